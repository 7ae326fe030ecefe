#pragma once
// How subcommands plug into the `lathe` binary. Each cli/<name>.cpp defines one
// `cli_add_<name>(CLI::App& parent, CommandAction& action)` that declares its options and flags
// and, from the subcommand's callback, stores the function to run into `action`. main() parses
// the command line, runs the stored action, and turns its Status into a message and exit code:
// this folder is the only place that happens.

#include <CLI/CLI.hpp>

#include <functional>
#include <string>

#include "core/status.h"

namespace lathe {

using CommandAction = std::function<Status()>;

// The --threads options' bound: a thread each costs a stack, and far more threads than cores only
// slow a run down (an error, not the OS's "Resource temporarily unavailable").
inline const CLI::Range kThreadsRange(0, 4096);

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

// An option of the words auto, on and off: `flag` on `cmd`, into `value`, its default shown.
inline CLI::Option* cli_add_auto_on_off(CLI::App* cmd, const std::string& flag, std::string& value,
                                        const std::string& help) {
    return cmd->add_option(flag, value, help)
        ->capture_default_str()
        ->check(CLI::IsMember({"auto", "on", "off"}));
}

// --decode-gemv auto|on|off (infer/engine.h, DecodeGemv) on `cmd`, into `value`, which the action
// reads with decode_gemv_parse; `prefix` starts its help ("--generate: " in bench).
inline CLI::Option* cli_add_decode_gemv(CLI::App* cmd, std::string& value,
                                        const std::string& prefix = "") {
    return cli_add_auto_on_off(cmd, "--decode-gemv", value,
                               prefix +
                                   "The GEMM of decode steps of few sequences: off = cuBLASLt; on "
                                   "= lathe's skinny GEMM (ops/cuda/gemv.h) up to 16 rows; auto "
                                   "= it up to 2 rows (CUDA)");
}

// --peer-reduce auto|on|off (infer/engine.h, PeerReduce) on `cmd`, into `value`, which the action
// reads with peer_reduce_parse; `prefix` starts its help.
inline CLI::Option* cli_add_peer_reduce(CLI::App* cmd, std::string& value,
                                        const std::string& prefix = "") {
    return cli_add_auto_on_off(cmd, "--peer-reduce", value,
                               prefix +
                                   "Tensor parallel on GPUs: on = the sums of decode steps and "
                                   "short prefills (up to 128 KB) read the peer GPUs' memory in "
                                   "one kernel (dist/peer_all_reduce.h) where every GPU reaches "
                                   "the others; off = NCCL only; auto = on with 4 GPUs or more");
}

}  // namespace lathe
