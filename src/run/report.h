#pragma once
// `lathe report`: one self-contained HTML page about one or more training runs, with its plots
// drawn here as inline SVG (no script, no stylesheet or font fetched from anywhere).
//
// A run is either a run folder (what `lathe train --run-dir` writes: metrics.jsonl, config.yaml)
// or any JSONL file whose lines are objects with an integer "step" and a number "loss" (e.g. a
// baseline's log). Lines with "split": "valid" are validation points; every other line is a
// training point. The page holds, for each metric below that some run logged, one plot against
// step and one against tokens (the "tokens" key; a run without it has no series there):
//   train loss, valid loss, lr, grad_norm, tokens_per_s, mfu, memory_bytes
// Several runs are overlaid in one plot, one <path> per run, with a legend naming the runs. Below
// the plots: a summary table (steps done/total, last loss, best validation loss, tokens/s and the
// status as `lathe runs` computes it, run/run_list.h), each run folder's config.yaml and its memory
// plan (memory_plan.txt, the table `lathe train` prints before step 1). Every text read from a file
// is HTML-escaped.

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/status.h"
#include "run/run_list.h"

namespace lathe {

// One line of a plot: (x, y) points in the order they are drawn.
struct PlotSeries {
    std::string name;
    std::vector<std::pair<double, double>> points;
};

// A run read for the report.
struct ReportRun {
    std::string name;         // legend name: the folder's or file's name (made unique)
    std::string path;         // the folder or the JSONL file as given
    std::string config_yaml;  // the run folder's config.yaml, "" for a JSONL file
    std::string memory_plan;  // the run folder's memory_plan.txt, "" when it has none
    RunRow row;               // the summary row (status "JSONL file" for a file)
    // Metric lines as read: split "valid" in valid, the others in train.
    std::vector<std::pair<int64_t, std::vector<std::pair<std::string, double>>>> train, valid;
};

// `text` with & < > " ' replaced by their character references.
std::string html_escape(std::string_view text);

// An SVG plot `width` x `height` pixels: axes with ticks, `x_label` under the x axis, `y_label`
// beside the y axis, `title` above, one <path class="series"> per series with points (drawn in
// the palette's colour of its index) and a legend entry per series. Series without points draw
// nothing. Non-finite points are left out.
std::string svg_plot(std::string_view title, std::string_view x_label, std::string_view y_label,
                     const std::vector<PlotSeries>& series, int width = 460, int height = 300);

// Reads a run folder or a JSONL file. Errors: the path missing (not found), a folder without
// metrics.jsonl, a line that is not a JSON object with an integer "step" (naming file and line).
Result<ReportRun> report_read_run(const std::string& path);

// The whole HTML page for `runs`.
std::string report_html(const std::vector<ReportRun>& runs);

// Reads `paths`, writes the page to `output` (atomically).
Status write_report(const std::vector<std::string>& paths, const std::string& output);

}  // namespace lathe
