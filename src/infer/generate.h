#pragma once
// Generation over the engine: every request's prompt is prefilled, then tokens are sampled one
// step at a time for all running requests together, with continuous batching: up to batch_size
// requests run at once; a finished request leaves between two decode steps and the next waiting
// one joins (opened and prefilled), so requests of different lengths share steps.
//
// A request stops after a stop token (its id is kept as the last generated token), after a stop
// string appears in its text (the token that completed it is the last), after max_new_tokens, or
// when its sequence fills the engine's context (max_len). Each request samples with its own
// generator, SampleRng(sample_seed(seed, index)), so its tokens do not depend on the batch.
// Tensor parallel (the engine has a group): each sampled token is rank 0's on every rank
// (InferenceEngine::agree_tokens), so every rank takes the same steps and stops alike.

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "infer/engine.h"
#include "infer/sampling.h"

namespace lathe {

struct GenerateOptions {
    SamplingParams sampling;
    uint64_t seed = 0;
    int64_t max_new_tokens = 64;
    std::vector<int32_t> stop_ids;          // e.g. the checkpoint's EOS ids
    std::vector<std::string> stop_strings;  // matched in the decoded text of the new tokens
    int64_t batch_size = 1;                 // requests running at once (<= engine max_sequences)
};

struct GenerateResult {
    std::vector<int32_t> ids;  // new tokens only
    std::string text;          // their text, cut right after a stop string that ended it
    std::string stop;          // "stop_id", "stop_string", "length" (max_new_tokens) or "context"
};

// The text of token ids (the tokenizer's decode); needed for stop strings and for `text`.
using Detokenizer = std::function<Result<std::string>(std::span<const int32_t> ids)>;
// Called after each new token of request `index` with its result so far (streaming).
using TokenCallback = std::function<void(size_t index, const GenerateResult& so_far)>;

// Runs every prompt (each at least one token, each shorter than the engine's max_len) and
// returns the results in input order. Errors: from the engine (a token outside the vocabulary),
// the detokenizer, or options (batch_size above the engine's max_sequences, max_new_tokens < 1).
Result<std::vector<GenerateResult>> generate(InferenceEngine& engine,
                                             const std::vector<std::vector<int32_t>>& prompts,
                                             const GenerateOptions& options,
                                             const Detokenizer& detokenize,
                                             const TokenCallback& on_token = {});

}  // namespace lathe
