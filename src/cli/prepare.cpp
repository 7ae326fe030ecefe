// `lathe prepare`: documents in, GPT-NeoX / Megatron-LM token files out (data/prepare.h).

#include "data/prepare.h"

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <memory>

#include "cli/command.h"
#include "core/log.h"
#include "core/progress.h"
#include "core/strings.h"
#include "io/file.h"

namespace lathe {

namespace {

// SIGINT/SIGTERM ask the run to stop; it then removes its temporary files and exits without
// output. A signal handler can only reach static storage, hence this one flag. The handlers are
// one-shot (SA_RESETHAND): a second Ctrl-C ends the process at once.
std::atomic<bool>& prepare_interrupt_flag() {
    static std::atomic<bool> flag{false};
    return flag;
}

extern "C" void prepare_on_signal(int) {
    prepare_interrupt_flag().store(true);
}

void prepare_install_signal_handlers() {
    struct sigaction sa {};
    sa.sa_handler = prepare_on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESETHAND;
    sigaction(SIGINT, &sa, nullptr);
    sigaction(SIGTERM, &sa, nullptr);
}

// GPT-NeoX takes `--input a.jsonl,b.jsonl`; a value that is not an existing file and holds
// commas is split the same way.
std::vector<std::string> expand_inputs(const std::vector<std::string>& given) {
    std::vector<std::string> out;
    for (const std::string& v : given) {
        if (v.find(',') == std::string::npos || file_exists(v)) {
            out.push_back(v);
            continue;
        }
        for (std::string_view part : split(v, ',')) {
            if (!part.empty()) out.emplace_back(part);
        }
    }
    return out;
}

void print_report(const PrepareReport& r) {
    std::string files;
    for (const std::string& f : r.outputs) files += (files.empty() ? "" : ", ") + f;
    const double t = std::max(r.seconds, 1e-9);
    std::printf("prepare: wrote %s\n", files.c_str());
    std::printf("  format: %s\n", prepare_format_name(r.format));
    std::printf("  dtype: %s\n", token_dtype_name(r.dtype));
    if (r.eod_id.has_value()) {
        std::printf("  eod: %s = %d (%s)\n", r.eod_token.c_str(), *r.eod_id, r.eod_source.c_str());
    }
    std::printf("  documents: %llu\n", static_cast<unsigned long long>(r.documents));
    std::printf("  tokens: %llu\n", static_cast<unsigned long long>(r.tokens));
    std::string by_problem;
    for (const auto& [problem, n] : r.skipped_by_problem) {
        by_problem += fmt::format("{}{}: {}", by_problem.empty() ? " (" : ", ", problem, n);
    }
    if (!by_problem.empty()) by_problem += ')';
    std::printf("  skipped: %llu%s\n", static_cast<unsigned long long>(r.skipped),
                by_problem.c_str());
    std::printf("  blank lines: %llu\n", static_cast<unsigned long long>(r.blank_lines));
    std::printf("  bytes: %llu (%s; %s read from disk)\n",
                static_cast<unsigned long long>(r.input_bytes),
                Progress::format_bytes(static_cast<double>(r.input_bytes)).c_str(),
                Progress::format_bytes(static_cast<double>(r.raw_bytes)).c_str());
    std::printf("  time: %.2f s on %d worker threads (+ %.2f s loading the tokenizer)\n", r.seconds,
                r.threads, r.load_seconds);
    std::printf("  throughput: %.2f MB/s, %.0f tokens/s, %.0f docs/s\n",
                static_cast<double>(r.input_bytes) / 1e6 / t, static_cast<double>(r.tokens) / t,
                static_cast<double>(r.documents) / t);
    std::fflush(stdout);
}

}  // namespace

void cli_add_prepare(CLI::App& parent, CommandAction& action) {
    CLI::App* cmd = parent.add_subcommand(
        "prepare",
        "Tokenize documents into GPT-NeoX / Megatron-LM token files (<prefix>.bin + .idx)");
    cmd->footer(
        "Inputs may be plain, gzip or zstd (detected from their bytes), '-' for stdin.\n"
        "Formats: jsonl (one JSON object per line, --json-key field), text (one document per\n"
        "line), text-blocks (documents separated by blank lines), chat (JSONL with\n"
        "\"messages\": [{role, content}], rendered with the tokenizer_config.json chat template;\n"
        "also writes <prefix>_label.bin/.idx with -100 where there is no loss), alpaca and\n"
        "sharegpt (LLaMA-Factory's layouts, mapped onto messages and rendered as chat; see\n"
        "docs/SFT.md). chat, alpaca and sharegpt inputs may also be one JSON array of records.\n"
        "auto picks jsonl for inputs whose first line starts with '{', chat when that line has\n"
        "\"messages\" and no \"text\", else text.\n"
        "Blank lines (empty or only whitespace) are never documents: text-blocks splits at them;\n"
        "text, jsonl, chat, alpaca and sharegpt pass over them (counted as 'blank lines'), as\n"
        "tokenizer train does.");
    auto opts = std::make_shared<PrepareOptions>();
    auto inputs = std::make_shared<std::vector<std::string>>();
    auto format = std::make_shared<std::string>("auto");
    auto on_error = std::make_shared<std::string>("fail");
    auto json_key = std::make_shared<std::string>();
    auto eod_token = std::make_shared<std::string>();
    auto no_progress = std::make_shared<bool>(false);
    auto role_tags = std::make_shared<std::string>();

    cmd->add_option("--tokenizer", opts->tokenizer_path, "Hugging Face tokenizer.json")->required();
    cmd->add_option("--input", *inputs,
                    "Input files ('-' = stdin); several values, or comma-separated as in GPT-NeoX")
        ->required();
    cmd->add_option("--output-prefix", opts->output_prefix, "Writes <prefix>.bin and <prefix>.idx")
        ->required();
    cmd->add_flag("--append-eod", opts->append_eod,
                  "Append the end-of-document token to every document");
    cmd->add_option("--eod-token", *eod_token,
                    "End-of-document token (default: <|endoftext|>, else the eos_token of the "
                    "tokenizer_config.json beside the tokenizer)");
    cmd->add_option("--json-key,--jsonl-keys", *json_key,
                    "JSONL field holding the document (default text; chat: messages; sharegpt: "
                    "conversations)");
    cmd->add_option("--format", *format, "auto, jsonl, text, text-blocks, chat, alpaca or sharegpt")
        ->capture_default_str();
    cmd->add_option("--on-error", *on_error,
                    "fail: stop at the first bad record; skip: count and skip bad records")
        ->capture_default_str();
    cmd->add_option("--threads,--workers", opts->threads, "Worker threads (default: all cores)")
        ->check(kThreadsRange);
    cmd->add_option("--chat-template-config", opts->chat_template_config,
                    "tokenizer_config.json with the chat template (default: beside the tokenizer)");
    cmd->add_option("--generation-role", opts->generation_role,
                    "Chat: turns of this role keep loss")
        ->capture_default_str();
    cmd->add_flag("--only-last-turn", opts->only_last_turn,
                  "Chat: only the last turn keeps loss (GPT-NeoX --only-last)");
    cmd->add_option("--role-tags", *role_tags,
                    "sharegpt: KEY=VALUE,... with keys role_tag, content_tag, user_tag, "
                    "assistant_tag, system_tag, observation_tag, function_tag (several tags: "
                    "a|b)");
    cmd->add_option("--seq-length", opts->max_tokens,
                    "chat, alpaca, sharegpt: a conversation of more tokens is a bad record "
                    "(default: no limit)");
    cmd->add_flag("--no-progress", *no_progress, "Do not show the progress display");

    cmd->callback([=, &action] {
        action = [=]() -> Status {
            PrepareOptions o = *opts;
            o.inputs = expand_inputs(*inputs);
            for (const std::string& in : o.inputs)
                for (const char* out : {".bin", ".idx", "_label.bin", "_label.idx"})
                    LATHE_RETURN_IF_ERROR(check_output_is_not_input(
                        "--output-prefix", o.output_prefix + out, "--input", in));
            LATHE_ASSIGN_OR_RETURN(o.format, prepare_format_from_name(*format));
            if (*on_error == "fail") {
                o.on_error = OnError::kFail;
            } else if (*on_error == "skip") {
                o.on_error = OnError::kSkip;
            } else {
                return invalid_argument_error("--on-error {}: expected fail or skip", *on_error);
            }
            if (!json_key->empty()) o.json_key = *json_key;
            if (!eod_token->empty()) o.eod_token = *eod_token;
            if (o.max_tokens < 0)
                return invalid_argument_error("--seq-length {}: must be >= 1", o.max_tokens);
            if (!role_tags->empty()) {
                if (o.format != PrepareFormat::kSharegpt)
                    return invalid_argument_error("--role-tags applies to --format sharegpt only");
                LATHE_RETURN_IF_ERROR(sharegpt_tags_parse(*role_tags, o.sharegpt_tags));
            }
            o.show_progress = !*no_progress && log_level() <= LogLevel::kInfo;
            prepare_install_signal_handlers();
            o.cancel = &prepare_interrupt_flag();
            LATHE_ASSIGN_OR_RETURN(const PrepareReport report, prepare_run(o));
            print_report(report);
            if (report.skipped > 0) {
                log_warning("{} bad records skipped (the first: {})", report.skipped,
                            report.skipped_examples.front());
            }
            return ok_status();
        };
    });
}

}  // namespace lathe
