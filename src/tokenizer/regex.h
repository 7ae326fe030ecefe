#pragma once
// Regular expressions for the tokenizer (internal to src/tokenizer): PCRE2 with UTF, UCP and JIT.
//
// HF `tokenizers` runs the patterns found in tokenizer.json on Oniguruma (Ruby-like syntax), and a
// few built-in ones on Rust's `regex` crate. Both are matched here on PCRE2 after translating the
// constructs whose meaning differs (checked against HF with the `tokenizers` Python package):
//   Oniguruma        meaning                                    PCRE2 written as
//   \s  \S           White_Space (PCRE2's UCP \s adds U+180E)   \p{White_Space}  \P{White_Space}
//   \w               letters, marks, numbers, Pc                [\p{L}\p{M}\p{N}\p{Pc}]
//   \W               the complement (outside [...] only)        [^\p{L}\p{M}\p{N}\p{Pc}]
//   \h  \H           hexadecimal digit (not horizontal space)   [0-9a-fA-F]  [^0-9a-fA-F]
//   \uHHHH           a code point                               \x{HHHH}
//   (?m)             dot matches newline                        (?s)
//   ^ $              line anchors                               PCRE2_MULTILINE
// Known gaps (never seen in real tokenizer.json files): \W and \H inside a character class keep
// PCRE2's meaning; Oniguruma's nested classes and && intersections are not translated.
//
// Thread safety: a compiled Regex is immutable and may be used from many threads at once (match
// data and the JIT stack are per thread).

#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>

#include "core/status.h"

namespace lathe {

// Thrown by Regex::search when PCRE2 gives up on a text (its match, depth or heap limit: a text
// that makes the pattern backtrack too far, as ten million spaces do for Llama-3's pre-tokenizer
// pattern; Hugging Face's tokenizers fails on it too). what() names the pattern and the text's
// size. It never leaves src/tokenizer: every entry point that runs a pattern returns it as an
// error Status (Tokenizer::encode, decode and from_json, PreTokenizer::split,
// Normalizer::normalize, Decoder::decode), so a caller on any thread gets a Status, never an
// exception.
class RegexLimitExceeded : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

// The error Status of a text that a pattern gave up on: e.what() and what to do with the text.
Status regex_limit_text_error(const RegexLimitExceeded& e);

class Regex {
public:
    // Compiles an Oniguruma-syntax pattern (as written in tokenizer.json). Errors carry PCRE2's
    // message and the offset in the pattern.
    static Result<Regex> from_oniguruma(std::string_view pattern);
    // Compiles a pattern already in PCRE2 syntax (lathe's own built-in patterns).
    static Result<Regex> from_pcre2(std::string_view pattern);
    // A pattern that matches `literal` exactly (HF: regex::escape of a String pattern).
    static Regex from_literal(std::string_view literal);

    Regex(Regex&&) noexcept;
    Regex& operator=(Regex&&) noexcept;
    ~Regex();

    // Finds the leftmost match in text starting the search at byte `start` (text before `start`
    // is visible to lookbehind). Returns false when there is none. text must be valid UTF-8 and
    // start a character boundary.
    bool search(std::string_view text, size_t start, size_t* match_begin, size_t* match_end) const;

    // Calls fn(begin, end) for each successive match, as Oniguruma's find_iter (the onig crate)
    // iterates: after a match ending at e the search restarts at e; an empty match at the end of
    // the previous match is skipped by advancing one character.
    template <typename F>
    void find_iter(std::string_view text, F&& fn) const {
        size_t last_end = 0;
        bool have_last = false;
        size_t last_match_end = 0;
        while (last_end <= text.size()) {
            size_t b, e;
            if (!search(text, last_end, &b, &e)) return;
            if (b == e && have_last && last_match_end == e) {
                if (last_end >= text.size()) return;
                last_end += next_char_len(text, last_end);
                continue;
            }
            last_end = e;
            have_last = true;
            last_match_end = e;
            fn(b, e);
        }
    }

    const std::string& pattern() const { return pattern_; }

private:
    struct Code;
    Regex(std::unique_ptr<Code> code, std::string pattern);
    static Result<Regex> compile(const std::string& pcre2_pattern, std::string original,
                                 uint32_t extra_options);
    static size_t next_char_len(std::string_view text, size_t i);
    std::unique_ptr<Code> code_;
    std::string pattern_;  // as given (for messages)
};

// Translates an Oniguruma pattern to PCRE2 syntax (see the table above). Exposed for tests.
std::string regex_translate_oniguruma(std::string_view pattern);

}  // namespace lathe
