#pragma once
// `lathe prepare`: text, JSONL or chat JSONL in (plain, gzip, zstd, stdin), GPT-NeoX token files
// out (data/indexed_dataset.h), on every core, with bounded memory.
//
// Pipeline (core/ordered_pool.h): the calling thread cuts the inputs into records and packs them
// into batches of about 1 MiB; worker threads parse (JSON), check (UTF-8, empty) and tokenize whole
// batches; the calling thread writes the batches strictly in input order. At most `2 * threads`
// batches exist at any time (reading waits for the oldest batch to be written), so memory does
// not grow with the corpus. The token index grows by 12 bytes per document
// (data/indexed_dataset.h).
//
// Each document is tokenized as GPT-NeoX's tools/datasets/preprocess_data.py does with its
// HFTokenizer: `tokenizer.encode(text)` with add_special_tokens=True (the post-processor's BOS and
// the like are added), then, with append_eod, the end-of-document id; one sequence per document.
// Blank lines (empty, or only spaces, tabs, \r, \v, \f) are never documents, in every format and
// as in `lathe tokenizer train`: text-blocks splits documents at them, and text, JSONL and chat
// input pass over them (counted in PrepareReport::blank_lines). Any other empty document (a JSONL
// "text" of "", a conversation that renders to nothing) is an error, or is counted as skipped with
// OnError::kSkip, like a malformed line; GPT-NeoX drops empty documents silently.
//
// Conversation formats (chat, alpaca, sharegpt) render each record with the model's chat template
// (tokenizer/chat_template.h: the ids of transformers' apply_chat_template(messages,
// tokenize=True)) and write a label file beside the tokens: the tokens of every generation-role
// (assistant) message and its end of turn keep their id, every other token is -100. alpaca and
// sharegpt records are mapped onto messages as LLaMA-Factory maps them (data/sft_records.h). An
// input of these formats may also be one JSON array of records (the first non-blank character is
// '['; the array is read whole); its records are named "<file>[index]" in messages. With
// max_tokens, a conversation of more tokens is a bad record. Bad records stop the run, or with
// OnError::kSkip are counted per RecordProblem. Training packs the conversations several to a
// sample (data/gpt2_dataset.h), with per-document attention when the run asks for it.
//
// Outputs appear only when the whole run succeeded: an error, a cancellation or a kill leaves
// nothing under the final names (temporary files are removed, except after SIGKILL, when a
// "<name>.tmp-<pid>" may remain).

#include <atomic>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "data/indexed_dataset.h"
#include "data/sft_records.h"

