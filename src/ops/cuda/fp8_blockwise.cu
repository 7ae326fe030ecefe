// clang-format off
#include "ops/cuda/nvcc_compat.h"  // first: before any header that includes fmt
// clang-format on

#include "ops/cuda/fp8_blockwise.h"

#include <cuda_runtime.h>
#include <fmt/format.h>

#include <cstdint>

#include "core/check.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/cuda_state.h"
#include "ops/cuda/gemm.h"
#include "ops/cuda/kernel_util.cuh"

namespace lathe::cuda {

namespace {

constexpr int kThreads = 256;

// One thread per element of dst (dst_rows, ld): the re-layout of fp8_block_scales_to_gemm.
// For 1 x 128: dst_rows = Kb, ld = R4(R), dst[kb][r] = src[r][kb]. For 128 x 128: dst_rows = Rb,
// ld = R4(Kb), dst[rb][kb] = src[rb][kb] or, of a transpose, src[kb][rb]. Padding gets zeros.
__global__ void scales_to_gemm_kernel(const float* __restrict__ src, bool one_by_128,
                                      bool src_of_transpose, int64_t R, int64_t Rb, int64_t Kb,
                                      int64_t dst_rows, int64_t ld, float* __restrict__ dst) {
    const int64_t n = dst_rows * ld;
    const int64_t stride = int64_t(gridDim.x) * blockDim.x;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
        const int64_t row = i / ld, col = i % ld;
        float v = 0.0f;
        if (one_by_128) {
            if (col < R) v = src[col * Kb + row];  // row is kb, col is r
        } else if (col < Kb) {
            v = src_of_transpose ? src[col * Rb + row] : src[row * Kb + col];  // row rb, col kb
        }
        dst[i] = v;
    }
}

// Owners of the cuBLASLt descriptors of one call.
struct Desc {
    cublasLtMatmulDesc_t desc = nullptr;
    Desc() { LATHE_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F)); }
    ~Desc() { LATHE_CUBLAS_CHECK(cublasLtMatmulDescDestroy(desc)); }
    Desc(const Desc&) = delete;
    Desc& operator=(const Desc&) = delete;
    template <typename T>
    void set(cublasLtMatmulDescAttributes_t attr, const T& value) {
        LATHE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, attr, &value, sizeof(value)));
    }
};

struct Layout {
    cublasLtMatrixLayout_t layout = nullptr;
    Layout(cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld) {
        LATHE_CUBLAS_CHECK(
            cublasLtMatrixLayoutCreate(&layout, type, uint64_t(rows), uint64_t(cols), ld));
    }
    ~Layout() { LATHE_CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(layout)); }
    Layout(const Layout&) = delete;
    Layout& operator=(const Layout&) = delete;
};

struct Preference {
    cublasLtMatmulPreference_t pref = nullptr;
    Preference() { LATHE_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref)); }
    ~Preference() { LATHE_CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(pref)); }
    Preference(const Preference&) = delete;
    Preference& operator=(const Preference&) = delete;
    template <typename T>
    void set(cublasLtMatmulPreferenceAttributes_t attr, const T& value) {
        LATHE_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &value, sizeof(value)));
    }
};

// The largest power of two (at most 256) dividing the address (the alignment promised to
// cuBLASLt, as ops/cuda/gemm.cu does).
uint32_t alignment_of(const void* p) {
    const uintptr_t a = reinterpret_cast<uintptr_t>(p);
    uint32_t align = 256;
    while (align > 1 && a % align != 0) align /= 2;
    return align;
}

cudaDataType_t fp8_type(DType t) {
    return t == DType::kE4M3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2;
}

int32_t scale_mode(Fp8Block b) {
    return b == Fp8Block::k1x128 ? int32_t(CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F)
                                 : int32_t(CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F);
}

const char* block_name(Fp8Block b) {
    return b == Fp8Block::k1x128 ? "1x128" : "128x128";
}

