#pragma once
// CUDA linear layer (ops/linear.h has the math and the shape rules), through cuBLASLt.
//   forward:   y (N, O) bf16 = x (N, I) bf16 . weight (O, I)^T bf16 + bias (O) bf16, fp32
//   accumulation,
//              the bias added in cuBLASLt's epilogue
//   backward:  dx (N, I) bf16 = dy . weight        (= or += per dx_accumulate; beta 0 or 1)
//              dweight (O, I) f32 += dy^T . x       (beta 1: accumulates over micro-batches)
//              dbias (O) f32 += sum_n dy[n, :]     (column_reduce.h, two passes, no atomics)
// Parameter gradients are f32 so that micro-batch accumulation does not round to bf16 each time.
// dx, dweight, dbias may each be null (not needed / frozen). Deterministic.
// Pointers are device pointers; work is enqueued on `stream`, which must be the state's.

#include <cstdint>

#include "core/dtype.h"

struct CUstream_st;

namespace lathe {
struct CudaState;
}

namespace lathe::cuda {

void linear_forward(CudaState& state, CUstream_st* stream, bf16* y, const bf16* x,
                    const bf16* weight, const bf16* bias, int64_t N, int64_t I, int64_t O);

void linear_backward(CudaState& state, CUstream_st* stream, bf16* dx, float* dweight, float* dbias,
                     const bf16* dy, const bf16* x, const bf16* weight, int64_t N, int64_t I,
                     int64_t O, bool dx_accumulate);

}  // namespace lathe::cuda
