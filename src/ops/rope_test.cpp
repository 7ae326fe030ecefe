#include "ops/rope.h"

#include "ops/op_test.h"

namespace lathe::optest {
namespace {

RopeConfig llama3_config() {
    RopeConfig c;
    c.head_dim = 16;
    c.theta = 500000.0;
    c.scaling = RopeScaling::kLlama3;
    c.factor = 8.0;
    c.low_freq_factor = 1.0;
    c.high_freq_factor = 4.0;
    c.original_max_position_embeddings = 8192;
    return c;
}

// Fixtures from transformers 5.24.0 with torch 2.15.0 (CPU): head_dim 16;
// ROPE_INIT_FUNCTIONS["llama3"] for inv_freq, and LlamaRotaryEmbedding(config)(x, position_ids)
// for cos/sin at positions 0, 37, 5000 (first R/2 = 8 columns; the other 8 repeat them).
// llama3: rope_theta 500000, factor 8, low 1, high 4, original_max_position_embeddings 8192
// (the three frequency regimes all occur). default: rope_theta 10000.
const float kLlama3InvFreq[] = {
    0x1.0000000000000p+0f,  0x1.8d27600000000p-3f,  0x1.3411900000000p-5f,  0x1.ddee9e0000000p-8f,
    0x1.132ba40000000p-11f, 0x1.1f91f00000000p-15f, 0x1.be21880000000p-18f, 0x1.5a0f4e0000000p-20f};
const float kLlama3Cos[] = {
    0x1.0000000000000p+0f,  0x1.0000000000000p+0f,  0x1.0000000000000p+0f, 0x1.0000000000000p+0f,
    0x1.0000000000000p+0f,  0x1.0000000000000p+0f,  0x1.0000000000000p+0f, 0x1.0000000000000p+0f,
    0x1.87e45a0000000p-1f,  0x1.417ad00000000p-1f,  0x1.6d63bc0000000p-3f, 0x1.ed795e0000000p-1f,
    0x1.ffe74a0000000p-1f,  0x1.ffffe60000000p-1f,  0x1.0000000000000p+0f, 0x1.0000000000000p+0f,
    0x1.3cc2ca0000000p-3f,  -0x1.ad24480000000p-2f, 0x1.c98b000000000p-1f, 0x1.50ab560000000p-2f,
    -0x1.bcfe2c0000000p-1f, 0x1.f87f480000000p-1f,  0x1.ffb79a0000000p-1f, 0x1.fffd480000000p-1f};
const float kLlama3Sin[] = {0.0f,
                            0.0f,
                            0.0f,
                            0.0f,
                            0.0f,
                            0.0f,
                            0.0f,
                            0.0f,
                            -0x1.497dd40000000p-1f,
                            0x1.8e7d9a0000000p-1f,
                            0x1.f7c90c0000000p-1f,
                            0x1.10f6be0000000p-2f,
                            0x1.3e25580000000p-6f,
                            0x1.4c80b80000000p-10f,
                            0x1.01eb620000000p-12f,
                            0x1.9021b20000000p-15f,
                            -0x1.f9d6bc0000000p-1f,
                            0x1.d0de820000000p-1f,
                            -0x1.cb8ee60000000p-2f,
                            -0x1.e389520000000p-1f,
                            0x1.fa75ae0000000p-2f,
                            0x1.5d52420000000p-3f,
                            0x1.103f220000000p-5f,
                            0x1.a66eee0000000p-8f};
const float kDefaultInvFreq[] = {
    0x1.0000000000000p+0f, 0x1.43d1360000000p-2f, 0x1.99999a0000000p-4f,  0x1.030dc60000000p-5f,
    0x1.47ae140000000p-7f, 0x1.9e7c700000000p-9f, 0x1.0624de0000000p-10f, 0x1.4b96c00000000p-12f};
const float kDefaultCos[] = {
    0x1.0000000000000p+0f, 0x1.0000000000000p+0f,  0x1.0000000000000p+0f,  0x1.0000000000000p+0f,
    0x1.0000000000000p+0f, 0x1.0000000000000p+0f,  0x1.0000000000000p+0f,  0x1.0000000000000p+0f,
    0x1.87e45a0000000p-1f, 0x1.4bbc640000000p-1f,  -0x1.b23a2a0000000p-1f, 0x1.8f799a0000000p-2f,
    0x1.dd5a020000000p-1f, 0x1.fc7fd60000000p-1f,  0x1.ffa64a0000000p-1f,  0x1.fff7080000000p-1f,
    0x1.3cc2ca0000000p-3f, -0x1.371ed20000000p-1f, -0x1.c487e40000000p-1f, 0x1.05b7280000000p-1f,
    0x1.ee10080000000p-1f, -0x1.fd43980000000p-1f, 0x1.2278580000000p-2f,  -0x1.52e6d20000000p-7f};
const float kDefaultSin[] = {0.0f,
                             0.0f,
                             0.0f,
                             0.0f,
                             0.0f,
                             0.0f,
                             0.0f,
                             0.0f,
                             -0x1.497dd40000000p-1f,
                             -0x1.85fe740000000p-1f,
                             -0x1.0f46b00000000p-1f,
                             0x1.d76ed00000000p-1f,
                             0x1.724b520000000p-2f,
                             0x1.de28240000000p-4f,
                             0x1.2f08ec0000000p-5f,
                             0x1.7f64100000000p-7f,
                             -0x1.f9d6bc0000000p-1f,
                             -0x1.96a1540000000p-1f,
                             -0x1.deff920000000p-2f,
                             0x1.b80e420000000p-1f,
                             -0x1.0cabfe0000000p-2f,
                             -0x1.a6e0780000000p-4f,
                             -0x1.eaf8200000000p-1f,
                             0x1.fff8fe0000000p-1f};

void expect_tables_match(const RopeConfig& config, const float* inv_ref, const float* cos_ref,
                         const float* sin_ref) {
    const std::vector<float> inv = rope_inv_freq(config);
    ASSERT_EQ(inv.size(), 8u);
    for (int i = 0; i < 8; ++i) EXPECT_EQ(inv[size_t(i)], inv_ref[i]) << "inv_freq " << i;
    HostTensor cos = f32(Shape{5001, 8}), sin = f32(Shape{5001, 8});
    rope_build_table(cos.view(), sin.view(), config);
    const int positions[] = {0, 37, 5000};
    for (int p = 0; p < 3; ++p) {
        for (int i = 0; i < 8; ++i) {
            // torch's fp32 cos/sin and ours (fp64, rounded) of the same fp32 angle: within an ulp.
            EXPECT_NEAR(cos.as<float>()[positions[p] * 8 + i], cos_ref[p * 8 + i], 1.2e-7)
                << "cos pos " << positions[p] << " i " << i;
            EXPECT_NEAR(sin.as<float>()[positions[p] * 8 + i], sin_ref[p * 8 + i], 1.2e-7)
                << "sin pos " << positions[p] << " i " << i;
        }
    }
}

TEST(Rope, TablesMatchTransformers) {
    expect_tables_match(llama3_config(), kLlama3InvFreq, kLlama3Cos, kLlama3Sin);
    RopeConfig plain;
    plain.head_dim = 16;
    expect_tables_match(plain, kDefaultInvFreq, kDefaultCos, kDefaultSin);
}

TEST(Rope, ForwardRotatesHalvesAndPassesTheRestThrough) {
    const Context ctx = cpu_context();
    RopeConfig c;
    c.head_dim = 8;
    c.partial_rotary_factor = 0.5;  // R = 4: dims 4..7 pass through (GPT-NeoX rotary_pct)
    ASSERT_EQ(rope_rotary_dim(c), 4);
    HostTensor cos = f32(Shape{4, 2}), sin = f32(Shape{4, 2});
    rope_build_table(cos.view(), sin.view(), c);
    // One head at t = 0 (identity) and t = 1 (angle 1 on pair (0, 2), 1/100 on pair (1, 3)).
    HostTensor x = tensor_of(Shape{1, 2, 1, 8}, {1, 2, 3, 4, 5, 6, 7, 8, 1, 0, 0, 1, 5, 6, 7, 8});
    HostTensor out = f32(Shape{1, 2, 1, 8});
    rope_forward(out.view(), x.view(), {}, cos.view(), sin.view(), ctx);
    for (int i = 0; i < 8; ++i) EXPECT_FLOAT_EQ(out.as<float>()[i], x.as<float>()[i]);
    const float* o = out.as<float>() + 8;
    EXPECT_FLOAT_EQ(o[0], std::cos(1.0f));
    EXPECT_FLOAT_EQ(o[2], std::sin(1.0f));
    EXPECT_FLOAT_EQ(o[1], -std::sin(0.01f));  // x1 c - x3 s with x1 = 0, x3 = 1
    EXPECT_FLOAT_EQ(o[3], std::cos(0.01f));
    for (int i = 4; i < 8; ++i) EXPECT_EQ(o[i], x.as<float>()[8 + i]);
    // Explicit positions: row 0 at position 1 equals row 1 above; in place equals out of place.
    HostTensor pos = ids_of(Shape{1, 2}, {1, 1});
    HostTensor y = copy_tensor(x.view());
    rope_forward(y.view(), y.view(), pos.view(), cos.view(), sin.view(), ctx);
    for (int i = 0; i < 8; ++i) EXPECT_EQ(y.as<float>()[8 + i], o[i]);
}

TEST(Rope, GradientsMatchFiniteDifferences) {
    const Context ctx = cpu_context();
    Rng rng(51);
    RopeConfig c = llama3_config();
    c.head_dim = 12;
    c.partial_rotary_factor = 0.5;  // R = 6 of 12, with llama3 scaling: every path at once
    const int64_t B = 2, T = 5, Hx = 3, D = 12;
    HostTensor cos = f32(Shape{T + 3, 3}), sin = f32(Shape{T + 3, 3});
    rope_build_table(cos.view(), sin.view(), c);
    HostTensor pos(DType::kI32, Shape{B, T});
    for (int64_t i = 0; i < B * T; ++i) pos.as<int32_t>()[i] = int32_t(rng.integer(0, T + 2));
    for (bool with_positions : {false, true}) {
        const ConstTensorView p = with_positions ? ConstTensorView(pos.view()) : ConstTensorView();
        HostTensor x = random_tensor(rng, Shape{B, T, Hx, D});
        HostTensor out = f32(Shape{B, T, Hx, D}), r = random_tensor(rng, Shape{B, T, Hx, D});
        auto loss = [&] {
            rope_forward(out.view(), x.view(), p, cos.view(), sin.view(), ctx);
            return weighted_sum(out.view(), r.view());
        };
        HostTensor dx = f32(Shape{B, T, Hx, D});
        rope_backward(dx.view(), r.view(), p, cos.view(), sin.view(), ctx);
        EXPECT_TRUE(gradient_matches(x, dx, loss)) << "positions " << with_positions;
        // In place (dx = dout) gives the same.
        HostTensor d2 = copy_tensor(r.view());
        rope_backward(d2.view(), d2.view(), p, cos.view(), sin.view(), ctx);
        for (int64_t i = 0; i < dx.numel(); ++i) EXPECT_EQ(d2.as<float>()[i], dx.as<float>()[i]);
    }
}

// q and k together are the two single ops (in place, GQA head counts, forward and backward), and
// the pair is checked against itself: q and k must share batch, sequence and head dim.
TEST(Rope, QueriesAndKeysTogetherAreTheSingleOps) {
    const Context ctx = cpu_context();
    Rng rng(52);
    RopeConfig c = llama3_config();
    const int64_t B = 2, T = 5, D = 16;
    HostTensor cos = f32(Shape{T, 8}), sin = f32(Shape{T, 8});
    rope_build_table(cos.view(), sin.view(), c);
    const HostTensor q = random_tensor(rng, Shape{B, T, 4, D}),
                     k = random_tensor(rng, Shape{B, T, 2, D});
    for (bool backward : {false, true}) {
        HostTensor q1 = f32(q.shape()), k1 = f32(k.shape());
        HostTensor q2 = copy_tensor(q.view()), k2 = copy_tensor(k.view());
        if (backward) {
            rope_backward(q1.view(), q.view(), {}, cos.view(), sin.view(), ctx);
            rope_backward(k1.view(), k.view(), {}, cos.view(), sin.view(), ctx);
            rope_qk_backward(q2.view(), k2.view(), q2.view(), k2.view(), {}, cos.view(), sin.view(),
                             ctx);
        } else {
            rope_forward(q1.view(), q.view(), {}, cos.view(), sin.view(), ctx);
            rope_forward(k1.view(), k.view(), {}, cos.view(), sin.view(), ctx);
            rope_qk_forward(q2.view(), k2.view(), q2.view(), k2.view(), {}, cos.view(), sin.view(),
                            ctx);
        }
        for (int64_t i = 0; i < q.numel(); ++i) EXPECT_EQ(q2.as<float>()[i], q1.as<float>()[i]);
        for (int64_t i = 0; i < k.numel(); ++i) EXPECT_EQ(k2.as<float>()[i], k1.as<float>()[i]);
    }
}

// The queries and keys of a packed q, k, v buffer rotate as the single ops rotate them; the
// values' heads stay as they were, bit for bit.
TEST(Rope, PackedQueriesAndKeysAreTheSingleOpsAndValuesStay) {
    const Context ctx = cpu_context();
    Rng rng(53);
    RopeConfig c = llama3_config();
    const int64_t B = 2, T = 5, D = 16, H = 4, Hkv = 2;
    HostTensor cos = f32(Shape{T, 8}), sin = f32(Shape{T, 8});
    rope_build_table(cos.view(), sin.view(), c);
    const HostTensor q = random_tensor(rng, Shape{B, T, H, D}),
                     k = random_tensor(rng, Shape{B, T, Hkv, D}),
                     v = random_tensor(rng, Shape{B, T, Hkv, D});
    const HostTensor pos = ids_of(Shape{B, T}, {4, 0, 3, 1, 2, 0, 1, 2, 3, 4});
    for (bool backward : {false, true}) {
        HostTensor q1 = f32(q.shape()), k1 = f32(k.shape());
        HostTensor qkv = pack_heads({q.view(), k.view(), v.view()});
        if (backward) {
            rope_backward(q1.view(), q.view(), pos.view(), cos.view(), sin.view(), ctx);
            rope_backward(k1.view(), k.view(), pos.view(), cos.view(), sin.view(), ctx);
            rope_qkv_backward(qkv.view(), H + Hkv, pos.view(), cos.view(), sin.view(), ctx);
        } else {
            rope_forward(q1.view(), q.view(), pos.view(), cos.view(), sin.view(), ctx);
            rope_forward(k1.view(), k.view(), pos.view(), cos.view(), sin.view(), ctx);
            rope_qkv_forward(qkv.view(), H + Hkv, pos.view(), cos.view(), sin.view(), ctx);
        }
        EXPECT_TRUE(bitwise_equal(take_heads(qkv.view(), 0, H), q1));
        EXPECT_TRUE(bitwise_equal(take_heads(qkv.view(), H, Hkv), k1));
        EXPECT_TRUE(bitwise_equal(take_heads(qkv.view(), H + Hkv, Hkv), v));
    }
}

TEST(RopeDeathTest, PackedQueriesAndKeysLeaveTheValues) {
    HostTensor qkv = f32(Shape{1, 2, 3, 4}), cos = f32(Shape{2, 2}), sin = f32(Shape{2, 2});
    EXPECT_DEATH(rope_qkv_forward(qkv.view(), 3, {}, cos.view(), sin.view(), cpu_context()),
                 "qk_heads 3 of a row of 3 heads");
}

TEST(RopeDeathTest, QueriesAndKeysMustShareBatchAndSequence) {
    RopeConfig c = llama3_config();
    HostTensor cos = f32(Shape{5, 8}), sin = f32(Shape{5, 8});
    rope_build_table(cos.view(), sin.view(), c);
    HostTensor q = f32(Shape{2, 5, 4, 16}), k = f32(Shape{2, 4, 2, 16});
    EXPECT_DEATH(rope_qk_forward(q.view(), k.view(), q.view(), k.view(), {}, cos.view(), sin.view(),
                                 cpu_context()),
                 "rope_qk_forward: q .* and k .* differ in batch, sequence or head dim");
}

TEST(Rope, ValidateNamesTheKey) {
    RopeConfig c;
    c.head_dim = 10;
    c.partial_rotary_factor = 0.25;  // int(2.5) = 2: fine
    EXPECT_TRUE(rope_validate(c).ok());
    c.partial_rotary_factor = 0.3;  // int(3.0) = 3: odd
    EXPECT_NE(rope_validate(c).message().find("rotary_pct"), std::string::npos);
    c = llama3_config();
    c.high_freq_factor = 0.5;
    EXPECT_NE(rope_validate(c).message().find("high_freq_factor"), std::string::npos);
    c = llama3_config();
    c.theta = 0;
    EXPECT_NE(rope_validate(c).message().find("rope_theta"), std::string::npos);
}

}  // namespace
}  // namespace lathe::optest
