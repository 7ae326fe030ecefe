#pragma once
// Every matmul of the CUDA backend goes through cuBLASLt, through this one function, which takes
// the backend-neutral description of ops/gemm_args.h (the math, row-major terms, the epilogues;
// the CPU's gemm is its reference) and maps it onto cuBLASLt's column-major descriptors: the
// translation lives here only. Accumulation is fp32 (CUBLAS_COMPUTE_32F, f32 alpha and beta;
// with f32 A and B a plain fp32 GEMM, no TF32).
//
// The combinations it runs (anything else stops naming the combination and the reason):
//   bf16 A, B  -> D bf16 or f32; C of D's dtype; a bias (bf16) with a bf16 D only; the GELU
//                 epilogues with a bf16 D, beta 0 and ldaux a multiple of 8. No scales or amax.
//   f32 A, B   -> D f32; C f32; no bias, no GELU, no scales or amax.
//   fp8 A, B   (e4m3 or e5m2, not both e5m2; Hopper or Ada): op(A) = A stored (M, K) and op(B) =
//                 B^T with B stored (N, K) (cuBLASLt's fp8 "TN" layout: not trans_a, trans_b),
//                 per-tensor a_scale, b_scale; D bf16, f32, e4m3 or e5m2. An fp8 D takes d_scale
//                 and d_amax (nothing else does) and a bf16 C (or beta 0). A bias (bf16) with a
//                 bf16 D only; no GELU. cuBLASLt wants 16-byte aligned operands and leading
//                 dimensions that are multiples of 16 here; it has no algorithm otherwise. Scale
//                 and amax pointers 16-byte aligned (checked: cuBLASLt refuses 4-byte aligned
//                 ones at launch).
//   Every combination takes batch_count > 1 (strided batches), without an epilogue.
// A bias with a bf16 D is what cuBLASLt's bias takes (D's type); the aux of the GELU epilogues is
// the pre-activation in D's dtype. cuBLASLt's GELU is the tanh form (HF's "gelu_new"), so callers
// use it for GeluKind::kTanh only.
//
// beta = 1 accumulates into D (weight gradients over micro-batches). Deterministic: the algorithm
// is picked once per problem (shape, layout, dtypes, scales and amax given or not, epilogue,
// batches, pointer alignment) and cached in the CudaState, and a cuBLASLt algorithm computes the
// same bits on every run for the same inputs on the same GPU model (cuBLAS' documented
// reproducibility: same toolkit, same architecture and SM count, one stream, a workspace the
// caller owns; split-K reductions included: in-place split-K orders its partial sums with
// counters, the other schemes reduce in a separate pass). Internal to ops/cuda: includes
// cuBLASLt's header.
//
// Algorithm search (CudaState::gemm_search, on by default): the first time a problem is met the
// heuristic is asked for up to 8 candidates, each runs once on the call's own operands and only
// those whose D hashes to the heuristic's first choice's bits (an order-independent 64-bit hash of
// D's bytes) are timed, with every stream of the state waited for first, in 5 interleaved rounds
// after 2 warm-up launches each (the median of each); the fastest is kept when it beats the
// first by at least 1 %. So the search changes how long a problem takes, never its bits: a run,
// its resume and another process compute what the heuristic's first would (candidates with
// another reduction order, split-K ones at a long K, are dropped by the hash). The host waits
// for the GPU at each new problem (in a run's first step). The search does not run while the
// stream is captured into a graph, when D overlaps A, B or C, or with an amax output (fp8 D).
// A D that accumulates (beta != 0, C = D)
// is copied first (a temporary cudaMalloc of D's bytes, freed before the call returns; without
// the memory the problem keeps the heuristic's first) and restored before each candidate and the
// call's own launch. Measured: bench/gemm_algo_search.cpp and docs/PERF.md.
//
// The backward epilogues (DGELU_BGRAD, BGRADB) were built and measured on the H100 and removed:
// cuBLASLt refuses an f32 bias gradient next to a bf16 D, and with a bf16 one the fused GELU MLP
// backward was 1.5x slower than the separate kernels (docs/CUDA.md, "Fusions in the block").

#include <cublasLt.h>

#include <array>
#include <cstdint>
#include <unordered_map>

#include "ops/cuda/cuda_state.h"
#include "ops/gemm_args.h"

namespace lathe {

struct CudaState::MatmulCache {
    using Key = std::array<int64_t, 40>;
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
    // The search's 8-byte device word for D's hash.
    DeviceBuffer hash_slot;
};

namespace cuda {

// Enqueues the matmul on `stream` with the state's handle and workspace. Stops on arguments that
// break gemm_args_check, on a combination outside the list above, and when cuBLASLt has no
// algorithm for the problem, naming it.
void gemm(CudaState& state, CUstream_st* stream, const GemmArgs& args);

// The same, but returns false (enqueuing nothing) when cuBLASLt has no algorithm for a GELU
// epilogue's problem, so that its caller can fall back to separate kernels. The answer is cached
// per problem like the algorithm, so a fallback costs one heuristic query per shape.
bool gemm_try(CudaState& state, CUstream_st* stream, const GemmArgs& args);

}  // namespace cuda
}  // namespace lathe
