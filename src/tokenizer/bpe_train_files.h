#pragma once
// Training a byte-level BPE tokenizer.json from files (`lathe tokenizer train`): the inputs are
// read one after the other in batches of documents, words are counted on `threads` threads with
// the pre-tokenizer the output carries (tokenizer/bpe_trainer.h), merges are learned as HF's
// BpeTrainer learns them, and the file is written atomically once lathe's own encoder loads it.
//
// Inputs: text (a document per line), text-blocks (a document per run of non-blank lines) or JSONL
// (the string field `json_key` of each line); "auto" reads names ending in .jsonl, .ndjson or
// .json (optionally .gz/.zst/.zstd) as JSONL and everything else (stdin included) as text. Blank
// lines are never documents, as in `lathe prepare`.

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace lathe {

struct BpeTrainFilesOptions {
    int64_t vocab_size = 0;           // special tokens and the 256 byte symbols included
    std::vector<std::string> inputs;  // paths; "-" = stdin
    std::string output;               // tokenizer.json, written atomically
    uint64_t min_frequency = 0;
    std::vector<std::string> special_tokens;  // ids 0..k-1
    std::string pre_tokenizer = "gpt2";       // gpt2, llama3 or bytelevel-noregex
    std::string json_key = "text";
    std::string format = "auto";    // auto, jsonl, text or text-blocks
    std::string on_error = "fail";  // a bad document (bpe_count_words): fail or skip
    int threads = 0;                // 0 = every core
    bool show_progress = true;      // the counting progress display on stderr
};

// Checks the options (and that the output can be created) before reading any input; logs the
// counts, the merges learned and why training stopped.
Status bpe_train_files(const BpeTrainFilesOptions& options);

}  // namespace lathe
