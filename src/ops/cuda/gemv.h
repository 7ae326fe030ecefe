#pragma once
// Skinny GEMM for a few rows (the decode step's projections): y = x W^T (+ bias) (+ residual),
// the linear forward of ops/linear.h when x has at most kGemvMaxRows rows. At M = 1..16 rows a
// projection reads its weight once and does M multiply-adds per weight element: it is bound by
// the weight's bytes, which this kernel streams with 16-byte loads (several in flight per
// thread) instead of cuBLASLt's tiles sized for large M.
//   y[m, n] = sum_k x[m, k] * weight[n, k] + bias[n] + residual[m, n]
// Shapes: x (M, K) | weight (N, K), row-major | bias (N) or null | residual (M, N) or null |
// y (M, N); every row contiguous. residual may be y itself (each element is read, then written,
// by one thread); y must not overlap x or weight.
// Dtypes: bf16 in and out, fp32 products and sums; the sum, bias and residual are added in fp32
// and rounded to bf16 once (as cuBLASLt's bias epilogue and beta = 1 C do).
// Work split: one block of kGemvThreads threads per kGemvCols consecutive weight rows; the
// block's threads split K in 16-byte chunks (8 elements); each thread keeps M x kGemvCols fp32
// sums, reduced by warp shuffles, then across the block's warps in warp order through shared
// memory. Deterministic: no atomics, a fixed order for a given (M, K, N).
// Pointers are device pointers; work is enqueued on `stream`.

#include <cstdint>

#include "core/dtype.h"

struct CUstream_st;

namespace lathe::cuda {

inline constexpr int64_t kGemvMaxRows = 16;

// Whether gemv_forward takes this problem: 1 <= M <= kGemvMaxRows, K a positive multiple of 8
// (rows of whole 16-byte chunks) below 2^31, 1 <= N < 2^31, x and weight 16-byte aligned. The
// kernel takes K and N as int (offsets into the weight and y are 64-bit): a larger K or N goes to
// cuBLASLt. Host-callable without CUDA.
inline bool gemv_supports(int64_t M, int64_t K, int64_t N, const void* x, const void* weight) {
    constexpr int64_t kIntLimit = int64_t(1) << 31;
    auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
    return M >= 1 && M <= kGemvMaxRows && K > 0 && K % 8 == 0 && K < kIntLimit && N >= 1 &&
           N < kIntLimit && aligned(x) && aligned(weight);
}

// Checked: gemv_supports(M, K, N, x, weight).
void gemv_forward(bf16* y, const bf16* x, const bf16* weight, const bf16* bias,
                  const bf16* residual, int64_t M, int64_t K, int64_t N, CUstream_st* stream);

}  // namespace lathe::cuda
