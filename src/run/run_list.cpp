#include "run/run_list.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <span>
#include <system_error>

#include "core/progress.h"
#include "io/config.h"
#include "io/file.h"
#include "io/json.h"
#include "model/model_config.h"
#include "model/registry.h"
#include "run/checkpoint_dir.h"
#include "run/train_schema.h"
#include "run/trainer.h"

namespace lathe {

namespace fs = std::filesystem;

namespace {

// The run's config.yaml loaded with the train schema, or nullopt when it is missing or invalid.
std::optional<Config> load_run_config(const fs::path& run, const ConfigSchema& schema) {
    const std::string path = (run / "config.yaml").string();
    auto config = Config::load(schema, std::span(&path, 1), {});
    if (!config.ok()) return std::nullopt;
    return std::move(*config);
}

// "llama 1.2M" from the newest complete checkpoint's config.json, else "llama L=2 C=48" from the
// run's configuration, else "".
std::string run_model(const fs::path& run, const std::optional<Config>& config) {
    auto newest = CheckpointDir::newest_in((run / "checkpoints").string());
    if (newest.ok() && newest->has_value()) {
        auto model = model_config_from_hf_file(**newest);
        if (model.ok()) {
            return fmt::format("{} {}", model->model_type,
                               Progress::format_count(double(model_config_num_parameters(*model))));
        }
    }
    if (!config) return "";
    std::string text;
    if (config->has("model.family")) {
        text = config->get_string("model.family");
    } else if (config->has("model.config")) {
        text = fs::path(config->get_string("model.config")).filename().string();
    }
    if (config->has("model.num_hidden_layers") && config->has("model.hidden_size")) {
        text += fmt::format("{}L={} C={}", text.empty() ? "" : " ",
                            config->get_int("model.num_hidden_layers"),
                            config->get_int("model.hidden_size"));
    }
    return text;
}

// A finite number at `key` of a metrics line, or nullopt.
std::optional<double> number_at(const nlohmann::json& line, const char* key) {
    auto it = line.find(key);
    if (it == line.end() || !it->is_number()) return std::nullopt;
    const double v = it->get<double>();
    if (!std::isfinite(v)) return std::nullopt;
    return v;
}

// Fills the metrics of `row` from RUN/metrics.jsonl; false (status set) on a malformed line.
bool read_metrics(const fs::path& path, RunRow& row) {
    std::ifstream in(path);
    if (!in) return true;  // no metrics yet: nothing logged
    std::string text;
    int64_t line_no = 0;
    while (std::getline(in, text)) {
        ++line_no;
        if (text.empty()) continue;
        const auto line = json_parse<nlohmann::json>(text);
        if (line.is_discarded() || !line.is_object() || !line.contains("step") ||
            !line["step"].is_number_integer()) {
            row.status = fmt::format("unreadable: metrics.jsonl line {}", line_no);
            row.steps_done = 0;
            row.last_loss.reset();
            row.best_valid_loss.reset();
            row.tokens_per_s.reset();
            return false;
        }
        const auto split = line.value("split", std::string());
        if (split == "train") {
            row.steps_done = line["step"].get<int64_t>();
            row.last_loss = number_at(line, "loss");
            row.tokens_per_s = number_at(line, "tokens_per_s");
        } else if (split == "valid") {
            const auto loss = number_at(line, "loss");
            if (loss && (!row.best_valid_loss || *loss < *row.best_valid_loss)) {
                row.best_valid_loss = loss;
            }
        }
    }
    return true;
}

RunRow read_run(const fs::path& run, const ConfigSchema& schema) {
    RunRow row;
    row.name = run.filename().string();
    row.path = run.string();
    const std::optional<Config> config = load_run_config(run, schema);
    row.model = run_model(run, config);
    if (config && config->has("train.steps")) row.steps_total = config->get_int("train.steps");
    // A run being trained reads as running even when its last metrics line is half written.
    const std::optional<std::string> by = FileLock::holder((run / kRunLockFile).string());
    const bool readable = read_metrics(run / "metrics.jsonl", row);
    if (by) {
        row.status = fmt::format("running ({})", *by);
    } else if (!readable) {
        return row;
    } else if (row.steps_total && row.steps_done == *row.steps_total) {
        row.status = "finished";
    } else {
        row.status = fmt::format("stopped at step {}", row.steps_done);
    }
    return row;
}

bool is_run_dir(const fs::path& p) {
    std::error_code ec;
    return fs::is_regular_file(p / "metrics.jsonl", ec) || fs::is_directory(p / "checkpoints", ec);
}

// Columns a UTF-8 string takes in a terminal (one per code point).
size_t display_width(const std::string& s) {
    return size_t(std::count_if(
        s.begin(), s.end(), [](char c) { return (static_cast<unsigned char>(c) & 0xC0) != 0x80; }));
}

constexpr const char* kUnknown = "—";

std::string loss_text(const std::optional<double>& v) {
    return v ? fmt::format("{:.4f}", *v) : kUnknown;
}

}  // namespace

Result<std::vector<RunRow>> run_list(const std::string& dir) {
    std::error_code ec;
    if (!fs::exists(dir, ec)) return not_found_error("{}: no such folder", dir);
    if (!fs::is_directory(dir, ec)) return not_found_error("{}: not a folder", dir);
    std::vector<fs::path> runs;
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
        std::error_code ec2;
        if (it->is_directory(ec2) && is_run_dir(it->path())) runs.push_back(it->path());
    }
    if (ec) return io_error("{}: cannot list the folder: {}", dir, ec.message());
    std::sort(runs.begin(), runs.end(),
              [](const fs::path& a, const fs::path& b) { return a.filename() < b.filename(); });
    const ConfigSchema schema = train_config_schema();
    std::vector<RunRow> rows;
    rows.reserve(runs.size());
    for (const auto& run : runs) rows.push_back(read_run(run, schema));
    return rows;
}

