// `lathe align`: vocabulary adaptation (docs/ALIGN.md). The group only; each stage is
// one file, cli/align_<stage>.cpp, declared in cli/command.h and added here.
#include "cli/command.h"

namespace lathe {

void cli_add_align(CLI::App& parent, CommandAction& action) {
    CLI::App* cmd = parent.add_subcommand(
        "align", "Move a model to a new vocabulary: terms -> embed -> map -> apply -> eval");
    cmd->require_subcommand(1);
    // One line per stage (kept in pipeline order).
    cli_add_align_terms(*cmd, action);
    cli_add_align_embed(*cmd, action);
    cli_add_align_map(*cmd, action);
    cli_add_align_apply(*cmd, action);
    cli_add_align_eval(*cmd, action);
    cli_add_align_run(*cmd, action);
    (void)action;
}

}  // namespace lathe
