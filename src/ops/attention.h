#pragma once
// Causal self-attention with grouped-query heads, an optional sliding window and optional
// per-document masking for packed sequences; for inference, queries that continue a key/value
// cache (a query length Tq below the key length Tk, at a position offset) and a decode step.
//   For query (b, i, h) at absolute position p = q_offset + i, its key/value head is
//   g = h / (H / Hkv) (Hkv divides H), and
//   s[j] = scale * dot(q[b, i, h, :], k[b, j, g, :])            for every visible j
//   p = softmax over visible j,  out[b, i, h, :] = sum_j p[j] * v[b, j, g, :]
//   lse[b, h, i] = log sum_j exp(s[j])                          (saved for the backward)
// visible(p, j) = j <= p                                     (causal)
//   and p - window < j          when window > 0            (Mistral: `window` keys, self included)
//   and docs[b, j] == docs[b, p] when docs is given         (packed documents see only themselves)
// These are transformers' masking_utils rules (sliding_window_overlay: kv_idx > q_idx - window;
// packed_sequence_mask: equal sequence ids). Every row sees at least itself, so no row is empty.
// Training runs Tq == Tk with q_offset 0 (query i is key i). With a cache, keys 0..Tk-1 hold
// the positions 0..Tk-1 and q_offset + Tq <= Tk: the queries of a prompt chunk are the last Tq
// positions when q_offset = Tk - Tq; keys past q_offset + Tq - 1 are never visible (a cache
// buffer longer than what is filled). The model passes scale = 1 / sqrt(D).
// Backward (training shapes only: Tq == Tk, q_offset 0; P recomputed from lse,
// Di = dot(dout[b, t, h, :], out[b, t, h, :])):
//   dP[j] = dot(dout, v[j]);  dS[j] = P[j] * (dP[j] - Di)
//   dq = scale * sum_j dS[j] k[j];  dk[j] += scale * dS[j] q;  dv[j] += P[j] dout
//   (dk, dv summed over the H / Hkv query heads that share a key/value head)
// Shapes: q, out, dout, dq (B, Tq, H, D) | k, v, dk, dv (B, Tk, Hkv, D) | lse (B, H, Tq) f32 |
//   docs (B, Tk) i32 or null (the document of every key position; a query at p has docs[b, p]).
//   (B, T, H, D) is what the q/k/v projections write, no transposes.
// Dtypes: CPU f32. CUDA: bf16 q, k, v, out, f32 lse. cuDNN's flash attention runs Tq == Tk with
// q_offset 0, and Tq < Tk without docs (D <= 128); documents at an offset, what cuDNN declines and
// attention_decode run lathe's own kernel (ops/cuda/attention.h).
// Gradients: dq, dk, dv are overwritten (=). Deterministic unless ctx.deterministic is false
// (CUDA: cuDNN's backward with atomic dQ, less workspace, a little faster) (CPU: matrix form per
// head through sgemm, threads take whole heads; dk, dv sum a group's query heads in head order).
// Shapes, dtypes and offsets that break these rules are caller bugs: they stop (LATHE_CHECK)
// naming the tensor and the rule.
#include <cstdint>

#include "core/status.h"
#include "core/tensor.h"
#include "ops/context.h"

