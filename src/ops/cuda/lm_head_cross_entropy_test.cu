// clang-format off
#include "ops/cuda/nvcc_compat.h"  // first: before any header that includes fmt
// clang-format on

#include <gtest/gtest.h>

#include "ops/cuda/cuda_test_util.h"
#include "ops/lm_head_cross_entropy.h"

namespace lathe {
namespace {

using namespace cudatest;

struct LmHeadCase {
    int64_t N, C, V, Nc;
    double ignored;  // fraction of targets that are -100
};

void check_lm_head(const LmHeadCase& c, uint64_t seed) {
    SCOPED_TRACE(::testing::Message() << "N=" << c.N << " C=" << c.C << " V=" << c.V
                                      << " Nc=" << c.Nc << " ignored=" << c.ignored);
    CudaState state(0);
    const Context gpu = state.context(), cpu = cpu_context();
    optest::Rng rng(seed);
    HostTensor targets(DType::kI32, {c.N});
    for (int64_t n = 0; n < c.N; ++n)
        targets.as<int32_t>()[n] = rng.uniform(0.0f, 1.0f) < c.ignored
                                       ? kIgnoreIndex
                                       : int32_t(rng.integer(0, c.V - 1));
    const HostTensor x = random_bf16_values(rng, {c.N, c.C});
    const HostTensor w = random_bf16_values(rng, {c.V, c.C}, -0.5f, 0.5f);
    const HostTensor dw0 = optest::random_tensor(rng, {c.V, c.C}, -0.01f, 0.01f);
    const float dloss = 0.7f;

    HostTensor scratch(DType::kF32, {c.Nc, c.V});
    HostTensor loss_ref(DType::kF32, {1}), losses_ref(DType::kF32, {c.N}), lse_ref(DType::kF32, {c.N});
    lm_head_cross_entropy_forward(loss_ref.view(), losses_ref.view(), lse_ref.view(), x.view(),
                                  targets.view(), w.view(), scratch.view(), cpu);
    HostTensor dx_ref(DType::kF32, {c.N, c.C});
    HostTensor dw_ref = optest::copy_tensor(dw0.view());
    lm_head_cross_entropy_backward(dx_ref.view(), dw_ref.view(), x.view(), targets.view(),
                                   w.view(), lse_ref.view(), dloss, scratch.view(), cpu);

    DeviceTensor gx = upload(x, DType::kBF16, state), gw = upload(w, DType::kBF16, state);
    DeviceTensor gt = upload(targets, DType::kI32, state);
    DeviceTensor gscratch = device_tensor(DType::kF32, {c.Nc, c.V}, state);
    DeviceTensor loss = device_tensor(DType::kF32, {1}, state);
    DeviceTensor losses = device_tensor(DType::kF32, {c.N}, state);
    DeviceTensor lse = device_tensor(DType::kF32, {c.N}, state);
    lm_head_cross_entropy_forward(loss.view, losses.view, lse.view, gx.view, gt.view, gw.view,
                                  gscratch.view, gpu);
    EXPECT_TRUE(matches(download_f32(loss.view, state), loss_ref, kF32Sum));
    EXPECT_TRUE(matches(download_f32(losses.view, state), losses_ref, kF32Sum));
    EXPECT_TRUE(matches(download_f32(lse.view, state), lse_ref, kF32Sum));

    // Without per-row losses (the op keeps its own).
    DeviceTensor loss2 = device_tensor(DType::kF32, {1}, state);
    lm_head_cross_entropy_forward(loss2.view, TensorView(), lse.view, gx.view, gt.view, gw.view,
                                  gscratch.view, gpu);
    EXPECT_TRUE(bitwise_equal(download_raw(loss2.view, state), download_raw(loss.view, state)));

    DeviceTensor dx = device_tensor(DType::kBF16, {c.N, c.C}, state);
    DeviceTensor dw = upload(dw0, DType::kF32, state);
    lm_head_cross_entropy_backward(dx.view, dw.view, gx.view, gt.view, gw.view, lse.view, dloss,
                                   gscratch.view, gpu);
    const HostTensor dx_gpu = download_f32(dx.view, state), dw_gpu = download_f32(dw.view, state);
    EXPECT_TRUE(matches(dx_gpu, dx_ref, kBf16Derived));
    EXPECT_TRUE(matches(dw_gpu, dw_ref, kBf16Derived));

    // Forward and backward in one pass: the same loss, and the same gradients up to the softmax
    // being formed from the fresh sum instead of the saved lse.
    DeviceTensor loss3 = device_tensor(DType::kF32, {1}, state);
    DeviceTensor losses3 = device_tensor(DType::kF32, {c.N}, state);
    DeviceTensor dx3 = device_tensor(DType::kBF16, {c.N, c.C}, state);
    DeviceTensor dw3 = upload(dw0, DType::kF32, state);
    lm_head_cross_entropy_forward_backward(loss3.view, losses3.view, dx3.view, dw3.view, gx.view,
                                           gt.view, gw.view, dloss, gscratch.view, gpu);
    EXPECT_TRUE(bitwise_equal(download_raw(loss3.view, state), download_raw(loss.view, state)));
    EXPECT_TRUE(bitwise_equal(download_raw(losses3.view, state), download_raw(losses.view, state)));
    EXPECT_TRUE(matches(download_f32(dx3.view, state), dx_ref, kBf16Derived));
    EXPECT_TRUE(matches(download_f32(dw3.view, state), dw_ref, kBf16Derived));

    // Determinism.
    DeviceTensor dx4 = device_tensor(DType::kBF16, {c.N, c.C}, state);
    DeviceTensor dw4 = upload(dw0, DType::kF32, state);
    lm_head_cross_entropy_backward(dx4.view, dw4.view, gx.view, gt.view, gw.view, lse.view, dloss,
                                   gscratch.view, gpu);
    EXPECT_TRUE(bitwise_equal(download_raw(dx4.view, state), download_raw(dx.view, state)));
    EXPECT_TRUE(bitwise_equal(download_raw(dw4.view, state), download_raw(dw.view, state)));
}

TEST(CudaLmHeadCrossEntropy, MatchesCpuInUnevenChunks) {
    check_lm_head({70, 64, 1000, 32, 0.2}, 61);  // chunks of 32, 32, 6 rows
}

TEST(CudaLmHeadCrossEntropy, MatchesCpuOneChunk) {
    check_lm_head({48, 128, 4096, 64, 0.0}, 62);
}

TEST(CudaLmHeadCrossEntropy, MatchesCpuOddVocabulary) {
    check_lm_head({40, 64, 999, 16, 0.1}, 63);  // bf16 dlogits rows of 1998 elements: 4-byte aligned
}

TEST(CudaLmHeadCrossEntropy, AllTargetsIgnored) {
    CudaState state(0);
    const Context gpu = state.context();
    optest::Rng rng(64);
    const int64_t N = 8, C = 16, V = 64;
    HostTensor targets(DType::kI32, {N});
    for (int64_t n = 0; n < N; ++n) targets.as<int32_t>()[n] = kIgnoreIndex;
    DeviceTensor gx = upload(random_bf16_values(rng, {N, C}), DType::kBF16, state);
    DeviceTensor gw = upload(random_bf16_values(rng, {V, C}), DType::kBF16, state);
    DeviceTensor gt = upload(targets, DType::kI32, state);
    DeviceTensor scratch = device_tensor(DType::kF32, {4, V}, state);
    DeviceTensor loss = device_tensor(DType::kF32, {1}, state);
    DeviceTensor dx = device_tensor(DType::kBF16, {N, C}, state);
    const HostTensor dw0 = optest::random_tensor(rng, {V, C});
    DeviceTensor dw = upload(dw0, DType::kF32, state);
    lm_head_cross_entropy_forward_backward(loss.view, TensorView(), dx.view, dw.view, gx.view,
                                           gt.view, gw.view, 1.0f, scratch.view, gpu);
    EXPECT_EQ(download_f32(loss.view, state).as<float>()[0], 0.0f);
    const HostTensor dx_host = download_f32(dx.view, state);
    for (int64_t i = 0; i < dx_host.numel(); ++i) ASSERT_EQ(dx_host.as<float>()[i], 0.0f) << i;
    EXPECT_TRUE(bitwise_equal(download_f32(dw.view, state), dw0));
}

}  // namespace
}  // namespace lathe
