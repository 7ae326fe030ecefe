// `lathe tokenizer`: train a byte-level BPE tokenizer (`train`), describe a tokenizer.json
// (`info`).
//
//   lathe tokenizer train --vocab-size N --input FILES... --output T.json [--min-frequency F]
//       [--special-tokens A,B,...] [--pre-tokenizer gpt2|llama3|bytelevel-noregex]
//       [--json-key K] [--format auto|jsonl|text|text-blocks] [--on-error fail|skip]
//       [--threads N]
//   lathe tokenizer info T.json

#include <memory>

#include "cli/command.h"
#include "core/log.h"
#include "tokenizer/bpe_train_files.h"
#include "tokenizer/describe.h"

namespace lathe {

void cli_add_tokenizer(CLI::App& parent, CommandAction& action) {
    CLI::App* cmd = parent.add_subcommand("tokenizer", "Train or inspect a tokenizer.json");
    cmd->require_subcommand(1);

    auto args = std::make_shared<BpeTrainFilesOptions>();
    CLI::App* train = cmd->add_subcommand(
        "train",
        "Train a byte-level BPE tokenizer whose tokenizer.json Hugging Face tokenizers loads "
        "(merges chosen as HF's BpeTrainer chooses them)");
    train
        ->add_option("--vocab-size", args->vocab_size,
                     "Vocabulary size, special tokens and the 256 byte symbols included")
        ->required()
        ->check(CLI::PositiveNumber);
    train
        ->add_option("--input", args->inputs,
                     "Input files (text, JSONL; gzip and zstd read transparently; - is stdin)")
        ->required();
    train->add_option("--output", args->output, "Where to write tokenizer.json")->required();
    train
        ->add_option("--min-frequency", args->min_frequency,
                     "Never merge a pair seen fewer times than this")
        ->capture_default_str();
    train
        ->add_option("--special-tokens", args->special_tokens,
                     "Special tokens, comma-separated; they take ids 0..k-1")
        ->delimiter(',');
    train
        ->add_option("--pre-tokenizer", args->pre_tokenizer,
                     "gpt2 (GPT-2's regex + ByteLevel), llama3 (Llama-3's regex + ByteLevel) or "
                     "bytelevel-noregex (each document one word)")
        ->capture_default_str();
    train->add_option("--json-key", args->json_key, "JSONL field that holds the text")
        ->capture_default_str();
    train
        ->add_option("--format", args->format,
                     "auto (JSONL for .jsonl/.json/.ndjson names, else text), jsonl, text (a "
                     "document per line) or text-blocks (per blank-line-separated block); blank "
                     "lines (empty or only whitespace) are never documents, as in lathe prepare")
        ->capture_default_str();
    train
        ->add_option("--on-error", args->on_error,
                     "A document that is not valid UTF-8 or that the pre-tokenizer's pattern "
                     "gives up on: fail (stop with its file and line) or skip (leave it out, "
                     "count it)")
        ->capture_default_str();
    train->add_option("--threads", args->threads, "Threads (0 = every core)")
        ->capture_default_str()
        ->check(kThreadsRange);
    train->callback([&action, args] {
        action = [args] {
            // No progress display under --quiet (its final line is printed whatever the
            // terminal).
            args->show_progress = log_level() <= LogLevel::kInfo;
            return bpe_train_files(*args);
        };
    });

    auto info_path = std::make_shared<std::string>();
    CLI::App* info = cmd->add_subcommand(
        "info", "Describe a tokenizer.json: model, vocabulary size, components, special tokens");
    info->add_option("tokenizer", *info_path, "tokenizer.json")->required();
    info->callback([&action, info_path] {
        action = [info_path] {
            LATHE_ASSIGN_OR_RETURN(const std::string text, tokenizer_describe(*info_path));
            fmt::print("{}", text);
            return ok_status();
        };
    });
}

}  // namespace lathe
