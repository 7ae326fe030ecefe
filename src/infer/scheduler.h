#pragma once
// The continuous-batching scheduler of `lathe serve`: one engine thread owns the InferenceEngine;
// other threads submit requests and wait on (or stream from) their tickets.
//
//   submit(group)   validates a group of sequences (a prompt's n choices, a list of prompts) and
//                   appends them all to the waiting queue, or none: a full queue (max_queue
//                   sequences waiting) is kFailedPrecondition, which a server answers 503.
//   step()          one iteration of the engine thread: cancelled sequences leave; waiting ones
//                   join in order while the engine has free sequences and, with a paged KV
//                   cache, free blocks for their prompt + max_tokens beyond what the running
//                   sequences may still fill (opened, prefilled, first token sampled); those
//                   admitted together prefill in groups of one forward where the engine takes
//                   them (InferenceEngine::prefill_many: new sequences whose prompts, padded to
//                   the longest, fit its prefill chunk, at most a fifth of the rows padding; a
//                   failed group fails each of its requests);
//                   then one decode step for every running sequence. Joining and leaving happen
//                   only here, between decode steps.
//   start()/stop()  the engine thread runs step() while there is work and sleeps otherwise;
//                   stop() ends every ticket still waiting or running with an error and joins.
//
// A sequence samples with SampleRng(params.seed_state) exactly as generate() does (the same
// sample_token calls on the same logits), so greedy and seeded output equal `lathe generate`'s.
// Stops: a stop id (kept as the last token; its text is skipped as a special token), a stop
// string (the text ends right before it, the OpenAI convention; the token that completed it is
// the last), max_tokens ("length"), or the engine's context ("length").
// Log-probabilities are of the model's distribution, log_softmax of the raw logits (before the
// penalty and temperature): the chosen token's and the top_logprobs most probable ones; with
// prompt_logprobs, those of every prompt token after the first (prefill_all).

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/status.h"
#include "infer/engine.h"
#include "infer/generate.h"
#include "infer/sampling.h"

namespace lathe {

struct SequenceParams {
    std::vector<int32_t> prompt;  // at least one token, each in [0, V)
    SamplingParams sampling;
    uint64_t seed_state = 0;  // the generator's starting state (sample_seed(seed, index))
    int64_t max_tokens = 16;  // new tokens at most; 0 = prompt only (with prompt_logprobs)
    std::vector<int32_t> stop_ids;
    std::vector<std::string> stop_strings;
    bool prompt_logprobs = false;  // log-probabilities of the prompt's tokens (echo)
    int64_t top_logprobs = -1;     // -1: none; k >= 0: the chosen token's and the top k
};

struct TokenLogprob {
    int32_t id = 0;
    float logprob = 0;                           // log p(id | before); 0 for a first token
    bool has_logprob = false;                    // false for the prompt's first token
    std::vector<std::pair<int32_t, float>> top;  // the top_logprobs most probable, decreasing
};

// What a sequence has produced so far (a copy, consistent at one point between steps).
struct SequenceState {
    std::vector<int32_t> ids;            // new tokens
    std::vector<TokenLogprob> logprobs;  // per new token (top_logprobs >= 0)
    std::vector<TokenLogprob> prompt;    // per prompt token (prompt_logprobs)
    std::string text;                    // the new tokens' text (up to a stop string)
    size_t stable_text = 0;  // bytes of `text` that later tokens cannot change (streaming)
    std::string finish;      // "" while running; "stop" or "length"
    Status error;            // set when it ended without finishing (shutdown)
    bool done = false;
};

class SequenceTicket {
public:
    // Blocks until the state changed since `version` (or done); returns the new version.
    uint64_t wait(uint64_t version, SequenceState& out) const;
    SequenceState snapshot() const;
    // Asks the engine thread to drop the sequence at the next step (a client that went away).
    void cancel() { cancelled_.store(true); }
    bool cancelled() const { return cancelled_.load(); }

private:
    friend class Scheduler;
    void publish(const SequenceState& s);

    mutable std::mutex mu_;
    mutable std::condition_variable cv_;
    SequenceState state_;
    uint64_t version_ = 0;
    std::atomic<bool> cancelled_{false};
    std::chrono::steady_clock::time_point submitted_;  // Scheduler::submit
};

// Durations observed, as a Prometheus histogram: per upper bound the observations at most that
// long (cumulative), their sum and count.
struct SecondsHistogram {
    static constexpr std::array<double, 13> kBounds = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                                       1,     2.5,  5,     10,   30,  60};
    std::array<int64_t, kBounds.size()> at_most{};
    int64_t count = 0;
    double sum = 0;

