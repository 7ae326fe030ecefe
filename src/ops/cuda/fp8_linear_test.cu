// The FP8 linear GEMMs (ops/cuda/fp8_linear.h) against the CPU reference: operands cast on the GPU
// (ops/cuda/fp8_cast.h), their codes and scales read back and multiplied by the CPU's gemm in
// fp32 (quantize, then fp32 math). The bound of each element is derived, not tuned: products of
// two fp8 values are exact in fp32; two fp32 summation orders of K terms differ by at most
// 2 K 2^-24 of the sum of |terms| (S = sum_k |a_ik| |b_jk| sa sb, computed alongside); Hopper's
// FP8 MMA adds its products in an accumulator of about 14 significant bits before cuBLASLt
// promotes the partial sums to fp32 (fast accumulation off; DeepSeek-V3 report, 3.3.2): 2^-13 S
// more; and the output's rounding adds half an ulp of its dtype of the value, once more when a C
// is added (+= and the residual). Half an ulp relative to the value is 2^-p for p significant
// bits: 2^-8 for bf16 (7 stored + 1 implicit; e.g. 0.0020688 lies in [2^-9, 2^-8), ulp 2^-16,
// so its nearest bf16 0.0020752 is 6.4e-6 = 2^-8.3 of it away), 2^-24 for f32.

// clang-format off
#include "ops/cuda/nvcc_compat.h"  // first: before any header that includes fmt
// clang-format on

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "ops/cpu/gemm.h"
#include "ops/cuda/cuda_state.h"
#include "ops/cuda/fp8_cast.h"
#include "ops/cuda/fp8_linear.h"
#include "ops/linear.h"

#if defined(__NVCC__)
#pragma nv_diag_suppress 177
#endif

namespace lathe {
namespace {

std::vector<bf16> random_bf16(int64_t n, uint32_t seed, float sd) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, sd);
    std::vector<bf16> v(static_cast<size_t>(n));
    for (auto& x : v) x = float_to_bf16(normal(rng));
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
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
}

float decode(uint8_t c, DType t) {
    return t == DType::kE4M3 ? e4m3_to_float(fp8_e4m3{c}) : e5m2_to_float(fp8_e5m2{c});
}

// A bf16 tensor (rows, cols) cast on the GPU, current per-tensor scaling: q (rows, cols), qt
// (cols, rows), scale_inv; and the host copies of the codes and the scale.
struct Cast {
    Dev q, qt, scalars;  // scalars: amax at 0, scale_inv at 4 (16-byte aligned)
    DType dtype;
    std::vector<uint8_t> hq, hqt;
    float scale_inv = 0;
    Cast(const Dev& x, int64_t rows, int64_t cols, DType t, CudaState& state)
        : q(size_t(rows * cols)), qt(size_t(rows * cols)), scalars(64), dtype(t) {
        Fp8CastArgs a;
        a.rows = rows;
        a.cols = cols;
        a.x = x.as<bf16>();
        a.dtype = t;
        a.q = q.as<void>();
        a.qt = qt.as<void>();
        a.amax = scalars.as<float>();
        a.scale_inv = scalars.as<float>() + 4;
        cuda::fp8_cast(a, state.stream());
        hq = download<uint8_t>(q.as<void>(), size_t(rows * cols));
        hqt = download<uint8_t>(qt.as<void>(), size_t(rows * cols));
        scale_inv = download<float>(scalars.as<float>() + 4, 1)[0];
    }
    cuda::Fp8Operand op() const { return {q.as<void>(), dtype, scalars.as<float>() + 4}; }
    cuda::Fp8Operand op_t() const { return {qt.as<void>(), dtype, scalars.as<float>() + 4}; }
};

// ref = sa sb (A (M, K) . B (N, K)^T) + c (may be empty) in fp32 on the CPU, and the bound of each
// element (see the file comment; out_unit: half an ulp of the output dtype, relative).
void reference(const std::vector<uint8_t>& a, DType at, float sa, const std::vector<uint8_t>& b,
               DType bt, float sb, int64_t M, int64_t N, int64_t K, const std::vector<float>& c,
               double out_unit, std::vector<float>& ref, std::vector<double>& bound) {
    std::vector<float> fa(a.size()), fb(b.size()), aa(a.size()), ab(b.size());
    for (size_t i = 0; i < a.size(); ++i) aa[i] = std::fabs(fa[i] = decode(a[i], at));
    for (size_t i = 0; i < b.size(); ++i) ab[i] = std::fabs(fb[i] = decode(b[i], bt));
    ref.assign(size_t(M * N), 0.0f);
    std::vector<float> mag(size_t(M * N));
    cpu::sgemm(false, true, M, N, K, sa * sb, fa.data(), fb.data(), 0.0f, ref.data());
    cpu::sgemm(false, true, M, N, K, sa * sb, aa.data(), ab.data(), 0.0f, mag.data());
    bound.resize(ref.size());
    for (size_t i = 0; i < ref.size(); ++i) {
        double extra = 0;
        if (!c.empty()) {
            ref[i] += c[i];
            extra = out_unit * std::fabs(ref[i]) + std::ldexp(std::fabs(c[i]), -24);
        }
        bound[i] = out_unit * std::fabs(ref[i]) + (2.0 * double(K) * 0x1p-24 + 0x1p-13) * mag[i] +
                   extra + 1e-30;
    }
}

