// The CUDA GloVe trainer against its CPU twin (align/glove.h): one warp is bitwise equal to one
// CPU thread; the full-device Hogwild kernel reaches the same cost and the same neighbours.

// clang-format off
#include "ops/cuda/nvcc_compat.h"  // first: before any header that includes fmt
// clang-format on

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "align/embed_test_util.h"
#include "align/glove.h"
#include "ops/cuda/cuda_state.h"

#if defined(__NVCC__)
#pragma nv_diag_suppress 177
#endif

namespace lathe {
namespace {

struct Problem {
    EmbedVocab vocab;
    std::vector<GloveEntry> entries;
};

Problem make_problem(const std::vector<std::vector<int32_t>>& docs, const std::string& name,
                     int64_t min_count, int window, uint64_t seed) {
    const auto data = embedtest::write_docs(name, docs);
    auto vocab = embed_count_vocab(data, min_count, 2);
    LATHE_CHECK(vocab.ok(), "{}", vocab.status().to_string());
    CooccurOptions co;
    co.window = window;
    const auto x = cooccur_count(data, *vocab, co);
    GloveOptions o;
    o.seed = seed;
    return {std::move(vocab).value(), glove_make_entries(x, o)};
}

void expect_bitwise_equal(const GloveModel& a, const GloveModel& b) {
    EXPECT_EQ(a.w, b.w);
    EXPECT_EQ(a.c, b.c);
    EXPECT_EQ(a.bw, b.bw);
    EXPECT_EQ(a.bc, b.bc);
    EXPECT_EQ(a.gw, b.gw);
    EXPECT_EQ(a.gc, b.gc);
    EXPECT_EQ(a.gbw, b.gbw);
    EXPECT_EQ(a.gbc, b.gbc);
}

TEST(GloveCuda, OneWarpIsBitwiseTheSingleThreadCpuEpoch) {
    CudaState state(0);
    const Context ctx = state.context();
    // D = 300 (TokAlign's): not a multiple of 32, so lanes hold 10 or 9 dimensions.
    const Problem p =
        make_problem(embedtest::zipf_docs(200, 60, 3000, 21), "glove_cuda_zipf", 2, 15, 4);
    ASSERT_GT(p.entries.size(), 10000u);
    for (int64_t D : {300, 16}) {
        GloveModel cpu = glove_init(p.vocab.size(), D, 9);
        GloveCuda gpu(ctx, cpu, p.entries, /*warps=*/1);
        for (int it = 0; it < 2; ++it) {
            const double cpu_cost = glove_epoch_hogwild_cpu(cpu, p.entries, 0.05, 100.0, 1);
            const double gpu_cost = gpu.epoch(0.05, 100.0);
            EXPECT_EQ(gpu_cost, cpu_cost) << "D=" << D << " iteration " << it;
        }
        GloveModel back = glove_init(p.vocab.size(), D, 0);
        gpu.download(back);
        expect_bitwise_equal(back, cpu);
    }
}

TEST(GloveCuda, HogwildReachesTheCpuCostAndNeighbours) {
    CudaState state(0);
    const Context ctx = state.context();
    // A ring of 4000 ids: enough rows for about 250 warps in flight (the kernel keeps
    // warps <= V / 16, see glove.cu), few enough for a test of a second.
    constexpr int kRing = 4000;
    const Problem p =
        make_problem(embedtest::ring_docs(4000, 60, kRing, 3), "glove_cuda_ring", 5, 5, 1);
    const int64_t D = 16;
    GloveModel cpu = glove_init(p.vocab.size(), D, 1);
    GloveCuda gpu(ctx, cpu, p.entries);
    ASSERT_GE(gpu.warps(), 200);
    double cpu_cost = 0, gpu_cost = 0;
    for (int it = 0; it < 30; ++it) {
        cpu_cost = glove_epoch_hogwild_cpu(cpu, p.entries, 0.05, 100.0, 1);
        gpu_cost = gpu.epoch(0.05, 100.0);
    }
    // The arithmetic is pinned by OneWarpIsBitwiseTheSingleThreadCpuEpoch; the gap is the Hogwild
    // schedule. Unlike skip-gram's positions, GloVe's entries are shuffled co-occurrence pairs, so
    // the ~250 warps in flight update rows drawn across the 4000-id vocabulary: an entry's two
    // rows (of W and of C) are also being written by another warp with a probability of about
    // 2 x warps / V = 1/8 (the V / 16 cap in glove.cu), an unsynchronised read-modify-write that
    // can lose one of the two updates. Nothing bounds the lost updates' effect on the cost from the
    // arithmetic, so the tolerance is measured: the V / 16 cap is where the device cost comes
    // within 30% of the sequential run on this ring (docs/ALIGN.md: V / 4 warps gave 1.6x); GCIDE's
    // 31k rows gave 0.0198 against 0.0191 (+4%). The line below prints every run's ratio so the GPU
    // runs build up the distribution.
    std::printf("[glove hogwild] %d warps: cost %.5f against the sequential %.5f (%.3fx)\n",
                gpu.warps(), gpu_cost, cpu_cost, gpu_cost / cpu_cost);
    EXPECT_NEAR(gpu_cost, cpu_cost, 0.3 * cpu_cost);
    GloveModel back = glove_init(p.vocab.size(), D, 0);
    gpu.download(back);
    auto agreement = [&](const GloveModel& m) {
        return embedtest::nearest_neighbour_agreement(
            glove_output_vectors(m), D, p.vocab.size(), [&](int64_t a, int64_t b) {
                return embedtest::ring_distance(p.vocab.token_of_row[size_t(a)],
                                                p.vocab.token_of_row[size_t(b)], kRing) <= 2;
            });
    };
    const double cpu_agreement = agreement(cpu);
    EXPECT_GE(cpu_agreement, 0.5);
    EXPECT_GE(agreement(back), cpu_agreement - 0.05);
}

TEST(GloveCuda, FreshRandomProblemsStayFiniteAndCostFalls) {
    CudaState state(0);
    const Context ctx = state.context();
    for (uint64_t seed : {1u, 2u, 3u}) {
        const Problem p = make_problem(embedtest::zipf_docs(500, 80, 5000, seed * 7),
                                       "glove_cuda_rand", 1, 10, seed);
        GloveModel m = glove_init(p.vocab.size(), 64, seed);
        GloveCuda gpu(ctx, m, p.entries);
        const double first = gpu.epoch(0.05, 100.0);
        double last = first;
        for (int it = 0; it < 5; ++it) last = gpu.epoch(0.05, 100.0);
        EXPECT_LT(last, first) << "seed " << seed;
        gpu.download(m);
        for (float v : m.w) ASSERT_TRUE(std::isfinite(v));
    }
}

}  // namespace
}  // namespace lathe
