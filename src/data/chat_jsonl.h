#pragma once
// Conversations in JSONL through a chat template (`lathe chat render` / `lathe chat encode`).
//
// Each input line is a JSON object {"messages": [...], "tools": [...] (optional),
// "chat_template_kwargs": {...} (optional)}; other keys are ignored. chat_template_kwargs (and
// the run's default kwargs, which a line's own keys override) become template variables, as
// **kwargs of transformers' apply_chat_template do (e.g. {"enable_thinking": false} for Qwen3).
//
// Render writes one {"text": "..."} per line: the text apply_chat_template(messages,
// tools=tools, tokenize=False, add_generation_prompt=...) returns. Encode writes one
// {"ids": [...], "labels": [...]} per line: the ids are apply_chat_template(messages,
// tokenize=True)'s, with eos_token appended only after a final assistant turn that the
// template does not end itself (unless no_eos); labels as GPT-NeoX's
// preprocess_data_with_chat_template.py masks them (see ChatTemplate::encode_with_labels).
//
// Input and output are paths, "-" for stdin/stdout; gzip/zstd input is read transparently;
// output to a file is atomic. A bad line stops the run with an error naming the file and line.

#include <string>

#include "core/status.h"
#include "tokenizer/chat_template.h"

namespace lathe {

enum class ChatJsonlMode { kRender, kEncode };

struct ChatJsonlOptions {
    std::string tokenizer_config;  // tokenizer_config.json: chat_template and special tokens
    std::string chat_template;     // a template file overriding the config's ("" = none)
    std::string template_name = "default";
    std::string tokenizer;  // tokenizer.json; encode only
    std::string input = "-";
    std::string output = "-";
    std::string kwargs;  // JSON object of template variables for every line ("" = none)
    bool add_generation_prompt = false;  // render only
    ChatEncodeOptions encode;            // encode only (append_eos is set from no_eos)
    bool no_eos = false;
};

// The template: the config's (named) chat_template, or the chat_template file with the config's
// special tokens (then the config needs no chat_template of its own).
Result<ChatTemplate> chat_jsonl_load_template(const ChatJsonlOptions& options);

// Renders or encodes every line of options.input into options.output; logs a one-line summary.
Status chat_jsonl_run(const ChatJsonlOptions& options, ChatJsonlMode mode);

}  // namespace lathe
