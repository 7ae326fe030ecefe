// The blockwise fp8 linear on CUDA (ops/fp8_blockwise.h, ops/cuda/fp8_blockwise.h) against the
// CPU: the same bf16 x, w and dy cast on the CPU (ops/cpu/fp8_cast.h, which the CUDA casts match
// bit for bit) give the codes and row-major scales the CPU reference GEMM multiplies; the CUDA
// linear steps (weight cast, forward, backward) run on the GPU. Checked:
//   - the GPU's codes (xq, xqt, wq, wqt, dyq, dyqt) equal the CPU's, byte for byte;
//   - the GEMM-ready scales equal the CPU's row-major scales re-laid out by the formulas of
//     ops/fp8_blockwise.h (zeros in the padding), exactly;
//   - y, dx and dweight from cuBLASLt's block-scaled GEMMs equal the CPU reference within the
//     bound below. The inputs change magnitude by up to 2^+-6 every 32 elements, so scales differ
//     widely from block to block: a scale layout other than the one cuBLASLt reads (R-major vs
//     K-block-major, the padding) puts a wrong scale on most blocks, errors of many times the
//     values, far outside the bound. That is how this test checks the layout assumed from
//     NVIDIA's block-scaled users (ops/cuda/fp8_blockwise.h).
// The bound of an element, derived (S = sum_kb |sa sb| sum_k |a b|, the reference's abs_sum):
//   products of two fp8 values are exact in fp32; two fp32 summation orders of the promoted,
//   scaled block sums differ by at most 2 K 2^-24 S; an added C, bias or residual is one more
//   fp32 addition in each computation: 2 2^-24 (S + |c|); the output's rounding: half an ulp of
//   the value, 2^-8 for bf16 (8 significant bits), none for f32 D beyond the fp32 addition;
//   and the MMA's own accumulation, the dominant term: Hopper's FP8 tensor cores keep about 14
//   significant bits (e8m13, truncating; DeepSeek-V3 section 3.3.2), and a block-scaled GEMM
//   promotes the MMA's sum to fp32 once per 128-wide K block, where the block's scales apply.
//   Within a block, each wgmma step adds 32 products to the running sum: the 33 terms aligned to
//   the largest of them on a grid of 2^-13 of its power of two, a term off the grid losing less
//   than one unit, the result kept to 14 bits. fp8_blockwise_mma_error_bound (ops/fp8_blockwise.h)
//   sums that per element, step by step, from the same codes and scales. It depends on the
//   spread of magnitudes inside a step: along I (y) and O (dx) the inputs' magnitude changes
//   every 32 elements, in step with the wgmma's 32, so a step's products lie close together and
//   mostly on the grid, and the error comes from the running sum's truncation; along the tokens
//   (dweight) every product of a step has its own 2^+-12 of magnitude, most small products fall
//   off the grid of the largest, and the error per step is up to 33 grid units. A single
//   2^-13 S per element (what the per-tensor GEMMs meet: with FAST_ACCUM off they promote
//   every step, ops/cuda/fp8_linear.cu) is exceeded by the blockwise ones: up to 1.7x for y and
//   dx and 7.3x for dweight on H100; the model's bound is 1.0 to 92x that single term and the
//   measured worst errors lie at 0.04 to 0.54 of it (the truncations' signs vary, so they do not
//   all add up).

// clang-format off
#include "ops/cuda/nvcc_compat.h"  // first: before any header that includes fmt
// clang-format on

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "ops/cpu/fp8_cast.h"
#include "ops/cuda/cuda_state.h"
#include "ops/cuda/fp8_blockwise.h"
#include "ops/fp8_blockwise.h"
#include "ops/linear.h"

#if defined(__NVCC__)
#pragma nv_diag_suppress 177
#endif

namespace lathe {
namespace {

// Normal values whose magnitude changes by 2^e, e uniform in [-6, 6], every 32 elements.
std::vector<bf16> random_bf16(int64_t n, uint32_t seed, float sd) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, sd);
    std::uniform_int_distribution<int> expo(-6, 6);
    std::vector<bf16> v(static_cast<size_t>(n));
    int e = 0;
    for (int64_t i = 0; i < n; ++i) {
        if (i % 32 == 0) e = expo(rng);
        v[size_t(i)] = float_to_bf16(std::ldexp(normal(rng), e));
    }
    return v;
}

