// clang-format off
#include "ops/cuda/nvcc_compat.h"  // first: before any header that includes fmt
// clang-format on

// gpu_self_test (ops/device_info.h): the CUDA ops through their dispatchers against their CPU
// twins on the same inputs. Host code only; a .cu because it exists only in builds with CUDA.

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "ops/cuda/cuda_state.h"
#include "ops/cuda/device_info.h"
#include "ops/grad_norm.h"
#include "ops/linear.h"
#include "ops/rmsnorm.h"

namespace lathe {
namespace {

// bf16's unit roundoff (8 significant bits): the tolerances below are multiples of it, as in
// ops/cuda/cuda_test_util.h, which the op tests use.
constexpr double kBf16Unit = 1.0 / 256;

struct Inputs {
    std::mt19937_64 gen;
    explicit Inputs(uint64_t seed) : gen(seed) {}
    // Uniform values in [lo, hi) rounded to bf16, held as f32: the exact values both backends see.
    HostTensor bf16_values(Shape shape, float lo = -1.0f, float hi = 1.0f) {
        HostTensor t(DType::kF32, shape);
        std::uniform_real_distribution<float> dist(lo, hi);
        float* p = t.as<float>();
        for (int64_t i = 0; i < t.numel(); ++i) p[i] = bf16_to_float(float_to_bf16(dist(gen)));
        return t;
    }
};

// A device copy of a host f32 tensor in `dtype` (bf16 rounding is exact for bf16_values).
struct DeviceCopy {
    DeviceBuffer buffer;
    TensorView view;
};

DeviceCopy upload(const HostTensor& host, DType dtype, CudaState& state) {
    HostTensor staged(dtype, host.shape());
    tensor_convert(staged.view(), host.view());
    DeviceCopy d{DeviceBuffer(size_t(host.numel()) * dtype_size(dtype)), TensorView()};
    d.view = d.buffer.view(dtype, host.shape());
    cuda_copy_sync(d.view, staged.view(), state.stream());
    return d;
}

// An output buffer, poisoned with NaN (0xFF bytes) so an element the op never writes fails.
DeviceCopy device_output(DType dtype, Shape shape, CudaState& state) {
    DeviceCopy d{DeviceBuffer(size_t(shape.numel()) * dtype_size(dtype)), TensorView()};
    d.view = d.buffer.view(dtype, shape);
    cuda_fill_bytes(d.view, 0xFF, state.stream());
    return d;
}

HostTensor download_f32(ConstTensorView dev, CudaState& state) {
    HostTensor raw(dev.dtype(), dev.shape());
    cuda_copy_sync(raw.view(), dev, state.stream());
    if (dev.dtype() == DType::kF32) return raw;
    HostTensor f(DType::kF32, dev.shape());
    tensor_convert(f.view(), raw.view());
    return f;
}

GpuSelfTestCheck compare(std::string name, const HostTensor& got, const HostTensor& ref, double rel,
                         double abs) {
    GpuSelfTestCheck c;
    c.name = std::move(name);
    c.rel_tolerance = rel;
    c.abs_tolerance = abs;
    const float* g = got.as<float>();
    const float* r = ref.as<float>();
    for (int64_t i = 0; i < ref.numel(); ++i)
        c.max_ref = std::max(c.max_ref, std::fabs(double(r[i])));
    for (int64_t i = 0; i < ref.numel(); ++i) {
        if (!std::isfinite(g[i])) {
            ++c.failing_elements;
            c.max_abs_error = INFINITY;
            continue;
        }
        const double d = std::fabs(double(g[i]) - double(r[i]));
        c.max_abs_error = std::max(c.max_abs_error, d);
        if (d > rel * std::fabs(double(r[i])) + abs * c.max_ref) ++c.failing_elements;
    }
    c.passed = got.numel() == ref.numel() && c.failing_elements == 0;
    return c;
}

std::vector<GpuSelfTestCheck> run_self_test(int device, uint64_t seed) {
    std::vector<GpuSelfTestCheck> checks;
    CudaState state(device);
    const Context gpu = state.context(), cpu = cpu_context();
    Inputs in(seed);
    constexpr double u = kBf16Unit;

    // A GEMM at a size where cuBLASLt picks a real tensor-core kernel, with the bias epilogue;
    // then its backward: dweight (f32, cuBLASLt) and dbias (the deterministic column reduction).
    {
        const int64_t N = 256, I = 512, O = 384;
        const HostTensor x = in.bf16_values({N, I});
        const HostTensor w = in.bf16_values({O, I}, -0.2f, 0.2f);
        const HostTensor b = in.bf16_values({O});
        const HostTensor dy = in.bf16_values({N, O});
        HostTensor y_ref(DType::kF32, {N, O});
        linear_forward(y_ref.view(), x.view(), w.view(), b.view(), cpu);
        HostTensor dw_ref(DType::kF32, {O, I}), db_ref(DType::kF32, {O});
        linear_backward(TensorView(), dw_ref.view(), db_ref.view(), dy.view(), x.view(), w.view(),
                        GradMode::kOverwrite, cpu);

        DeviceCopy dx = upload(x, DType::kBF16, state), dw = upload(w, DType::kBF16, state);
        DeviceCopy db = upload(b, DType::kBF16, state), ddy = upload(dy, DType::kBF16, state);
        DeviceCopy y = device_output(DType::kBF16, {N, O}, state);
        linear_forward(y.view, dx.view, dw.view, db.view, gpu);
        // A bf16 sum: within two bf16 roundings of the output's scale (cancellation).
        checks.push_back(compare(fmt::format("linear_forward bf16 GEMM + bias epilogue, "
                                             "{}x{} -> {}",
                                             N, I, O),
                                 download_f32(y.view, state), y_ref, 2 * u, 2 * u));
        // dweight and dbias accumulate (+=): start them at zero on both sides.
        DeviceCopy gw = upload(HostTensor(DType::kF32, {O, I}), DType::kF32, state);
        DeviceCopy gb = upload(HostTensor(DType::kF32, {O}), DType::kF32, state);
        linear_backward(TensorView(), gw.view, gb.view, ddy.view, dx.view, dw.view,
                        GradMode::kOverwrite, gpu);
        // f32 results of the same bf16 inputs summed in another order: fp32 accuracy.
        checks.push_back(compare(fmt::format("linear_backward dweight f32 GEMM, {}x{}", O, I),
                                 download_f32(gw.view, state), dw_ref, 1e-4, 1e-5));
        checks.push_back(compare(fmt::format("linear_backward dbias column reduction, {} rows", N),
                                 download_f32(gb.view, state), db_ref, 1e-4, 1e-5));
    }
    // RMSNorm forward: a per-row sum of squares (warp reduction) then a scale.
    {
        const int64_t N = 64, C = 2048;
        const HostTensor x = in.bf16_values({N, C}, -2.0f, 2.0f);
        const HostTensor w = in.bf16_values({C}, 0.5f, 1.5f);
        HostTensor y_ref(DType::kF32, {N, C}), rstd_ref(DType::kF32, {N});
        rmsnorm_forward(y_ref.view(), rstd_ref.view(), x.view(), w.view(), 1e-5f, cpu);
        DeviceCopy dx = upload(x, DType::kBF16, state), dw = upload(w, DType::kBF16, state);
        DeviceCopy y = device_output(DType::kBF16, {N, C}, state);
        DeviceCopy rstd = device_output(DType::kF32, {N}, state);
        rmsnorm_forward(y.view, rstd.view, dx.view, dw.view, 1e-5f, gpu);
        // Rounded once to bf16 from an fp32 value: two roundings at most.
        checks.push_back(compare(fmt::format("rmsnorm_forward bf16, {} rows x {}", N, C),
                                 download_f32(y.view, state), y_ref, 2 * u, 1e-5));
    }
    // The global gradient norm over two f32 tensors: fp64 partials in fixed blocks, then one
    // final block; sizes that are not multiples of any block size.
    {
        const HostTensor g1 = in.bf16_values({(int64_t(1) << 20) + 12345});
        const HostTensor g2 = in.bf16_values({4099}, -3.0f, 3.0f);
        HostTensor norm_ref(DType::kF32, {1});
        const ConstTensorView cpu_grads[] = {g1.view(), g2.view()};
        grad_norm_l2(norm_ref.view(), cpu_grads, cpu);
        DeviceCopy d1 = upload(g1, DType::kF32, state), d2 = upload(g2, DType::kF32, state);
        DeviceCopy norm = device_output(DType::kF32, {1}, state);
        const ConstTensorView gpu_grads[] = {d1.view, d2.view};
        grad_norm_l2(norm.view, gpu_grads, gpu);
        // Both sum squares in fp64 and round once to f32: within a few f32 ulps.
        checks.push_back(
            compare(fmt::format("grad_norm_l2 f32, {} elements", g1.numel() + g2.numel()),
                    download_f32(norm.view, state), norm_ref, 1e-6, 0.0));
    }
    state.synchronize();
    return checks;
}

}  // namespace

// Defined through a helper of namespace lathe, so the ops it calls are the dispatchers of
// ops/<op>.h, never the launchers of the same names in lathe::cuda.
std::vector<GpuSelfTestCheck> cuda::gpu_self_test(int device, uint64_t seed) {
    return run_self_test(device, seed);
}

}  // namespace lathe
