// clang-format off
#include "ops/cuda/nvcc_compat.h"  // first: before any header that includes fmt
// clang-format on

#include <cstdint>

#include "core/check.h"
#include "core/log.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/gemm.h"

namespace lathe::cuda {

namespace {

// Owners of the cuBLASLt descriptors of one call.
struct MatmulDesc {
    cublasLtMatmulDesc_t desc = nullptr;
    MatmulDesc() {
        LATHE_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    }
    ~MatmulDesc() { LATHE_CUBLAS_CHECK(cublasLtMatmulDescDestroy(desc)); }
    MatmulDesc(const MatmulDesc&) = delete;
    MatmulDesc& operator=(const MatmulDesc&) = delete;
    template <typename T>
    void set(cublasLtMatmulDescAttributes_t attr, const T& value) {
        LATHE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, attr, &value, sizeof(value)));
    }
};

// A column-major rows x cols matrix with leading dimension ld, as cuBLASLt sees it.
struct MatrixLayout {
    cublasLtMatrixLayout_t layout = nullptr;
    MatrixLayout(cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld) {
        LATHE_CUBLAS_CHECK(
            cublasLtMatrixLayoutCreate(&layout, type, uint64_t(rows), uint64_t(cols), ld));
    }
    ~MatrixLayout() { LATHE_CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(layout)); }
    MatrixLayout(const MatrixLayout&) = delete;
    MatrixLayout& operator=(const MatrixLayout&) = delete;
};

struct MatmulPreference {
    cublasLtMatmulPreference_t pref = nullptr;
    MatmulPreference() { LATHE_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref)); }
    ~MatmulPreference() { LATHE_CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(pref)); }
    MatmulPreference(const MatmulPreference&) = delete;
    MatmulPreference& operator=(const MatmulPreference&) = delete;
    template <typename T>
    void set(cublasLtMatmulPreferenceAttributes_t attr, const T& value) {
        LATHE_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &value, sizeof(value)));
    }
};

// The largest power of two (at most 256) dividing the address: cuBLASLt picks vectorized kernels
// by the alignment the caller promises, so the promise must be the pointer's real alignment.
uint32_t alignment_of(const void* p) {
    const uintptr_t a = reinterpret_cast<uintptr_t>(p);
    uint32_t align = 256;
    while (align > 1 && a % align != 0) align /= 2;
    return align;
}

}  // namespace

namespace {

cublasLtEpilogue_t lt_epilogue(const GemmArgs& g) {
    switch (g.epilogue) {
        case GemmEpilogue::kDefault:
            return g.bias != nullptr ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
        case GemmEpilogue::kGeluAux:
            return g.bias != nullptr ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
    }
    return CUBLASLT_EPILOGUE_DEFAULT;
}

void check_args(const GemmArgs& g) {
    LATHE_CHECK(g.M > 0 && g.N > 0 && g.K > 0, "gemm: M={} N={} K={}", g.M, g.N, g.K);
    LATHE_CHECK(g.A != nullptr && g.B != nullptr && g.D != nullptr, "gemm: a null operand");
    LATHE_CHECK(
        g.lda >= (g.trans_a ? g.M : g.K) && g.ldb >= (g.trans_b ? g.K : g.N) && g.ldd >= g.N,
        "gemm: strides lda={} ldb={} ldd={} too small for M={} N={} K={} (trans {} {})", g.lda,
        g.ldb, g.ldd, g.M, g.N, g.K, g.trans_a, g.trans_b);
    LATHE_CHECK(g.d_dtype == DType::kBF16 || g.d_dtype == DType::kF32, "gemm: D of dtype {}",
                dtype_name(g.d_dtype));
    LATHE_CHECK(g.bias == nullptr || g.d_dtype == DType::kBF16, "gemm: a bias needs a bf16 D");
    LATHE_CHECK(g.C == nullptr || (g.C != g.D && g.ldc >= g.N),
                "gemm: C must be another buffer than D with ldc >= N ({}), got ldc={}", g.N, g.ldc);
    switch (g.epilogue) {
        case GemmEpilogue::kDefault:
            LATHE_CHECK(g.aux == nullptr, "gemm: aux without an epilogue that uses it");
            break;
        case GemmEpilogue::kGeluAux:
            LATHE_CHECK(g.aux != nullptr && g.ldaux >= g.N && g.ldaux % 8 == 0,
                        "gemm: the GELU epilogue needs aux with ldaux >= N ({}) and a multiple of "
                        "8, got ldaux={}",
                        g.N, g.ldaux);
            LATHE_CHECK(g.d_dtype == DType::kBF16 && g.beta == 0.0f,
                        "gemm: the GELU epilogue takes a bf16 D and beta 0");
            break;
    }
}

}  // namespace

void gemm_bf16(CudaState& state, CUstream_st* stream, const GemmArgs& g) {
    LATHE_CHECK(gemm_bf16_try(state, stream, g),
                "gemm: cuBLASLt has no algorithm for M={} N={} K={} lda={} ldb={} ldd={} "
                "trans_a={} trans_b={} D {} bias {} epilogue {} (alignments A {} B {} D {})",
                g.M, g.N, g.K, g.lda, g.ldb, g.ldd, g.trans_a, g.trans_b, dtype_name(g.d_dtype),
                g.bias != nullptr, int(g.epilogue), alignment_of(g.A), alignment_of(g.B),
                alignment_of(g.D));
}

