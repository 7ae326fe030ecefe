#pragma once
// CUDA token (+ learned position) embedding (ops/embedding.h has the math).
//   forward:  out (B, T, C) bf16 = wte[tokens] (+ wpe[pos]), wte (V, C), wpe (P, C) bf16
//   backward: dwte (V, C) f32 += sum of dout rows per token; dwpe (P, C) f32 += per position
// positions (B, T) i32 or null (pos = t); wpe/dwpe null for models without learned positions.
// Ids outside their table trap the kernel (the CPU twin checks them with a message).
//
// Deterministic backward without float atomics, bit-equal to the CPU twin (every table element is
// summed by one thread, from its old value, adding the rows in row order n = 0..N-1):
// - a table indexed by ids (dwte; dwpe with explicit positions): the ids are checked and
//   (id, row) pairs sorted by id with CUB's stable radix sort (in the state's scratch: 12 bytes
//   per row plus CUB's temporary storage, checked against CudaState::kScratchBytes), so each id's
//   rows form one segment in row order; then a block per 64 sorted positions and column slice
//   adds the segments that start there, one thread per (segment, column);
// - dwpe with implicit positions (pos = t, needs T <= P, checked): one thread per (t, column
//   pair) adds the B rows b = 0..B-1 in order.
// Cost: one read of dout per table, one read and write of each touched table row, the sort (a few
// small kernels); an id repeated m times makes its block walk m rows serially, 64 per memory
// round trip (see docs/CUDA.md). Uses the state's scratch: enqueue on the state's stream.

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"

struct CUstream_st;

namespace lathe {
struct CudaState;
}

namespace lathe::cuda {

void embedding_forward(bf16* out, const int32_t* tokens, const int32_t* positions, const bf16* wte,
                       const bf16* wpe, int64_t B, int64_t T, int64_t C, int64_t V, int64_t P,
                       CUstream_st* stream);

void embedding_backward(float* dwte, float* dwpe, const bf16* dout, const int32_t* tokens,
                        const int32_t* positions, int64_t B, int64_t T, int64_t C, int64_t V,
                        int64_t P, CudaState& state, CUstream_st* stream);

// The backward of a vocabulary shard's embedding (ops/vocab_parallel.h): dwte (V, C) f32 +=
// the dout (N, C) bf16 rows of the ids (N, the whole vocabulary's, checked against [0, total)) in
// [begin, begin + V), at row id - begin. The same sort by the ids themselves, so an id of another
// shard is a segment of its own, walked without loads or stores: the ids the shard does not hold
// (most of them) touch no row and pile onto no segment. Bit-equal to the CPU twin; its scratch is
// embedding_backward_scratch_bytes(N, total).
void embedding_backward_shard(float* dwte, const bf16* dout, const int32_t* ids, int64_t N,
                              int64_t C, int64_t begin, int64_t V, int64_t total, CudaState& state,
                              CUstream_st* stream);

// Bytes of the state's scratch that the sorted backward of N ids into a table of `rows` rows uses
// (sorted keys, row numbers in and out, CUB's temporary storage); embedding_backward stops with a
// message when this exceeds CudaState::kScratchBytes. Needs a current CUDA device (CUB asks it).
size_t embedding_backward_scratch_bytes(int64_t N, int64_t rows);

}  // namespace lathe::cuda
