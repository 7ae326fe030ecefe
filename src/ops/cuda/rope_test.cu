// clang-format off
#include "ops/cuda/nvcc_compat.h"  // first: before any header that includes fmt
// clang-format on

#include <gtest/gtest.h>

#include "ops/cuda/cuda_test_util.h"
#include "ops/cuda/rope.h"
#include "ops/op_test.h"
#include "ops/rope.h"

namespace lathe {
namespace {

using namespace cudatest;

struct RopeCase {
    int64_t B, T, Hx, D;
    double partial;  // partial_rotary_factor
    bool positions;  // explicit positions (packed documents) or 0..T-1
    bool in_place;
};

void check_rope(const RopeCase& c, uint64_t seed) {
    SCOPED_TRACE(::testing::Message()
                 << "B=" << c.B << " T=" << c.T << " Hx=" << c.Hx << " D=" << c.D << " partial="
                 << c.partial << " positions=" << c.positions << " in_place=" << c.in_place);
    CudaState state(0);
    const Context gpu = state.context(), cpu = cpu_context();
    optest::Rng rng(seed);
    RopeConfig config;
    config.head_dim = c.D;
    config.partial_rotary_factor = c.partial;
    config.theta = 500000.0;
    const int64_t R = rope_rotary_dim(config), P = 4 * c.T;
    HostTensor cos(DType::kF32, {P, R / 2}), sin(DType::kF32, {P, R / 2});
    rope_build_table(cos.view(), sin.view(), config);
    HostTensor pos(DType::kI32, {c.B, c.T});
    for (int64_t i = 0; i < pos.numel(); ++i) pos.as<int32_t>()[i] = int32_t(rng.integer(0, P - 1));
    const ConstTensorView pos_view = c.positions ? pos.view() : ConstTensorView();
    const HostTensor x = random_bf16_values(rng, {c.B, c.T, c.Hx, c.D});
    const HostTensor dout = random_bf16_values(rng, {c.B, c.T, c.Hx, c.D});

    HostTensor out_ref(DType::kF32, x.shape()), dx_ref(DType::kF32, x.shape());
    rope_forward(out_ref.view(), x.view(), pos_view, cos.view(), sin.view(), cpu);
    rope_backward(dx_ref.view(), dout.view(), pos_view, cos.view(), sin.view(), cpu);

    DeviceTensor gcos = upload(cos, DType::kF32, state), gsin = upload(sin, DType::kF32, state);
    DeviceTensor gpos = upload(pos, DType::kI32, state);
    const ConstTensorView gpos_view = c.positions ? ConstTensorView(gpos.view) : ConstTensorView();
    DeviceTensor gx = upload(x, DType::kBF16, state), gdout = upload(dout, DType::kBF16, state);
    DeviceTensor out =
        c.in_place ? upload(x, DType::kBF16, state) : device_tensor(DType::kBF16, x.shape(), state);
    DeviceTensor dx = c.in_place ? upload(dout, DType::kBF16, state)
                                 : device_tensor(DType::kBF16, x.shape(), state);
    rope_forward(out.view, c.in_place ? ConstTensorView(out.view) : ConstTensorView(gx.view),
                 gpos_view, gcos.view, gsin.view, gpu);
    rope_backward(dx.view, c.in_place ? ConstTensorView(dx.view) : ConstTensorView(gdout.view),
                  gpos_view, gcos.view, gsin.view, gpu);
    EXPECT_TRUE(matches(download_f32(out.view, state), out_ref, kBf16Sum));
    EXPECT_TRUE(matches(download_f32(dx.view, state), dx_ref, kBf16Sum));
}

TEST(CudaRope, MatchesCpuFullRotary) {
    check_rope({2, 16, 4, 64, 1.0, false, false}, 31);
}

TEST(CudaRope, MatchesCpuPartialRotaryWithPositions) {
    check_rope({2, 12, 3, 64, 0.25, true, false}, 32);  // GPT-NeoX rotary_pct 0.25: 48 dims copied
}

TEST(CudaRope, MatchesCpuInPlace) {
    check_rope({1, 9, 8, 128, 1.0, true, true}, 33);
}

TEST(CudaRope, MatchesCpuInPlacePartial) {
    check_rope({3, 5, 2, 80, 0.5, false, true}, 34);
}

// Queries and keys in one launch (GQA head counts, in place as the block runs it, and out of
// place): against the CPU twin, and bit for bit against the single-tensor CUDA launches.
void check_rope_qk(int64_t H, int64_t Hkv, double partial, bool positions, bool in_place,
                   uint64_t seed) {
    SCOPED_TRACE(::testing::Message() << "H=" << H << " Hkv=" << Hkv << " partial=" << partial
                                      << " positions=" << positions << " in_place=" << in_place);
    const int64_t B = 2, T = 24, D = 64;
    CudaState state(0);
    const Context gpu = state.context(), cpu = cpu_context();
    optest::Rng rng(seed);
    RopeConfig config;
    config.head_dim = D;
    config.partial_rotary_factor = partial;
    const int64_t R = rope_rotary_dim(config), P = 4 * T;
    HostTensor cos(DType::kF32, {P, R / 2}), sin(DType::kF32, {P, R / 2});
    rope_build_table(cos.view(), sin.view(), config);
    HostTensor pos(DType::kI32, {B, T});
    for (int64_t i = 0; i < pos.numel(); ++i) pos.as<int32_t>()[i] = int32_t(rng.integer(0, P - 1));
    const HostTensor q = random_bf16_values(rng, {B, T, H, D});
    const HostTensor k = random_bf16_values(rng, {B, T, Hkv, D});

    DeviceTensor gcos = upload(cos, DType::kF32, state), gsin = upload(sin, DType::kF32, state);
    DeviceTensor gpos = upload(pos, DType::kI32, state);
    const ConstTensorView pos_cpu = positions ? pos.view() : ConstTensorView();
    const ConstTensorView pos_gpu = positions ? ConstTensorView(gpos.view) : ConstTensorView();
    for (const bool backward : {false, true}) {
        SCOPED_TRACE(backward ? "backward" : "forward");
        HostTensor q_ref(DType::kF32, q.shape()), k_ref(DType::kF32, k.shape());
        if (backward)
            rope_qk_backward(q_ref.view(), k_ref.view(), q.view(), k.view(), pos_cpu, cos.view(),
                             sin.view(), cpu);
        else
            rope_qk_forward(q_ref.view(), k_ref.view(), q.view(), k.view(), pos_cpu, cos.view(),
                            sin.view(), cpu);
        // Single launches.
        DeviceTensor gq = upload(q, DType::kBF16, state), gk = upload(k, DType::kBF16, state);
        DeviceTensor q1 = device_tensor(DType::kBF16, q.shape(), state);
        DeviceTensor k1 = device_tensor(DType::kBF16, k.shape(), state);
        if (backward) {
            rope_backward(q1.view, gq.view, pos_gpu, gcos.view, gsin.view, gpu);
            rope_backward(k1.view, gk.view, pos_gpu, gcos.view, gsin.view, gpu);
        } else {
            rope_forward(q1.view, gq.view, pos_gpu, gcos.view, gsin.view, gpu);
            rope_forward(k1.view, gk.view, pos_gpu, gcos.view, gsin.view, gpu);
        }
        // One launch.
        DeviceTensor q2 = in_place ? upload(q, DType::kBF16, state)
                                   : device_tensor(DType::kBF16, q.shape(), state);
        DeviceTensor k2 = in_place ? upload(k, DType::kBF16, state)
                                   : device_tensor(DType::kBF16, k.shape(), state);
        const ConstTensorView qi = in_place ? ConstTensorView(q2.view) : ConstTensorView(gq.view);
        const ConstTensorView ki = in_place ? ConstTensorView(k2.view) : ConstTensorView(gk.view);
        if (backward)
            rope_qk_backward(q2.view, k2.view, qi, ki, pos_gpu, gcos.view, gsin.view, gpu);
        else
            rope_qk_forward(q2.view, k2.view, qi, ki, pos_gpu, gcos.view, gsin.view, gpu);
        EXPECT_TRUE(matches(download_f32(q2.view, state), q_ref, kBf16Sum)) << "q";
        EXPECT_TRUE(matches(download_f32(k2.view, state), k_ref, kBf16Sum)) << "k";
        EXPECT_TRUE(bitwise_equal(download_raw(q2.view, state), download_raw(q1.view, state)));
        EXPECT_TRUE(bitwise_equal(download_raw(k2.view, state), download_raw(k1.view, state)));
        // Packed with the values (B, T, H + 2 Hkv, D), in place: the same bits, values untouched.
        const HostTensor v = random_bf16_values(rng, {B, T, Hkv, D});
        const HostTensor packed = optest::pack_heads({q.view(), k.view(), v.view()});
        DeviceTensor qkv = upload(packed, DType::kBF16, state);
        if (backward)
            rope_qkv_backward(qkv.view, H + Hkv, pos_gpu, gcos.view, gsin.view, gpu);
        else
            rope_qkv_forward(qkv.view, H + Hkv, pos_gpu, gcos.view, gsin.view, gpu);
        const HostTensor got = download_raw(qkv.view, state);
        EXPECT_TRUE(
            bitwise_equal(optest::take_heads(got.view(), 0, H), download_raw(q1.view, state)))
            << "packed q";
        EXPECT_TRUE(
            bitwise_equal(optest::take_heads(got.view(), H, Hkv), download_raw(k1.view, state)))
            << "packed k";
        EXPECT_TRUE(bitwise_equal(optest::take_heads(got.view(), H + Hkv, Hkv),
                                  download_raw(upload(v, DType::kBF16, state).view, state)))
            << "packed v untouched";
    }
}

// (Also the packed q, k, v layout's launch, rope_qkv_*, against the single ones.)
TEST(CudaRopeQk, OneLaunchIsTheTwoSingleOnes) {
    check_rope_qk(8, 2, 1.0, true, true, 35);     // GQA, packed positions, in place (the block)
    check_rope_qk(4, 4, 0.25, false, false, 36);  // partial rotary, out of place
}

// Eight pairs a thread (the shapes whose halves split into 16-byte pieces) against one pair a
// thread, bit for bit: Llama's head (D 128), GPT-NeoX's partial rotary (R 16 of D 64, the rest
// copied), in place and not, forward and backward.
void check_rope_eight_pairs(int64_t H, int64_t Hkv, int64_t D, double partial, bool positions,
                            bool in_place, uint64_t seed) {
    SCOPED_TRACE(::testing::Message()
                 << "H=" << H << " Hkv=" << Hkv << " D=" << D << " partial=" << partial
                 << " positions=" << positions << " in_place=" << in_place);
    const int64_t B = 3, T = 13;
    CudaState state(0);
    optest::Rng rng(seed);
    RopeConfig config;
    config.head_dim = D;
    config.partial_rotary_factor = partial;
    const int64_t R = rope_rotary_dim(config), P = 4 * T;
    ASSERT_EQ((R / 2) % 8, 0);
    HostTensor cos(DType::kF32, {P, R / 2}), sin(DType::kF32, {P, R / 2});
    rope_build_table(cos.view(), sin.view(), config);
    HostTensor pos(DType::kI32, {B, T});
    for (int64_t i = 0; i < pos.numel(); ++i) pos.as<int32_t>()[i] = int32_t(rng.integer(0, P - 1));
    const HostTensor q = random_bf16_values(rng, {B, T, H, D});
    const HostTensor k = random_bf16_values(rng, {B, T, Hkv, D});
    DeviceTensor gcos = upload(cos, DType::kF32, state), gsin = upload(sin, DType::kF32, state);
    DeviceTensor gpos = upload(pos, DType::kI32, state);
    const int32_t* p = positions ? static_cast<const int32_t*>(gpos.view.data()) : nullptr;
    const float* c = static_cast<const float*>(gcos.view.data());
    const float* s = static_cast<const float*>(gsin.view.data());
    auto bf = [](DeviceTensor& t) { return static_cast<bf16*>(t.view.data()); };
    for (const bool backward : {false, true}) {
        SCOPED_TRACE(backward ? "backward" : "forward");
        DeviceTensor gq = upload(q, DType::kBF16, state), gk = upload(k, DType::kBF16, state);
        DeviceTensor q1 = in_place ? upload(q, DType::kBF16, state)
                                   : device_tensor(DType::kBF16, q.shape(), state);
        DeviceTensor k1 = in_place ? upload(k, DType::kBF16, state)
                                   : device_tensor(DType::kBF16, k.shape(), state);
        DeviceTensor q8 = in_place ? upload(q, DType::kBF16, state)
                                   : device_tensor(DType::kBF16, q.shape(), state);
        DeviceTensor k8 = in_place ? upload(k, DType::kBF16, state)
                                   : device_tensor(DType::kBF16, k.shape(), state);
        cuda::rope_qk_one_pair_per_thread(bf(q1), bf(k1), in_place ? bf(q1) : bf(gq),
                                          in_place ? bf(k1) : bf(gk), p, c, s, B, T, H, Hkv, D, R,
                                          P, backward, state.stream());
        cuda::rope_qk(bf(q8), bf(k8), in_place ? bf(q8) : bf(gq), in_place ? bf(k8) : bf(gk), p, c,
                      s, B, T, H, Hkv, D, R, P, backward, state.stream());
        EXPECT_TRUE(bitwise_equal(download_raw(q8.view, state), download_raw(q1.view, state)));
        EXPECT_TRUE(bitwise_equal(download_raw(k8.view, state), download_raw(k1.view, state)));
    }
}

TEST(CudaRopeQk, EightPairsAThreadIsOnePairAThread) {
    check_rope_eight_pairs(8, 2, 128, 1.0, true, true, 37);    // Llama: GQA, in place
    check_rope_eight_pairs(4, 4, 128, 1.0, false, false, 38);  // out of place
    check_rope_eight_pairs(4, 2, 64, 0.25, true, false, 39);   // partial: 48 dims copied
    check_rope_eight_pairs(2, 2, 64, 0.25, false, true, 40);   // partial, in place
}

}  // namespace
}  // namespace lathe
