// clang-format off
#include "ops/cuda/nvcc_compat.h"  // first: before any header that includes fmt
// clang-format on

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "ops/cuda/cuda_test_util.h"
#include "ops/cuda/gemv.h"
#include "ops/gelu.h"
#include "ops/linear.h"
#include "ops/residual.h"

namespace lathe {
namespace {

using namespace cudatest;

// The bound on one output y[m, n] against the CPU twin (f32), both fed the same bf16 values:
// every product x[m, k] w[n, k] of two bf16 (8 significant bits each) is exact in fp32; the CPU
// and the kernel each add the K products, the bias and the residual in fp32 in their own order,
// K + 1 roundings of at most 2^-24 of a partial sum each, so each is within
// (K + 1) 2^-24 S of the exact value, S = sum_k |x[m, k] w[n, k]| + |bias[n]| + |residual[m, n]|
// (first order; the worst case of every rounding falling the same way). The kernel then rounds
// its fp32 value to bf16 once: at most 2^-8 (kBf16Unit, half an ulp of 8 bits) of its magnitude.
//   |got - ref| <= kBf16Unit (|ref| + E) + E,   E = 2 (K + 1) 2^-24 S.
::testing::AssertionResult within_bound(const HostTensor& got, const HostTensor& ref,
                                        const HostTensor& x, const HostTensor& w,
                                        const HostTensor* bias, const HostTensor* residual,
                                        int64_t M, int64_t K, int64_t N) {
    const float *g = got.as<float>(), *r = ref.as<float>(), *xv = x.as<float>();
    const float* wv = w.as<float>();
    for (int64_t m = 0; m < M; ++m) {
        for (int64_t n = 0; n < N; ++n) {
            double s = 0.0;
            for (int64_t k = 0; k < K; ++k) s += std::fabs(double(xv[m * K + k]) * wv[n * K + k]);
            if (bias != nullptr) s += std::fabs(double(bias->as<float>()[n]));
            if (residual != nullptr) s += std::fabs(double(residual->as<float>()[m * N + n]));
            const double e = 2.0 * double(K + 1) * std::ldexp(1.0, -24) * s;
            const double ref_mn = r[m * N + n], got_mn = g[m * N + n];
            const double allowed = kBf16Unit * (std::fabs(ref_mn) + e) + e;
            if (!std::isfinite(got_mn) || std::fabs(got_mn - ref_mn) > allowed) {
                return ::testing::AssertionFailure()
                       << "y[" << m << ", " << n << "] = " << got_mn << ", reference " << ref_mn
                       << ", allowed difference " << allowed;
            }
        }
    }
    return ::testing::AssertionSuccess();
}

struct GemvCase {
    int64_t M, K, N;
    bool bias, residual;
};

// The kernel against the CPU linear (+ residual), then a second run for the same bits.
void check_gemv(const GemvCase& c, uint64_t seed) {
    SCOPED_TRACE(::testing::Message() << "M=" << c.M << " K=" << c.K << " N=" << c.N
                                      << " bias=" << c.bias << " residual=" << c.residual);
    CudaState state(0);
    const Context cpu = cpu_context();
    optest::Rng rng(seed);
    const HostTensor x = random_bf16_values(rng, {c.M, c.K});
    const HostTensor w = random_bf16_values(rng, {c.N, c.K}, -0.2f, 0.2f);
    const HostTensor b = c.bias ? random_bf16_values(rng, {c.N}) : HostTensor();
    const HostTensor res = c.residual ? random_bf16_values(rng, {c.M, c.N}) : HostTensor();

    HostTensor ref(DType::kF32, {c.M, c.N});
    linear_forward(ref.view(), x.view(), w.view(), c.bias ? b.view() : ConstTensorView(), cpu);
    if (c.residual) residual_forward(ref.view(), ref.view(), res.view(), cpu);

    DeviceTensor dx = upload(x, DType::kBF16, state), dw = upload(w, DType::kBF16, state);
    DeviceTensor db = c.bias ? upload(b, DType::kBF16, state) : DeviceTensor{};
    DeviceTensor dres = c.residual ? upload(res, DType::kBF16, state) : DeviceTensor{};
    DeviceTensor y = device_tensor(DType::kBF16, {c.M, c.N}, state);
    ASSERT_TRUE(cuda::gemv_supports(c.M, c.K, c.N, dx.view.data(), dw.view.data()));
    auto run = [&](const DeviceTensor& out) {
        cuda::gemv_forward(out.view.as<bf16>(), dx.view.as<bf16>(), dw.view.as<bf16>(),
                           c.bias ? db.view.as<bf16>() : nullptr,
                           c.residual ? dres.view.as<bf16>() : nullptr, c.M, c.K, c.N,
                           state.stream());
    };
    run(y);
    EXPECT_TRUE(within_bound(download_f32(y.view, state), ref, x, w, c.bias ? &b : nullptr,
                             c.residual ? &res : nullptr, c.M, c.K, c.N));
    DeviceTensor y2 = device_tensor(DType::kBF16, {c.M, c.N}, state);
    run(y2);
    EXPECT_TRUE(bitwise_equal(download_raw(y2.view, state), download_raw(y.view, state)));
}

// Every row count the kernel's register arrays are sized for (1, 2, 4, 8, 16) and counts
// between them; N not a multiple of the block's 4 weight rows; K of one chunk, of a tail that
// leaves some threads without a chunk, and of the MLP down projection's length.
TEST(CudaGemv, MatchesCpuAcrossRowCounts) {
    uint64_t seed = 100;
    for (int64_t M : {1, 2, 3, 4, 5, 8, 11, 16}) {
        check_gemv({M, 1024, 300, false, false}, ++seed);
        check_gemv({M, 2056, 77, true, false}, ++seed);
    }
}

TEST(CudaGemv, MatchesCpuOnEdgeShapes) {
    check_gemv({1, 8, 5, true, true}, 201);        // one 16-byte chunk per row, one partial block
    check_gemv({3, 72, 1, false, false}, 202);     // one output column
    check_gemv({16, 14336, 64, true, true}, 203);  // the Llama-3-8B down projection's K
    check_gemv({7, 4096, 1027, false, true}, 204);
}

// In place: residual and y the same buffer (gemv.h allows it).
TEST(CudaGemv, ResidualInPlace) {
    const int64_t M = 4, K = 512, N = 96;
    CudaState state(0);
    const Context cpu = cpu_context();
    optest::Rng rng(301);
    const HostTensor x = random_bf16_values(rng, {M, K});
    const HostTensor w = random_bf16_values(rng, {N, K}, -0.2f, 0.2f);
    const HostTensor res = random_bf16_values(rng, {M, N});
    HostTensor ref(DType::kF32, {M, N});
    linear_forward(ref.view(), x.view(), w.view(), ConstTensorView(), cpu);
    residual_forward(ref.view(), ref.view(), res.view(), cpu);
    DeviceTensor dx = upload(x, DType::kBF16, state), dw = upload(w, DType::kBF16, state);
    DeviceTensor y = upload(res, DType::kBF16, state);
    cuda::gemv_forward(y.view.as<bf16>(), dx.view.as<bf16>(), dw.view.as<bf16>(), nullptr,
                       y.view.as<bf16>(), M, K, N, state.stream());
    EXPECT_TRUE(within_bound(download_f32(y.view, state), ref, x, w, nullptr, &res, M, K, N));
}

// Through the linear ops with LinearSpec::skinny_gemv: where the kernel applies (2 rows) the
// ops give its bits (the direct call's) within the bound of the CPU twin; where it does not (17
// rows; K = 36, not whole chunks) cuBLASLt runs, within kBf16Sum as in linear_test.cu.
TEST(CudaGemv, LinearOpsWithSkinnyGemvMatchCpu) {
    CudaState state(0);
    const Context gpu = state.context(), cpu = cpu_context();
    LinearSpec spec;
    spec.skinny_gemv = true;
    uint64_t seed = 400;
    struct Dims {
        int64_t M, K, N;
    };
    for (const Dims s : {Dims{2, 256, 40}, Dims{17, 256, 40}, Dims{3, 36, 20}}) {
        SCOPED_TRACE(::testing::Message() << "M=" << s.M << " K=" << s.K << " N=" << s.N);
        optest::Rng rng(++seed);
        const HostTensor x = random_bf16_values(rng, {s.M, s.K});
        const HostTensor w = random_bf16_values(rng, {s.N, s.K}, -0.2f, 0.2f);
        const HostTensor b = random_bf16_values(rng, {s.N});
        const HostTensor res = random_bf16_values(rng, {s.M, s.N});
        HostTensor ref(DType::kF32, {s.M, s.N}), ref_res(DType::kF32, {s.M, s.N});
        linear_forward(ref.view(), x.view(), w.view(), b.view(), cpu);
        residual_forward(ref_res.view(), ref.view(), res.view(), cpu);
        DeviceTensor dx = upload(x, DType::kBF16, state), dw = upload(w, DType::kBF16, state);
        DeviceTensor db = upload(b, DType::kBF16, state);
        DeviceTensor dres = upload(res, DType::kBF16, state);
        DeviceTensor y = device_tensor(DType::kBF16, {s.M, s.N}, state);
        DeviceTensor yr = device_tensor(DType::kBF16, {s.M, s.N}, state);
        linear_forward(y.view, dx.view, dw.view, db.view, gpu, spec);
        linear_residual_forward(yr.view, dx.view, dw.view, db.view, dres.view, gpu, spec);
        const HostTensor got = download_f32(y.view, state), got_res = download_f32(yr.view, state);
        if (!cuda::gemv_supports(s.M, s.K, s.N, dx.view.data(), dw.view.data())) {
            EXPECT_TRUE(matches(got, ref, kBf16Sum));
            EXPECT_TRUE(matches(got_res, ref_res, kBf16Sum));
            continue;
        }
        EXPECT_TRUE(within_bound(got, ref, x, w, &b, nullptr, s.M, s.K, s.N));
        EXPECT_TRUE(within_bound(got_res, ref_res, x, w, &b, &res, s.M, s.K, s.N));
        DeviceTensor direct = device_tensor(DType::kBF16, {s.M, s.N}, state);
        DeviceTensor direct_res = device_tensor(DType::kBF16, {s.M, s.N}, state);
        cuda::gemv_forward(direct.view.as<bf16>(), dx.view.as<bf16>(), dw.view.as<bf16>(),
                           db.view.as<bf16>(), nullptr, s.M, s.K, s.N, state.stream());
        cuda::gemv_forward(direct_res.view.as<bf16>(), dx.view.as<bf16>(), dw.view.as<bf16>(),
                           db.view.as<bf16>(), dres.view.as<bf16>(), s.M, s.K, s.N, state.stream());
        EXPECT_TRUE(bitwise_equal(download_raw(y.view, state), download_raw(direct.view, state)));
        EXPECT_TRUE(
            bitwise_equal(download_raw(yr.view, state), download_raw(direct_res.view, state)));
    }
}

// linear_gelu_forward with LinearSpec::skinny_gemv (both GELU forms): pre is the kernel's, within
// the bound of the CPU twin; act is the GELU kernel on that bf16 pre: against the CPU's GELU of
// its own f32 pre, one rounding of pre (u, times |gelu'| <= 1.13) and one of act, kBf16Derived.
TEST(CudaGemv, LinearGeluWithSkinnyGemvMatchesCpu) {
    const int64_t M = 3, K = 512, N = 72;
    CudaState state(0);
    const Context gpu = state.context(), cpu = cpu_context();
    LinearSpec spec;
    spec.skinny_gemv = true;
    for (const GeluKind kind : {GeluKind::kErf, GeluKind::kTanh}) {
        optest::Rng rng(kind == GeluKind::kErf ? 501 : 502);
        const HostTensor x = random_bf16_values(rng, {M, K});
        const HostTensor w = random_bf16_values(rng, {N, K}, -0.2f, 0.2f);
        const HostTensor b = random_bf16_values(rng, {N});
        HostTensor pre_ref(DType::kF32, {M, N}), act_ref(DType::kF32, {M, N});
        linear_gelu_forward(act_ref.view(), pre_ref.view(), x.view(), w.view(), b.view(), kind,
                            cpu);
        DeviceTensor dx = upload(x, DType::kBF16, state), dw = upload(w, DType::kBF16, state);
        DeviceTensor db = upload(b, DType::kBF16, state);
        DeviceTensor pre = device_tensor(DType::kBF16, {M, N}, state);
        DeviceTensor act = device_tensor(DType::kBF16, {M, N}, state);
        linear_gelu_forward(act.view, pre.view, dx.view, dw.view, db.view, kind, gpu, spec);
        EXPECT_TRUE(
            within_bound(download_f32(pre.view, state), pre_ref, x, w, &b, nullptr, M, K, N));
        EXPECT_TRUE(matches(download_f32(act.view, state), act_ref, kBf16Derived));
    }
}

}  // namespace
}  // namespace lathe
