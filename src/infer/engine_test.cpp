// The inference engine on the CPU against Model::logits on the transformers parity fixtures
// (tests/fixtures/models): a prompt prefilled in chunks, then token by token decoding, must give
// each position's logits row of one full forward; sequences of different lengths decoded in one
// step (and a sequence leaving mid-way, its row taken by another) give their own rows; bad input
// comes back as errors.
//
// Tolerance: both paths run the same f32 ops; they differ only in summation order (attention
// over a cache, the decode kernel, GEMM shapes). Each of the L blocks and the LM head adds an
// error of at most about K eps relative to the logits' scale, K the longest reduction (the MLP
// width F, the hidden size C, or the sequence): (L + 1) K eps.
#include "infer/engine.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <limits>

#include "infer/engine_test_util.h"
#include "model/model_fixture_test_util.h"
#include "model/model_io.h"

namespace lathe {
namespace {

using engine_test::load;
using engine_test::Loaded;

double row_error(const Loaded& L, int64_t t, std::span<const float> got) {
    const int64_t V = L.f.config.vocab_size;
    return model_fixture::rel_error(
        ConstTensorView(got.data(), DType::kF32, Shape{V}, Device::kCpu),
        L.logits.view().reshape(Shape{L.f.T, V}).slice(t, t + 1).reshape(Shape{V}));
}

class EngineParity : public ::testing::TestWithParam<std::string> {};

TEST_P(EngineParity, PrefillInChunksThenDecodeEqualsFullForward) {
    Loaded L = load(GetParam());
    const int64_t T = L.f.T, V = L.f.config.vocab_size, P = T / 2;
    EngineLimits lim;
    lim.max_sequences = 1;
    lim.max_len = T;
    lim.prefill_chunk = 3;  // the prompt goes in several chunks, each at an offset
    Result<InferenceEngine> e = InferenceEngine::create(L.model, lim);
    ASSERT_TRUE(e.ok()) << e.status().to_string();
    const SeqId s = *e->open();
    std::vector<float> logits(static_cast<size_t>(V));
    ASSERT_TRUE(e->prefill(s, std::span(L.tokens).first(size_t(P)), logits).ok());
    EXPECT_LE(row_error(L, P - 1, logits), L.tol) << "prefill, position " << P - 1;
    for (int64_t t = P; t < T; ++t) {
        const DecodeStep step{s, L.tokens[size_t(t)]};
        ASSERT_TRUE(e->decode(std::span(&step, 1), logits).ok());
        EXPECT_LE(row_error(L, t, logits), L.tol) << "decode, position " << t;
    }
    EXPECT_EQ(e->length(s), T);
}

TEST_P(EngineParity, SequencesOfDifferentLengthsShareDecodeSteps) {
    Loaded L = load(GetParam());
    const int64_t T = L.f.T, V = L.f.config.vocab_size;
    EngineLimits lim;
    lim.max_sequences = 3;
    lim.max_len = T;
    lim.prefill_chunk = 8;
    Result<InferenceEngine> e = InferenceEngine::create(L.model, lim);
    ASSERT_TRUE(e.ok()) << e.status().to_string();
    // Three copies of the sequence at prompt lengths 1, 5 and 3; all step together; the second
    // leaves after two steps (the third's row moves into its place).
    const int64_t starts[3] = {1, 5, 3};  // 1: a one-token prompt
    SeqId seq[3];
    int64_t pos[3];
    std::vector<float> one(static_cast<size_t>(V));
    for (int i = 0; i < 3; ++i) {
        seq[i] = *e->open();
        ASSERT_TRUE(e->prefill(seq[i], std::span(L.tokens).first(size_t(starts[i])), one).ok());
        EXPECT_LE(row_error(L, starts[i] - 1, one), L.tol);
        pos[i] = starts[i];
    }
    for (int step = 0; step < 4; ++step) {
        std::vector<DecodeStep> steps;
        std::vector<int> who;
        // Listed in reverse order: the logits rows follow the steps, not the cache rows.
        for (int i = 2; i >= 0; --i) {
            if (!e->cache().is_open(seq[i])) continue;
            steps.push_back(DecodeStep{seq[i], L.tokens[size_t(pos[i])]});
            who.push_back(i);
        }
        std::vector<float> logits(steps.size() * size_t(V));
        const auto t0 = std::chrono::steady_clock::now();
        ASSERT_TRUE(e->decode(steps, logits).ok());
        const double wall =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        // The three stretches are disjoint parts of the call, in order.
        const InferenceEngine::DecodeTimes& part = e->last_decode_times();
        EXPECT_GE(part.inputs, 0.0);
        EXPECT_GT(part.forward, 0.0);
        EXPECT_GE(part.widen, 0.0);
        EXPECT_LE(part.inputs + part.forward + part.widen, wall);
        for (size_t k = 0; k < who.size(); ++k) {
            const int i = who[k];
            EXPECT_LE(row_error(L, pos[i], std::span(logits).subspan(k * size_t(V), size_t(V))),
                      L.tol)
                << "sequence " << i << " position " << pos[i];
            ++pos[i];
        }
        if (step == 1) e->close(seq[1]);
    }
}

INSTANTIATE_TEST_SUITE_P(Families, EngineParity,
                         ::testing::Values("llama", "llama_bias_packed", "mistral", "qwen2",
                                           "gpt_neox", "gpt_neox_sequential", "gpt2"));

TEST(Engine, BadInputComesBackAsErrors) {
    Loaded L = load("llama");
    const int64_t V = L.f.config.vocab_size;
    EngineLimits lim;
    lim.max_sequences = 2;
    lim.max_len = 4;
    Result<InferenceEngine> e = InferenceEngine::create(L.model, lim);
    ASSERT_TRUE(e.ok());
    std::vector<float> logits(static_cast<size_t>(V));
    const SeqId a = *e->open();
    const std::vector<int32_t> bad = {1, int32_t(V)};
    Status s = e->prefill(a, bad, logits);
    EXPECT_NE(s.message().find("outside the vocabulary"), std::string::npos) << s.to_string();
    EXPECT_EQ(e->length(a), 0);
    const std::vector<int32_t> five = {1, 2, 3, 4, 5};
    s = e->prefill(a, five, logits);
    EXPECT_NE(s.message().find("4-token context"), std::string::npos) << s.to_string();
    EXPECT_FALSE(e->prefill(a, {}, logits).ok());
    // A sequence never prefilled cannot decode; every open sequence must step.
    const SeqId b = *e->open();
    const std::vector<int32_t> two = {1, 2};
    ASSERT_TRUE(e->prefill(a, two, logits).ok());
    std::vector<float> rows(2 * static_cast<size_t>(V));
    const DecodeStep both[2] = {{a, 3}, {b, 3}};
    s = e->decode(both, rows);
    EXPECT_NE(s.message().find("no prompt"), std::string::npos) << s.to_string();
    const DecodeStep only_a[1] = {{a, 3}};
    s = e->decode(only_a, logits);
    EXPECT_NE(s.message().find("every open sequence"), std::string::npos) << s.to_string();
    e->close(b);
    ASSERT_TRUE(e->decode(only_a, logits).ok());
    ASSERT_TRUE(e->decode(only_a, logits).ok());  // length 4 = max_len now
    s = e->decode(only_a, logits);
    EXPECT_NE(s.message().find("fills its 4-token context"), std::string::npos) << s.to_string();
    EngineLimits too_long;
    too_long.max_len = L.f.config.max_position_embeddings + 1;
    EXPECT_FALSE(InferenceEngine::create(L.model, too_long).ok());
}

// --peer-reduce's names round-trip (the words of --decode-gemv); any other text is an error naming
// the flag. The CPU engine has no GPU sums to route: every mode opens and reports none.
TEST(Engine, PeerReduceModes) {
    for (PeerReduce m : {PeerReduce::kOff, PeerReduce::kOn, PeerReduce::kAuto}) {
        const Result<PeerReduce> back = peer_reduce_parse(peer_reduce_name(m), "--peer-reduce");
        ASSERT_TRUE(back.ok());
        EXPECT_EQ(*back, m);
    }
    EXPECT_EQ(peer_reduce_name(PeerReduce::kAuto), "auto");
    const Result<PeerReduce> bad = peer_reduce_parse("nvlink", "--peer-reduce");
    ASSERT_FALSE(bad.ok());
    EXPECT_NE(bad.status().message().find("--peer-reduce must be auto, on or off, got 'nvlink'"),
              std::string::npos)
        << bad.status().to_string();
    engine_test::Loaded L = engine_test::load("llama");
    for (PeerReduce m : {PeerReduce::kOff, PeerReduce::kOn, PeerReduce::kAuto}) {
        EngineLimits lim;
        lim.peer_reduce = m;
        Result<InferenceEngine> e = InferenceEngine::create(L.model, lim);
        ASSERT_TRUE(e.ok()) << e.status().to_string();
        EXPECT_FALSE(e->peer_all_reduce());
    }
}

// --decode-gemv's names round-trip; any other text is an error naming the flag. The CPU engine
// takes every mode (it has one GEMM) and computes the same logits.
TEST(Engine, DecodeGemvModes) {
    for (DecodeGemv m : {DecodeGemv::kOff, DecodeGemv::kOn, DecodeGemv::kAuto}) {
        const Result<DecodeGemv> back = decode_gemv_parse(decode_gemv_name(m), "--decode-gemv");
        ASSERT_TRUE(back.ok());
        EXPECT_EQ(*back, m);
    }
    const Result<DecodeGemv> bad = decode_gemv_parse("fast", "--decode-gemv");
    ASSERT_FALSE(bad.ok());
    EXPECT_NE(bad.status().message().find("--decode-gemv must be auto, on or off, got 'fast'"),
              std::string::npos)
        << bad.status().to_string();
    engine_test::Loaded L = engine_test::load("llama");
    const int64_t V = L.f.config.vocab_size;
    std::vector<std::vector<float>> out;
    for (DecodeGemv m : {DecodeGemv::kOff, DecodeGemv::kOn}) {
        EngineLimits lim;
        lim.max_len = 8;
        lim.decode_gemv = m;
        Result<InferenceEngine> e = InferenceEngine::create(L.model, lim);
        ASSERT_TRUE(e.ok()) << e.status().to_string();
        const SeqId s = *e->open();
        std::vector<float> z(static_cast<size_t>(V));
        ASSERT_TRUE(e->prefill(s, std::span(L.tokens.data(), 3), z).ok());
        const DecodeStep step{s, L.tokens[3]};
        ASSERT_TRUE(e->decode(std::span(&step, 1), z).ok());
        out.push_back(z);
    }
    EXPECT_EQ(out[0], out[1]);
}

}  // namespace
}  // namespace lathe
