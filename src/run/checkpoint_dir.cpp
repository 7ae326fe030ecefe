#include "run/checkpoint_dir.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <string_view>
#include <system_error>

#include "core/check.h"
#include "core/log.h"
#include "core/strings.h"
#include "io/file.h"

namespace fs = std::filesystem;

namespace lathe {
namespace {

constexpr std::string_view kStepPrefix = "step-";
constexpr const char* kPartialPrefix = ".partial-";
constexpr const char* kConfigFile = "config.json";

// What a folder name in DIR/checkpoints/ is: a step folder ("step-" + decimal digits), one whose
// digits overflow int64, or anything else.
struct StepNameKind {
    enum { kOther, kStep, kOutOfRange } kind = kOther;
    int64_t step = 0;
};

StepNameKind classify_step_name(std::string_view name) {
    if (!starts_with(name, kStepPrefix)) return {};
    const std::string_view digits = name.substr(kStepPrefix.size());
    if (digits.empty() ||
        !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
        return {};
    int64_t step = 0;
    const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), step);
    if (ec != std::errc() || end != digits.data() + digits.size())
        return {StepNameKind::kOutOfRange, 0};
    return {StepNameKind::kStep, step};
}

Status out_of_range_step(const fs::path& folder) {
    return invalid_argument_error(
        "{}: not a checkpoint lathe writes (its step number does not fit in 64 bits); rename or "
        "remove the folder",
        folder.string());
}

// Steps of the step folders under `root`, ascending; with `need_config`, only those holding
// config.json (for folders lathe did not necessarily write).
Result<std::vector<int64_t>> list_steps(const fs::path& root, bool need_config) {
    std::vector<int64_t> steps;
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(root, ec)) {
        std::error_code entry_ec;
        if (!entry.is_directory(entry_ec)) continue;
        const StepNameKind k = classify_step_name(entry.path().filename().string());
        if (k.kind == StepNameKind::kOutOfRange) return out_of_range_step(entry.path());
        if (k.kind != StepNameKind::kStep) continue;
        if (need_config && !fs::is_regular_file(entry.path() / kConfigFile, entry_ec)) continue;
        steps.push_back(k.step);
    }
    if (ec) return io_error("{}: cannot list: {}", root.string(), ec.message());
    std::sort(steps.begin(), steps.end());
    return steps;
}

constexpr const char* kAcceptedForms =
    "expected a checkpoint folder (config.json + model*.safetensors: a lathe checkpoint or a "
    "Hugging Face folder), a run folder or its checkpoints/ folder (meaning the newest "
    "checkpoint), or checkpoints/latest";

}  // namespace

std::optional<int64_t> CheckpointDir::parse_step_name(const std::string& name) {
    const StepNameKind k = classify_step_name(name);
    if (k.kind != StepNameKind::kStep) return std::nullopt;
    return k.step;
}

std::string CheckpointDir::step_name(int64_t step) {
    return fmt::format("{}{:08d}", kStepPrefix, step);
}

Result<CheckpointDir> CheckpointDir::open(const std::string& root) {
    std::error_code ec;
    fs::create_directories(root, ec);
    if (ec) return io_error("{}: cannot create checkpoint folder: {}", root, ec.message());
    for (const auto& entry : fs::directory_iterator(root, ec)) {
        const std::string name = entry.path().filename().string();
        // Left by a run killed while writing: a partial checkpoint, or the temporary file of
        // `latest` (io/file.h's file_write_atomic names it latest.tmp-PID).
        if (name.rfind(kPartialPrefix, 0) == 0 ||
            name.rfind(std::string(kLatestCheckpointFile) + ".tmp-", 0) == 0)
            fs::remove_all(entry.path(), ec);
    }
    if (ec) return io_error("{}: cannot list: {}", root, ec.message());
    CheckpointDir d;
    d.root_ = root;
    return d;
}

Result<CheckpointDir> CheckpointDir::attach(const std::string& root) {
    std::error_code ec;
    if (!fs::is_directory(root, ec)) {
        return failed_precondition_error(
            "{}: no such checkpoint folder; rank 0 creates it before the other ranks attach, so "
            "the run folder must be on a file system every rank shares",
            root);
    }
    CheckpointDir d;
    d.root_ = root;
    d.attached_ = true;
    return d;
}

Result<std::vector<int64_t>> CheckpointDir::complete_steps() const {
    return list_steps(root_, false);
}

Result<std::optional<std::string>> CheckpointDir::newest_in(const std::string& root) {
    std::error_code ec;
    if (!fs::is_directory(root, ec)) return std::optional<std::string>();
    LATHE_ASSIGN_OR_RETURN(std::vector<int64_t> steps, list_steps(root, false));
    if (steps.empty()) return std::optional<std::string>();
    return std::optional<std::string>((fs::path(root) / step_name(steps.back())).string());
}

std::string CheckpointDir::partial_path(int64_t step) const {
    return (fs::path(root_) / (std::string(kPartialPrefix) + step_name(step))).string();
}

Result<std::string> CheckpointDir::begin(int64_t step) const {
    LATHE_CHECK(!attached_, "{}: begin() on a folder attached by a rank other than 0", root_);
    const fs::path partial = partial_path(step);
    std::error_code ec;
    fs::remove_all(partial, ec);
    fs::create_directories(partial, ec);
    if (ec) return io_error("{}: cannot create: {}", partial.string(), ec.message());
    return partial.string();
}