namespace lathe {

// Null when `backend` can run attention in this build; otherwise a sentence saying what the
// build lacks and how to get it (CUDA: the cuDNN frontend headers or libcudnn were missing when
// it was configured; or no CUDA backend at all). Every model needs attention, so this decides
// where a model can compute before one is made (run/compute_device.h, `lathe doctor`).
const char* attention_unavailable_reason(Backend backend);

void attention_forward(TensorView out, TensorView lse, ConstTensorView q, ConstTensorView k,
                       ConstTensorView v, ConstTensorView docs, int64_t window, float scale,
                       const Context& ctx);

// The same with queries at absolute positions q_offset + i against keys 0..Tk-1 (a key/value
// cache): q (B, Tq, H, D), k, v (B, Tk, Hkv, D), Tq <= Tk, 0 <= q_offset <= Tk - Tq. The form above
// is this with q_offset 0.
void attention_forward(TensorView out, TensorView lse, ConstTensorView q, ConstTensorView k,
                       ConstTensorView v, ConstTensorView docs, int64_t window, float scale,
                       int64_t q_offset, const Context& ctx);

// One decode step for a batch of sequences of different lengths in a contiguous cache: row b's
// new token has its key and value already written at k_cache[b, lengths[b] - 1] (and v_cache), and
// its query q[b, 0] attends to keys 0..lengths[b] - 1 (with the window) as attention_forward does
// for Tq = 1, q_offset = lengths[b] - 1, Tk = lengths[b]. Cache slots at or past lengths[b] are
// never read.
// Shapes: q, out (B, 1, H, D) | k_cache, v_cache (B, Tmax, Hkv, D) | lengths (B) i32, each in
//   [1, Tmax] | lse (B, H, 1) f32. No document masks (one sequence per row).
// A length outside [1, Tmax] is a caller bug: the CPU stops naming the row; the CUDA kernel cannot
// stop without a synchronization and writes NaN to that row's out and lse instead.
void attention_decode(TensorView out, TensorView lse, ConstTensorView q, ConstTensorView k_cache,
                      ConstTensorView v_cache, ConstTensorView lengths, int64_t window, float scale,
                      const Context& ctx);

// The same decode step over a paged cache (infer/paged_kv_cache.h): keys and values live in
// pools of fixed-size blocks, and row b's position j in block block_tables[b, j / Bk] at offset
// j % Bk. Row b's new key and value are already written at its position lengths[b] - 1; the math
// is attention_decode's over the row's positions 0..lengths[b] - 1 gathered in order.
// Shapes: q, out (B, 1, H, D) | k_pool, v_pool (N, Bk, Hkv, D) | block_tables (B, M) i32, entries
//   [0, ceil(lengths[b] / Bk)) of row b in [0, N) (the rest never read) | lengths (B) i32, each in
//   [1, M Bk] | lse (B, H, 1) f32.
// CUDA: bf16, D % 8 == 0 (ops/cuda/attention.h: attention_decode_paged). A length outside
// [1, M Bk] stops on the CPU and makes that row NaN on CUDA, as attention_decode.
void attention_decode_paged(TensorView out, TensorView lse, ConstTensorView q,
                            ConstTensorView k_pool, ConstTensorView v_pool,
                            ConstTensorView block_tables, ConstTensorView lengths, int64_t window,
                            float scale, const Context& ctx);

// Whether attention_decode_paged's CUDA kernel takes a model of `heads` query heads and
// `kv_heads` key/value heads of `head_dim` on a device whose blocks may use at most
// `smem_limit_bytes` of shared memory (cuda::shared_memory_per_block_optin): head_dim % 8 == 0
// (16-byte key rows), head_dim <= 256 (its value pass gives a head head_dim / 2 lanes of a
// 128-thread block), and the block's shared memory for the GQA group G = heads / kv_heads and
// head_dim (ops/cuda/attention_decode_smem.h; it grows with G and head_dim) within the limit.
// Errors (invalid argument): which rule fails, naming head_dim, the group, the bytes needed and
// the limit, and the remedy: the row cache (kv_block_size 0), whose decode kernel takes any
// group. Plain arithmetic: callable in a build without CUDA.
Status attention_decode_paged_supports(int64_t heads, int64_t kv_heads, int64_t head_dim,
                                       int64_t smem_limit_bytes);

// Rows between a contiguous buffer and a paged pool, one row being a position's (Hkv, D) keys or
// values: pool (N, Bk, Hkv, D) seen as N Bk rows, rows (n, Hkv, D) (any shape of n * Hkv * D
// elements), slots (n) i32 in [0, N Bk) (the slot of position j of a sequence: its block id times
// Bk plus j % Bk). kv_rows_scatter writes rows[i] to pool slot slots[i] (slots distinct) and
// skips a row whose slot is -1 (the padding rows of a CUDA-graph decode bucket, infer/engine.h);
// kv_rows_gather reads pool slot slots[i] into rows[i]. The same dtype on both sides.
void kv_rows_scatter(TensorView pool, ConstTensorView rows, ConstTensorView slots,
                     const Context& ctx);
void kv_rows_gather(TensorView rows, ConstTensorView pool, ConstTensorView slots,
                    const Context& ctx);

void attention_backward(TensorView dq, TensorView dk, TensorView dv, ConstTensorView dout,
                        ConstTensorView q, ConstTensorView k, ConstTensorView v,
                        ConstTensorView out, ConstTensorView lse, ConstTensorView docs,
                        int64_t window, float scale, const Context& ctx);

// The training form over q, k and v packed in one buffer, as one GEMM over the stacked q, k, v
// weight writes them (the model's block): qkv (B, T, H + 2 Hkv, D) holds q in the first H heads of
// each row, then k's Hkv heads, then v's Hkv; H is out's (B, T, H, D). The math, the rules and the
// results are attention_forward's / attention_backward's on the three head slices (CPU: the same
// products on strided rows; CUDA: cuDNN reading and writing the slices in place, no copies). The
// backward writes dq, dk, dv into the same slices of dqkv (qkv's shape), every element of it.
void attention_forward_qkv(TensorView out, TensorView lse, ConstTensorView qkv,
                           ConstTensorView docs, int64_t window, float scale, const Context& ctx);
void attention_backward_qkv(TensorView dqkv, ConstTensorView dout, ConstTensorView qkv,
                            ConstTensorView out, ConstTensorView lse, ConstTensorView docs,
                            int64_t window, float scale, const Context& ctx);

}  // namespace lathe
