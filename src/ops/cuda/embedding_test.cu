// clang-format off
#include "ops/cuda/nvcc_compat.h"  // first: before any header that includes fmt
// clang-format on

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "ops/cuda/cuda_test_util.h"
#include "ops/cuda/embedding.h"
#include "ops/embedding.h"
#include "ops/vocab_parallel.h"

namespace lathe {
namespace {

using namespace cudatest;

struct EmbeddingCase {
    int64_t B, T, C, V, P;
    bool wpe;          // learned positions (GPT-2)
    bool positions;    // explicit positions or 0..T-1
    int64_t distinct;  // tokens drawn from this many ids, so most repeat
    // Token ids log-uniform over [0, V) (id = floor(V^u) - 1): a Zipf-like text distribution, id 0
    // about 1/ln(V) of all rows (long segments), most ids rare. `distinct` is ignored.
    bool zipf = false;
};

void check_embedding(const EmbeddingCase& c, uint64_t seed) {
    SCOPED_TRACE(::testing::Message() << "B=" << c.B << " T=" << c.T << " C=" << c.C << " V=" << c.V
                                      << " wpe=" << c.wpe << " positions=" << c.positions);
    CudaState state(0);
    const Context gpu = state.context(), cpu = cpu_context();
    optest::Rng rng(seed);
    HostTensor tokens(DType::kI32, {c.B, c.T}), pos(DType::kI32, {c.B, c.T});
    for (int64_t i = 0; i < tokens.numel(); ++i) {
        // A few ids spread over the whole table (first and last chunk included).
        if (c.zipf) {
            const double u = rng.uniform(0.0f, 1.0f);
            const int64_t id = int64_t(std::floor(std::pow(double(c.V), u))) - 1;
            tokens.as<int32_t>()[i] = int32_t(std::min<int64_t>(std::max<int64_t>(id, 0), c.V - 1));
        } else {
            const int64_t k = rng.integer(0, c.distinct - 1);
            tokens.as<int32_t>()[i] = int32_t(k == 0 ? c.V - 1 : (k * 7919) % c.V);
        }
        pos.as<int32_t>()[i] = int32_t(rng.integer(0, c.P - 1));
    }
    const HostTensor wte = random_bf16_values(rng, {c.V, c.C});
    const HostTensor wpe = random_bf16_values(rng, {c.P, c.C});
    const HostTensor dout = random_bf16_values(rng, {c.B, c.T, c.C});
    const HostTensor dwte0 = optest::random_tensor(rng, {c.V, c.C});
    const HostTensor dwpe0 = optest::random_tensor(rng, {c.P, c.C});
    const ConstTensorView pos_view = c.positions ? pos.view() : ConstTensorView();
    const ConstTensorView wpe_view = c.wpe ? wpe.view() : ConstTensorView();

    HostTensor out_ref(DType::kF32, {c.B, c.T, c.C});
    embedding_forward(out_ref.view(), tokens.view(), pos_view, wte.view(), wpe_view, cpu);
    HostTensor dwte_ref = optest::copy_tensor(dwte0.view());
    HostTensor dwpe_ref = optest::copy_tensor(dwpe0.view());
    embedding_backward(dwte_ref.view(), c.wpe ? dwpe_ref.view() : TensorView(), dout.view(),
                       tokens.view(), pos_view, cpu);

    DeviceTensor gtok = upload(tokens, DType::kI32, state), gpos = upload(pos, DType::kI32, state);
    DeviceTensor gwte = upload(wte, DType::kBF16, state), gwpe = upload(wpe, DType::kBF16, state);
    DeviceTensor gdout = upload(dout, DType::kBF16, state);
    const ConstTensorView gpos_view = c.positions ? ConstTensorView(gpos.view) : ConstTensorView();
    DeviceTensor out = device_tensor(DType::kBF16, {c.B, c.T, c.C}, state);
    embedding_forward(out.view, gtok.view, gpos_view, gwte.view,
                      c.wpe ? ConstTensorView(gwpe.view) : ConstTensorView(), gpu);
    const HostTensor out_gpu = download_f32(out.view, state);
    if (c.wpe)
        EXPECT_TRUE(matches(out_gpu, out_ref, kBf16Rounded));
    else
        EXPECT_TRUE(bitwise_equal(out_gpu, out_ref));  // a plain copy of bf16 rows

    // Twice from the same start: the runs must agree with each other (determinism) and with the
    // CPU twin (the same fp32 additions in the same row order: equal bits).
    HostTensor first_dwte, first_dwpe;
    for (int run = 0; run < 2; ++run) {
        SCOPED_TRACE(::testing::Message() << "run " << run);
        DeviceTensor dwte = upload(dwte0, DType::kF32, state);
        DeviceTensor dwpe = upload(dwpe0, DType::kF32, state);
        embedding_backward(dwte.view, c.wpe ? dwpe.view : TensorView(), gdout.view, gtok.view,
                           gpos_view, gpu);
        HostTensor got_dwte = download_f32(dwte.view, state);
        HostTensor got_dwpe = download_f32(dwpe.view, state);
        EXPECT_TRUE(bitwise_equal(got_dwte, dwte_ref));
        if (c.wpe)
            EXPECT_TRUE(bitwise_equal(got_dwpe, dwpe_ref));
        else
            EXPECT_TRUE(bitwise_equal(got_dwpe, dwpe0));  // untouched
        if (run == 0) {
            first_dwte = std::move(got_dwte);
            first_dwpe = std::move(got_dwpe);
        } else {
            EXPECT_TRUE(bitwise_equal(got_dwte, first_dwte));
            EXPECT_TRUE(bitwise_equal(got_dwpe, first_dwpe));
        }
    }
}

TEST(CudaEmbedding, MatchesCpuTokensOnly) {
    check_embedding({4, 64, 96, 1000, 64, false, false, 40}, 51);
}

TEST(CudaEmbedding, MatchesCpuWithLearnedPositions) {
    check_embedding({4, 64, 96, 1000, 64, true, false, 40}, 52);
}

TEST(CudaEmbedding, MatchesCpuWithExplicitPositionsWideRows) {
    // C = 1500: two column slices per table chunk, the scalar path (C % 8 != 0) forward.
    check_embedding({2, 50, 1500, 300, 80, true, true, 7}, 53);
}

TEST(CudaEmbedding, MatchesCpuOneTokenEverywhere) {
    check_embedding({3, 200, 64, 500, 200, false, false, 1}, 54);  // every row hits one table row
}

TEST(CudaEmbedding, MatchesCpuOddWidthScalarPath) {
    // C odd: one column per thread in the sorted and the position kernels; N = 111 ends mid-chunk.
    check_embedding({3, 37, 97, 700, 40, true, true, 30}, 55);
    check_embedding({3, 37, 97, 700, 40, true, false, 30}, 56);
}

TEST(CudaEmbedding, MatchesCpuOneTokenRepeatedAcrossManyChunks) {
    // N = 8192 rows of one id: a single segment crossing 128 chunks of sorted positions, walked by
    // one block (the long-run path), and 40 sequences summed per position.
    check_embedding({40, 205, 768, 5000, 256, true, false, 1}, 57);
    check_embedding({8, 1024, 768, 50304, 1024, false, false, 1}, 58);
}

TEST(CudaEmbedding, MatchesCpuFewIdsManyRepeats) {
    // 3 ids over 4096 rows: long segments that start and end inside chunks and across them.
    check_embedding({4, 1024, 256, 1000, 1024, true, true, 3}, 59);
}

TEST(CudaEmbedding, Gpt2TrainingShapeZipfTokensMatchCpu) {
    // GPT-2 124M's training shape (B=32, T=1024, C=768, V=50304 padded, P=1024), text-like ids.
    EmbeddingCase c{32, 1024, 768, 50304, 1024, true, false, 0};
    c.zipf = true;
    check_embedding(c, 60);
}

TEST(CudaEmbedding, Gpt2TrainingShapeUniformTokensMatchCpu) {
    // Mostly distinct ids (segments of 1-3 rows): the general path everywhere.
    check_embedding({32, 1024, 768, 50304, 1024, true, false, 50304}, 61);
}

TEST(CudaEmbedding, SortScratchFitsTheTrainingShapes) {
    CudaState state(0);
    // GPT-2 (B=32, T=1024, V=50304), Llama 3 (B=8, T=2048, V=128256), and 1M tokens per call.
    const size_t gpt2 = cuda::embedding_backward_scratch_bytes(32768, 50304);
    const size_t llama = cuda::embedding_backward_scratch_bytes(16384, 128256);
    const size_t big = cuda::embedding_backward_scratch_bytes(int64_t(1) << 20, 128256);
    std::printf("embedding_backward scratch: %zu bytes (GPT-2), %zu (Llama 3), %zu (1M ids)\n",
                gpt2, llama, big);
    EXPECT_GE(gpt2, size_t(3) * 32768 * 4);  // the three id arrays at least
    EXPECT_LE(gpt2, size_t(2) << 20);
    EXPECT_LE(llama, size_t(2) << 20);
    EXPECT_LE(big, CudaState::kScratchBytes);
}

// The backward of a vocabulary shard (ops/vocab_parallel.h) against its CPU twin: equal bits,
// twice the same. Ids Zipf-like over the whole vocabulary, so the first of S shards holds most
// of them and every other shard a few: most ids lie outside those shards (sorted as segments of
// their own that load and store nothing) and none adds to the shard's row 0.
void check_vocab_shard_backward(int64_t B, int64_t T, int64_t C, int64_t total, int64_t S,
                                uint64_t seed) {
    SCOPED_TRACE(::testing::Message()
                 << "N=" << B * T << " C=" << C << " vocabulary " << total << " over " << S);
    CudaState state(0);
    const Context gpu = state.context(), cpu = cpu_context();
    optest::Rng rng(seed);
    HostTensor ids(DType::kI32, {B, T});
    for (int64_t i = 0; i < ids.numel(); ++i) {
        const double u = rng.uniform(0.0f, 1.0f);
        const int64_t id = int64_t(std::floor(std::pow(double(total), u))) - 1;
        ids.as<int32_t>()[i] = int32_t(std::min<int64_t>(std::max<int64_t>(id, 0), total - 1));
    }
    const HostTensor dx = random_bf16_values(rng, {B, T, C});
    DeviceTensor gids = upload(ids, DType::kI32, state), gdx = upload(dx, DType::kBF16, state);
    const int64_t V = total / S;
    for (int64_t s = 0; s < S; ++s) {
        SCOPED_TRACE(::testing::Message() << "shard " << s);
        int64_t held = 0;
        for (int64_t i = 0; i < ids.numel(); ++i)
            held += ids.as<int32_t>()[i] >= s * V && ids.as<int32_t>()[i] < (s + 1) * V;
        if (s > 0) EXPECT_LT(held * 2, ids.numel()) << "most ids outside the shard";
        const HostTensor dwte0 = optest::random_tensor(rng, {V, C});
        HostTensor want = optest::copy_tensor(dwte0.view());
        vocab_shard_embedding_backward(want.view(), dx.view(), ids.view(), s * V, total, cpu);
        HostTensor first;
        for (int run = 0; run < 2; ++run) {
            DeviceTensor dwte = upload(dwte0, DType::kF32, state);
            vocab_shard_embedding_backward(dwte.view, gdx.view, gids.view, s * V, total, gpu);
            HostTensor got = download_f32(dwte.view, state);
            EXPECT_TRUE(bitwise_equal(got, want)) << "run " << run;
            if (run == 0)
                first = std::move(got);
            else
                EXPECT_TRUE(bitwise_equal(got, first));
        }
    }
}

TEST(CudaEmbedding, VocabShardBackwardMatchesCpuWithMostIdsOutside) {
    check_vocab_shard_backward(4, 512, 96, 1000, 4, 62);  // N = 2048 over 32 sorted chunks
    check_vocab_shard_backward(3, 37, 97, 700, 2, 63);    // odd width, N ending mid-chunk
}

TEST(CudaEmbedding, VocabShardBackwardLlamaShapeMatchesCpu) {
    // Llama 3's vocabulary over 4 shards at 8192 tokens, the model's width.
    check_vocab_shard_backward(4, 2048, 512, 128256, 4, 64);
}

class CudaEmbeddingDeathTest : public ::testing::Test {
protected:
    void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

TEST_F(CudaEmbeddingDeathTest, TokenOutsideTheTableTraps) {
    CudaState state(0);
    const Context gpu = state.context();
    HostTensor tokens(DType::kI32, {2, 8});
    for (int64_t i = 0; i < tokens.numel(); ++i) tokens.as<int32_t>()[i] = int32_t(i);
    tokens.as<int32_t>()[11] = 64;  // the table has 64 rows
    DeviceTensor gtok = upload(tokens, DType::kI32, state);
    DeviceTensor dout = device_tensor(DType::kBF16, {2, 8, 16}, state);
    DeviceTensor dwte = device_tensor(DType::kF32, {64, 16}, state);
    EXPECT_DEATH(
        {
            embedding_backward(dwte.view, TensorView(), dout.view, gtok.view, ConstTensorView(),
                               gpu);
            state.synchronize();
        },
        "CUDA error cudaError");
}

TEST_F(CudaEmbeddingDeathTest, SequenceLongerThanThePositionTableStops) {
    CudaState state(0);
    const Context gpu = state.context();
    HostTensor tokens(DType::kI32, {2, 8});
    for (int64_t i = 0; i < tokens.numel(); ++i) tokens.as<int32_t>()[i] = int32_t(i);
    DeviceTensor gtok = upload(tokens, DType::kI32, state);
    DeviceTensor dout = device_tensor(DType::kBF16, {2, 8, 16}, state);
    DeviceTensor dwpe = device_tensor(DType::kF32, {6, 16}, state);
    EXPECT_DEATH(
        embedding_backward(TensorView(), dwpe.view, dout.view, gtok.view, ConstTensorView(), gpu),
        "embedding_backward: sequences of T=8 tokens need positions 0..7, the position "
        "table has 6 rows");
}

}  // namespace
}  // namespace lathe
