#include "tokenizer/utf8.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include <cstdlib>
#include <cstring>
#include <memory>

#include "core/check.h"

namespace lathe::utf8 {
namespace {

// Scans one character at p (n > 0 bytes available). Returns its length when it is a complete,
// valid UTF-8 sequence (and sets *valid), otherwise the length of the maximal subpart of a valid
// sequence (at least 1), which is what one U+FFFD replaces (Unicode §3.9, Table 3-7).
size_t scan_char(const uint8_t* p, size_t n, bool* valid) {
    const uint8_t b0 = p[0];
    *valid = false;
    if (b0 < 0x80) {
        *valid = true;
        return 1;
    }
    size_t need;
    uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte
    if (b0 >= 0xC2 && b0 <= 0xDF) {
        need = 2;
    } else if (b0 >= 0xE0 && b0 <= 0xEF) {
        need = 3;
        if (b0 == 0xE0) lo = 0xA0;
        if (b0 == 0xED) hi = 0x9F;
    } else if (b0 >= 0xF0 && b0 <= 0xF4) {
        need = 4;
        if (b0 == 0xF0) lo = 0x90;
        if (b0 == 0xF4) hi = 0x8F;
    } else {
        return 1;
    }
    size_t i = 1;
    for (; i < need; ++i) {
        if (i >= n) return i;
        const uint8_t b = p[i];
        if (i == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) return i;
    }
    *valid = true;
    return need;
}

// A tiny anchored PCRE2 matcher for one Unicode property, used for the few properties utf8proc
// does not expose (Alphabetic). Compiled once per process.
class PropertyMatcher {
public:
    explicit PropertyMatcher(const char* pattern) {
        int err = 0;
        PCRE2_SIZE off = 0;
        code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern), PCRE2_ZERO_TERMINATED,
                              PCRE2_UTF | PCRE2_UCP | PCRE2_ANCHORED, &err, &off, nullptr);
        LATHE_CHECK(code_ != nullptr, "pattern {} does not compile (error {})", pattern, err);
    }
    ~PropertyMatcher() { pcre2_code_free(code_); }
    bool matches(char32_t c) const {
        std::string s = encode(c);
        pcre2_match_data* md = pcre2_match_data_create(1, nullptr);
        const int rc = pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), 0,
                                   PCRE2_NO_UTF_CHECK, md, nullptr);
        pcre2_match_data_free(md);
        return rc > 0;
    }

private:
    pcre2_code* code_ = nullptr;
};

}  // namespace

size_t first_invalid(std::string_view s) {
    const auto* p = reinterpret_cast<const uint8_t*>(s.data());
    const size_t n = s.size();
    size_t i = 0;
    while (i < n) {
        // Fast path over ASCII, 8 bytes at a time.
        while (i + 8 <= n) {
            uint64_t w;
            std::memcpy(&w, p + i, 8);
            if (w & 0x8080808080808080ull) break;
            i += 8;
        }
        if (i >= n) break;
        if (p[i] < 0x80) {
            ++i;
            continue;
        }
        bool valid = false;
        const size_t len = scan_char(p + i, n - i, &valid);
        if (!valid) return i;
        i += len;
    }
    return n;
}

bool is_valid(std::string_view s) { return first_invalid(s) == s.size(); }

void append_lossy(std::string& out, std::string_view s) {
    const auto* p = reinterpret_cast<const uint8_t*>(s.data());
    const size_t n = s.size();
    size_t i = 0;
    while (i < n) {
        bool valid = false;
        const size_t len = scan_char(p + i, n - i, &valid);
        if (valid) {
            out.append(s.data() + i, len);
        } else {
            out.append("\xEF\xBF\xBD");
        }
        i += len;
    }
}

size_t count_chars(std::string_view s) {
    size_t n = 0;
    for (char c : s) n += (static_cast<uint8_t>(c) & 0xC0) != 0x80;
    return n;
}

