#include "ops/linear.h"

#include <algorithm>
#include <limits>
#include <string>

#include "ops/cuda/gemv.h"
#include "ops/gelu.h"
#include "ops/op_test.h"
#include "ops/residual.h"

namespace lathe::optest {
namespace {

TEST(Linear, ForwardUsesTheOutInWeightLayout) {
    HostTensor x = tensor_of(Shape{1, 2}, {1, 2});
    HostTensor w = tensor_of(Shape{3, 2}, {1, 0, 0, 1, 1, 1});  // [out, in]
    HostTensor b = tensor_of(Shape{3}, {0.5f, 0, -1});
    HostTensor y = f32(Shape{1, 3});
    linear_forward(y.view(), x.view(), w.view(), b.view(), cpu_context());
    EXPECT_EQ(y.as<float>()[0], 1.5f);
    EXPECT_EQ(y.as<float>()[1], 2.0f);
    EXPECT_EQ(y.as<float>()[2], 2.0f);
    linear_forward(y.view(), x.view(), w.view(), {}, cpu_context());
    EXPECT_EQ(y.as<float>()[0], 1.0f);
}

TEST(Linear, GradientsMatchFiniteDifferences) {
    const Context ctx = cpu_context();
    Rng rng(41);
    const int64_t B = 2, T = 3, I = 5, O = 4;
    HostTensor x = random_tensor(rng, Shape{B, T, I}), w = random_tensor(rng, Shape{O, I});
    HostTensor b = random_tensor(rng, Shape{O});
    HostTensor y = f32(Shape{B, T, O}), r = random_tensor(rng, Shape{B, T, O});
    auto loss = [&] {
        linear_forward(y.view(), x.view(), w.view(), b.view(), ctx);
        return weighted_sum(y.view(), r.view());
    };
    HostTensor dx = f32(Shape{B, T, I}), dw = f32(Shape{O, I}), db = f32(Shape{O});
    linear_backward(dx.view(), dw.view(), db.view(), r.view(), x.view(), w.view(),
                    GradMode::kOverwrite, ctx);
    EXPECT_TRUE(gradient_matches(x, dx, loss)) << "x";
    EXPECT_TRUE(gradient_matches(w, dw, loss)) << "weight";
    EXPECT_TRUE(gradient_matches(b, db, loss)) << "bias";

    HostTensor dx1 = copy_tensor(dx.view()), dw1 = copy_tensor(dw.view());
    linear_backward(dx.view(), dw.view(), {}, r.view(), x.view(), w.view(), GradMode::kAccumulate,
                    ctx);
    for (int64_t i = 0; i < B * T * I; ++i)
        EXPECT_FLOAT_EQ(dx.as<float>()[i], 2 * dx1.as<float>()[i]);
    for (int64_t i = 0; i < O * I; ++i) EXPECT_FLOAT_EQ(dw.as<float>()[i], 2 * dw1.as<float>()[i]);
}

// The fused GELU projections are, on the CPU, exactly the unfused sequence (linear, then GELU):
// same values bit for bit, for both GELU forms, with and without biases.
void check_linear_gelu_is_the_unfused_sequence(GeluKind kind, bool bias, uint64_t seed) {
    SCOPED_TRACE(::testing::Message() << "tanh=" << (kind == GeluKind::kTanh) << " bias=" << bias);
    const Context ctx = cpu_context();
    Rng rng(seed);
    const int64_t N = 6, C = 5, F = 12;
    const HostTensor x = random_tensor(rng, Shape{2, N / 2, C});
    const HostTensor w_up = random_tensor(rng, Shape{F, C}), b_up = random_tensor(rng, Shape{F});
    const HostTensor w_down = random_tensor(rng, Shape{C, F});
    const HostTensor dy = random_tensor(rng, Shape{2, N / 2, C});
    const HostTensor gb_up0 = random_tensor(rng, Shape{F}), gw0 = random_tensor(rng, Shape{C, F});
    const HostTensor gb0 = random_tensor(rng, Shape{C});
    const ConstTensorView b = bias ? b_up.view() : ConstTensorView();

    // Unfused: linear, gelu; then linear_backward, gelu_backward and the up projection's bias sum.
    HostTensor pre_ref = f32(Shape{2, N / 2, F}), act_ref = f32(Shape{2, N / 2, F});
    linear_forward(pre_ref.view(), x.view(), w_up.view(), b, ctx);
    gelu_forward(act_ref.view(), pre_ref.view(), kind, ctx);
    HostTensor dact = f32(Shape{2, N / 2, F}), dpre_ref = f32(Shape{2, N / 2, F});
    HostTensor gw_ref = copy_tensor(gw0.view()), gb_ref = copy_tensor(gb0.view());
    HostTensor gb_up_ref = copy_tensor(gb_up0.view()), gw_up = f32(Shape{F, C});
    linear_backward(dact.view(), gw_ref.view(), gb_ref.view(), dy.view(), act_ref.view(),
                    w_down.view(), GradMode::kOverwrite, ctx);
    gelu_backward(dpre_ref.view(), dact.view(), pre_ref.view(), kind, ctx);
    linear_backward(TensorView(), gw_up.view(), gb_up_ref.view(), dpre_ref.view(), x.view(),
                    w_up.view(), GradMode::kOverwrite, ctx);

    // Fused.
    HostTensor pre = f32(Shape{2, N / 2, F}), act = f32(Shape{2, N / 2, F});
    linear_gelu_forward(act.view(), pre.view(), x.view(), w_up.view(), b, kind, ctx);
    HostTensor dpre = random_tensor(rng, Shape{2, N / 2, F});  // overwritten, whatever it held
    HostTensor gw = copy_tensor(gw0.view()), gb = copy_tensor(gb0.view());
    HostTensor gb_up = copy_tensor(gb_up0.view());
    linear_gelu_backward(dpre.view(), gb_up.view(), gw.view(), gb.view(), dy.view(), act.view(),
                         pre.view(), w_down.view(), kind, ctx);
    EXPECT_TRUE(bitwise_equal(pre, pre_ref)) << "pre";
    EXPECT_TRUE(bitwise_equal(act, act_ref)) << "act";
    EXPECT_TRUE(bitwise_equal(dpre, dpre_ref)) << "dpre";
    EXPECT_TRUE(bitwise_equal(gw, gw_ref)) << "dweight";
    EXPECT_TRUE(bitwise_equal(gb, gb_ref)) << "dbias";
    EXPECT_TRUE(bitwise_equal(gb_up, gb_up_ref)) << "dpre_bias";

    // Frozen biases: null gradients are skipped, the rest unchanged.
    HostTensor dpre2 = f32(Shape{2, N / 2, F}), gw2 = copy_tensor(gw0.view());
    linear_gelu_backward(dpre2.view(), TensorView(), gw2.view(), TensorView(), dy.view(),
                         act.view(), pre.view(), w_down.view(), kind, ctx);
    EXPECT_TRUE(bitwise_equal(dpre2, dpre_ref)) << "dpre, frozen biases";
    EXPECT_TRUE(bitwise_equal(gw2, gw_ref)) << "dweight, frozen biases";
}

TEST(LinearGelu, IsTheUnfusedSequenceOnTheCpu) {
    check_linear_gelu_is_the_unfused_sequence(GeluKind::kTanh, true, 51);
    check_linear_gelu_is_the_unfused_sequence(GeluKind::kErf, true, 52);
    check_linear_gelu_is_the_unfused_sequence(GeluKind::kTanh, false, 53);
}

// LinearSpec::dweight_mode kOverwrite: dweight = dy^T x, whatever it held (NaN here), bit for
// bit what += onto zeros gives; dbias (and linear_gelu_backward's dpre_bias) still accumulate.
TEST(Linear, OverwriteModeWritesTheWeightGradient) {
    const Context ctx = cpu_context();
    Rng rng(55);
    const int64_t N = 6, I = 5, O = 4;
    const HostTensor x = random_tensor(rng, Shape{N, I}), w = random_tensor(rng, Shape{O, I});
    const HostTensor dy = random_tensor(rng, Shape{N, O}), db0 = random_tensor(rng, Shape{O});
    LinearSpec over;
    over.dweight_mode = GradMode::kOverwrite;
    HostTensor dw_ref = f32(Shape{O, I}), db_ref = copy_tensor(db0.view());
    linear_backward({}, dw_ref.view(), db_ref.view(), dy.view(), x.view(), w.view(),
                    GradMode::kOverwrite, ctx);
    HostTensor dw = f32(Shape{O, I}), db = copy_tensor(db0.view());
    std::fill_n(dw.as<float>(), O * I, std::numeric_limits<float>::quiet_NaN());
    linear_backward({}, dw.view(), db.view(), dy.view(), x.view(), w.view(), GradMode::kOverwrite,
                    ctx, over);
    EXPECT_TRUE(bitwise_equal(dw, dw_ref)) << "dweight";
    EXPECT_TRUE(bitwise_equal(db, db_ref)) << "dbias accumulates";

    // The GELU MLP's down projection: the same for its dweight.
    const HostTensor pre = random_tensor(rng, Shape{N, I});
    HostTensor act = f32(Shape{N, I});
    gelu_forward(act.view(), pre.view(), GeluKind::kTanh, ctx);
    HostTensor dpre_ref = f32(Shape{N, I}), gw_ref = f32(Shape{O, I});
    linear_gelu_backward(dpre_ref.view(), TensorView(), gw_ref.view(), TensorView(), dy.view(),
                         act.view(), pre.view(), w.view(), GeluKind::kTanh, ctx);
    HostTensor dpre = f32(Shape{N, I}), gw = f32(Shape{O, I});
    std::fill_n(gw.as<float>(), O * I, std::numeric_limits<float>::quiet_NaN());
    linear_gelu_backward(dpre.view(), TensorView(), gw.view(), TensorView(), dy.view(), act.view(),
                         pre.view(), w.view(), GeluKind::kTanh, ctx, over);
    EXPECT_TRUE(bitwise_equal(gw, gw_ref)) << "linear_gelu_backward dweight";
    EXPECT_TRUE(bitwise_equal(dpre, dpre_ref)) << "linear_gelu_backward dpre";
}

// The projection joining the residual stream is, on the CPU, the linear then the residual add.
TEST(LinearResidual, IsTheLinearThenTheAddOnTheCpu) {
    const Context ctx = cpu_context();
    Rng rng(54);
    const HostTensor x = random_tensor(rng, Shape{2, 3, 5}), w = random_tensor(rng, Shape{4, 5});
    const HostTensor b = random_tensor(rng, Shape{4}), r = random_tensor(rng, Shape{2, 3, 4});
    HostTensor tmp = f32(Shape{2, 3, 4}), ref = f32(Shape{2, 3, 4}), y = f32(Shape{2, 3, 4});
    linear_forward(tmp.view(), x.view(), w.view(), b.view(), ctx);
    residual_forward(ref.view(), r.view(), tmp.view(), ctx);
    linear_residual_forward(y.view(), x.view(), w.view(), b.view(), r.view(), ctx);
    EXPECT_TRUE(bitwise_equal(y, ref));
}

TEST(LinearResidualDeathTest, RejectsAnOutputThatIsTheResidual) {
    HostTensor x = f32(Shape{2, 4}), w = f32(Shape{4, 4}), y = f32(Shape{2, 4});
    EXPECT_DEATH(linear_residual_forward(y.view(), x.view(), w.view(), {}, y.view(), cpu_context()),
                 "linear_residual_forward: y must be another buffer than residual and x");
}

TEST(LinearGeluDeathTest, RejectsMismatchedShapes) {
    const Context ctx = cpu_context();
    HostTensor x = f32(Shape{4, 3}), w = f32(Shape{8, 3}), pre = f32(Shape{4, 8});
    HostTensor act = f32(Shape{4, 7});
    EXPECT_DEATH(
        linear_gelu_forward(act.view(), pre.view(), x.view(), w.view(), {}, GeluKind::kTanh, ctx),
        "linear_gelu_forward: act");
}

// Every linear op checks the precision it is asked for first: the native one runs (a role
// changes nothing), an fp8 one stops naming the op, the precision, the role and the backend.
TEST(Linear, Fp8PrecisionStopsNamingOpRoleAndBackend) {
    GTEST_FLAG_SET(death_test_style, "threadsafe");
    const Context ctx = cpu_context();
    Rng rng(43);
    const int64_t N = 3, I = 4, O = 8;
    HostTensor x = random_tensor(rng, Shape{N, I}), w = random_tensor(rng, Shape{O, I});
    HostTensor b = random_tensor(rng, Shape{O}), res = random_tensor(rng, Shape{N, O});
    HostTensor y1 = f32(Shape{N, O}), y2 = f32(Shape{N, O}), pre = f32(Shape{N, O});
    HostTensor dy = random_tensor(rng, Shape{N, O}), dx = f32(Shape{N, I});
    const LinearSpec native{LinearPrecision::kNative, "qkv"};
    linear_forward(y1.view(), x.view(), w.view(), b.view(), ctx);
    linear_forward(y2.view(), x.view(), w.view(), b.view(), ctx, native);
    EXPECT_TRUE(bitwise_equal(y1, y2));

    const LinearSpec fp8{LinearPrecision::kFp8PerTensor, "mlp_up"};
    const char* want = "fp8 linear: no kernel for fp8_per_tensor \\(mlp_up\\) on the cpu backend";
    EXPECT_DEATH(linear_forward(y1.view(), x.view(), w.view(), b.view(), ctx, fp8),
                 std::string("linear_forward: ") + want);
    EXPECT_DEATH(
        linear_residual_forward(y1.view(), x.view(), w.view(), b.view(), res.view(), ctx, fp8),
        std::string("linear_residual_forward: ") + want);
    EXPECT_DEATH(linear_backward(dx.view(), {}, {}, dy.view(), x.view(), w.view(),
                                 GradMode::kOverwrite, ctx, fp8),
                 std::string("linear_backward: ") + want);
    EXPECT_DEATH(linear_gelu_forward(y1.view(), pre.view(), x.view(), w.view(), b.view(),
                                     GeluKind::kTanh, ctx, fp8),
                 std::string("linear_gelu_forward: ") + want);
    HostTensor w2 = random_tensor(rng, Shape{I, O}), dy2 = random_tensor(rng, Shape{N, I});
    HostTensor dpre = f32(Shape{N, O});
    EXPECT_DEATH(linear_gelu_backward(dpre.view(), {}, {}, {}, dy2.view(), y1.view(), pre.view(),
                                      w2.view(), GeluKind::kTanh, ctx, fp8),
                 std::string("linear_gelu_backward: ") + want);
    EXPECT_DEATH(linear_forward(y1.view(), x.view(), w.view(), b.view(), ctx,
                                LinearSpec{LinearPrecision::kFp8Blockwise, {}}),
                 "no kernel for fp8_blockwise \\(linear\\)");
}

// What the decode skinny GEMM (ops/cuda/gemv.h, the CUDA linear ops' choice with
// LinearSpec::skinny_gemv) refuses, leaving the problem to cuBLASLt: more rows than
// kGemvMaxRows, K not whole chunks, x or weight not 16-byte aligned, and a K or N the kernel's
// int indexing cannot hold (2^31 and up). The check reads only shapes and addresses.
TEST(CudaGemvSupports, OnlyWholeAlignedChunksAndIntSizes) {
    alignas(16) static const bf16 buf[16] = {};
    const int64_t big = int64_t(1) << 31;
    EXPECT_TRUE(cuda::gemv_supports(16, 8, 1, buf, buf));
    EXPECT_FALSE(cuda::gemv_supports(17, 8, 1, buf, buf));
    EXPECT_FALSE(cuda::gemv_supports(0, 8, 1, buf, buf));
    EXPECT_FALSE(cuda::gemv_supports(1, 12, 1, buf, buf));
    EXPECT_FALSE(cuda::gemv_supports(1, 8, 1, buf + 1, buf));
    EXPECT_FALSE(cuda::gemv_supports(1, 8, 1, buf, buf + 4));
    EXPECT_FALSE(cuda::gemv_supports(1, 8, 0, buf, buf));
    EXPECT_TRUE(cuda::gemv_supports(1, big - 8, 1, buf, buf));
    EXPECT_FALSE(cuda::gemv_supports(1, big, 1, buf, buf));
    EXPECT_TRUE(cuda::gemv_supports(1, 8, big - 1, buf, buf));
    EXPECT_FALSE(cuda::gemv_supports(1, 8, big, buf, buf));
    EXPECT_FALSE(cuda::gemv_supports(1, 8, big + 4, buf, buf));
}

}  // namespace
}  // namespace lathe::optest
