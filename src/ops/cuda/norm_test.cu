// clang-format off
#include "ops/cuda/nvcc_compat.h"  // first: before any header that includes fmt
// clang-format on

#include <gtest/gtest.h>

#include <bit>
#include <vector>

#include "ops/cpu/fp8_cast.h"
#include "ops/cuda/cuda_test_util.h"
#include "ops/layernorm.h"
#include "ops/residual.h"
#include "ops/rmsnorm.h"

// RMSNorm and LayerNorm, CUDA against the CPU twin. C = 768 takes the 16-byte path, C = 100 the
// scalar one; N = 300 rows give several dweight row chunks, N = 4100 many (column_reduce.h: 129
// chunks of 32 rows in the fused plan, 65 of 64 in the two-kernel one, the last chunk short),
// C = 2000 a partial 256-column tile.
// The forward has two layouts (row_block_plan in kernel_util.cuh): up to 512 rows a block per row
// (N = 300, 37, 16, 8, 5: one vector a thread; C = 16384 and the scalar C = 2002: two), more rows
// a warp per row (N = 600, 1000, 1030, 4100), and so do rows too wide for the block (the scalar
// C = 3001 at N = 3).
// C % 8 == 0 and C <= 2048 take the fused backward (dx and the parameter partials in one kernel;
// C = 768: 3 column groups, 1536: 6, 2000 and 2048: 8); wider rows (4096, 8192) and C % 8 != 0
// the dx kernel followed by the partials kernel.

