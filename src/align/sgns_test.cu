// The CUDA skip-gram trainer against its CPU twin (align/sgns.h): one warp is bitwise equal to
// one CPU thread; the full-device Hogwild kernel reaches the CPU's loss and neighbours.

// clang-format off
#include "ops/cuda/nvcc_compat.h"  // first: before any header that includes fmt
// clang-format on

#include <gtest/gtest.h>

#include <cstdio>

#include "align/embed_test_util.h"
#include "align/sgns.h"
#include "ops/cuda/cuda_state.h"

#if defined(__NVCC__)
#pragma nv_diag_suppress 177
#endif

namespace lathe {
namespace {

struct Problem {
    EmbedVocab vocab;
    SgnsCorpus corpus;
};

Problem make_problem(const std::vector<std::vector<int32_t>>& docs, const std::string& name,
                     int64_t min_count) {
    const auto data = embedtest::write_docs(name, docs);
    auto vocab = embed_count_vocab(data, min_count, 2);
    LATHE_CHECK(vocab.ok(), "{}", vocab.status().to_string());
    auto corpus = sgns_load_corpus(data, *vocab);
    LATHE_CHECK(corpus.ok());
    return {std::move(vocab).value(), std::move(corpus).value()};
}

TEST(SgnsCuda, OneWarpIsBitwiseTheSingleThreadCpuEpoch) {
    CudaState state(0);
    const Context ctx = state.context();
    const Problem p = make_problem(embedtest::zipf_docs(100, 80, 2000, 13), "sgns_cuda_zipf", 2);
    for (int64_t D : {300, 16}) {
        SgnsOptions o;
        o.dim = D;
        o.window = 5;
        o.epochs = 2;
        o.threads = 1;
        o.subsample = 1e-3;
        const SgnsTables tables = sgns_make_tables(p.vocab, o);
        SgnsModel cpu = sgns_init(p.vocab.size(), D, 3);
        SgnsCuda gpu(ctx, cpu, p.corpus, tables, /*warps=*/1);
        for (int e = 0; e < o.epochs; ++e) {
            const double cpu_loss = sgns_epoch_hogwild_cpu(cpu, p.corpus, tables, o, e);
            const double gpu_loss = gpu.epoch(o, e);
            EXPECT_EQ(gpu_loss, cpu_loss) << "D=" << D << " epoch " << e;
        }
        SgnsModel back = sgns_init(p.vocab.size(), D, 0);
        gpu.download(back);
        EXPECT_EQ(back.in, cpu.in) << "D=" << D;
        EXPECT_EQ(back.out, cpu.out) << "D=" << D;
    }
}

TEST(SgnsCuda, HogwildReachesTheCpuLossAndNeighbours) {
    CudaState state(0);
    const Context ctx = state.context();
    // A ring of 4000 ids: about 250 warps in flight (warps <= V / 16, see sgns.cu).
    constexpr int kRing = 4000;
    const Problem p = make_problem(embedtest::ring_docs(4000, 60, kRing, 3), "sgns_cuda_ring", 5);
    const int64_t D = 16;
    SgnsOptions o;
    o.dim = D;
    o.window = 3;
    o.epochs = 10;
    o.threads = 1;
    o.subsample = 1e-3;
    const SgnsTables tables = sgns_make_tables(p.vocab, o);
    SgnsModel cpu = sgns_init(p.vocab.size(), D, 1);
    SgnsCuda gpu(ctx, cpu, p.corpus, tables);
    ASSERT_GE(gpu.warps(), 200);
    double cpu_loss = 0, gpu_loss = 0;
    for (int e = 0; e < o.epochs; ++e) {
        cpu_loss = sgns_epoch_hogwild_cpu(cpu, p.corpus, tables, o, e);
        gpu_loss = gpu.epoch(o, e);
    }
    // What the gap is: the arithmetic is pinned by OneWarpIsBitwiseTheSingleThreadCpuEpoch (one
    // warp = one CPU thread, bit for bit), so any difference here is the Hogwild schedule. Warp k
    // takes positions k, k + W, ... (sgns.cu), so the W ~ 250 warps in flight hold W consecutive
    // corpus positions: about four of this corpus's 60-token documents at once. Each document is a
    // random walk of steps +-1, +-2 on the ring, so its 60 positions visit only ~15-20 distinct
    // ids; about 60 warps therefore update the in-rows of the same ~15-20 centres and the out-rows
    // of the same contexts (window 3) concurrently. Those updates are unsynchronised
    // read-modify-writes (out[t] += a h, in[w] += grad), so colliding updates can overwrite each
    // other and part of the epoch's updates is lost: learning is slower and the loss after 10
    // epochs higher. Nothing bounds that share from the arithmetic (it depends on warp timing), so
    // the tolerance is measured: on the H100, the GPU loss 0.120 against the sequential
    // 0.087 (1.38x); 1.5x allows that with room for run-to-run timing. The line below prints the
    // ratio of every run, so further GPU runs add to the distribution. A schedule bug that did not
    // depend on collisions (the learning-rate decay, the document bounds) would also break the
    // one-warp test.
    std::printf("[sgns hogwild] %d warps: loss %.4f against the sequential %.4f (%.3fx)\n",
                gpu.warps(), gpu_loss, cpu_loss, gpu_loss / cpu_loss);
    EXPECT_NEAR(gpu_loss, cpu_loss, 0.5 * cpu_loss);
    SgnsModel back = sgns_init(p.vocab.size(), D, 0);
    gpu.download(back);
    auto agreement = [&](const SgnsModel& m) {
        return embedtest::nearest_neighbour_agreement(
            m.in, D, p.vocab.size(), [&](int64_t a, int64_t b) {
                return embedtest::ring_distance(p.vocab.token_of_row[size_t(a)],
                                                p.vocab.token_of_row[size_t(b)], kRing) <= 2;
            });
    };
    const double cpu_agreement = agreement(cpu);
    EXPECT_GE(cpu_agreement, 0.5);
    EXPECT_GE(agreement(back), cpu_agreement - 0.05);
}

}  // namespace
}  // namespace lathe
