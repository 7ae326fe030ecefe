#pragma once
// Row-major single-precision matrix multiply for the CPU ops:
//   C (M, N) = alpha * op(A) @ op(B) + beta * C
// op(A) is (M, K): A is stored (M, K), or (K, M) when trans_a. op(B) is (K, N): B is stored
// (K, N), or (N, K) when trans_b. beta == 0 overwrites C without reading it (NaNs in C vanish).
// sgemm uses cblas_sgemm when the build has a CBLAS (OpenBLAS), else sgemm_reference. BLAS runs
// single-threaded on fixed blocks of rows of C, the blocks spread over the OpenMP threads: one
// thread pool, and results that depend on the shapes only, not on the thread count.

#include <cstdint>

#include "ops/gemm_args.h"

namespace lathe::cpu {

// The reference GEMM of every backend: computes a GemmArgs (ops/gemm_args.h has the math) in
// f32, reading and writing any float dtype of core/dtype.h (f32, bf16, e4m3, e5m2) for A, B, C, D,
// aux and the bias; scale and amax pointers are host pointers. Every combination runs. All-f32
// operands without scales, amax or a GELU go straight to sgemm_strided (alpha and beta included),
// the bias added after it in f32: bit for bit the plain sgemm calls plus a bias loop. Any other
// combination widens A and B to f32, multiplies them with sgemm_strided, and applies the rest per
// element in f32 (the GELU in fp64, as the CPU's gelu op), rounding once into D. Deterministic.
void gemm(const GemmArgs& g);

void sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
           const float* B, float beta, float* C);

// The plain-loop version (fp64 accumulation, OpenMP over rows of C): the fallback without BLAS
// and the reference the BLAS path is tested against. Deterministic.
void sgemm_reference(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                     const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
                     int64_t ldc);

// The same with explicit leading dimensions (row strides, in elements) of A, B and C, for
// operating on one head of a (B, T, H, D) tensor in place: lda >= stored row length, etc.
void sgemm_strided(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                   const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
                   int64_t ldc);

// Whether sgemm calls a BLAS library in this build (for logs and `lathe doctor`).
bool cpu_has_blas();

}  // namespace lathe::cpu
