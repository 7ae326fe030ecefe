#pragma once
// `lathe train CONFIG.yaml... --run-dir DIR [--set key=value...]`: the training loop.
//
// The run folder DIR holds:
//   config.yaml      the resolved configuration (every key, defaults included)
//   metrics.jsonl    one object per logged step (run/metrics.h) and per validation pass
//   tb/              TensorBoard event files (io/tensorboard.h; logging.tensorboard, rank 0): the
//                    scalars train/{loss,lr,grad_norm,tokens_per_s,skipped,memory_bytes,mfu} and
//                    valid/{loss,perplexity}, each its metrics.jsonl value rounded to f32; a
//                    resumed run adds a file whose START makes TensorBoard drop the steps after
//                    the checkpoint that the earlier files hold, so it shows each step once, as
//                    metrics.jsonl does
//   checkpoints/     step folders (run/checkpoint_dir.h); each a Hugging Face checkpoint
//                    (model.safetensors, config.json, tokenizer files) plus optimizer.safetensors
//                    (AdamW moments, parameter layout) and trainer_state.json
//
// A train line of metrics.jsonl (and of the console) carries, after step, split, loss (the mean
// over the interval's steps), lr, grad_norm, tokens, skipped, tokens_per_s (and world_size,
// comm_wait_ms with several ranks):
//   mfu           CUDA on a GPU with a known peak: tokens_per_s / ranks * flops_per_token / peak,
//                 with `lathe bench`'s flops_per_token and peak (run/bench.h: 989.4e12 on Hopper);
//                 left out elsewhere
//   memory_bytes  CUDA: the device's memory in use at the log line (cudaMemGetInfo total - free,
//                 so other processes on the GPU count too); CPU: the process's peak resident set
//
// Started again with the same command, a run resumes from its newest complete checkpoint, and the
// losses it logs are the same, bit for bit, as a run that was never stopped: the sample order is a
// pure function of the step (GPT-NeoX's sequential sampler over a seeded shuffle), the model and
// optimizer state are saved exactly (fp32), every op is deterministic, and the few running values
// the loop keeps (skip counts, the loss mean for spike detection, the partial log interval) are
// saved with the checkpoint. A resume whose configuration changes a key that this depends on is
// refused before anything is written; a change of any other key is logged (the rule and the keys:
// run/train_schema.h).
//
// Every token file (and label file) is checked when it is opened: an id outside the model's
// vocabulary (data prepared with another tokenizer) is an error naming the file, the id and where
// it is, before the first step.
//
// SIGTERM, SIGINT and SIGHUP finish the current step, save a checkpoint, and return ok with the
// signal in TrainOutcome (the command exits 128 + its number: 143, 130, 129); a signal that
// arrives after the last step changes nothing (the run is complete). With several ranks, each
// rank's request joins the step's gather: every rank stops after the same step, the one during
// which any of them received the signal.

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace lathe {

// RUN_DIR/memory_plan.txt: the memory plan table the trainer prints before step 1 (rank 0's, one
// rank's plan with several), for `lathe report` and people.
inline constexpr const char* kMemoryPlanFile = "memory_plan.txt";
// RUN_DIR/.lathe-train.lock: locked (io/file.h FileLock) by the trainer's rank 0 while it trains
// the run, holding "pid P on host H"; a second `lathe train` of the same run is refused, and
// `lathe runs` reads a locked run as running.
inline constexpr const char* kRunLockFile = ".lathe-train.lock";

struct TrainRequest {
    std::vector<std::string> config_files;  // merged left to right
    std::vector<std::string> overrides;     // "key=value"
    std::string run_dir;
};

struct TrainOutcome {
    int stop_signal = 0;  // SIGINT or SIGTERM when one stopped the run before its last step
    int64_t step = 0;     // the step the run reached (and saved)
};

// Runs (or resumes) a training run. Bad configuration fails before any work, naming the key.
Result<TrainOutcome> train_run(const TrainRequest& request);

}  // namespace lathe
