// `lathe tokenize`: encode JSONL text with a Hugging Face tokenizer.json, or decode ids back.
//
//   lathe tokenize --tokenizer T.json [--special] [--decode] [--input F] [--output F]
//                  [--threads N] [--json-key K]
//
// What each mode does, and the formats: data/tokenize_jsonl.h.

#include <memory>

#include "cli/command.h"
#include "core/log.h"
#include "data/tokenize_jsonl.h"
#include "io/file.h"

namespace lathe {

void cli_add_tokenize(CLI::App& parent, CommandAction& action) {
    auto args = std::make_shared<TokenizeJsonlOptions>();
    CLI::App* cmd = parent.add_subcommand(
        "tokenize",
        "Encode JSONL {\"text\": ...} lines to {\"ids\": [...]} with a Hugging Face tokenizer.json "
        "(byte-exact with HF tokenizers), or decode ids back with --decode");
    cmd->add_option("--tokenizer", args->tokenizer, "tokenizer.json (model type BPE)")->required();
    cmd->add_flag("--special", args->special,
                  "Encode: add the post-processor's special tokens (HF add_special_tokens=True). "
                  "Decode: keep special tokens (default skips them, as HF's "
                  "skip_special_tokens=True)");
    cmd->add_flag("--decode", args->decode,
                  "Decode {\"ids\": [...]} lines to {\"text\": ...} instead of encoding");
    cmd->add_option("--input", args->input, "Input JSONL file, gzip/zstd allowed ('-' = stdin)")
        ->capture_default_str();
    cmd->add_option("--output", args->output,
                    "Output JSONL file, written atomically ('-' = stdout)")
        ->capture_default_str();
    cmd->add_option("--threads", args->threads, "Worker threads (0 = all cores)")
        ->capture_default_str()
        ->check(kThreadsRange);
    cmd->add_option("--json-key", args->json_key,
                    "Input field to read (default: text; ids with --decode)");
    cmd->callback([args, &action] {
        action = [args] {
            // The summary line goes to stderr, except under --quiet.
            args->show_progress = log_level() <= LogLevel::kInfo;
            LATHE_RETURN_IF_ERROR(
                check_output_is_not_input("--output", args->output, "--input", args->input));
            return tokenize_jsonl(*args);
        };
    });
}

}  // namespace lathe
