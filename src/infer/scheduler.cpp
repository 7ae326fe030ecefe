#include "infer/scheduler.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>

#include "core/check.h"

namespace lathe {

namespace {

using Clock = std::chrono::steady_clock;

int64_t nanoseconds(Clock::duration d) {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(d).count();
}

// log_softmax(row)[id] and the k most probable tokens (decreasing, ties by increasing id), in
// double over the raw logits.
TokenLogprob logprob_of(std::span<const float> row, int32_t id, int64_t k) {
    double m = -INFINITY;
    for (float x : row) m = std::max(m, double(x));
    double sum = 0;
    for (float x : row) sum += std::exp(double(x) - m);
    const double lse = m + std::log(sum);
    TokenLogprob lp;
    lp.id = id;
    lp.logprob = float(double(row[size_t(id)]) - lse);
    lp.has_logprob = true;
    if (k > 0) {
        std::vector<int32_t> idx(row.size());
        std::iota(idx.begin(), idx.end(), 0);
        const size_t kk = std::min(size_t(k), idx.size());
        std::partial_sort(idx.begin(), idx.begin() + ptrdiff_t(kk), idx.end(),
                          [&](int32_t a, int32_t b) {
                              return row[size_t(a)] > row[size_t(b)] ||
                                     (row[size_t(a)] == row[size_t(b)] && a < b);
                          });
        for (size_t i = 0; i < kk; ++i)
            lp.top.emplace_back(idx[i], float(double(row[size_t(idx[i])]) - lse));
    }
    return lp;
}

const std::string kReplacement = "\xEF\xBF\xBD";  // what a decoder writes for an unfinished char

}  // namespace

uint64_t SequenceTicket::wait(uint64_t version, SequenceState& out) const {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return version_ != version; });
    out = state_;
    return version_;
}

SequenceState SequenceTicket::snapshot() const {
    std::lock_guard<std::mutex> lock(mu_);
    return state_;
}

void SequenceTicket::publish(const SequenceState& s) {
    {
        std::lock_guard<std::mutex> lock(mu_);
        state_ = s;
        ++version_;
    }
    cv_.notify_all();
}

Scheduler::Scheduler(InferenceEngine& engine, Detokenizer detokenize, int64_t max_queue)
    : engine_(engine),
      detokenize_(std::move(detokenize)),
      max_queue_(std::max<int64_t>(1, max_queue)) {}

Scheduler::~Scheduler() {
    stop();
}

Result<std::vector<std::shared_ptr<SequenceTicket>>> Scheduler::submit(
    std::vector<SequenceParams> group) {
    const int64_t V = engine_.vocab_size(), T = engine_.limits().max_len;
    for (const SequenceParams& p : group) {
        LATHE_RETURN_IF_ERROR(sampling_validate(p.sampling));
        if (p.prompt.empty()) return invalid_argument_error("the prompt has no tokens");
        for (size_t i = 0; i < p.prompt.size(); ++i) {
            if (p.prompt[i] < 0 || p.prompt[i] >= V) {
                return invalid_argument_error(
                    "token {} at index {} of the prompt is outside the vocabulary [0, {})",
                    p.prompt[i], i, V);
            }
        }
        if (p.max_tokens < 0)
            return invalid_argument_error("max_tokens must be >= 0, got {}", p.max_tokens);
        // Overflow-free: max_tokens may be anything up to INT64_MAX.
        if (int64_t(p.prompt.size()) > T || p.max_tokens > T - int64_t(p.prompt.size())) {
            return invalid_argument_error(
                "the prompt's {} tokens and max_tokens {} exceed the {}-token context: shorten "
                "the prompt or lower max_tokens",
                p.prompt.size(), p.max_tokens, T);
        }
        const int64_t blocks = engine_.kv_blocks_for(int64_t(p.prompt.size()) + p.max_tokens);
        if (blocks > engine_.kv_total_blocks()) {
            return invalid_argument_error(
                "the prompt's {} tokens and max_tokens {} need {} KV blocks, the pool has {}: "
                "shorten the prompt or lower max_tokens",
                p.prompt.size(), p.max_tokens, blocks, engine_.kv_total_blocks());
        }
        if (!p.stop_strings.empty() && !detokenize_)
            return invalid_argument_error("stop strings need a tokenizer to decode text");
        if (p.top_logprobs < -1)
            return invalid_argument_error("top_logprobs must be >= -1, got {}", p.top_logprobs);
    }
    std::vector<std::shared_ptr<SequenceTicket>> tickets;
    {
        std::lock_guard<std::mutex> lock(mu_);
        if (stopping_) return cancelled_error("the server is shutting down");
        if (int64_t(waiting_.size() + group.size()) > max_queue_) {
            return failed_precondition_error(
                "the queue is full ({} sequences waiting, at most {}): retry later",
                waiting_.size(), max_queue_);
        }
        for (SequenceParams& p : group) {
            tickets.push_back(std::make_shared<SequenceTicket>());
            tickets.back()->submitted_ = std::chrono::steady_clock::now();
            waiting_.emplace_back(tickets.back(), std::move(p));
        }
    }
    cv_.notify_all();
    return tickets;
}

