// `lathe align run CONFIG.yaml...`: every stage of vocabulary adaptation from one configuration
// (align/pipeline.h has the stages and outputs; configs/align-example.yaml every key).
//
//   lathe align run configs/align-example.yaml [--set terms.top_k=500] [--force] [--threads N]
//
// Every path and setting is checked before stage 1 writes anything (align/pipeline.h lists the
// checks). Stages whose inputs and settings are unchanged are skipped (each says so), so a run
// that stopped part way continues where it stopped.

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <memory>

#include "align/pipeline.h"
#include "cli/command.h"
#include "core/log.h"

namespace lathe {

namespace {

std::atomic<bool>& align_run_interrupt_flag() {
    static std::atomic<bool> flag{false};
    return flag;
}

extern "C" void align_run_on_signal(int) {
    align_run_interrupt_flag().store(true);
}

// SIGINT/SIGTERM ask the stages that support it (terms, prepare) to stop without leaving outputs;
// one-shot, so a second Ctrl-C ends the process at once.
void align_run_install_signal_handlers() {
    struct sigaction sa {};
    sa.sa_handler = align_run_on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESETHAND;
    sigaction(SIGINT, &sa, nullptr);
    sigaction(SIGTERM, &sa, nullptr);
}

struct AlignRunArgs {
    std::vector<std::string> configs;
    std::vector<std::string> overrides;
    bool force = false;
    int threads = 0;
    bool no_progress = false;
};

}  // namespace

void cli_add_align_run(CLI::App& align, CommandAction& action) {
    CLI::App* cmd = align.add_subcommand(
        "run",
        "Run every stage (terms, prepare, embed, map, apply, eval) from YAML config(s); "
        "stages that are up to date are skipped");
    auto args = std::make_shared<AlignRunArgs>();
    cmd->add_option("config", args->configs, "YAML files, merged left to right")->required();
    cmd->add_option("--set", args->overrides, "Override a key: --set terms.top_k=500 (repeatable)");
    cmd->add_flag("--force", args->force, "Rerun every stage");
    cmd->add_option("--threads", args->threads,
                    "CPU threads (default: align.threads, 0 = all cores)")
        ->check(kThreadsRange);
    cmd->add_flag("--no-progress", args->no_progress, "Do not show progress displays");
    cmd->callback([args, &action] {
        action = [args]() -> Status {
            const ConfigSchema schema = align_run_config_schema();
            LATHE_ASSIGN_OR_RETURN(const Config config,
                                   Config::load(schema, args->configs, args->overrides));
            if (args->threads < 0)
                return invalid_argument_error("--threads {}: must be >= 1", args->threads);
            AlignRunOptions o;
            o.threads = args->threads;
            o.force = args->force;
            o.show_progress = !args->no_progress && log_level() <= LogLevel::kInfo;
            align_run_install_signal_handlers();
            o.cancel = &align_run_interrupt_flag();
            LATHE_ASSIGN_OR_RETURN(const AlignRunReport r, align_run_pipeline(config, o));
            std::printf("align run: done in %.1f s\n", r.seconds);
            for (const AlignStageOutcome& s : r.stages) {
                std::printf("  %-16s %-14s %7.1f s  %s\n", s.stage.c_str(), s.state.c_str(),
                            s.seconds, s.detail.c_str());
            }
            std::fflush(stdout);
            return ok_status();
        };
    });
}

}  // namespace lathe
