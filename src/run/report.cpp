#include "run/report.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "core/progress.h"
#include "io/file.h"
#include "io/json.h"
#include "run/trainer.h"

namespace lathe {

namespace fs = std::filesystem;

namespace {

// Colours of series 0, 1, ... (repeating), distinguishable on white.
constexpr std::array<const char*, 8> kPalette = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e",
                                                 "#9467bd", "#8c564b", "#e377c2", "#17becf"};

// Tick values covering [lo, hi]: a step of 1, 2 or 5 times a power of ten, about 5 ticks.
std::vector<double> nice_ticks(double lo, double hi, double* step_out) {
    const double raw = (hi - lo) / 5.0;
    const double mag = std::pow(10.0, std::floor(std::log10(raw)));
    double step = mag;
    for (double m : {1.0, 2.0, 5.0, 10.0}) {
        step = m * mag;
        if (step >= raw) break;
    }
    // Counted, not accumulated: a step too small for the range's magnitude cannot loop forever.
    std::vector<double> ticks;
    const double first = std::ceil(lo / step);
    for (int i = 0; i <= 20; ++i) {
        const double t = (first + i) * step;
        if (t > hi + step * 1e-9) break;
        ticks.push_back(std::abs(t) < step * 1e-9 ? 0.0 : t);
    }
    *step_out = step;
    return ticks;
}

// A tick value with as many significant digits as tell ticks `step` apart.
std::string tick_text(double v, double step) {
    if (v == 0) return "0";
    const int digits =
        std::max(1, int(std::floor(std::log10(std::abs(v))) - std::floor(std::log10(step))) + 1);
    if (std::abs(v) >= 1e5 || std::abs(v) < 1e-3) return fmt::format("{:.{}e}", v, digits - 1);
    return fmt::format("{:.{}g}", v, std::max(digits, 6));
}

// A number for an SVG attribute (two decimals are below a pixel's width).
std::string px(double v) {
    return fmt::format("{:.2f}", v);
}

}  // namespace

std::string html_escape(std::string_view text) {
    std::string out;
    out.reserve(text.size());
    for (char c : text) {
        switch (c) {
            case '&':
                out += "&amp;";
                break;
            case '<':
                out += "&lt;";
                break;
            case '>':
                out += "&gt;";
                break;
            case '"':
                out += "&quot;";
                break;
            case '\'':
                out += "&#39;";
                break;
            default:
                out += c;
        }
    }
    return out;
}

