// `lathe runs`: a table of the training runs under a folder.
//
//   lathe runs [DIR] [--json]

#include <cstdio>
#include <memory>
#include <string>

#include "cli/command.h"
#include "run/run_list.h"

namespace lathe {

namespace {

Status run_runs(const std::string& dir, bool json) {
    LATHE_ASSIGN_OR_RETURN(std::vector<RunRow> rows, run_list(dir));
    if (json) {
        for (const auto& row : rows) std::printf("%s\n", run_row_to_json(row).dump().c_str());
    } else {
        std::fputs(run_list_table(rows).c_str(), stdout);
    }
    std::fflush(stdout);
    return ok_status();
}

}  // namespace

void cli_add_runs(CLI::App& parent, CommandAction& action) {
    CLI::App* cmd = parent.add_subcommand("runs", "List the training runs under a folder");
    cmd->footer(
        "One row per folder directly under DIR holding metrics.jsonl or checkpoints/ (what `lathe "
        "train --run-dir` writes): name, model, steps done/total, last loss, best validation "
        "loss, tokens/s (last logged) and status (finished, or stopped at step N).");
    auto dir = std::make_shared<std::string>("runs");
    auto json = std::make_shared<bool>(false);
    cmd->add_option("dir", *dir, "Folder holding run folders (default: runs)");
    cmd->add_flag("--json", *json, "Print one JSON object per run instead of the table");
    cmd->callback([=, &action] { action = [=] { return run_runs(*dir, *json); }; });
}

}  // namespace lathe