namespace lathe {

class Tokenizer;

enum class PrepareFormat {
    kAuto,        // per input: JSONL when the first non-blank line starts with '{', else kText;
                  // the first input decides chat vs plain for the run (see prepare_run)
    kJsonl,       // one JSON object per line; the document is its `json_key` string field
    kText,        // one document per line ("\n" or "\r\n"); blank lines are passed over
    kTextBlocks,  // one document per run of non-blank lines
    kChat,        // JSONL whose `json_key` (default "messages") is [{role, content}, ...]
    kAlpaca,      // LLaMA-Factory alpaca records (instruction, input, output, system, history)
    kSharegpt,    // LLaMA-Factory sharegpt records (`json_key`, default "conversations")
};

// True for the formats rendered with a chat template: kChat, kAlpaca, kSharegpt.
bool prepare_format_is_conversation(PrepareFormat format);

// "auto", "jsonl", "text", "text-blocks", "chat", "alpaca", "sharegpt".
const char* prepare_format_name(PrepareFormat format);
// The inverse; an unknown name is an error listing the valid ones.
Result<PrepareFormat> prepare_format_from_name(std::string_view name);

enum class OnError { kFail, kSkip };

struct PrepareOptions {
    std::string tokenizer_path;       // tokenizer.json
    std::vector<std::string> inputs;  // paths; "-" = stdin (at most once)
    std::string output_prefix;        // writes <prefix>.bin/.idx (+ <prefix>_label.bin/.idx)
    PrepareFormat format = PrepareFormat::kAuto;
    std::optional<std::string> json_key;  // default "text" ("messages" for chat)
    bool append_eod = false;
    std::optional<std::string> eod_token;  // --eod-token; see prepare_resolve_eod
    OnError on_error = OnError::kFail;
    int threads = 0;  // worker threads; 0 = all cores
    // Chat: the tokenizer_config.json whose chat_template renders the conversations (default:
    // the one beside the tokenizer, see prepare_find_tokenizer_config), and GPT-NeoX's switches.
    std::string chat_template_config;
    std::string generation_role = "assistant";
    bool only_last_turn = false;
    SharegptTags sharegpt_tags;  // sharegpt: turn keys and role tags (--role-tags)
    // Conversation formats: a conversation of more tokens is a bad record (0 = no limit).
    int64_t max_tokens = 0;
    // Presentation and limits.
    bool show_progress = true;
    size_t batch_bytes = size_t{1} << 20;
    size_t max_record_bytes = size_t{1} << 30;
    // Set from a signal handler to stop the run (it then returns a kCancelled error).
    const std::atomic<bool>* cancel = nullptr;
};

// What a run did; every count is final.
struct PrepareReport {
    std::vector<std::string> outputs;             // files written, in commit order
    PrepareFormat format = PrepareFormat::kAuto;  // kChat, or the first input's (auto resolved)
    TokenDType dtype = TokenDType::kInt32;
    int threads = 0;
    uint64_t documents = 0;                     // documents written
    uint64_t tokens = 0;                        // tokens written (EOD included)
    uint64_t trained_tokens = 0;                // SFT: tokens whose label is not -100
    uint64_t untrained_documents = 0;           // SFT: documents with no such token
    uint64_t skipped = 0;                       // bad records skipped under OnError::kSkip
    uint64_t blank_lines = 0;                   // blank lines passed over (not documents)
    std::vector<std::string> skipped_examples;  // the first messages, "file:line: problem"
    uint64_t input_bytes = 0;                   // decompressed bytes read
    uint64_t raw_bytes = 0;                     // bytes read from disk / stdin
    double load_seconds = 0.0;                  // loading the tokenizer (and chat template)
    double seconds = 0.0;                       // reading, tokenizing and writing, until committed
    std::optional<int32_t> eod_id;              // with append_eod (or chat: the template's eos)
    std::string eod_token;
    std::string eod_source;  // where the EOD token came from, in words
    // Bad records skipped under OnError::kSkip, per record_problem_name.
    std::map<std::string, uint64_t> skipped_by_problem;
};

// Runs the whole pipeline. Errors (the first bad record in input order under kFail, an
// unreadable input, a tokenizer that cannot load, no EOD token, a write failure, cancellation)
// name the file, line and problem, and leave no output under the final names.
Result<PrepareReport> prepare_run(const PrepareOptions& options);

// The end-of-document token for append_eod, in this order: `eod_token` if given (it must be in
// the vocabulary); "<|endoftext|>" if the vocabulary has it (what GPT-NeoX's HFTokenizer uses);
// the eos_token of the tokenizer_config.json beside the tokenizer. Otherwise an error that says to
// pass --eod-token. Returns (id, token, where it came from).
struct EodChoice {
    int32_t id = 0;
    std::string token;
    std::string source;
};
Result<EodChoice> prepare_resolve_eod(const Tokenizer& tokenizer, const std::string& tokenizer_path,
                                      const std::optional<std::string>& eod_token);

// The tokenizer_config.json that belongs to `tokenizer_path`: "<dir>/<stem>.tokenizer_config.json"
// (one folder holding several tokenizers as <name>.json) or "<dir>/tokenizer_config.json" (a
// Hugging Face model folder), whichever exists first; nullopt when neither does.
std::optional<std::string> prepare_find_tokenizer_config(const std::string& tokenizer_path);

}  // namespace lathe