struct Dev {
    DeviceBuffer buf;
    explicit Dev(size_t bytes) : buf(bytes > 0 ? bytes : 1) {
        EXPECT_EQ(cudaMemset(buf.data(), 0xFF, bytes > 0 ? bytes : 1), cudaSuccess);
    }
    template <typename T>
    T* as() const {
        return static_cast<T*>(buf.data());
    }
};

template <typename T>
Dev upload(const std::vector<T>& h) {
    Dev d(h.size() * sizeof(T));
    EXPECT_EQ(cudaMemcpy(d.buf.data(), h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice),
              cudaSuccess);
    return d;
}

template <typename T>
std::vector<T> download(const void* p, size_t n) {
    std::vector<T> h(n);
    EXPECT_EQ(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
}

// The linear's buffers carved from one allocation, every buffer 256-byte aligned, poisoned.
struct Buffers {
    Fp8BlockwiseBufferBytes bytes;
    Dev mem;
    Fp8BlockwiseBuffers b;
    Buffers(int64_t N, int64_t I, int64_t O)
        : bytes(fp8_blockwise_buffer_bytes(N, I, O)), mem(bytes.total()) {
        auto* p = mem.as<unsigned char>();
        const auto take = [&](size_t n) {
            void* at = p;
            p += (n + 255) / 256 * 256;
            return at;
        };
        b.wq = take(bytes.wq);
        b.wqt = take(bytes.wqt);
        b.w_scale = static_cast<float*>(take(bytes.w_scale));
        b.wt_scale = static_cast<float*>(take(bytes.wt_scale));
        b.xq = take(bytes.xq);
        b.xqt = take(bytes.xqt);
        b.x_scale = static_cast<float*>(take(bytes.x_scale));
        b.xt_scale = static_cast<float*>(take(bytes.xt_scale));
        b.dyq = take(bytes.dyq);
        b.dyqt = take(bytes.dyqt);
        b.dy_scale = static_cast<float*>(take(bytes.dy_scale));
        b.dyt_scale = static_cast<float*>(take(bytes.dyt_scale));
        b.cast_scales = static_cast<float*>(take(bytes.cast_scales));
        EXPECT_EQ(size_t(p - mem.as<unsigned char>()), bytes.total());
    }
};

// A tensor (rows, cols) cast on the CPU: q, qt and their row-major scales (1x128: s (rows, Cb),
// st (cols, Rb); 128x128: s (Rb, Cb)).
struct CpuCast {
    std::vector<uint8_t> q, qt;
    std::vector<float> s, st;
    CpuCast(const std::vector<bf16>& x, int64_t rows, int64_t cols, Fp8Block block)
        : q(size_t(rows * cols)), qt(size_t(rows * cols)) {
        Fp8BlockCastArgs a;
        a.rows = rows;
        a.cols = cols;
        a.x = x.data();
        a.block = block;
        a.q = q.data();
        a.qt = qt.data();
        if (block == Fp8Block::k1x128) {
            s.resize(size_t(rows * fp8_blocks(cols)));
            st.resize(size_t(cols * fp8_blocks(rows)));
            a.scale_inv_t = st.data();
        } else {
            s.resize(size_t(fp8_blocks(rows) * fp8_blocks(cols)));
        }
        a.scale_inv = s.data();
        cpu::fp8_block_cast(a);
    }
};

// ops/fp8_blockwise.h's GEMM-ready layouts, from row-major scales, on the host:
//   1x128 of an operand (R, K), src (R, Kb): dst[kb * R4(R) + r] = src[r * Kb + kb]
//   128x128, src (Rb, Kb) (or, of a transpose, (Kb, Rb)): dst[rb * R4(Kb) + kb]
std::vector<float> gemm_layout(const std::vector<float>& src, Fp8Block block, bool of_transpose,
                               int64_t R, int64_t K) {
    const int64_t Rb = fp8_blocks(R), Kb = fp8_blocks(K);
    std::vector<float> dst(size_t(fp8_block_gemm_scale_count(block, R, K)), 0.0f);
    if (block == Fp8Block::k1x128) {
        for (int64_t r = 0; r < R; ++r)
            for (int64_t kb = 0; kb < Kb; ++kb)
                dst[size_t(kb * fp8_round4(R) + r)] = src[size_t(r * Kb + kb)];
    } else {
        for (int64_t rb = 0; rb < Rb; ++rb)
            for (int64_t kb = 0; kb < Kb; ++kb)
                dst[size_t(rb * fp8_round4(Kb) + kb)] =
                    of_transpose ? src[size_t(kb * Rb + rb)] : src[size_t(rb * Kb + kb)];
    }
    return dst;
}

void expect_bytes_equal(const void* dev, const std::vector<uint8_t>& want, const char* what) {
    const std::vector<uint8_t> got = download<uint8_t>(dev, want.size());
    size_t diffs = 0, first = 0;
    for (size_t i = 0; i < want.size(); ++i)
        if (got[i] != want[i] && diffs++ == 0) first = i;
    EXPECT_EQ(diffs, 0u) << what << ": " << diffs << " codes differ, first at " << first;
}

void expect_scales_equal(const float* dev, const std::vector<float>& want, const char* what) {
    const std::vector<float> got = download<float>(dev, want.size());
    size_t diffs = 0, first = 0;
    for (size_t i = 0; i < want.size(); ++i)
        if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0 && diffs++ == 0) first = i;
    EXPECT_EQ(diffs, 0u) << what << ": " << diffs << " scales differ, first at " << first
                         << " (got " << got[first] << ", want " << want[first] << ")";
}

