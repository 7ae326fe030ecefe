// clang-format off
#include "ops/cuda/nvcc_compat.h"  // first: before any header that includes fmt
// clang-format on

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

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
    SCOPED_TRACE(::testing::Message()
                 << "N=" << c.N << " I=" << c.I << " O=" << c.O << " bias=" << c.bias);
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

    // dweight_mode kOverwrite: dweight = dy^T x over whatever it held (NaN: device_tensor's
    // poison), against the CPU's = (which is += onto zeros); dbias still accumulates.
    LinearSpec over;
    over.dweight_mode = GradMode::kOverwrite;
    HostTensor dw_over_ref(DType::kF32, {c.O, c.I});
    HostTensor db_over_ref = optest::copy_tensor(db0.view());
    linear_backward(TensorView(), dw_over_ref.view(), db_over_ref.view(), dy.view(), x.view(),
                    w.view(), GradMode::kOverwrite, cpu, over);
    DeviceTensor gw_over = device_tensor(DType::kF32, {c.O, c.I}, state);
    DeviceTensor gb_over = upload(db0, DType::kF32, state);
    linear_backward(TensorView(), gw_over.view, gb_over.view, ddy.view, dx_in.view, dw_in.view,
                    GradMode::kOverwrite, gpu, over);
    EXPECT_TRUE(matches(download_f32(gw_over.view, state), dw_over_ref, kF32Sum)) << "dweight =";
    EXPECT_TRUE(matches(download_f32(gb_over.view, state), db_over_ref, kF32Sum)) << "dbias +=";

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
    cuda::column_sum_bf16_accumulate(static_cast<float*>(a.view.data()), aligned_ptr, N, C, "test",
                                     state, state.stream());
    cuda::column_sum_bf16_accumulate(static_cast<float*>(b.view.data()), offset_ptr, N, C, "test",
                                     state, state.stream());
    cuda::column_sum_bf16_accumulate(static_cast<float*>(a2.view.data()), aligned_ptr, N, C, "test",
                                     state, state.stream());
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

// A projection joining the residual stream (one GEMM with the residual as C) against its CPU twin
// (linear, then the add), with and without bias, on aligned and unaligned sizes.
void check_linear_residual(int64_t N, int64_t I, int64_t O, bool bias, uint64_t seed) {
    SCOPED_TRACE(::testing::Message() << "N=" << N << " I=" << I << " O=" << O << " bias=" << bias);
    CudaState state(0);
    const Context gpu = state.context(), cpu = cpu_context();
    optest::Rng rng(seed);
    const HostTensor x = random_bf16_values(rng, {N, I});
    const HostTensor w = random_bf16_values(rng, {O, I}, -0.2f, 0.2f);
    const HostTensor b = random_bf16_values(rng, {O});
    const HostTensor r = random_bf16_values(rng, {N, O}, -4.0f, 4.0f);
    HostTensor ref(DType::kF32, {N, O});
    linear_residual_forward(ref.view(), x.view(), w.view(), bias ? b.view() : ConstTensorView(),
                            r.view(), cpu);
    DeviceTensor gx = upload(x, DType::kBF16, state), gw = upload(w, DType::kBF16, state);
    DeviceTensor gb = upload(b, DType::kBF16, state), gr = upload(r, DType::kBF16, state);
    DeviceTensor y = device_tensor(DType::kBF16, {N, O}, state);
    linear_residual_forward(y.view, gx.view, gw.view, bias ? gb.view : TensorView(), gr.view, gpu);
    EXPECT_TRUE(matches(download_f32(y.view, state), ref, kBf16Sum));
    // The residual is only read.
    EXPECT_TRUE(bitwise_equal(download_raw(gr.view, state),
                              download_raw(upload(r, DType::kBF16, state).view, state)));
}

TEST(CudaLinearResidual, MatchesCpu) {
    check_linear_residual(96, 128, 64, true, 27);
    check_linear_residual(33, 64, 40, false, 28);
    check_linear_residual(7, 36, 20, true, 29);  // rows of 72 and 40 bytes
}

struct LinearGeluCase {
    int64_t N, C, F;  // rows, model width, GELU width: up (F, C), down (C, F)
    GeluKind kind;
    bool bias;
};

