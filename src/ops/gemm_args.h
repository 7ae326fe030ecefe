#pragma once
// The description of one matrix multiply (or a batch of equal ones), the same for every backend:
// the CPU's gemm (ops/cpu/gemm.h) computes it in f32 and is the reference; the CUDA backend's
// (ops/cuda/gemm.h) maps it onto cuBLASLt. A new number format (fp8) or scaling scheme is a new
// set of values in this description and a kernel choice behind it, not a new code path in the ops.
//
// Row-major terms throughout. For each batch b (A, B, C, D advanced by their batch strides):
//   P    = op(A) op(B)                         (M, N), products summed in fp32 or wider
//   T    = alpha * a_scale * b_scale * P + beta * C     C is D itself when C is null
//   T    = T + bias[j]  (every row i)          epilogues kBias, kGeluAuxBias
//   aux  = T, then T = gelu_tanh(T)            epilogues kGeluAux, kGeluAuxBias (aux has D's dtype)
//   amax = max over every element of every batch of |T|      (written when d_amax is given)
//   D    = round_to_d_dtype(d_scale * T)
// op(A) is (M, K): A is stored (M, K) with row stride lda, or (K, M) when trans_a. op(B) is
// (K, N): B is stored (K, N) with row stride ldb, or (N, K) when trans_b. C and D are (M, N) with
// row strides ldc and ldd; aux (M, N) with row stride ldaux. A scale pointer that is null means 1.
// beta = 0 does not read C (NaNs there vanish). The rounding to D's dtype is to nearest even; fp8
// saturates to the largest finite value (core/dtype.h, Fp8Overflow::kSaturate).
//
// Pointers (data, scales, amax) are in the memory of the backend that runs the GEMM; strides are
// in elements of their matrix's dtype. Which combinations of dtypes, scales and epilogues a
// backend runs is its own list (ops/cpu/gemm.h, ops/cuda/gemm.h); any other stops naming the
// combination (gemm_args_describe), never falls back to another computation.

#include <cstdint>
#include <string>
#include <string_view>

#include "core/dtype.h"

namespace lathe {

// What happens to T before D is written (above). The GELU is the tanh form (HF's "gelu_new"),
// the one cuBLASLt's epilogue computes.
enum class GemmEpilogue : uint8_t { kNone, kBias, kGeluAux, kGeluAuxBias };

// "none", "bias", "gelu_aux", "gelu_aux_bias".
std::string_view gemm_epilogue_name(GemmEpilogue e);

constexpr bool gemm_epilogue_has_bias(GemmEpilogue e) {
    return e == GemmEpilogue::kBias || e == GemmEpilogue::kGeluAuxBias;
}
constexpr bool gemm_epilogue_has_gelu(GemmEpilogue e) {
    return e == GemmEpilogue::kGeluAux || e == GemmEpilogue::kGeluAuxBias;
}

struct GemmArgs {
    int64_t M = 0, N = 0, K = 0;

    const void* A = nullptr;
    DType a_dtype = DType::kBF16;
    int64_t lda = 0;
    bool trans_a = false;

    const void* B = nullptr;
    DType b_dtype = DType::kBF16;
    int64_t ldb = 0;
    bool trans_b = false;

    void* D = nullptr;
    DType d_dtype = DType::kBF16;
    int64_t ldd = 0;

    const void* C = nullptr;  // read with beta; null: D itself (then c_dtype is not read)
    DType c_dtype = DType::kBF16;
    int64_t ldc = 0;

    float alpha = 1.0f;
    float beta = 0.0f;

    // Per-tensor scales (one f32 each) and the amax output (one f32); null: 1 / not computed.
    const float* a_scale = nullptr;
    const float* b_scale = nullptr;
    const float* d_scale = nullptr;
    float* d_amax = nullptr;

    GemmEpilogue epilogue = GemmEpilogue::kNone;
    const void* bias = nullptr;  // (N), with a bias epilogue only
    DType bias_dtype = DType::kBF16;
    void* aux = nullptr;  // (M, N) of D's dtype, with a GELU epilogue only (written)
    int64_t ldaux = 0;

    // batch_count equal products; matrix b of X starts at X + b * batch_stride_x (elements).
    // A stride of 0 shares one matrix between the batches (not for D). The epilogues take one
    // batch only.
    int64_t batch_count = 1;
    int64_t batch_stride_a = 0, batch_stride_b = 0, batch_stride_c = 0, batch_stride_d = 0;
};

// The combination in words, for messages: "M=4 N=8 K=16 A e4m3 (N, lda 16) x B e4m3 (T, ldb 16)
// -> D bf16 (ldd 8), C bf16 (ldc 8), alpha 1 beta 1, scales a b, amax, epilogue bias (bf16), batch
// 2".
std::string gemm_args_describe(const GemmArgs& g);

// The checks every backend makes first (LATHE_CHECK naming `backend` and the combination): sizes
// positive, operands present, row strides at least the stored row lengths, C another buffer than
// D with ldc >= N, the bias and aux present exactly when the epilogue uses them, batch strides
// non-negative and D's at least M * ldd when batch_count > 1, no epilogue with batch_count > 1.
void gemm_args_check(const GemmArgs& g, std::string_view backend);

}  // namespace lathe