template <typename T>
void expect_within(const std::vector<T>& got, const std::vector<float>& ref,
                   const std::vector<double>& bound, const char* what) {
    ASSERT_EQ(got.size(), ref.size());
    int bad = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
        double g;
        if constexpr (std::is_same_v<T, bf16>)
            g = bf16_to_float(got[i]);
        else
            g = got[i];
        const double err = std::fabs(g - ref[i]);
        if (!(err <= bound[i]) && ++bad <= 5)
            ADD_FAILURE() << what << " element " << i << ": got " << g << " want " << ref[i]
                          << " (bound " << bound[i] << ")";
    }
    EXPECT_EQ(bad, 0) << what;
}

std::vector<float> widen(const std::vector<bf16>& v) {
    std::vector<float> f(v.size());
    for (size_t i = 0; i < v.size(); ++i) f[i] = bf16_to_float(v[i]);
    return f;
}

void check_linear(int64_t N, int64_t I, int64_t O, DType grad_dtype, bool with_bias,
                  bool with_residual, uint32_t seed) {
    SCOPED_TRACE(::testing::Message()
                 << "N " << N << " I " << I << " O " << O << " dy " << dtype_name(grad_dtype)
                 << " bias " << with_bias << " residual " << with_residual);
    CudaState state(0);
    const auto x = random_bf16(N * I, seed, 1.0f), w = random_bf16(O * I, seed + 1, 0.05f);
    const auto dy = random_bf16(N * O, seed + 2, 1e-3f), bias = random_bf16(O, seed + 3, 0.1f);
    const auto residual = random_bf16(N * O, seed + 4, 1.0f);
    const Dev dx_in = upload(x), dw_in = upload(w), ddy = upload(dy), dbias = upload(bias),
              dres = upload(residual);
    const Cast cx(dx_in, N, I, DType::kE4M3, state), cw(dw_in, O, I, DType::kE4M3, state),
        cdy(ddy, N, O, grad_dtype, state);

    // Forward: y = sx sw x w^T (+ bias) (+ residual).
    Dev y(size_t(N * O) * 2);
    cuda::fp8_linear_forward(y.as<bf16>(), cx.op(), cw.op(), with_bias ? dbias.as<bf16>() : nullptr,
                             with_residual ? dres.as<bf16>() : nullptr, N, I, O, state,
                             state.stream());
    std::vector<float> c;
    if (with_bias || with_residual) {
        c.assign(size_t(N * O), 0.0f);
        for (int64_t n = 0; n < N; ++n)
            for (int64_t o = 0; o < O; ++o)
                c[size_t(n * O + o)] =
                    (with_bias ? bf16_to_float(bias[size_t(o)]) : 0.0f) +
                    (with_residual ? bf16_to_float(residual[size_t(n * O + o)]) : 0.0f);
    }
    std::vector<float> ref;
    std::vector<double> bound;
    reference(cx.hq, DType::kE4M3, cx.scale_inv, cw.hq, DType::kE4M3, cw.scale_inv, N, O, I, c,
              0x1p-8, ref, bound);
    expect_within(download<bf16>(y.as<void>(), size_t(N * O)), ref, bound, "forward y");

    // Input gradient: dx = sdy sw dy (N, O) . wt (I, O)^T, then += the same again.
    Dev dx(size_t(N * I) * 2);
    cuda::fp8_linear_backward_input(dx.as<bf16>(), cdy.op(), cw.op_t(), N, I, O, false, state,
                                    state.stream());
    reference(cdy.hq, grad_dtype, cdy.scale_inv, cw.hqt, DType::kE4M3, cw.scale_inv, N, I, O, {},
              0x1p-8, ref, bound);
    const auto dx1 = download<bf16>(dx.as<void>(), size_t(N * I));
    expect_within(dx1, ref, bound, "input gradient dx");
    cuda::fp8_linear_backward_input(dx.as<bf16>(), cdy.op(), cw.op_t(), N, I, O, true, state,
                                    state.stream());
    reference(cdy.hq, grad_dtype, cdy.scale_inv, cw.hqt, DType::kE4M3, cw.scale_inv, N, I, O,
              widen(dx1), 0x1p-8, ref, bound);
    expect_within(download<bf16>(dx.as<void>(), size_t(N * I)), ref, bound, "dx +=");

    // Weight gradient: dweight (f32, starting from 0.25) += sdy sx dyt (O, N) . xt (I, N)^T.
    const std::vector<float> start(size_t(O * I), 0.25f);
    Dev dweight = upload(start);
    cuda::fp8_linear_backward_weight(dweight.as<float>(), cdy.op_t(), cx.op_t(), N, I, O, true,
                                     state, state.stream());
    reference(cdy.hqt, grad_dtype, cdy.scale_inv, cx.hqt, DType::kE4M3, cx.scale_inv, O, I, N,
              start, 0x1p-24, ref, bound);
    expect_within(download<float>(dweight.as<void>(), size_t(O * I)), ref, bound,
                  "weight gradient");
}

