// `lathe train`: see run/trainer.h.
#include <cstdio>
#include <cstdlib>

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
    cmd->add_option("--run-dir", req->run_dir,
                    "Run folder: config.yaml, metrics.jsonl, checkpoints/")
        ->required();
    cmd->add_option("--set", req->overrides, "Override a key: --set train.steps=100 (repeatable)");
    cmd->footer(
        "Exit codes: 0 the run reached train.steps (or had already); 130 / 143 stopped by SIGINT / "
        "SIGTERM after saving a checkpoint (129 for SIGHUP; the same command resumes), so `lathe "
        "train ... && lathe convert ...` converts only a finished model; 1 or 2 an error (2: a bad "
        "argument, "
        "configuration value or data), after which no checkpoint is half-written.\n"
        "Resume: a rerun continues exactly (the same losses, bit for bit) from the newest "
        "checkpoint. It refuses, before writing anything, a configuration that changes what that "
        "depends on: model.*, data.*, train.seed, train.micro_batch_size, "
        "train.gradient_accumulation_steps, checkpoint.init_from. These may change, and each "
        "change is logged: train.steps, train.log_interval, train.eval_interval, train.eval_iters, "
        "train.device, train.precision, train.recompute, train.threads, train.deterministic, "
        "train.nonfinite_policy, train.max_skipped_steps, train.spike_factor, train.freeze, "
        "optimizer.*, lr.*, checkpoint.interval, checkpoint.keep_last, checkpoint.init_mode.");
    cmd->callback([req, &action] {
        action = [req]() -> Status {
            LATHE_ASSIGN_OR_RETURN(const TrainOutcome outcome, train_run(*req));
            if (outcome.stop_signal != 0) {
                // Stopped early, everything saved: the exit code tells a caller (a shell's &&, a
                // scheduler) that the model is not finished, as a shell reports a process ended by
                // the signal. main() knows only 0, 1 and 2, so the command ends the process here.
                std::fflush(stdout);
                std::fflush(stderr);
                std::exit(128 + outcome.stop_signal);
            }
            return ok_status();
        };
    });
}

}  // namespace lathe
