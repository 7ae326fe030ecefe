#pragma once
// The GEMMs of a linear layer in FP8 with per-tensor scales (ops/linear.h has the layer's math),
// through cuBLASLt's FP8 matmul (ops/cuda/gemm.h: fp8 A and B in the "TN" layout, fp32
// accumulation, per-operand scales). Operands come from the casts of ops/cuda/fp8_cast.h: codes
// plus the scale_inv that multiplies them back (q * scale_inv ~ the bf16 tensor).
//   forward:         y (N, O) bf16  = sx sw (xq (N, I) . wq (O, I)^T) + bias (O)  [+ residual]
//   input gradient:  dx (N, I) bf16 = sdy sw (dyq (N, O) . wtq (I, O)^T)   (= or += per
//                    dx_accumulate); wtq is the transposed weight copy (I, O)
//   weight gradient: dweight (O, I) f32 += sdy sx (dytq (O, N) . xtq (I, N)^T); dytq and xtq the
//                    transposed copies the casts write next to dyq and xq (one read of each)
// E4M3 x and w; dy E4M3 or E5M2 (not both operands E5M2). cuBLASLt's FP8 kernels want 16-byte
// aligned operands and every leading dimension (I, O, N here) a multiple of 16; other shapes stop
// naming the GEMM. Deterministic (gemm.h). Pointers are device pointers; work is enqueued on
// `stream`, the state's.
//
// fp8_support_problem and fp8_self_test are the FP8 line of `lathe doctor` and the check a run
// with fp8 linears makes before its first step.

#include <cstdint>
#include <string>

#include "core/dtype.h"

struct CUstream_st;

namespace lathe {
struct CudaState;
}

namespace lathe::cuda {

// An fp8 operand: codes, their dtype (E4M3/E5M2), and the device f32 scale_inv (16-byte aligned).
struct Fp8Operand {
    const void* data = nullptr;
    DType dtype = DType::kE4M3;
    const float* scale_inv = nullptr;
};

// residual may be null; with it y = residual + ..., rounded once (y another buffer than it).
void fp8_linear_forward(bf16* y, Fp8Operand x, Fp8Operand w, const bf16* bias, const bf16* residual,
                        int64_t N, int64_t I, int64_t O, CudaState& state, CUstream_st* stream);

void fp8_linear_backward_input(bf16* dx, Fp8Operand dy, Fp8Operand wt, int64_t N, int64_t I,
                               int64_t O, bool dx_accumulate, CudaState& state,
                               CUstream_st* stream);

// dweight (O, I) f32 += (accumulate) or = sdy sx (dyt . xt^T).
void fp8_linear_backward_weight(float* dweight, Fp8Operand dyt, Fp8Operand xt, int64_t N, int64_t I,
                                int64_t O, bool accumulate, CudaState& state, CUstream_st* stream);

// dbias (O) f32 += sum_n dy[n, :] over dy (N, O) bf16: the native linear's bias gradient (two
// passes, no atomics: ops/cuda/column_reduce.h), for the FP8 backward.
void fp8_linear_backward_bias(float* dbias, const bf16* dy, int64_t N, int64_t O, CudaState& state,
                              CUstream_st* stream);

// Empty when `device` has FP8 tensor cores (compute capability 8.9 or newer: Ada, Hopper and
// later); otherwise what is missing, naming the GPU and its compute capability, e.g.
// "GPU 0 (Tesla V100-SXM2-16GB, compute capability 7.0) has no FP8 tensor cores (8.9 or newer:
// Ada, Hopper)". A failing device query is named the same way.
std::string fp8_support_problem(int device);

// One FP8 GEMM on `device` against the CPU reference: a (256, 1024) x (512, 1024)^T product of
// seeded random bf16 tensors cast to E4M3 with per-tensor scales, through fp8_linear_forward, and
// the same codes and scales through the CPU's gemm (fp32 math). Returns the line `lathe doctor`
// prints, starting "fp8: ok" or "fp8: FAIL" (or "fp8: none" without FP8 tensor cores), with the
// GPU, the largest error and its bound; `ok` says which.
std::string fp8_self_test(int device, bool& ok);

}  // namespace lathe::cuda
