#include "run/bench_generate.h"

#include <gtest/gtest.h>

namespace lathe {
namespace {

// Llama-3-8B counted by hand: per layer q and o 4096 x 4096, k and v 1024 x 4096, the MLP's
// three 4096 x 14336, two norms of 4096; 32 layers and the final norm; the untied head 128256 x
// 4096 (the embedding table is a lookup, not counted).
constexpr double kLayer = 2.0 * 4096 * 4096 + 2.0 * 1024 * 4096 + 3.0 * 4096 * 14336 + 2 * 4096;
constexpr double kBody = 32 * kLayer + 4096;
constexpr double kHead = 128256.0 * 4096;

TEST(BenchGenerate, PrefillFlopsOfLlama3_8b) {
    auto c = bench_model_config("llama3-8b", std::nullopt);
    ASSERT_TRUE(c.ok()) << c.status().message();
    EXPECT_EQ(bench_flop_parameters(*c), int64_t(kBody + kHead));
    for (const int64_t T : {int64_t(1), int64_t(4096), int64_t(32768)}) {
        // Causal attention: query t sees t + 1 keys; QK^T and PV cost 2 D each per pair, per head
        // (32 of 128) and layer.
        const double pairs = double(T) * double(T + 1) / 2.0;
        const double attention = 32.0 * 32.0 * 2.0 * (2.0 * 128.0) * pairs;
        const double want = 2.0 * kBody * double(T) + 2.0 * kHead + attention;
        EXPECT_DOUBLE_EQ(generate_prefill_flops(*c, T), want) << T;
    }
}

TEST(BenchGenerate, DecodeBytesAreWeightsPlusCacheAtTheLengths) {
    auto c = bench_model_config("llama3-8b", std::nullopt);
    ASSERT_TRUE(c.ok());
    EXPECT_DOUBLE_EQ(generate_weight_bytes(*c, 2), 2.0 * (kBody + kHead));
    // Keys and values, 8 KV heads of 128, 32 layers, bf16: 128 KiB a position.
    EXPECT_DOUBLE_EQ(generate_kv_bytes_per_position(*c, 2), 131072.0);
    const std::vector<int64_t> lengths{1025, 1025, 2000};
    EXPECT_DOUBLE_EQ(generate_step_bytes(*c, 2, lengths),
                     2.0 * (kBody + kHead) + 131072.0 * (1025 + 1025 + 2000));
    EXPECT_DOUBLE_EQ(generate_step_bytes(*c, 4, {}), 4.0 * (kBody + kHead));
}

TEST(BenchGenerate, TiedHeadCountsTheEmbeddingOnce) {
    auto c = bench_model_config("tiny", std::nullopt);
    ASSERT_TRUE(c.ok());
    // tiny: V 512, C 64, tied: the head is the embedding matrix, read once per step.
    const double head = 512.0 * 64;
    EXPECT_DOUBLE_EQ(generate_weight_bytes(*c, 4), 4.0 * double(bench_flop_parameters(*c)));
    EXPECT_DOUBLE_EQ(generate_prefill_flops(*c, 1) - 2.0 * head,
                     2.0 * (double(bench_flop_parameters(*c)) - head) + 2.0 * 2 * 4 * 16 * 2);
}

TEST(BenchGenerate, LengthLists) {
    auto a = parse_length_list("4096,32768", "--prefill");
    ASSERT_TRUE(a.ok());
    EXPECT_EQ(*a, (std::vector<int64_t>{4096, 32768}));
    auto empty = parse_length_list("", "--prefill");
    ASSERT_TRUE(empty.ok());
    EXPECT_TRUE(empty->empty());
    for (const char* bad : {"0", "1,,2", "-3", "1,x", "16,", "1.5", "99999999999999999999999"}) {
        auto r = parse_length_list(bad, "--decode-batches");
        ASSERT_FALSE(r.ok()) << bad;
        EXPECT_NE(r.status().message().find("--decode-batches"), std::string::npos) << bad;
    }
}

TEST(BenchGenerate, BadRequestsAreErrorsNamingTheFlag) {
    GenerateBenchRequest r;
    r.model = "tiny";
    r.device = BenchDevice::kCpu;
    r.prefill = {300};  // tiny has 256 positions
    r.decode_batches = {};
    auto long_prefill = bench_generate_run(r);
    ASSERT_FALSE(long_prefill.ok());
    EXPECT_NE(long_prefill.status().message().find("--prefill"), std::string::npos);
    r.prefill = {};
    r.decode_batches = {1};
    r.prompt_len = 250;
    r.decode_steps = 8;
    auto long_decode = bench_generate_run(r);
    ASSERT_FALSE(long_decode.ok());
    EXPECT_NE(long_decode.status().message().find("--prompt-len"), std::string::npos);
    r.decode_batches = {};
    auto nothing = bench_generate_run(r);
    ASSERT_FALSE(nothing.ok());
    EXPECT_NE(nothing.status().message().find("nothing to measure"), std::string::npos);
}

}  // namespace
}  // namespace lathe