bool Scheduler::accept(Running& r, std::span<float> logits) {
    const SequenceParams& p = r.params;
    std::vector<float> raw;
    if (p.top_logprobs >= 0) raw.assign(logits.begin(), logits.end());
    const int32_t token = sample_token(logits, r.seen, p.sampling, r.rng, prob_, order_);
    if (p.top_logprobs >= 0) r.state.logprobs.push_back(logprob_of(raw, token, p.top_logprobs));
    return accept_token(r, token);
}

bool Scheduler::picks_on_device(const SequenceParams& p) {
    return sampling_is_argmax(p.sampling) && p.top_logprobs < 0;
}

bool Scheduler::accept_token(Running& r, int32_t token) {
    SequenceState& st = r.state;
    const SequenceParams& p = r.params;
    st.ids.push_back(token);
    r.seen.push_back(token);
    r.last = token;
    generated_.fetch_add(1);
    // A stop string that this token completes starts at or after the stable text of the step
    // before (below: the text before it holds no stop string's start); only that tail is searched.
    const size_t search_from = st.stable_text;
    if (detokenize_) {
        Result<std::string> text = detokenize_(st.ids);
        if (!text.ok()) {
            st.error = text.status();
            return true;
        }
        st.text = std::move(*text);
    }
    if (std::find(p.stop_ids.begin(), p.stop_ids.end(), token) != p.stop_ids.end()) {
        st.finish = "stop";
    } else {
        // The earliest stop string ends the text right before it.
        size_t cut = std::string::npos;
        for (const std::string& s : p.stop_strings) {
            const size_t at = s.empty() || search_from >= st.text.size()
                                  ? std::string::npos
                                  : st.text.find(s, search_from);
            if (at != std::string::npos) cut = std::min(cut, at);
        }
        if (cut != std::string::npos) {
            st.text.resize(cut);
            st.finish = "stop";
        }
    }
    if (st.finish.empty() && int64_t(st.ids.size()) >= p.max_tokens) st.finish = "length";
    if (st.finish.empty() && engine_.length(r.seq) >= engine_.limits().max_len)
        st.finish = "length";
    if (!st.finish.empty()) return true;
    // Stable text: not the replacement characters at the end (bytes of a character that later
    // tokens may complete, which a decoder may write as several), and not the last (longest stop
    // string - 1) bytes, which a stop string completed by a later token may still cut. A stop
    // string found later starts after the bytes held back, so the stable prefix only grows.
    size_t stable = st.text.size();
    while (stable >= kReplacement.size() &&
           st.text.compare(stable - kReplacement.size(), kReplacement.size(), kReplacement) == 0)
        stable -= kReplacement.size();
    size_t longest = 0;
    for (const std::string& s : p.stop_strings) longest = std::max(longest, s.size());
    stable = longest > 1 ? (stable >= longest - 1 ? stable - (longest - 1) : 0) : stable;
    // Whole characters only: a stream's pieces are each valid UTF-8.
    while (stable > 0 && stable < st.text.size() && (uint8_t(st.text[stable]) & 0xC0) == 0x80)
        --stable;
    st.stable_text = std::max(st.stable_text, stable);
    r.ticket->publish(st);
    return false;
}

void Scheduler::finish(Running& r) {
    engine_.close(r.seq);
    reserved_blocks_ -= r.blocks;
    r.state.done = true;
    r.state.stable_text = r.state.text.size();
    finished_.fetch_add(1);
    r.ticket->publish(r.state);
}

