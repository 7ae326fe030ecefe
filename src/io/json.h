#pragma once
// JSON text that lathe reads with nlohmann::json, behind one nesting bound. nlohmann's parser
// builds its value without recursion, but copying, dumping and walking a value (a chat
// template's view of a conversation, a config's keys written back) recurse once per level: a
// small input nested deeply enough overflows the stack. Inputs nested deeper than
// kJsonMaxDepth are refused before they are parsed.

#include <cstdint>
#include <istream>
#include <iterator>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace lathe {

// simdjson's default bound, which the tokenizer.json and JSONL readers apply.
inline constexpr int64_t kJsonMaxDepth = 1024;

// The deepest array/object nesting of a JSON text, counted outside strings; stops counting past
// `limit`. Linear in the text, no allocation.
int64_t json_depth(std::string_view text, int64_t limit = kJsonMaxDepth);

// Why `text` is not a JSON value lathe reads ("" when it is one): nested deeper than the bound,
// or nlohmann's parse error (with its line and column), without the exception's id.
std::string json_problem(std::string_view text, int64_t limit = kJsonMaxDepth);

// nlohmann's parse(text, nullptr, false) behind the bound: a discarded value (is_discarded())
// when `text` is not JSON or nests deeper than `limit`; json_problem(text) says which.
template <class J>
J json_parse(std::string_view text, int64_t limit = kJsonMaxDepth) {
    if (json_depth(text, limit) > limit) return J(J::value_t::discarded);
    return J::parse(text, nullptr, /*allow_exceptions=*/false);
}

// The same over a whole stream (a file opened by the caller).
template <class J>
J json_parse(std::istream& in, int64_t limit = kJsonMaxDepth) {
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    return json_parse<J>(std::string_view(text), limit);
}

}  // namespace lathe
