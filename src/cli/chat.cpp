// Placeholder while the command is being written; replaced by its owner.
#include "cli/command.h"

namespace lathe {

void cli_add_chat(CLI::App& parent, CommandAction& action) {
    CLI::App* cmd = parent.add_subcommand("chat", "(being written)");
    cmd->callback([&action] { action = [] { return unimplemented_error("'chat' is not written yet"); }; });
}

}  // namespace lathe