std::string run_list_table(const std::vector<RunRow>& rows) {
    std::vector<std::vector<std::string>> cells;
    cells.push_back(
        {"name", "model", "steps", "last loss", "best valid loss", "tokens/s", "status"});
    for (const auto& r : rows) {
        const bool unreadable = r.status.rfind("unreadable", 0) == 0;
        const std::string total = r.steps_total ? std::to_string(*r.steps_total) : kUnknown;
        cells.push_back(
            {r.name, r.model.empty() ? kUnknown : r.model,
             unreadable ? std::string(kUnknown) : fmt::format("{}/{}", r.steps_done, total),
             loss_text(r.last_loss), loss_text(r.best_valid_loss),
             r.tokens_per_s ? Progress::format_count(*r.tokens_per_s) : kUnknown, r.status});
    }
    std::vector<size_t> widths(cells.front().size(), 0);
    for (const auto& line : cells) {
        for (size_t c = 0; c < line.size(); ++c) {
            widths[c] = std::max(widths[c], display_width(line[c]));
        }
    }
    std::string out;
    for (const auto& line : cells) {
        std::string text;
        for (size_t c = 0; c < line.size(); ++c) {
            text += line[c];
            if (c + 1 < line.size())
                text += std::string(widths[c] - display_width(line[c]) + 2, ' ');
        }
        out += text + "\n";
    }
    return out;
}

nlohmann::ordered_json run_row_to_json(const RunRow& r) {
    nlohmann::ordered_json j;
    j["name"] = r.name;
    j["path"] = r.path;
    j["model"] = r.model.empty() ? nlohmann::ordered_json() : nlohmann::ordered_json(r.model);
    j["steps_done"] = r.steps_done;
    j["steps_total"] = r.steps_total ? nlohmann::ordered_json(*r.steps_total) : nullptr;
    j["last_loss"] = r.last_loss ? nlohmann::ordered_json(*r.last_loss) : nullptr;
    j["best_valid_loss"] = r.best_valid_loss ? nlohmann::ordered_json(*r.best_valid_loss) : nullptr;
    j["tokens_per_s"] = r.tokens_per_s ? nlohmann::ordered_json(*r.tokens_per_s) : nullptr;
    j["status"] = r.status;
    return j;
}

}  // namespace lathe
