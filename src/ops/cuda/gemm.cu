// clang-format off
#include "ops/cuda/nvcc_compat.h"  // first: before any header that includes fmt
// clang-format on

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "core/check.h"
#include "core/log.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/gemm.h"
#include "ops/cuda/kernel_util.cuh"

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

bool is_fp8(DType t) {
    return t == DType::kE4M3 || t == DType::kE5M2;
}

cudaDataType_t cuda_type(DType t) {
    switch (t) {
        case DType::kF32:
            return CUDA_R_32F;
        case DType::kBF16:
            return CUDA_R_16BF;
        case DType::kE4M3:
            return CUDA_R_8F_E4M3;
        case DType::kE5M2:
            return CUDA_R_8F_E5M2;
        default:
            break;
    }
    LATHE_CHECK(false, "cuda gemm: no cuBLASLt type for {}", dtype_name(t));
    return CUDA_R_32F;
}

// Empty when the combination is one gemm.h lists, else what is outside the list.
const char* unsupported(const GemmArgs& g) {
    const bool bias = gemm_epilogue_has_bias(g.epilogue), gelu = gemm_epilogue_has_gelu(g.epilogue);
    const bool scales = g.a_scale != nullptr || g.b_scale != nullptr;
    const bool d_scaling = g.d_scale != nullptr || g.d_amax != nullptr;
    if (is_fp8(g.a_dtype) || is_fp8(g.b_dtype)) {
        if (!is_fp8(g.a_dtype) || !is_fp8(g.b_dtype)) return "fp8 next to a wider operand";
        if (g.a_dtype == DType::kE5M2 && g.b_dtype == DType::kE5M2) return "e5m2 times e5m2";
        // Measured on the H100 (cuBLAS 13.0): scales 4 bytes apart in one buffer made
        // cublasLtMatmul return NOT_SUPPORTED after the heuristic had found an algorithm;
        // separately allocated ones run. 16 bytes is the alignment cuBLASLt asks of operands.
        for (const void* p :
             {static_cast<const void*>(g.a_scale), static_cast<const void*>(g.b_scale),
              static_cast<const void*>(g.d_scale), static_cast<const void*>(g.d_amax)})
            if (p != nullptr && reinterpret_cast<uintptr_t>(p) % 16 != 0)
                return "scale and amax pointers must be 16-byte aligned";
        if (g.trans_a || !g.trans_b)
            return "fp8 takes A stored (M, K) and B stored (N, K) only (not trans_a, trans_b)";
        if (g.d_dtype != DType::kBF16 && g.d_dtype != DType::kF32 && !is_fp8(g.d_dtype))
            return "an fp8 product into a D that is not bf16, f32 or fp8";
        if (is_fp8(g.d_dtype)) {
            if (g.C != nullptr ? g.c_dtype != DType::kBF16 : g.beta != 0.0f)
                return "an fp8 D reads a bf16 C (or beta 0)";
        } else {
            if (d_scaling) return "d_scale or d_amax without an fp8 D";
            if (g.C != nullptr && g.c_dtype != g.d_dtype) return "C of another dtype than D";
        }
        if (bias && (g.d_dtype != DType::kBF16 || g.bias_dtype != DType::kBF16))
            return "a bias that is not a bf16 bias next to a bf16 D";
        if (gelu) return "a GELU epilogue on an fp8 product";
        return nullptr;
    }
    if (scales || d_scaling) return "scale or amax pointers without fp8 A and B";
    if (g.C != nullptr && g.c_dtype != g.d_dtype) return "C of another dtype than D";
    if (g.a_dtype == DType::kBF16 && g.b_dtype == DType::kBF16) {
        if (g.d_dtype != DType::kBF16 && g.d_dtype != DType::kF32)
            return "a D that is not bf16 or f32";
        if (bias && (g.d_dtype != DType::kBF16 || g.bias_dtype != DType::kBF16))
            return "a bias that is not a bf16 bias next to a bf16 D";
        if (gelu && (g.d_dtype != DType::kBF16 || g.beta != 0.0f || g.ldaux % 8 != 0))
            return "a GELU epilogue needs a bf16 D, beta 0 and ldaux a multiple of 8";
        return nullptr;
    }
    if (g.a_dtype == DType::kF32 && g.b_dtype == DType::kF32) {
        if (g.d_dtype != DType::kF32) return "an f32 product into a D that is not f32";
        if (g.epilogue != GemmEpilogue::kNone) return "an epilogue on an f32 product";
        return nullptr;
    }
    return "A and B of these dtypes";
}

