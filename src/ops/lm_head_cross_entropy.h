#pragma once
// The LM head fused with softmax cross-entropy: never the whole (N, V) fp32 logits at once.
//   logits[n, v] = dot(x[n, :], weight[v, :])                 (logits = x W^T, HF lm_head layout)
//   lse[n] = log sum_v exp(logits[n, v])
//   losses[n] = lse[n] - logits[n, targets[n]]   if targets[n] != kIgnoreIndex (-100), else 0
//   loss = sum_n losses[n] / count_n(targets[n] != -100)     (0 when every target is ignored)
// Backward of `dloss * loss` (dloss: the gradient of the objective with respect to this loss;
// for micro-batches that share one mean, dloss = this batch's count / the total count):
//   dlogits[n, v] = dloss / count * (softmax(logits[n])[v] - [v == targets[n]])  (0 if ignored)
//   dx = dlogits W,   dweight += dlogits^T x
// The rows are processed Nc at a time, Nc = scratch.dim(0): one chunk's (Nc, V) f32 logits in
// `scratch` is all that ever exists of them. The memory plan picks Nc.
// Shapes: x, dx (N, C) | targets (N) i32 | weight, dweight (V, C) | losses, lse (N) f32 |
//   loss (1) f32 | scratch (Nc, V) f32, 1 <= Nc. losses may be null.
// Dtypes: CPU f32. CUDA: bf16 x, weight; f32 statistics and loss; the f32 scratch's
//   bytes hold 2 Nc rows of bf16 logits there, so the loss comes from bf16-rounded logits
//   (ops/cuda/lm_head_cross_entropy.h: the bound, within u max|logit| per row, u = 2^-8).
// Gradients: dx is overwritten (=); dweight accumulates (+=) (micro-batches; a tied embedding
//   shares it with embedding_backward), or with spec.dweight_mode kOverwrite the first chunk
//   writes it (=) and the others add (ops/linear.h, LinearSpec::dweight_mode); null when frozen.
// Targets outside [0, V) other than -100 are bugs upstream: checked on the CPU.
// Deterministic for a given BLAS build, whatever the thread count (loss: fp64 row sums in order).
//
// Precision: `spec` is the LM head's (ops/linear.h). kFp8PerTensor runs on CUDA with the caller's
// Fp8LinearBuffers: wq / wqt the weight's codes from linear_fp8_cast_weight (once per optimizer
// step), xq and xqt scratch of (N, C) bytes each, scalars, grad_dtype, the delayed scales and
// step amaxes (x, w, dlogits in that order); dyq / dyqt unused (the chunk's scratch holds the
// dlogits' codes; ops/cuda/lm_head_cross_entropy.h has the layout and the GEMMs). gemm_count
// counts the head as one linear: 1 for the logits, 1 for dx, 1 for dweight per call, whatever
// the chunk count. spec.x_amax (current scaling): amax(x) from the kernel that wrote x (the
// final RMSNorm), so x's cast reads x once. Every other fp8 case stops before any work, naming the
// op and the precision (kFp8Blockwise: no block-scaled head).
//
// Vocabulary shard (`shard`, forward and backward; vocabulary-parallel training, model/model.h):
// the weight holds rows [begin, begin + V) of a vocabulary of `total` ids, which the targets
// index (checked against total). Every row with a target counts (count, the mean's divisor, is
// the same in every shard); the one-hot term and the target logit belong to the shard holding
// the target. The forward then writes this shard's statistics: lse[n] = log sum over the shard's
// logits, losses[n] = lse[n] - logit[n, target - begin] where the shard holds the target, lse[n]
// where another does, 0 where ignored (loss: their mean, meaningless alone);
// cross_entropy_vocab_parallel_combine (ops/vocab_parallel.h) combines the shards' into the loss
// and the whole vocabulary's lse, which the backward takes: its dlogits are the shard's columns
// of the whole softmax's, dx its part of the sum over the vocabulary (the caller sums the
// shards'), dweight the shard's rows. total 0: the weight is the whole vocabulary. Not with fp8.
#include <cstdint>

#include "core/tensor.h"
#include "ops/context.h"
#include "ops/linear.h"

namespace lathe {

inline constexpr int32_t kIgnoreIndex = -100;

// A vocabulary shard (header comment); total 0: the whole vocabulary.
struct LmHeadVocabShard {
    int64_t begin = 0;
    int64_t total = 0;
};

void lm_head_cross_entropy_forward(TensorView loss, TensorView losses, TensorView lse,
                                   ConstTensorView x, ConstTensorView targets,
                                   ConstTensorView weight, TensorView scratch, const Context& ctx,
                                   const LinearSpec& spec = {}, const LmHeadVocabShard& shard = {});

void lm_head_cross_entropy_backward(TensorView dx, TensorView dweight, ConstTensorView x,
                                    ConstTensorView targets, ConstTensorView weight,
                                    ConstTensorView lse, float dloss, TensorView scratch,
                                    const Context& ctx, const LinearSpec& spec = {},
                                    const LmHeadVocabShard& shard = {});

// Forward and backward in one pass over the chunks (each chunk's logits are computed once and
// turned into dlogits in place): what a training step calls. Same results as the pair above.
void lm_head_cross_entropy_forward_backward(TensorView loss, TensorView losses, TensorView dx,
                                            TensorView dweight, ConstTensorView x,
                                            ConstTensorView targets, ConstTensorView weight,
                                            float dloss, TensorView scratch, const Context& ctx,
                                            const LinearSpec& spec = {});

}  // namespace lathe
