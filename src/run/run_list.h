#pragma once
// `lathe runs`: one row per training run found directly under a folder. A run folder is one
// holding metrics.jsonl and/or checkpoints/ (what `lathe train --run-dir` writes). A row reads:
//   model       the newest complete checkpoint's config.json (family and parameter count), else
//               the run's config.yaml (model.family and its L and C), else empty
//   steps       the last "train" line of metrics.jsonl (0 when none) out of config.yaml's
//               train.steps
//   last loss, tokens/s   that last "train" line; best validation loss: the lowest "valid" loss
//   status      "running (pid P on host H)" while a `lathe train` holds the run's lock
//               (run/trainer.h kRunLockFile), else "finished" when done == total, else
//               "stopped at step N".
// A metrics.jsonl line that is not a JSON object makes that row's status
// "unreadable: metrics.jsonl line N" (1-based), with no metrics; the other rows are unaffected.

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"

namespace lathe {

struct RunRow {
    std::string name;   // the run folder's name
    std::string path;   // the run folder
    std::string model;  // "llama 1.2M", "llama L=2 C=48", or "" when unknown
    int64_t steps_done = 0;
    std::optional<int64_t> steps_total;  // config.yaml's train.steps
    std::optional<double> last_loss;
    std::optional<double> best_valid_loss;
    std::optional<double> tokens_per_s;
    std::string status;  // "finished", "stopped at step N", "unreadable: metrics.jsonl line N"
};

// The rows of the run folders directly under `dir`, sorted by name. Errors: `dir` missing or not
// a folder (not found, naming it), a folder that cannot be listed (io).
Result<std::vector<RunRow>> run_list(const std::string& dir);

// The rows as an aligned text table with a header line; "—" for a value that is unknown.
std::string run_list_table(const std::vector<RunRow>& rows);

// One row as a JSON object (null for a value that is unknown).
nlohmann::ordered_json run_row_to_json(const RunRow& row);

}  // namespace lathe
