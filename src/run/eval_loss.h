#pragma once
// `lathe eval loss --checkpoint DIR --data PREFIX --seq-len T --batches N`.
//
// The definition tests, users and the vocabulary work rely on: read the token file as one stream
// (its documents concatenated in order, nothing inserted between them), cut the first N
// non-overlapping windows of T + 1 tokens (window i is stream[i (T+1), (i+1) (T+1))), predict
// tokens 1..T of each window from the tokens before it, and report the mean cross-entropy over
// all N T predictions (natural log), its exponential (perplexity) and the token count.

#include <cstdint>
#include <string>

#include "core/status.h"

namespace lathe {

struct EvalLossRequest {
    std::string checkpoint;   // a checkpoint, a run folder, its checkpoints/ or checkpoints/latest
                              // (resolve_checkpoint in run/checkpoint_dir.h)
    std::string data;         // token-file prefix
    int64_t seq_len = 0;      // T
    int64_t batches = 0;      // N windows
    int64_t micro_batch = 8;  // windows per forward pass (memory only; the result does not change)
    int threads = 0;
    std::string device = "auto";  // auto | cpu | cuda
};

struct EvalLossResult {
    double loss = 0.0;
    double perplexity = 0.0;
    int64_t tokens = 0;  // N T predictions
    int64_t windows = 0;
    std::string checkpoint;  // the checkpoint folder evaluated
};

// Errors: a --checkpoint that names no checkpoint, a checkpoint that does not load, a token file
// that does not open, a stream shorter than N (T + 1) tokens (the message says how many windows
// fit), T beyond the model's limit.
Result<EvalLossResult> eval_loss_run(const EvalLossRequest& request);

// The result as one JSON line (no trailing newline).
std::string eval_loss_json(const EvalLossRequest& request, const EvalLossResult& result);

}  // namespace lathe