// Marks the blockwise GEMMs' entries in the CudaState's matmul cache (ops/cuda/gemm.cu's keys
// start with a positive M).
constexpr int64_t kCacheTag = -0x426C6B;

// One blockwise GEMM: D (M, N) row-major (row stride ldd) = A (M, K) . B (N, K)^T per block,
// + bias (N) [bf16 D], + beta C (C of D's dtype, row stride ldd; null: D itself). `gemm` names
// the GEMM in messages.
struct BlockGemm {
    const char* gemm = "";
    int64_t M = 0, N = 0, K = 0;
    Fp8BlockOperand a, b;
    void* D = nullptr;
    DType d_dtype = DType::kBF16;
    int64_t ldd = 0;
    const void* C = nullptr;
    float beta = 0.0f;
    const bf16* bias = nullptr;
};

void run(const BlockGemm& g, CudaState& state, CUstream_st* stream) {
    const auto problem = [&] {
        return fmt::format("M={} N={} K={}, A {} {} x B {} {} -> D {}{}{}", g.M, g.N, g.K,
                           dtype_name(g.a.dtype), block_name(g.a.block), dtype_name(g.b.dtype),
                           block_name(g.b.block), dtype_name(g.d_dtype),
                           g.beta != 0.0f ? ", beta 1" : "", g.bias != nullptr ? ", bias" : "");
    };
    LATHE_CHECK(g.M > 0 && g.N > 0 && g.K > 0, "cuda::{}: empty problem ({})", g.gemm, problem());
    LATHE_CHECK(g.M % 16 == 0 && g.N % 16 == 0 && g.K % 16 == 0,
                "cuda::{}: cuBLASLt's fp8 GEMMs need every dimension a multiple of 16 ({}); use "
                "the native or per-tensor precision for this linear",
                g.gemm, problem());
    LATHE_CHECK(is_fp8(g.a.dtype) && is_fp8(g.b.dtype) &&
                    !(g.a.dtype == DType::kE5M2 && g.b.dtype == DType::kE5M2),
                "cuda::{}: operands must be e4m3 or e5m2, not both e5m2 ({})", g.gemm, problem());
    LATHE_CHECK(!(g.a.block == Fp8Block::k128x128 && g.b.block == Fp8Block::k128x128),
                "cuda::{}: cuBLASLt does not multiply two 128x128-block operands ({})", g.gemm,
                problem());
    LATHE_CHECK(g.d_dtype == DType::kBF16 || g.d_dtype == DType::kF32,
                "cuda::{}: D must be bf16 or f32 ({})", g.gemm, problem());
    LATHE_CHECK(g.bias == nullptr || g.d_dtype == DType::kBF16,
                "cuda::{}: a bf16 bias goes with a bf16 D ({})", g.gemm, problem());
    for (const void* p : {g.a.data, g.b.data, static_cast<const void*>(g.a.scale),
                          static_cast<const void*>(g.b.scale), static_cast<const void*>(g.D), g.C})
        LATHE_CHECK(p == nullptr || reinterpret_cast<uintptr_t>(p) % 16 == 0,
                    "cuda::{}: operands, scales and outputs must be 16-byte aligned ({})", g.gemm,
                    problem());
    LATHE_CHECK(g.a.data != nullptr && g.b.data != nullptr && g.a.scale != nullptr &&
                    g.b.scale != nullptr && g.D != nullptr,
                "cuda::{}: an operand, scale or D is missing ({})", g.gemm, problem());

    // Row-major D (M, N) = A B^T is column-major D^T (N, M): cuBLASLt's first operand is our B
    // (stored (N, K) row-major = column-major (K, N), transposed: op = (N, K)), its second our A
    // (column-major (K, M), not transposed), m = N, n = M. So our B's scales are its A scales.
    const cudaDataType_t d_type = g.d_dtype == DType::kBF16 ? CUDA_R_16BF : CUDA_R_32F;
    Layout first(fp8_type(g.b.dtype), g.K, g.N, g.K);
    Layout second(fp8_type(g.a.dtype), g.K, g.M, g.K);
    Layout out(d_type, g.N, g.M, g.ldd);
    Desc desc;
    desc.set(CUBLASLT_MATMUL_DESC_TRANSA, int32_t(CUBLAS_OP_T));
    desc.set(CUBLASLT_MATMUL_DESC_TRANSB, int32_t(CUBLAS_OP_N));
    desc.set(CUBLASLT_MATMUL_DESC_A_SCALE_MODE, scale_mode(g.b.block));
    desc.set(CUBLASLT_MATMUL_DESC_B_SCALE_MODE, scale_mode(g.a.block));
    desc.set(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, static_cast<const void*>(g.b.scale));
    desc.set(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, static_cast<const void*>(g.a.scale));
    if (g.bias != nullptr) {
        desc.set(CUBLASLT_MATMUL_DESC_EPILOGUE, uint32_t(CUBLASLT_EPILOGUE_BIAS));
        desc.set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, static_cast<const void*>(g.bias));
        desc.set(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, int32_t(CUDA_R_16BF));
    }
    const void* c_ptr = g.C != nullptr ? g.C : g.D;

    const uint32_t align_a = alignment_of(g.a.data), align_b = alignment_of(g.b.data),
                   align_c = alignment_of(c_ptr), align_d = alignment_of(g.D);
    const CudaState::MatmulCache::Key key{kCacheTag,
                                          g.M,
                                          g.N,
                                          g.K,
                                          g.ldd,
                                          int64_t(g.a.dtype),
                                          int64_t(g.b.dtype),
                                          int64_t(g.a.block),
                                          int64_t(g.b.block),
                                          int64_t(g.d_dtype),
                                          g.beta != 0.0f,
                                          g.bias != nullptr,
                                          g.bias != nullptr ? alignment_of(g.bias) : 0,
                                          align_a,
                                          align_b,
                                          align_c,
                                          align_d,
                                          int64_t(state.workspace_bytes())};
    auto& algos = state.matmul_cache().algos;
    auto it = algos.find(key);
    if (it == algos.end()) {
        Preference pref;
        pref.set(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, uint64_t(state.workspace_bytes()));
        pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_b);
        pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_a);
        pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_c);
        pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_d);
        cublasLtMatmulHeuristicResult_t result{};
        int found = 0;
        const cublasStatus_t status =
            cublasLtMatmulAlgoGetHeuristic(state.cublaslt(), desc.desc, first.layout, second.layout,
                                           out.layout, out.layout, pref.pref, 1, &result, &found);
        // NOT_SUPPORTED and INVALID_VALUE are cuBLASLt refusing the problem (a scale mode, shape
        // or epilogue it has no block-scaled kernel for): said below, naming the GEMM.
        if (status != CUBLAS_STATUS_NOT_SUPPORTED && status != CUBLAS_STATUS_INVALID_VALUE)
            LATHE_CUBLAS_CHECK(status);
        CudaState::MatmulCache::Entry entry;
        entry.found =
            status == CUBLAS_STATUS_SUCCESS && found > 0 && result.state == CUBLAS_STATUS_SUCCESS;
        if (entry.found) entry.algo = result.algo;
        it = algos.emplace(key, entry).first;
    }
    LATHE_CHECK(it->second.found,
                "cuda::{}: cuBLASLt has no block-scaled fp8 algorithm for {} (alignments A {} B {} "
                "D {}; Hopper (compute capability 9.0) and CUDA 12.9 or newer run these); use the "
                "per-tensor fp8 precision for this linear",
                g.gemm, problem(), align_a, align_b, align_d);
    const float alpha = 1.0f;
    const cublasStatus_t status =
        cublasLtMatmul(state.cublaslt(), desc.desc, &alpha, g.b.data, first.layout, g.a.data,
                       second.layout, &g.beta, c_ptr, out.layout, g.D, out.layout, &it->second.algo,
                       state.workspace(), state.workspace_bytes(), stream);
    LATHE_CHECK(status == CUBLAS_STATUS_SUCCESS, "cuda::{}: cublasLtMatmul failed ({}) for {}",
                g.gemm, cublasLtGetStatusName(status), problem());
}

}  // namespace

