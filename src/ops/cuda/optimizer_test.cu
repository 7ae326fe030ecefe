// clang-format off
#include "ops/cuda/nvcc_compat.h"  // first: before any header that includes fmt
// clang-format on

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdlib>
#include <vector>

#include "ops/adamw.h"
#include "ops/cuda/adamw.h"
#include "ops/cuda/cuda_test_util.h"
#include "ops/grad_norm.h"

// AdamW and the gradient norm / clip, CUDA against the CPU twin.

namespace lathe {
namespace {

using namespace cudatest;

// Largest distance in units in the last place between two f32 tensors of the same size (finite
// values of one sign compare by their ordered bit patterns), and how many elements differ at all.
struct UlpDiff {
    int64_t max_ulp = 0;
    int64_t differing = 0;
};

UlpDiff ulp_diff(const HostTensor& a, const HostTensor& b) {
    auto ordered = [](float f) {
        const int32_t i = std::bit_cast<int32_t>(f);
        return i < 0 ? int64_t(INT32_MIN) - i : int64_t(i);
    };
    UlpDiff d;
    for (int64_t i = 0; i < a.numel(); ++i) {
        const float x = a.as<float>()[i], y = b.as<float>()[i];
        if (std::isnan(x) || std::isnan(y)) {
            d.max_ulp = INT64_MAX;
            ++d.differing;
            continue;
        }
        const int64_t u = std::llabs(ordered(x) - ordered(y));
        d.max_ulp = std::max(d.max_ulp, u);
        d.differing += u != 0;
    }
    return d;
}

// Parameter groups over 5000 elements, with and without decay, and gaps no segment covers, laid
// out for the kernel's two paths (four elements a thread where a segment starts on a multiple of
// four, one at a time otherwise; blocks of 1024 elements): three blocks of four-at-a-time ending
// in a partial group, two blocks one at a time, an aligned group of three elements alone, and an
// aligned segment ending one short of the tensor.
std::vector<AdamWSegment> five_thousand_segments() {
    return {{0, 2101, 1e-3, 0.1},
            {2202, 1798, 5e-4, 0.0},
            {4000, 3, 1e-3, 0.0},
            {4004, 995, 2e-3, 0.01}};
}

TEST(CudaAdamW, MatchesCpuOverSegmentsAndSteps) {
    CudaState state(0);
    const Context gpu = state.context(), cpu = cpu_context();
    optest::Rng rng(71);
    const int64_t P = 5000;
    // beta1 both sides of the lerp switch over the two runs.
    const std::vector<AdamWSegment> segments = five_thousand_segments();
    for (const double beta1 : {0.9, 0.3}) {
        SCOPED_TRACE(::testing::Message() << "beta1=" << beta1);
        const AdamWHyper hyper{beta1, 0.95, 1e-8};
        HostTensor p = optest::random_tensor(rng, {P});
        HostTensor m(DType::kF32, {P}), v(DType::kF32, {P});
        DeviceTensor gp = upload(p, DType::kF32, state);
        DeviceTensor gm = upload(m, DType::kF32, state), gv = upload(v, DType::kF32, state);
        for (int64_t step = 1; step <= 3; ++step) {
            const HostTensor g = optest::random_tensor(rng, {P}, -0.1f, 0.1f);
            DeviceTensor gg = upload(g, DType::kF32, state);
            adamw_update(p.view(), m.view(), v.view(), g.view(), segments, hyper, step, cpu);
            adamw_update(gp.view, gm.view, gv.view, gg.view, segments, hyper, step, gpu);
        }
        // The kernel repeats the CPU's operations with explicitly rounded intrinsics: expect the
        // same bits; allow 1 ulp so that a libm difference in the host-side scalars would show
        // up as a count, not a failure.
        for (const auto& [name, got, ref] :
             {std::tuple{"params", download_f32(gp.view, state), optest::copy_tensor(p.view())},
              std::tuple{"m", download_f32(gm.view, state), optest::copy_tensor(m.view())},
              std::tuple{"v", download_f32(gv.view, state), optest::copy_tensor(v.view())}}) {
            const UlpDiff d = ulp_diff(got, ref);
            EXPECT_LE(d.max_ulp, 1) << name << ": " << d.differing << " of " << P << " differ";
            RecordProperty(std::string(name) + "_differing_elements", int(d.differing));
        }
    }
}

// bf16 moments (optimizer.state_dtype: bf16): the kernel against the CPU twin over the same bf16
// storage, with clipping: the same bits for the masters, both moments and the compute copy. A
// NaN gradient element makes NaNs on both (their bits may differ: the GPU's f32 arithmetic
// returns its canonical NaN, the CPU's keeps the input's), compared as NaN.
TEST(CudaAdamW, Bf16MomentsMatchCpuBits) {
    CudaState state(0);
    const Context gpu = state.context(), cpu = cpu_context();
    optest::Rng rng(73);
    const int64_t P = 5000;
    const std::vector<AdamWSegment> segments = five_thousand_segments();
    const AdamWHyper hyper{0.9, 0.95, 1e-8};
    HostTensor p = optest::random_tensor(rng, {P});
    HostTensor m(DType::kBF16, {P}), v(DType::kBF16, {P}), copy(DType::kBF16, {P});
    DeviceTensor gp = upload(p, DType::kF32, state);
    DeviceTensor gm = device_tensor(DType::kBF16, Shape{P}, state);
    DeviceTensor gv = device_tensor(DType::kBF16, Shape{P}, state);
    DeviceTensor gcopy = device_tensor(DType::kBF16, Shape{P}, state);
    cuda_copy_sync(gm.view, m.view(), state.stream());
    cuda_copy_sync(gv.view, v.view(), state.stream());
    cuda_copy_sync(gcopy.view, copy.view(), state.stream());
    float norm = 4.0f;  // above max_norm 0.5: every gradient scaled
    HostTensor norm_host(DType::kF32, Shape{1});
    norm_host.as<float>()[0] = norm;
    DeviceTensor gnorm = upload(norm_host, DType::kF32, state);
    for (int64_t step = 1; step <= 4; ++step) {
        HostTensor g = optest::random_tensor(rng, {P}, -0.1f, 0.1f);
        if (step == 3) g.as<float>()[17] = std::nanf("");
        DeviceTensor gg = upload(g, DType::kF32, state);
        adamw_update_with_copy(p.view(), copy.view(), m.view(), v.view(), g.view(), segments, hyper,
                               step, ConstTensorView(&norm, DType::kF32, Shape{1}), 0.5f, cpu);
        adamw_update_with_copy(gp.view, gcopy.view, gm.view, gv.view, gg.view, segments, hyper,
                               step, gnorm.view, 0.5f, gpu);
    }
    const HostTensor got_p = download_raw(gp.view, state), got_m = download_raw(gm.view, state),
                     got_v = download_raw(gv.view, state),
                     got_copy = download_raw(gcopy.view, state);
    // Equal bits, or NaN on both sides.
    const auto same = [](float a, float b) {
        return std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b) ||
               (std::isnan(a) && std::isnan(b));
    };
    int64_t differing = 0;
    for (int64_t i = 0; i < P; ++i) {
        differing += !same(got_p.as<float>()[i], p.as<float>()[i]);
        differing += !same(bf16_to_float(got_m.as<bf16>()[i]), bf16_to_float(m.as<bf16>()[i]));
        differing += !same(bf16_to_float(got_v.as<bf16>()[i]), bf16_to_float(v.as<bf16>()[i]));
        differing +=
            !same(bf16_to_float(got_copy.as<bf16>()[i]), bf16_to_float(copy.as<bf16>()[i]));
    }
    EXPECT_EQ(differing, 0);
    EXPECT_TRUE(std::isnan(bf16_to_float(got_m.as<bf16>()[17])));
    EXPECT_FALSE(std::isnan(bf16_to_float(got_m.as<bf16>()[16])));
}

// Clipping fused into the update (GPU) against clip-then-update (CPU twin, through the same
// dispatcher with clip_norm): a norm above max_norm scales, one below leaves the gradients, and the
// gradients in memory stay unclipped on both.
TEST(CudaAdamW, FusedClipEqualsClipThenUpdate) {
    CudaState state(0);
    const Context gpu = state.context(), cpu = cpu_context();
    optest::Rng rng(73);
    const int64_t P = 4096;
    const std::vector<AdamWSegment> segments = {{0, 3000, 1e-3, 0.1}, {3000, 1096, 5e-4, 0.0}};
    for (const float max_norm : {0.5f, 1e9f}) {
        SCOPED_TRACE(::testing::Message() << "max_norm=" << max_norm);
        HostTensor p = optest::random_tensor(rng, {P});
        HostTensor m(DType::kF32, {P}), v(DType::kF32, {P});
        HostTensor p2 = optest::copy_tensor(p.view()), m2(DType::kF32, {P}), v2(DType::kF32, {P});
        const HostTensor g = optest::random_tensor(rng, {P}, -0.1f, 0.1f);
        HostTensor norm(DType::kF32, {1});
        const ConstTensorView gs[] = {g.view()};
        grad_norm_l2(norm.view(), gs, cpu);
        // Reference: clip a copy, then the plain update.
        HostTensor clipped = optest::copy_tensor(g.view());
        const TensorView cs[] = {clipped.view()};
        grad_clip_by_norm(cs, norm.view(), max_norm, cpu);
        adamw_update(p2.view(), m2.view(), v2.view(), clipped.view(), segments, AdamWHyper{}, 1,
                     cpu);
        DeviceTensor gp = upload(p, DType::kF32, state), gg = upload(g, DType::kF32, state);
        DeviceTensor gm = upload(m, DType::kF32, state), gv = upload(v, DType::kF32, state);
        DeviceTensor gn = upload(norm, DType::kF32, state);
        adamw_update_with_copy(gp.view, TensorView(), gm.view, gv.view, gg.view, segments,
                               AdamWHyper{}, 1, gn.view, max_norm, gpu);
        adamw_update_with_copy(p.view(), TensorView(), m.view(), v.view(), g.view(), segments,
                               AdamWHyper{}, 1, norm.view(), max_norm, cpu);
        EXPECT_LE(ulp_diff(download_f32(gp.view, state), p2).max_ulp, 1);
        EXPECT_LE(ulp_diff(p, p2).max_ulp, 0) << "the CPU's fused path differs from clip+update";
        EXPECT_LE(ulp_diff(download_f32(gg.view, state), g).max_ulp, 0) << "gradients were written";
    }
}

TEST(CudaAdamW, WritesTheBf16CopyOfUpdatedElementsOnly) {
    CudaState state(0);
    optest::Rng rng(72);
    const int64_t P = 3000;
    const std::vector<AdamWSegment> segments = {{10, 1500, 1e-3, 0.1}, {2000, 1000, 3e-4, 0.0}};
    const HostTensor p = optest::random_tensor(rng, {P});
    const HostTensor g = optest::random_tensor(rng, {P});
    HostTensor zeros(DType::kF32, {P});
    DeviceTensor gp = upload(p, DType::kF32, state), gg = upload(g, DType::kF32, state);
    DeviceTensor gm = upload(zeros, DType::kF32, state), gv = upload(zeros, DType::kF32, state);
    DeviceTensor copy = device_tensor(DType::kBF16, {P}, state);  // poisoned
    cuda::adamw_update(gp.view.as<float>(), copy.view.as<bf16>(), gm.view.as<float>(),
                       gv.view.as<float>(), gg.view.as<float>(), segments, AdamWHyper{}, 1, nullptr,
                       0.0f, state.stream());
    const HostTensor master = download_f32(gp.view, state);
    const HostTensor raw = download_raw(copy.view, state);
    for (int64_t i = 0; i < P; ++i) {
        const bool updated = (i >= 10 && i < 1510) || (i >= 2000 && i < 3000);
        const uint16_t bits = raw.as<bf16>()[i].bits;
        if (updated)
            ASSERT_EQ(bits, float_to_bf16(master.as<float>()[i]).bits) << i;
        else
            ASSERT_EQ(bits, 0xFFFF) << i << " outside every segment was written";
    }
}

TEST(CudaGradNorm, MatchesCpuAndClips) {
    CudaState state(0);
    const Context gpu = state.context(), cpu = cpu_context();
    optest::Rng rng(73);
    const std::vector<int64_t> sizes = {1000, 70000, 3, 200000};
    std::vector<HostTensor> host;
    std::vector<DeviceTensor> dev;
    for (int64_t n : sizes) {
        host.push_back(optest::random_tensor(rng, {n}, -0.05f, 0.05f));
        dev.push_back(upload(host.back(), DType::kF32, state));
    }
    std::vector<ConstTensorView> host_c, dev_c;
    std::vector<TensorView> host_m, dev_m;
    for (size_t i = 0; i < sizes.size(); ++i) {
        host_c.push_back(host[i].view());
        host_m.push_back(host[i].view());
        dev_c.push_back(dev[i].view);
        dev_m.push_back(dev[i].view);
    }
    HostTensor norm_ref(DType::kF32, {1});
    grad_norm_l2(norm_ref.view(), host_c, cpu);
    DeviceTensor norm = device_tensor(DType::kF32, {1}, state);
    grad_norm_l2(norm.view, dev_c, gpu);
    const HostTensor norm_gpu = download_f32(norm.view, state);
    // Both sum the squares in fp64 (an error near 2^-53 relative) and round the root to fp32 once
    // (2^-24 = 6e-8): they agree within an ulp or two; 1e-6 is 16 ulps.
    EXPECT_NEAR(norm_gpu.as<float>()[0], norm_ref.as<float>()[0], 1e-6 * norm_ref.as<float>()[0]);

    // A max_norm above the norm leaves the gradients alone.
    grad_clip_by_norm(dev_m, norm.view, 2.0f * norm_ref.as<float>()[0], gpu);
    for (size_t i = 0; i < sizes.size(); ++i)
        EXPECT_TRUE(bitwise_equal(download_f32(dev[i].view, state), host[i]));

    // Below it, every gradient is scaled as the CPU scales it: the coefficient
    // max_norm / (norm + 1e-6) from norms an ulp or two apart, then one fp32 product: a few ulps,
    // within 1e-6 relative.
    const float max_norm = 0.25f * norm_ref.as<float>()[0];
    grad_clip_by_norm(host_m, norm_ref.view(), max_norm, cpu);
    grad_clip_by_norm(dev_m, norm.view, max_norm, gpu);
    for (size_t i = 0; i < sizes.size(); ++i)
        EXPECT_TRUE(matches(download_f32(dev[i].view, state), host[i], {1e-6, 0.0, 1e-6}));
}

TEST(CudaGradNorm, NonFiniteNormLeavesGradients) {
    CudaState state(0);
    const Context gpu = state.context();
    optest::Rng rng(74);
    HostTensor g = optest::random_tensor(rng, {5000});
    g.as<float>()[1234] = std::nanf("");
    DeviceTensor dg = upload(g, DType::kF32, state);
    DeviceTensor norm = device_tensor(DType::kF32, {1}, state);
    const ConstTensorView views[] = {dg.view};
    grad_norm_l2(norm.view, views, gpu);
    EXPECT_TRUE(std::isnan(download_f32(norm.view, state).as<float>()[0]));
    const TensorView mviews[] = {dg.view};
    grad_clip_by_norm(mviews, norm.view, 1e-3f, gpu);
    EXPECT_TRUE(bitwise_equal(download_f32(dg.view, state), g));
}

}  // namespace
}  // namespace lathe
