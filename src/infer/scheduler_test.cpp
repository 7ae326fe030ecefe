// The continuous-batching scheduler (scheduler.h) and the engine's all-position prefill, on the
// CPU with the llama parity fixture (tests/fixtures/models/llama):
//   - prefill_all's rows equal Model::logits of one full forward at every position;
//   - sequences that join and leave a running batch (more sequences than the engine holds)
//     produce exactly generate()'s tokens, greedy and seeded, stepped by hand and from threads;
//   - log-probabilities (prompt and new tokens) are log_softmax of the full forward's logits;
//   - the bounded queue, validation errors, cancellation, stop strings and shutdown.
// Tolerance of logits and log-probabilities: as engine_test.cpp, (L + 1) K f32 eps relative to the
// logits' scale K the longest reduction; a log-softmax adds the log-sum-exp's error, of the
// same order, so log-probabilities use twice that bound times the largest |logit|.
#include "infer/scheduler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <thread>

#include "infer/engine_test_util.h"
#include "model/model_fixture_test_util.h"
#include "model/model_io.h"

namespace lathe {
namespace {

using engine_test::load;
using engine_test::Loaded;

InferenceEngine engine_of(const Model& model, int64_t seqs, int64_t max_len, int64_t chunk) {
    EngineLimits lim;
    lim.max_sequences = seqs;
    lim.max_len = max_len;
    lim.prefill_chunk = chunk;
    Result<InferenceEngine> e = InferenceEngine::create(model, lim);
    LATHE_CHECK(e.ok(), "{}", e.status().to_string());
    return std::move(*e);
}

std::vector<std::vector<int32_t>> prompts_of(const Loaded& L) {
    const auto& t = L.tokens;
    return {{t.begin(), t.begin() + 3},
            {t.begin(), t.begin() + 7},
            {t[2]},
            {t.begin() + 1, t.begin() + 6},
            {t.begin() + 2, t.begin() + 4}};
}

SequenceParams params_of(std::vector<int32_t> prompt, double temperature, uint64_t state,
                         int64_t max_tokens) {
    SequenceParams p;
    p.prompt = std::move(prompt);
    p.sampling.temperature = temperature;
    p.sampling.top_k = 50;
    p.sampling.repetition_penalty = 1.1;
    p.seed_state = state;
    p.max_tokens = max_tokens;
    return p;
}

SequenceState wait_done(const SequenceTicket& t) {
    SequenceState st;
    for (uint64_t v = 0; !st.done;) v = t.wait(v, st);
    return st;
}

// log_softmax(row)[id] in double.
double log_prob(std::span<const float> row, int32_t id) {
    double m = -INFINITY, s = 0;
    for (float x : row) m = std::max(m, double(x));
    for (float x : row) s += std::exp(double(x) - m);
    return double(row[size_t(id)]) - m - std::log(s);
}

TEST(PrefillAll, EveryRowEqualsTheFullForward) {
    Loaded L = load("llama");
    const int64_t T = L.f.T, V = L.f.config.vocab_size;
    // Chunks of 3 tokens, logits in pieces of 2 rows (max_sequences): offsets cross both.
    InferenceEngine e = engine_of(L.model, 2, T, 3);
    const SeqId s = *e.open();
    std::vector<float> all(size_t(T * V));
    ASSERT_TRUE(e.prefill_all(s, L.tokens, all).ok());
    EXPECT_EQ(e.length(s), T);
    for (int64_t t = 0; t < T; ++t) {
        const double err = model_fixture::rel_error(
            ConstTensorView(all.data() + t * V, DType::kF32, Shape{V}, Device::kCpu),
            L.logits.view().reshape(Shape{T, V}).slice(t, t + 1).reshape(Shape{V}));
        EXPECT_LE(err, L.tol) << "position " << t;
    }
    std::vector<float> wrong(static_cast<size_t>(V));
    e.close(s);
    const SeqId s2 = *e.open();
    EXPECT_FALSE(e.prefill_all(s2, L.tokens, wrong).ok());  // V floats for T rows
}

// Runs `prompts` through generate() one request at a time: the reference.
std::vector<GenerateResult> reference(const Loaded& L, const std::vector<std::vector<int32_t>>& p,
                                      double temperature, uint64_t seed, int64_t new_tokens) {
    InferenceEngine e = engine_of(L.model, 1, L.f.T, 4);
    GenerateOptions o;
    o.sampling.temperature = temperature;
    o.sampling.top_k = 50;
    o.sampling.repetition_penalty = 1.1;
    o.seed = seed;
    o.max_new_tokens = new_tokens;
    o.batch_size = 1;
    Result<std::vector<GenerateResult>> r = generate(e, p, o, {});
    LATHE_CHECK(r.ok(), "{}", r.status().to_string());
    return *r;
}

TEST(Scheduler, JoiningAndLeavingGivesGeneratesTokens) {
    Loaded L = load("llama");
    const auto prompts = prompts_of(L);
    const int64_t T = L.f.T;
    for (double temperature : {0.0, 0.9}) {
        const uint64_t seed = 7;
        const std::vector<GenerateResult> want = reference(L, prompts, temperature, seed, 6);
        InferenceEngine e = engine_of(L.model, 2, T, 4);
        Scheduler sched(e, {}, 16);
        std::vector<std::shared_ptr<SequenceTicket>> tickets;
        // Different lengths: some leave while others run, and waiting ones join between steps.
        for (size_t i = 0; i < prompts.size(); ++i) {
            const int64_t n = i == 1 ? 2 : 6;
            auto t = sched.submit({params_of(prompts[i], temperature, sample_seed(seed, i), n)});
            ASSERT_TRUE(t.ok()) << t.status().to_string();
            tickets.push_back((*t)[0]);
        }
        EXPECT_EQ(sched.stats().waiting, 5);
        int steps = 0;
        while (sched.step()) ++steps;
        for (size_t i = 0; i < prompts.size(); ++i) {
            const SequenceState st = tickets[i]->snapshot();
            ASSERT_TRUE(st.done && st.error.ok()) << i << ": " << st.error.to_string();
            const size_t n = i == 1 ? 2 : 6;
            EXPECT_EQ(st.ids, std::vector<int32_t>(want[i].ids.begin(), want[i].ids.begin() + n))
                << "sequence " << i << " temperature " << temperature;
            EXPECT_EQ(st.finish, "length");
        }
        // 26 tokens (4 x 6 + 2) over at most 2 sequences at a time, each sequence's first token
        // from its prefill: fewer steps than one at a time (26 - 5 = 21 decode steps).
        EXPECT_LT(sched.stats().decode_steps, 21);
        EXPECT_EQ(sched.stats().generated_tokens, 26);
        // Every token after a sequence's first is one decoded row; both phases took time.
        EXPECT_EQ(sched.stats().decode_rows, 21);
        EXPECT_GT(sched.stats().prefill_seconds, 0);
        EXPECT_GT(sched.stats().decode_seconds, 0);
        // One first token per sequence, one gap before each later token; every observation
        // falls under some bound (the test's steps take far less than a minute).
        const SchedulerStats st = sched.stats();
        EXPECT_EQ(st.time_to_first_token.count, 5);
        EXPECT_EQ(st.time_per_output_token.count, 21);
        for (const SecondsHistogram* h : {&st.time_to_first_token, &st.time_per_output_token}) {
            EXPECT_GT(h->sum, 0);
            EXPECT_EQ(h->at_most.back(), h->count);
            for (size_t i = 1; i < h->at_most.size(); ++i)
                EXPECT_LE(h->at_most[i - 1], h->at_most[i]);
        }
        EXPECT_EQ(e.open_sequences(), 0);
    }
}

// Greedy sequences without a penalty (their steps picked by the engine, decode_greedy) and sampled
// ones (logits on the host) in one batch: a step takes the engine's picks only while every running
// sequence is of the first kind, so the path changes as the sampled ones finish (after 2 and 4
// tokens) and join (one waits for a free row). Each sequence's tokens are generate()'s for it
// alone: the switch changes no token and no draw of a sampled sequence's generator.
TEST(Scheduler, GreedyAndSampledSequencesMixAndSwitchTheDecodePath) {
    Loaded L = load("llama");
    const auto prompts = prompts_of(L);
    const uint64_t seed = 5;
    const std::vector<GenerateResult> sampled = reference(L, prompts, 0.9, seed, 8);
    InferenceEngine ref = engine_of(L.model, 1, L.f.T, 4);
    GenerateOptions g;
    g.sampling.temperature = 0;
    g.max_new_tokens = 8;
    const Result<std::vector<GenerateResult>> greedy = generate(ref, prompts, g, {});
    ASSERT_TRUE(greedy.ok());
    InferenceEngine e = engine_of(L.model, 4, L.f.T, 4);
    Scheduler sched(e, {}, 16);
    std::vector<std::shared_ptr<SequenceTicket>> tickets;
    const int64_t length[5] = {8, 2, 8, 4, 8};  // odd i sampled
    for (size_t i = 0; i < prompts.size(); ++i) {
        SequenceParams p = params_of(prompts[i], 0.9, sample_seed(seed, i), length[i]);
        if (i % 2 == 0) {
            p.sampling = SamplingParams{};
            p.sampling.temperature = 0;
        }
        auto t = sched.submit({p});
        ASSERT_TRUE(t.ok()) << t.status().to_string();
        tickets.push_back((*t)[0]);
    }
    while (sched.step()) {
    }
    for (size_t i = 0; i < prompts.size(); ++i) {
        const SequenceState st = tickets[i]->snapshot();
        ASSERT_TRUE(st.done && st.error.ok()) << i << ": " << st.error.to_string();
        const std::vector<int32_t>& all = i % 2 == 0 ? (*greedy)[i].ids : sampled[i].ids;
        EXPECT_EQ(st.ids, std::vector<int32_t>(all.begin(), all.begin() + length[i]))
            << "sequence " << i;
    }
}

TEST(Scheduler, EngineThreadServesConcurrentSubmitters) {
    Loaded L = load("llama");
    const auto prompts = prompts_of(L);
    const std::vector<GenerateResult> want = reference(L, prompts, 0.0, 0, 5);
    InferenceEngine e = engine_of(L.model, 3, L.f.T, 4);
    Scheduler sched(e, {}, 16);
    sched.start();
    std::vector<std::vector<int32_t>> got(prompts.size());
    std::vector<std::thread> threads;
    for (size_t i = 0; i < prompts.size(); ++i) {
        threads.emplace_back([&, i] {
            auto t = sched.submit({params_of(prompts[i], 0.0, 0, 5)});
            LATHE_CHECK(t.ok(), "{}", t.status().to_string());
            got[i] = wait_done(*(*t)[0]).ids;
        });
    }
    for (auto& t : threads) t.join();
    sched.stop();
    for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(got[i], want[i].ids) << i;
}

TEST(Scheduler, LogprobsAreLogSoftmaxOfTheFullForward) {
    Loaded L = load("llama");
    const int64_t T = L.f.T, V = L.f.config.vocab_size;
    InferenceEngine e = engine_of(L.model, 2, T, 4);
    Scheduler sched(e, {}, 4);
    const int64_t P = T - 2;
    SequenceParams p = params_of({L.tokens.begin(), L.tokens.begin() + P}, 0.0, 0, 0);
    p.prompt_logprobs = true;
    p.top_logprobs = 3;
    SequenceParams g = params_of({L.tokens.begin(), L.tokens.begin() + P}, 0.0, 0, 1);
    g.top_logprobs = 2;
    auto t = sched.submit({p, g});
    ASSERT_TRUE(t.ok());
    while (sched.step()) {
    }
    const SequenceState a = (*t)[0]->snapshot(), b = (*t)[1]->snapshot();
    ASSERT_TRUE(a.done && a.error.ok() && b.done && b.error.ok());
    const auto full = L.logits.view().reshape(Shape{T, V});
    double scale = 0;
    const float* fl = full.as<float>();
    for (int64_t i = 0; i < T * V; ++i) scale = std::max(scale, double(std::fabs(fl[i])));
    const double tol = 2 * L.tol * scale;
    // max_tokens 0: the prompt's log-probabilities only.
    EXPECT_TRUE(a.ids.empty());
    EXPECT_EQ(a.finish, "length");
    ASSERT_EQ(int64_t(a.prompt.size()), P);
    EXPECT_FALSE(a.prompt[0].has_logprob);
    for (int64_t i = 1; i < P; ++i) {
        const std::span<const float> row(fl + (i - 1) * V, size_t(V));
        const TokenLogprob& lp = a.prompt[size_t(i)];
        EXPECT_EQ(lp.id, L.tokens[size_t(i)]);
        EXPECT_NEAR(lp.logprob, log_prob(row, lp.id), tol) << "prompt position " << i;
        ASSERT_EQ(lp.top.size(), 3u);
        const int32_t argmax = int32_t(std::max_element(row.begin(), row.end()) - row.begin());
        EXPECT_EQ(lp.top[0].first, argmax);
        EXPECT_GE(lp.top[0].second, lp.top[1].second);
        EXPECT_GE(lp.top[1].second, lp.top[2].second);
    }
    // The greedy token's log-probability, after the prompt.
    ASSERT_EQ(b.ids.size(), 1u);
    ASSERT_EQ(b.logprobs.size(), 1u);
    const std::span<const float> row(fl + (P - 1) * V, size_t(V));
    EXPECT_NEAR(b.logprobs[0].logprob, log_prob(row, b.ids[0]), tol);
    EXPECT_EQ(b.logprobs[0].top[0].first, b.ids[0]);
    EXPECT_TRUE(b.prompt.empty());
}

TEST(Scheduler, QueueBoundAndValidation) {
    Loaded L = load("llama");
    const int64_t T = L.f.T;
    InferenceEngine e = engine_of(L.model, 1, T, 4);
    Scheduler sched(e, {}, 2);
    const SequenceParams ok = params_of({1, 2}, 0.0, 0, 2);
    auto full = sched.submit({ok, ok, ok});
    ASSERT_FALSE(full.ok());
    EXPECT_EQ(full.status().code(), StatusCode::kFailedPrecondition);
    EXPECT_EQ(sched.stats().waiting, 0);  // all or none
    ASSERT_TRUE(sched.submit({ok, ok}).ok());
    EXPECT_EQ(sched.submit({ok}).status().code(), StatusCode::kFailedPrecondition);
    // One joins the engine: a place frees.
    sched.step();
    EXPECT_EQ(sched.stats().waiting, 1);
    EXPECT_TRUE(sched.submit({ok}).ok());

    auto bad = [&](SequenceParams p, const char* needle) {
        Result<std::vector<std::shared_ptr<SequenceTicket>>> r = sched.submit({p});
        ASSERT_FALSE(r.ok()) << needle;
        EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
        EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().message();
    };
    bad(params_of({}, 0.0, 0, 2), "no tokens");
    bad(params_of({1, int32_t(L.f.config.vocab_size)}, 0.0, 0, 2), "outside the vocabulary");
    bad(params_of({1, 2}, 0.0, 0, T - 1), "context");
    // max_tokens near INT64_MAX: refused, not wrapped around into a small sum.
    bad(params_of({1, 2}, 0.0, 0, std::numeric_limits<int64_t>::max()), "context");
    bad(params_of({1, 2}, 0.0, 0, std::numeric_limits<int64_t>::max() - 1), "context");
    bad(params_of({1, 2}, -1.0, 0, 2), "temperature");
    SequenceParams s = ok;
    s.stop_strings = {"x"};
    bad(s, "tokenizer");
}

TEST(Scheduler, CancelStopStringsAndShutdown) {
    Loaded L = load("llama");
    InferenceEngine e = engine_of(L.model, 2, L.f.T, 4);
    // Each id's text is one letter; stop strings then match the letters of the tokens.
    Detokenizer letters = [](std::span<const int32_t> ids) -> Result<std::string> {
        std::string s;
        for (int32_t id : ids) s += char('a' + id % 26);
        return s;
    };
    Scheduler sched(e, letters, 8);
    const std::vector<int32_t> prompt(L.tokens.begin(), L.tokens.begin() + 4);
    auto free = sched.submit({params_of(prompt, 1.0, 3, 12)});
    ASSERT_TRUE(free.ok());
    while (sched.step()) {
    }
    const SequenceState f = (*free)[0]->snapshot();
    ASSERT_EQ(f.ids.size(), 12u);
    // A two-letter stop string at the 5th and 6th tokens: the text ends before it; the token
    // that completed it is the last.
    const std::string stop = f.text.substr(4, 2);
    const size_t first = f.text.find(stop);
    SequenceParams sp = params_of(prompt, 1.0, 3, 12);
    sp.stop_strings = {"zzzz", stop};
    auto stopped = sched.submit({sp});
    ASSERT_TRUE(stopped.ok());
    // While running, the stable text holds back the last 3 bytes (the longest stop string - 1).
    sched.step();
    const SequenceState mid = (*stopped)[0]->snapshot();
    EXPECT_FALSE(mid.done);
    EXPECT_EQ(mid.stable_text, mid.text.size() >= 3 ? mid.text.size() - 3 : 0);
    while (sched.step()) {
    }
    const SequenceState s = (*stopped)[0]->snapshot();
    EXPECT_EQ(s.finish, "stop");
    EXPECT_EQ(s.text, f.text.substr(0, first));
    EXPECT_EQ(s.ids, std::vector<int32_t>(f.ids.begin(), f.ids.begin() + ptrdiff_t(first + 2)));

    // Only the tail after the last stable text is searched: every stop string of 1 to 3 letters
    // at each position still ends the text at its first occurrence, as a whole-text search.
    for (size_t len = 1; len <= 3; ++len) {
        for (size_t at = 0; at + len <= f.text.size(); ++at) {
            SequenceParams q = params_of(prompt, 1.0, 3, 12);
            q.stop_strings = {"zzzz", f.text.substr(at, len)};
            auto r = sched.submit({q});
            ASSERT_TRUE(r.ok());
            while (sched.step()) {
            }
            const SequenceState st = (*r)[0]->snapshot();
            EXPECT_EQ(st.finish, "stop");
            EXPECT_EQ(st.text, f.text.substr(0, f.text.find(q.stop_strings[1])))
                << at << " " << len;
        }
    }

    // The stable text ends on a character boundary: with two-byte characters and a stop string
    // of two bytes, holding back one byte would split a character.
    Detokenizer accents = [](std::span<const int32_t> ids) -> Result<std::string> {
        std::string s;
        for (size_t i = 0; i < ids.size(); ++i) s += "\xC3\xA9";  // U+00E9
        return s;
    };
    InferenceEngine e2 = engine_of(L.model, 1, L.f.T, 4);
    Scheduler two(e2, accents, 2);
    SequenceParams ap = params_of(prompt, 0.0, 0, 6);
    ap.stop_strings = {"zz"};
    auto at = two.submit({ap});
    ASSERT_TRUE(at.ok());
    for (int i = 0; i < 3; ++i) {
        two.step();
        const SequenceState st = (*at)[0]->snapshot();
        EXPECT_EQ(st.stable_text % 2, 0u) << st.stable_text;
        EXPECT_EQ(st.stable_text, st.text.size() - 2);
    }

    // Cancelled while running: it leaves at the next step and frees its sequence.
    auto c = sched.submit({params_of(prompt, 0.0, 0, 12)});
    ASSERT_TRUE(c.ok());
    sched.step();
    EXPECT_EQ(e.open_sequences(), 1);
    (*c)[0]->cancel();
    sched.step();
    EXPECT_EQ(e.open_sequences(), 0);
    const SequenceState cs = (*c)[0]->snapshot();
    EXPECT_TRUE(cs.done);
    EXPECT_EQ(cs.error.code(), StatusCode::kCancelled);
    EXPECT_LT(cs.ids.size(), 12u);

    // Shutdown ends what is running and waiting with an error, and refuses new work.
    auto run = sched.submit({params_of(prompt, 0.0, 0, 12), params_of(prompt, 0.0, 0, 12),
                             params_of(prompt, 0.0, 0, 12)});
    ASSERT_TRUE(run.ok());
    sched.step();  // two run, one waits
    sched.stop();
    for (const auto& t : *run) {
        const SequenceState st = t->snapshot();
        EXPECT_TRUE(st.done);
        EXPECT_EQ(st.error.code(), StatusCode::kCancelled);
    }
    EXPECT_EQ(e.open_sequences(), 0);
    EXPECT_EQ(sched.submit({params_of(prompt, 0.0, 0, 2)}).status().code(), StatusCode::kCancelled);
}

}  // namespace
}  // namespace lathe