// The fused GELU projections (the MLP of a GELU block) against their CPU twin, the unfused
// sequence, on the same bf16-valued inputs: forward (act and the saved pre-activation), then the
// down projection's backward (d pre, the up projection's bias gradient, the down projection's
// weight and bias gradients, accumulating onto random values); then the same backward again from
// the same starting point, bit for bit.
void check_linear_gelu(const LinearGeluCase& c, uint64_t seed) {
    SCOPED_TRACE(::testing::Message() << "N=" << c.N << " C=" << c.C << " F=" << c.F << " tanh="
                                      << (c.kind == GeluKind::kTanh) << " bias=" << c.bias);
    CudaState state(0);
    const Context gpu = state.context(), cpu = cpu_context();
    optest::Rng rng(seed);
    const HostTensor x = random_bf16_values(rng, {c.N, c.C});
    const HostTensor w_up = random_bf16_values(rng, {c.F, c.C}, -0.2f, 0.2f);
    const HostTensor b_up = random_bf16_values(rng, {c.F});
    const HostTensor w_down = random_bf16_values(rng, {c.C, c.F}, -0.2f, 0.2f);
    // The backward's saved inputs are drawn directly, as bf16 values both sides read: pre over
    // GELU's curved range, act anything (the op only multiplies by it).
    const HostTensor pre = random_bf16_values(rng, {c.N, c.F}, -4.0f, 4.0f);
    const HostTensor act = random_bf16_values(rng, {c.N, c.F});
    const HostTensor dy = random_bf16_values(rng, {c.N, c.C});
    const HostTensor gb_up0 = optest::random_tensor(rng, {c.F});
    const HostTensor gw0 = optest::random_tensor(rng, {c.C, c.F});
    const HostTensor gb0 = optest::random_tensor(rng, {c.C});

    // CPU twin.
    HostTensor pre_ref(DType::kF32, {c.N, c.F}), act_ref(DType::kF32, {c.N, c.F});
    linear_gelu_forward(act_ref.view(), pre_ref.view(), x.view(), w_up.view(),
                        c.bias ? b_up.view() : ConstTensorView(), c.kind, cpu);
    HostTensor dpre_ref(DType::kF32, {c.N, c.F});
    HostTensor gb_up_ref = optest::copy_tensor(gb_up0.view());
    HostTensor gw_ref = optest::copy_tensor(gw0.view()), gb_ref = optest::copy_tensor(gb0.view());
    linear_gelu_backward(dpre_ref.view(), c.bias ? gb_up_ref.view() : TensorView(), gw_ref.view(),
                         c.bias ? gb_ref.view() : TensorView(), dy.view(), act.view(), pre.view(),
                         w_down.view(), c.kind, cpu);

    // CUDA forward.
    DeviceTensor gx = upload(x, DType::kBF16, state), gw_up = upload(w_up, DType::kBF16, state);
    DeviceTensor gb_upw = upload(b_up, DType::kBF16, state);
    DeviceTensor gpre = device_tensor(DType::kBF16, {c.N, c.F}, state);
    DeviceTensor gact = device_tensor(DType::kBF16, {c.N, c.F}, state);
    linear_gelu_forward(gact.view, gpre.view, gx.view, gw_up.view,
                        c.bias ? gb_upw.view : TensorView(), c.kind, gpu);
    EXPECT_TRUE(matches(download_f32(gpre.view, state), pre_ref, kBf16Sum)) << "pre";
    // act = gelu of an fp32 sum (the epilogue) or of its bf16 rounding (the separate kernel):
    // one rounding of the sum, one of the result.
    EXPECT_TRUE(matches(download_f32(gact.view, state), act_ref, kBf16Derived)) << "act";

    // CUDA backward, twice from the same start.
    DeviceTensor gw_down = upload(w_down, DType::kBF16, state);
    DeviceTensor dpre_in = upload(pre, DType::kBF16, state),
                 dact = upload(act, DType::kBF16, state);
    DeviceTensor ddy = upload(dy, DType::kBF16, state);
    HostTensor first[4];
    for (int run = 0; run < 2; ++run) {
        DeviceTensor dpre = device_tensor(DType::kBF16, {c.N, c.F}, state);
        DeviceTensor g_bup = upload(gb_up0, DType::kF32, state);
        DeviceTensor g_w = upload(gw0, DType::kF32, state), g_b = upload(gb0, DType::kF32, state);
        linear_gelu_backward(dpre.view, c.bias ? g_bup.view : TensorView(), g_w.view,
                             c.bias ? g_b.view : TensorView(), ddy.view, dact.view, dpre_in.view,
                             gw_down.view, c.kind, gpu);
        HostTensor got[4] = {download_raw(dpre.view, state), download_raw(g_bup.view, state),
                             download_raw(g_w.view, state), download_raw(g_b.view, state)};
        if (run == 0) {
            // d pre: the bf16 rounding of (dy W) * gelu'(pre).
            EXPECT_TRUE(matches(download_f32(dpre.view, state), dpre_ref, kBf16Sum)) << "dpre";
            // Its column sums: cuBLASLt may add the rounded or the unrounded values.
            EXPECT_TRUE(matches(download_f32(g_bup.view, state), gb_up_ref, kBf16Sum))
                << "dpre_bias";
            EXPECT_TRUE(matches(download_f32(g_w.view, state), gw_ref, kF32Sum)) << "dweight";
            EXPECT_TRUE(matches(download_f32(g_b.view, state), gb_ref, kF32Sum)) << "dbias";
            for (int i = 0; i < 4; ++i) first[i] = std::move(got[i]);
        } else {
            for (int i = 0; i < 4; ++i)
                EXPECT_TRUE(bitwise_equal(got[i], first[i])) << "output " << i << " of a rerun";
        }
    }
}

