#pragma once
// CUDA fp8 casts (ops/fp8_cast.h has the math; ops/cpu/fp8_cast.h is the reference they match
// bit for bit). Enqueued on `stream`; every pointer is a device pointer.
//
// Passes over x (bf16, 2 bytes an element; q and qt 1 byte each):
//   fp8_amax:          one read of x; *amax = amax(x) (an integer max of |x|'s bits, so the same
//                      bits every run whatever the block order).
//   fp8_cast:          current scaling without amax_ready: fp8_amax, then one read of x that writes
//                      q and/or qt; with amax_ready (the producer computed amax) or delayed scaling
//                      (a given scale; amax(x) reported from the same read): one read.
//                      A qt goes through 32 x 32 tiles in shared memory, q written from the same
//                      tile, so cast + transpose (+ amax when delayed) read x once.
//   fp8_block_cast:    one read of x per 128 x 128 tile (staged in shared memory) writes q, qt and
//                      all their block scales (row groups, column groups, or the whole tile).
// Vector loads when cols is a multiple of 8 and x 16-byte aligned; any shape runs.

#include <cstdint>

#include "ops/fp8_cast.h"

struct CUstream_st;

namespace lathe::cuda {

// *amax = amax over n bf16 values of x.
void fp8_amax(const bf16* x, int64_t n, float* amax, CUstream_st* stream);

void fp8_cast(const Fp8CastArgs& args, CUstream_st* stream);

void fp8_block_cast(const Fp8BlockCastArgs& args, CUstream_st* stream);

}  // namespace lathe::cuda
