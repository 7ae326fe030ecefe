#include "ops/cpu/gemm.h"

#include <algorithm>
#include <limits>

#include "core/check.h"
#include "ops/cpu/parallel.h"

// The build links a BLAS when CMake finds one (find_package(BLAS)); its CBLAS header comes with
// the same package (libopenblas-dev). LATHE_NO_BLAS forces the plain loops.
#if !defined(LATHE_NO_BLAS) && __has_include(<cblas.h>)
#include <cblas.h>
#define LATHE_CPU_BLAS 1
#else
#define LATHE_CPU_BLAS 0
#endif

namespace lathe::cpu {

namespace {

#if LATHE_CPU_BLAS
// The CPU backend has one thread pool, OpenMP's: BLAS runs single-threaded inside our parallel
// loops. Two pools on the same cores (OpenMP's and OpenBLAS's pthreads) spin against each other
// between calls; on the shared 2-core build machine attention ran 30x slower that way. This is a
// process-wide OpenBLAS setting, made once; nothing else in lathe calls BLAS.
void blas_single_threaded() {
#ifdef OPENBLAS_VERSION
    static const bool done = [] {
        openblas_set_num_threads(1);
        return true;
    }();
    (void)done;
#endif
}

// C is computed in blocks of this many rows, one single-threaded BLAS call each. The blocking
// depends on the shape only, never on the thread count: OpenBLAS picks different kernels (with
// different summation orders) for different block shapes, so splitting by thread count would
// make results depend on it.
constexpr int64_t kRowBlock = 128;
#endif  // LATHE_CPU_BLAS

}  // namespace

void sgemm_reference(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                     const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
                     int64_t ldc) {
    LATHE_OMP_PARALLEL_FOR(M * N * K)
    for (int64_t m = 0; m < M; ++m) {
        for (int64_t n = 0; n < N; ++n) {
            double acc = 0.0;
            for (int64_t k = 0; k < K; ++k) {
                const float a = trans_a ? A[k * lda + m] : A[m * lda + k];
                const float b = trans_b ? B[n * ldb + k] : B[k * ldb + n];
                acc += double(a) * double(b);
            }
            float& c = C[m * ldc + n];
            c = beta == 0.0f ? float(alpha * acc) : float(alpha * acc + double(beta) * c);
        }
    }
}

void sgemm_strided(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                   const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
                   int64_t ldc) {
    if (M == 0 || N == 0) return;
    LATHE_CHECK(lda >= (trans_a ? M : K) && ldb >= (trans_b ? K : N) && ldc >= N,
                "sgemm leading dimensions lda={} ldb={} ldc={} for {}x{}x{}", lda, ldb, ldc, M, N,
                K);
#if LATHE_CPU_BLAS
    constexpr int64_t kMax = std::numeric_limits<int>::max();
    LATHE_CHECK(M <= kMax && N <= kMax && K <= kMax && lda <= kMax && ldb <= kMax && ldc <= kMax,
                "sgemm sizes {}x{}x{} exceed int", M, N, K);
    if (K == 0) {  // BLAS leaves C * beta; keep the contract explicit
        for (int64_t m = 0; m < M; ++m)
            for (int64_t n = 0; n < N; ++n)
                C[m * ldc + n] = beta == 0.0f ? 0.0f : beta * C[m * ldc + n];
        return;
    }
    blas_single_threaded();
    // Blocks run on separate OpenMP threads when the product is big enough (and the caller is
    // not already inside a parallel loop, where this nests as a serial loop).
    const int64_t blocks = (M + kRowBlock - 1) / kRowBlock;
    LATHE_OMP_PARALLEL_FOR(blocks > 1 ? M * N * K / 8 : 0)
    for (int64_t blk = 0; blk < blocks; ++blk) {
        const int64_t m0 = blk * kRowBlock, m1 = std::min(M, m0 + kRowBlock);
        cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                    trans_b ? CblasTrans : CblasNoTrans, int(m1 - m0), int(N), int(K), alpha,
                    trans_a ? A + m0 : A + m0 * lda, int(lda), B, int(ldb), beta, C + m0 * ldc,
                    int(ldc));
    }
#else
    sgemm_reference(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
#endif
}

void sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
           const float* B, float beta, float* C) {
    sgemm_strided(trans_a, trans_b, M, N, K, alpha, A, trans_a ? M : K, B, trans_b ? K : N, beta, C,
                  N);
}

bool cpu_has_blas() {
    return LATHE_CPU_BLAS != 0;
}

}  // namespace lathe::cpu