void fp8_block_scales_to_gemm(const float* src, Fp8Block block, bool src_of_transpose, int64_t R,
                              int64_t K, float* dst, CUstream_st* stream) {
    LATHE_CHECK(R >= 0 && K >= 0, "cuda::fp8_block_scales_to_gemm: R {} K {}", R, K);
    LATHE_CHECK(block == Fp8Block::k128x128 || !src_of_transpose,
                "cuda::fp8_block_scales_to_gemm: a transposed source is for 128x128 blocks");
    if (R == 0 || K == 0) return;
    const int64_t Rb = fp8_blocks(R), Kb = fp8_blocks(K);
    const bool one = block == Fp8Block::k1x128;
    const int64_t dst_rows = one ? Kb : Rb, ld = one ? fp8_round4(R) : fp8_round4(Kb);
    const unsigned blocks = blocks_for(dst_rows * ld, kThreads, 132 * 8);
    scales_to_gemm_kernel<<<blocks, kThreads, 0, stream>>>(src, one, src_of_transpose, R, Rb, Kb,
                                                           dst_rows, ld, dst);
    LATHE_CUDA_CHECK_LAUNCH();
}

void fp8_blockwise_forward_gemm(bf16* y, Fp8BlockOperand x, Fp8BlockOperand w, const bf16* bias,
                                const bf16* residual, int64_t N, int64_t I, int64_t O,
                                CudaState& state, CUstream_st* stream) {
    LATHE_CHECK(residual == nullptr || static_cast<const void*>(residual) != y,
                "cuda::fp8_blockwise_forward_gemm: y must be another buffer than the residual");
    BlockGemm g;
    g.gemm = "fp8_blockwise_forward_gemm (y = x . w^T)";
    g.M = N, g.N = O, g.K = I;
    g.a = x, g.b = w;
    g.D = y, g.d_dtype = DType::kBF16, g.ldd = O;
    g.C = residual, g.beta = residual != nullptr ? 1.0f : 0.0f;
    g.bias = bias;
    run(g, state, stream);
}

