#include "ops/adamw.h"

#include <bit>
#include <cmath>
#include <vector>

#include "ops/op_test.h"

namespace lathe::optest {
namespace {

constexpr int64_t kP = 12;

// The fixture's exact inputs: parameters and per-step gradients are multiples of 1/8.
void init_params(float* p) {
    for (int64_t i = 0; i < kP; ++i) p[i] = float((i * 5) % 13 - 6) / 8.0f;
}
void step_grads(float* g, int64_t t) {
    for (int64_t i = 0; i < kP; ++i) g[i] = float((i * 7 + t * 3) % 11 - 5) / 8.0f;
}

// Produced with torch 2.15.0 (CPU, the single-tensor path torch takes for CPU tensors):
//   a = Parameter(init[0:6]); b = Parameter(init[6:10])
//   opt = torch.optim.AdamW([{"params": [a], "lr": 1e-2, "weight_decay": 0.1},
//                            {"params": [b], "lr": 3e-3, "weight_decay": 0.0}],
//                           betas=(0.9, 0.95), eps=1e-8)
//   ten steps of a.grad, b.grad = g_t[0:6], g_t[6:10]; then params, exp_avg, exp_avg_sq.
const float kTorchParams[] = {
    -0x1.7a7c1a0000000p-1f, -0x1.16eef20000000p-3f, 0x1.dcd6160000000p-2f,  -0x1.d885be0000000p-2f,
    0x1.b913ea0000000p-4f,  0x1.7d4b6c0000000p-1f,  -0x1.f25f0e0000000p-3f, 0x1.80173a0000000p-2f,
    -0x1.411e5a0000000p-1f, 0x1.39b8560000000p-7f};
const float kTorchExpAvg[] = {
    0x1.c07cc60000000p-5f,  -0x1.0fefa40000000p-5f, -0x1.279db20000000p-8f, -0x1.b4ee8a0000000p-6f,
    -0x1.11c2f00000000p-5f, 0x1.a67eaa0000000p-5f,  -0x1.1ecdd20000000p-5f, 0x1.242e600000000p-7f,
    0x1.264b8c0000000p-5f,  -0x1.4afc720000000p-8f};
const float kTorchExpAvgSq[] = {0x1.b7bb240000000p-5f, 0x1.07d1200000000p-4f, 0x1.1935580000000p-4f,
                                0x1.af0dd80000000p-5f, 0x1.1608300000000p-4f, 0x1.0b81d00000000p-4f,
                                0x1.d959a20000000p-5f, 0x1.1aee860000000p-4f, 0x1.eac59e0000000p-5f,
                                0x1.f715420000000p-5f};

TEST(AdamW, TenStepsMatchTorch) {
    HostTensor p = f32(Shape{kP}), m = f32(Shape{kP}), v = f32(Shape{kP}), g = f32(Shape{kP});
    init_params(p.as<float>());
    // Two parameter groups; elements 10 and 11 belong to none (arena padding, say).
    const AdamWSegment segments[] = {{0, 6, 1e-2, 0.1}, {6, 4, 3e-3, 0.0}};
    AdamWHyper hyper;
    hyper.beta1 = 0.9;
    hyper.beta2 = 0.95;
    hyper.eps = 1e-8;
    for (int64_t t = 1; t <= 10; ++t) {
        step_grads(g.as<float>(), t);
        adamw_update(p.view(), m.view(), v.view(), g.view(), segments, hyper, t, cpu_context());
    }
    // Bit for bit: the same fp32 operations in the same order (see ops/cpu/adamw.cpp).
    for (int64_t i = 0; i < 10; ++i) {
        EXPECT_EQ(p.as<float>()[i], kTorchParams[i]) << i;
        EXPECT_EQ(m.as<float>()[i], kTorchExpAvg[i]) << i;
        EXPECT_EQ(v.as<float>()[i], kTorchExpAvgSq[i]) << i;
    }
    float init[kP];
    init_params(init);
    for (int64_t i = 10; i < kP; ++i) {
        EXPECT_EQ(p.as<float>()[i], init[i]);
        EXPECT_EQ(m.as<float>()[i], 0.0f);
    }
}

// First step by hand: m = 0.1 g, v = 0.05 g^2 (beta2 0.95), bias-corrected m/sqrt(v) = sign(g),
// so p = p (1 - lr wd) - lr sign(g) (up to eps).
TEST(AdamW, FirstStepIsSignDescentWithDecoupledDecay) {
    HostTensor p = tensor_of(Shape{3}, {1.0f, -2.0f, 0.5f});
    HostTensor g = tensor_of(Shape{3}, {0.3f, -4.0f, 1e-3f});
    HostTensor m = f32(Shape{3}), v = f32(Shape{3});
    const AdamWSegment seg[] = {{0, 3, 0.1, 0.5}};
    AdamWHyper hyper;
    hyper.beta2 = 0.95;
    adamw_update(p.view(), m.view(), v.view(), g.view(), seg, hyper, 1, cpu_context());
    EXPECT_NEAR(p.as<float>()[0], 1.0 * 0.95 - 0.1, 1e-6);
    EXPECT_NEAR(p.as<float>()[1], -2.0 * 0.95 + 0.1, 1e-6);
    EXPECT_NEAR(p.as<float>()[2], 0.5 * 0.95 - 0.1, 1e-4);  // eps matters a little at g = 1e-3
    EXPECT_NEAR(m.as<float>()[1], -0.4, 1e-7);
    EXPECT_NEAR(v.as<float>()[1], 0.05 * 16.0, 1e-6);
}

// bf16 moments: each step equals the f32 update over the moments widened, with its moments
// rounded to nearest even afterwards (ops/adamw.h), over ten steps of the torch fixture's inputs
// with clipping and a NaN gradient (its NaN moments round to quiet NaNs of their sign).
TEST(AdamW, Bf16MomentsAreTheF32UpdateRounded) {
    HostTensor p = f32(Shape{kP}), g = f32(Shape{kP}), ref_p = f32(Shape{kP});
    HostTensor m16(DType::kBF16, Shape{kP}), v16(DType::kBF16, Shape{kP});
    HostTensor ref_m16(DType::kBF16, Shape{kP}), ref_v16(DType::kBF16, Shape{kP});
    HostTensor m32 = f32(Shape{kP}), v32 = f32(Shape{kP});
    HostTensor copy(DType::kBF16, Shape{kP}), ref_copy(DType::kBF16, Shape{kP});
    init_params(p.as<float>());
    init_params(ref_p.as<float>());
    const AdamWSegment segments[] = {{0, 6, 1e-2, 0.1}, {6, 4, 3e-3, 0.0}};
    AdamWHyper hyper;
    hyper.beta2 = 0.95;
    float norm = 9.0f;  // above max_norm 1: the gradients scaled
    const ConstTensorView clip(&norm, DType::kF32, Shape{1});
    for (int64_t t = 1; t <= 10; ++t) {
        step_grads(g.as<float>(), t);
        if (t == 7) g.as<float>()[3] = std::nanf("");
        adamw_update_with_copy(p.view(), copy.view(), m16.view(), v16.view(), g.view(), segments,
                               hyper, t, clip, 1.0f, cpu_context());
        for (int64_t i = 0; i < kP; ++i) {
            m32.as<float>()[i] = bf16_to_float(ref_m16.as<bf16>()[i]);
            v32.as<float>()[i] = bf16_to_float(ref_v16.as<bf16>()[i]);
        }
        adamw_update_with_copy(ref_p.view(), ref_copy.view(), m32.view(), v32.view(), g.view(),
                               segments, hyper, t, clip, 1.0f, cpu_context());
        for (int64_t i = 0; i < kP; ++i) {
            ref_m16.as<bf16>()[i] = float_to_bf16(m32.as<float>()[i]);
            ref_v16.as<bf16>()[i] = float_to_bf16(v32.as<float>()[i]);
        }
        for (int64_t i = 0; i < kP; ++i) {
            ASSERT_EQ(std::bit_cast<uint32_t>(p.as<float>()[i]),
                      std::bit_cast<uint32_t>(ref_p.as<float>()[i]))
                << "step " << t << " element " << i;
            ASSERT_EQ(m16.as<bf16>()[i].bits, ref_m16.as<bf16>()[i].bits) << t << " " << i;
            ASSERT_EQ(v16.as<bf16>()[i].bits, ref_v16.as<bf16>()[i].bits) << t << " " << i;
            ASSERT_EQ(copy.as<bf16>()[i].bits, ref_copy.as<bf16>()[i].bits) << t << " " << i;
        }
    }
    EXPECT_TRUE(std::isnan(bf16_to_float(m16.as<bf16>()[3])));
    EXPECT_NE(m16.as<bf16>()[0].bits, 0);  // the moments moved
}

TEST(AdamWDeathTest, MomentsOfTwoDtypesStop) {
    HostTensor p = f32(Shape{4}), m = f32(Shape{4}), g = f32(Shape{4});
    HostTensor v(DType::kBF16, Shape{4});
    const AdamWSegment seg[] = {{0, 4, 0.1, 0.0}};
    EXPECT_DEATH(
        adamw_update(p.view(), m.view(), v.view(), g.view(), seg, AdamWHyper{}, 1, cpu_context()),
        "both f32 or both bf16");
}

TEST(AdamWDeathTest, OverlappingSegmentsStop) {
    HostTensor p = f32(Shape{4}), m = f32(Shape{4}), v = f32(Shape{4}), g = f32(Shape{4});
    const AdamWSegment seg[] = {{0, 3, 0.1, 0.0}, {2, 2, 0.1, 0.0}};
    EXPECT_DEATH(
        adamw_update(p.view(), m.view(), v.view(), g.view(), seg, AdamWHyper{}, 1, cpu_context()),
        "overlap");
}

}  // namespace
}  // namespace lathe::optest