// Groups of joining sequences that prefill_many takes in one forward: consecutive ones without
// prompt log-probabilities whose prompts, padded to the group's longest, fit its limits
// (prefill_many_fits) and waste at most a fifth of the forward's rows on padding. A group of
// one prefills alone (in prefill_chunk pieces).
void Scheduler::prefill_joining(std::vector<Running>& joining) {
    const int64_t V = engine_.vocab_size();
    size_t i = 0;
    while (i < joining.size()) {
        size_t end = i + 1;
        std::vector<int64_t> lengths = {int64_t(joining[i].params.prompt.size())};
        if (!joining[i].params.prompt_logprobs) {
            int64_t total = lengths[0], longest = lengths[0];
            while (end < joining.size() && !joining[end].params.prompt_logprobs) {
                const int64_t n = int64_t(joining[end].params.prompt.size());
                lengths.push_back(n);
                const int64_t l = std::max(longest, n), rows = l * int64_t(lengths.size());
                if (!engine_.prefill_many_fits(lengths) || 4 * rows > 5 * (total + n)) {
                    lengths.pop_back();
                    break;
                }
                total += n;
                longest = l;
                ++end;
            }
        }
        const Clock::time_point t0 = Clock::now();
        Status s = ok_status();
        if (end - i > 1) {
            std::vector<SeqId> seqs;
            std::vector<std::span<const int32_t>> prompts;
            for (size_t k = i; k < end; ++k) {
                seqs.push_back(joining[k].seq);
                prompts.emplace_back(joining[k].params.prompt);
            }
            logits_.resize((end - i) * size_t(V));
            s = engine_.prefill_many(seqs, prompts, logits_);
        } else {
            Running& r = joining[i];
            const std::vector<int32_t>& prompt = r.params.prompt;
            const size_t rows = r.params.prompt_logprobs ? prompt.size() : 1;
            logits_.resize(rows * size_t(V));
            s = r.params.prompt_logprobs ? engine_.prefill_all(r.seq, prompt, logits_)
                                         : engine_.prefill(r.seq, prompt, logits_);
        }
        // The prefill's end: its time, and each sequence's first token's.
        const Clock::time_point t1 = Clock::now();
        prefill_ns_.fetch_add(nanoseconds(t1 - t0));
        prefill_calls_.fetch_add(1);
        for (size_t k = i; k < end; ++k) {
            Running& r = joining[k];
            r.last_token = t1;
            if (!s.ok()) {
                r.state.error = s;
                finish(r);
                continue;
            }
            const std::vector<int32_t>& prompt = r.params.prompt;
            const size_t T = prompt.size();
            prompt_tokens_.fetch_add(int64_t(T));
            if (r.params.prompt_logprobs) {
                TokenLogprob first;
                first.id = prompt[0];
                r.state.prompt.push_back(first);
                const int64_t top = std::max<int64_t>(r.params.top_logprobs, 0);
                for (size_t t = 1; t < T; ++t) {
                    const std::span<const float> row(logits_.data() + (t - 1) * size_t(V),
                                                     size_t(V));
                    r.state.prompt.push_back(logprob_of(row, prompt[t], top));
                }
            }
            if (r.params.max_tokens == 0) {
                r.state.finish = "length";
                finish(r);
                continue;
            }
            // This sequence's row: its own in a group, the last of prefill_all's rows alone.
            const size_t row = end - i > 1 ? k - i : (r.params.prompt_logprobs ? T - 1 : 0);
            const std::span<float> last(logits_.data() + row * size_t(V), size_t(V));
            {
                std::lock_guard<std::mutex> lock(latency_mu_);
                first_token_.observe(
                    std::chrono::duration<double>(r.last_token - r.ticket->submitted_).count());
            }
            if (accept(r, last))
                finish(r);
            else
                running_.push_back(std::move(r));
        }
        i = end;
    }
}

