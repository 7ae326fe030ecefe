#pragma once
// Every key `lathe train` accepts, with its type, default and meaning. This table is the
// contract users write configs against (README, configs/*.yaml); the keys train.steps,
// train.log_interval, checkpoint.interval, checkpoint.keep_last, data.path and data.tokenizer are
// stable by promise. Names follow GPT-NeoX where it has one.

#include <string>
#include <string_view>
#include <vector>

#include "io/config.h"

namespace lathe {

// The schema, built once per call (cheap); Config keeps a pointer to it, so keep it alive.
ConfigSchema train_config_schema();

// Resuming with a changed configuration. Run again with the same --run-dir, `lathe train` resumes
// from the newest checkpoint and logs the same losses, bit for bit, as a run never stopped. That
// holds only while what decides the model, the data and the sample order stays as the checkpoint
// was written with, so a resume compares the configuration with the checkpoint's (its
// trainer_state.json; RUN/config.yaml when it has none) and
//   - refuses, before anything is written, when an incompatible key differs, naming each with
//     its old and new value: model.* (the shape), data.* (token files, weights, split,
//     seq_length, tokenizer), train.seed, train.micro_batch_size,
//     train.gradient_accumulation_steps and checkpoint.init_from;
//   - logs every compatible key that differs and goes on: train.steps, train.log_interval,
//     train.eval_interval, train.eval_iters, train.device, train.precision, train.recompute,
//     train.threads, train.deterministic, train.nonfinite_policy, train.max_skipped_steps,
//     train.spike_factor, train.freeze, optimizer.*, lr.*, parallel.* (the optimizer state is
//     re-sharded on load), checkpoint.interval, checkpoint.keep_last, checkpoint.init_mode and
//     logging.*.
//   - a change of the number of ranks (data parallel) keeps the sample order only when the global
//     batch, ranks x micro-batch x accumulation, stays: the trainer then accepts a change of
//     train.gradient_accumulation_steps that keeps it (run/trainer.cpp). The steps after the change
//     follow the new values; they differ from those of a run that had them from the start where the
//     value shapes what came before (train.steps sizes GPT-NeoX's sample index and, with
//     lr.decay_steps 0, the schedule; another device computes other last bits).
// A key added to the schema is incompatible unless it is listed here as compatible.
bool train_key_resume_compatible(std::string_view key);

// The value of `key` in `c` as YAML-like text ("(unset)" when it has none): for messages and for
// comparing configurations.
std::string config_value_text(const Config& c, const ConfigKey& key);

// One key whose value differs between two configurations of the train schema.
struct TrainConfigChange {
    std::string key;
    std::string before, after;  // YAML-like text of the values; "(unset)" for no value
    bool compatible = false;    // train_key_resume_compatible(key)
};

// The keys, in schema order, whose values differ between `before` (the run's) and `after` (this
// command's). Both must be built with train_config_schema().
std::vector<TrainConfigChange> train_config_changes(const Config& before, const Config& after);

}  // namespace lathe
