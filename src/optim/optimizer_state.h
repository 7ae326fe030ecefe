#pragma once
// The optimizer state files of a lathe checkpoint, defined here and nowhere else: the trainer
// saves and resumes through them, `lathe convert --to lathe` writes a fresh full file.
//
// Three layouts, each safetensors over the parameter arena seen as one flat f32 vector, element
// i of each moment belonging to element i of the arena.
//
// The canonical coordinates are those of the one-process arena (Model::params_flat() of a run of
// one rank): its elements [0, U), U the end of the model's last real parameter ("used"). A run
// whose arena differs (ZeRO pads each unit per world size) writes and reads its state in these
// coordinates, so that every world size meets in one vector.
//
// The full file, optimizer.safetensors (one process, or rank 0 of a run whose every rank keeps
// the whole state):
//   exp_avg      F32, shape (P)   AdamW's first moment
//   exp_avg_sq   F32, shape (P)   AdamW's second moment
//   __metadata__ {"format": "lathe-adamw", "layout": "parameter arena"}
// P >= U is the writer's arena length; elements [0, U) are canonical, those after padding (zero).
// The bytes are those safetensors_write_file writes for the two tensors in this order with this
// metadata, so a saved state is byte for byte the same on every save of the same values.
//
// The range-list shard set, optimizer.rank-RRRRR-of-WWWWW.safetensors for RRRRR = 00000 .. W-1
// (a run of W ranks, each keeping the moments of many canonical ranges: chunk r of every unit):
//   exp_avg      F32, shape (N)   the first moment over the ranges, concatenated in list order
//   exp_avg_sq   F32, shape (N)   the second moment, likewise
//   __metadata__ {"format": "lathe-adamw-ranges", "ranges": "B0-E0,B1-E1,...", "used": U,
//                 "rank": R, "world": W}   (decimal strings)
// "ranges" lists the canonical ranges [Bi, Ei) of the file: decimal, "-" inside a range, ","
// between ranges, no spaces; every range non-empty, sorted and disjoint (Ei <= Bi+1), within
// [0, U); "" for none. N is the sum of Ei - Bi. The writer merges adjacent ranges, so the list is
// the shortest for its elements. No padding is stored. The W files' ranges tile [0, U): together
// they hold every canonical element once.
//
// The single-range shard set, the same names (a run of W ranks each keeping one contiguous range
// of its arena, the one-process arena padded at its end so that W ranks get equal ranges):
//   exp_avg      F32, shape (range_end - range_begin)   the first moment over the range
//   exp_avg_sq   F32, shape (range_end - range_begin)   the second moment over the range
//   __metadata__ {"format": "lathe-adamw-shard", "range_begin": B, "range_end": E,
//                 "total": T, "used": U, "rank": R, "world": W}   (decimal strings)
// T is the writer's arena length, U <= T. The W ranges tile [0, T) in rank order. Moments at and
// after U belong to padding and are zero; a loader ignores them.
//
// Re-sharding: a checkpoint is one vector, whatever wrote it. Loading fills any canonical ranges
// (and, for the single-range API, any range of any arena length T' >= U, zero from U on) from the
// full file or from a complete shard set of either kind at any world size, reading only the bytes
// of the overlap (the files are mapped). A set is complete when all W files are present, of one
// format, written for this model (the same U), and their ranges, cut at U, tile [0, U): disjoint,
// with no gap. Anything else is an error naming the file.
//
// The API for a run in canonical coordinates (ZeRO over units): each rank saves its ranges with
// optimizer_state_save_shard(exp_avg, exp_avg_sq, ranges, dir, rank, world, used), loads its
// ranges with optimizer_state_load_ranges(dir, used, ranges, exp_avg, exp_avg_sq), and rank 0
// checks the folder with optimizer_state_check_checkpoint(dir, used) before committing it; a run
// keeping the whole state writes the canonical vector with optimizer_state_write.
//
// Every write is atomic: nothing appears under the final name unless the whole file was written.
#include <cstdint>
#include <span>
#include <string>

#include <functional>

#include "core/status.h"
#include "optim/adamw_optimizer.h"

