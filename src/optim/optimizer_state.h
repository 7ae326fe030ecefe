#pragma once
// The optimizer state files of a lathe checkpoint, defined here and nowhere else: the trainer
// saves and resumes through them, `lathe convert --to lathe` writes a fresh full file.
//
// Two layouts, both safetensors over the parameter arena seen as one flat f32 vector
// (AdamWOptimizer's full vector, Model::params_flat(), padding included):
//
// The full file, optimizer.safetensors (one process, or rank 0 of a run whose every rank keeps
// the whole state):
//   exp_avg      F32, shape (P)   AdamW's first moment
//   exp_avg_sq   F32, shape (P)   AdamW's second moment
//   __metadata__ {"format": "lathe-adamw", "layout": "parameter arena"}
// P is the arena's length in f32 elements, element i of each moment belonging to element i of
// the arena. The bytes are those safetensors_write_file writes for the two tensors in this order
// with this metadata, so a saved state is byte for byte the same on every save of the same
// values.
//
// The shard set, optimizer.rank-RRRRR-of-WWWWW.safetensors for RRRRR = 00000 .. W-1 (a run of W
// ranks each keeping the moments of one contiguous range of the vector, ZeRO):
//   exp_avg      F32, shape (range_end - range_begin)   the first moment over the range
//   exp_avg_sq   F32, shape (range_end - range_begin)   the second moment over the range
//   __metadata__ {"format": "lathe-adamw-shard", "range_begin": B, "range_end": E,
//                 "total": T, "used": U, "rank": R, "world": W}   (decimal strings)
// T is the writer's arena length (padded so that W ranks get equal ranges), U <= T the end of
// its last real parameter. The W ranges tile [0, T) in rank order. Moments at and after U
// belong to padding and are zero.
//
// Re-sharding: a checkpoint is one vector, whatever wrote it. Loading fills any range of any
// arena length T' >= U (another world size, another padding) from the full file or from the
// shards that overlap the range, reading only the bytes of the overlap (the files are mapped);
// elements at and after U are zero. A shard set must be complete and written for this model
// (the same U), or loading is an error naming the file.
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

// The full file's name in a checkpoint folder.
inline constexpr const char* kOptimizerStateFullName = "optimizer.safetensors";

// The shard file of `rank` of `world` in a checkpoint folder:
// "optimizer.rank-00001-of-00004.safetensors" (at least five digits each, so names sort by rank).
// 0 <= rank < world (checked).
std::string optimizer_state_shard_name(int rank, int world);

// Writes `dir`/optimizer_state_shard_name(rank, world) with the moments of `optimizer`'s range
// and the shard metadata above; `used` is the end of the model's last real parameter
// (0 <= used <= optimizer.total(), checked). The ranges of the `world` writers must tile
// [0, total) in rank order (the loader checks). Errors: kIoError naming the file.
Status optimizer_state_save_shard(const AdamWOptimizer& optimizer, const std::string& dir, int rank,
                                  int world, int64_t used);

// Fills `optimizer`'s range (any range of any total >= used, checked) from the checkpoint folder
// `dir`: the full file (moments of at least `used` elements, zero from `used` on) or a complete
// shard set. Elements at and after `used` become zero. Errors, each naming the file or folder:
// neither kind present (kNotFound); both kinds, or shard files of two world sizes (kDataLoss:
// which one is the checkpoint is unknown); a shard set missing files (kNotFound naming the
// missing ones); a file that is not safetensors, a tensor missing, of another dtype or length,
// metadata missing, malformed or disagreeing with the file name or the other files, ranges that
// do not tile [0, total), a `used` other than this model's or a full file shorter than `used`
// (kDataLoss: written for another model).
Status optimizer_state_load_checkpoint(AdamWOptimizer& optimizer, const std::string& dir,
                                       int64_t used);

// What optimizer_state_load_checkpoint checks of `dir` for a model of `used` parameters, reading
// only the files' headers: for rank 0 to confirm, before it commits a checkpoint that every rank
// wrote, that the folder holds a complete state. Errors: optimizer_state_load_checkpoint's.
Status optimizer_state_check_checkpoint(const std::string& dir, int64_t used);

}  // namespace lathe
