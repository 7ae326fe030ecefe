// clang-format off
#include "ops/cuda/nvcc_compat.h"  // first: before any header that includes fmt
// clang-format on

#include <gtest/gtest.h>

#include "ops/cuda/column_reduce.h"
#include "ops/cuda/cuda_test_util.h"
#include "ops/linear.h"

namespace lathe {
namespace {

using namespace cudatest;

struct LinearCase {
    int64_t N, I, O;
    bool bias;
};

// Forward, then backward with dx overwritten and accumulated, dweight and dbias accumulating
// onto random values, against the CPU twin on the same bf16-valued inputs.
void check_linear(const LinearCase& c, uint64_t seed) {
    SCOPED_TRACE(::testing::Message() << "N=" << c.N << " I=" << c.I << " O=" << c.O
                                      << " bias=" << c.bias);
    CudaState state(0);
    const Context gpu = state.context(), cpu = cpu_context();
    optest::Rng rng(seed);
    const HostTensor x = random_bf16_values(rng, {c.N, c.I});
    const HostTensor w = random_bf16_values(rng, {c.O, c.I}, -0.2f, 0.2f);
    const HostTensor b = c.bias ? random_bf16_values(rng, {c.O}) : HostTensor();
    const HostTensor dy = random_bf16_values(rng, {c.N, c.O});
    const HostTensor dx0 = random_bf16_values(rng, {c.N, c.I});
    const HostTensor dw0 = optest::random_tensor(rng, {c.O, c.I});
    const HostTensor db0 = optest::random_tensor(rng, {c.O});
    const ConstTensorView b_view = c.bias ? b.view() : ConstTensorView();

    // CPU reference.
    HostTensor y_ref(DType::kF32, {c.N, c.O});
    linear_forward(y_ref.view(), x.view(), w.view(), b_view, cpu);
    HostTensor dx_ref(DType::kF32, {c.N, c.I});
    HostTensor dx_acc_ref = optest::copy_tensor(dx0.view());
    HostTensor dw_ref = optest::copy_tensor(dw0.view());
    HostTensor db_ref = optest::copy_tensor(db0.view());
    linear_backward(dx_ref.view(), dw_ref.view(), db_ref.view(), dy.view(), x.view(), w.view(),
                    GradMode::kOverwrite, cpu);
    linear_backward(dx_acc_ref.view(), TensorView(), TensorView(), dy.view(), x.view(), w.view(),
                    GradMode::kAccumulate, cpu);

    // CUDA.
    DeviceTensor dx_in = upload(x, DType::kBF16, state), dw_in = upload(w, DType::kBF16, state);
    DeviceTensor db_in = c.bias ? upload(b, DType::kBF16, state) : DeviceTensor{};
    DeviceTensor ddy = upload(dy, DType::kBF16, state);
    DeviceTensor y = device_tensor(DType::kBF16, {c.N, c.O}, state);
    linear_forward(y.view, dx_in.view, dw_in.view, c.bias ? db_in.view : TensorView(), gpu);
    EXPECT_TRUE(matches(download_f32(y.view, state), y_ref, kBf16Sum));

    DeviceTensor gx = device_tensor(DType::kBF16, {c.N, c.I}, state);
    DeviceTensor gx_acc = upload(dx0, DType::kBF16, state);
    DeviceTensor gw = upload(dw0, DType::kF32, state), gb = upload(db0, DType::kF32, state);
    linear_backward(gx.view, gw.view, gb.view, ddy.view, dx_in.view, dw_in.view,
                    GradMode::kOverwrite, gpu);
    linear_backward(gx_acc.view, TensorView(), TensorView(), ddy.view, dx_in.view, dw_in.view,
                    GradMode::kAccumulate, gpu);
    EXPECT_TRUE(matches(download_f32(gx.view, state), dx_ref, kBf16Sum));
    EXPECT_TRUE(matches(download_f32(gx_acc.view, state), dx_acc_ref, kBf16Sum));
    EXPECT_TRUE(matches(download_f32(gw.view, state), dw_ref, kF32Sum));
    EXPECT_TRUE(matches(download_f32(gb.view, state), db_ref, kF32Sum));

    // Determinism: the same backward from the same starting point gives the same bits.
    DeviceTensor gw2 = upload(dw0, DType::kF32, state), gb2 = upload(db0, DType::kF32, state);
    DeviceTensor gx2 = device_tensor(DType::kBF16, {c.N, c.I}, state);
    linear_backward(gx2.view, gw2.view, gb2.view, ddy.view, dx_in.view, dw_in.view,
                    GradMode::kOverwrite, gpu);
    EXPECT_TRUE(bitwise_equal(download_raw(gx2.view, state), download_raw(gx.view, state)));
    EXPECT_TRUE(bitwise_equal(download_raw(gw2.view, state), download_raw(gw.view, state)));
    EXPECT_TRUE(bitwise_equal(download_raw(gb2.view, state), download_raw(gb.view, state)));
}

TEST(CudaLinear, MatchesCpuWithBias) {
    check_linear({96, 128, 192, true}, 11);
}

TEST(CudaLinear, MatchesCpuWithoutBias) {
    check_linear({33, 64, 40, false}, 12);
}

TEST(CudaLinear, MatchesCpuOnModelSizedRows) {
    check_linear({512, 768, 2304, true}, 13);  // GPT-2's fused qkv on 512 tokens
}

TEST(CudaLinear, MatchesCpuOnUnalignedSizes) {
    check_linear({7, 36, 20, true}, 14);  // rows of 72 and 40 bytes: no 16-byte vectors
}

TEST(CudaLinear, MatchesCpuOnManyBiasChunks) {
    // 4100 rows: 65 row chunks of 64 (the last one 4 rows) over 3 column tiles of the bias sum.
    check_linear({4100, 64, 768, true}, 15);
}

// The bias gradient's column sum directly: the 16-byte path (aligned source) and the scalar path
// (the same values 2 bytes further on) add in the same order, so they give the same bits; both
// agree with a double-precision host sum; a second run gives the same bits.
TEST(CudaColumnSum, VectorAndScalarPathsGiveSameBits) {
    const int64_t N = 2100, C = 1032;  // 5 column tiles (the last one partial), 33 row chunks
    CudaState state(0);
    optest::Rng rng(16);
    const HostTensor src = random_bf16_values(rng, {N * C});
    const HostTensor dst0 = optest::random_tensor(rng, {C});
    HostTensor shifted(DType::kF32, {N * C + 1});
    auto* sh = static_cast<float*>(shifted.view().data());
    const auto* sv = static_cast<const float*>(src.view().data());
    sh[0] = 0.0f;
    for (int64_t i = 0; i < N * C; ++i) sh[i + 1] = sv[i];
    DeviceTensor aligned = upload(src, DType::kBF16, state);
    DeviceTensor offset = upload(shifted, DType::kBF16, state);
    const auto* aligned_ptr = static_cast<const bf16*>(aligned.view.data());
    const auto* offset_ptr = static_cast<const bf16*>(offset.view.data()) + 1;
    DeviceTensor a = upload(dst0, DType::kF32, state), b = upload(dst0, DType::kF32, state);
    DeviceTensor a2 = upload(dst0, DType::kF32, state);
    cuda::column_sum_bf16_accumulate(state, state.stream(), static_cast<float*>(a.view.data()),
                                     aligned_ptr, N, C, "test");
    cuda::column_sum_bf16_accumulate(state, state.stream(), static_cast<float*>(b.view.data()),
                                     offset_ptr, N, C, "test");
    cuda::column_sum_bf16_accumulate(state, state.stream(), static_cast<float*>(a2.view.data()),
                                     aligned_ptr, N, C, "test");
    HostTensor ref = optest::copy_tensor(dst0.view());
    auto* r = static_cast<float*>(ref.view().data());
    for (int64_t c = 0; c < C; ++c) {
        double sum = 0.0;
        for (int64_t n = 0; n < N; ++n) sum += sv[n * C + c];
        r[c] = float(double(r[c]) + sum);
    }
    EXPECT_TRUE(matches(download_f32(a.view, state), ref, kF32Sum));
    EXPECT_TRUE(bitwise_equal(download_raw(b.view, state), download_raw(a.view, state)));
    EXPECT_TRUE(bitwise_equal(download_raw(a2.view, state), download_raw(a.view, state)));
}

TEST(CudaLinear, RejectsF32Activations) {
    GTEST_FLAG_SET(death_test_style, "threadsafe");
    EXPECT_DEATH(
        {
            CudaState state(0);
            DeviceTensor x = device_tensor(DType::kF32, {2, 8}, state);
            DeviceTensor w = device_tensor(DType::kBF16, {4, 8}, state);
            DeviceTensor y = device_tensor(DType::kBF16, {2, 4}, state);
            linear_forward(y.view, x.view, w.view, ConstTensorView(), state.context());
        },
        "linear_forward: the CUDA backend takes bf16 here, got f32");
}

}  // namespace
}  // namespace lathe