// An operand view for the CPU reference: codes (R, K), scale of (r, kb) at
// scale[(r / row_block) * row_stride + kb * k_stride].
Fp8BlockOperandView view(const std::vector<uint8_t>& q, int64_t K, const std::vector<float>& s,
                         int64_t row_block, int64_t row_stride, int64_t k_stride) {
    Fp8BlockOperandView v;
    v.q = q.data();
    v.ld = K;
    v.scale = s.data();
    v.row_block = row_block;
    v.scale_row_stride = row_stride;
    v.scale_k_stride = k_stride;
    return v;
}

// got (M, N) against ref + c, c (M, N) the added terms (may be empty), S the reference's
// abs_sum; bf16 outputs add half an ulp of the value (2^-8). Reports the worst error over its
// bound.
void expect_within(const std::vector<float>& got, const std::vector<float>& acc,
                   const std::vector<float>& mag, const std::vector<float>& mma,
                   const std::vector<double>& c, int64_t K, bool bf16_out, const char* what) {
    const double sum_rel = 2.0 * double(K) * 0x1p-24;
    double worst = 0;
    size_t worst_i = 0, fails = 0;
    for (size_t i = 0; i < got.size(); ++i) {
        const double ci = c.empty() ? 0.0 : c[i];
        const double ref = double(acc[i]) + ci;
        const double numeric =
            sum_rel * mag[i] + double(mma[i]) + 2 * 0x1p-24 * (mag[i] + std::fabs(ci));
        const double bound =
            numeric + (bf16_out ? 0x1p-8 * (std::fabs(ref) + numeric) : 0.0) + 1e-30;
        const double err = std::fabs(double(got[i]) - ref);
        const double r = std::isnan(err) ? INFINITY : err / bound;
        if (r > 1.0) ++fails;
        if (!(r <= worst)) {
            worst = r;
            worst_i = i;
        }
    }
    std::printf("%s: worst error %.3g of its bound at %zu (got %.6g, reference %.6g)\n", what,
                worst, worst_i, double(got[worst_i]),
                double(acc[worst_i]) + (c.empty() ? 0.0 : c[worst_i]));
    EXPECT_EQ(fails, 0u) << what << ": " << fails << " of " << got.size()
                         << " elements outside the bound; worst " << worst << " at " << worst_i;
}

// Hopper's FP8 MMA: steps of 32 products, 14 significant bits (the bound's derivation above).
constexpr int64_t kMmaStep = 32;
constexpr int kMmaBits = 14;

// The reference D (M, N), its abs_sum and the MMA error bound of each element.
struct Reference {
    std::vector<float> acc, mag, mma;
    Reference(const Fp8BlockOperandView& A, const Fp8BlockOperandView& B, int64_t M, int64_t N,
              int64_t K)
        : acc(size_t(M * N)), mag(size_t(M * N)), mma(size_t(M * N)) {
        fp8_blockwise_gemm_reference(acc.data(), N, A, B, M, N, K, 0.0f, mag.data());
        fp8_blockwise_mma_error_bound(mma.data(), N, A, B, M, N, K, kMmaStep, kMmaBits);
    }
};

std::vector<float> widen(const std::vector<bf16>& v) {
    std::vector<float> f(v.size());
    for (size_t i = 0; i < v.size(); ++i) f[i] = bf16_to_float(v[i]);
    return f;
}