cublasLtEpilogue_t lt_epilogue(const GemmArgs& g) {
    switch (g.epilogue) {
        case GemmEpilogue::kNone:
            return CUBLASLT_EPILOGUE_DEFAULT;
        case GemmEpilogue::kBias:
            return CUBLASLT_EPILOGUE_BIAS;
        case GemmEpilogue::kGeluAux:
            return CUBLASLT_EPILOGUE_GELU_AUX;
        case GemmEpilogue::kGeluAuxBias:
            return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    }
    return CUBLASLT_EPILOGUE_DEFAULT;
}

// Batched layouts: the batch count and the stride between matrices, set only for more than one
// batch (a single matrix gets the descriptor cuBLASLt's defaults describe).
void set_batches(const MatrixLayout& l, int64_t count, int64_t stride) {
    if (count == 1) return;
    const int32_t n = int32_t(count);
    LATHE_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(
        l.layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &n, sizeof(n)));
    LATHE_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(
        l.layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)));
}

// ---- The measured search (gemm.h, "Algorithm search") ----

constexpr int kSearchCandidates = 8;  // the heuristic's first ones; it rarely returns more here
constexpr int kSearchWarmup = 2, kSearchTimed = 5;
// A candidate replaces the heuristic's first only when it is this much faster (timing noise).
constexpr double kSearchMinGain = 1.01;

__device__ __forceinline__ uint64_t mix64(uint64_t x) {  // splitmix64's finalizer
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

// An order-independent hash of `n` units (bytes or 4-byte words) at p: the wrapping sum of
// mix64(index, unit), so blocks may add in any order and the result is the same.
template <typename Unit>
__global__ void hash_units_kernel(unsigned long long* __restrict__ out, const Unit* __restrict__ p,
                                  int64_t n) {
    uint64_t h = 0;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += int64_t(gridDim.x) * blockDim.x)
        h += mix64(uint64_t(i) * 0x9e3779b97f4a7c15ull ^ uint64_t(p[i]));
    for (int off = 16; off > 0; off /= 2) h += __shfl_down_sync(0xffffffffu, h, off);
    if ((threadIdx.x & 31) == 0) atomicAdd(out, static_cast<unsigned long long>(h));
}

// The hash of `bytes` bytes of device memory at p, read back (waits for `stream`). slot: one
// 8-byte device word the hash is summed in.
uint64_t device_hash(const void* p, int64_t bytes, unsigned long long* slot, CUstream_st* stream) {
    LATHE_CUDA_CHECK(cudaMemsetAsync(slot, 0, sizeof(*slot), stream));
    const bool words = reinterpret_cast<uintptr_t>(p) % 4 == 0 && bytes % 4 == 0;
    const int64_t n = words ? bytes / 4 : bytes;
    const unsigned blocks = blocks_for(n, 256 * 16, 4096);
    if (words)
        hash_units_kernel<<<blocks, 256, 0, stream>>>(slot, static_cast<const uint32_t*>(p), n);
    else
        hash_units_kernel<<<blocks, 256, 0, stream>>>(slot, static_cast<const uint8_t*>(p), n);
    LATHE_CUDA_CHECK_LAUNCH();
    unsigned long long h = 0;
    LATHE_CUDA_CHECK(cudaMemcpyAsync(&h, slot, sizeof(h), cudaMemcpyDeviceToHost, stream));
    LATHE_CUDA_CHECK(cudaStreamSynchronize(stream));
    return h;
}

