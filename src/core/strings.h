#pragma once
// Small string helpers shared by config, CLI and tokenizer error messages.

#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace lathe {

// Levenshtein distance (insertions, deletions, substitutions; bytes).
size_t edit_distance(std::string_view a, std::string_view b);

// The candidate closest to `word` by edit distance, or "" when none is close enough to be a
// plausible typo (distance > max(2, |word|/3)). Used for "did you mean ...?" suggestions.
std::string closest_match(std::string_view word, std::span<const std::string> candidates);

// ", did you mean 'x'?" or "" — appended to error messages.
std::string did_you_mean(std::string_view word, std::span<const std::string> candidates);

std::vector<std::string_view> split(std::string_view s, char sep);
std::string_view trim(std::string_view s);
bool starts_with(std::string_view s, std::string_view prefix);
bool ends_with(std::string_view s, std::string_view suffix);

// Printable form of a byte string for an error message: non-printable and non-ASCII bytes escaped,
// cut to `max_len` bytes with "..." after.
std::string escape_for_message(std::string_view s, size_t max_len = 80);

// Appends `s` as a JSON string literal, quotes included: '"' and '\\' escaped, \n \r \t \b \f
// in their short forms, other bytes below 0x20 as \u00xx (lower-case hex), every other byte
// (UTF-8 included) as it is. This is the form serde_json and Python's
// json.dumps(ensure_ascii=False) write, so tokenizer.json files written here match Hugging Face's
// byte for byte.
void append_json_string(std::string& out, std::string_view s);
std::string json_string(std::string_view s);

}  // namespace lathe