bool is_whitespace(char32_t c) {
    switch (c) {
        case 0x09: case 0x0A: case 0x0B: case 0x0C: case 0x0D: case 0x20: case 0x85: case 0xA0:
        case 0x1680: case 0x2028: case 0x2029: case 0x202F: case 0x205F: case 0x3000:
            return true;
        default:
            return c >= 0x2000 && c <= 0x200A;
    }
}

static utf8proc_category_t category(char32_t c) {
    return static_cast<utf8proc_category_t>(utf8proc_category(static_cast<utf8proc_int32_t>(c)));
}

bool is_numeric(char32_t c) {
    if (c < 0x80) return c >= '0' && c <= '9';
    const auto cat = category(c);
    return cat == UTF8PROC_CATEGORY_ND || cat == UTF8PROC_CATEGORY_NL ||
           cat == UTF8PROC_CATEGORY_NO;
}

bool is_numeric_decimal(char32_t c) {
    if (c < 0x80) return c >= '0' && c <= '9';
    return category(c) == UTF8PROC_CATEGORY_ND;
}

bool is_connector_punctuation(char32_t c) { return category(c) == UTF8PROC_CATEGORY_PC; }

bool is_alphabetic(char32_t c) {
    if (c < 0x80) return (c | 0x20) >= 'a' && (c | 0x20) <= 'z';
    static const PropertyMatcher matcher("\\p{Alphabetic}");
    return matcher.matches(c);
}

bool is_punctuation(char32_t c) {
    const auto cat = category(c);
    return cat >= UTF8PROC_CATEGORY_PC && cat <= UTF8PROC_CATEGORY_PO;
}

bool is_mark(char32_t c) {
    const auto cat = category(c);
    return cat == UTF8PROC_CATEGORY_MN || cat == UTF8PROC_CATEGORY_MC ||
           cat == UTF8PROC_CATEGORY_ME;
}

bool is_mark_nonspacing(char32_t c) { return category(c) == UTF8PROC_CATEGORY_MN; }

bool is_control_category(char32_t c) {
    const auto cat = category(c);
    return cat == UTF8PROC_CATEGORY_CC || cat == UTF8PROC_CATEGORY_CF ||
           cat == UTF8PROC_CATEGORY_CN || cat == UTF8PROC_CATEGORY_CO;
}

bool is_chinese_char(char32_t c) {
    return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) ||
           (c >= 0x20000 && c <= 0x2A6DF) || (c >= 0x2A700 && c <= 0x2B73F) ||
           (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
           (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

void append_lowercase(std::string& out, char32_t c) {
    if (c < 0x80) {
        out.push_back(static_cast<char>(c >= 'A' && c <= 'Z' ? c + 32 : c));
        return;
    }
    // The only character whose unconditional lowercase mapping (SpecialCasing.txt) has more than
    // one character: U+0130 LATIN CAPITAL LETTER I WITH DOT ABOVE -> "i" + U+0307.
    if (c == 0x130) {
        out.append("i\xCC\x87");
        return;
    }
    append(out, static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(c))));
}

void append_normalized(std::string& out, std::string_view s, NormalForm form) {
    // ASCII is invariant under all four forms.
    bool ascii = true;
    for (char ch : s) {
        if (static_cast<uint8_t>(ch) >= 0x80) {
            ascii = false;
            break;
        }
    }
    if (ascii) {
        out.append(s);
        return;
    }
    int options = UTF8PROC_STABLE;
    switch (form) {
        case NormalForm::kNfc: options |= UTF8PROC_COMPOSE; break;
        case NormalForm::kNfd: options |= UTF8PROC_DECOMPOSE; break;
        case NormalForm::kNfkc: options |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT; break;
        case NormalForm::kNfkd: options |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT; break;
    }
    utf8proc_uint8_t* result = nullptr;
    const utf8proc_ssize_t n =
        utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                     static_cast<utf8proc_ssize_t>(s.size()), &result,
                     static_cast<utf8proc_option_t>(options));
    LATHE_CHECK(n >= 0, "utf8proc_map failed on valid UTF-8: {}", utf8proc_errmsg(n));
    out.append(reinterpret_cast<const char*>(result), static_cast<size_t>(n));
    std::free(result);
}

}  // namespace lathe::utf8