// The weight cast, forward and backward of one linear (N tokens, weight (O, I)) on the GPU,
// against the CPU. bias, residual: the forward adds them; accumulate: dx += (from a nonzero dx).
void check_linear(int64_t N, int64_t I, int64_t O, bool bias, bool residual, bool accumulate,
                  uint32_t seed) {
    SCOPED_TRACE(testing::Message() << "N " << N << " I " << I << " O " << O);
    CudaState state(0);
    CUstream_st* stream = state.stream();
    const std::vector<bf16> hx = random_bf16(N * I, seed, 1.0f);
    const std::vector<bf16> hw = random_bf16(O * I, seed + 1, 0.05f);
    const std::vector<bf16> hdy = random_bf16(N * O, seed + 2, 0.01f);
    const std::vector<bf16> hbias = random_bf16(O, seed + 3, 0.5f);
    const std::vector<bf16> hres = random_bf16(N * O, seed + 4, 1.0f);
    const std::vector<bf16> hdx0 = random_bf16(N * I, seed + 5, 0.1f);
    const std::vector<float> hdw0(size_t(O * I), 0.25f);
    const Dev x = upload(hx), w = upload(hw), dy = upload(hdy), b = upload(hbias),
              res = upload(hres), dx = upload(hdx0), dw = upload(hdw0);
    const Dev y(size_t(N * O) * 2);
    Buffers buf(N, I, O);
    int64_t gemms = 0;
    buf.b.gemm_count = &gemms;

    fp8_blockwise_cast_weight(w.as<bf16>(), O, I, buf.b, stream);
    fp8_blockwise_forward(y.as<bf16>(), x.as<bf16>(), bias ? b.as<bf16>() : nullptr,
                          residual ? res.as<bf16>() : nullptr, N, I, O, buf.b, state, stream);
    fp8_blockwise_backward(dx.as<bf16>(), dw.as<float>(), nullptr, dy.as<bf16>(), N, I, O,
                           accumulate, true, buf.b, state, stream);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    EXPECT_EQ(gemms, 3);

    const CpuCast cx(hx, N, I, Fp8Block::k1x128), cw(hw, O, I, Fp8Block::k128x128),
        cdy(hdy, N, O, Fp8Block::k1x128);
    expect_bytes_equal(buf.b.xq, cx.q, "xq");
    expect_bytes_equal(buf.b.xqt, cx.qt, "xqt");
    expect_bytes_equal(buf.b.wq, cw.q, "wq");
    expect_bytes_equal(buf.b.wqt, cw.qt, "wqt");
    expect_bytes_equal(buf.b.dyq, cdy.q, "dyq");
    expect_bytes_equal(buf.b.dyqt, cdy.qt, "dyqt");
    expect_scales_equal(buf.b.w_scale, gemm_layout(cw.s, Fp8Block::k128x128, false, O, I),
                        "w_scale");
    expect_scales_equal(buf.b.wt_scale, gemm_layout(cw.s, Fp8Block::k128x128, true, I, O),
                        "wt_scale");
    expect_scales_equal(buf.b.x_scale, gemm_layout(cx.s, Fp8Block::k1x128, false, N, I), "x_scale");
    expect_scales_equal(buf.b.xt_scale, gemm_layout(cx.st, Fp8Block::k1x128, false, I, N),
                        "xt_scale");
    expect_scales_equal(buf.b.dy_scale, gemm_layout(cdy.s, Fp8Block::k1x128, false, N, O),
                        "dy_scale");
    expect_scales_equal(buf.b.dyt_scale, gemm_layout(cdy.st, Fp8Block::k1x128, false, O, N),
                        "dyt_scale");

    const int64_t Ib = fp8_blocks(I), Ob = fp8_blocks(O), Nb = fp8_blocks(N);
    // Forward: x (N, I) 1x128 (s (N, Ib)), w (O, I) 128x128 (s (Ob, Ib)).
    {
        const Reference r(view(cx.q, I, cx.s, 1, Ib, 1), view(cw.q, I, cw.s, 128, Ib, 1), N, O, I);
        std::vector<double> c;
        if (bias || residual) {
            c.assign(size_t(N * O), 0.0);
            for (int64_t n = 0; n < N; ++n)
                for (int64_t o = 0; o < O; ++o)
                    c[size_t(n * O + o)] =
                        (bias ? double(bf16_to_float(hbias[size_t(o)])) : 0.0) +
                        (residual ? double(bf16_to_float(hres[size_t(n * O + o)])) : 0.0);
        }
        expect_within(widen(download<bf16>(y.as<void>(), size_t(N * O))), r.acc, r.mag, r.mma, c, I,
                      true, "forward y");
    }
    // Input gradient: dy (N, O) 1x128 (s (N, Ob)), wt (I, O): block (ib, ob) of w, its scale
    // cw.s[ob * Ib + ib]: row stride 1 (per 128 rows), k stride Ib.
    {
        const Reference r(view(cdy.q, O, cdy.s, 1, Ob, 1), view(cw.qt, O, cw.s, 128, 1, Ib), N, I,
                          O);
        std::vector<double> c;
        if (accumulate) {
            c.resize(size_t(N * I));
            for (size_t i = 0; i < c.size(); ++i) c[i] = bf16_to_float(hdx0[i]);
        }
        expect_within(widen(download<bf16>(dx.as<void>(), size_t(N * I))), r.acc, r.mag, r.mma, c,
                      O, true, "input gradient dx");
    }
    // Weight gradient: dyt (O, N) 1x128 (st (O, Nb)), xt (I, N) 1x128 (st (I, Nb)); += 0.25.
    {
        const Reference r(view(cdy.qt, N, cdy.st, 1, Nb, 1), view(cx.qt, N, cx.st, 1, Nb, 1), O, I,
                          N);
        const std::vector<double> c(size_t(O * I), 0.25);
        expect_within(download<float>(dw.as<void>(), size_t(O * I)), r.acc, r.mag, r.mma, c, N,
                      false, "weight gradient dweight");
    }
}