TEST(CudaFp8Linear, ForwardAndBothGradientsWithinTheDerivedBound) {
    check_linear(256, 512, 384, DType::kE5M2, true, false, 1);
    check_linear(256, 512, 384, DType::kE4M3, false, true, 11);
    check_linear(512, 1024, 256, DType::kE5M2, true, true, 21);
}

// The casts' transposed copies are the operands the backward GEMMs need: the input gradient
// through wt equals the one through w's codes read transposed on the CPU (checked above), and the
// codes of qt are q's transposed (here directly).
TEST(CudaFp8Linear, TransposedCopiesHoldTheSameCodes) {
    CudaState state(0);
    const int64_t R = 96, C = 160;
    const Dev x = upload(random_bf16(R * C, 5, 1.0f));
    const Cast c(x, R, C, DType::kE4M3, state);
    for (int64_t r = 0; r < R; ++r)
        for (int64_t k = 0; k < C; ++k)
            ASSERT_EQ(c.hqt[size_t(k * R + r)], c.hq[size_t(r * C + k)]);
}

// The linear ops with LinearSpec kFp8PerTensor against the same ops in BF16, within the error FP8
// quantization can make, derived per element of P = A (M, K) . B (N, K)^T: a quantized operand
// is within u |v| + h of v (u: the format's unit roundoff, 2^-4 for E4M3 and 2^-3 for E5M2; h:
// half its smallest subnormal step times the tensor's scale_inv), so
//   |P8 - P| <= sum_k (2u + u^2 ...) |a||b| + (1 + uB) hA sum|b| + (1 + uA) hB sum|a| + K hA hB
// (with each operand's own u and h), plus the accumulation terms of both GEMMs (fp32 orders and
// Hopper's FP8 accumulator, as above) and the output roundings of both (bf16: 2^-8 of each).
std::vector<double> fp8_vs_native_bound(const std::vector<float>& a, const std::vector<float>& b,
                                        int64_t M, int64_t N, int64_t K, double ua, double ha,
                                        double ub, double hb, double out_unit,
                                        const std::vector<float>& y8,
                                        const std::vector<float>& y16) {
    std::vector<float> aa(a.size()), ab(b.size()), s(size_t(M * N));
    for (size_t i = 0; i < a.size(); ++i) aa[i] = std::fabs(a[i]);
    for (size_t i = 0; i < b.size(); ++i) ab[i] = std::fabs(b[i]);
    cpu::sgemm(false, true, M, N, K, 1.0f, aa.data(), ab.data(), 0.0f, s.data());
    std::vector<double> ra(size_t(M), 0), rb(size_t(N), 0);
    for (int64_t m = 0; m < M; ++m)
        for (int64_t k = 0; k < K; ++k) ra[size_t(m)] += aa[size_t(m * K + k)];
    for (int64_t n = 0; n < N; ++n)
        for (int64_t k = 0; k < K; ++k) rb[size_t(n)] += ab[size_t(n * K + k)];
    const double quant = ua + ub + ua * ub;
    const double accum =
        (2.0 * double(K) * 0x1p-24 + 0x1p-13) * (1 + ua) * (1 + ub) + 2.0 * double(K) * 0x1p-24;
    std::vector<double> bound(s.size());
    for (int64_t m = 0; m < M; ++m)
        for (int64_t n = 0; n < N; ++n) {
            const size_t i = size_t(m * N + n);
            bound[i] = (quant + accum) * s[i] + (1 + ub) * ha * rb[size_t(n)] +
                       (1 + ua) * hb * ra[size_t(m)] + double(K) * ha * hb +
                       out_unit * (std::fabs(y8[i]) + std::fabs(y16[i])) + 1e-30;
        }
    return bound;
}