std::string svg_plot(std::string_view title, std::string_view x_label, std::string_view y_label,
                     const std::vector<PlotSeries>& series, int width, int height) {
    // Plot area inside the margins: title and legend above, tick labels and x label below, tick
    // labels and the rotated y label on the left.
    const double left = 72, right = 16, top = 48, bottom = 44;
    const double pw = width - left - right, ph = height - top - bottom;
    double x0 = std::numeric_limits<double>::infinity(), x1 = -x0, y0 = x0, y1 = -x0;
    for (const auto& s : series) {
        for (const auto& [x, y] : s.points) {
            if (!std::isfinite(x) || !std::isfinite(y)) continue;
            x0 = std::min(x0, x), x1 = std::max(x1, x), y0 = std::min(y0, y), y1 = std::max(y1, y);
        }
    }
    if (!std::isfinite(x0)) x0 = 0, x1 = 1, y0 = 0, y1 = 1;  // no point: empty axes
    // A single value, or values a few ulps apart (e.g. a constant learning rate), get a range
    // around them so that they sit in the middle and the ticks have a step to count with.
    const auto widen = [](double& lo, double& hi, double around_zero) {
        const double scale = std::max(std::abs(lo), std::abs(hi));
        if (hi - lo > 1e-9 * scale && hi > lo) return;
        const double d = scale == 0 ? around_zero : scale * 0.1;
        const double mid = lo / 2 + hi / 2;
        lo = mid - d, hi = mid + d;
    };
    widen(x0, x1, 0.5);
    widen(y0, y1, 0.5);
    const auto sx = [&](double x) { return left + (x - x0) / (x1 - x0) * pw; };
    const auto sy = [&](double y) { return top + ph - (y - y0) / (y1 - y0) * ph; };

    std::string out = fmt::format(
        "<svg width=\"{0}\" height=\"{1}\" "
        "viewBox=\"0 0 {0} {1}\" font-family=\"sans-serif\" font-size=\"11\">\n"
        "<rect width=\"{0}\" height=\"{1}\" fill=\"white\"/>\n"
        "<text class=\"title\" x=\"{2}\" y=\"16\" text-anchor=\"middle\" font-size=\"13\" "
        "font-weight=\"bold\">{3}</text>\n",
        width, height, px(width / 2.0), html_escape(title));
    // Ticks and grid lines.
    double step = 0;
    for (double t : nice_ticks(x0, x1, &step)) {
        out += fmt::format(
            "<line x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\" stroke=\"#e5e5e5\"/>"
            "<text x=\"{0}\" y=\"{3}\" text-anchor=\"middle\">{4}</text>\n",
            px(sx(t)), px(top), px(top + ph), px(top + ph + 14), tick_text(t, step));
    }
    for (double t : nice_ticks(y0, y1, &step)) {
        out += fmt::format(
            "<line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" stroke=\"#e5e5e5\"/>"
            "<text x=\"{3}\" y=\"{4}\" text-anchor=\"end\">{5}</text>\n",
            px(left), px(sy(t)), px(left + pw), px(left - 4), px(sy(t) + 4), tick_text(t, step));
    }
    out += fmt::format(
        "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#444\"/>\n",
        px(left), px(top), px(pw), px(ph));
    out +=
        fmt::format("<text class=\"x-label\" x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n",
                    px(left + pw / 2), px(height - 8.0), html_escape(x_label));
    out += fmt::format(
        "<text class=\"y-label\" x=\"0\" y=\"0\" text-anchor=\"middle\" "
        "transform=\"translate(14 {}) rotate(-90)\">{}</text>\n",
        px(top + ph / 2), html_escape(y_label));
    // One path per series with points, and its legend entry on the line under the title.
    double legend_x = left;
    for (size_t i = 0; i < series.size(); ++i) {
        std::string d;
        int drawn = 0;
        for (const auto& [x, y] : series[i].points) {
            if (!std::isfinite(x) || !std::isfinite(y)) continue;
            d += fmt::format("{}{} {}", d.empty() ? "M" : " L", px(sx(x)), px(sy(y)));
            ++drawn;
        }
        if (d.empty()) continue;
        if (drawn == 1) d += " h0.01";  // a lone point: a dot, drawn by the round line cap
        const char* colour = kPalette[i % kPalette.size()];
        const std::string name = html_escape(series[i].name);
        out += fmt::format(
            "<path class=\"series\" data-series=\"{}\" d=\"{}\" fill=\"none\" stroke=\"{}\" "
            "stroke-width=\"1.5\" stroke-linecap=\"round\"/>\n",
            name, d, colour);
        out += fmt::format(
            "<line x1=\"{0}\" y1=\"32\" x2=\"{1}\" y2=\"32\" stroke=\"{2}\" stroke-width=\"3\"/>"
            "<text class=\"legend\" x=\"{3}\" y=\"36\">{4}</text>\n",
            px(legend_x), px(legend_x + 16), colour, px(legend_x + 20), name);
        legend_x += 28 + 6.5 * double(series[i].name.size());
    }
    out += "</svg>\n";
    return out;
}