bool Scheduler::step() {
    const Clock::time_point step_start = Clock::now();
    struct Busy {  // the step's wall time into step_ns_, however it returns
        std::atomic<int64_t>& ns;
        Clock::time_point start;
        ~Busy() { ns.fetch_add(nanoseconds(Clock::now() - start)); }
    } busy{step_ns_, step_start};
    bool worked = false;
    const int64_t V = engine_.vocab_size();
    // Leave: sequences whose client went away.
    for (size_t i = 0; i < running_.size();) {
        if (!running_[i].ticket->cancelled()) {
            ++i;
            continue;
        }
        running_[i].state.error = cancelled_error("the request was cancelled");
        finish(running_[i]);
        running_.erase(running_.begin() + ptrdiff_t(i));
        worked = true;
    }
    // Join: waiting sequences while the engine has room, admitted in order, then prefilled
    // (prefill_joining); arrivals during the prefills join in the next round before any decode.
    for (;;) {
        std::vector<Running> joining;
        while (engine_.open_sequences() < engine_.limits().max_sequences) {
            std::pair<std::shared_ptr<SequenceTicket>, SequenceParams> item;
            int64_t blocks = 0;
            {
                std::lock_guard<std::mutex> lock(mu_);
                if (waiting_.empty()) break;
                // A paged cache admits what its free blocks can finish (the prompt and max_tokens
                // of every running sequence are spoken for); the queue keeps its order.
                const SequenceParams& front = waiting_.front().second;
                blocks = engine_.kv_blocks_for(int64_t(front.prompt.size()) + front.max_tokens);
                if (reserved_blocks_ + blocks > engine_.kv_total_blocks() &&
                    !waiting_.front().first->cancelled())
                    break;
                item = std::move(waiting_.front());
                waiting_.pop_front();
            }
            worked = true;
            Running r;
            r.ticket = std::move(item.first);
            r.params = std::move(item.second);
            if (r.ticket->cancelled()) {
                r.state.error = cancelled_error("the request was cancelled");
                r.state.done = true;
                r.ticket->publish(r.state);
                continue;
            }
            r.rng = SampleRng(r.params.seed_state);
            r.seen = r.params.prompt;
            Result<SeqId> seq = engine_.open();
            if (!seq.ok()) {
                // The admission above leaves a free row, so only the tensor-parallel lead's
                // message to its followers can fail here: the request ends with that error.
                r.state.error = seq.status();
                r.state.done = true;
                r.ticket->publish(r.state);
                continue;
            }
            r.seq = *seq;
            r.blocks = blocks;
            reserved_blocks_ += blocks;
            joining.push_back(std::move(r));
        }
        if (joining.empty()) break;
        prefill_joining(joining);
    }
    running_count_.store(int64_t(running_.size()));
    if (running_.empty()) return worked;
    // One decode step for every running sequence.
    std::vector<DecodeStep> steps;
    for (const Running& r : running_) steps.push_back(DecodeStep{r.seq, r.last});
    // Every sequence greedy without log-probabilities or a repetition penalty: the engine picks
    // the tokens where the logits are (decode_greedy), the same ones sample_token would.
    const bool on_device = std::all_of(running_.begin(), running_.end(),
                                       [](const Running& r) { return picks_on_device(r.params); });
    const Clock::time_point t0 = Clock::now();
    Status s = ok_status();
    if (on_device) {
        tokens_.resize(running_.size());
        s = engine_.decode_greedy(steps, tokens_);
    } else {
        logits_.resize(running_.size() * size_t(V));
        s = engine_.decode(steps, logits_);
    }
    const Clock::time_point now = Clock::now();
    decode_ns_.fetch_add(nanoseconds(now - t0));
    steps_.fetch_add(1);
    decode_rows_.fetch_add(int64_t(steps.size()));
    if (s.ok()) {
        std::lock_guard<std::mutex> lock(latency_mu_);
        for (Running& r : running_) {
            per_token_.observe(std::chrono::duration<double>(now - r.last_token).count());
            r.last_token = now;
        }
    }
    std::vector<Running> still;
    for (size_t k = 0; k < running_.size(); ++k) {
        Running& r = running_[k];
        if (!s.ok()) {
            r.state.error = s;
            finish(r);
            continue;
        }
        const bool done =
            on_device ? accept_token(r, tokens_[k])
                      : accept(r, std::span<float>(logits_.data() + k * size_t(V), size_t(V)));
        if (done)
            finish(r);
        else
            still.push_back(std::move(r));
    }
    running_ = std::move(still);
    running_count_.store(int64_t(running_.size()));
    return true;
}

void Scheduler::loop() {
    for (;;) {
        {
            std::unique_lock<std::mutex> lock(mu_);
            cv_.wait(lock, [&] { return stopping_ || !waiting_.empty() || !running_.empty(); });
            if (stopping_) break;
        }
        step();
    }
}

void Scheduler::start() {
    LATHE_CHECK(!thread_.joinable(), "scheduler started twice");
    thread_ = std::thread([this] { loop(); });
}

void Scheduler::stop() {
    {
        std::lock_guard<std::mutex> lock(mu_);
        stopping_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
    // Everything still in flight ends with an error its waiter reports.
    for (Running& r : running_) {
        r.state.error = cancelled_error("the server is shutting down");
        finish(r);
    }
    running_.clear();
    running_count_.store(0);
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [ticket, params] : waiting_) {
        SequenceState st;
        st.error = cancelled_error("the server is shutting down");
        st.done = true;
        ticket->publish(st);
    }
    waiting_.clear();
}

SchedulerStats Scheduler::stats() const {
    SchedulerStats s;
    {
        std::lock_guard<std::mutex> lock(mu_);
        s.waiting = int64_t(waiting_.size());
    }
    s.running = running_count_.load();
    s.sequences_finished = finished_.load();
    s.prompt_tokens = prompt_tokens_.load();
    s.generated_tokens = generated_.load();
    s.decode_steps = steps_.load();
    s.decode_rows = decode_rows_.load();
    s.prefill_seconds = double(prefill_ns_.load()) * 1e-9;
    s.prefill_calls = prefill_calls_.load();
    s.step_seconds = double(step_ns_.load()) * 1e-9;
    s.decode_seconds = double(decode_ns_.load()) * 1e-9;
    std::lock_guard<std::mutex> lock(latency_mu_);
    s.time_to_first_token = first_token_;
    s.time_per_output_token = per_token_;
    return s;
}

}  // namespace lathe
