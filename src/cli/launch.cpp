// `lathe launch`: one process per GPU of this machine (see dist/launch.h).
//
//   lathe launch --gpus N [--master-port P] [--grace-s S] [--] COMMAND ARGS...
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "cli/command.h"
#include "dist/launch.h"

namespace lathe {

void cli_add_launch(CLI::App& parent, CommandAction& action) {
    auto o = std::make_shared<LaunchOptions>();
    CLI::App* cmd = parent.add_subcommand(
        "launch",
        "Start N ranks of a command on this machine, one per GPU, as torchrun does: `lathe launch "
        "--gpus 4 lathe train configs/tiny.yaml --run-dir runs/tiny`");
    // Everything from the first word that is not one of launch's options on (or after `--`) is
    // the command, so the command's own options (--run-dir, --help) are passed to it untouched.
    cmd->add_option("command", o->command,
                    "The program to start and its arguments (`lathe` is this lathe)");
    cmd->positionals_at_end();
    cmd->add_option("--gpus", o->gpus,
                    "Ranks to start, one per GPU (not checked against the GPUs present: any "
                    "command may be started N times; lathe's CPU training is started by mpirun; "
                    "at most 256, one machine's ranks)")
        ->required();
    cmd->add_option("--master-port", o->master_port,
                    "MASTER_PORT for rank 0's rendezvous (default: a free port of 127.0.0.1)");
    cmd->add_option("--grace-s", o->grace_s,
                    "Seconds between SIGTERM and SIGKILL for the ranks still running after one "
                    "fails")
        ->capture_default_str();
    cmd->footer(
        "Rank i of N gets the variables torchrun gives its workers: RANK=LOCAL_RANK=i, "
        "WORLD_SIZE=LOCAL_WORLD_SIZE=N, MASTER_ADDR=127.0.0.1, MASTER_PORT, plus "
        "LATHE_LAUNCHER=launch; every other variable is passed on. COMMAND is found on PATH; "
        "`lathe` means this lathe binary. The ranks share the launcher's terminal and output, "
        "and start with no signal blocked, keeping the signals the launcher was given ignored "
        "(nohup's SIGHUP) but SIGCHLD, every other signal at its default action.\n"
        "Signals: SIGINT, SIGTERM and SIGHUP are sent on to every running rank (`lathe train` "
        "then saves a checkpoint and exits 128 + the signal: 130 / 143 / 129); one that arrives "
        "while the ranks start (they start in order, rank 0 first) also stops the start: no "
        "further rank starts. When a rank exits non-zero or is killed, the launcher prints "
        "`lathe: error: launch: rank R (pid P) exited with status C; stopping the other K ranks`, "
        "starts no further rank, sends the running ones SIGTERM, and SIGKILL to any still running "
        "--grace-s seconds later (a rank that cannot be started stops the others the same way); "
        "after a signal sent on, ends at 128 + that signal are expected, and the launcher waits "
        "for every rank to save. Each rank is reaped as it ends, and the launcher exits only once "
        "every rank it started has ended. A launcher killed outright takes its ranks with it "
        "(each gets SIGTERM).\n"
        "Exit codes: 0 when every rank exited 0; else the first non-zero rank's code (128 + the "
        "signal's number for a rank killed by a signal, e.g. 143 after SIGTERM), else 128 + the "
        "signal that stopped the start before every rank had started; 1 or 2 when a rank could "
        "not be started (2: bad options, a command not found or not executable).\n"
        "Relation to other launchers: this is torchrun --standalone --nproc-per-node N for one "
        "machine, without torchrun's elastic restarts. Across machines, start one process per GPU "
        "with "
        "srun (SLURM) or mpirun, which lathe reads as well; torchrun works too. See "
        "docs/DISTRIBUTED.md.");
    cmd->callback([o, &action] {
        action = [o]() -> Status {
            const auto print = [](const std::string& error) {
                std::fprintf(stderr, "lathe: error: %s\n", error.c_str());
                std::fflush(stderr);
            };
            LATHE_ASSIGN_OR_RETURN(const int code, launch_run(*o, print));
            if (code != 0) {
                // The ranks' exit code: main() knows only 0, 1 and 2, so the command ends the
                // process here (the failure line, if any, is printed already).
                std::fflush(stdout);
                std::fflush(stderr);
                std::exit(code);
            }
            return ok_status();
        };
    });
}

}  // namespace lathe
