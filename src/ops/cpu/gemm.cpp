#include "ops/cpu/gemm.h"

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
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, int(M), int(N), int(K), alpha, A, int(lda), B,
                int(ldb), beta, C, int(ldc));
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
