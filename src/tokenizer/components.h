#pragma once
// Builders of tokenizer components from parsed tokenizer.json nodes (internal to src/tokenizer;
// the public entry points taking JSON text are in normalizer.h and pre_tokenizer.h).

#include <memory>

#include "core/status.h"
#include "tokenizer/json_node.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/regex.h"

namespace lathe {

// A {"String": s} or {"Regex": r} pattern node (Split, Replace) as a Regex: a String matches
// itself literally; a Regex is Oniguruma syntax.
Result<Regex> regex_from_pattern_node(const JsonNode& node);

// A non-null "normalizer" / "pre_tokenizer" node.
Result<std::unique_ptr<Normalizer>> normalizer_from_node(const JsonNode& node);
Result<std::unique_ptr<PreTokenizer>> pre_tokenizer_from_node(const JsonNode& node);

// The "type" string of a component node, or an error naming the node.
Result<std::string_view> component_type(const JsonNode& node);

}  // namespace lathe