// The re-layout kernel alone, every mode, with partial blocks and padding (R 200, K 300: Rb 2,
// Kb 3, R4(Kb) 4, R4(R) 200; R 90: R4 92), against the host formulas.
TEST(CudaFp8Blockwise, ScalesToGemmLayoutMatchesTheFormulas) {
    CudaState state(0);
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> u(0.5f, 2.0f);
    for (const auto& [R, K] : {std::pair<int64_t, int64_t>{200, 300}, {90, 260}, {128, 128}}) {
        for (int mode = 0; mode < 3; ++mode) {
            const Fp8Block block = mode == 0 ? Fp8Block::k1x128 : Fp8Block::k128x128;
            const bool tr = mode == 2;
            const size_t n = block == Fp8Block::k1x128 ? size_t(R * fp8_blocks(K))
                                                       : size_t(fp8_blocks(R) * fp8_blocks(K));
            std::vector<float> src(n);
            for (auto& v : src) v = u(rng);
            const Dev d = upload(src);
            const Dev out(size_t(fp8_block_gemm_scale_count(block, R, K)) * 4);
            cuda::fp8_block_scales_to_gemm(d.as<float>(), block, tr, R, K, out.as<float>(),
                                           state.stream());
            ASSERT_EQ(cudaStreamSynchronize(state.stream()), cudaSuccess);
            SCOPED_TRACE(testing::Message() << "R " << R << " K " << K << " mode " << mode);
            expect_scales_equal(out.as<float>(), gemm_layout(src, block, tr, R, K), "re-layout");
        }
    }
}

