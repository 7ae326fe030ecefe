#pragma once
// trainer_state.json: the loop state a checkpoint carries so that resuming is exact. Written by
// the trainer at every checkpoint and by `lathe convert --to lathe` (a fresh state at step 0);
// read by the trainer on resume and by `checkpoint.init_mode: continue`. One definition here keeps
// the writers and the reader from drifting apart.

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>

#include "core/status.h"
#include "optim/optimizer_state.h"

namespace lathe {

inline constexpr const char* kTrainerStateFile = "trainer_state.json";
// One process's AdamW state (optim/optimizer_state.h, which also names the per-rank shard files).
inline constexpr const char* kOptimizerStateFile = kOptimizerStateFullName;
// A checkpoint's delayed fp8 scaling state (fp8.recipe delayed: model/fp8_state.h), beside it.
inline constexpr const char* kFp8ScalingFile = "fp8_scaling.json";

struct TrainerState {
    int64_t step = 0;       // optimizer steps done (skipped ones included)
    int64_t adam_step = 0;  // AdamW updates applied (t of the bias correction)
    int64_t skipped_steps = 0;
    int64_t skipped_in_a_row = 0;
    double loss_mean = 0.0;  // running mean of accepted losses (spike detection)
    int64_t loss_count = 0;
    double interval_loss_sum = 0.0;  // since the last log line
    int64_t interval_steps = 0;
    int64_t eval_passes = 0;  // validation passes done (the valid iterator's position)
    int64_t consumed_train_samples = 0;
    int64_t tokens = 0;
};

// The state's keys (doubles at full precision, so they round-trip exactly) plus lathe_version.
// Callers add their own keys (the resolved config, where a conversion came from).
nlohmann::json trainer_state_to_json(const TrainerState& state);

// Reads the keys written by trainer_state_to_json; `path` names the file in errors (kDataLoss for
// a missing key or a wrong type).
Result<TrainerState> trainer_state_from_json(const nlohmann::json& j, const std::string& path);

}  // namespace lathe
