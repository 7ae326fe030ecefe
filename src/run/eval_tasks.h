#pragma once
// `lathe eval tasks --checkpoint DIR --tasks FILE.yaml [--tasks ...]`: multiple-choice
// log-likelihood tasks and greedy generation tasks, scored as lm-evaluation-harness scores them
// with its Hugging Face backend (docs/INFERENCE.md, "Eval tasks"). Task files and prompts:
// run/eval_tasks_spec.h.
//
// Log-likelihood of a request (context, continuation):
//   - trailing whitespace of the context moves to the front of the continuation;
//   - whole = encode(context + continuation), ctx = encode(context) (the tokenizer's default
//     special tokens, as transformers' tokenizer(text) adds them), cont = whole[len(ctx):];
//     an empty context is [p] (config.json's bos_token_id, else eos_token_id) with
//     cont = encode(continuation) without special tokens (when cont starts with p itself, that
//     first token is the context instead);
//   - the model reads (ctx + cont)[-(L+1):][:-1] (L = max_position_embeddings) and
//       ll = sum over the last |cont| positions of log_softmax(logits)[cont token],
//     is_greedy = every one of those positions' argmax (the lowest id among equal maxima) is the
//     continuation's token.
// Multiple choice, per record, requests (context, target_delimiter + choice_i) give ll_i:
//   acc      = [argmax_i ll_i == gold]               (the first index among equal maxima)
//   acc_norm = [argmax_i ll_i / chars(choice_i) == gold]   chars: Unicode code points of the
//                                                           choice without the delimiter
// Generate, per record: encode(context) left-truncated to L - max_gen_toks tokens, greedy tokens
// until an EOS id (generation_config.json's eos_token_id, else config.json's), max_gen_toks, or
// a stop string; text = decode(new tokens, skipping special tokens) cut before the first
// occurrence of each string of until + [decode(EOS)] in turn;
// then, with strip, without leading and trailing ASCII whitespace;
//   exact_match = [form(text) == form(target)], form: ASCII-lowercased with ignore_case, ASCII
//   punctuation removed with ignore_punctuation (the identity otherwise).
// Each metric's score is the mean over records and its stderr the sample standard deviation over
// records divided by sqrt(n) (lm-eval's mean_stderr; null for one record).
//
// Batching: the log-likelihood requests are sorted by length (longest first) and run through
// Model::logits in groups of eval_tasks_logits_rows(--batch-size, T, V, kEvalTasksLogitsBudget)
// (T: the group's longest input; eval_tasks_spec.h), so the host logits buffer holds at most
// max(kEvalTasksLogitsBudget, T*V*4) bytes: 1 GiB, or one request's (T, V) f32 logits where
// that alone is larger. The result of a request does not depend on its group. On the CPU the model
// computes in f32; on CUDA the logits are bf16 rounded, so scores can differ from an f32 reference
// where choices are within bf16 rounding of each other.

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace lathe {

struct EvalTasksRequest {
    std::string checkpoint;          // as eval loss's (resolve_checkpoint); needs tokenizer.json
    std::vector<std::string> tasks;  // task YAML files
    std::string output;              // summary JSON file ("" = stdout only)
    std::string samples;             // per-example JSONL ("" = none)
    int64_t batch_size = 8;          // log-likelihood requests per forward pass
    int64_t limit = 0;               // first N records of each task (0 = all)
    std::string device = "auto";
};

struct EvalMetric {
    std::string name;  // acc, acc_norm, exact_match
    double value = 0.0;
    double stderr_ = -1.0;  // < 0: undefined (one record)
};

struct EvalTaskResult {
    std::string name, kind, file;
    int64_t records = 0;
    std::vector<EvalMetric> metrics;
};

struct EvalTasksResult {
    std::string checkpoint;
    std::vector<EvalTaskResult> tasks;
};

// Errors: the task files' (eval_task_load, eval_task_build), a checkpoint that does not load or
// has no tokenizer.json, a continuation that encodes to no token, a choice with no characters,
// an output that cannot be written. Outputs are written under temporary names and renamed.
Result<EvalTasksResult> eval_tasks_run(const EvalTasksRequest& request);

// The summary: {"checkpoint", "device", "tasks": {NAME: {"kind", "file", "records",
// METRIC: value, METRIC_stderr: value or null, ...}}}.
std::string eval_tasks_json(const EvalTasksRequest& request, const EvalTasksResult& result);

}  // namespace lathe