// Which scale layout cuBLASLt reads, asked directly: the forward GEMM on the same codes with the
// scales laid out each candidate way, against the reference. The layout of ops/fp8_blockwise.h
// must be the one that matches; when it is not, the failure names the candidates that do, so
// one run says what to change. x (64, 384) 1x128 (Kb 3), w (256, 384) 128x128 (Rb 2, Kb 3 is
// not a multiple of 4, so the padded and unpadded layouts differ).
//   1x128 of (R, K):   "R-major"  s[kb * R4(R) + r]   (ops/fp8_blockwise.h)
//                      "K-major"  s[r * Kb + kb]
//   128x128 of (R, K): "Kb-padded" s[rb * R4(Kb) + kb] (ops/fp8_blockwise.h)
//                      "Kb-unpadded" s[rb * Kb + kb]
//                      "Rb-major" s[kb * R4(Rb) + rb]
TEST(CudaFp8Blockwise, CublasLtReadsTheAssumedScaleLayout) {
    constexpr int64_t N = 64, I = 384, O = 256;
    const int64_t Ib = fp8_blocks(I), Ob = fp8_blocks(O);
    CudaState state(0);
    const std::vector<bf16> hx = random_bf16(N * I, 500, 1.0f), hw = random_bf16(O * I, 501, 0.05f);
    const CpuCast cx(hx, N, I, Fp8Block::k1x128), cw(hw, O, I, Fp8Block::k128x128);
    const Reference r(view(cx.q, I, cx.s, 1, Ib, 1), view(cw.q, I, cw.s, 128, Ib, 1), N, O, I);
    const std::vector<float>&acc = r.acc, &mag = r.mag, &mma = r.mma;
    std::vector<std::vector<float>> xs(2), ws(3);
    xs[0] = gemm_layout(cx.s, Fp8Block::k1x128, false, N, I);
    xs[1] = cx.s;
    ws[0] = gemm_layout(cw.s, Fp8Block::k128x128, false, O, I);
    ws[1] = cw.s;
    ws[2].assign(size_t(Ib * fp8_round4(Ob)), 0.0f);
    for (int64_t rb = 0; rb < Ob; ++rb)
        for (int64_t kb = 0; kb < Ib; ++kb)
            ws[2][size_t(kb * fp8_round4(Ob) + rb)] = cw.s[size_t(rb * Ib + kb)];
    const char* x_names[] = {"R-major", "K-major"};
    const char* w_names[] = {"Kb-padded", "Kb-unpadded", "Rb-major"};
    const Dev xq = upload(cx.q), wq = upload(cw.q);
    const double sum_rel = 2.0 * double(I) * 0x1p-24;
    std::string matching, worst_of_each;
    bool assumed_matches = false;
    double assumed_worst = INFINITY, others_best = INFINITY;
    for (int xi = 0; xi < 2; ++xi)
        for (int wi = 0; wi < 3; ++wi) {
            const Dev sx = upload(xs[size_t(xi)]), sw = upload(ws[size_t(wi)]);
            const Dev y(size_t(N * O) * 2);
            cuda::fp8_blockwise_forward_gemm(
                y.as<bf16>(), {xq.as<void>(), DType::kE4M3, Fp8Block::k1x128, sx.as<float>()},
                {wq.as<void>(), DType::kE4M3, Fp8Block::k128x128, sw.as<float>()}, nullptr, nullptr,
                N, I, O, state, state.stream());
            ASSERT_EQ(cudaStreamSynchronize(state.stream()), cudaSuccess);
            const std::vector<bf16> got = download<bf16>(y.as<void>(), size_t(N * O));
            double worst = 0;
            for (size_t i = 0; i < got.size(); ++i) {
                const double numeric = sum_rel * mag[i] + double(mma[i]);
                const double bound = numeric + 0x1p-8 * (std::fabs(acc[i]) + numeric) + 1e-30;
                const double err = std::fabs(double(bf16_to_float(got[i])) - double(acc[i]));
                worst = std::max(worst, std::isnan(err) ? INFINITY : err / bound);
            }
            const std::string name = std::string("x ") + x_names[xi] + ", w " + w_names[wi];
            worst_of_each += name + ": " + std::to_string(worst) + "; ";
            if (xi == 0 && wi == 0)
                assumed_worst = worst;
            else
                others_best = std::min(others_best, worst);
            if (worst <= 1.0) {
                matching += name + "; ";
                if (xi == 0 && wi == 0) assumed_matches = true;
            }
        }
    std::printf("scale layouts (worst error over bound): %s\n", worst_of_each.c_str());
    EXPECT_TRUE(assumed_matches) << "cuBLASLt does not read ops/fp8_blockwise.h's scale layout; "
                                 << "layouts that match: " << (matching.empty() ? "none" : matching)
                                 << " (all: " << worst_of_each << ")";
    // The bound is a worst case over the truncations, so a wrong layout must stand out from the
    // assumed one by more than the bound's slack, not just cross it.
    EXPECT_GE(others_best, 10.0 * assumed_worst)
        << "the layouts are not told apart: the assumed one at " << assumed_worst
        << " of its bound, the nearest other at " << others_best << " (" << worst_of_each << ")";
}