Result<std::string> CheckpointDir::commit(int64_t step, int keep_last) const {
    LATHE_CHECK(!attached_, "{}: commit() on a folder attached by a rank other than 0", root_);
    const fs::path partial = partial_path(step);
    const fs::path final_path = fs::path(root_) / step_name(step);
    std::error_code ec;
    if (!fs::is_directory(partial, ec)) {
        return failed_precondition_error("{}: commit without begin for step {}", root_, step);
    }
    // The same step written again (e.g. SIGTERM right after an interval save) replaces it.
    LATHE_RETURN_IF_ERROR(folder_publish(
        partial.string(), final_path.string(),
        (fs::path(root_) / (std::string(kPartialPrefix) + "old-" + step_name(step))).string()));
    LATHE_RETURN_IF_ERROR(file_write_atomic((fs::path(root_) / kLatestCheckpointFile).string(),
                                            step_name(step) + "\n"));
    if (keep_last > 0) {
        LATHE_ASSIGN_OR_RETURN(std::vector<int64_t> steps, complete_steps());
        const size_t keep = static_cast<size_t>(keep_last);
        for (size_t i = 0; i + keep < steps.size(); ++i) {
            if (steps[i] == step) continue;  // never prune what was just written
            // Renamed first, so that a kill during the removal leaves a partial folder (which
            // open() removes), never a step folder with some of its files.
            const fs::path doomed =
                fs::path(root_) / (std::string(kPartialPrefix) + "pruned-" + step_name(steps[i]));
            fs::remove_all(doomed, ec);
            fs::rename(fs::path(root_) / step_name(steps[i]), doomed, ec);
            if (!ec) fs::remove_all(doomed, ec);
            if (ec) return io_error("{}: cannot prune: {}", step_name(steps[i]), ec.message());
        }
    }
    return final_path.string();
}

namespace {

// The checkpoint `latest` names (a step-N folder beside it).
Result<fs::path> resolve_latest(const fs::path& latest) {
    LATHE_ASSIGN_OR_RETURN(std::string text, file_read_all(latest.string()));
    const std::string name(trim(text));
    if (classify_step_name(name).kind != StepNameKind::kStep) {
        return data_loss_error(
            "{}: holds '{}', not a checkpoint folder name (step-NNNNNNNN); pass the run folder {} "
            "for its newest checkpoint",
            latest.string(), escape_for_message(name), latest.parent_path().parent_path().string());
    }
    const fs::path target = latest.parent_path() / name;
    std::error_code ec;
    if (!fs::is_regular_file(target / kConfigFile, ec)) {
        return not_found_error(
            "{}: names {}, which is not a complete checkpoint (no {}/config.json); pass the run "
            "folder {} for its newest checkpoint",
            latest.string(), name, target.string(), latest.parent_path().parent_path().string());
    }
    return target;
}

}  // namespace

Result<fs::path> resolve_checkpoint(const fs::path& path) {
    std::error_code ec;
    const fs::file_status st = fs::status(path, ec);
    if (!fs::exists(st))
        return not_found_error("{}: no such folder; {}", path.string(), kAcceptedForms);
    if (fs::is_regular_file(st)) {
        if (path.filename() == kLatestCheckpointFile) return resolve_latest(path);
        const fs::path parent = path.has_parent_path() ? path.parent_path() : fs::path(".");
        if (fs::is_regular_file(parent / kConfigFile, ec)) {
            return invalid_argument_error(
                "{}: a file, not a checkpoint; pass the folder that holds it, {}", path.string(),
                parent.string());
        }
        return invalid_argument_error("{}: a file, not a checkpoint; {}", path.string(),
                                      kAcceptedForms);
    }
    if (!fs::is_directory(st))
        return invalid_argument_error("{}: not a folder; {}", path.string(), kAcceptedForms);
    if (fs::is_regular_file(path / kConfigFile, ec)) return path;

    const bool run_folder = fs::is_directory(path / "checkpoints", ec);
    const fs::path root = run_folder ? path / "checkpoints" : path;
    LATHE_ASSIGN_OR_RETURN(std::vector<int64_t> steps, list_steps(root, true));
    if (!steps.empty()) {
        const fs::path newest = root / CheckpointDir::step_name(steps.back());
        log_info("{}: newest checkpoint {}", path.string(), newest.string());
        return newest;
    }
    if (run_folder) {
        return not_found_error(
            "{}: a run folder with no complete checkpoint in {} yet (one is written every "
            "checkpoint.interval steps and when training ends)",
            path.string(), root.string());
    }
    return not_found_error("{}: no config.json, and no checkpoints/step-*/ with one; {}",
                           path.string(), kAcceptedForms);
}

Result<Tokenizer> checkpoint_tokenizer(const fs::path& dir) {
    if (!fs::exists(dir / "tokenizer.json"))
        return failed_precondition_error("--checkpoint {}: no tokenizer.json", dir.string());
    auto tok = Tokenizer::load((dir / "tokenizer.json").string());
    if (!tok.ok()) return tok.status().with_context("--checkpoint");
    return tok;
}

}  // namespace lathe