std::vector<float> transpose(const std::vector<float>& v, int64_t rows, int64_t cols) {
    std::vector<float> t(v.size());
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) t[size_t(c * rows + r)] = v[size_t(r * cols + c)];
    return t;
}

void expect_close(const std::vector<float>& got, const std::vector<float>& want,
                  const std::vector<double>& bound, const char* what) {
    int bad = 0;
    for (size_t i = 0; i < got.size(); ++i)
        if (!(std::fabs(double(got[i]) - want[i]) <= bound[i]) && ++bad <= 5)
            ADD_FAILURE() << what << " element " << i << ": fp8 " << got[i] << " bf16 " << want[i]
                          << " (bound " << bound[i] << ")";
    EXPECT_EQ(bad, 0) << what;
}

TEST(CudaFp8Linear, LinearOpsInFp8MatchBf16WithinTheQuantizationBound) {
    const int64_t N = 256, I = 512, O = 384;
    for (DType grad : {DType::kE5M2, DType::kE4M3}) {
        SCOPED_TRACE(dtype_name(grad));
        CudaState state(0);
        const Context ctx = state.context();
        const auto hx = random_bf16(N * I, 31, 1.0f), hw = random_bf16(O * I, 32, 0.05f);
        const auto hdy = random_bf16(N * O, 33, 1e-3f), hb = random_bf16(O, 34, 0.1f);
        const Dev x = upload(hx), w = upload(hw), dy = upload(hdy), bias = upload(hb);
        const std::vector<float> zeros_w(size_t(O * I), 0.0f), zeros_b(size_t(O), 0.0f);
        Dev y16(size_t(N * O) * 2), y8(size_t(N * O) * 2), dx16(size_t(N * I) * 2),
            dx8(size_t(N * I) * 2);
        Dev dw16 = upload(zeros_w), dw8 = upload(zeros_w), db16 = upload(zeros_b),
            db8 = upload(zeros_b);
        Dev wq(size_t(O * I)), wqt(size_t(O * I)), xq(size_t(N * I)), xqt(size_t(N * I)),
            dyq(size_t(N * O)), dyqt(size_t(N * O)), scalars(32 * 4);
        int64_t gemms = 0;
        Fp8LinearBuffers buf;
        buf.wq = wq.as<void>();
        buf.wqt = wqt.as<void>();
        buf.xq = xq.as<void>();
        buf.xqt = xqt.as<void>();
        buf.dyq = dyq.as<void>();
        buf.dyqt = dyqt.as<void>();
        buf.scalars = scalars.as<float>();
        buf.grad_dtype = grad;
        buf.gemm_count = &gemms;
        LinearSpec spec{LinearPrecision::kFp8PerTensor, "mlp_up", &buf};
        auto view = [](const Dev& d, DType t, Shape s) { return d.buf.view(t, s); };
        const auto vx = view(x, DType::kBF16, {N, I}), vw = view(w, DType::kBF16, {O, I});
        const auto vdy = view(dy, DType::kBF16, {N, O}), vb = view(bias, DType::kBF16, {O});
        linear_forward(view(y16, DType::kBF16, {N, O}), vx, vw, vb, ctx);
        linear_backward(view(dx16, DType::kBF16, {N, I}), view(dw16, DType::kF32, {O, I}),
                        view(db16, DType::kF32, {O}), vdy, vx, vw, GradMode::kOverwrite, ctx);
        linear_fp8_cast_weight(vw, ctx, spec);
        linear_forward(view(y8, DType::kBF16, {N, O}), vx, vw, vb, ctx, spec);
        linear_backward(view(dx8, DType::kBF16, {N, I}), view(dw8, DType::kF32, {O, I}),
                        view(db8, DType::kF32, {O}), vdy, vx, vw, GradMode::kOverwrite, ctx, spec);
        const auto sc = download<float>(scalars.as<void>(), 24);
        EXPECT_EQ(gemms, 3);  // forward, input gradient, weight gradient

        auto widen_dev = [](const Dev& d, size_t n) {
            const auto h = download<bf16>(d.as<void>(), n);
            std::vector<float> f(n);
            for (size_t i = 0; i < n; ++i) f[i] = bf16_to_float(h[i]);
            return f;
        };
        const auto fx = widen(hx), fw = widen(hw), fdy = widen(hdy);
        const double u4 = 1.0 / 16, h4 = 0x1p-10;
        const double ug = grad == DType::kE4M3 ? 1.0 / 16 : 1.0 / 8;
        const double hg = grad == DType::kE4M3 ? 0x1p-10 : 0x1p-17;
        // Forward: x (N, I) . w (O, I)^T, bf16 outputs; the bias adds the same bf16 to both.
        const auto a8 = widen_dev(y8, size_t(N * O)), a16 = widen_dev(y16, size_t(N * O));
        expect_close(
            a8, a16,
            fp8_vs_native_bound(fx, fw, N, O, I, u4, h4 * sc[4], u4, h4 * sc[12], 0x1p-8, a8, a16),
            "forward y");
        // Input gradient: dy (N, O) . (w^T) (I, O)^T.
        const auto d8 = widen_dev(dx8, size_t(N * I)), d16 = widen_dev(dx16, size_t(N * I));
        expect_close(d8, d16,
                     fp8_vs_native_bound(fdy, transpose(fw, O, I), N, I, O, ug, hg * sc[20], u4,
                                         h4 * sc[12], 0x1p-8, d8, d16),
                     "input gradient");
        // Weight gradient: dy^T (O, N) . x^T (I, N)^T, f32 outputs.
        const auto g8 = download<float>(dw8.as<void>(), size_t(O * I));
        const auto g16 = download<float>(dw16.as<void>(), size_t(O * I));
        expect_close(g8, g16,
                     fp8_vs_native_bound(transpose(fdy, N, O), transpose(fx, N, I), O, I, N, ug,
                                         hg * sc[20], u4, h4 * sc[4], 0x1p-24, g8, g16),
                     "weight gradient");
        // The bias gradient is the native op's own sum over the bf16 dy: the same bits.
        const auto b8 = download<float>(db8.as<void>(), size_t(O));
        const auto b16 = download<float>(db16.as<void>(), size_t(O));
        for (int64_t o = 0; o < O; ++o) ASSERT_EQ(b8[size_t(o)], b16[size_t(o)]) << o;
    }
}

