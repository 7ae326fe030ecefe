#pragma once
// CUDA linear layer (ops/linear.h has the math and the shape rules), through cuBLASLt.
//   forward:   y (N, O) bf16 = x (N, I) bf16 . weight (O, I)^T bf16 + bias (O) bf16, fp32
//              accumulation, the bias added in cuBLASLt's epilogue
//   backward:  dx (N, I) bf16 = dy . weight        (= or += per dx_accumulate; beta 0 or 1)
//              dweight (O, I) f32 += dy^T . x       (beta 1: accumulates over micro-batches)
//              dbias (O) f32 += sum_n dy[n, :]     column_reduce.h (two passes, no atomics)
// Parameter gradients are f32 so that micro-batch accumulation does not round to bf16 each time.
// dx, dweight, dbias may each be null (not needed / frozen). Deterministic.
//
// The GELU MLP's two GEMMs with the activation fused (ops/linear.h: linear_gelu_*):
//   linear_gelu_forward:  pre = x W^T + b; act = gelu(pre). Tanh GELU: one GEMM whose epilogue
//       writes act and keeps pre as its aux output. Erf GELU (cuBLASLt has only the tanh form):
//       the GEMM, then the gelu kernel.
//   linear_gelu_backward (the down projection y = act W^T + b, act = gelu(pre)):
//       dpre = gelu'(pre) * (dy W) (=); dpre_bias += sum_n dpre (the up projection's bias
//       gradient); dweight += dy^T act; dbias += sum_n dy: the dx GEMM, the gelu backward in
//       place, column reductions (the backward epilogues were slower on the H100: gemm.h).
//   The forward's epilogue falls back to the separate kernels when cuBLASLt has no algorithm.
// Pointers are device pointers; work is enqueued on `stream`, which must be the state's. Argument
// order of every CUDA launcher: outputs, inputs, sizes, flags, then the state and the stream.

#include <cstdint>

#include "core/dtype.h"

struct CUstream_st;

namespace lathe {
struct CudaState;
}

namespace lathe::cuda {

void linear_forward(bf16* y, const bf16* x, const bf16* weight, const bf16* bias, int64_t N,
                    int64_t I, int64_t O, CudaState& state, CUstream_st* stream);

// y = residual + x . weight^T + bias in one GEMM: residual is cuBLASLt's C (beta 1), so the sum
// is rounded to bf16 once. y must be another buffer than residual.
void linear_residual_forward(bf16* y, const bf16* x, const bf16* weight, const bf16* bias,
                             const bf16* residual, int64_t N, int64_t I, int64_t O,
                             CudaState& state, CUstream_st* stream);

// dx += or = per dx_accumulate; dweight += or = per dw_accumulate (beta 1 or 0); dbias +=.
void linear_backward(bf16* dx, float* dweight, float* dbias, const bf16* dy, const bf16* x,
                     const bf16* weight, int64_t N, int64_t I, int64_t O, bool dx_accumulate,
                     bool dw_accumulate, CudaState& state, CUstream_st* stream);

// act, pre (N, O); bias may be null.
void linear_gelu_forward(bf16* act, bf16* pre, const bf16* x, const bf16* weight, const bf16* bias,
                         int64_t N, int64_t I, int64_t O, bool tanh_form, CudaState& state,
                         CUstream_st* stream);

// dy (N, O); act, pre, dpre (N, I); weight (O, I); dpre_bias (I), dweight, dbias may be null.
void linear_gelu_backward(bf16* dpre, float* dpre_bias, float* dweight, float* dbias,
                          const bf16* dy, const bf16* act, const bf16* pre, const bf16* weight,
                          int64_t N, int64_t I, int64_t O, bool tanh_form, bool dw_accumulate,
                          CudaState& state, CUstream_st* stream);

// FP8 delayed scaling's step amax (ops/linear.h, Fp8LinearBuffers::step_amax): *step_amax =
// max(*step_amax, *amax) as an integer max of the f32 bits (amaxes are non-negative or NaN, whose
// bits order above every finite amax: the casts' own rule). One thread; device pointers.
void fp8_amax_max_into(float* step_amax, const float* amax, CUstream_st* stream);

}  // namespace lathe::cuda
