#include "ops/vocab_parallel.h"

#include <cmath>
#include <cstring>

#include "ops/embedding.h"
#include "ops/op_test.h"

namespace lathe::optest {
namespace {

// The shard's backward against the whole table's: each shard's rows of dwte are the rows
// [begin, begin + V) of embedding_backward over the whole vocabulary (the same additions in row
// order: equal bits), for ids that mostly fall outside any one shard.
TEST(VocabShardEmbeddingBackward, IsTheWholeTablesBackwardRestrictedToTheShard) {
    const Context cpu = cpu_context();
    Rng rng(81);
    const int64_t N = 300, C = 5, total = 40, S = 4, V = total / S;
    HostTensor ids(DType::kI32, {N});
    for (int64_t n = 0; n < N; ++n) ids.as<int32_t>()[n] = int32_t(rng.integer(0, total - 1));
    const HostTensor dx = random_tensor(rng, Shape{N, C});
    const HostTensor dwte0 = random_tensor(rng, Shape{total, C});
    HostTensor whole = copy_tensor(dwte0.view());
    embedding_backward(whole.view(), TensorView(), dx.view().reshape(Shape{1, N, C}),
                       ids.view().reshape(Shape{1, N}), ConstTensorView(), cpu);
    for (int64_t s = 0; s < S; ++s) {
        HostTensor shard(DType::kF32, {V, C}), want(DType::kF32, {V, C});
        std::memcpy(shard.as<float>(), dwte0.as<float>() + s * V * C,
                    size_t(V * C) * sizeof(float));
        std::memcpy(want.as<float>(), whole.as<float>() + s * V * C, size_t(V * C) * sizeof(float));
        vocab_shard_embedding_backward(shard.view(), dx.view(), ids.view(), s * V, total, cpu);
        EXPECT_TRUE(bitwise_equal(shard, want)) << "shard " << s;
    }
}

// Most ids outside the shard, and the shard's first id absent: they add nothing and touch no row,
// row 0 included (its -0.0 stays -0.0, which adding a cleared row's +0.0 would turn into +0.0).
TEST(VocabShardEmbeddingBackward, IdsOfOtherShardsTouchNoRow) {
    const Context cpu = cpu_context();
    Rng rng(82);
    const int64_t N = 64, C = 3, total = 100, begin = 50, V = 25;
    HostTensor ids(DType::kI32, {N});
    for (int64_t n = 0; n < N; ++n) {
        // One row in 8 holds an id of the shard other than its first; the rest lie outside it.
        const bool held = n % 8 == 3;
        ids.as<int32_t>()[n] = int32_t(
            held ? rng.integer(begin + 1, begin + V - 1)
                 : (n % 2 == 0 ? rng.integer(0, begin - 1) : rng.integer(begin + V, total - 1)));
    }
    const HostTensor dx = random_tensor(rng, Shape{N, C});
    HostTensor dwte = random_tensor(rng, Shape{V, C});
    for (int64_t c = 0; c < C; ++c) dwte.as<float>()[c] = -0.0f;
    HostTensor want = copy_tensor(dwte.view());
    for (int64_t n = 0; n < N; ++n) {
        const int64_t i = int64_t(ids.as<int32_t>()[n]) - begin;
        if (i < 0 || i >= V) continue;
        for (int64_t c = 0; c < C; ++c) want.as<float>()[i * C + c] += dx.as<float>()[n * C + c];
    }
    vocab_shard_embedding_backward(dwte.view(), dx.view(), ids.view(), begin, total, cpu);
    EXPECT_TRUE(bitwise_equal(dwte, want));
    for (int64_t c = 0; c < C; ++c) EXPECT_TRUE(std::signbit(dwte.as<float>()[c])) << c;
}

// The default ("fast", fork only) death-test style, as EmbeddingDeathTest: the "threadsafe" one
// re-executes the binary, which the aarch64 tests under qemu-user cannot (scripts/test-aarch64.sh).
TEST(VocabShardEmbeddingBackwardDeathTest, AnIdOutsideTheVocabularyStops) {
    const Context cpu = cpu_context();
    HostTensor ids = ids_of(Shape{2}, {3, 40});
    HostTensor dx = f32(Shape{2, 4}), dwte = f32(Shape{10, 4});
    EXPECT_DEATH(vocab_shard_embedding_backward(dwte.view(), dx.view(), ids.view(), 10, 40, cpu),
                 "id 40 at row 1 outside \\[0, 40\\)");
}

}  // namespace
}  // namespace lathe::optest
