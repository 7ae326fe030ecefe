#pragma once
// Every matmul of the CUDA backend goes through cuBLASLt, through this one function, in row-major
// terms (the engine's tensors are row-major; the column-major translation lives here only).
//
//   D = alpha * op(A) op(B) + beta * D  (+ bias[j] added to every row i of D, when bias is given)
//   op(A) (M, K): A is stored row-major (M, K) with row stride lda, or (K, M) when trans_a;
//   op(B) (K, N): B is stored row-major (K, N) with row stride ldb, or (N, K) when trans_b;
//   D (M, N) row-major with row stride ldd.
//   With C given: D = alpha * op(A) op(B) + beta * C (+ bias), C (M, N) of D's dtype with row
//   stride ldc, another buffer than D (a residual the product joins); C null means C is D.
// A and B are bf16; D is bf16 or f32; bias (N) is bf16 and only allowed with a bf16 D (cuBLASLt's
// bias takes D's type). Accumulation is fp32 (CUBLAS_COMPUTE_32F). beta = 1 accumulates into D
// (weight gradients over micro-batches). Deterministic: the algorithm is picked once per problem
// (shape, layout, dtypes, epilogue, pointer alignment) and cached in the CudaState, and a cuBLASLt
// algorithm computes the same bits on every run for the same inputs on the same GPU model (cuBLAS'
// documented reproducibility: same toolkit, same architecture and SM count, one stream, a
// workspace the caller owns; split-K reductions included: in-place split-K orders its partial sums
// with counters, the other schemes reduce in a separate pass). Internal to ops/cuda: includes
// cuBLASLt's header.
//
// Epilogues beyond the bias (GemmEpilogue), each computed from the fp32 accumulator before D is
// rounded:
//   kGeluAux:  P = op(A) op(B) (+ bias);  aux = P (bf16, the pre-activation);  D = gelu_tanh(P).
//              cuBLASLt's GELU is the tanh form (the one HF calls "gelu_new"), so callers use it
//              for GeluKind::kTanh only. beta must be 0.
// aux is row-major (M, N) with row stride ldaux (a multiple of 8, at least N).
// The backward epilogues (DGELU_BGRAD, BGRADB) were built and measured on the H100 and removed:
// cuBLASLt refuses an f32 bias gradient next to a bf16 D, and with a bf16 one the fused GELU MLP
// backward was 1.5x slower than the separate kernels (docs/CUDA.md, "Fusions in the block").

#include <cublasLt.h>

#include <array>
#include <cstdint>
#include <unordered_map>

#include "ops/cuda/cuda_state.h"

namespace lathe {

struct CudaState::MatmulCache {
    using Key = std::array<int64_t, 24>;
    struct KeyHash {
        size_t operator()(const Key& k) const {
            uint64_t h = 1469598103934665603ull;  // FNV-1a over the words
            for (int64_t v : k) h = (h ^ uint64_t(v)) * 1099511628211ull;
            return size_t(h);
        }
    };
    struct Entry {
        bool found = false;  // false: cuBLASLt has no algorithm for the problem (asked once)
        cublasLtMatmulAlgo_t algo{};
    };
    std::unordered_map<Key, Entry, KeyHash> algos;
};

namespace cuda {

enum class GemmEpilogue : uint8_t { kDefault, kGeluAux };

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
    const void* C = nullptr;  // (M, N) of D's dtype, read with beta; null: D itself
    int64_t ldc = 0;
    GemmEpilogue epilogue = GemmEpilogue::kDefault;
    void* aux = nullptr;  // kGeluAux (written): bf16 (M, N)
    int64_t ldaux = 0;
};

// Enqueues the matmul on `stream` with the state's handle and workspace. Shapes must be positive
// and strides at least the stored row lengths (checked). Stops when cuBLASLt has no algorithm for
// the problem, naming it.
void gemm_bf16(CudaState& state, CUstream_st* stream, const GemmArgs& args);

// The same, but returns false (enqueuing nothing) when cuBLASLt has no algorithm for the problem,
// so that a caller asking for a fused epilogue can fall back to separate kernels. The answer is
// cached per problem like the algorithm, so a fallback costs one heuristic query per shape.
bool gemm_bf16_try(CudaState& state, CUstream_st* stream, const GemmArgs& args);

}  // namespace cuda
}  // namespace lathe