namespace lathe {
namespace {

using namespace cudatest;

constexpr float kEps = 1e-5f;

void check_rmsnorm(int64_t N, int64_t C, uint64_t seed) {
    SCOPED_TRACE(::testing::Message() << "N=" << N << " C=" << C);
    CudaState state(0);
    const Context gpu = state.context(), cpu = cpu_context();
    optest::Rng rng(seed);
    const HostTensor x = random_bf16_values(rng, {N, C}, -2.0f, 2.0f);
    const HostTensor w = random_bf16_values(rng, {C}, 0.5f, 1.5f);
    const HostTensor dy = random_bf16_values(rng, {N, C});
    const HostTensor dx0 = random_bf16_values(rng, {N, C});
    const HostTensor dw0 = optest::random_tensor(rng, {C});

    HostTensor y_ref(DType::kF32, {N, C}), rstd_ref(DType::kF32, {N});
    rmsnorm_forward(y_ref.view(), rstd_ref.view(), x.view(), w.view(), kEps, cpu);
    HostTensor dx_ref(DType::kF32, {N, C});
    HostTensor dx_acc_ref = optest::copy_tensor(dx0.view());
    HostTensor dw_ref = optest::copy_tensor(dw0.view());
    rmsnorm_backward(dx_ref.view(), dw_ref.view(), dy.view(), x.view(), w.view(), rstd_ref.view(),
                     GradMode::kOverwrite, cpu);
    rmsnorm_backward(dx_acc_ref.view(), TensorView(), dy.view(), x.view(), w.view(),
                     rstd_ref.view(), GradMode::kAccumulate, cpu);

    DeviceTensor gx = upload(x, DType::kBF16, state), gw = upload(w, DType::kBF16, state);
    DeviceTensor gdy = upload(dy, DType::kBF16, state);
    DeviceTensor y = device_tensor(DType::kBF16, {N, C}, state);
    DeviceTensor rstd = device_tensor(DType::kF32, {N}, state);
    rmsnorm_forward(y.view, rstd.view, gx.view, gw.view, kEps, gpu);
    EXPECT_TRUE(matches(download_f32(y.view, state), y_ref, kBf16Rounded));
    const HostTensor rstd_gpu = download_f32(rstd.view, state);
    EXPECT_TRUE(matches(rstd_gpu, rstd_ref, kF32Sum));

    DeviceTensor dx = device_tensor(DType::kBF16, {N, C}, state);
    DeviceTensor dx_acc = upload(dx0, DType::kBF16, state);
    DeviceTensor dw = upload(dw0, DType::kF32, state);
    rmsnorm_backward(dx.view, dw.view, gdy.view, gx.view, gw.view, rstd.view, GradMode::kOverwrite,
                     gpu);
    rmsnorm_backward(dx_acc.view, TensorView(), gdy.view, gx.view, gw.view, rstd.view,
                     GradMode::kAccumulate, gpu);
    EXPECT_TRUE(matches(download_f32(dx.view, state), dx_ref, kBf16Sum));
    EXPECT_TRUE(matches(download_f32(dx_acc.view, state), dx_acc_ref, kBf16Sum));
    EXPECT_TRUE(matches(download_f32(dw.view, state), dw_ref, kF32Sum));

    DeviceTensor dw2 = upload(dw0, DType::kF32, state);
    DeviceTensor dx2 = device_tensor(DType::kBF16, {N, C}, state);
    rmsnorm_backward(dx2.view, dw2.view, gdy.view, gx.view, gw.view, rstd.view,
                     GradMode::kOverwrite, gpu);
    EXPECT_TRUE(bitwise_equal(download_raw(dw2.view, state), download_raw(dw.view, state)));
    EXPECT_TRUE(bitwise_equal(download_raw(dx2.view, state), download_raw(dx.view, state)));
}

void check_layernorm(int64_t N, int64_t C, uint64_t seed) {
    SCOPED_TRACE(::testing::Message() << "N=" << N << " C=" << C);
    CudaState state(0);
    const Context gpu = state.context(), cpu = cpu_context();
    optest::Rng rng(seed);
    // An offset mean: the variance must not come from E[x^2] - mean^2.
    const HostTensor x = random_bf16_values(rng, {N, C}, 3.0f, 5.0f);
    const HostTensor w = random_bf16_values(rng, {C}, 0.5f, 1.5f);
    const HostTensor b = random_bf16_values(rng, {C});
    const HostTensor dy = random_bf16_values(rng, {N, C});
    const HostTensor dx0 = random_bf16_values(rng, {N, C});
    const HostTensor dw0 = optest::random_tensor(rng, {C});
    const HostTensor db0 = optest::random_tensor(rng, {C});

    HostTensor y_ref(DType::kF32, {N, C}), mean_ref(DType::kF32, {N}), rstd_ref(DType::kF32, {N});
    layernorm_forward(y_ref.view(), mean_ref.view(), rstd_ref.view(), x.view(), w.view(), b.view(),
                      kEps, cpu);
    HostTensor dx_ref(DType::kF32, {N, C});
    HostTensor dx_acc_ref = optest::copy_tensor(dx0.view());
    HostTensor dw_ref = optest::copy_tensor(dw0.view()), db_ref = optest::copy_tensor(db0.view());
    layernorm_backward(dx_ref.view(), dw_ref.view(), db_ref.view(), dy.view(), x.view(), w.view(),
                       mean_ref.view(), rstd_ref.view(), GradMode::kOverwrite, cpu);
    layernorm_backward(dx_acc_ref.view(), TensorView(), TensorView(), dy.view(), x.view(), w.view(),
                       mean_ref.view(), rstd_ref.view(), GradMode::kAccumulate, cpu);

    DeviceTensor gx = upload(x, DType::kBF16, state), gw = upload(w, DType::kBF16, state);
    DeviceTensor gb = upload(b, DType::kBF16, state), gdy = upload(dy, DType::kBF16, state);
    DeviceTensor y = device_tensor(DType::kBF16, {N, C}, state);
    DeviceTensor mean = device_tensor(DType::kF32, {N}, state);
    DeviceTensor rstd = device_tensor(DType::kF32, {N}, state);
    layernorm_forward(y.view, mean.view, rstd.view, gx.view, gw.view, gb.view, kEps, gpu);
    EXPECT_TRUE(matches(download_f32(y.view, state), y_ref, kBf16Sum));
    EXPECT_TRUE(matches(download_f32(mean.view, state), mean_ref, kF32Sum));
    EXPECT_TRUE(matches(download_f32(rstd.view, state), rstd_ref, kF32Sum));

    DeviceTensor dx = device_tensor(DType::kBF16, {N, C}, state);
    DeviceTensor dx_acc = upload(dx0, DType::kBF16, state);
    DeviceTensor dw = upload(dw0, DType::kF32, state), db = upload(db0, DType::kF32, state);
    layernorm_backward(dx.view, dw.view, db.view, gdy.view, gx.view, gw.view, mean.view, rstd.view,
                       GradMode::kOverwrite, gpu);
    layernorm_backward(dx_acc.view, TensorView(), TensorView(), gdy.view, gx.view, gw.view,
                       mean.view, rstd.view, GradMode::kAccumulate, gpu);
    EXPECT_TRUE(matches(download_f32(dx.view, state), dx_ref, kBf16Sum));
    EXPECT_TRUE(matches(download_f32(dx_acc.view, state), dx_acc_ref, kBf16Sum));
    EXPECT_TRUE(matches(download_f32(dw.view, state), dw_ref, kF32Sum));
    EXPECT_TRUE(matches(download_f32(db.view, state), db_ref, kF32Sum));

    // dbias alone (frozen weight): the partial pass writes only one array.
    DeviceTensor db_only = upload(db0, DType::kF32, state);
    DeviceTensor dx3 = device_tensor(DType::kBF16, {N, C}, state);
    layernorm_backward(dx3.view, TensorView(), db_only.view, gdy.view, gx.view, gw.view, mean.view,
                       rstd.view, GradMode::kOverwrite, gpu);
    EXPECT_TRUE(bitwise_equal(download_raw(db_only.view, state), download_raw(db.view, state)));

    // Determinism: the same backward from the same starting point gives the same bits.
    DeviceTensor dw2 = upload(dw0, DType::kF32, state), db2 = upload(db0, DType::kF32, state);
    DeviceTensor dx2 = device_tensor(DType::kBF16, {N, C}, state);
    layernorm_backward(dx2.view, dw2.view, db2.view, gdy.view, gx.view, gw.view, mean.view,
                       rstd.view, GradMode::kOverwrite, gpu);
    EXPECT_TRUE(bitwise_equal(download_raw(dw2.view, state), download_raw(dw.view, state)));
    EXPECT_TRUE(bitwise_equal(download_raw(db2.view, state), download_raw(db.view, state)));
    EXPECT_TRUE(bitwise_equal(download_raw(dx2.view, state), download_raw(dx.view, state)));
}

// y_amax: the amax the fp8 cast of y would compute (cpu::fp8_amax of the bf16 values the kernel
// wrote), bit for bit, plain and with the residual fused, on the vector and scalar paths; y's
// (and x_out's) bits unchanged by asking.
void check_rmsnorm_amax(int64_t N, int64_t C, uint64_t seed) {
    SCOPED_TRACE(::testing::Message() << "N=" << N << " C=" << C);
    CudaState state(0);
    const Context gpu = state.context();
    optest::Rng rng(seed);
    DeviceTensor x = upload(random_bf16_values(rng, {N, C}, -3.0f, 3.0f), DType::kBF16, state);
    DeviceTensor b = upload(random_bf16_values(rng, {N, C}), DType::kBF16, state);
    DeviceTensor w = upload(random_bf16_values(rng, {C}, 0.5f, 1.5f), DType::kBF16, state);
    DeviceTensor rstd = device_tensor(DType::kF32, {N}, state);
    DeviceTensor plain = device_tensor(DType::kBF16, {N, C}, state);
    DeviceTensor y = device_tensor(DType::kBF16, {N, C}, state);
    DeviceTensor amax = device_tensor(DType::kF32, {1}, state);
    auto expect_amax = [&](const char* what) {
        const HostTensor raw = download_raw(y.view, state);
        EXPECT_TRUE(bitwise_equal(raw, download_raw(plain.view, state))) << what;
        const float want = cpu::fp8_amax(raw.as<bf16>(), N * C);
        const float got = download_raw(amax.view, state).as<float>()[0];
        EXPECT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(want))
            << what << ": " << got << " vs " << want;
        EXPECT_GT(got, 0.0f) << what;
    };
    rmsnorm_forward(plain.view, rstd.view, x.view, w.view, kEps, gpu);
    rmsnorm_forward(y.view, rstd.view, x.view, w.view, kEps, gpu, amax.view);
    expect_amax("rmsnorm_forward");
    DeviceTensor xo1 = device_tensor(DType::kBF16, {N, C}, state);
    DeviceTensor xo2 = device_tensor(DType::kBF16, {N, C}, state);
    rmsnorm_residual_forward(xo1.view, plain.view, rstd.view, x.view, b.view, w.view, kEps, gpu);
    rmsnorm_residual_forward(xo2.view, y.view, rstd.view, x.view, b.view, w.view, kEps, gpu,
                             amax.view);
    EXPECT_TRUE(bitwise_equal(download_raw(xo2.view, state), download_raw(xo1.view, state)));
    expect_amax("rmsnorm_residual_forward");
}

TEST(CudaRmsnorm, OutputAmaxIsTheCastsBitForBit) {
    check_rmsnorm_amax(300, 768, 91);  // 16-byte path
    check_rmsnorm_amax(37, 100, 92);   // scalar path
    check_rmsnorm_amax(4100, 4096, 93);
    check_rmsnorm_amax(8, 8192, 94);   // a block per row, 1024 threads
    check_rmsnorm_amax(600, 100, 95);  // a warp per row, scalar
    check_rmsnorm_amax(5, 16384, 96);  // a block per row, two vectors a thread
}

TEST(CudaRmsnorm, MatchesCpuVectorized) {
    check_rmsnorm(300, 768, 21);
}

TEST(CudaRmsnorm, MatchesCpuScalarPath) {
    check_rmsnorm(37, 100, 22);
}

TEST(CudaRmsnorm, MatchesCpuWideRows) {
    check_rmsnorm(16, 8192, 23);
}

TEST(CudaRmsnorm, MatchesCpuBlockPerRowTwoVectorsAThread) {
    check_rmsnorm(8, 16384, 41);
    check_rmsnorm(5, 2002, 42);  // scalar
}

TEST(CudaRmsnorm, MatchesCpuRowsTooWideForTheBlock) {
    check_rmsnorm(3, 3001, 43);  // scalar, 3 vectors a thread: a warp per row
}

TEST(CudaRmsnorm, MatchesCpuWarpPerRowJustAboveTheBlockRows) {
    check_rmsnorm(513, 768, 44);
}

TEST(CudaLayernorm, MatchesCpuBlockPerRow) {
    check_layernorm(8, 8192, 45);
    check_layernorm(8, 16384, 46);
    check_layernorm(5, 2002, 47);  // scalar, two vectors a thread
    check_layernorm(3, 3001, 48);  // a warp per row
}

TEST(CudaLayernorm, MatchesCpuVectorized) {
    check_layernorm(300, 768, 24);
}

TEST(CudaLayernorm, MatchesCpuScalarPath) {
    check_layernorm(37, 100, 25);
}

TEST(CudaRmsnorm, MatchesCpuManyChunks) {
    check_rmsnorm(4100, 2048, 26);
}

TEST(CudaRmsnorm, MatchesCpuManyChunksPartialTile) {
    check_rmsnorm(1000, 2000, 27);
}

TEST(CudaRmsnorm, MatchesCpuSixColumnGroups) {
    check_rmsnorm(200, 1536, 30);
}

TEST(CudaLayernorm, MatchesCpuWideRowsTwoKernelPath) {
    check_layernorm(100, 4096, 31);  // > 2048 columns: dx kernel, then the partials kernel
}

TEST(CudaLayernorm, MatchesCpuManyChunks) {
    check_layernorm(4100, 768, 28);
}

TEST(CudaLayernorm, MatchesCpuManyChunksScalarPath) {
    check_layernorm(1030, 770, 29);
}

// The residual add fused into the norm's forward: against the CPU twin (residual_forward then the
// norm, on the same bf16 values) with the usual tolerances, and bit for bit against the unfused
// CUDA sequence (the fused kernel rounds the sum as residual_forward does and normalizes the
// rounded row). Also in place (x_out = a).
void check_residual_norm(bool rms, int64_t N, int64_t C, uint64_t seed) {
    SCOPED_TRACE(::testing::Message()
                 << (rms ? "rmsnorm" : "layernorm") << " N=" << N << " C=" << C);
    CudaState state(0);
    const Context gpu = state.context(), cpu = cpu_context();
    optest::Rng rng(seed);
    const HostTensor a = random_bf16_values(rng, {N, C}, -2.0f, 2.0f);
    const HostTensor b = random_bf16_values(rng, {N, C}, 0.0f, 1.0f);  // an offset mean
    const HostTensor w = random_bf16_values(rng, {C}, 0.5f, 1.5f);
    const HostTensor bias = random_bf16_values(rng, {C});

    HostTensor x_ref(DType::kF32, {N, C}), y_ref(DType::kF32, {N, C});
    HostTensor mean_ref(DType::kF32, {N}), rstd_ref(DType::kF32, {N});
    if (rms)
        rmsnorm_residual_forward(x_ref.view(), y_ref.view(), rstd_ref.view(), a.view(), b.view(),
                                 w.view(), kEps, cpu);
    else
        layernorm_residual_forward(x_ref.view(), y_ref.view(), mean_ref.view(), rstd_ref.view(),
                                   a.view(), b.view(), w.view(), bias.view(), kEps, cpu);

    DeviceTensor ga = upload(a, DType::kBF16, state), gb = upload(b, DType::kBF16, state);
    DeviceTensor gw = upload(w, DType::kBF16, state), gbias = upload(bias, DType::kBF16, state);
    auto run = [&](bool fused, bool in_place) {
        DeviceTensor a_copy = upload(a, DType::kBF16, state);
        DeviceTensor x = device_tensor(DType::kBF16, {N, C}, state);
        const TensorView xo = in_place ? a_copy.view : x.view;
        DeviceTensor y = device_tensor(DType::kBF16, {N, C}, state);
        DeviceTensor mean = device_tensor(DType::kF32, {N}, state);
        DeviceTensor rstd = device_tensor(DType::kF32, {N}, state);
        const ConstTensorView av = in_place ? ConstTensorView(a_copy.view) : ga.view;
        if (fused) {
            if (rms)
                rmsnorm_residual_forward(xo, y.view, rstd.view, av, gb.view, gw.view, kEps, gpu);
            else
                layernorm_residual_forward(xo, y.view, mean.view, rstd.view, av, gb.view, gw.view,
                                           gbias.view, kEps, gpu);
        } else {
            residual_forward(xo, av, gb.view, gpu);
            if (rms)
                rmsnorm_forward(y.view, rstd.view, xo, gw.view, kEps, gpu);
            else
                layernorm_forward(y.view, mean.view, rstd.view, xo, gw.view, gbias.view, kEps, gpu);
        }
        std::vector<HostTensor> out;
        out.push_back(download_raw(xo, state));
        out.push_back(download_raw(y.view, state));
        out.push_back(download_raw(rstd.view, state));
        if (!rms) out.push_back(download_raw(mean.view, state));
        if (!fused && !in_place) {
            EXPECT_TRUE(matches(download_f32(xo, state), x_ref, kBf16Rounded)) << "x_out";
            EXPECT_TRUE(matches(download_f32(y.view, state), y_ref, kBf16Derived)) << "y";
            EXPECT_TRUE(matches(download_f32(rstd.view, state), rstd_ref, kBf16Derived)) << "rstd";
        }
        return out;
    };
    const std::vector<HostTensor> unfused = run(false, false);
    const std::vector<HostTensor> fused = run(true, false);
    const std::vector<HostTensor> fused_in_place = run(true, true);
    for (size_t i = 0; i < unfused.size(); ++i) {
        EXPECT_TRUE(bitwise_equal(fused[i], unfused[i])) << "output " << i;
        EXPECT_TRUE(bitwise_equal(fused_in_place[i], unfused[i])) << "output " << i << " in place";
    }
}

TEST(CudaResidualNorm, RmsnormFusedIsTheUnfusedSequence) {
    check_residual_norm(true, 300, 768, 71);
    check_residual_norm(true, 37, 100, 72);   // scalar path
    check_residual_norm(true, 8, 16384, 75);  // a block per row, two vectors a thread
    check_residual_norm(true, 600, 768, 76);  // a warp per row
    check_residual_norm(true, 600, 100, 77);  // a warp per row, scalar
}

TEST(CudaResidualNorm, LayernormFusedIsTheUnfusedSequence) {
    check_residual_norm(false, 300, 768, 73);
    check_residual_norm(false, 37, 100, 74);   // scalar path
    check_residual_norm(false, 8, 16384, 78);  // a block per row, two vectors a thread
    check_residual_norm(false, 600, 768, 79);  // a warp per row
    check_residual_norm(false, 600, 100, 80);  // a warp per row, scalar
}

}  // namespace
}  // namespace lathe
