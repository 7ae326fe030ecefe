#pragma once
// Resumable stages for `lathe align` : a stage's outputs are reused when its inputs and
// settings are unchanged.
//
// How a stage uses it:
//
//   StageFingerprint fp("terms");
//   fp.add_setting("top_k", options.top_k);                 // every setting that changes output
//   LATHE_RETURN_IF_ERROR(fp.add_input("corpus", options.corpus));
//   if (!options.force && stage_up_to_date(options.output, fp)) return ...;  // logs "skipped"
//   ... write every output with AtomicFile / file_write_atomic (io/file.h) ...
//   LATHE_RETURN_IF_ERROR(stage_write_manifest(options.output, fp, {options.output, report}));
//
// The manifest "<primary output>.stage.json" is written last, after every output is committed, so
// a run killed at any point leaves either no manifest or one that describes complete outputs (a
// stale manifest from an earlier run no longer matches the new outputs' size/mtime, see below).
//
// What the fingerprint covers (a 128-bit hash, hex, of one canonical text):
//   - the stage name and the manifest format version;
//   - each setting as "key=value" in the order added (callers add them in a fixed order);
//   - each input by role (not by path), and either
//       * a content hash, for regular files up to kContentHashMaxBytes (tokenizer.json, configs,
//         maps): such files are often rewritten or copied with identical bytes (an upstream stage
//         rerun, `cp`, a git checkout), which changes their mtime but should not force downstream
//         stages to rerun; hashing 64 MiB costs a few tens of milliseconds;
//       * or absolute path + size + mtime (nanoseconds), for larger files (corpora, token files,
//         vectors): hashing gigabytes would cost as much as the stage's own first pass, and any
//         tool that rewrites a file changes its mtime (lathe's atomic renames always do);
//       * a folder (a checkpoint) is fingerprinted as the sorted list of its regular files
//         (relative path, then one of the two above), recursively.
// The lathe version is recorded in the manifest but is not part of the fingerprint: a new lathe
// that computes the same thing need not redo hours of work; pass --force to rerun regardless.
//
// stage_up_to_date() also checks the outputs: each must exist with the size and mtime recorded
// when the manifest was written, so an output deleted, truncated or edited by hand makes the stage
// run again.
//
// Manifest format (JSON object):
//   {"stage": "terms", "format": 1, "fingerprint": "<32 hex>", "lathe_version": "0.1.0",
//    "created": "2026-11-26T02:30:00Z",
//    "settings": {"top_k": "2000", ...},
//    "inputs": [{"role": "corpus", "path": "/abs/corpus.txt", "size": 123,
//                "mtime_ns": 1764123456000000000} | {..., "content_hash": "<32 hex>"}],
//    "outputs": [{"path": "/abs/out.tsv", "size": 456, "mtime_ns": 1764...}]}
// "settings" and "inputs" are there for people (why did it rerun?); only "fingerprint" and
// "outputs" decide.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace lathe {

// Files at most this large are fingerprinted by content, larger ones by path + size + mtime.
inline constexpr uint64_t kContentHashMaxBytes = uint64_t{64} << 20;

// 128-bit hash of a byte string as 32 lowercase hex digits (not cryptographic; two independent
// 64-bit multiply-xorshift lanes). Deterministic across runs and machines (little-endian).
std::string stage_hash_hex(std::string_view bytes);

class StageFingerprint {
public:
    explicit StageFingerprint(std::string stage);

    // Adds a setting that changes the stage's outputs. Values are rendered canonically: integers
    // in decimal, doubles with 17 significant digits, booleans as true/false.
    void add_setting(std::string_view key, std::string_view value);
    void add_setting(std::string_view key, const char* value) {
        add_setting(key, std::string_view(value));
    }
    void add_setting(std::string_view key, const std::string& value) {
        add_setting(key, std::string_view(value));
    }
    void add_setting(std::string_view key, int64_t value);
    void add_setting(std::string_view key, int value) { add_setting(key, int64_t{value}); }
    void add_setting(std::string_view key, uint64_t value);
    void add_setting(std::string_view key, double value);
    void add_setting(std::string_view key, bool value);

    // Adds an input file or folder under `role` (see the header comment for what is recorded).
    // Errors: the path does not exist or cannot be read (kNotFound / kIoError, naming the path and
    // the role).
    Status add_input(std::string_view role, const std::string& path);

    const std::string& stage() const { return stage_; }
    // The fingerprint: stage_hash_hex of the canonical text.
    std::string digest() const;
    // The canonical text (one line per stage/setting/input entry), for tests and debugging.
    const std::string& canonical() const { return canonical_; }
    // The "settings" and "inputs" members of the manifest, as a JSON text (an object).
    std::string description_json() const;

private:
    Status add_file(std::string_view role, const std::string& shown_path, const std::string& path);
    std::string stage_;
    std::string canonical_;
    std::vector<std::pair<std::string, std::string>> settings_;
    std::string inputs_json_;  // comma-separated JSON objects
};

// "<primary_output>.stage.json".
std::string stage_manifest_path(const std::string& primary_output);

// True when the manifest beside `primary_output` exists, is readable, has this stage's name and
// fingerprint, and every output it lists exists with its recorded size and mtime. Never an error:
// a missing, corrupt or stale manifest means "run the stage" (the reason is logged at debug
// level). When it returns true it logs at info level "<stage>: outputs up to date (<manifest>),
// skipped".
bool stage_up_to_date(const std::string& primary_output, const StageFingerprint& fingerprint);

// Writes the manifest atomically, recording each of `outputs` (which must exist: call after they
// are committed) with its size and mtime. `outputs` should include primary_output. Errors: an
// output missing (kFailedPrecondition, a bug in the caller), the manifest cannot be written.
Status stage_write_manifest(const std::string& primary_output, const StageFingerprint& fingerprint,
                            const std::vector<std::string>& outputs);

}  // namespace lathe
