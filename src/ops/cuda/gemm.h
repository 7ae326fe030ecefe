#pragma once
// Every matmul of the CUDA backend goes through cuBLASLt, through this one function, in row-major
// terms (the engine's tensors are row-major; the column-major translation lives here only).
//
//   D = alpha * op(A) op(B) + beta * D  (+ bias[j] added to every row i of D, when bias is given)
//   op(A) (M, K): A is stored row-major (M, K) with row stride lda, or (K, M) when trans_a;
//   op(B) (K, N): B is stored row-major (K, N) with row stride ldb, or (N, K) when trans_b;
//   D (M, N) row-major with row stride ldd.
// A and B are bf16; D is bf16 or f32; bias (N) is bf16 and only allowed with a bf16 D (cuBLASLt's
// bias takes D's type). Accumulation is fp32 (CUBLAS_COMPUTE_32F). beta = 1 accumulates into D
// (weight gradients over micro-batches). Deterministic: the algorithm is picked once per problem
// (shape, layout, dtypes, pointer alignment) and cached in the CudaState, and a cuBLASLt algorithm
// computes the same bits on every run for the same inputs on the same GPU model (split-K reductions
// included: in-place split-K orders its partial sums with counters). Internal to ops/cuda: includes
// cuBLASLt's header.

#include <cublasLt.h>

#include <array>
#include <cstdint>
#include <unordered_map>

#include "ops/cuda/cuda_state.h"

namespace lathe {

struct CudaState::MatmulCache {
    using Key = std::array<int64_t, 16>;
    struct KeyHash {
        size_t operator()(const Key& k) const {
            uint64_t h = 1469598103934665603ull;  // FNV-1a over the words
            for (int64_t v : k) h = (h ^ uint64_t(v)) * 1099511628211ull;
            return size_t(h);
        }
    };
    std::unordered_map<Key, cublasLtMatmulAlgo_t, KeyHash> algos;
};

namespace cuda {

struct GemmArgs {
    int64_t M = 0, N = 0, K = 0;
    const void* A = nullptr;  // bf16
    int64_t lda = 0;
    bool trans_a = false;
    const void* B = nullptr;  // bf16
    int64_t ldb = 0;
    bool trans_b = false;
    void* D = nullptr;
    int64_t ldd = 0;
    DType d_dtype = DType::kBF16;  // kBF16 or kF32
    const void* bias = nullptr;    // (N) of D's dtype, or null
    float alpha = 1.0f;
    float beta = 0.0f;
};

// Enqueues the matmul on `stream` with the state's handle and workspace. Shapes must be positive
// and strides at least the stored row lengths (checked). Stops when cuBLASLt has no algorithm for
// the problem, naming it.
void gemm_bf16(CudaState& state, CUstream_st* stream, const GemmArgs& args);

}  // namespace cuda
}  // namespace lathe