    void observe(double seconds) {
        for (size_t i = 0; i < kBounds.size(); ++i)
            if (seconds <= kBounds[i]) ++at_most[i];
        ++count;
        sum += seconds;
    }
};

struct SchedulerStats {
    int64_t waiting = 0, running = 0;
    int64_t sequences_finished = 0, prompt_tokens = 0, generated_tokens = 0, decode_steps = 0;
    // Wall time inside the engine's prefills (their logits on the host) and decode steps, and
    // the rows those steps decoded (a step of n running sequences adds n).
    double prefill_seconds = 0, decode_seconds = 0;
    int64_t decode_rows = 0;
    // The scheduler's prefill calls to the engine: a group of sequences prefilled together counts
    // once, and so does a prompt longer than prefill_chunk (several forwards in one call).
    int64_t prefill_calls = 0;
    // Wall time of the engine thread's steps: the prefills and decode steps above and the host
    // work around them (admission, sampling, stop checks, publishing to the waiters).
    double step_seconds = 0;
    // Per sequence: submit() to its first token (the queue wait and the prefill); and between
    // its consecutive tokens (a decode step, and the prefills of sequences that joined before it).
    SecondsHistogram time_to_first_token, time_per_output_token;
};

class Scheduler {
public:
    // `engine` and `detokenize` (the text of ids; may be empty: no text, no stop strings) must
    // outlive the scheduler. max_queue >= 1.
    Scheduler(InferenceEngine& engine, Detokenizer detokenize, int64_t max_queue);
    ~Scheduler();
    Scheduler(const Scheduler&) = delete;
    Scheduler& operator=(const Scheduler&) = delete;

    // Errors: kInvalidArgument for a sequence that cannot run (empty prompt, a token outside the
    // vocabulary, prompt + max_tokens beyond the engine's max_len, bad sampling values, stop
    // strings without a detokenizer); kFailedPrecondition when the group does not fit the queue;
    // kCancelled after stop().
    Result<std::vector<std::shared_ptr<SequenceTicket>>> submit(std::vector<SequenceParams> group);

    // One iteration (see above); false when there was nothing to do. Only the engine thread (or
    // a test without start()) calls it.
    bool step();
    void start();
    void stop();

    SchedulerStats stats() const;
    int64_t max_len() const { return engine_.limits().max_len; }

private:
    struct Running {
        std::shared_ptr<SequenceTicket> ticket;
        SequenceParams params;
        SequenceState state;
        SeqId seq = 0;
        SampleRng rng;
        std::vector<int32_t> seen;
        int32_t last = 0;
        int64_t blocks = 0;                                // KV blocks spoken for (paged cache)
        std::chrono::steady_clock::time_point last_token;  // when its latest token came
    };
    // Prefills the admitted sequences (groups through prefill_many), samples each one's first
    // token, and moves the unfinished ones into running_.
    void prefill_joining(std::vector<Running>& joining);
    // Samples a token from `logits` (and its log-probabilities when asked) and accepts it.
    bool accept(Running& r, std::span<float> logits);
    // Appends `token`; true when the sequence finished (a stop id or string, its length).
    bool accept_token(Running& r, int32_t token);
    // Whether the engine may pick p's tokens itself (decode_greedy): greedy, no repetition
    // penalty, no log-probabilities.
    static bool picks_on_device(const SequenceParams& p);
    void finish(Running& r);
    void loop();

    InferenceEngine& engine_;
    Detokenizer detokenize_;
    int64_t max_queue_;
    mutable std::mutex mu_;
    std::condition_variable cv_;
    std::deque<std::pair<std::shared_ptr<SequenceTicket>, SequenceParams>> waiting_;
    bool stopping_ = false;
    std::thread thread_;
    // Engine-thread state.
    std::vector<Running> running_;
    int64_t reserved_blocks_ = 0;  // KV blocks the running sequences may still fill
    std::vector<float> logits_;
    std::vector<int32_t> tokens_;  // a decode_greedy step's picks
    std::vector<double> prob_;
    std::vector<int32_t> order_;
    std::atomic<int64_t> running_count_{0}, finished_{0}, prompt_tokens_{0}, generated_{0},
        steps_{0}, decode_rows_{0}, prefill_ns_{0}, decode_ns_{0}, prefill_calls_{0}, step_ns_{0};
    mutable std::mutex latency_mu_;  // the two histograms
    SecondsHistogram first_token_, per_token_;
};

}  // namespace lathe
