#include "align/glove.h"

#include <gtest/gtest.h>

#include <cmath>

#include "align/embed_test_util.h"

namespace lathe {
namespace {

using embedtest::write_docs;

TEST(Glove, InitialisationIsGloveCsRangeAndSeeded) {
    const GloveModel a = glove_init(50, 20, 7);
    const GloveModel b = glove_init(50, 20, 7);
    const GloveModel c = glove_init(50, 20, 8);
    EXPECT_EQ(a.w, b.w);
    EXPECT_NE(a.w, c.w);
    EXPECT_NE(a.w, a.c);  // word and context vectors are drawn independently
    for (float v : a.w) {
        EXPECT_GE(v, -0.5f / 20);
        EXPECT_LT(v, 0.5f / 20);
    }
    for (float g : a.gw) EXPECT_EQ(g, 1.0f);
}

TEST(Glove, OneStepMatchesTheFormulaInDouble) {
    GloveModel m = glove_init(3, 5, 1);
    const GloveModel before = m;
    const float x = 3.0f;
    GloveOptions options;
    options.x_max = 10;
    options.alpha = 0.75;
    const CooccurEntry ce{2, 1, x};
    auto entries = glove_make_entries(std::span(&ce, 1), options);
    ASSERT_EQ(entries.size(), 1u);
    const double lr = 0.05;
    const double cost = glove_epoch_hogwild_cpu(m, entries, lr, 100.0, 1);

    const int64_t D = 5, a = 2, b = 1;
    double dot = 0;
    for (int64_t d = 0; d < D; ++d) dot += double(before.w[a * D + d]) * before.c[b * D + d];
    const double diff = dot + before.bw[a] + before.bc[b] - std::log(double(x));
    const double f = std::pow(x / 10.0, 0.75);
    EXPECT_NEAR(cost, 0.5 * f * diff * diff, 1e-6);
    for (int64_t d = 0; d < D; ++d) {
        const double g1 = f * diff * before.c[b * D + d] * lr;
        const double g2 = f * diff * before.w[a * D + d] * lr;
        EXPECT_NEAR(m.w[a * D + d], before.w[a * D + d] - g1, 1e-6);  // AdaGrad sums start at 1
        EXPECT_NEAR(m.c[b * D + d], before.c[b * D + d] - g2, 1e-6);
        EXPECT_NEAR(m.gw[a * D + d], 1 + g1 * g1, 1e-6);
    }
    EXPECT_NEAR(m.bw[a], before.bw[a] - f * diff, 1e-6);  // biases step with fdiff (glove.c)
    EXPECT_NEAR(m.gbc[b], 1 + f * diff * f * diff, 1e-6);
    EXPECT_EQ(m.w[0], before.w[0]);  // untouched rows stay
    EXPECT_EQ(m.c[2 * D], before.c[2 * D]);
}

TEST(Glove, ShuffleIsSeededPermutation) {
    std::vector<CooccurEntry> x;
    for (uint32_t i = 0; i < 1000; ++i) x.push_back({i, i + 1, 1.0f + float(i)});
    GloveOptions o;
    const auto a = glove_make_entries(x, o);
    const auto b = glove_make_entries(x, o);
    o.seed = 2;
    const auto c = glove_make_entries(x, o);
    std::vector<int> seen(1000, 0);
    int moved = 0, differ = 0;
    for (size_t i = 0; i < a.size(); ++i) {
        ++seen[a[i].row];
        moved += a[i].row != i;
        EXPECT_EQ(a[i].row, b[i].row);
        differ += a[i].row != c[i].row;
        EXPECT_EQ(a[i].col, a[i].row + 1);
        EXPECT_FLOAT_EQ(a[i].log_x, std::log(1.0f + float(a[i].row)));
        EXPECT_FLOAT_EQ(a[i].weight, a[i].row + 1.0 >= 10
                                         ? 1.0f
                                         : float(std::pow((a[i].row + 1.0) / 10.0, 0.75)));
    }
    for (int s : seen) EXPECT_EQ(s, 1);
    EXPECT_GT(moved, 900);
    EXPECT_GT(differ, 900);
}

// Trains on random walks around a ring (embed_test_util.h); returns the per-epoch costs, the
// output vectors and the token id of each row.
struct RingRun {
    std::vector<double> costs;
    std::vector<float> vectors;
    std::vector<int32_t> token_of_row;
};
constexpr int kRing = 40;
constexpr int64_t kDim = 16;
RingRun train_ring(int threads, int iters) {
    const auto data = write_docs("glove_ring", embedtest::ring_docs(300, 40, kRing, 3));
    auto vocab = embed_count_vocab(data, 5, 1);
    LATHE_CHECK(vocab.ok());
    CooccurOptions co;
    co.window = 5;
    const auto x = cooccur_count(data, *vocab, co);
    GloveOptions o;
    o.dim = kDim;
    const auto entries = glove_make_entries(x, o);
    GloveModel m = glove_init(vocab->size(), o.dim, 1);
    RingRun run;
    for (int it = 0; it < iters; ++it)
        run.costs.push_back(glove_epoch_hogwild_cpu(m, entries, o.lr, o.grad_clip, threads));
    run.vectors = glove_output_vectors(m);
    run.token_of_row = vocab->token_of_row;
    return run;
}

double ring_neighbour_agreement(const RingRun& run) {
    return embedtest::nearest_neighbour_agreement(
        run.vectors, kDim, int64_t(run.token_of_row.size()), [&](int64_t a, int64_t b) {
            return embedtest::ring_distance(run.token_of_row[size_t(a)],
                                            run.token_of_row[size_t(b)], kRing) <= 2;
        });
}

TEST(Glove, LearnsRingStructureAndCostFalls) {
    const RingRun one = train_ring(1, 30);
    EXPECT_LT(one.costs.back(), 0.25 * one.costs.front());
    for (size_t i = 1; i < one.costs.size(); ++i) EXPECT_LT(one.costs[i], one.costs[i - 1] * 1.01);
    EXPECT_GE(ring_neighbour_agreement(one), 0.9);

    // One thread is deterministic; Hogwild on several threads lands at about the same cost.
    const RingRun again = train_ring(1, 30);
    EXPECT_EQ(again.vectors, one.vectors);
    const RingRun three = train_ring(3, 30);
    EXPECT_NEAR(three.costs.back(), one.costs.back(), 0.2 * one.costs.back());
    EXPECT_GE(ring_neighbour_agreement(three), 0.9);
}

}  // namespace
}  // namespace lathe