// The same question for the weight gradient's two 1x128 operands (cuBLASLt's A and B both
// VEC128_32F): dyt (192, 384) and xt (256, 384), K = N = 384 tokens (Kb 3), each operand's
// scales laid out R-major (ops/fp8_blockwise.h) or K-major.
TEST(CudaFp8Blockwise, CublasLtReadsTheAssumedScaleLayoutOfTwoVectorOperands) {
    constexpr int64_t N = 384, I = 256, O = 192;
    const int64_t Nb = fp8_blocks(N);
    CudaState state(0);
    const std::vector<bf16> hx = random_bf16(N * I, 600, 1.0f),
                            hdy = random_bf16(N * O, 601, 0.01f);
    const CpuCast cx(hx, N, I, Fp8Block::k1x128), cdy(hdy, N, O, Fp8Block::k1x128);
    const Reference r(view(cdy.qt, N, cdy.st, 1, Nb, 1), view(cx.qt, N, cx.st, 1, Nb, 1), O, I, N);
    const std::vector<float>&acc = r.acc, &mag = r.mag, &mma = r.mma;
    const std::vector<float> dys[2] = {gemm_layout(cdy.st, Fp8Block::k1x128, false, O, N), cdy.st};
    const std::vector<float> xs[2] = {gemm_layout(cx.st, Fp8Block::k1x128, false, I, N), cx.st};
    const char* names[] = {"R-major", "K-major"};
    const Dev dyqt = upload(cdy.qt), xqt = upload(cx.qt);
    const double sum_rel = 2.0 * double(N) * 0x1p-24;
    std::string matching, worst_of_each;
    bool assumed_matches = false;
    double assumed_worst = INFINITY, others_best = INFINITY;
    for (int di = 0; di < 2; ++di)
        for (int xi = 0; xi < 2; ++xi) {
            const Dev sd = upload(dys[di]), sx = upload(xs[xi]);
            const Dev dw = upload(std::vector<float>(size_t(O * I), 0.0f));
            cuda::fp8_blockwise_weight_grad_gemm(
                dw.as<float>(), {dyqt.as<void>(), DType::kE4M3, Fp8Block::k1x128, sd.as<float>()},
                {xqt.as<void>(), DType::kE4M3, Fp8Block::k1x128, sx.as<float>()}, N, I, O, true,
                state, state.stream());
            ASSERT_EQ(cudaStreamSynchronize(state.stream()), cudaSuccess);
            const std::vector<float> got = download<float>(dw.as<void>(), size_t(O * I));
            double worst = 0;
            for (size_t i = 0; i < got.size(); ++i) {
                const double bound = sum_rel * mag[i] + double(mma[i]) + 1e-30;
                const double err = std::fabs(double(got[i]) - double(acc[i]));
                worst = std::max(worst, std::isnan(err) ? INFINITY : err / bound);
            }
            const std::string name = std::string("dyt ") + names[di] + ", xt " + names[xi];
            worst_of_each += name + ": " + std::to_string(worst) + "; ";
            if (di == 0 && xi == 0)
                assumed_worst = worst;
            else
                others_best = std::min(others_best, worst);
            if (worst <= 1.0) {
                matching += name + "; ";
                if (di == 0 && xi == 0) assumed_matches = true;
            }
        }
    std::printf("scale layouts (worst error over bound): %s\n", worst_of_each.c_str());
    EXPECT_TRUE(assumed_matches) << "cuBLASLt does not read ops/fp8_blockwise.h's scale layout; "
                                 << "layouts that match: " << (matching.empty() ? "none" : matching)
                                 << " (all: " << worst_of_each << ")";
    // The bound is a worst case over the truncations, so a wrong layout must stand out from the
    // assumed one by more than the bound's slack, not just cross it.
    EXPECT_GE(others_best, 10.0 * assumed_worst)
        << "the layouts are not told apart: the assumed one at " << assumed_worst
        << " of its bound, the nearest other at " << others_best << " (" << worst_of_each << ")";
}

// A Llama-3-8B-like layer at a test-sized token count (K up to 4096, O 1024).
TEST(CudaFp8Blockwise, Llama8BShapeMatchesTheReference) {
    check_linear(512, 4096, 1024, false, false, false, 100);
}

// Non-square, with the forward's residual (cuBLASLt's C, beta 1) and dx +=.
TEST(CudaFp8Blockwise, NonSquareWithResidualAndAccumulation) {
    check_linear(256, 1024, 3072, false, true, true, 200);
}

// The forward's bias through cuBLASLt's bias epilogue on the block-scaled GEMM (on its own: a
// refusal of the epilogue shows here only).
TEST(CudaFp8Blockwise, ForwardBiasEpilogue) {
    check_linear(128, 512, 384, true, false, false, 250);
}

// Dimensions that are multiples of 16 but not of 128: partial blocks along every K and padded
// 128x128 scale rows (Ob 3 -> 4). cuBLASLt may refuse these; it then stops naming the GEMM.
TEST(CudaFp8Blockwise, PartialBlocksMatchTheReference) {
    check_linear(272, 400, 336, false, true, false, 300);
}