// A CUDA call without its precision's buffers is refused: each stops naming the op and the
// role.
TEST(CudaFp8Linear, UnsupportedFp8CasesStopNamingTheRole) {
    GTEST_FLAG_SET(death_test_style, "threadsafe");
    CudaState state(0);
    const Context ctx = state.context();
    const Dev x(64 * 64 * 2), w(64 * 64 * 2), y(64 * 64 * 2);
    const auto vx = x.buf.view(DType::kBF16, {64, 64}), vw = w.buf.view(DType::kBF16, {64, 64});
    const auto vy = y.buf.view(DType::kBF16, {64, 64});
    EXPECT_DEATH(linear_forward(vy, vx, vw, ConstTensorView(), ctx,
                                LinearSpec{LinearPrecision::kFp8PerTensor, "qkv", nullptr}),
                 "fp8 linear fp8_per_tensor \\(qkv\\) on the cuda backend without its buffers");
    EXPECT_DEATH(linear_forward(vy, vx, vw, ConstTensorView(), ctx,
                                LinearSpec{LinearPrecision::kFp8Blockwise, "attn_out", nullptr}),
                 "fp8 linear fp8_blockwise \\(attn_out\\) on the cuda backend without its "
                 "buffers \\(LinearSpec::fp8_block\\)");
}

TEST(CudaFp8Linear, DeviceSupportAndSelfTest) {
    int major = 0, minor = 0;
    ASSERT_EQ(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0), cudaSuccess);
    ASSERT_EQ(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0), cudaSuccess);
    const std::string problem = cuda::fp8_support_problem(0);
    bool ok = false;
    const std::string line = cuda::fp8_self_test(0, ok);
    if (major * 10 + minor < 89) {
        EXPECT_NE(problem.find("no FP8 tensor cores"), std::string::npos) << problem;
        EXPECT_EQ(line.rfind("fp8: none", 0), 0u) << line;
        EXPECT_FALSE(ok);
        return;
    }
    EXPECT_TRUE(problem.empty()) << problem;
    EXPECT_TRUE(ok) << line;
    EXPECT_EQ(line.rfind("fp8: ok", 0), 0u) << line;
    std::cout << line << "\n";
}

}  // namespace
}  // namespace lathe