namespace lathe {

// Writes `path` with the two moments (the same length, checked).
Status optimizer_state_write(const std::string& path, std::span<const float> exp_avg,
                             std::span<const float> exp_avg_sq);

// Writes `path` with moments of `n` elements, byte for byte what optimizer_state_write writes for
// them, without holding them whole: fill(moment, begin, out) writes elements [begin, begin +
// out.size()) of moment 0 (exp_avg) or 1 (exp_avg_sq) into out, called in file order over chunks
// of at most 2^20 elements. Atomic (io/file.h AtomicFile). Errors: kIoError naming the path.
Status optimizer_state_write_streamed(
    const std::string& path, uint64_t n,
    const std::function<void(int moment, uint64_t begin, std::span<float> out)>& fill);

// Writes `path` with moments of `n` zeros (a fresh optimizer), byte for byte what
// optimizer_state_write writes for them, except that the data region is a hole in a sparse file:
// zeros read back from it cost no disk, so a 7B model's state does not write 56 GB of zeros (a
// file system without holes stores real zeros; the content is the same). Errors: kIoError naming
// the path.
Status optimizer_state_write_zeros(const std::string& path, uint64_t n);

// Reads elements [range.begin, range.end) of both moments of `path` into exp_avg and exp_avg_sq
// (range.size() elements each, checked); the file's tensors must hold `total` F32 elements.
// Errors name the file and the tensor: a file that is missing or not safetensors, a missing
// tensor (kNotFound), a tensor of another dtype or length (kDataLoss: written for another model),
// a NaN or infinity among the values read (kDataLoss, with their count and the first's element).
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

// Writes `dir`/optimizer_state_shard_name(rank, world), a single-range shard: the moments of
// `optimizer`'s range and the single-range metadata above; `used` is the end of the model's last
// real parameter (0 <= used <= optimizer.total(), checked). The ranges of the `world` writers must
// tile [0, total) in rank order (the loader checks). Errors: kIoError naming the file.
Status optimizer_state_save_shard(const AdamWOptimizer& optimizer, const std::string& dir, int rank,
                                  int world, int64_t used);

// Writes `dir`/optimizer_state_shard_name(rank, world), a range-list shard: the moments
// `exp_avg` and `exp_avg_sq` (each the concatenation of the elements of `ranges` in order, so of
// their total length, checked) with the range-list metadata above. `ranges` are canonical, sorted
// and disjoint within [0, used) (checked); empty ranges are dropped and adjacent ones merged in the
// metadata. The `world` writers' ranges must tile [0, used) (the loader checks). Errors: kIoError
// naming the file.
Status optimizer_state_save_shard(std::span<const float> exp_avg, std::span<const float> exp_avg_sq,
                                  std::span<const FlatRange> ranges, const std::string& dir,
                                  int rank, int world, int64_t used);

// Fills `exp_avg` and `exp_avg_sq` with the canonical `ranges` (each within [0, used), in any
// order; the outputs are their elements concatenated in list order, of the ranges' total length,
// checked) from the checkpoint folder `dir`: the full file, a complete range-list shard set or a
// complete single-range shard set, of any world size. Errors: optimizer_state_load_checkpoint's,
// and for a range-list set: metadata 'ranges' malformed (not "B-E" decimals, an empty range,
// ranges unsorted or overlapping, a range past the file's 'used'), two files holding one element
// or no file holding one (naming the files and the ranges), files of both formats in one set, the
// tensors' length other than the ranges' (kDataLoss).
Status optimizer_state_load_ranges(const std::string& dir, int64_t used,
                                   std::span<const FlatRange> ranges, std::span<float> exp_avg,
                                   std::span<float> exp_avg_sq);

// Fills `optimizer`'s range (any range of any total >= used, checked) from the checkpoint folder
// `dir`: the full file (moments of at least `used` elements, zero from `used` on) or a complete
// shard set of either format. Elements at and after `used` become zero. Errors, each naming the
// file or folder: no full file and no shard file (kNotFound); both, or shard files of two world
// sizes (kDataLoss: which one is the checkpoint is unknown); a shard set missing files (kNotFound
// naming the missing ones); a file that is not safetensors, a tensor missing, of another dtype or
// length, metadata missing, malformed or disagreeing with the file name or the other files, ranges
// that do not tile [0, total) (single-range) or [0, used) (range-list), a `used` other than this
// model's or a full file shorter than `used` (kDataLoss: written for another model), a NaN or
// infinity among the moments read (kDataLoss naming the file, the tensor, their count and the
// first's canonical element: a diverged run's state is not resumed).
Status optimizer_state_load_checkpoint(AdamWOptimizer& optimizer, const std::string& dir,
                                       int64_t used);

// What optimizer_state_load_checkpoint checks of `dir` for a model of `used` parameters, reading
// only the files' headers: for rank 0 to confirm, before it commits a checkpoint that every rank
// wrote, that the folder holds a complete state. Errors: optimizer_state_load_checkpoint's, but
// for the values' (it reads none).
Status optimizer_state_check_checkpoint(const std::string& dir, int64_t used);

}  // namespace lathe
