#pragma once
// Blockwise-scaled fp8 GEMMs (DeepSeek-V3's scheme) for a linear layer y = x W^T (ops/linear.h):
// the CPU reference of their math, the GEMM-ready scale layout the CUDA GEMMs read, and the
// kFp8Blockwise branch of the linear ops on CUDA with the buffers it needs.
//
// Math. An operand is codes q (R, K) row-major (R its rows, K the contraction) with one f32
// scale_inv per block (ops/fp8_cast.h: q * scale_inv ~ the bf16 tensor), blocks of 1 x 128
// (activations, gradients) or 128 x 128 (weights) along (R, K). For A (M, K) and B (N, K):
//   D[m, n] = sum_kb  sa(m, kb) sb(n, kb)  sum_{k in kb} A[m, k] B[n, k]
// with kb the 128-wide K blocks (the last one shorter when K % 128 != 0), sa(m, kb) the scale
// of A's block holding row m and block kb, and the same for B. The reference computes each
// block's inner sum in fp32 (products of two fp8 values are exact in fp32), multiplies it by
// (sa sb) rounded to fp32, and accumulates the blocks in order in fp32.
//
// GEMM-ready scale layout (what cuBLASLt's VEC128_32F and BLK128x128_32F scale modes read on
// Hopper, for an operand stored (R, K) row-major, K contiguous; see ops/cuda/fp8_blockwise.h for
// where this comes from and how the GPU test checks it). R4(n) = n rounded up to a multiple of 4:
//   1 x 128:   s[kb * R4(R) + r]                 (ceil(K/128) rows of R4(R): R contiguous)
//   128 x 128: s[rb * R4(ceil(K/128)) + kb]      (ceil(R/128) rows of R4(ceil(K/128)))
// The casts of ops/fp8_cast.h write row-major (R, ceil(K/128)) and (ceil(R/128), ceil(K/128));
// cuda::fp8_block_scales_to_gemm turns them into this layout (padding zeroed).
//
// The linear (kFp8Blockwise on CUDA, all codes E4M3):
//   weight, once per optimizer step (linear_fp8_cast_weight): W (O, I) cast in 128 x 128 blocks
//     to wq (O, I) and its transpose wqt (I, O) (the same blocks), with w_scale (wq as the
//     forward's B operand, K = I) and wt_scale (wqt as the input gradient's B operand, K = O);
//   forward: x (N, I) cast once into xq (1 x 128 along I) and xqt (I, N) re-quantized from the
//     bf16 x in 1 x 128 blocks along N (each with its own scales: the weight gradient contracts
//     over tokens, so its operands need blocks along N; quantizing the bf16 transpose, as
//     DeepSeek-V3 does, instead of re-scaling xq's codes, adds no second rounding);
//     y = sum_kb sx sw (xq . wq^T) + bias [+ residual], bf16;
//   backward: dy (N, O) cast into dyq (1 x 128 along O) and dyqt (O, N) (1 x 128 along N);
//     dx = dyq . wqt^T scaled per block (= or +=, bf16); dweight += dyqt . xqt^T scaled per block
//     (f32); dbias += sum_n dy (bf16 dy, as the native op).

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"
#include "ops/fp8_cast.h"

struct CUstream_st;

