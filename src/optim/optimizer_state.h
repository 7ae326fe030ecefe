#pragma once
// The optimizer state file of a lathe checkpoint (optimizer.safetensors), defined here and
// nowhere else: the trainer saves and resumes through it, `lathe convert --to lathe` writes a
// fresh one.
//
// Layout (safetensors):
//   exp_avg      F32, shape (P)   AdamW's first moment
//   exp_avg_sq   F32, shape (P)   AdamW's second moment
//   __metadata__ {"format": "lathe-adamw", "layout": "parameter arena"}
// P is the parameter arena's length in f32 elements, padding included (Model::params_flat()),
// element i of each moment belonging to element i of the arena (AdamWOptimizer's full vector).
// The bytes are those safetensors_write_file writes for the two tensors in this order with this
// metadata, so a saved state is byte for byte the same on every save of the same values.
//
// Every write is atomic: nothing appears under the final name unless the whole file was written.

#include <cstdint>
#include <span>
#include <string>

#include "core/status.h"
#include "optim/adamw_optimizer.h"

namespace lathe {

// Writes `path` with the two moments (the same length, checked).
Status optimizer_state_write(const std::string& path, std::span<const float> exp_avg,
                             std::span<const float> exp_avg_sq);

// Writes `path` with moments of `n` zeros (a fresh optimizer), byte for byte what
// optimizer_state_write writes for them, except that the data region is a hole in a sparse file:
// zeros read back from it cost no disk, so a 7B model's state does not write 56 GB of zeros (a
// file system without holes stores real zeros; the content is the same). Errors: kIoError naming
// the path.
Status optimizer_state_write_zeros(const std::string& path, uint64_t n);

// Reads elements [range.begin, range.end) of both moments of `path` into exp_avg and exp_avg_sq
// (range.size() elements each, checked); the file's tensors must hold `total` F32 elements.
// Errors name the file and the tensor: a file that is missing or not safetensors, a missing
// tensor (kNotFound), a tensor of another dtype or length (kDataLoss: written for another model).
Status optimizer_state_read(const std::string& path, int64_t total, FlatRange range,
                            std::span<float> exp_avg, std::span<float> exp_avg_sq);

// The state of `optimizer` (over the whole vector, checked) written to `path`.
Status optimizer_state_save(const AdamWOptimizer& optimizer, const std::string& path);
// The state of `optimizer` (any range: a shard reads its part) read from `path`.
Status optimizer_state_load(AdamWOptimizer& optimizer, const std::string& path);

}  // namespace lathe
