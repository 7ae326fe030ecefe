#include "infer/generate.h"

#include <algorithm>
#include <deque>

namespace lathe {

namespace {

struct Running {
    size_t index = 0;
    SeqId seq = 0;
    std::vector<int32_t> seen;  // prompt and generated, for the repetition penalty
    SampleRng rng;
    int32_t last = 0;  // the token the next decode step feeds
};

}  // namespace

Result<std::vector<GenerateResult>> generate(InferenceEngine& engine,
                                             const std::vector<std::vector<int32_t>>& prompts,
                                             const GenerateOptions& o,
                                             const Detokenizer& detokenize,
                                             const TokenCallback& on_token) {
    LATHE_RETURN_IF_ERROR(sampling_validate(o.sampling));
    if (o.max_new_tokens < 1)
        return invalid_argument_error("--max-new-tokens must be >= 1, got {}", o.max_new_tokens);
    if (o.batch_size < 1 || o.batch_size > engine.limits().max_sequences) {
        return invalid_argument_error("--batch-size must be in [1, {}], got {}",
                                      engine.limits().max_sequences, o.batch_size);
    }
    const int64_t V = engine.vocab_size(), max_len = engine.limits().max_len;
    std::vector<GenerateResult> results(prompts.size());
    std::deque<size_t> waiting;
    for (size_t i = 0; i < prompts.size(); ++i) waiting.push_back(i);
    std::vector<Running> running;
    std::vector<float> logits;
    std::vector<double> prob;
    std::vector<int32_t> order;
    // Greedy without a repetition penalty: decode steps return the picks, not the logits.
    const bool greedy = sampling_is_argmax(o.sampling);

    // Appends `token` to request r; true when it finished (its sequence is then closed).
    auto accept = [&](Running& r, int32_t token) -> Result<bool> {
        GenerateResult& out = results[r.index];
        out.ids.push_back(token);
        r.seen.push_back(token);
        r.last = token;
        if (detokenize) {
            LATHE_ASSIGN_OR_RETURN(out.text, detokenize(out.ids));
        }
        if (std::find(o.stop_ids.begin(), o.stop_ids.end(), token) != o.stop_ids.end()) {
            out.stop = "stop_id";
        } else {
            for (const std::string& s : o.stop_strings) {
                const size_t at = s.empty() ? std::string::npos : out.text.find(s);
                if (at != std::string::npos) {
                    out.text.resize(at + s.size());
                    out.stop = "stop_string";
                    break;
                }
            }
        }
        if (out.stop.empty() && int64_t(out.ids.size()) >= o.max_new_tokens) out.stop = "length";
        if (out.stop.empty() && engine.length(r.seq) >= max_len) out.stop = "context";
        if (on_token) on_token(r.index, out);
        return !out.stop.empty();
    };

    while (!waiting.empty() || !running.empty()) {
        // Join: open and prefill waiting requests while there is room.
        while (!waiting.empty() && int64_t(running.size()) < o.batch_size) {
            const size_t i = waiting.front();
            waiting.pop_front();
            const std::vector<int32_t>& prompt = prompts[i];
            if (prompt.empty()) return invalid_argument_error("request {}: empty prompt", i);
            if (int64_t(prompt.size()) >= max_len) {
                return invalid_argument_error(
                    "request {}: the prompt's {} tokens leave no room in the {}-token context", i,
                    prompt.size(), max_len);
            }
            Running r;
            r.index = i;
            r.rng = SampleRng(sample_seed(o.seed, i));
            r.seen = prompt;
            LATHE_ASSIGN_OR_RETURN(r.seq, engine.open());
            logits.resize(size_t(V));
            if (Status s = engine.prefill(r.seq, prompt, logits); !s.ok()) {
                engine.close(r.seq);
                return s.with_context("request " + std::to_string(i));
            }
            int32_t token = sample_token(logits, r.seen, o.sampling, r.rng, prob, order);
            // Tensor parallel: rank 0's token on every rank.
            LATHE_RETURN_IF_ERROR(engine.agree_tokens(std::span<int32_t>(&token, 1)));
            LATHE_ASSIGN_OR_RETURN(bool done, accept(r, token));
            if (done)
                engine.close(r.seq);
            else
                running.push_back(std::move(r));
        }
        if (running.empty()) continue;
        // One decode step for every running request.
        std::vector<DecodeStep> steps;
        for (const Running& r : running) steps.push_back(DecodeStep{r.seq, r.last});
        std::vector<int32_t> tokens(running.size());
        if (greedy) {
            // The engine picks them where the logits are: sample_token's choice at temperature 0.
            LATHE_RETURN_IF_ERROR(engine.decode_greedy(steps, tokens));
        } else {
            logits.resize(running.size() * size_t(V));
            LATHE_RETURN_IF_ERROR(engine.decode(steps, logits));
            for (size_t k = 0; k < running.size(); ++k) {
                Running& r = running[k];
                const std::span<float> row(logits.data() + k * size_t(V), size_t(V));
                tokens[k] = sample_token(row, r.seen, o.sampling, r.rng, prob, order);
            }
        }
        LATHE_RETURN_IF_ERROR(engine.agree_tokens(tokens));
        std::vector<Running> still;
        for (size_t k = 0; k < running.size(); ++k) {
            Running& r = running[k];
            LATHE_ASSIGN_OR_RETURN(bool done, accept(r, tokens[k]));
            if (done)
                engine.close(r.seq);
            else
                still.push_back(std::move(r));
        }
        running = std::move(still);
    }
    return results;
}

}  // namespace lathe
