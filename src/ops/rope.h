#pragma once
// Rotary position embedding in Hugging Face's rotate-half convention, with partial rotary
// (GPT-NeoX's rotary_pct) and the `llama3` rope_scaling, as transformers' modeling_rope_utils
// computes them.
//
// Frequencies (rope_inv_freq), with R = int(D * partial_rotary_factor) rotary dims, i < R/2:
//   inv_freq[i] = 1 / theta^(2i / R)
// llama3 scaling (factor f, low_freq_factor lo, high_freq_factor hi, original context L0):
//   wavelen = 2 pi / inv_freq;  low_wavelen = L0 / lo;  high_wavelen = L0 / hi
//   wavelen > low_wavelen:   inv_freq / f
//   wavelen < high_wavelen:  inv_freq
//   otherwise:  (1 - s) * inv_freq / f + s * inv_freq,   s = (L0 / wavelen - lo) / (hi - lo)
// All of it in fp32 arithmetic in the order transformers uses, so tables match bit for bit.
// Table (rope_build_table): angle[p, i] = float(p) * inv_freq[i] (fp32 product),
//   cos[p, i] = cos(angle), sin[p, i] = sin(angle), for positions p < P.
// Rotation (rope_forward), per head vector x of length D, with c = cos[pos, i], s = sin[pos, i]:
//   out[i]       = x[i] * c - x[i + R/2] * s          for i < R/2
//   out[i + R/2] = x[i + R/2] * c + x[i] * s
//   out[j]       = x[j]                               for R <= j < D (not rotated)
// Backward applies the inverse rotation (the transpose): dx = rotate(dout, -angle).
// Shapes: x, out, dout, dx (B, T, Hx, D) with Hx = H for queries or Hkv for keys |
//   positions (B, T) i32 or null (then pos = t) | cos, sin (P, R/2) f32.
// out may be x itself (in place), and dx may be dout. Dtypes: CPU f32. CUDA: bf16 x/out,
// f32 tables. Gradients: dx is overwritten (=). Deterministic (no reductions).
#include <cstdint>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "ops/context.h"

namespace lathe {

enum class RopeScaling { kNone, kLlama3 };

// The rotary part of a model's config.json (names are the HF keys).
struct RopeConfig {
    int64_t head_dim = 0;                      // D (head_dim, or hidden_size / num_attention_heads)
    double theta = 10000.0;                    // rope_theta (GPT-NeoX: rotary_emb_base)
    double partial_rotary_factor = 1.0;        // partial_rotary_factor / rotary_pct
    RopeScaling scaling = RopeScaling::kNone;  // rope_scaling.rope_type ("llama3")
    double factor = 1.0;                       // rope_scaling.factor
    double low_freq_factor = 1.0;              // rope_scaling.low_freq_factor
    double high_freq_factor = 4.0;             // rope_scaling.high_freq_factor
    int64_t original_max_position_embeddings =
        8192;  // rope_scaling.original_max_position_embeddings
};

// R = int(head_dim * partial_rotary_factor), the rotated dims per head.
int64_t rope_rotary_dim(const RopeConfig& config);

// Ok, or invalid argument naming the config key: head_dim > 0, theta > 0, a rotary dim R that is
// even and in [2, head_dim], and for llama3 factor > 0, high_freq_factor > low_freq_factor > 0,
// original_max_position_embeddings > 0.
Status rope_validate(const RopeConfig& config);

// The R/2 inverse frequencies (scaled per `config.scaling`). config must be valid (checked).
std::vector<float> rope_inv_freq(const RopeConfig& config);

// Fills host tables cos, sin (P, R/2) f32 for positions 0..P-1. Runs on the host (the engine
// copies the tables to the device once). config must be valid (checked).
void rope_build_table(TensorView cos, TensorView sin, const RopeConfig& config);

void rope_forward(TensorView out, ConstTensorView x, ConstTensorView positions, ConstTensorView cos,
                  ConstTensorView sin, const Context& ctx);

void rope_backward(TensorView dx, ConstTensorView dout, ConstTensorView positions,
                   ConstTensorView cos, ConstTensorView sin, const Context& ctx);

// Queries and keys together (an attention layer's two rotations), with the same results bit for
// bit as rope_forward / rope_backward on each: the CPU runs the two ops, CUDA one launch over
// both. q (B, T, H, D) and k (B, T, Hkv, D) share positions and tables; q_out may be q and k_out
// may be k (in place), as for the single ops.
void rope_qk_forward(TensorView q_out, TensorView k_out, ConstTensorView q, ConstTensorView k,
                     ConstTensorView positions, ConstTensorView cos, ConstTensorView sin,
                     const Context& ctx);

void rope_qk_backward(TensorView dq, TensorView dk, ConstTensorView dq_out, ConstTensorView dk_out,
                      ConstTensorView positions, ConstTensorView cos, ConstTensorView sin,
                      const Context& ctx);

// The queries and keys of a packed q, k, v buffer (ops/attention.h: attention_forward_qkv), in
// place: qkv (B, T, H + 2 Hkv, D) with qk_heads = H + Hkv; the first qk_heads heads of each row
// rotate as rope_forward / rope_backward rotate them (the same bits), the last Hkv (the values)
// are not touched. One launch on CUDA.
void rope_qkv_forward(TensorView qkv, int64_t qk_heads, ConstTensorView positions,
                      ConstTensorView cos, ConstTensorView sin, const Context& ctx);
void rope_qkv_backward(TensorView dqkv, int64_t qk_heads, ConstTensorView positions,
                       ConstTensorView cos, ConstTensorView sin, const Context& ctx);

}  // namespace lathe
