#pragma once
// CUDA token (+ learned position) embedding (ops/embedding.h has the math).
//   forward:  out (B, T, C) bf16 = wte[tokens] (+ wpe[pos]), wte (V, C), wpe (P, C) bf16
//   backward: dwte (V, C) f32 += sum of dout rows per token; dwpe (P, C) f32 += per position
// positions (B, T) i32 or null (pos = t); wpe/dwpe null for models without learned positions.
// Ids outside their table trap the kernel (the CPU twin checks them with a message).
//
// Deterministic backward without sorting and without float atomics: "one block per vocabulary
// row chunk". Block (x, y) owns the table rows [64x, 64x + 64) and a 1024-column slice; it scans
// all N ids in order, compacts the rows that hit its chunk (warp ballots, in row order) and adds
// each hit row into its table row. Every table element is therefore summed by one thread, in row
// order n = 0..N-1: the same fp32 additions, in the same order, as the CPU twin, so the two agree
// bit for bit. Cost: every block reads all N ids (from L2), V/64 x ceil(C/1024) blocks; a token
// repeated m times costs its block m sequential row adds (see docs/CUDA.md).
// Enqueued on `stream`.

#include <cstdint>

#include "core/dtype.h"

struct CUstream_st;

namespace lathe::cuda {

void embedding_forward(bf16* out, const int32_t* tokens, const int32_t* positions, const bf16* wte,
                       const bf16* wpe, int64_t B, int64_t T, int64_t C, int64_t V, int64_t P,
                       CUstream_st* stream);

void embedding_backward(float* dwte, float* dwpe, const bf16* dout, const int32_t* tokens,
                        const int32_t* positions, int64_t B, int64_t T, int64_t C, int64_t V,
                        int64_t P, CUstream_st* stream);

}  // namespace lathe::cuda
