#include "ops/device_info.h"

#include <dlfcn.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <random>

#include "core/tensor.h"
#include "ops/cuda/device_info.h"
#include "ops/grad_norm.h"
#include "ops/linear.h"
#include "ops/rmsnorm.h"

#if LATHE_HAVE_CUDA
#include "ops/cuda/cuda_state.h"
#endif

namespace lathe {
namespace {

// A library opened with dlopen, closed on destruction. Closing only drops our reference: a
// library the process also links (libcudnn once the ops link it) stays loaded.
class DlHandle {
public:
    explicit DlHandle(void* handle) : handle_(handle) {}
    ~DlHandle() {
        if (handle_ != nullptr) dlclose(handle_);
    }
    DlHandle(const DlHandle&) = delete;
    DlHandle& operator=(const DlHandle&) = delete;
    void* get() const { return handle_; }

private:
    void* handle_;
};

// Opens the first of `names` the dynamic loader finds (its usual search: LD_LIBRARY_PATH,
// ld.so.cache, the default folders) and reads its version through `symbol`, a function
// returning the encoded version (size_t cudnnGetVersion(void) or int ncclGetVersion(int*) style,
// told apart by `by_pointer`). The version is decoded by `decode`.
template <typename Decode>
GpuLibraryInfo probe_library(std::initializer_list<const char*> names, const char* symbol,
                             bool by_pointer, Decode decode) {
    GpuLibraryInfo info;
    std::string tried;
    for (const char* name : names) {
        DlHandle lib(dlopen(name, RTLD_NOW | RTLD_LOCAL));
        if (lib.get() == nullptr) {
            const char* why = dlerror();
            tried += fmt::format("{}{}", tried.empty() ? "" : "; ", why != nullptr ? why : name);
            continue;
        }
        void* fn = dlsym(lib.get(), symbol);
        if (fn == nullptr) {
            info.detail = fmt::format("{} has no {}", name, symbol);
            return info;
        }
        if (by_pointer) {
            int version = 0;
            // ncclResult_t ncclGetVersion(int* version): 0 is ncclSuccess.
            const int rc = reinterpret_cast<int (*)(int*)>(fn)(&version);
            if (rc != 0) {
                info.detail = fmt::format("{}: {} returned error {}", name, symbol, rc);
                return info;
            }
            info.version = decode(size_t(version));
        } else {
            info.version = decode(reinterpret_cast<size_t (*)()>(fn)());
        }
        info.found = true;
        Dl_info where{};
        info.detail = dladdr(fn, &where) != 0 && where.dli_fname != nullptr
                          ? std::string(where.dli_fname)
                          : std::string(name);
        return info;
    }
    info.detail = "not found (" + tried + ")";
    return info;
}

// The driver's release ("580.159.04") through NVML, which ships with the driver
// (libnvidia-ml.so.1); empty when NVML is not there or fails. Its functions return 0 on success.
std::string nvml_driver_release() {
    DlHandle lib(dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL));
    if (lib.get() == nullptr) return {};
    auto init = reinterpret_cast<int (*)()>(dlsym(lib.get(), "nvmlInit_v2"));
    auto get =
        reinterpret_cast<int (*)(char*, unsigned)>(dlsym(lib.get(), "nvmlSystemGetDriverVersion"));
    auto shutdown = reinterpret_cast<int (*)()>(dlsym(lib.get(), "nvmlShutdown"));
    if (init == nullptr || get == nullptr || shutdown == nullptr || init() != 0) return {};
    char version[96] = {};  // NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE is 80
    const bool ok = get(version, sizeof(version)) == 0;
    shutdown();
    return ok ? std::string(version) : std::string();
}

#if LATHE_HAVE_CUDA

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

#endif  // LATHE_HAVE_CUDA

}  // namespace

std::string cuda_version_string(int version) {
    return fmt::format("{}.{}", version / 1000, (version % 1000) / 10);
}

std::string library_version_string(size_t version) {
    return fmt::format("{}.{}.{}", version / 10000, (version / 100) % 100, version % 100);
}

std::string nccl_version_string(int version) {
    // NCCL_VERSION(X, Y, Z) in nccl.h: X * 1000 + Y * 100 + Z up to 2.8, X * 10000 + Y * 100 + Z
    // from 2.9 on (so every new-style code is >= 20900, every old one < 10000).
    if (version >= 10000) return library_version_string(size_t(version));
    return fmt::format("{}.{}.{}", version / 1000, (version / 100) % 10, version % 100);
}

GpuEnvironment gpu_environment_probe(int only_device) {
    GpuEnvironment env;
    cuda::probe_environment(env, only_device);
    env.driver_release = nvml_driver_release();
    // cudnnGetVersion: CUDNN_VERSION of the library loaded (major * 10000 + minor * 100 + patch
    // since cuDNN 9), which is what runs, whatever header lathe was compiled against.
    env.cudnn = probe_library({"libcudnn.so.9", "libcudnn.so"}, "cudnnGetVersion", false,
                              [](size_t v) { return library_version_string(v); });
    env.nccl = probe_library({"libnccl.so.2", "libnccl.so"}, "ncclGetVersion", true,
                             [](size_t v) { return nccl_version_string(int(v)); });
    return env;
}

bool gpu_memory_info(int device, size_t& free_bytes, size_t& total_bytes) {
    return cuda::memory_info(device, free_bytes, total_bytes);
}

std::vector<GpuSelfTestCheck> gpu_self_test(int device, uint64_t seed) {
    std::vector<GpuSelfTestCheck> checks;
#if LATHE_HAVE_CUDA
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
#else
    (void)device;
    (void)seed;
#endif
    return checks;
}

}  // namespace lathe