namespace {

// The line's number fields (finite numbers only; "step" and "split" left out).
std::vector<std::pair<std::string, double>> numbers_of(const nlohmann::json& line) {
    std::vector<std::pair<std::string, double>> out;
    for (auto it = line.begin(); it != line.end(); ++it) {
        if (it.key() == "step" || !it->is_number()) continue;
        const double v = it->get<double>();
        if (std::isfinite(v)) out.emplace_back(it.key(), v);
    }
    return out;
}

Status read_metrics_lines(const std::string& path, ReportRun& run) {
    std::ifstream in(path);
    if (!in) return io_error("{}: cannot open", path);
    std::string text;
    int64_t line_no = 0;
    while (std::getline(in, text)) {
        ++line_no;
        if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
        const auto line = json_parse<nlohmann::json>(text);
        if (line.is_discarded() || !line.is_object()) {
            return invalid_argument_error(
                "{}:{}: not a JSON object (lathe report reads one JSON "
                "object per line)",
                path, line_no);
        }
        if (!line.contains("step") || !line["step"].is_number_integer()) {
            return invalid_argument_error(
                "{}:{}: no integer \"step\" key (lathe report needs \"step\" on every line)", path,
                line_no);
        }
        const int64_t step = line["step"].get<int64_t>();
        auto it = line.find("split");
        const bool valid = it != line.end() && it->is_string() && it->get<std::string>() == "valid";
        (valid ? run.valid : run.train).emplace_back(step, numbers_of(line));
    }
    return ok_status();
}

std::optional<double> field(const std::vector<std::pair<std::string, double>>& fields,
                            std::string_view key) {
    for (const auto& [k, v] : fields) {
        if (k == key) return v;
    }
    return std::nullopt;
}

// The summary row of a JSONL file, read the way run/run_list.h reads metrics.jsonl.
RunRow file_row(const ReportRun& run) {
    RunRow row;
    row.name = run.name;
    row.path = run.path;
    if (!run.train.empty()) {
        row.steps_done = run.train.back().first;
        row.last_loss = field(run.train.back().second, "loss");
        row.tokens_per_s = field(run.train.back().second, "tokens_per_s");
    }
    for (const auto& [step, fields] : run.valid) {
        const auto loss = field(fields, "loss");
        if (loss && (!row.best_valid_loss || *loss < *row.best_valid_loss)) {
            row.best_valid_loss = loss;
        }
    }
    row.status = "JSONL file";
    return row;
}

struct Metric {
    const char* key;
    bool valid;  // from the validation lines
    const char* title;
};

constexpr std::array<Metric, 7> kMetrics = {{
    {"loss", false, "training loss"},
    {"loss", true, "validation loss"},
    {"lr", false, "learning rate"},
    {"grad_norm", false, "gradient norm"},
    {"tokens_per_s", false, "tokens/s"},
    {"mfu", false, "MFU"},
    {"memory_bytes", false, "device memory in use (bytes)"},
}};

std::string opt_text(const std::optional<double>& v, const char* spec) {
    return v ? fmt::format(fmt::runtime(spec), *v) : "—";
}

}  // namespace

Result<ReportRun> report_read_run(const std::string& path) {
    std::error_code ec;
    if (!fs::exists(path, ec)) {
        return not_found_error("{}: no such run folder or JSONL file", path);
    }
    ReportRun run;
    run.path = path;
    if (fs::is_directory(path, ec)) {
        const fs::path dir = fs::path(path).lexically_normal();
        const fs::path metrics = dir / "metrics.jsonl";
        if (!fs::is_regular_file(metrics, ec)) {
            return not_found_error(
                "{}: no metrics.jsonl in this folder (give a folder that `lathe train --run-dir` "
                "wrote, or a JSONL file)",
                path);
        }
        run.name = (dir.filename().empty() ? dir.parent_path() : dir).filename().string();
        LATHE_RETURN_IF_ERROR(read_metrics_lines(metrics.string(), run));
        if (fs::is_regular_file(dir / "config.yaml", ec)) {
            LATHE_ASSIGN_OR_RETURN(run.config_yaml, file_read_all((dir / "config.yaml").string()));
        }
        if (fs::is_regular_file(dir / kMemoryPlanFile, ec)) {
            LATHE_ASSIGN_OR_RETURN(run.memory_plan,
                                   file_read_all((dir / kMemoryPlanFile).string()));
        }
        // The row `lathe runs` shows for this folder, found among its parent's runs.
        const fs::path parent = fs::absolute(dir, ec).parent_path();
        LATHE_ASSIGN_OR_RETURN(std::vector<RunRow> rows, run_list(parent.string()));
        for (auto& row : rows) {
            if (row.name == fs::absolute(dir, ec).filename().string()) run.row = std::move(row);
        }
        run.row.name = run.name;
        run.row.path = path;
    } else {
        run.name = fs::path(path).filename().string();
        LATHE_RETURN_IF_ERROR(read_metrics_lines(path, run));
        run.row = file_row(run);
    }
    return run;
}