void fp8_blockwise_input_grad_gemm(bf16* dx, Fp8BlockOperand dy, Fp8BlockOperand wt, int64_t N,
                                   int64_t I, int64_t O, bool dx_accumulate, CudaState& state,
                                   CUstream_st* stream) {
    BlockGemm g;
    g.gemm = "fp8_blockwise_input_grad_gemm (dx = dy . wt^T)";
    g.M = N, g.N = I, g.K = O;
    g.a = dy, g.b = wt;
    g.D = dx, g.d_dtype = DType::kBF16, g.ldd = I;
    g.beta = dx_accumulate ? 1.0f : 0.0f;
    run(g, state, stream);
}

void fp8_blockwise_weight_grad_gemm(float* dweight, Fp8BlockOperand dyt, Fp8BlockOperand xt,
                                    int64_t N, int64_t I, int64_t O, bool dw_accumulate,
                                    CudaState& state, CUstream_st* stream) {
    BlockGemm g;
    g.gemm = dw_accumulate ? "fp8_blockwise_weight_grad_gemm (dweight += dyt . xt^T)"
                           : "fp8_blockwise_weight_grad_gemm (dweight = dyt . xt^T)";
    g.M = O, g.N = I, g.K = N;
    g.a = dyt, g.b = xt;
    g.D = dweight, g.d_dtype = DType::kF32, g.ldd = I;
    g.beta = dw_accumulate ? 1.0f : 0.0f;
    run(g, state, stream);
}

}  // namespace lathe::cuda
