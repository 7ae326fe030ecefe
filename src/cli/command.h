#pragma once
// How subcommands plug into the `lathe` binary. Each cli/<name>.cpp defines one
// `cli_add_<name>(CLI::App& parent, CommandAction& action)` that declares its options and flags
// and, from the subcommand's callback, stores the function to run into `action`. main() parses
// the command line, runs the stored action, and turns its Status into a message and exit code:
// this folder is the only place that happens.

#include <CLI/CLI.hpp>

#include <functional>

#include "core/status.h"

namespace lathe {

using CommandAction = std::function<Status()>;

void cli_add_tokenize(CLI::App& parent, CommandAction& action);
void cli_add_tokenizer(CLI::App& parent, CommandAction& action);
void cli_add_prepare(CLI::App& parent, CommandAction& action);
void cli_add_data(CLI::App& parent, CommandAction& action);
void cli_add_chat(CLI::App& parent, CommandAction& action);
void cli_add_train(CLI::App& parent, CommandAction& action);
void cli_add_eval(CLI::App& parent, CommandAction& action);
void cli_add_generate(CLI::App& parent, CommandAction& action);
void cli_add_serve(CLI::App& parent, CommandAction& action);
void cli_add_convert(CLI::App& parent, CommandAction& action);
void cli_add_align(CLI::App& parent, CommandAction& action);
void cli_add_bench(CLI::App& parent, CommandAction& action);
void cli_add_doctor(CLI::App& parent, CommandAction& action);
void cli_add_runs(CLI::App& parent, CommandAction& action);
void cli_add_report(CLI::App& parent, CommandAction& action);
void cli_add_launch(CLI::App& parent, CommandAction& action);

// The stages of `lathe align` , each in cli/align_<stage>.cpp; cli/align.cpp adds them
// under the `align` group.
void cli_add_align_terms(CLI::App& align, CommandAction& action);
void cli_add_align_embed(CLI::App& align, CommandAction& action);
void cli_add_align_map(CLI::App& align, CommandAction& action);
void cli_add_align_apply(CLI::App& align, CommandAction& action);
void cli_add_align_eval(CLI::App& align, CommandAction& action);
void cli_add_align_run(CLI::App& align, CommandAction& action);

}  // namespace lathe
