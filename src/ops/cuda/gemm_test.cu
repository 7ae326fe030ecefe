// clang-format off
#include "ops/cuda/nvcc_compat.h"  // first: before any header that includes fmt
// clang-format on

// The CUDA GEMM through its description (ops/gemm_args.h) against the CPU's gemm, the reference,
// run on the same values: the CPU computes in f32 with an f32 D, so each comparison sees the GPU's
// fp32 accumulation order and its one rounding into D. And the combinations outside the CUDA
// list (ops/cuda/gemm.h) stop naming themselves.

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "ops/cpu/gemm.h"
#include "ops/cuda/cuda_test_util.h"
#include "ops/cuda/gemm.h"

namespace lathe {
namespace {

using namespace cudatest;

// The values a `dtype` tensor made from `host` holds, as f32.
HostTensor round_to(const HostTensor& host, DType dtype) {
    HostTensor narrow(dtype, host.shape()), wide(DType::kF32, host.shape());
    tensor_convert(narrow.view(), host.view());
    tensor_convert(wide.view(), narrow.view());
    return wide;
}

// `g` with every operand and output pointing at host f32 tensors (values already those of the
// device dtypes): the CPU reference of the same problem.
GemmArgs on_host(GemmArgs g, const HostTensor& a, const HostTensor& b, HostTensor& d) {
    g.A = a.view().data(), g.a_dtype = DType::kF32;
    g.B = b.view().data(), g.b_dtype = DType::kF32;
    g.D = d.view().data(), g.d_dtype = DType::kF32;
    return g;
}

// bf16 operands, every transpose, padded row strides, three strided batches, alpha and beta
// (D accumulates): a bf16 D is the reference's sum rounded once (kBf16Sum), an f32 D the same sum
// in another order (kF32Sum). The padding between D's rows keeps its values.
TEST(CudaGemm, Bf16ThroughArgsMatchesCpuReference) {
    CudaState state(0);
    optest::Rng rng(61);
    const int64_t M = 40, N = 24, K = 72, batches = 3;
    for (DType d_dtype : {DType::kBF16, DType::kF32}) {
        for (bool ta : {false, true}) {
            for (bool tb : {false, true}) {
                SCOPED_TRACE(::testing::Message() << "D " << dtype_name(d_dtype) << " trans_a "
                                                  << ta << " trans_b " << tb);
                const int64_t lda = (ta ? M : K) + 8, ldb = (tb ? K : N) + 8, ldd = N + 8;
                const int64_t sa = (ta ? K : M) * lda, sb = (tb ? N : K) * ldb, sd = M * ldd;
                const HostTensor a = random_bf16_values(rng, {batches * sa});
                const HostTensor b = random_bf16_values(rng, {batches * sb});
                const HostTensor d0 = random_bf16_values(rng, {batches * sd});
                GemmArgs g;
                g.M = M, g.N = N, g.K = K;
                g.lda = lda, g.trans_a = ta, g.ldb = ldb, g.trans_b = tb, g.ldd = ldd;
                g.alpha = 0.5f, g.beta = 1.0f;
                g.batch_count = batches;
                g.batch_stride_a = sa, g.batch_stride_b = sb, g.batch_stride_d = sd;

                HostTensor ref = optest::copy_tensor(d0.view());
                cpu::gemm(on_host(g, a, b, ref));

                DeviceTensor ga = upload(a, DType::kBF16, state),
                             gb = upload(b, DType::kBF16, state);
                DeviceTensor gd = upload(d0, d_dtype, state);
                g.A = ga.view.data(), g.a_dtype = DType::kBF16;
                g.B = gb.view.data(), g.b_dtype = DType::kBF16;
                g.D = gd.view.data(), g.d_dtype = d_dtype;
                cuda::gemm(state, state.stream(), g);
                EXPECT_TRUE(matches(download_f32(gd.view, state), ref,
                                    d_dtype == DType::kBF16 ? kBf16Sum : kF32Sum));
            }
        }
    }
}

// The epilogues the linear ops use, on a bf16 D: the bias, and the tanh GELU keeping its input
// as aux, against the reference's f32 D and aux.
TEST(CudaGemm, EpiloguesMatchCpuReference) {
    CudaState state(0);
    optest::Rng rng(62);
    const int64_t M = 64, N = 128, K = 96;
    const HostTensor x = random_bf16_values(rng, {M, K});
    const HostTensor w = random_bf16_values(rng, {N, K}, -0.2f, 0.2f);
    const HostTensor bias = random_bf16_values(rng, {N});
    for (GemmEpilogue e : {GemmEpilogue::kBias, GemmEpilogue::kGeluAuxBias}) {
        SCOPED_TRACE(gemm_epilogue_name(e));
        const bool gelu = gemm_epilogue_has_gelu(e);
        GemmArgs g;
        g.M = M, g.N = N, g.K = K;
        g.lda = K, g.ldb = K, g.trans_b = true, g.ldd = N;
        g.epilogue = e, g.bias_dtype = DType::kF32, g.bias = bias.view().data();
        HostTensor ref(DType::kF32, {M, N}), aux_ref(DType::kF32, {M, N});
        GemmArgs h = on_host(g, x, w, ref);
        if (gelu) h.aux = aux_ref.view().data(), h.ldaux = N;
        cpu::gemm(h);

        DeviceTensor gx = upload(x, DType::kBF16, state), gw = upload(w, DType::kBF16, state);
        DeviceTensor gbias = upload(bias, DType::kBF16, state);
        DeviceTensor gd = device_tensor(DType::kBF16, {M, N}, state);
        DeviceTensor gaux = device_tensor(DType::kBF16, {M, N}, state);
        g.A = gx.view.data(), g.B = gw.view.data(), g.D = gd.view.data();
        g.bias = gbias.view.data(), g.bias_dtype = DType::kBF16;
        if (gelu) g.aux = gaux.view.data(), g.ldaux = N;
        ASSERT_TRUE(cuda::gemm_try(state, state.stream(), g));
        if (!gelu) {
            EXPECT_TRUE(matches(download_f32(gd.view, state), ref, kBf16Sum));
            continue;
        }
        EXPECT_TRUE(matches(download_f32(gaux.view, state), aux_ref, kBf16Sum)) << "aux";
        // cuBLASLt's GELU (fp32) of its fp32 sum against the reference's fp64 GELU, then D's
        // rounding: the bound of the fused GELU in CudaLinearGelu.
        EXPECT_TRUE(matches(download_f32(gd.view, state), ref, kBf16Derived)) << "gelu";
    }
}

// The algorithm search (gemm.h) keeps the heuristic's bits: a state that searches and one that
// does not run the same problems from the same operands, twice each (the second launch takes the
// cached choice), and their D (and aux) are the same bytes. The problems: a layer's forward (bf16
// D), a weight gradient accumulating in place into an f32 D at a long K (where cuBLASLt offers
// split-K candidates with other bits), the GELU epilogue with its aux, and a bf16 D accumulating
// onto another C (the residual).
TEST(CudaGemm, SearchKeepsTheHeuristicsBits) {
    CudaState on(0), off(0);
    off.set_gemm_search(false);
    ASSERT_TRUE(on.gemm_search());
    optest::Rng rng(64);
    struct Problem {
        const char* name;
        int64_t M, N, K;
        bool trans_a, trans_b;
        DType d_dtype;
        float beta;
        bool separate_c, gelu;
    };
    const Problem problems[] = {
        {"forward", 512, 1024, 768, false, true, DType::kBF16, 0.0f, false, false},
        {"weight gradient", 768, 768, 32768, true, false, DType::kF32, 1.0f, false, false},
        {"gelu", 1024, 3072, 768, false, true, DType::kBF16, 0.0f, false, true},
        {"residual", 1024, 768, 3072, false, true, DType::kBF16, 1.0f, true, false},
    };
    for (const Problem& p : problems) {
        SCOPED_TRACE(p.name);
        const HostTensor a = random_bf16_values(rng, {p.M * p.K});
        const HostTensor b = random_bf16_values(rng, {p.K * p.N}, -0.2f, 0.2f);
        const HostTensor d0 = random_bf16_values(rng, {p.M * p.N});
        const HostTensor c0 = random_bf16_values(rng, {p.M * p.N});
        const HostTensor bias = random_bf16_values(rng, {p.N});
        HostTensor out[2], aux[2];
        for (int s = 0; s < 2; ++s) {
            CudaState& state = s == 0 ? on : off;
            DeviceTensor ga = upload(a, DType::kBF16, state), gb = upload(b, DType::kBF16, state);
            DeviceTensor gd = upload(d0, p.d_dtype, state), gc = upload(c0, p.d_dtype, state);
            DeviceTensor gbias = upload(bias, DType::kBF16, state);
            DeviceTensor gaux = device_tensor(DType::kBF16, {p.M, p.N}, state);
            GemmArgs g;
            g.M = p.M, g.N = p.N, g.K = p.K;
            g.trans_a = p.trans_a, g.trans_b = p.trans_b;
            g.lda = p.trans_a ? p.M : p.K, g.ldb = p.trans_b ? p.K : p.N, g.ldd = p.N;
            g.A = ga.view.data(), g.a_dtype = DType::kBF16;
            g.B = gb.view.data(), g.b_dtype = DType::kBF16;
            g.D = gd.view.data(), g.d_dtype = p.d_dtype;
            g.beta = p.beta;
            if (p.separate_c) g.C = gc.view.data(), g.c_dtype = p.d_dtype, g.ldc = p.N;
            if (p.gelu) {
                g.epilogue = GemmEpilogue::kGeluAuxBias;
                g.bias = gbias.view.data(), g.bias_dtype = DType::kBF16;
                g.aux = gaux.view.data(), g.ldaux = p.N;
            }
            for (int launch = 0; launch < 2; ++launch)
                ASSERT_TRUE(cuda::gemm_try(state, state.stream(), g));
            out[s] = download_raw(gd.view, state);
            if (p.gelu) aux[s] = download_raw(gaux.view, state);
        }
        EXPECT_TRUE(bitwise_equal(out[0], out[1])) << "D";
        if (p.gelu) EXPECT_TRUE(bitwise_equal(aux[0], aux[1])) << "aux";
    }
    // The searching state searched (cuBLASLt offers several candidates at these shapes); the
    // other asked for the heuristic's first only.
    EXPECT_GE(on.gemm_search_counts().searched, 1);
    EXPECT_EQ(off.gemm_search_counts().searched, 0);
}

// f32 operands: a plain fp32 GEMM (no TF32) on sizes that are not multiples of anything.
TEST(CudaGemm, F32OperandsMatchCpuReference) {
    CudaState state(0);
    optest::Rng rng(63);
    const int64_t M = 33, N = 17, K = 50;
    const HostTensor a = optest::random_tensor(rng, {K, M}), b = optest::random_tensor(rng, {N, K});
    GemmArgs g;
    g.M = M, g.N = N, g.K = K;
    g.lda = M, g.trans_a = true, g.ldb = K, g.trans_b = true, g.ldd = N;
    HostTensor ref(DType::kF32, {M, N});
    cpu::gemm(on_host(g, a, b, ref));
    DeviceTensor ga = upload(a, DType::kF32, state), gb = upload(b, DType::kF32, state);
    DeviceTensor gd = device_tensor(DType::kF32, {M, N}, state);
    g.A = ga.view.data(), g.a_dtype = DType::kF32;
    g.B = gb.view.data(), g.b_dtype = DType::kF32;
    g.D = gd.view.data(), g.d_dtype = DType::kF32;
    cuda::gemm(state, state.stream(), g);
    EXPECT_TRUE(matches(download_f32(gd.view, state), ref, kF32Sum));
}

// fp8 E4M3 operands in cuBLASLt's TN layout with per-tensor scales: into a bf16 D, and into an
// e4m3 D with its scale and the amax of the unscaled result. Hopper's fp8 tensor cores keep at
// least 13 bits of the sum between cuBLASLt's fp32 promotions (fast accumulation is off), far
// below the bf16 rounding of D (kBf16Sum). An e4m3 D is one rounding to 3 mantissa bits: 2^-4
// relative, twice that for an fp32 difference tipping it, and the same of the scale for values
// near zero. The amax is an fp32 maximum of the same sums: within one bf16 unit of the reference.
// The operands both fp8 tests share: A (M, K) and B (N, K) rounded to e4m3, the scales of A, B
// and D on the host and on the device, each in its own allocation (256-byte aligned), as a
// caller's per-tensor scales are.
struct Fp8Case {
    static constexpr int64_t M = 64, N = 32, K = 128;
    CudaState state{0};
    HostTensor a, b, scales{DType::kF32, {3}};
    DeviceTensor ga, gb;
    std::vector<DeviceTensor> gs;
    const float* dev_s[3] = {};
    GemmArgs g;

