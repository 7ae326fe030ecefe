#include "ops/fp8_blockwise.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/check.h"
#include "ops/cpu/parallel.h"
#include "ops/cuda/fp8_blockwise.h"
#include "ops/cuda/fp8_cast.h"
#include "ops/cuda/fp8_linear.h"

namespace lathe {

namespace {

// The codes of an operand widened to f32 (exact), row-major (R, K).
std::vector<float> widen(const Fp8BlockOperandView& v, int64_t R, int64_t K) {
    LATHE_CHECK(is_fp8(v.dtype), "fp8_blockwise_gemm_reference: codes of dtype {}, not e4m3/e5m2",
                dtype_name(v.dtype));
    LATHE_CHECK(v.row_block == 1 || v.row_block == kFp8BlockSize,
                "fp8_blockwise_gemm_reference: row_block {} (1 or 128)", v.row_block);
    std::vector<float> out(size_t(R * K));
    const auto* q = static_cast<const uint8_t*>(v.q);
    for (int64_t r = 0; r < R; ++r)
        for (int64_t k = 0; k < K; ++k) {
            const uint8_t c = q[r * v.ld + k];
            out[size_t(r * K + k)] =
                v.dtype == DType::kE4M3 ? e4m3_to_float(fp8_e4m3{c}) : e5m2_to_float(fp8_e5m2{c});
        }
    return out;
}

float scale_of(const Fp8BlockOperandView& v, int64_t r, int64_t kb) {
    return v.scale[(r / v.row_block) * v.scale_row_stride + kb * v.scale_k_stride];
}

size_t align256(size_t n) {
    return (n + 255) / 256 * 256;
}

// x (rows, cols) bf16 -> q (rows, cols) in 1 x 128 blocks along cols and qt (cols, rows) in
// 1 x 128 blocks along rows, their scales in the GEMM-ready layout (through the row-major scales
// the cast writes into `scratch`).
void cast_1x128(const bf16* x, int64_t rows, int64_t cols, void* q, void* qt, float* q_scale,
                float* qt_scale, float* scratch, CUstream_st* stream) {
    Fp8BlockCastArgs a;
    a.rows = rows;
    a.cols = cols;
    a.x = x;
    a.dtype = DType::kE4M3;
    a.block = Fp8Block::k1x128;
    a.q = q;
    a.scale_inv = scratch;
    a.qt = qt;
    a.scale_inv_t = scratch + rows * fp8_blocks(cols);
    cuda::fp8_block_cast(a, stream);
    cuda::fp8_block_scales_to_gemm(a.scale_inv, Fp8Block::k1x128, false, rows, cols, q_scale,
                                   stream);
    cuda::fp8_block_scales_to_gemm(a.scale_inv_t, Fp8Block::k1x128, false, cols, rows, qt_scale,
                                   stream);
}

void count_gemm(const Fp8BlockwiseBuffers& b) {
    if (b.gemm_count != nullptr) ++*b.gemm_count;
}

}  // namespace

void fp8_blockwise_gemm_reference(float* D, int64_t ldd, const Fp8BlockOperandView& A,
                                  const Fp8BlockOperandView& B, int64_t M, int64_t N, int64_t K,
                                  float beta, float* abs_sum) {
    LATHE_CHECK(M > 0 && N > 0 && K > 0 && ldd >= N && A.ld >= K && B.ld >= K,
                "fp8_blockwise_gemm_reference: M {} N {} K {} lda {} ldb {} ldd {}", M, N, K, A.ld,
                B.ld, ldd);
    const std::vector<float> a = widen(A, M, K), b = widen(B, N, K);
    const int64_t kblocks = fp8_blocks(K);
    LATHE_OMP_PARALLEL_FOR(M * N * K)
    for (int64_t m = 0; m < M; ++m) {
        for (int64_t n = 0; n < N; ++n) {
            const float* ar = a.data() + m * K;
            const float* br = b.data() + n * K;
            float acc = 0.0f, mag = 0.0f;
            for (int64_t kb = 0; kb < kblocks; ++kb) {
                const int64_t k0 = kb * kFp8BlockSize, k1 = std::min(K, k0 + kFp8BlockSize);
                float part = 0.0f, part_mag = 0.0f;
                for (int64_t k = k0; k < k1; ++k) {
                    const float p = ar[k] * br[k];  // exact: two fp8 significands
                    part += p;
                    part_mag += std::fabs(p);
                }
                const float s = scale_of(A, m, kb) * scale_of(B, n, kb);
                acc += s * part;
                mag += std::fabs(s) * part_mag;
            }
            float& d = D[m * ldd + n];
            d = beta != 0.0f ? d + acc : acc;
            if (abs_sum != nullptr) abs_sum[m * ldd + n] = mag;
        }
    }
}

void fp8_blockwise_mma_error_bound(float* bound, int64_t ldd, const Fp8BlockOperandView& A,
                                   const Fp8BlockOperandView& B, int64_t M, int64_t N, int64_t K,
                                   int64_t step, int bits) {
    LATHE_CHECK(M > 0 && N > 0 && K > 0 && ldd >= N && A.ld >= K && B.ld >= K && step > 0 &&
                    bits > 1 && bits < 53,
                "fp8_blockwise_mma_error_bound: M {} N {} K {} lda {} ldb {} ldd {} step {} "
                "bits {}",
                M, N, K, A.ld, B.ld, ldd, step, bits);
    const std::vector<float> a = widen(A, M, K), b = widen(B, N, K);
    const int64_t kblocks = fp8_blocks(K);
    LATHE_OMP_PARALLEL_FOR(M * N * K)
    for (int64_t m = 0; m < M; ++m) {
        for (int64_t n = 0; n < N; ++n) {
            const float* ar = a.data() + m * K;
            const float* br = b.data() + n * K;
            double total = 0.0;
            for (int64_t kb = 0; kb < kblocks; ++kb) {
                const int64_t k0 = kb * kFp8BlockSize, k1 = std::min(K, k0 + kFp8BlockSize);
                double part = 0.0, part_err = 0.0;  // exact running sum; its bound so far
                for (int64_t s0 = k0; s0 < k1; s0 += step) {
                    const int64_t s1 = std::min(k1, s0 + step);
                    double top = std::fabs(part) + part_err, sum = 0.0, sum_abs = 0.0;
                    for (int64_t k = s0; k < s1; ++k) {
                        top = std::max(top, std::fabs(double(ar[k]) * double(br[k])));
                        sum_abs += std::fabs(double(ar[k]) * double(br[k]));
                    }
                    if (top == 0.0) continue;
                    // The grid of the aligned terms: bits significant bits below top's exponent.
                    const double ulp = std::ldexp(1.0, std::ilogb(top) - bits + 1);
                    int64_t off_grid = part != 0.0 || part_err != 0.0 ? 1 : 0;
                    for (int64_t k = s0; k < s1; ++k) {
                        const double p = double(ar[k]) * double(br[k]);  // exact
                        if (std::fmod(p, ulp) != 0.0) ++off_grid;
                        sum += p;  // exact for e4m3 (products span < 2^40, 128 of them)
                    }
                    // The aligned terms' truncation, then the step's result kept to `bits`.
                    part_err += double(off_grid) * ulp +
                                std::ldexp(std::fabs(part) + part_err + sum_abs, 1 - bits);
                    part += sum;
                }
                total +=
                    std::fabs(double(scale_of(A, m, kb)) * double(scale_of(B, n, kb))) * part_err;
            }
            bound[m * ldd + n] = float(total * (1.0 + 0x1p-20));
        }
    }
}

size_t Fp8BlockwiseBufferBytes::total() const {
    size_t t = 0;
    for (size_t s : {wq, wqt, w_scale, wt_scale, xq, xqt, x_scale, xt_scale, dyq, dyqt, dy_scale,
                     dyt_scale, cast_scales})
        t += align256(s);
    return t;
}

Fp8BlockwiseBufferBytes fp8_blockwise_buffer_bytes(int64_t N, int64_t I, int64_t O) {
    LATHE_CHECK(N >= 0 && I >= 0 && O >= 0, "fp8_blockwise_buffer_bytes: N {} I {} O {}", N, I, O);
    constexpr size_t f = sizeof(float);
    Fp8BlockwiseBufferBytes s;
    s.wq = s.wqt = size_t(O * I);
    s.w_scale = f * size_t(fp8_block_gemm_scale_count(Fp8Block::k128x128, O, I));
    s.wt_scale = f * size_t(fp8_block_gemm_scale_count(Fp8Block::k128x128, I, O));
    s.xq = s.xqt = size_t(N * I);
    s.x_scale = f * size_t(fp8_block_gemm_scale_count(Fp8Block::k1x128, N, I));
    s.xt_scale = f * size_t(fp8_block_gemm_scale_count(Fp8Block::k1x128, I, N));
    s.dyq = s.dyqt = size_t(N * O);
    s.dy_scale = f * size_t(fp8_block_gemm_scale_count(Fp8Block::k1x128, N, O));
    s.dyt_scale = f * size_t(fp8_block_gemm_scale_count(Fp8Block::k1x128, O, N));
    // The casts' row-major scales: the weight's (Ob, Ib), or an activation's (N, Ib) + (I, Nb),
    // or the gradient's (N, Ob) + (O, Nb); one at a time on the stream.
    const int64_t w = fp8_blocks(O) * fp8_blocks(I);
    const int64_t x = N * fp8_blocks(I) + I * fp8_blocks(N);
    const int64_t dy = N * fp8_blocks(O) + O * fp8_blocks(N);
    s.cast_scales = f * size_t(std::max({w, x, dy}));
    return s;
}

void fp8_blockwise_cast_weight(const bf16* weight, int64_t O, int64_t I,
                               const Fp8BlockwiseBuffers& b, CUstream_st* stream) {
    Fp8BlockCastArgs a;
    a.rows = O;
    a.cols = I;
    a.x = weight;
    a.dtype = DType::kE4M3;
    a.block = Fp8Block::k128x128;
    a.q = b.wq;
    a.scale_inv = b.cast_scales;
    a.qt = b.wqt;
    cuda::fp8_block_cast(a, stream);
    // wq as (R O, K I); wqt as (R I, K O), whose blocks are w's transposed.
    cuda::fp8_block_scales_to_gemm(b.cast_scales, Fp8Block::k128x128, false, O, I, b.w_scale,
                                   stream);
    cuda::fp8_block_scales_to_gemm(b.cast_scales, Fp8Block::k128x128, true, I, O, b.wt_scale,
                                   stream);
}

void fp8_blockwise_forward(bf16* y, const bf16* x, const bf16* bias, const bf16* residual,
                           int64_t N, int64_t I, int64_t O, const Fp8BlockwiseBuffers& b,
                           CudaState& state, CUstream_st* stream) {
    if (N == 0) return;
    cast_1x128(x, N, I, b.xq, b.xqt, b.x_scale, b.xt_scale, b.cast_scales, stream);
    cuda::fp8_blockwise_forward_gemm(y, {b.xq, DType::kE4M3, Fp8Block::k1x128, b.x_scale},
                                     {b.wq, DType::kE4M3, Fp8Block::k128x128, b.w_scale}, bias,
                                     residual, N, I, O, state, stream);
    count_gemm(b);
}

void fp8_blockwise_backward(bf16* dx, float* dweight, float* dbias, const bf16* dy, int64_t N,
                            int64_t I, int64_t O, bool dx_accumulate, bool dw_accumulate,
                            const Fp8BlockwiseBuffers& b, CudaState& state, CUstream_st* stream) {
    if (N == 0) return;
    if (dx != nullptr || dweight != nullptr)
        cast_1x128(dy, N, O, b.dyq, b.dyqt, b.dy_scale, b.dyt_scale, b.cast_scales, stream);
    if (dx != nullptr) {
        cuda::fp8_blockwise_input_grad_gemm(dx, {b.dyq, DType::kE4M3, Fp8Block::k1x128, b.dy_scale},
                                            {b.wqt, DType::kE4M3, Fp8Block::k128x128, b.wt_scale},
                                            N, I, O, dx_accumulate, state, stream);
        count_gemm(b);
    }
    if (dweight != nullptr) {
        cuda::fp8_blockwise_weight_grad_gemm(dweight,
                                             {b.dyqt, DType::kE4M3, Fp8Block::k1x128, b.dyt_scale},
                                             {b.xqt, DType::kE4M3, Fp8Block::k1x128, b.xt_scale}, N,
                                             I, O, dw_accumulate, state, stream);
        count_gemm(b);
    }
    if (dbias != nullptr) cuda::fp8_linear_backward_bias(dbias, dy, N, O, state, stream);
}

}  // namespace lathe