// Bytes from the first to one past the last element of a row-major (rows, cols) matrix with row
// stride ld, in `count` batches `stride` elements apart.
struct Extent {
    uintptr_t begin = 0, end = 0;
    bool overlaps(const Extent& o) const { return begin < o.end && o.begin < end; }
};
Extent extent_of(const void* p, int64_t rows, int64_t cols, int64_t ld, int64_t count,
                 int64_t stride, DType t) {
    const int64_t elems = (count - 1) * stride + (rows - 1) * ld + cols;
    const uintptr_t b = reinterpret_cast<uintptr_t>(p);
    return {b, b + uintptr_t(elems * int64_t(dtype_size(t)))};
}

// The algorithm a problem keeps (gemm.h, "Algorithm search"): of the heuristic's candidates
// (results, first = its choice), the fastest whose D has the first's bits on this call's
// operands, timed on them; the first when only one came back, when the search is off or cannot
// run here (a stream being captured into a graph, D overlapping an operand, an amax output, no
// device memory for the copy an accumulating D needs). Leaves D as the call found it when
// it accumulates, for the launch that follows.
template <typename Launch>
cublasLtMatmulAlgo_t search(CudaState& state, CudaState::MatmulCache& cache, CUstream_st* stream,
                            const GemmArgs& g,
                            std::span<const cublasLtMatmulHeuristicResult_t> results,
                            const Launch& launch) {
    const cublasLtMatmulAlgo_t heuristic = results[0].algo;
    if (results.size() < 2 || !state.gemm_search() || g.d_amax != nullptr) return heuristic;
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    LATHE_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
    if (capture != cudaStreamCaptureStatusNone) return heuristic;
    const int64_t n = g.batch_count;
    const Extent d = extent_of(g.D, g.M, g.N, g.ldd, n, g.batch_stride_d, g.d_dtype);
    const Extent a = g.trans_a ? extent_of(g.A, g.K, g.M, g.lda, n, g.batch_stride_a, g.a_dtype)
                               : extent_of(g.A, g.M, g.K, g.lda, n, g.batch_stride_a, g.a_dtype);
    const Extent b = g.trans_b ? extent_of(g.B, g.N, g.K, g.ldb, n, g.batch_stride_b, g.b_dtype)
                               : extent_of(g.B, g.K, g.N, g.ldb, n, g.batch_stride_b, g.b_dtype);
    if (d.overlaps(a) || d.overlaps(b)) return heuristic;
    if (g.C != nullptr && g.C != g.D &&
        d.overlaps(extent_of(g.C, g.M, g.N, g.ldc, n, g.batch_stride_c, g.c_dtype)))
        return heuristic;
    const int64_t bytes = int64_t(d.end - d.begin);
    // D accumulating in place (beta != 0, C = D): every launch adds to it, so each candidate
    // starts from a copy of what the call found.
    const bool in_place = g.beta != 0.0f && (g.C == nullptr || g.C == g.D);
    void* saved = nullptr;
    if (in_place) {
        if (cudaMalloc(&saved, size_t(bytes)) != cudaSuccess) {
            (void)cudaGetLastError();
            log_debug("gemm: no device memory for the search's copy of D ({} B) at M={} N={} K={}",
                      bytes, g.M, g.N, g.K);
            return heuristic;
        }
        LATHE_CUDA_CHECK(
            cudaMemcpyAsync(saved, g.D, size_t(bytes), cudaMemcpyDeviceToDevice, stream));
    }
    auto restore = [&] {
        if (in_place)
            LATHE_CUDA_CHECK(
                cudaMemcpyAsync(g.D, saved, size_t(bytes), cudaMemcpyDeviceToDevice, stream));
    };
    if (cache.hash_slot.data() == nullptr) cache.hash_slot = DeviceBuffer(sizeof(uint64_t));
    auto* slot = static_cast<unsigned long long*>(cache.hash_slot.data());
    cudaEvent_t start = nullptr, stop = nullptr;
    LATHE_CUDA_CHECK(cudaEventCreate(&start));
    LATHE_CUDA_CHECK(cudaEventCreate(&stop));
    // Which candidates give the first's bits: one launch each from what the call found.
    uint64_t want = 0;
    std::vector<size_t> same;
    for (size_t i = 0; i < results.size(); ++i) {
        if (results[i].state != CUBLAS_STATUS_SUCCESS) continue;
        restore();
        if (launch(results[i].algo) != CUBLAS_STATUS_SUCCESS) {
            if (i == 0) break;  // the caller's launch reports it
            continue;
        }
        const uint64_t h = device_hash(g.D, bytes, slot, stream);
        if (i == 0) want = h;
        if (h == want) same.push_back(i);  // else another reduction order (split-K): other bits
    }
    // Their times, with the device otherwise idle (every stream of the state waited for: work
    // beside the call, such as the gradients' clearing, would skew them), in interleaved rounds.
    size_t best = 0;
    double first_ms = 0.0, best_ms = 0.0;
    if (same.size() > 1 && same[0] == 0) {
        state.synchronize_all();
        for (size_t i : same)
            for (int w = 0; w < kSearchWarmup; ++w) LATHE_CUBLAS_CHECK(launch(results[i].algo));
        std::vector<std::vector<float>> times(same.size());
        for (int round = 0; round < kSearchTimed; ++round) {
            for (size_t c = 0; c < same.size(); ++c) {
                float ms = 0.0f;
                LATHE_CUDA_CHECK(cudaEventRecord(start, stream));
                LATHE_CUBLAS_CHECK(launch(results[same[c]].algo));
                LATHE_CUDA_CHECK(cudaEventRecord(stop, stream));
                LATHE_CUDA_CHECK(cudaEventSynchronize(stop));
                LATHE_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
                times[c].push_back(ms);
            }
        }
        for (size_t c = 0; c < same.size(); ++c) {
            std::sort(times[c].begin(), times[c].end());
            const double ms = times[c][times[c].size() / 2];
            if (c == 0) first_ms = best_ms = ms;
            if (ms < best_ms) {
                best_ms = ms;
                best = same[c];
            }
        }
    }
    restore();
    LATHE_CUDA_CHECK(cudaEventDestroy(start));
    LATHE_CUDA_CHECK(cudaEventDestroy(stop));
    if (saved != nullptr) {
        LATHE_CUDA_CHECK(cudaStreamSynchronize(stream));
        LATHE_CUDA_CHECK(cudaFree(saved));
    }
    CudaState::GemmSearchCounts& counts = state.gemm_search_counts();
    ++counts.searched;
    if (best == 0 || first_ms < best_ms * kSearchMinGain) return heuristic;
    ++counts.faster;
    counts.saved_ms += first_ms - best_ms;
    log_debug(
        "gemm: candidate {} of {} ({} with the same bits) at M={} N={} K={} beta {}: {:.4f} ms "
        "against the heuristic's {:.4f}",
        best, results.size(), same.size(), g.M, g.N, g.K, g.beta, best_ms, first_ms);
    return results[best].algo;
}

}  // namespace

