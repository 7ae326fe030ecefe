#pragma once
// Causal self-attention with grouped-query heads, an optional sliding window and optional
// per-document masking for packed sequences.
//   For query (b, t, h), its key/value head is g = h / (H / Hkv) (Hkv divides H), and
//   s[j] = scale * dot(q[b, t, h, :], k[b, j, g, :])            for every visible j
//   p = softmax over visible j,  out[b, t, h, :] = sum_j p[j] * v[b, j, g, :]
//   lse[b, h, t] = log sum_j exp(s[j])                          (saved for the backward)
// visible(t, j) = j <= t                                     (causal)
//   and t - window < j          when window > 0            (Mistral: `window` keys, self included)
//   and docs[b, j] == docs[b, t] when docs is given         (packed documents see only themselves)
// These are transformers' masking_utils rules (sliding_window_overlay: kv_idx > q_idx - window;
// packed_sequence_mask: equal sequence ids). Every row sees at least itself, so no row is empty.
// The model passes scale = 1 / sqrt(D).
// Backward (P recomputed from lse, Di = dot(dout[b, t, h, :], out[b, t, h, :])):
//   dP[j] = dot(dout, v[j]);  dS[j] = P[j] * (dP[j] - Di)
//   dq = scale * sum_j dS[j] k[j];  dk[j] += scale * dS[j] q;  dv[j] += P[j] dout
//   (dk, dv summed over the H / Hkv query heads that share a key/value head)
// Shapes: q, out, dout, dq (B, T, H, D) | k, v, dk, dv (B, T, Hkv, D) | lse (B, H, T) f32 |
//   docs (B, T) i32 or null. (B, T, H, D) is what the q/k/v projections write, no transposes.
// Dtypes: CPU f32. CUDA: bf16 q, k, v, out (cuDNN flash attention), f32 lse.
// Gradients: dq, dk, dv are overwritten (=). Deterministic unless ctx.deterministic is false
// (CUDA: cuDNN's backward with atomic dQ, less workspace, a little faster) (CPU: matrix form per
// head through sgemm, threads take whole heads; dk, dv sum a group's query heads in head order).
#include <cstdint>

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

void attention_backward(TensorView dq, TensorView dk, TensorView dv, ConstTensorView dout,
                        ConstTensorView q, ConstTensorView k, ConstTensorView v,
                        ConstTensorView out, ConstTensorView lse, ConstTensorView docs,
                        int64_t window, float scale, const Context& ctx);

}  // namespace lathe
