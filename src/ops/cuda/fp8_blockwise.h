#pragma once
// The blockwise-scaled fp8 GEMMs of a linear layer (ops/fp8_blockwise.h has the math, the
// GEMM-ready scale layout and the CPU reference), through cuBLASLt's block-scaled fp8 matmul on
// Hopper: CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F (one f32 per 128 elements along K: 1 x 128
// blocks of activations and gradients) and CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F (one f32
// per 128 x 128 block: weights), fp8 "TN" (both operands stored with K contiguous), fp32
// accumulation, no fast accumulation.
//   forward:         y (N, O) bf16 = x (N, I) 1x128 . w (O, I)^T 128x128 + bias [+ residual]
//   input gradient:  dx (N, I) bf16 = dy (N, O) 1x128 . wt (I, O)^T 128x128 (= or +=)
//   weight gradient: dweight (O, I) f32 += dyt (O, N) 1x128 . xt (I, N)^T 1x128
// (the weight gradient contracts over the N tokens: its operands are the transposed codes with
// 1 x 128 blocks along N that the casts write next to xq and dyq).
//
// The scale layout is the one NVIDIA's block-scaled cuBLASLt users read and write for Hopper
// (cuBLASMp's reference for the 32F modes, TransformerEngine's GEMM-ready block scales), the
// cuBLAS documentation stating it only in prose ("a dedicated scaling factor for each 128-element
// block in the innermost dimension"): for an operand stored with K innermost and R outer,
// VEC128_32F is R-major (s[kb * R4(R) + r]) and BLK128x128_32F K-block-major with the K blocks
// padded to a multiple of 4 (s[rb * R4(Kb) + kb]). The GPU test (fp8_blockwise_test.cu) runs
// every GEMM against the CPU reference on the casts' own codes and row-major scales, with scales
// that differ from block to block, so a layout that is not this one fails there.
// cuBLASLt does not take two 128 x 128 operands (one of the two is 1 x 128 here, always).
//
// Shapes: every dimension a multiple of 16 and pointers 16-byte aligned (cuBLASLt's fp8
// requirements); a shape or combination cuBLASLt refuses stops, naming the GEMM and the problem.
// Deterministic like ops/cuda/gemm.h: one algorithm per problem, cached in the CudaState's
// matmul cache. Device pointers; work enqueued on `stream`.

#include <cstdint>

#include "core/dtype.h"
#include "ops/fp8_blockwise.h"

struct CUstream_st;

namespace lathe {
struct CudaState;
}

namespace lathe::cuda {

// An operand of the blockwise GEMM: codes (R, K) row-major (K contiguous), E4M3 or E5M2, and
// its scales in the GEMM-ready layout of its block kind.
struct Fp8BlockOperand {
    const void* data = nullptr;
    DType dtype = DType::kE4M3;
    Fp8Block block = Fp8Block::k1x128;
    const float* scale = nullptr;
};

// The casts' row-major scales to the GEMM-ready layout, zeros in the padding:
//   1 x 128 (src (R, ceil(K/128)), as the 1x128 cast writes scale_inv, or scale_inv_t for qt):
//       dst[kb * R4(R) + r] = src[r * Kb + kb]
//   128 x 128 (src (ceil(R/128), ceil(K/128)), as the 128x128 cast writes scale_inv):
//       dst[rb * R4(Kb) + kb] = src[rb * Kb + kb]
//   128 x 128 of the transpose (src the scales of the (K, R) tensor whose transpose is the
//   operand: (ceil(K/128), ceil(R/128)), e.g. w's when the operand is wqt):
//       dst[rb * R4(Kb) + kb] = src[kb * Rb + rb]
// dst holds fp8_block_gemm_scale_count(block, R, K) floats.
void fp8_block_scales_to_gemm(const float* src, Fp8Block block, bool src_of_transpose, int64_t R,
                              int64_t K, float* dst, CUstream_st* stream);

// y = x . w^T per block (+ bias (O) bf16) (+ residual (N, O) bf16, another buffer than y).
// x (R N, K I) 1x128, w (R O, K I) 128x128.
void fp8_blockwise_forward_gemm(bf16* y, Fp8BlockOperand x, Fp8BlockOperand w, const bf16* bias,
                                const bf16* residual, int64_t N, int64_t I, int64_t O,
                                CudaState& state, CUstream_st* stream);

// dx = dy . wt^T per block (+= with dx_accumulate). dy (R N, K O) 1x128, wt (R I, K O) 128x128.
void fp8_blockwise_input_grad_gemm(bf16* dx, Fp8BlockOperand dy, Fp8BlockOperand wt, int64_t N,
                                   int64_t I, int64_t O, bool dx_accumulate, CudaState& state,
                                   CUstream_st* stream);

// dweight += dyt . xt^T per block (= without dw_accumulate: beta 0). dyt (R O, K N) 1x128,
// xt (R I, K N) 1x128.
void fp8_blockwise_weight_grad_gemm(float* dweight, Fp8BlockOperand dyt, Fp8BlockOperand xt,
                                    int64_t N, int64_t I, int64_t O, bool dw_accumulate,
                                    CudaState& state, CUstream_st* stream);

}  // namespace lathe::cuda
