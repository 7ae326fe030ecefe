#pragma once
// The checkpoints folder of a run, DIR/checkpoints/:
//
//   step-00000100/        one complete checkpoint (model.safetensors, config.json, tokenizer
//   step-00000200/        files, optimizer state, trainer_state.json)
//   latest                text file naming the newest complete checkpoint ("step-00000200")
//   .partial-step-.../    a checkpoint being written; never read, removed on the next start
//   latest.tmp-PID        `latest` being written; removed on the next start
//
// A checkpoint is written into a ".partial-" folder and renamed to its final name only when every
// file in it is complete (and fsynced); `latest` moves after that, atomically. A run killed at
// any moment therefore leaves either the old or the new checkpoint as newest, never half of one.
// Resume picks the newest complete step folder (it does not trust `latest` alone: a kill between
// the rename and the marker update leaves `latest` one behind, which is still consistent).
//
// Several processes (the ranks of a data-parallel run, on a file system they share) write one
// checkpoint together. Rank 0 owns the folder: it open()s it (creating it and cleaning leftover
// ".partial-" folders), begin()s each checkpoint and commit()s it. The other ranks attach() (which
// creates and cleans nothing) and write their files into partial_path(step) only after rank 0's
// begin() returned, and rank 0 commits only after every rank has finished its files: the caller
// orders both with a collective. Until the commit, the checkpoint is a ".partial-" folder, which
// newest() never returns however many of its files are written.

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "tokenizer/tokenizer.h"

namespace lathe {

class CheckpointDir {
public:
    // `root` is DIR/checkpoints; created if missing. Stale ".partial-*" folders and
    // "latest.tmp-*" files (of a run killed while writing them) are removed.
    // Rank 0's (the one writer of the folder's structure).
    static Result<CheckpointDir> open(const std::string& root);
    // `root`, opened by rank 0, for the other ranks of the run: creates and removes nothing.
    // begin() and commit() are rank 0's (checked). Errors: `root` is not a folder
    // (kFailedPrecondition: rank 0 opens it first, on a file system every rank shares).
    static Result<CheckpointDir> attach(const std::string& root);

    // Folder name for a step: "step-00000100" (zero-padded so names sort by step).
    static std::string step_name(int64_t step);
    // The step of a folder name written by step_name ("step-00000100" -> 100), or nullopt for any
    // other name (".partial-*", "latest", a number beyond int64). For readers that must not
    // open() (which cleans).
    static std::optional<int64_t> parse_step_name(const std::string& name);

    // Steps of complete checkpoints, ascending. Errors: a "step-" folder whose digits do not fit in
    // int64 (no run writes one; the message names it, as picking an older checkpoint silently
    // would resume or evaluate something other than what the folder suggests).
    Result<std::vector<int64_t>> complete_steps() const;
    // The newest complete checkpoint's folder, or nullopt when there is none.
    Result<std::optional<std::string>> newest() const { return newest_in(root_); }
    // newest() for a `root` that is not open()ed: reads only (creates and cleans nothing);
    // nullopt also when `root` is not a folder.
    static Result<std::optional<std::string>> newest_in(const std::string& root);

    // The ".partial-" folder begin(step) creates, where every rank writes its files for `step`:
    // "ROOT/.partial-step-00000100". Computes the name only.
    std::string partial_path(int64_t step) const;
    // Starts writing the checkpoint for `step`: returns a fresh empty ".partial-" folder to write
    // every file into (partial_path(step)). A leftover folder of the same step is removed first.
    Result<std::string> begin(int64_t step) const;
    // Publishes the folder begun for `step`: syncs it, renames it to its final name (replacing an
    // existing checkpoint of the same step), updates `latest`, then prunes to the newest
    // `keep_last` checkpoints (keep_last <= 0 keeps all). Returns the final folder path.
    Result<std::string> commit(int64_t step, int keep_last) const;

    const std::string& root() const { return root_; }

    // Whether this is attach()'s (a rank other than 0) rather than open()'s.
    bool attached() const { return attached_; }

private:
    std::string root_;
    bool attached_ = false;
};

// The file in DIR/checkpoints/ naming the newest complete checkpoint.
inline constexpr const char* kLatestCheckpointFile = "latest";

// The checkpoint folder meant by a path given on the command line or in a config, in any of the
// forms a user has at hand. Read-only (a run may be writing there at the same time):
//
//   a folder with config.json           itself (a lathe checkpoint or a Hugging Face folder)
//   RUN/ (holds checkpoints/)           its newest complete checkpoint
//   RUN/checkpoints/                    its newest complete checkpoint
//   RUN/checkpoints/latest              the checkpoint the marker names
//
// A complete checkpoint is a step-N folder holding config.json. Errors (naming the path and the
// accepted forms): a path that does not exist, a file other than `latest`, a `latest` that names
// no checkpoint, a run folder with no complete checkpoint, a folder of none of these kinds, a
// step folder whose number does not fit in int64.
Result<std::filesystem::path> resolve_checkpoint(const std::filesystem::path& path);

// The tokenizer of checkpoint folder `dir` (resolved): DIR/tokenizer.json, loaded, for the commands
// that score text. Errors, in --checkpoint's context: no tokenizer.json, one that does not load.
Result<Tokenizer> checkpoint_tokenizer(const std::filesystem::path& dir);

}  // namespace lathe