void gemm(CudaState& state, CUstream_st* stream, const GemmArgs& g) {
    LATHE_CHECK(gemm_try(state, stream, g),
                "cuda gemm: cuBLASLt has no algorithm for {} (alignments A {} B {} D {})",
                gemm_args_describe(g), alignment_of(g.A), alignment_of(g.B), alignment_of(g.D));
}

bool gemm_try(CudaState& state, CUstream_st* stream, const GemmArgs& g) {
    gemm_args_check(g, "cuda");
    const char* reason = unsupported(g);
    LATHE_CHECK(reason == nullptr, "cuda gemm: no kernel for {}: {}", gemm_args_describe(g),
                reason != nullptr ? reason : "");
    LATHE_CHECK(g.batch_count <= INT32_MAX, "cuda gemm: {} batches", g.batch_count);
    const bool fused = gemm_epilogue_has_gelu(g.epilogue);

    // Row-major D (M, N) = op(A) op(B) is column-major D^T (N, M) = op(B)^T op(A)^T, so cuBLASLt
    // computes m = N, n = M, k = K with B as its first operand and A as its second (and so B's
    // scale is its A scale and A's its B scale). A row-major (r, c) matrix with row stride ld is a
    // column-major (c, r) matrix with the same ld. So cuBLASLt's bias (one per row of its D) is
    // per column of ours, and its aux (ld >= its rows) is our row-major (M, N) with row stride
    // ldaux. Without C, C is D; next to an fp8 D (beta 0 then) C is null with a bf16 layout, the
    // type cuBLASLt takes there, which it does not read.
    const cudaDataType_t d_type = cuda_type(g.d_dtype);
    const cudaDataType_t c_type = g.C != nullptr      ? cuda_type(g.c_dtype)
                                  : is_fp8(g.d_dtype) ? CUDA_R_16BF
                                                      : d_type;
    const cudaDataType_t a_type = cuda_type(g.a_dtype), b_type = cuda_type(g.b_dtype);
    MatrixLayout first =
        g.trans_b ? MatrixLayout(b_type, g.K, g.N, g.ldb) : MatrixLayout(b_type, g.N, g.K, g.ldb);
    MatrixLayout second =
        g.trans_a ? MatrixLayout(a_type, g.M, g.K, g.lda) : MatrixLayout(a_type, g.K, g.M, g.lda);
    MatrixLayout out(d_type, g.N, g.M, g.ldd);
    MatrixLayout c_layout(c_type, g.N, g.M, g.C != nullptr ? g.ldc : g.ldd);
    const void* c_ptr = g.C != nullptr ? g.C : is_fp8(g.d_dtype) ? nullptr : g.D;
    set_batches(first, g.batch_count, g.batch_stride_b);
    set_batches(second, g.batch_count, g.batch_stride_a);
    set_batches(out, g.batch_count, g.batch_stride_d);
    set_batches(c_layout, g.batch_count, g.C != nullptr ? g.batch_stride_c : g.batch_stride_d);

    MatmulDesc desc;
    desc.set(CUBLASLT_MATMUL_DESC_TRANSA, int32_t(g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N));
    desc.set(CUBLASLT_MATMUL_DESC_TRANSB, int32_t(g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N));
    const cublasLtEpilogue_t epilogue = lt_epilogue(g);
    if (epilogue != CUBLASLT_EPILOGUE_DEFAULT)
        desc.set(CUBLASLT_MATMUL_DESC_EPILOGUE, uint32_t(epilogue));
    if (g.bias != nullptr) {
        desc.set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, g.bias);
        desc.set(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, int32_t(cuda_type(g.bias_dtype)));
    }
    if (g.aux != nullptr) {
        desc.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, g.aux);
        desc.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, int64_t(g.ldaux));
    }
    // Scales and amax only when given (an unset pointer is cuBLASLt's 1 / no amax).
    if (g.b_scale != nullptr)
        desc.set(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, static_cast<const void*>(g.b_scale));
    if (g.a_scale != nullptr)
        desc.set(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, static_cast<const void*>(g.a_scale));
    if (g.d_scale != nullptr)
        desc.set(CUBLASLT_MATMUL_DESC_D_SCALE_POINTER, static_cast<const void*>(g.d_scale));
    if (g.d_amax != nullptr)
        desc.set(CUBLASLT_MATMUL_DESC_AMAX_D_POINTER, static_cast<void*>(g.d_amax));
    // Beside a collective: plan for the SMs it leaves (CudaState::gemm_sm_target).
    const int sm_target = state.gemm_sm_target();
    if (sm_target > 0) desc.set(CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, int32_t(sm_target));

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
                                          int64_t(a_type),
                                          int64_t(b_type),
                                          int64_t(c_type),
                                          g.bias ? int64_t(g.bias_dtype) : -1,
                                          g.a_scale != nullptr,
                                          g.b_scale != nullptr,
                                          g.d_scale != nullptr,
                                          g.d_amax != nullptr,
                                          g.batch_count,
                                          g.batch_count > 1 ? g.batch_stride_a : 0,
                                          g.batch_count > 1 ? g.batch_stride_b : 0,
                                          g.batch_count > 1 ? g.batch_stride_c : 0,
                                          g.batch_count > 1 ? g.batch_stride_d : 0,
                                          sm_target,
                                          0,
                                          0,
                                          0,
                                          0,
                                          0};
    auto launch = [&](const cublasLtMatmulAlgo_t& algo) {
        return cublasLtMatmul(state.cublaslt(), desc.desc, &g.alpha, g.B, first.layout, g.A,
                              second.layout, &g.beta, c_ptr, c_layout.layout, g.D, out.layout,
                              &algo, state.workspace(), state.workspace_bytes(), stream);
    };
    CudaState::MatmulCache& cache = state.matmul_cache();
    auto it = cache.algos.find(key);
    if (it == cache.algos.end()) {
        MatmulPreference pref;
        pref.set(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, uint64_t(state.workspace_bytes()));
        // First operand of cuBLASLt is our B, second our A; C is D unless given.
        pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_b);
        pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_a);
        pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                 g.C != nullptr ? alignment_of(g.C) : align_d);
        pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_d);
        cublasLtMatmulHeuristicResult_t results[kSearchCandidates] = {};
        int found = 0;
        const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(
            state.cublaslt(), desc.desc, first.layout, second.layout, c_layout.layout, out.layout,
            pref.pref, state.gemm_search() ? kSearchCandidates : 1, results, &found);
        // NOT_SUPPORTED (or no result) means no algorithm for this problem. A fused epilogue
        // can also be refused with INVALID_VALUE (on the H100, cuBLAS 13, an epilogue type
        // combination it does not take), which its caller handles like no algorithm. Any other
        // failure is a real error.
        if (status != CUBLAS_STATUS_NOT_SUPPORTED &&
            !(fused && status == CUBLAS_STATUS_INVALID_VALUE))
            LATHE_CUBLAS_CHECK(status);
        CudaState::MatmulCache::Entry entry;
        entry.found = status == CUBLAS_STATUS_SUCCESS && found > 0 &&
                      results[0].state == CUBLAS_STATUS_SUCCESS;
        if (entry.found)
            entry.algo = search(state, cache, stream, g,
                                std::span<const cublasLtMatmulHeuristicResult_t>(
                                    results, size_t(std::min(found, kSearchCandidates))),
                                launch);
        if (!entry.found && fused)
            log_info(
                "gemm: cuBLASLt has no algorithm for epilogue {} at M={} N={} K={}; "
                "the op uses separate kernels for this shape",
                gemm_epilogue_name(g.epilogue), g.M, g.N, g.K);
        it = cache.algos.emplace(key, entry).first;
    }
    if (!it->second.found) {
        LATHE_CHECK(fused,
                    "cuda gemm: cuBLASLt has no algorithm for {} (alignments A {} B {} D {})",
                    gemm_args_describe(g), align_a, align_b, align_d);
        return false;
    }
    const cublasStatus_t status = launch(it->second.algo);
    // cuBLASLt documents INVALID_VALUE for an epilogue type combination it does not support
    // (e.g. an aux or bias type); it then launches nothing, so a fused epilogue's caller can
    // still fall back. The plain GEMM has no fallback: any failure is an error.
    if (fused && (status == CUBLAS_STATUS_NOT_SUPPORTED || status == CUBLAS_STATUS_INVALID_VALUE)) {
        it->second.found = false;
        log_info(
            "gemm: cuBLASLt refused epilogue {} at M={} N={} K={} ({}); the op uses "
            "separate kernels for this shape",
            gemm_epilogue_name(g.epilogue), g.M, g.N, g.K, cublasLtGetStatusName(status));
        return false;
    }
    LATHE_CUBLAS_CHECK(status);
    return true;
}

}  // namespace lathe::cuda