// The linear ops with LinearSpec kFp8Blockwise run the blockwise steps checked above: their
// outputs equal, bit for bit, the steps called directly on another set of buffers (the GEMMs
// are deterministic), the bias gradient included (the forward's bias has its own test).
TEST(CudaFp8Blockwise, LinearOpsRunTheBlockwiseSteps) {
    constexpr int64_t N = 128, I = 256, O = 384;
    CudaState state(0);
    const Context ctx = state.context();
    const Dev x = upload(random_bf16(N * I, 400, 1.0f)), w = upload(random_bf16(O * I, 401, 0.05f));
    const Dev dy = upload(random_bf16(N * O, 402, 0.01f));
    const Dev res = upload(random_bf16(N * O, 404, 1.0f));
    const std::vector<float> zeros_w(size_t(O * I), 0.0f), zeros_b(size_t(O), 0.0f);
    const Dev y1(size_t(N * O) * 2), y2(size_t(N * O) * 2), dx1(size_t(N * I) * 2),
        dx2(size_t(N * I) * 2);
    const Dev dw1 = upload(zeros_w), dw2 = upload(zeros_w), db1 = upload(zeros_b),
              db2 = upload(zeros_b);
    Buffers b1(N, I, O), b2(N, I, O);
    const LinearSpec spec{LinearPrecision::kFp8Blockwise, "mlp_down", nullptr, &b1.b};
    const auto vx = x.buf.view(DType::kBF16, {N, I}), vw = w.buf.view(DType::kBF16, {O, I});
    linear_fp8_cast_weight(vw, ctx, spec);
    linear_residual_forward(y1.buf.view(DType::kBF16, {N, O}), vx, vw, ConstTensorView(),
                            res.buf.view(DType::kBF16, {N, O}), ctx, spec);
    linear_backward(dx1.buf.view(DType::kBF16, {N, I}), dw1.buf.view(DType::kF32, {O, I}),
                    db1.buf.view(DType::kF32, {O}), dy.buf.view(DType::kBF16, {N, O}), vx, vw,
                    GradMode::kOverwrite, ctx, spec);
    CUstream_st* stream = state.stream();
    fp8_blockwise_cast_weight(w.as<bf16>(), O, I, b2.b, stream);
    fp8_blockwise_forward(y2.as<bf16>(), x.as<bf16>(), nullptr, res.as<bf16>(), N, I, O, b2.b,
                          state, stream);
    fp8_blockwise_backward(dx2.as<bf16>(), dw2.as<float>(), db2.as<float>(), dy.as<bf16>(), N, I, O,
                           false, true, b2.b, state, stream);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    const auto same = [](const Dev& a, const Dev& c, size_t bytes, const char* what) {
        expect_bytes_equal(a.buf.data(), download<uint8_t>(c.buf.data(), bytes), what);
    };
    same(y1, y2, size_t(N * O) * 2, "y");
    same(dx1, dx2, size_t(N * I) * 2, "dx");
    same(dw1, dw2, size_t(O * I) * 4, "dweight");
    same(db1, db2, size_t(O) * 4, "dbias");
    // And the bias gradient is the column sum of dy (not zeros left untouched).
    EXPECT_NE(download<float>(db1.buf.data(), 1)[0], 0.0f);
}

// A shape outside cuBLASLt's fp8 requirements stops naming the GEMM.
TEST(CudaFp8Blockwise, RefusedShapeStopsNamingTheGemm) {
    GTEST_FLAG_SET(death_test_style, "threadsafe");
    CudaState state(0);
    const Dev a(64 * 128), s(64 * 64), y(64 * 64 * 2);
    const cuda::Fp8BlockOperand x{a.as<void>(), DType::kE4M3, Fp8Block::k1x128, s.as<float>()};
    const cuda::Fp8BlockOperand w{a.as<void>(), DType::kE4M3, Fp8Block::k128x128, s.as<float>()};
    EXPECT_DEATH(cuda::fp8_blockwise_forward_gemm(y.as<bf16>(), x, w, nullptr, nullptr, 24, 120, 64,
                                                  state, state.stream()),
                 "fp8_blockwise_forward_gemm \\(y = x \\. w\\^T\\): cuBLASLt's fp8 GEMMs need "
                 "every dimension a multiple of 16");
    EXPECT_DEATH(cuda::fp8_blockwise_input_grad_gemm(y.as<bf16>(), w, w, 64, 64, 64, false, state,
                                                     state.stream()),
                 "fp8_blockwise_input_grad_gemm .*: cuBLASLt does not multiply two "
                 "128x128-block operands");
}

}  // namespace
}  // namespace lathe