    Fp8Case() {
        optest::Rng rng(64);
        a = round_to(optest::random_tensor(rng, {M, K}, -2.0f, 2.0f), DType::kE4M3);
        b = round_to(optest::random_tensor(rng, {N, K}, -2.0f, 2.0f), DType::kE4M3);
        float* s = scales.as<float>();
        s[0] = 0.5f, s[1] = 2.0f, s[2] = 4.0f;  // a, b, d
        ga = upload(a, DType::kE4M3, state), gb = upload(b, DType::kE4M3, state);
        HostTensor one(DType::kF32, {1});
        for (int i = 0; i < 3; ++i) {
            one.as<float>()[0] = s[i];
            gs.push_back(upload(one, DType::kF32, state));
            dev_s[i] = gs.back().view.as<float>();
        }
        g.M = M, g.N = N, g.K = K;
        g.lda = K, g.ldb = K, g.trans_b = true, g.ldd = N;
    }
    const float* host_scale(int i) const { return scales.as<float>() + i; }
    // g pointed at the device operands (fp8) and D.
    void on_device(void* d, DType d_dtype) {
        g.A = ga.view.data(), g.a_dtype = DType::kE4M3;
        g.B = gb.view.data(), g.b_dtype = DType::kE4M3;
        g.D = d, g.d_dtype = d_dtype;
    }
};

TEST(CudaGemm, Fp8PerTensorIntoBf16MatchesCpuReference) {
    Fp8Case c;
    const int64_t M = c.M, N = c.N;
    CudaState& state = c.state;
    GemmArgs& g = c.g;
    g.a_scale = c.host_scale(0), g.b_scale = c.host_scale(1);
    HostTensor ref(DType::kF32, {M, N});
    cpu::gemm(on_host(g, c.a, c.b, ref));
    DeviceTensor gd = device_tensor(DType::kBF16, {M, N}, state);
    c.on_device(gd.view.data(), DType::kBF16);
    g.a_scale = c.dev_s[0], g.b_scale = c.dev_s[1];
    cuda::gemm(state, state.stream(), g);
    EXPECT_TRUE(matches(download_f32(gd.view, state), ref, kBf16Sum)) << "bf16 D";
}

TEST(CudaGemm, Fp8PerTensorIntoFp8MatchesCpuReference) {
    Fp8Case c;
    const int64_t M = c.M, N = c.N;
    CudaState& state = c.state;
    GemmArgs& g = c.g;
    // e4m3 D: the reference is d_scale times the f32 result; amax is of the unscaled one.
    float amax_ref = 0.0f;
    g.a_scale = c.host_scale(0), g.b_scale = c.host_scale(1), g.d_scale = c.host_scale(2);
    g.d_amax = &amax_ref;
    HostTensor ref8(DType::kF32, {M, N});
    cpu::gemm(on_host(g, c.a, c.b, ref8));
    DeviceTensor gd8 = device_tensor(DType::kE4M3, {M, N}, state);
    DeviceTensor gamax = device_tensor(DType::kF32, {1}, state);
    c.on_device(gd8.view.data(), DType::kE4M3);
    g.a_scale = c.dev_s[0], g.b_scale = c.dev_s[1], g.d_scale = c.dev_s[2];
    g.d_amax = gamax.view.as<float>();
    cuda::gemm(state, state.stream(), g);
    constexpr double kE4M3Unit = 1.0 / 16;
    EXPECT_TRUE(matches(download_f32(gd8.view, state), ref8,
                        Tolerance{2 * kE4M3Unit, 2 * kE4M3Unit, 2 * kE4M3Unit}))
        << "e4m3 D";
    const float amax = download_f32(gamax.view, state).as<float>()[0];
    EXPECT_NEAR(amax, amax_ref, kBf16Unit * amax_ref);
}

// Combinations outside the CUDA list stop before cuBLASLt is asked, naming the combination.
TEST(CudaGemm, RefusesUnsupportedCombinations) {
    GTEST_FLAG_SET(death_test_style, "threadsafe");
    auto run = [](auto edit) {
        CudaState state(0);
        DeviceTensor a = device_tensor(DType::kBF16, {64, 64}, state);
        DeviceTensor b = device_tensor(DType::kBF16, {64, 64}, state);
        DeviceTensor d = device_tensor(DType::kF32, {64, 64}, state);
        GemmArgs g;
        g.M = 16, g.N = 16, g.K = 16;
        g.A = a.view.data(), g.lda = 16, g.B = b.view.data(), g.ldb = 16, g.trans_b = true;
        g.D = d.view.data(), g.ldd = 16;
        edit(g, d.view.as<float>());
        cuda::gemm(state, state.stream(), g);
    };
    EXPECT_DEATH(run([](GemmArgs& g, float* f) { g.a_scale = f; }),
                 "cuda gemm: no kernel for M=16 N=16 K=16 A bf16 .*scales a.*: scale or amax "
                 "pointers without fp8 A and B");
    EXPECT_DEATH(run([](GemmArgs& g, float*) { g.b_dtype = DType::kF32; }),
                 "no kernel for .*A bf16 .* x B f32.*: A and B of these dtypes");
    EXPECT_DEATH(run([](GemmArgs& g, float*) { g.a_dtype = g.b_dtype = DType::kE5M2; }),
                 "no kernel for .*: e5m2 times e5m2");
    EXPECT_DEATH(run([](GemmArgs& g, float* f) {
                     g.a_dtype = g.b_dtype = DType::kE4M3;
                     g.a_scale = f, g.b_scale = f + 1;
                 }),
                 "no kernel for .*: scale and amax pointers must be 16-byte aligned");
    EXPECT_DEATH(run([](GemmArgs& g, float*) {
                     g.a_dtype = g.b_dtype = DType::kE4M3;
                     g.trans_a = true;
                 }),
                 "no kernel for .*: fp8 takes A stored");
    EXPECT_DEATH(run([](GemmArgs& g, float*) {
                     g.a_dtype = g.b_dtype = DType::kE4M3;
                     g.d_dtype = DType::kBF16;
                     g.epilogue = GemmEpilogue::kGeluAux, g.aux = g.D, g.ldaux = 16;
                 }),
                 "no kernel for .*epilogue gelu_aux.*: a GELU epilogue on an fp8 product");
}

}  // namespace
}  // namespace lathe
