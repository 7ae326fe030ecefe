#pragma once
// Vocabulary-parallel embedding and cross-entropy (tensor-parallel training, model/model.h): each
// of the T ranks of a group holds rows [begin, begin + V) of the embedding and the LM head, V the
// vocabulary over T; the token ids and targets index the whole vocabulary.
//
// Embedding (the forward with ops/embedding.h over the shard):
//   vocab_shard_ids:        local[n] = ids[n] - begin   where begin <= ids[n] < begin + V, else 0
//   vocab_shard_zero_rows:  x[n, :] = 0                 where ids[n] is outside [begin, begin + V)
//   vocab_shard_embedding_backward:
//                           dwte[ids[n] - begin, :] += dx[n, :]   where begin <= ids[n] < begin + V
// The forward looks the local ids up in the shard and clears the rows of the ids it does not hold
// (row 0 stood in for them); the sum over the group gives every row its one embedding. The
// backward adds only the rows of the ids the shard holds and skips the others: no row of dwte is
// touched for them. (Clearing their gradient rows and adding them to row 0 gives the same sums,
// but on CUDA makes row 0's sorted segment hold most of the tokens, one block's serial walk.)
// Shapes: ids, local (N) i32 (ids in [0, total), checked on the CPU) | x, dx (N, C) | dwte (V, C).
// Dtypes: CPU f32 x, dx, dwte. CUDA bf16 x, dx, f32 dwte. Deterministic: the backward is
// ops/embedding.h's (each element of dwte sums its rows in row order, bit-equal across backends
// up to dx's rounding to bf16; no atomics).
//
// Cross-entropy: the rows' statistics of the shards (lm_head_cross_entropy_forward with an
// LmHeadVocabShard: the shard's lse and lse minus its part of the target logit) combined:
//   m[n]   = max over the shards of lse_s[n]                     (reduce.max)
//   e[n]   = sum over the shards of exp(lse_s[n] - m[n])         (reduce.sum)
//   t[n]   = sum over the shards of (lse_s[n] - losses_s[n])     (the target logit; same sum)
//   lse[n] = m[n] + log e[n],   losses[n] = lse[n] - t[n] (0 where targets[n] == -100)
//   loss   = sum_n losses[n] / count_n(targets[n] != -100)       (0 when every target is ignored)
// The shard's lse is the log-sum-exp of its row max and sum of exponentials, so m and e are the
// group's max and the sum of exponentials relative to it: the whole row's lse, and lse_s <= m
// keeps every exponential <= 1.
// Shapes: loss (1) | losses, lse, targets (N) | work (3, N) f32 scratch. lse and losses are read
// (the shard's) and overwritten (the whole vocabulary's). f32 on both backends.
// reduce.max / reduce.sum: in-place all-reduces of an f32 view over the group, in stream order
// (every rank of the group calls the op with the same N). Deterministic given the reductions
// (loss: an fp64 sum in row order).
// Accuracy against one process's fp64 sum of exponentials: each shard's lse is rounded to f32
// once, the combination adds a few f32 roundings of values of the size of lse: a few 2^-24
// relative of lse, far below the training noise.
#include <cstdint>
#include <functional>

#include "core/tensor.h"
#include "ops/context.h"

namespace lathe {

void vocab_shard_ids(TensorView local, ConstTensorView ids, int64_t begin, int64_t V, int64_t total,
                     const Context& ctx);

void vocab_shard_zero_rows(TensorView x, ConstTensorView ids, int64_t begin, int64_t V,
                           const Context& ctx);

// dwte (V, C) accumulates (+=), as embedding_backward's dwte; total bounds the ids (the whole
// vocabulary), begin + V <= total.
void vocab_shard_embedding_backward(TensorView dwte, ConstTensorView dx, ConstTensorView ids,
                                    int64_t begin, int64_t total, const Context& ctx);

// In-place reductions over the ranks holding the other shards (header comment).
struct VocabParallelReduce {
    std::function<void(TensorView)> max, sum;
};

void cross_entropy_vocab_parallel_combine(TensorView loss, TensorView losses, TensorView lse,
                                          ConstTensorView targets, TensorView work,
                                          const VocabParallelReduce& reduce, const Context& ctx);

}  // namespace lathe
