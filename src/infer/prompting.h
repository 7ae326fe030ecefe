#pragma once
// What a checkpoint folder gives the prompts of inference: its tokenizer (DIR/tokenizer.json), its
// chat template (DIR/tokenizer_config.json or its chat_template.jinja) and its stop ids
// (eos_token_id). `lathe generate` and `lathe serve` read prompts through these.
//
//   text:      tokenizer.encode(text, add_special_tokens=true), as HF's `tokenizer(text)`;
//   messages:  the chat template rendered with add_generation_prompt=true (transformers'
//              apply_chat_template), encoded without added special tokens (the template writes
//              BOS where the model wants one).
// A folder without a tokenizer or template loads; a prompt that needs the missing part is an
// error naming the file to add. Immutable after loading; safe to use from many threads.

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace lathe {

// The stop ids: DIR/generation_config.json's eos_token_id (an id or a list), else config.json's;
// empty when neither has one. Errors: a file that is not JSON, an eos_token_id of another type.
Result<std::vector<int32_t>> read_eos_ids(const std::filesystem::path& dir);

struct Prompting {
    std::optional<Tokenizer> tokenizer;
    std::optional<ChatTemplate> chat;
    Status chat_error;  // why tokenizer_config.json gave no template, for a chat prompt
    std::string dir;

    // Loads what DIR has. Errors: a tokenizer.json that does not load.
    static Result<Prompting> load(const std::filesystem::path& dir);

    Result<std::vector<int32_t>> encode_text(const std::string& text, bool add_special) const;
    Result<std::vector<int32_t>> encode_messages(const nlohmann::ordered_json& messages) const;
    // The text of ids with special tokens skipped; "" without a tokenizer.
    Result<std::string> decode(std::span<const int32_t> ids) const;
};

}  // namespace lathe
