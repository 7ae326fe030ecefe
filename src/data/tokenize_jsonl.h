#pragma once
// JSONL through a Hugging Face tokenizer.json, line by line (`lathe tokenize`).
//
// Encode (default): each input line is a JSON object whose string field `json_key` (default
// "text") is encoded as HF's `Tokenizer.encode(text, add_special_tokens=special).ids` (special
// tokens written in the text are always recognized, as in HF); one output line `{"ids":[...]}`
// per input line.
//
// Decode: each input line is a JSON object whose field `json_key` (default "ids") is an array of
// ids; the output line is `{"text":"..."}` with HF's `Tokenizer.decode(ids,
// skip_special_tokens=!special)`.
//
// Input and output are paths, "-" for stdin/stdout; gzip/zstd input is read transparently; output
// to a file is atomic (nothing under the final name unless the whole run succeeded). Lines are
// processed in batches on `threads` workers (core/ordered_pool.h) and written in input order
// whatever the thread count. A malformed line stops the run with an error naming the file and
// line.

#include <string>

#include "core/status.h"

namespace lathe {

struct TokenizeJsonlOptions {
    std::string tokenizer;  // tokenizer.json
    bool special = false;   // encode: add special tokens; decode: keep them
    bool decode = false;
    std::string input = "-";
    std::string output = "-";
    int threads = 0;       // 0 = all cores; 1 = everything on the calling thread
    std::string json_key;  // "" = "text" when encoding, "ids" when decoding
    bool show_progress = true;
};

// Runs the whole file; the progress summary goes to stderr when show_progress.
Status tokenize_jsonl(const TokenizeJsonlOptions& options);

}  // namespace lathe
