// The paged KV cache (paged_kv_cache.h): the block pool and free list; the engine on a paged
// cache against Model::logits of one full forward (prefill in chunks that cross block edges,
// then decode) and against the row cache with several sequences in one step; the scheduler
// admitting by free blocks.
// Tolerance: as engine_test.cpp, (L + 1) K f32 eps relative (both paths run the same f32 ops up
// to the attention's summation order).
#include "infer/paged_kv_cache.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <limits>

#include "infer/engine.h"
#include "infer/engine_test_util.h"
#include "infer/scheduler.h"
#include "model/model_fixture_test_util.h"
#include "model/model_io.h"

namespace lathe {
namespace {

TEST(PagedKvCache, BlocksComeFromAndReturnToTheFreeList) {
    PagedKvShape s{1, 4, 3, 2, 2};  // 4 blocks of 3 positions, (2, 2) per position
    Result<PagedKvCache> made = PagedKvCache::create(s);
    ASSERT_TRUE(made.ok());
    PagedKvCache& c = *made;
    const SeqId a = c.open(), b = c.open();
    EXPECT_EQ(c.free_blocks(), 4);
    ASSERT_TRUE(c.reserve(a, 4).ok());  // 2 blocks
    EXPECT_EQ(c.table(a).size(), 2u);
    ASSERT_TRUE(c.reserve(b, 3).ok());  // 1 block
    EXPECT_EQ(c.free_blocks(), 1);
    // Short of blocks: nothing is taken.
    const Status full = c.reserve(b, 7);
    EXPECT_EQ(full.code(), StatusCode::kFailedPrecondition);
    EXPECT_EQ(c.table(b).size(), 1u);
    EXPECT_EQ(c.free_blocks(), 1);
    // Positions land in their blocks; gather reads them back in order.
    for (int64_t p = 0; p < 4; ++p) {
        for (int i = 0; i < 4; ++i) {
            c.key(0, a, p)[i] = float(10 * p + i);
            c.value(0, a, p)[i] = -float(10 * p + i);
        }
    }
    c.set_length(a, 4);
    std::vector<float> k(16), v(16);
    c.gather(0, a, 4, k.data(), v.data());
    for (int64_t p = 0; p < 4; ++p) {
        for (int i = 0; i < 4; ++i) {
            EXPECT_EQ(k[size_t(p * 4 + i)], float(10 * p + i));
            EXPECT_EQ(v[size_t(p * 4 + i)], -float(10 * p + i));
        }
    }
    EXPECT_NE(c.table(a)[0], c.table(b)[0]);
    c.close(a);
    EXPECT_EQ(c.free_blocks(), 3);
    EXPECT_EQ(c.open_sequences(), 1);
    const SeqId d = c.open();
    EXPECT_EQ(d, a);  // the closed sequence's id serves again
    EXPECT_EQ(c.length(d), 0);
    EXPECT_TRUE(c.table(d).empty());
    ASSERT_TRUE(c.reserve(d, 9).ok());  // the freed blocks serve again
    EXPECT_EQ(c.free_blocks(), 0);
    // Opening and closing many times uses no more ids than were open at once.
    c.close(d);
    for (int i = 0; i < 1000; ++i) {
        const SeqId x = c.open();
        EXPECT_LE(x, 1);
        c.close(x);
    }
    EXPECT_EQ(c.open_sequences(), 1);
    EXPECT_FALSE(PagedKvCache::create(PagedKvShape{1, 0, 3, 2, 2}).ok());
}

// slot(seq, pos) names the pool row that key(layer, seq, pos) points at, and keys(layer) /
// values(layer) view the pools the kv_rows_* and attention_decode_paged ops read (what the CUDA
// engine uploads as a step's slots and tables).
TEST(PagedKvCache, SlotsAndPoolViewsNameTheRowsKeyPointsAt) {
    PagedKvShape s{2, 5, 3, 2, 2};
    Result<PagedKvCache> made = PagedKvCache::create(s);
    ASSERT_TRUE(made.ok());
    PagedKvCache& c = *made;
    EXPECT_FALSE(c.on_device());
    const SeqId a = c.open(), b = c.open();
    ASSERT_TRUE(c.reserve(a, 2).ok());
    ASSERT_TRUE(c.reserve(b, 4).ok());
    ASSERT_TRUE(c.reserve(a, 7).ok());  // a's blocks interleave with b's
    const TensorView keys = c.keys(1), values = c.values(1);
    EXPECT_EQ(keys.shape(), (Shape{5, 3, 2, 2}));
    for (SeqId seq : {a, b}) {
        for (int64_t p = 0; p < int64_t(c.table(seq).size()) * 3; ++p) {
            const int32_t slot = c.slot(seq, p);
            EXPECT_EQ(slot, c.table(seq)[size_t(p / 3)] * 3 + p % 3);
            EXPECT_EQ(c.key(1, seq, p), keys.as<float>() + slot * 4);
            EXPECT_EQ(c.value(1, seq, p), values.as<float>() + slot * 4);
        }
    }
    EXPECT_FALSE(PagedKvCache::create(PagedKvShape{1, int64_t(1) << 30, 4, 1, 1}).ok());
}

using engine_test::load;
using engine_test::Loaded;

double error_of(std::span<const float> got, std::span<const float> want) {
    const int64_t V = int64_t(want.size());
    return model_fixture::rel_error(
        ConstTensorView(got.data(), DType::kF32, Shape{V}, Device::kCpu),
        ConstTensorView(want.data(), DType::kF32, Shape{V}, Device::kCpu));
}

InferenceEngine make(const Model& m, int64_t seqs, int64_t max_len, int64_t block, int64_t blocks,
                     int64_t chunk = 3) {
    EngineLimits lim;
    lim.max_sequences = seqs;
    lim.max_len = max_len;
    lim.prefill_chunk = chunk;
    lim.kv_block_size = block;
    lim.kv_blocks = blocks;
    Result<InferenceEngine> e = InferenceEngine::create(m, lim);
    LATHE_CHECK(e.ok(), "{}", e.status().to_string());
    return std::move(*e);
}

// The scheduler tests' reference: generate() on the row cache, one prompt at a time, greedy, five
// new tokens each.
Result<std::vector<GenerateResult>> greedy_five(const Model& m, int64_t max_len,
                                                const std::vector<std::vector<int32_t>>& prompts) {
    InferenceEngine ref = make(m, 1, max_len, 0, 0);
    GenerateOptions o;
    o.sampling.temperature = 0;
    o.max_new_tokens = 5;
    return generate(ref, prompts, o, {});
}

class PagedEngine : public ::testing::TestWithParam<std::string> {};

TEST_P(PagedEngine, EqualsTheFullForwardAndTheRowCache) {
    Loaded L = load(GetParam());
    const int64_t T = L.f.T, V = L.f.config.vocab_size, P = T / 2;
    const float* full = L.logits.view().as<float>();
    // Blocks of 2 positions, chunks of 3: every chunk and step crosses block edges.
    InferenceEngine e = make(L.model, 3, T, 2, 0);
    ASSERT_TRUE(e.paged());
    const SeqId s = *e.open();
    std::vector<float> logits(static_cast<size_t>(V));
    ASSERT_TRUE(e.prefill(s, std::span(L.tokens).first(size_t(P)), logits).ok());
    EXPECT_LE(error_of(logits, {full + (P - 1) * V, size_t(V)}), L.tol);
    for (int64_t t = P; t < T; ++t) {
        const DecodeStep step{s, L.tokens[size_t(t)]};
        ASSERT_TRUE(e.decode({&step, 1}, logits).ok());
        EXPECT_LE(error_of(logits, {full + t * V, size_t(V)}), L.tol) << "position " << t;
    }
    e.close(s);
    EXPECT_EQ(e.paged_cache().free_blocks(), e.kv_total_blocks());

    // Three sequences of different lengths in one step, one leaving mid-way, against the row
    // cache doing the same.
    InferenceEngine rows = make(L.model, 3, T, 0, 0);
    InferenceEngine paged = make(L.model, 3, T, 2, 0);
    const std::vector<int64_t> lens = {2, 5, 3};
    std::vector<SeqId> a, b;
    std::vector<float> la(static_cast<size_t>(V)), lb(static_cast<size_t>(V));
    for (int64_t n : lens) {
        a.push_back(*rows.open());
        b.push_back(*paged.open());
        const auto prompt = std::span(L.tokens).subspan(size_t(T - n - 3), size_t(n));
        ASSERT_TRUE(rows.prefill(a.back(), prompt, la).ok());
        ASSERT_TRUE(paged.prefill(b.back(), prompt, lb).ok());
        EXPECT_LE(error_of(lb, la), L.tol);
    }
    for (int step = 0; step < 3; ++step) {
        if (step == 2) {  // the middle one leaves
            rows.close(a[1]);
            paged.close(b[1]);
            a.erase(a.begin() + 1);
            b.erase(b.begin() + 1);
        }
        std::vector<DecodeStep> sa, sb;
        for (size_t i = 0; i < a.size(); ++i) {
            sa.push_back({a[i], L.tokens[i + size_t(step)]});
            sb.push_back({b[i], L.tokens[i + size_t(step)]});
        }
        std::vector<float> ra(a.size() * size_t(V)), rb(b.size() * size_t(V));
        ASSERT_TRUE(rows.decode(sa, ra).ok());
        ASSERT_TRUE(paged.decode(sb, rb).ok());
        for (size_t i = 0; i < a.size(); ++i) {
            EXPECT_LE(error_of({rb.data() + i * size_t(V), size_t(V)},
                               {ra.data() + i * size_t(V), size_t(V)}),
                      L.tol)
                << "step " << step << " row " << i;
        }
    }
}

// Several new sequences prefilled in one forward (prefill_many: prompts of 5, 1 and 3 tokens
// padded to 5), then decoded together: every row the full forward's at its position.
TEST_P(PagedEngine, PrefillManyEqualsTheFullForward) {
    Loaded L = load(GetParam());
    const int64_t T = L.f.T, V = L.f.config.vocab_size;
    const float* full = L.logits.view().as<float>();
    InferenceEngine e = make(L.model, 3, T, 2, 0, 15);
    const std::vector<int64_t> lens = {5, 1, 3};
    std::vector<SeqId> seqs;
    std::vector<std::span<const int32_t>> prompts;
    for (int64_t n : lens) {
        seqs.push_back(*e.open());
        prompts.push_back(std::span<const int32_t>(L.tokens).first(size_t(n)));
    }
    EXPECT_TRUE(e.prefill_many_fits(lens));
    std::vector<float> logits(lens.size() * size_t(V));
    const Status s = e.prefill_many(seqs, prompts, logits);
    ASSERT_TRUE(s.ok()) << s.to_string();
    std::vector<int64_t> pos = lens;
    for (size_t b = 0; b < lens.size(); ++b) {
        EXPECT_EQ(e.length(seqs[b]), lens[b]);
        EXPECT_LE(error_of({logits.data() + b * size_t(V), size_t(V)},
                           {full + (lens[b] - 1) * V, size_t(V)}),
                  L.tol)
            << "prompt " << b;
    }
    for (int step = 0; step < 3; ++step) {
        std::vector<DecodeStep> steps;
        for (size_t b = 0; b < lens.size(); ++b)
            steps.push_back({seqs[b], L.tokens[size_t(pos[b])]});
        ASSERT_TRUE(e.decode(steps, logits).ok());
        for (size_t b = 0; b < lens.size(); ++b) {
            EXPECT_LE(error_of({logits.data() + b * size_t(V), size_t(V)},
                               {full + pos[b] * V, size_t(V)}),
                      L.tol)
                << "step " << step << " sequence " << b;
            ++pos[b];
        }
    }
}

INSTANTIATE_TEST_SUITE_P(Families, PagedEngine,
                         ::testing::Values("llama", "mistral", "gpt_neox", "gpt2"));

TEST(PagedEngine, PoolLimitsAndErrors) {
    Loaded L = load("llama");
    const int64_t T = L.f.T, V = L.f.config.vocab_size;
    InferenceEngine e = make(L.model, 2, T, 4, 3);  // 12 positions in all
    const SeqId a = *e.open(), b = *e.open();
    std::vector<float> logits(static_cast<size_t>(V));
    ASSERT_TRUE(e.prefill(a, std::span(L.tokens).first(8), logits).ok());  // 2 blocks
    const Status s = e.prefill(b, std::span(L.tokens).first(5), logits);   // 2 more: 1 free
    EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.to_string();
    ASSERT_TRUE(e.prefill(b, std::span(L.tokens).first(4), logits).ok());
    // a at 8 needs a third block for position 8, b at 4 a second: 2 needed, 0 free.
    std::vector<float> two(2 * static_cast<size_t>(V));
    const DecodeStep steps[2] = {{a, 1}, {b, 2}};
    EXPECT_EQ(e.decode(steps, two).code(), StatusCode::kFailedPrecondition);
    EXPECT_EQ(e.length(a), 8);  // nothing happened
    e.close(b);
    ASSERT_TRUE(e.decode({steps, 1}, logits).ok());
    EXPECT_EQ(e.length(a), 9);
    EXPECT_EQ(e.open().status().ok(), true);
}

TEST(PagedScheduler, AdmitsByFreeBlocksAndGivesGeneratesTokens) {
    Loaded L = load("llama");
    const int64_t T = L.f.T;
    const std::vector<std::vector<int32_t>> prompts = {{L.tokens.begin(), L.tokens.begin() + 3},
                                                       {L.tokens.begin() + 1, L.tokens.begin() + 6},
                                                       {L.tokens[2]}};
    const Result<std::vector<GenerateResult>> want = greedy_five(L.model, T, prompts);
    ASSERT_TRUE(want.ok());
    // Blocks of 4; prompt + 5 tokens need 2, 3 and 2 blocks; a pool of 3 holds one of them at a
    // time, though the engine could open three.
    InferenceEngine e = make(L.model, 3, T, 4, 3);
    Scheduler sched(e, {}, 8);
    std::vector<std::shared_ptr<SequenceTicket>> tickets;
    for (const auto& p : prompts) {
        SequenceParams sp;
        sp.prompt = p;
        sp.sampling.temperature = 0;
        sp.max_tokens = 5;
        auto t = sched.submit({sp});
        ASSERT_TRUE(t.ok()) << t.status().to_string();
        tickets.push_back((*t)[0]);
    }
    sched.step();
    EXPECT_EQ(e.open_sequences(), 1);  // 3 + 5 -> 2 blocks; 5 + 5 -> 3 more do not fit
    EXPECT_EQ(sched.stats().waiting, 2);
    while (sched.step()) {
    }
    for (size_t i = 0; i < prompts.size(); ++i)
        EXPECT_EQ(tickets[i]->snapshot().ids, (*want)[i].ids) << i;
    EXPECT_EQ(e.paged_cache().free_blocks(), 3);
    // The queue keeps its order: the third waits behind the second, so each runs alone, 4
    // decode steps after its prefill's token.
    EXPECT_EQ(sched.stats().decode_steps, 12);
    // More than the whole pool can ever hold: refused.
    SequenceParams big;
    big.prompt = {1, 2, 3};
    big.max_tokens = 10;  // 13 positions: 4 blocks
    auto r = sched.submit({big});
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("KV blocks"), std::string::npos);
}

// Sequences admitted together prefill in one forward (prefill_many) where the engine takes them,
// and generate()'s tokens come out: four prompts of 4, 5, 4 and 3 tokens padded to 5 (20 rows, the
// chunk; 4 of them padding, the most a group may waste); then the same with the second asking for
// prompt log-probabilities, which prefills alone (prefill_all): the first alone, the second alone,
// the last two together.
TEST(PagedScheduler, NewSequencesPrefillTogetherAndGiveGeneratesTokens) {
    Loaded L = load("llama");
    const int64_t T = L.f.T;
    const auto sub = [&](size_t a, size_t n) {
        return std::vector<int32_t>(L.tokens.begin() + long(a), L.tokens.begin() + long(a + n));
    };
    const std::vector<std::vector<int32_t>> prompts = {sub(0, 4), sub(1, 5), sub(2, 4), sub(3, 3)};
    const Result<std::vector<GenerateResult>> want = greedy_five(L.model, T, prompts);
    ASSERT_TRUE(want.ok());
    for (const bool logprobs : {false, true}) {
        SCOPED_TRACE(logprobs ? "the second with prompt log-probabilities" : "all together");
        InferenceEngine e = make(L.model, 4, T, 4, 0, 20);
        Scheduler sched(e, {}, 8);
        std::vector<std::shared_ptr<SequenceTicket>> tickets;
        for (size_t i = 0; i < prompts.size(); ++i) {
            SequenceParams sp;
            sp.prompt = prompts[i];
            sp.sampling.temperature = 0;
            sp.max_tokens = 5;
            sp.prompt_logprobs = logprobs && i == 1;
            auto t = sched.submit({sp});
            ASSERT_TRUE(t.ok()) << t.status().to_string();
            tickets.push_back((*t)[0]);
        }
        while (sched.step()) {
        }
        for (size_t i = 0; i < prompts.size(); ++i)
            EXPECT_EQ(tickets[i]->snapshot().ids, (*want)[i].ids) << i;
        EXPECT_EQ(sched.stats().prefill_calls, logprobs ? 3 : 1);
        EXPECT_EQ(sched.stats().decode_steps, 4);  // all four step together
        // The engine thread's busy time holds its prefills and decode steps.
        const SchedulerStats st = sched.stats();
        EXPECT_GE(st.step_seconds, st.prefill_seconds + st.decode_seconds);
        if (logprobs) {
            EXPECT_EQ(tickets[1]->snapshot().prompt.size(), prompts[1].size());
        }
        EXPECT_EQ(e.paged_cache().free_blocks(), e.kv_total_blocks());
    }
}

// prefill_many refuses, and takes nothing: the row cache, a sequence that holds tokens or is
// listed twice, a batch over the prefill chunk, a token outside the vocabulary, a pool too short.
TEST(PagedEngine, PrefillManyErrors) {
    Loaded L = load("llama");
    const int64_t T = L.f.T, V = L.f.config.vocab_size;
    const std::span<const int32_t> four = std::span<const int32_t>(L.tokens).first(4);
    std::vector<float> one(static_cast<size_t>(V)), two(2 * static_cast<size_t>(V));
    {
        InferenceEngine rows = make(L.model, 2, T, 0, 0);
        const SeqId a = *rows.open(), b = *rows.open();
        const SeqId ab[2] = {a, b};
        const std::span<const int32_t> p[2] = {four, four};
        EXPECT_EQ(rows.prefill_many(ab, p, two).code(), StatusCode::kInvalidArgument);
        const int64_t n[2] = {4, 4};
        EXPECT_FALSE(rows.prefill_many_fits(n));
    }
    EngineLimits lim;
    lim.max_sequences = 2;
    lim.max_len = T;
    lim.prefill_chunk = 8;
    lim.kv_block_size = 4;
    lim.kv_blocks = 3;  // 12 positions
    Result<InferenceEngine> r = InferenceEngine::create(L.model, lim);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    InferenceEngine& e = *r;
    const SeqId a = *e.open(), b = *e.open();
    const SeqId ab[2] = {a, b}, aa[2] = {a, a};
    const std::span<const int32_t> p44[2] = {four, four};
    const std::span<const int32_t> p45[2] = {four, std::span<const int32_t>(L.tokens).first(5)};
    EXPECT_EQ(e.prefill_many(aa, p44, two).code(), StatusCode::kInvalidArgument);  // twice
    EXPECT_EQ(e.prefill_many(ab, p45, two).code(), StatusCode::kInvalidArgument);  // 2 x 5 > 8
    const int64_t n45[2] = {4, 5}, n44[2] = {4, 4}, n11[2] = {1, 1}, n12[2] = {1, 2};
    EXPECT_FALSE(e.prefill_many_fits(n45));
    EXPECT_TRUE(e.prefill_many_fits(n44));
    EXPECT_FALSE(e.prefill_many_fits(n11));  // one-token prompts prefill alone
    EXPECT_TRUE(e.prefill_many_fits(n12));
    const std::span<const int32_t> p11[2] = {four.first(1), four.first(1)};
    EXPECT_EQ(e.prefill_many(ab, p11, two).code(), StatusCode::kInvalidArgument);
    std::vector<int32_t> bad(four.begin(), four.end());
    bad[2] = int32_t(V);
    const std::span<const int32_t> pbad[2] = {four, bad};
    EXPECT_EQ(e.prefill_many(ab, pbad, two).code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(e.prefill_many(ab, p44, one).code(), StatusCode::kInvalidArgument);  // logits
    EXPECT_EQ(e.paged_cache().free_blocks(), 3);
    const std::span<const int32_t> p5 = std::span<const int32_t>(L.tokens).first(5);
    const std::span<const int32_t> p8 = std::span<const int32_t>(L.tokens).first(8);
    const std::span<const int32_t> p9 = std::span<const int32_t>(L.tokens).first(9);
    EXPECT_FALSE(e.prefill_many_fits(std::vector<int64_t>{9}));  // 9 > the 8-token chunk
    EXPECT_EQ(e.prefill_many({&a, 1}, {&p9, 1}, one).code(), StatusCode::kInvalidArgument);
    ASSERT_TRUE(e.prefill(a, p8, one).ok());  // 2 of the 3 blocks
    EXPECT_EQ(e.prefill_many({&a, 1}, {&four, 1}, one).code(),
              StatusCode::kInvalidArgument);  // a holds tokens
    EXPECT_EQ(e.prefill_many({&b, 1}, {&p5, 1}, one).code(),
              StatusCode::kFailedPrecondition);  // 2 blocks, 1 free
    EXPECT_EQ(e.paged_cache().free_blocks(), 1);
    EXPECT_EQ(e.length(b), 0);
    EXPECT_TRUE(e.prefill_many({&b, 1}, {&four, 1}, one).ok());  // 1 block
    EXPECT_EQ(e.paged_cache().free_blocks(), 0);
    EXPECT_EQ(e.length(b), 4);
}

}  // namespace
}  // namespace lathe
