// clang-format off
#include "ops/cuda/nvcc_compat.h"  // first: before any header that includes fmt
// clang-format on

#include <gtest/gtest.h>

#include <bit>

#include "ops/cpu/fp8_cast.h"
#include "ops/cuda/cuda_test_util.h"
#include "ops/gelu.h"
#include "ops/residual.h"
#include "ops/swiglu.h"

// The elementwise ops: SwiGLU, GELU (both forms), residual add. Sizes that are multiples of 8 take
// the 16-byte path, the others the scalar one.

namespace lathe {
namespace {

using namespace cudatest;

void check_swiglu(int64_t N, int64_t F, uint64_t seed, float range = 4.0f) {
    SCOPED_TRACE(::testing::Message() << "N=" << N << " F=" << F << " range=" << range);
    CudaState state(0);
    const Context gpu = state.context(), cpu = cpu_context();
    optest::Rng rng(seed);
    const HostTensor gate_up = random_bf16_values(rng, {N, 2 * F}, -range, range);
    const HostTensor dout = random_bf16_values(rng, {N, F});
    HostTensor out_ref(DType::kF32, {N, F}), dgu_ref(DType::kF32, {N, 2 * F});
    swiglu_forward(out_ref.view(), gate_up.view(), cpu);
    swiglu_backward(dgu_ref.view(), dout.view(), gate_up.view(), cpu);

    DeviceTensor ggu = upload(gate_up, DType::kBF16, state), gd = upload(dout, DType::kBF16, state);
    DeviceTensor out = device_tensor(DType::kBF16, {N, F}, state);
    DeviceTensor dgu = device_tensor(DType::kBF16, {N, 2 * F}, state);
    swiglu_forward(out.view, ggu.view, gpu);
    swiglu_backward(dgu.view, gd.view, ggu.view, gpu);
    EXPECT_TRUE(matches(download_f32(out.view, state), out_ref, kBf16Rounded));
    EXPECT_TRUE(matches(download_f32(dgu.view, state), dgu_ref, kBf16Rounded));
}

// out_amax: the amax the fp8 cast of out would compute (cpu::fp8_amax of the bf16 values the
// kernel wrote), bit for bit, on the vector and scalar paths; out's bits unchanged by asking.
void check_swiglu_amax(int64_t N, int64_t F, uint64_t seed) {
    SCOPED_TRACE(::testing::Message() << "N=" << N << " F=" << F);
    CudaState state(0);
    const Context gpu = state.context();
    optest::Rng rng(seed);
    DeviceTensor ggu =
        upload(random_bf16_values(rng, {N, 2 * F}, -4.0f, 4.0f), DType::kBF16, state);
    DeviceTensor plain = device_tensor(DType::kBF16, {N, F}, state);
    DeviceTensor out = device_tensor(DType::kBF16, {N, F}, state);
    DeviceTensor amax = device_tensor(DType::kF32, {1}, state);
    swiglu_forward(plain.view, ggu.view, gpu);
    swiglu_forward(out.view, ggu.view, gpu, amax.view);
    const HostTensor raw = download_raw(out.view, state);
    EXPECT_TRUE(bitwise_equal(raw, download_raw(plain.view, state)));
    const float want = cpu::fp8_amax(raw.as<bf16>(), N * F);
    const float got = download_raw(amax.view, state).as<float>()[0];
    EXPECT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(want)) << got << " vs " << want;
    EXPECT_GT(got, 0.0f);
    // The backward's dgate_up_amax the same way.
    DeviceTensor gd = upload(random_bf16_values(rng, {N, F}), DType::kBF16, state);
    DeviceTensor dplain = device_tensor(DType::kBF16, {N, 2 * F}, state);
    DeviceTensor dgu = device_tensor(DType::kBF16, {N, 2 * F}, state);
    swiglu_backward(dplain.view, gd.view, ggu.view, gpu);
    swiglu_backward(dgu.view, gd.view, ggu.view, gpu, amax.view);
    const HostTensor draw = download_raw(dgu.view, state);
    EXPECT_TRUE(bitwise_equal(draw, download_raw(dplain.view, state)));
    const float dwant = cpu::fp8_amax(draw.as<bf16>(), N * 2 * F);
    const float dgot = download_raw(amax.view, state).as<float>()[0];
    EXPECT_EQ(std::bit_cast<uint32_t>(dgot), std::bit_cast<uint32_t>(dwant))
        << "backward: " << dgot << " vs " << dwant;
}

TEST(CudaSwiglu, OutputAmaxIsTheCastsBitForBit) {
    check_swiglu_amax(48, 256, 51);     // 16-byte path
    check_swiglu_amax(7, 36, 52);       // scalar path
    check_swiglu_amax(4096, 1024, 53);  // many blocks, grid-stride loop
}

TEST(CudaSwiglu, MatchesCpuOverTheWholeRange) {
    // Past |gate| = 88 the sigmoid's exponential overflows or vanishes: it is 0 or 1 there.
    check_swiglu(64, 256, 53, 120.0f);
    check_swiglu(3, 3000, 54, 120.0f);  // rows wider than a block
    check_swiglu(40, 9, 55, 120.0f);    // the scalar path, several rows a block
}

TEST(CudaSwiglu, MatchesCpuVectorized) {
    check_swiglu(48, 256, 41);
}

TEST(CudaSwiglu, MatchesCpuScalarPath) {
    check_swiglu(7, 36, 42);
}

void check_gelu(Shape shape, GeluKind kind, bool in_place, uint64_t seed, float range = 4.0f) {
    SCOPED_TRACE(::testing::Message() << shape.to_string() << " tanh=" << (kind == GeluKind::kTanh)
                                      << " in_place=" << in_place << " range=" << range);
    CudaState state(0);
    const Context gpu = state.context(), cpu = cpu_context();
    optest::Rng rng(seed);
    const HostTensor x = random_bf16_values(rng, shape, -range, range);
    const HostTensor dy = random_bf16_values(rng, shape);
    HostTensor y_ref(DType::kF32, shape), dx_ref(DType::kF32, shape);
    gelu_forward(y_ref.view(), x.view(), kind, cpu);
    gelu_backward(dx_ref.view(), dy.view(), x.view(), kind, cpu);

    DeviceTensor gx = upload(x, DType::kBF16, state);
    DeviceTensor gdy = upload(dy, DType::kBF16, state);
    DeviceTensor dx =
        in_place ? upload(dy, DType::kBF16, state) : device_tensor(DType::kBF16, shape, state);
    // Backward first: an in-place forward overwrites x.
    gelu_backward(dx.view, in_place ? ConstTensorView(dx.view) : ConstTensorView(gdy.view), gx.view,
                  kind, gpu);
    DeviceTensor y =
        in_place ? upload(x, DType::kBF16, state) : device_tensor(DType::kBF16, shape, state);
    gelu_forward(y.view, in_place ? ConstTensorView(y.view) : ConstTensorView(gx.view), kind, gpu);
    EXPECT_TRUE(matches(download_f32(y.view, state), y_ref, kBf16Rounded));
    EXPECT_TRUE(matches(download_f32(dx.view, state), dx_ref, kBf16Rounded));
}

TEST(CudaGelu, MatchesCpuErf) {
    check_gelu({64, 128}, GeluKind::kErf, false, 43);
}

TEST(CudaGelu, MatchesCpuTanh) {
    check_gelu({64, 128}, GeluKind::kTanh, false, 44);
}

TEST(CudaGelu, MatchesCpuInPlaceScalarPath) {
    check_gelu({7, 143}, GeluKind::kTanh, true, 45);
    check_gelu({1001}, GeluKind::kErf, true, 46);
}

TEST(CudaGelu, TanhBackwardMatchesCpuOverTheWholeRange) {
    // Past |x| = 10 the logistic form's exponential overflows or vanishes: gelu' is 0 or 1 there.
    check_gelu({256, 64}, GeluKind::kTanh, false, 47);
    check_gelu({4096}, GeluKind::kTanh, false, 48, 60.0f);
}

void check_residual(Shape shape, uint64_t seed) {
    SCOPED_TRACE(::testing::Message() << shape.to_string());
    CudaState state(0);
    const Context gpu = state.context(), cpu = cpu_context();
    optest::Rng rng(seed);
    const HostTensor a = random_bf16_values(rng, shape), b = random_bf16_values(rng, shape);
    const HostTensor dout = random_bf16_values(rng, shape);
    const HostTensor da0 = random_bf16_values(rng, shape), db0 = random_bf16_values(rng, shape);
    HostTensor out_ref(DType::kF32, shape);
    residual_forward(out_ref.view(), a.view(), b.view(), cpu);
    HostTensor da_ref = optest::copy_tensor(da0.view()), db_ref = optest::copy_tensor(db0.view());
    residual_backward(da_ref.view(), db_ref.view(), dout.view(), cpu);

    DeviceTensor ga = upload(a, DType::kBF16, state), gb = upload(b, DType::kBF16, state);
    DeviceTensor out = device_tensor(DType::kBF16, shape, state);
    residual_forward(out.view, ga.view, gb.view, gpu);
    EXPECT_TRUE(matches(download_f32(out.view, state), out_ref, kBf16Rounded));
    residual_forward(ga.view, ga.view, gb.view, gpu);  // in place: a += b
    EXPECT_TRUE(bitwise_equal(download_raw(ga.view, state), download_raw(out.view, state)));

    DeviceTensor gdout = upload(dout, DType::kBF16, state);
    DeviceTensor da = upload(da0, DType::kBF16, state), db = upload(db0, DType::kBF16, state);
    residual_backward(da.view, db.view, gdout.view, gpu);
    EXPECT_TRUE(matches(download_f32(da.view, state), da_ref, kBf16Rounded));
    EXPECT_TRUE(matches(download_f32(db.view, state), db_ref, kBf16Rounded));
    DeviceTensor da_only = upload(da0, DType::kBF16, state);
    residual_backward(da_only.view, TensorView(), gdout.view, gpu);
    EXPECT_TRUE(bitwise_equal(download_raw(da_only.view, state), download_raw(da.view, state)));
}

TEST(CudaResidual, MatchesCpuVectorized) {
    check_residual({4, 32, 96}, 47);
}

TEST(CudaResidual, MatchesCpuScalarPath) {
    check_residual({5, 13}, 48);
}

}  // namespace
}  // namespace lathe