bool gemm_bf16_try(CudaState& state, CUstream_st* stream, const GemmArgs& g) {
    check_args(g);

    // Row-major D (M, N) = op(A) op(B) is column-major D^T (N, M) = op(B)^T op(A)^T, so cuBLASLt
    // computes m = N, n = M, k = K with B as its first operand and A as its second. A row-major
    // (r, c) matrix with row stride ld is a column-major (c, r) matrix with the same ld. So
    // cuBLASLt's bias (one per row of its D) is per column of ours, and its aux (ld >= its rows)
    // is our row-major (M, N) with row stride ldaux.
    const cudaDataType_t d_type = g.d_dtype == DType::kBF16 ? CUDA_R_16BF : CUDA_R_32F;
    MatrixLayout first = g.trans_b ? MatrixLayout(CUDA_R_16BF, g.K, g.N, g.ldb)
                                   : MatrixLayout(CUDA_R_16BF, g.N, g.K, g.ldb);
    MatrixLayout second = g.trans_a ? MatrixLayout(CUDA_R_16BF, g.M, g.K, g.lda)
                                    : MatrixLayout(CUDA_R_16BF, g.K, g.M, g.lda);
    MatrixLayout out(d_type, g.N, g.M, g.ldd);
    MatrixLayout c_layout(d_type, g.N, g.M, g.C != nullptr ? g.ldc : g.ldd);
    const void* c_ptr = g.C != nullptr ? g.C : g.D;

    MatmulDesc desc;
    desc.set(CUBLASLT_MATMUL_DESC_TRANSA, int32_t(g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N));
    desc.set(CUBLASLT_MATMUL_DESC_TRANSB, int32_t(g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N));
    const cublasLtEpilogue_t epilogue = lt_epilogue(g);
    if (epilogue != CUBLASLT_EPILOGUE_DEFAULT)
        desc.set(CUBLASLT_MATMUL_DESC_EPILOGUE, uint32_t(epilogue));
    if (g.bias != nullptr) {
        desc.set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, g.bias);
        desc.set(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, int32_t(CUDA_R_16BF));
    }
    if (g.aux != nullptr) {
        desc.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, g.aux);
        desc.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, int64_t(g.ldaux));
    }

    const uint32_t align_a = alignment_of(g.A), align_b = alignment_of(g.B),
                   align_d = alignment_of(g.D);
    const CudaState::MatmulCache::Key key{g.M,
                                          g.N,
                                          g.K,
                                          g.lda,
                                          g.ldb,
                                          g.ldd,
                                          g.trans_a,
                                          g.trans_b,
                                          int64_t(g.d_dtype),
                                          g.bias != nullptr,
                                          g.beta != 0.0f,
                                          align_a,
                                          align_b,
                                          align_d,
                                          g.bias ? alignment_of(g.bias) : 0,
                                          int64_t(state.workspace_bytes()),
                                          int64_t(epilogue),
                                          g.aux ? alignment_of(g.aux) : 0,
                                          g.ldaux,
                                          g.C ? alignment_of(g.C) : 0,
                                          g.C ? g.ldc : 0,
                                          0,
                                          0,
                                          0};
    auto& algos = state.matmul_cache().algos;
    auto it = algos.find(key);
    if (it == algos.end()) {
        MatmulPreference pref;
        pref.set(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, uint64_t(state.workspace_bytes()));
        // First operand of cuBLASLt is our B, second our A; C is D unless given.
        pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_b);
        pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_a);
        pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                 g.C != nullptr ? alignment_of(g.C) : align_d);
        pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_d);
        cublasLtMatmulHeuristicResult_t result{};
        int found = 0;
        const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(
            state.cublaslt(), desc.desc, first.layout, second.layout, c_layout.layout, out.layout,
            pref.pref, 1, &result, &found);
        // NOT_SUPPORTED (or no result) means no algorithm for this problem. A fused epilogue
        // can also be refused with INVALID_VALUE (on the H100, cuBLAS 13, an epilogue type
        // combination it does not take), which its caller handles like no algorithm. For the
        // plain GEMM any failure is a real error.
        if (g.epilogue == GemmEpilogue::kDefault ||
            (status != CUBLAS_STATUS_NOT_SUPPORTED && status != CUBLAS_STATUS_INVALID_VALUE))
            LATHE_CUBLAS_CHECK(status);
        CudaState::MatmulCache::Entry entry;
        entry.found =
            status == CUBLAS_STATUS_SUCCESS && found > 0 && result.state == CUBLAS_STATUS_SUCCESS;
        if (entry.found) entry.algo = result.algo;
        if (!entry.found && g.epilogue != GemmEpilogue::kDefault)
            log_info(
                "gemm: cuBLASLt has no algorithm for epilogue {} at M={} N={} K={}; "
                "the op uses separate kernels for this shape",
                int(epilogue), g.M, g.N, g.K);
        it = algos.emplace(key, entry).first;
    }
    if (!it->second.found) return false;
    const cublasStatus_t status =
        cublasLtMatmul(state.cublaslt(), desc.desc, &g.alpha, g.B, first.layout, g.A, second.layout,
                       &g.beta, c_ptr, c_layout.layout, g.D, out.layout, &it->second.algo,
                       state.workspace(), state.workspace_bytes(), stream);
    // cuBLASLt documents INVALID_VALUE for an epilogue type combination it does not support
    // (e.g. an aux or bias type); it then launches nothing, so a fused epilogue's caller can
    // still fall back. The plain GEMM has no fallback: any failure is an error.
    if (g.epilogue != GemmEpilogue::kDefault &&
        (status == CUBLAS_STATUS_NOT_SUPPORTED || status == CUBLAS_STATUS_INVALID_VALUE)) {
        it->second.found = false;
        log_info(
            "gemm: cuBLASLt refused epilogue {} at M={} N={} K={} ({}); the op uses "
            "separate kernels for this shape",
            int(epilogue), g.M, g.N, g.K, cublasLtGetStatusName(status));
        return false;
    }
    LATHE_CUBLAS_CHECK(status);
    return true;
}

}  // namespace lathe::cuda
