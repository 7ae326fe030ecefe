// `lathe train`: see run/trainer.h.
#include "cli/command.h"
#include "run/trainer.h"

namespace lathe {

void cli_add_train(CLI::App& parent, CommandAction& action) {
    auto req = std::make_shared<TrainRequest>();
    CLI::App* cmd = parent.add_subcommand(
        "train",
        "Train (or resume) a model. Configs are YAML files merged left to right, then --set "
        "overrides; a rerun of the same command resumes from the newest checkpoint in --run-dir.");
    cmd->add_option("configs", req->config_files, "YAML config files, merged left to right")
        ->required()
        ->check(CLI::ExistingFile);
    cmd->add_option("--run-dir", req->run_dir, "Run folder: config.yaml, metrics.jsonl, checkpoints/")->required();
    cmd->add_option("--set", req->overrides, "Override a key: --set train.steps=100 (repeatable)");
    cmd->callback([req, &action] { action = [req] { return train_run(*req); }; });
}

}  // namespace lathe
