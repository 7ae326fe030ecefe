#pragma once
// UTF-8 and Unicode character helpers shared by the tokenizer components (internal to
// src/tokenizer). Character properties follow Rust's `char` methods, because HF `tokenizers` is
// written in Rust and its components call them (is_whitespace, is_alphanumeric, to_lowercase...).

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace lathe::utf8 {

// Decodes the character starting at s[i] (s must be valid UTF-8 and i < s.size()); stores its
// byte length in *len.
inline char32_t decode(std::string_view s, size_t i, int* len) {
    const auto b0 = static_cast<uint8_t>(s[i]);
    if (b0 < 0x80) {
        *len = 1;
        return b0;
    }
    if (b0 < 0xE0) {
        *len = 2;
        return (char32_t(b0 & 0x1F) << 6) | (static_cast<uint8_t>(s[i + 1]) & 0x3F);
    }
    if (b0 < 0xF0) {
        *len = 3;
        return (char32_t(b0 & 0x0F) << 12) |
               (char32_t(static_cast<uint8_t>(s[i + 1]) & 0x3F) << 6) |
               (static_cast<uint8_t>(s[i + 2]) & 0x3F);
    }
    *len = 4;
    return (char32_t(b0 & 0x07) << 18) | (char32_t(static_cast<uint8_t>(s[i + 1]) & 0x3F) << 12) |
           (char32_t(static_cast<uint8_t>(s[i + 2]) & 0x3F) << 6) |
           (static_cast<uint8_t>(s[i + 3]) & 0x3F);
}

// Byte length of the character whose first byte is b (1 for a stray continuation byte).
inline int char_len(uint8_t b) {
    if (b < 0xC0) return 1;
    if (b < 0xE0) return 2;
    if (b < 0xF0) return 3;
    return 4;
}

// Appends the UTF-8 encoding of cp (a Unicode scalar value) to out.
inline void append(std::string& out, char32_t cp) {
    if (cp < 0x80) {
        out.push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
        out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
        out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
        out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
        out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
        out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else {
        out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
        out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
        out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
        out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
}

inline std::string encode(char32_t cp) {
    std::string s;
    append(s, cp);
    return s;
}

// Whether s is valid UTF-8 (no surrogates, no overlong forms, nothing above U+10FFFF).
bool is_valid(std::string_view s);

// Byte offset of the first invalid sequence in s, or s.size() when s is valid.
size_t first_invalid(std::string_view s);

// Where the first invalid sequence of a text is, for an error message: its byte offset, its line
// (1 + the newlines before it) and byte column in that line (1-based), and its first byte.
struct InvalidAt {
    size_t offset = 0;
    uint64_t line = 1;
    size_t column = 1;
    uint8_t byte = 0;
};
// The first invalid sequence of s, or nullopt when s is valid.
std::optional<InvalidAt> find_invalid(std::string_view s);

// Appends s to out with every maximal invalid subsequence replaced by U+FFFD, as Rust's
// String::from_utf8_lossy does (the "substitution of maximal subparts" of Unicode §3.9).
void append_lossy(std::string& out, std::string_view s);

// Number of characters in valid UTF-8.
size_t count_chars(std::string_view s);

// Rust char::is_whitespace: the Unicode White_Space property.
bool is_whitespace(char32_t c);
// Rust char::is_numeric: general category Nd, Nl or No.
bool is_numeric(char32_t c);
// General category Nd.
bool is_numeric_decimal(char32_t c);
// General category Pc.
bool is_connector_punctuation(char32_t c);
// Rust char::is_alphabetic: the Unicode Alphabetic property.
bool is_alphabetic(char32_t c);
// Rust char::is_alphanumeric.
inline bool is_alphanumeric(char32_t c) {
    return is_alphabetic(c) || is_numeric(c);
}
// Unicode general category P* (Pc Pd Ps Pe Pi Pf Po).
bool is_punctuation(char32_t c);
// Unicode general category M* (Mn Mc Me).
bool is_mark(char32_t c);
// Unicode general category Mn.
bool is_mark_nonspacing(char32_t c);
// is_mark / is_mark_nonspacing as Unicode 9.0 had them: the tables HF's StripAccents and
// BertNormalizer use (marks added later are not marks to them).
bool is_mark_unicode9(char32_t c);
bool is_mark_nonspacing_unicode9(char32_t c);
// Unicode general category Cc, Cf or Co (what BERT's clean-up calls "control"; HF's categories
// crate does not count unassigned code points).
bool is_control_category(char32_t c);
// Whether the character is in one of the CJK ideograph blocks BERT pads with spaces.
bool is_chinese_char(char32_t c);
// Appends Rust's char::to_lowercase(c) (the full, context-free lowercase mapping) to out.
void append_lowercase(std::string& out, char32_t c);

enum class NormalForm { kNfc, kNfd, kNfkc, kNfkd };
// Appends the normalization form `form` of valid UTF-8 `s` to out.
void append_normalized(std::string& out, std::string_view s, NormalForm form);

}  // namespace lathe::utf8
