// `lathe report`: one self-contained HTML page with the plots, summary and configuration of
// training runs.
//
//   lathe report RUN_DIR... [--output report.html]

#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "cli/command.h"
#include "io/file.h"
#include "run/report.h"

namespace lathe {

namespace {

Status run_report(const std::vector<std::string>& runs, const std::string& output) {
    // The files a run gives the page: writing over one of them loses it.
    for (const std::string& run : runs) {
        LATHE_RETURN_IF_ERROR(check_output_is_not_input("--output", output, "run", run));
        for (const char* name : {"metrics.jsonl", "config.yaml"})
            LATHE_RETURN_IF_ERROR(check_output_is_not_input(
                "--output", output, "run's", (std::filesystem::path(run) / name).string()));
    }
    LATHE_RETURN_IF_ERROR(write_report(runs, output));
    std::printf("%s\n", output.c_str());
    std::fflush(stdout);
    return ok_status();
}

}  // namespace

void cli_add_report(CLI::App& parent, CommandAction& action) {
    CLI::App* cmd =
        parent.add_subcommand("report", "Write an HTML page with the plots of training runs");
    cmd->footer(
        "Each RUN_DIR is a folder `lathe train --run-dir` wrote, or any JSONL file with \"step\" "
        "and \"loss\" on its lines (e.g. a baseline's log). The page plots training and "
        "validation loss, lr, grad norm, tokens/s, MFU and memory against step and against "
        "tokens, the runs overlaid, with a summary table (as `lathe runs`) and each run's "
        "config.yaml. It is one file: inline SVG, no script, nothing fetched. The path written "
        "is printed.");
    auto runs = std::make_shared<std::vector<std::string>>();
    auto output = std::make_shared<std::string>("report.html");
    cmd->add_option("runs", *runs, "Run folders or JSONL files")->required();
    cmd->add_option("-o,--output", *output, "HTML file to write (default: report.html)");
    cmd->callback([=, &action] { action = [=] { return run_report(*runs, *output); }; });
}

}  // namespace lathe