TEST(CudaLinearGelu, TanhMatchesCpu) {
    check_linear_gelu({96, 64, 256, GeluKind::kTanh, true}, 21);
}

TEST(CudaLinearGelu, TanhWithoutBiasesMatchesCpu) {
    check_linear_gelu({64, 64, 128, GeluKind::kTanh, false}, 22);
}

TEST(CudaLinearGelu, ErfMatchesCpu) {
    check_linear_gelu({96, 64, 256, GeluKind::kErf, true}, 23);  // the separate-kernel path
}

TEST(CudaLinearGelu, TanhMatchesCpuOnUnalignedSizes) {
    check_linear_gelu({7, 36, 20, GeluKind::kTanh, true}, 24);  // F % 8 != 0: no epilogue
}

TEST(CudaLinearGelu, TanhMatchesCpuOnModelSizedRows) {
    // GPT-2's MLP on 1024 tokens: several row tiles feed each bias-gradient sum.
    check_linear_gelu({1024, 768, 3072, GeluKind::kTanh, true}, 25);
}

// Which GELU cuBLASLt's epilogue computes. With W the identity and no bias the pre-activation is
// x exactly, so act is gelu(x) rounded once. Over x in [-3.5, -2], where the two forms differ
// most relative to GELU's value (up to 4e-4 absolute, ~10% relative; elsewhere the difference
// drowns in bf16 rounding), act must be closer to the tanh form, which is what the fusion is used
// for, than to the erf form: an erf epilogue would sit at bf16-rounding distance from the erf
// values and fail this. (A fast hardware tanh in the epilogue would add its own small error;
// the comparison leaves room for that.)
TEST(CudaLinearGelu, EpilogueIsTheTanhForm) {
    const int64_t N = 256, I = 16;
    CudaState state(0);
    const Context gpu = state.context();
    optest::Rng rng(26);
    const HostTensor x = random_bf16_values(rng, {N, I}, -3.5f, -2.0f);
    HostTensor w(DType::kF32, {I, I});
    for (int64_t i = 0; i < I * I; ++i) w.as<float>()[i] = (i / I == i % I) ? 1.0f : 0.0f;
    DeviceTensor gx = upload(x, DType::kBF16, state), gw = upload(w, DType::kBF16, state);
    DeviceTensor pre = device_tensor(DType::kBF16, {N, I}, state);
    DeviceTensor act = device_tensor(DType::kBF16, {N, I}, state);
    linear_gelu_forward(act.view, pre.view, gx.view, gw.view, TensorView(), GeluKind::kTanh, gpu);
    const HostTensor got = download_f32(act.view, state);
    const HostTensor got_pre = download_f32(pre.view, state);
    double d_tanh = 0.0, d_erf = 0.0;
    for (int64_t i = 0; i < N * I; ++i) {
        const double v = x.as<float>()[i];
        ASSERT_EQ(double(got_pre.as<float>()[i]), v) << "pre-activation " << i;
        const double t =
            0.5 * v * (1.0 + std::tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)));
        const double e = 0.5 * v * (1.0 + std::erf(v * 0.7071067811865476));
        const double g = got.as<float>()[i];
        d_tanh += (g - t) * (g - t);
        d_erf += (g - e) * (g - e);
    }
    d_tanh = std::sqrt(d_tanh / double(N * I));
    d_erf = std::sqrt(d_erf / double(N * I));
    std::printf("GELU epilogue: rms distance to the tanh form %.3g, to the erf form %.3g\n", d_tanh,
                d_erf);
    EXPECT_LT(d_tanh, d_erf);
}

}  // namespace
}  // namespace lathe