namespace lathe {

struct CudaState;

// n rounded up to a multiple of 4.
constexpr int64_t fp8_round4(int64_t n) {
    return (n + 3) / 4 * 4;
}

// f32 count of the GEMM-ready scales of an operand (R, K) with `block` blocks (layout above).
constexpr int64_t fp8_block_gemm_scale_count(Fp8Block block, int64_t R, int64_t K) {
    return block == Fp8Block::k1x128 ? fp8_blocks(K) * fp8_round4(R)
                                     : fp8_blocks(R) * fp8_round4(fp8_blocks(K));
}

// One operand of the reference GEMM, in host memory: codes (R, K) row-major with row stride
// `ld`, and the scale of row r's block kb at scale[(r / row_block) * scale_row_stride +
// kb * scale_k_stride], row_block 1 (1 x 128 blocks) or 128 (128 x 128 blocks). Any layout of the
// scales reads through the two strides (the casts' row-major one, the GEMM-ready one, a
// transposed weight's).
struct Fp8BlockOperandView {
    const void* q = nullptr;
    DType dtype = DType::kE4M3;
    int64_t ld = 0;
    const float* scale = nullptr;
    int64_t row_block = 1;
    int64_t scale_row_stride = 0;
    int64_t scale_k_stride = 1;
};

// D (M, N) f32 row-major (row stride ldd) = the blockwise product of A (M, K) and B (N, K) (Math
// above); with beta 1, D += it (D read first). abs_sum, when not null, (M, N) with row stride
// ldd, receives sum_kb |sa sb| sum_k |A B|: the magnitude that bounds the rounding errors of any
// other summation order. Stops (LATHE_CHECK) on a dtype other than E4M3/E5M2 or a non-positive
// size.
void fp8_blockwise_gemm_reference(float* D, int64_t ldd, const Fp8BlockOperandView& A,
                                  const Fp8BlockOperandView& B, int64_t M, int64_t N, int64_t K,
                                  float beta, float* abs_sum = nullptr);

// Bound on how far an FP8 tensor-core GEMM of the same operands may land from the reference
// through its limited-precision accumulation (Hopper's FP8 MMA keeps about 14 significant bits,
// an e8m13 accumulator, truncating; DeepSeek-V3 section 3.3.2). Model: the MMA adds `step`
// products at a time (32 for Hopper's fp8 wgmma) to its running sum of the current 128-wide K
// block, all step + 1 terms aligned to the largest magnitude among them on a grid of 2^(1 - bits)
// of that magnitude's power of two, each term off the grid losing less than one grid unit, and
// the step's result kept to `bits` significant bits (less than 2^(1 - bits) of |running sum| +
// sum |step's products|); the block's sum is then promoted to fp32 and scaled. Per element:
// bound[m, n] = sum_kb |sa sb| sum_steps (those two errors), the running sum's magnitude taken
// with the bound so far added. The fp32 summation of the promoted blocks is not included (the
// caller adds 2 K 2^-24 abs_sum). Same operands and sizes as fp8_blockwise_gemm_reference;
// bound (M, N) with row stride ldd.
void fp8_blockwise_mma_error_bound(float* bound, int64_t ldd, const Fp8BlockOperandView& A,
                                   const Fp8BlockOperandView& B, int64_t M, int64_t N, int64_t K,
                                   int64_t step, int bits);

// The device memory of one kFp8Blockwise linear on CUDA, owned by the caller (sizes from
// fp8_blockwise_buffer_bytes); N is the micro-batch's token count, (O, I) the weight's shape.
// Codes are E4M3, one byte an element; scales f32 in the GEMM-ready layout; every pointer
// 256-byte aligned (cuBLASLt wants 16 bytes of operands and scales).
struct Fp8BlockwiseBuffers {
    void* wq = nullptr;             // (O, I): the weight's codes (linear_fp8_cast_weight)
    void* wqt = nullptr;            // (I, O): their transpose, same 128 x 128 blocks
    float* w_scale = nullptr;       // wq's scales as the forward's operand (R O, K I)
    float* wt_scale = nullptr;      // wqt's scales as the input gradient's operand (R I, K O)
    void* xq = nullptr;             // (N, I): the forward's scratch
    void* xqt = nullptr;            // (I, N): written by the forward, read by the backward
    float* x_scale = nullptr;       // xq's (R N, K I): the forward's scratch
    float* xt_scale = nullptr;      // xqt's (R I, K N): written by the forward, read by backward
    void* dyq = nullptr;            // (N, O): the backward's scratch
    void* dyqt = nullptr;           // (O, N): the backward's scratch
    float* dy_scale = nullptr;      // dyq's (R N, K O): the backward's scratch
    float* dyt_scale = nullptr;     // dyqt's (R O, K N): the backward's scratch
    float* cast_scales = nullptr;   // the casts' row-major scales before the re-layout: scratch
    int64_t* gemm_count = nullptr;  // host counter: += 1 per FP8 GEMM enqueued (may be null)
};

// Bytes of each buffer of Fp8BlockwiseBuffers for N tokens and a weight (O, I); total() is the
// sum with each buffer rounded up to 256 bytes (the alignment the buffers want).
struct Fp8BlockwiseBufferBytes {
    size_t wq = 0, wqt = 0, w_scale = 0, wt_scale = 0;
    size_t xq = 0, xqt = 0, x_scale = 0, xt_scale = 0;
    size_t dyq = 0, dyqt = 0, dy_scale = 0, dyt_scale = 0;
    size_t cast_scales = 0;
    size_t total() const;
};
Fp8BlockwiseBufferBytes fp8_blockwise_buffer_bytes(int64_t N, int64_t I, int64_t O);

// The kFp8Blockwise steps of the linear ops on CUDA (the Math above), called by ops/linear.cpp
// after its shape, memory and dtype checks; `op` and `role` name the linear in messages. Device
// pointers; work enqueued on `stream`.
void fp8_blockwise_cast_weight(const bf16* weight, int64_t O, int64_t I,
                               const Fp8BlockwiseBuffers& b, CUstream_st* stream);
void fp8_blockwise_forward(bf16* y, const bf16* x, const bf16* bias, const bf16* residual,
                           int64_t N, int64_t I, int64_t O, const Fp8BlockwiseBuffers& b,
                           CudaState& state, CUstream_st* stream);
// dx, dweight, dbias may be null (not wanted). dweight += (dw_accumulate) or =; dbias +=.
void fp8_blockwise_backward(bf16* dx, float* dweight, float* dbias, const bf16* dy, int64_t N,
                            int64_t I, int64_t O, bool dx_accumulate, bool dw_accumulate,
                            const Fp8BlockwiseBuffers& b, CudaState& state, CUstream_st* stream);

}  // namespace lathe
