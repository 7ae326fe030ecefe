#include "ops/lm_head_cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "ops/linear.h"
#include "ops/op_test.h"

namespace lathe::optest {
namespace {

constexpr int64_t N = 7, C = 6, V = 11;

struct Problem {
    HostTensor x, w, targets;
};

Problem make_problem(Rng& rng) {
    Problem p{random_tensor(rng, Shape{N, C}), random_tensor(rng, Shape{V, C}),
              HostTensor(DType::kI32, Shape{N})};
    for (int64_t n = 0; n < N; ++n) p.targets.as<int32_t>()[n] = int32_t(rng.integer(0, V - 1));
    p.targets.as<int32_t>()[2] = kIgnoreIndex;
    p.targets.as<int32_t>()[5] = kIgnoreIndex;
    return p;
}

// Unfused: full logits through linear_forward, then log-softmax and NLL in fp64.
TEST(LmHeadCrossEntropy, EqualsUnfusedLogitsLogSoftmaxNll) {
    const Context ctx = cpu_context();
    Rng rng(101);
    Problem p = make_problem(rng);
    HostTensor logits = f32(Shape{N, V});
    linear_forward(logits.view(), p.x.view(), p.w.view(), {}, ctx);
    double sum = 0.0;
    int count = 0;
    std::vector<double> ref_losses(N, 0.0), ref_lse(N);
    for (int64_t n = 0; n < N; ++n) {
        const float* l = logits.as<float>() + n * V;
        double m = l[0], s = 0.0;
        for (int64_t v = 1; v < V; ++v) m = std::max(m, double(l[v]));
        for (int64_t v = 0; v < V; ++v) s += std::exp(l[v] - m);
        ref_lse[n] = m + std::log(s);
        const int32_t t = p.targets.as<int32_t>()[n];
        if (t == kIgnoreIndex) continue;
        ref_losses[n] = -(l[t] - ref_lse[n]);  // -log_softmax[t]
        sum += ref_losses[n];
        ++count;
    }
    for (int64_t nc : {int64_t(1), int64_t(3), N, N + 4}) {  // chunk sizes, including > N
        HostTensor scratch = f32(Shape{nc, V});
        HostTensor loss = f32(Shape{1}), losses = f32(Shape{N}), lse = f32(Shape{N});
        lm_head_cross_entropy_forward(loss.view(), losses.view(), lse.view(), p.x.view(),
                                      p.targets.view(), p.w.view(), scratch.view(), ctx);
        EXPECT_NEAR(loss.as<float>()[0], sum / count, 1e-6) << "Nc " << nc;
        for (int64_t n = 0; n < N; ++n) {
            EXPECT_NEAR(losses.as<float>()[n], ref_losses[n], 2e-6) << n;
            EXPECT_NEAR(lse.as<float>()[n], ref_lse[n], 2e-6) << n;
        }
    }
}

TEST(LmHeadCrossEntropy, GradientsMatchFiniteDifferencesAndUnfused) {
    const Context ctx = cpu_context();
    Rng rng(102);
    Problem p = make_problem(rng);
    const float dloss = 0.7f;
    HostTensor scratch = f32(Shape{3, V}), loss = f32(Shape{1}), lse = f32(Shape{N});
    auto objective = [&] {
        lm_head_cross_entropy_forward(loss.view(), {}, lse.view(), p.x.view(), p.targets.view(),
                                      p.w.view(), scratch.view(), ctx);
        return double(dloss) * loss.as<float>()[0];
    };
    objective();
    HostTensor dx = f32(Shape{N, C}), dw = f32(Shape{V, C});
    lm_head_cross_entropy_backward(dx.view(), dw.view(), p.x.view(), p.targets.view(), p.w.view(),
                                   lse.view(), dloss, scratch.view(), ctx);
    EXPECT_TRUE(gradient_matches(p.x, dx, objective)) << "x";
    EXPECT_TRUE(gradient_matches(p.w, dw, objective)) << "weight";
    for (int64_t c = 0; c < C; ++c) {  // ignored rows get no gradient
        EXPECT_EQ(dx.as<float>()[2 * C + c], 0.0f);
        EXPECT_EQ(dx.as<float>()[5 * C + c], 0.0f);
    }

    // Unfused backward: dlogits = dloss / count * (softmax - onehot), then linear_backward.
    HostTensor logits = f32(Shape{N, V}), dlogits = f32(Shape{N, V});
    linear_forward(logits.view(), p.x.view(), p.w.view(), {}, ctx);
    for (int64_t n = 0; n < N; ++n) {
        const int32_t t = p.targets.as<int32_t>()[n];
        if (t == kIgnoreIndex) continue;
        double m = -1e300, s = 0.0;
        for (int64_t v = 0; v < V; ++v) m = std::max(m, double(logits.as<float>()[n * V + v]));
        for (int64_t v = 0; v < V; ++v) s += std::exp(logits.as<float>()[n * V + v] - m);
        for (int64_t v = 0; v < V; ++v)
            dlogits.as<float>()[n * V + v] =
                float(dloss / 5.0 * (std::exp(logits.as<float>()[n * V + v] - m) / s - (v == t)));
    }
    HostTensor ref_dx = f32(Shape{N, C}), ref_dw = f32(Shape{V, C});
    linear_backward(ref_dx.view(), ref_dw.view(), {}, dlogits.view(), p.x.view(), p.w.view(),
                    GradMode::kOverwrite, ctx);
    EXPECT_TRUE(close_to(dx.view(), ref_dx.view(), 1e-5));
    EXPECT_TRUE(close_to(dw.view(), ref_dw.view(), 1e-5));

    // The fused forward+backward gives the same loss and gradients; dweight accumulates.
    objective();  // the gradient check left the loss of a perturbed x behind
    HostTensor loss2 = f32(Shape{1}), losses2 = f32(Shape{N}), dx2 = f32(Shape{N, C});
    HostTensor dw2 = copy_tensor(dw.view());
    lm_head_cross_entropy_forward_backward(loss2.view(), losses2.view(), dx2.view(), dw2.view(),
                                           p.x.view(), p.targets.view(), p.w.view(), dloss,
                                           scratch.view(), ctx);
    EXPECT_NEAR(loss2.as<float>()[0], loss.as<float>()[0], 1e-7);
    EXPECT_TRUE(close_to(dx2.view(), dx.view(), 1e-6));
    for (int64_t i = 0; i < V * C; ++i)
        EXPECT_NEAR(dw2.as<float>()[i], 2 * dw.as<float>()[i], 1e-6);
}

// dweight_mode kOverwrite (ops/linear.h): over several chunks the head's dweight is written,
// whatever it held (NaN here), with the bits += onto zeros gives; in both the backward and the
// fused forward+backward.
TEST(LmHeadCrossEntropy, OverwriteModeWritesTheWeightGradient) {
    const Context ctx = cpu_context();
    Rng rng(104);
    Problem p = make_problem(rng);
    HostTensor scratch = f32(Shape{3, V}), loss = f32(Shape{1}), lse = f32(Shape{N});
    LinearSpec over;
    over.dweight_mode = GradMode::kOverwrite;
    const float nan = std::numeric_limits<float>::quiet_NaN();
    HostTensor dx = f32(Shape{N, C}), dw_ref = f32(Shape{V, C}), dw = f32(Shape{V, C});
    lm_head_cross_entropy_forward_backward(loss.view(), {}, dx.view(), dw_ref.view(), p.x.view(),
                                           p.targets.view(), p.w.view(), 0.5f, scratch.view(), ctx);
    std::fill_n(dw.as<float>(), V * C, nan);
    lm_head_cross_entropy_forward_backward(loss.view(), {}, dx.view(), dw.view(), p.x.view(),
                                           p.targets.view(), p.w.view(), 0.5f, scratch.view(), ctx,
                                           over);
    EXPECT_TRUE(bitwise_equal(dw, dw_ref)) << "forward_backward";

    lm_head_cross_entropy_forward(loss.view(), {}, lse.view(), p.x.view(), p.targets.view(),
                                  p.w.view(), scratch.view(), ctx);
    HostTensor dw2_ref = f32(Shape{V, C}), dw2 = f32(Shape{V, C});
    lm_head_cross_entropy_backward(dx.view(), dw2_ref.view(), p.x.view(), p.targets.view(),
                                   p.w.view(), lse.view(), 0.5f, scratch.view(), ctx);
    std::fill_n(dw2.as<float>(), V * C, nan);
    lm_head_cross_entropy_backward(dx.view(), dw2.view(), p.x.view(), p.targets.view(), p.w.view(),
                                   lse.view(), 0.5f, scratch.view(), ctx, over);
    EXPECT_TRUE(bitwise_equal(dw2, dw2_ref)) << "backward";
}

TEST(LmHeadCrossEntropy, AllTargetsIgnoredGivesZeroLossAndGradients) {
    const Context ctx = cpu_context();
    Rng rng(103);
    Problem p = make_problem(rng);
    for (int64_t n = 0; n < N; ++n) p.targets.as<int32_t>()[n] = kIgnoreIndex;
    HostTensor scratch = f32(Shape{4, V}), loss = f32(Shape{1}),
               dx = random_tensor(rng, Shape{N, C});
    HostTensor dw = f32(Shape{V, C});
    lm_head_cross_entropy_forward_backward(loss.view(), {}, dx.view(), dw.view(), p.x.view(),
                                           p.targets.view(), p.w.view(), 1.0f, scratch.view(), ctx);
    EXPECT_EQ(loss.as<float>()[0], 0.0f);
    for (int64_t i = 0; i < N * C; ++i) EXPECT_EQ(dx.as<float>()[i], 0.0f);
    for (int64_t i = 0; i < V * C; ++i) EXPECT_EQ(dw.as<float>()[i], 0.0f);
}

TEST(LmHeadCrossEntropyDeathTest, TargetOutsideVocabularyStops) {
    Rng rng(104);
    Problem p = make_problem(rng);
    p.targets.as<int32_t>()[0] = int32_t(V);
    HostTensor scratch = f32(Shape{4, V}), loss = f32(Shape{1}), lse = f32(Shape{N});
    EXPECT_DEATH(
        lm_head_cross_entropy_forward(loss.view(), {}, lse.view(), p.x.view(), p.targets.view(),
                                      p.w.view(), scratch.view(), cpu_context()),
        "target 11 at row 0 is neither -100 nor in");
}

// The head's fp8 precisions: the CPU backend runs none (naming the op, the precision and the
// backend), and no backend runs a blockwise head (naming what to choose instead).
TEST(LmHeadCrossEntropyDeathTest, Fp8PrecisionsStopNamingWhy) {
    Rng rng(105);
    Problem p = make_problem(rng);
    HostTensor scratch = f32(Shape{4, V}), loss = f32(Shape{1}), lse = f32(Shape{N});
    HostTensor dx = f32(Shape{N, C}), dw = f32(Shape{V, C});
    const LinearSpec per_tensor{LinearPrecision::kFp8PerTensor, "lm_head"};
    const LinearSpec blockwise{LinearPrecision::kFp8Blockwise, "lm_head"};
    EXPECT_DEATH(
        lm_head_cross_entropy_forward(loss.view(), {}, lse.view(), p.x.view(), p.targets.view(),
                                      p.w.view(), scratch.view(), cpu_context(), per_tensor),
        "lm_head_cross_entropy_forward: fp8 linear: no kernel for fp8_per_tensor "
        "\\(lm_head\\) on the cpu backend");
    EXPECT_DEATH(lm_head_cross_entropy_forward_backward(
                     loss.view(), {}, dx.view(), dw.view(), p.x.view(), p.targets.view(),
                     p.w.view(), 1.0f, scratch.view(), cpu_context(), blockwise),
                 "lm_head_cross_entropy_forward_backward: the LM head has no fp8_blockwise "
                 "kernel.*use per-tensor scales");
    EXPECT_DEATH(lm_head_cross_entropy_backward(dx.view(), dw.view(), p.x.view(), p.targets.view(),
                                                p.w.view(), lse.view(), 1.0f, scratch.view(),
                                                cpu_context(), per_tensor),
                 "lm_head_cross_entropy_backward: fp8 linear: no kernel");
}

}  // namespace
}  // namespace lathe::optest