std::string report_html(const std::vector<ReportRun>& runs) {
    std::string out =
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        "<title>lathe report</title>\n<style>\n"
        "body{font-family:sans-serif;margin:16px;color:#222}\n"
        ".plots{display:flex;flex-wrap:wrap;gap:8px}\n"
        "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:3px 8px;"
        "text-align:right}td:first-child,th:first-child{text-align:left}\n"
        "pre{background:#f6f6f6;padding:8px;overflow:auto}\n"
        "</style>\n</head>\n<body>\n<h1>lathe report</h1>\n";
    // Summary table.
    out +=
        "<h2>Summary</h2>\n<table class=\"summary\">\n<tr><th>run</th><th>model</th>"
        "<th>steps</th><th>last loss</th><th>best valid loss</th><th>tokens/s</th>"
        "<th>status</th></tr>\n";
    for (const auto& run : runs) {
        const RunRow& r = run.row;
        out += fmt::format(
            "<tr><td>{}</td><td>{}</td><td>{}/{}</td><td>{}</td><td>{}</td><td>{}</td>"
            "<td>{}</td></tr>\n",
            html_escape(run.name), html_escape(r.model.empty() ? "—" : r.model), r.steps_done,
            r.steps_total ? std::to_string(*r.steps_total) : "—", opt_text(r.last_loss, "{:.4f}"),
            opt_text(r.best_valid_loss, "{:.4f}"),
            r.tokens_per_s ? Progress::format_count(*r.tokens_per_s) : "—", html_escape(r.status));
    }
    out += "</table>\n";
    // Plots: a metric some run logged, against step and against tokens.
    for (const char* x_key : {"step", "tokens"}) {
        std::string plots;
        for (const auto& m : kMetrics) {
            std::vector<PlotSeries> series;
            bool any = false;
            for (const auto& run : runs) {
                PlotSeries s{run.name, {}};
                for (const auto& [step, fields] : m.valid ? run.valid : run.train) {
                    const auto y = field(fields, m.key);
                    const auto x = std::string_view(x_key) == "step"
                                       ? std::optional<double>(double(step))
                                       : field(fields, "tokens");
                    if (x && y) s.points.emplace_back(*x, *y);
                }
                any = any || !s.points.empty();
                series.push_back(std::move(s));
            }
            if (!any) continue;
            plots += svg_plot(fmt::format("{} against {}", m.title, x_key), x_key, m.title, series);
        }
        if (plots.empty()) continue;
        out += fmt::format("<h2>Against {}</h2>\n<div class=\"plots\">\n{}</div>\n", x_key, plots);
    }
    // Configurations.
    for (const auto& run : runs) {
        if (run.config_yaml.empty()) continue;
        out += fmt::format("<h2>{}: config.yaml</h2>\n<pre class=\"config\">{}</pre>\n",
                           html_escape(run.name), html_escape(run.config_yaml));
        if (!run.memory_plan.empty()) {
            out += fmt::format("<h2>{}: memory plan</h2>\n<pre class=\"config\">{}</pre>\n",
                               html_escape(run.name), html_escape(run.memory_plan));
        }
    }
    out += "</body>\n</html>\n";
    return out;
}

Status write_report(const std::vector<std::string>& paths, const std::string& output) {
    if (paths.empty()) return invalid_argument_error("lathe report: give at least one RUN_DIR");
    std::vector<ReportRun> runs;
    std::set<std::string> names;
    for (const auto& path : paths) {
        LATHE_ASSIGN_OR_RETURN(ReportRun run, report_read_run(path));
        // Two runs of one name (e.g. a/run and b/run) are told apart by their paths.
        if (!names.insert(run.name).second) run.name = path;
        names.insert(run.name);
        runs.push_back(std::move(run));
    }
    return file_write_atomic(output, report_html(runs));
}

}  // namespace lathe
