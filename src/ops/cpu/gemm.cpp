#include "ops/cpu/gemm.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/check.h"
#include "ops/cpu/gelu.h"
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

namespace {

bool is_float_dtype(DType t) {
    return t == DType::kF32 || t == DType::kBF16 || t == DType::kE4M3 || t == DType::kE5M2;
}

float load_element(const void* base, DType t, int64_t i) {
    switch (t) {
        case DType::kF32:
            return static_cast<const float*>(base)[i];
        case DType::kBF16:
            return bf16_to_float(static_cast<const bf16*>(base)[i]);
        case DType::kE4M3:
            return e4m3_to_float(static_cast<const fp8_e4m3*>(base)[i]);
        case DType::kE5M2:
            return e5m2_to_float(static_cast<const fp8_e5m2*>(base)[i]);
        default:
            break;
    }
    LATHE_CHECK(false, "cpu gemm: reading a {} element", dtype_name(t));
    return 0.0f;
}

void store_element(void* base, DType t, int64_t i, float v) {
    switch (t) {
        case DType::kF32:
            static_cast<float*>(base)[i] = v;
            return;
        case DType::kBF16:
            static_cast<bf16*>(base)[i] = float_to_bf16(v);
            return;
        case DType::kE4M3:
            static_cast<fp8_e4m3*>(base)[i] = float_to_e4m3(v, Fp8Overflow::kSaturate);
            return;
        case DType::kE5M2:
            static_cast<fp8_e5m2*>(base)[i] = float_to_e5m2(v, Fp8Overflow::kSaturate);
            return;
        default:
            break;
    }
    LATHE_CHECK(false, "cpu gemm: writing a {} element", dtype_name(t));
}

const void* advance(const void* p, DType t, int64_t elements) {
    return static_cast<const char*>(p) + elements * int64_t(dtype_size(t));
}
void* advance(void* p, DType t, int64_t elements) {
    return static_cast<char*>(p) + elements * int64_t(dtype_size(t));
}

// A stored rows x cols matrix with row stride ld, widened to a dense f32 one.
std::vector<float> widen(const void* p, DType t, int64_t rows, int64_t cols, int64_t ld) {
    std::vector<float> out(size_t(rows * cols));
    LATHE_OMP_PARALLEL_FOR(rows * cols)
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c)
            out[size_t(r * cols + c)] = load_element(p, t, r * ld + c);
    return out;
}

// One batch of the general path; returns max |T| over its elements.
float gemm_one_general(const GemmArgs& g, const void* A, const void* B, const void* C, void* D) {
    const int64_t M = g.M, N = g.N, K = g.K;
    const int64_t a_rows = g.trans_a ? K : M, a_cols = g.trans_a ? M : K;
    const int64_t b_rows = g.trans_b ? N : K, b_cols = g.trans_b ? K : N;
    const std::vector<float> a = widen(A, g.a_dtype, a_rows, a_cols, g.lda);
    const std::vector<float> b = widen(B, g.b_dtype, b_rows, b_cols, g.ldb);
    std::vector<float> t(size_t(M * N));
    sgemm_strided(g.trans_a, g.trans_b, M, N, K, 1.0f, a.data(), a_cols, b.data(), b_cols, 0.0f,
                  t.data(), N);
    const float s = g.alpha * (g.a_scale != nullptr ? *g.a_scale : 1.0f) *
                    (g.b_scale != nullptr ? *g.b_scale : 1.0f);
    const bool bias = gemm_epilogue_has_bias(g.epilogue);
    const DType c_dtype = C == nullptr ? g.d_dtype : g.c_dtype;
    const void* c_base = C == nullptr ? D : C;
    const int64_t ldc = C == nullptr ? g.ldd : g.ldc;
    LATHE_OMP_PARALLEL_FOR(M * N)
    for (int64_t i = 0; i < M; ++i) {
        for (int64_t j = 0; j < N; ++j) {
            float v = s * t[size_t(i * N + j)];
            if (g.beta != 0.0f) v += g.beta * load_element(c_base, c_dtype, i * ldc + j);
            if (bias) v += load_element(g.bias, g.bias_dtype, j);
            t[size_t(i * N + j)] = v;
        }
    }
    if (gemm_epilogue_has_gelu(g.epilogue)) {
        for (int64_t i = 0; i < M; ++i)
            for (int64_t j = 0; j < N; ++j)
                store_element(g.aux, g.d_dtype, i * g.ldaux + j, t[size_t(i * N + j)]);
        gelu_forward(t.data(), t.data(), M * N, true);
    }
    float amax = 0.0f;
    for (const float v : t) amax = std::max(amax, std::fabs(v));
    const float d_scale = g.d_scale != nullptr ? *g.d_scale : 1.0f;
    LATHE_OMP_PARALLEL_FOR(M * N)
    for (int64_t i = 0; i < M; ++i)
        for (int64_t j = 0; j < N; ++j)
            store_element(D, g.d_dtype, i * g.ldd + j, d_scale * t[size_t(i * N + j)]);
    return amax;
}

}  // namespace

void gemm(const GemmArgs& g) {
    gemm_args_check(g, "cpu");
    const bool c_given = g.C != nullptr;
    LATHE_CHECK(is_float_dtype(g.a_dtype) && is_float_dtype(g.b_dtype) &&
                    is_float_dtype(g.d_dtype) && (!c_given || is_float_dtype(g.c_dtype)) &&
                    (!gemm_epilogue_has_bias(g.epilogue) || is_float_dtype(g.bias_dtype)),
                "cpu gemm: no kernel for a non-float dtype in {}", gemm_args_describe(g));
    const bool plain = g.a_dtype == DType::kF32 && g.b_dtype == DType::kF32 &&
                       g.d_dtype == DType::kF32 && !c_given && g.a_scale == nullptr &&
                       g.b_scale == nullptr && g.d_scale == nullptr && g.d_amax == nullptr &&
                       !gemm_epilogue_has_gelu(g.epilogue) &&
                       (g.epilogue == GemmEpilogue::kNone || g.bias_dtype == DType::kF32);
    float amax = 0.0f;
    for (int64_t b = 0; b < g.batch_count; ++b) {
        const void* A = advance(g.A, g.a_dtype, b * g.batch_stride_a);
        const void* B = advance(g.B, g.b_dtype, b * g.batch_stride_b);
        const void* C = c_given ? advance(g.C, g.c_dtype, b * g.batch_stride_c) : nullptr;
        void* D = advance(g.D, g.d_dtype, b * g.batch_stride_d);
        if (!plain) {
            amax = std::max(amax, gemm_one_general(g, A, B, C, D));
            continue;
        }
        float* d = static_cast<float*>(D);
        sgemm_strided(g.trans_a, g.trans_b, g.M, g.N, g.K, g.alpha, static_cast<const float*>(A),
                      g.lda, static_cast<const float*>(B), g.ldb, g.beta, d, g.ldd);
        if (g.epilogue != GemmEpilogue::kBias) continue;
        const float* bias = static_cast<const float*>(g.bias);
        LATHE_OMP_PARALLEL_FOR(g.M * g.N)
        for (int64_t i = 0; i < g.M; ++i)
            for (int64_t j = 0; j < g.N; ++j) d[i * g.ldd + j] += bias[j];
    }
    if (g.d_amax != nullptr) *g.d_amax = amax;
}

bool cpu_has_blas() {
    return LATHE_CPU_BLAS != 0;
}

}  // namespace lathe::cpu
