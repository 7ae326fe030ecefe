#include "tokenizer/utf8.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <unordered_map>
#include <vector>

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

std::optional<InvalidAt> find_invalid(std::string_view s) {
    const size_t at = first_invalid(s);
    if (at == s.size()) return std::nullopt;
    InvalidAt r;
    r.offset = at;
    r.byte = static_cast<uint8_t>(s[at]);
    // s[at] is no newline (a newline is valid UTF-8): its line starts after the last one before.
    const size_t newline = s.rfind('\n', at);
    r.column = newline == std::string_view::npos ? at + 1 : at - newline;
    r.line = 1 + uint64_t(std::count(s.begin(), s.begin() + std::ptrdiff_t(at), '\n'));
    return r;
}

bool is_valid(std::string_view s) {
    return first_invalid(s) == s.size();
}

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
        case 0x09:
        case 0x0A:
        case 0x0B:
        case 0x0C:
        case 0x0D:
        case 0x20:
        case 0x85:
        case 0xA0:
        case 0x1680:
        case 0x2028:
        case 0x2029:
        case 0x202F:
        case 0x205F:
        case 0x3000:
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

bool is_connector_punctuation(char32_t c) {
    return category(c) == UTF8PROC_CATEGORY_PC;
}

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

bool is_mark_nonspacing(char32_t c) {
    return category(c) == UTF8PROC_CATEGORY_MN;
}

// Marks (general category M*) that Unicode assigned after 9.0 (Unicode 10.0-14.0 from Perl's
// Unicode::UCD, 15.0 from utf8proc): HF's StripAccents takes its mark table from a Unicode 9.0
// crate and leaves these in place.
constexpr std::pair<char32_t, char32_t> kMarksNewerThanUnicode9[] = {
    {0x07FD, 0x07FD},   {0x0898, 0x089F},   {0x08CA, 0x08D3},   {0x09FE, 0x09FE},
    {0x0AFA, 0x0AFF},   {0x0B55, 0x0B55},   {0x0C04, 0x0C04},   {0x0C3C, 0x0C3C},
    {0x0CF3, 0x0CF3},   {0x0D00, 0x0D00},   {0x0D3B, 0x0D3C},   {0x0D81, 0x0D81},
    {0x0EBA, 0x0EBA},   {0x0ECE, 0x0ECE},   {0x1715, 0x1715},   {0x180F, 0x180F},
    {0x1ABF, 0x1ACE},   {0x1CF7, 0x1CF7},   {0x1DF6, 0x1DFA},   {0xA82C, 0xA82C},
    {0xA8FF, 0xA8FF},   {0x10D24, 0x10D27}, {0x10EAB, 0x10EAC}, {0x10EFD, 0x10EFF},
    {0x10F46, 0x10F50}, {0x10F82, 0x10F85}, {0x11070, 0x11070}, {0x11073, 0x11074},
    {0x110C2, 0x110C2}, {0x11145, 0x11146}, {0x111CE, 0x111CF}, {0x11241, 0x11241},
    {0x1133B, 0x1133B}, {0x1145E, 0x1145E}, {0x1182C, 0x1183A}, {0x11930, 0x11935},
    {0x11937, 0x11938}, {0x1193B, 0x1193E}, {0x11940, 0x11940}, {0x11942, 0x11943},
    {0x119D1, 0x119D7}, {0x119DA, 0x119E0}, {0x119E4, 0x119E4}, {0x11A01, 0x11A0A},
    {0x11A33, 0x11A39}, {0x11A3B, 0x11A3E}, {0x11A47, 0x11A47}, {0x11A51, 0x11A5B},
    {0x11A8A, 0x11A99}, {0x11D31, 0x11D36}, {0x11D3A, 0x11D3A}, {0x11D3C, 0x11D3D},
    {0x11D3F, 0x11D45}, {0x11D47, 0x11D47}, {0x11D8A, 0x11D8E}, {0x11D90, 0x11D91},
    {0x11D93, 0x11D97}, {0x11EF3, 0x11EF6}, {0x11F00, 0x11F01}, {0x11F03, 0x11F03},
    {0x11F34, 0x11F3A}, {0x11F3E, 0x11F42}, {0x13440, 0x13440}, {0x13447, 0x13455},
    {0x16F4F, 0x16F4F}, {0x16F7F, 0x16F87}, {0x16FE4, 0x16FE4}, {0x16FF0, 0x16FF1},
    {0x1CF00, 0x1CF2D}, {0x1CF30, 0x1CF46}, {0x1E08F, 0x1E08F}, {0x1E130, 0x1E136},
    {0x1E2AE, 0x1E2AE}, {0x1E2EC, 0x1E2EF}, {0x1E4EC, 0x1E4EF},
};

static bool mark_newer_than_unicode9(char32_t c) {
    if (c < kMarksNewerThanUnicode9[0].first) return false;
    auto it = std::upper_bound(
        std::begin(kMarksNewerThanUnicode9), std::end(kMarksNewerThanUnicode9), c,
        [](char32_t x, const std::pair<char32_t, char32_t>& r) { return x < r.first; });
    --it;
    return c <= it->second;
}

bool is_mark_unicode9(char32_t c) {
    // General_Category changes since Unicode 9.0 among existing characters: U+1CF2 and U+1CF3
    // (Vedic ardhavisarga) were spacing marks, U+111C9 (Sharada sandhi mark) was punctuation.
    if (c == 0x1CF2 || c == 0x1CF3) return true;
    if (c == 0x111C9) return false;
    return is_mark(c) && !mark_newer_than_unicode9(c);
}

bool is_mark_nonspacing_unicode9(char32_t c) {
    return is_mark_nonspacing(c) && !mark_newer_than_unicode9(c);
}

bool is_control_category(char32_t c) {
    const auto cat = category(c);
    return cat == UTF8PROC_CATEGORY_CC || cat == UTF8PROC_CATEGORY_CF ||
           cat == UTF8PROC_CATEGORY_CO;
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

namespace {

// HF `tokenizers` normalizes with the Unicode 9.0 tables of the unicode-normalization-alignments
// crate; utf8proc carries a newer Unicode. The two agree on every character Unicode 9.0 had
// (decompositions and combining classes of assigned characters never change), so lathe uses
// utf8proc's data except for the characters below: assigned after Unicode 9.0 with a non-zero
// combining class or a decomposition. To HF they are unassigned: combining class 0, no
// decomposition, no composition. (Generated from Unicode 14.0's DerivedAge,
// Canonical_Combining_Class and Decomposition_Type with Perl's Unicode::UCD, plus the Unicode
// 15.0 ones that utf8proc 2.6 knows; characters newer than utf8proc's tables are unknown to both
// sides alike.)
constexpr std::pair<char32_t, char32_t> kNewerThanUnicode9[] = {
    {0x07FD, 0x07FD},   {0x0898, 0x089F},   {0x08CA, 0x08D3},   {0x09FE, 0x09FE},
    {0x0C3C, 0x0C3C},   {0x0D3B, 0x0D3C},   {0x0EBA, 0x0EBA},   {0x1715, 0x1715},
    {0x1ABF, 0x1ACE},   {0x1DF6, 0x1DFA},   {0x32FF, 0x32FF},   {0xA7F2, 0xA7F4},
    {0xA82C, 0xA82C},   {0xAB69, 0xAB69},   {0x10781, 0x10785}, {0x10787, 0x107B0},
    {0x107B2, 0x107BA}, {0x10D24, 0x10D27}, {0x10EAB, 0x10EAC}, {0x10F46, 0x10F50},
    {0x10F82, 0x10F85}, {0x11070, 0x11070}, {0x1133B, 0x1133B}, {0x1145E, 0x1145E},
    {0x11839, 0x1183A}, {0x11938, 0x11938}, {0x1193D, 0x1193E}, {0x11943, 0x11943},
    {0x119E0, 0x119E0}, {0x11A34, 0x11A34}, {0x11A47, 0x11A47}, {0x11A99, 0x11A99},
    {0x11D42, 0x11D42}, {0x11D44, 0x11D45}, {0x11D97, 0x11D97}, {0x16FF0, 0x16FF1},
    {0x1E130, 0x1E136}, {0x1E2AE, 0x1E2AE}, {0x1E2EC, 0x1E2EF}, {0x1F16C, 0x1F16C},
    {0x1FBF0, 0x1FBF9},
};
// The same for Unicode 15.0, which utf8proc knows and Perl's Unicode 14.0 data does not.
constexpr std::pair<char32_t, char32_t> kNewInUnicode15[] = {
    {0x10EFD, 0x10EFF}, {0x11F41, 0x11F42}, {0x1E030, 0x1E06D},
    {0x1E08F, 0x1E08F}, {0x1E4EC, 0x1E4EF},
};

template <size_t N>
bool in_ranges(const std::pair<char32_t, char32_t> (&ranges)[N], char32_t c) {
    if (c < ranges[0].first) return false;
    auto it = std::upper_bound(
        std::begin(ranges), std::end(ranges), c,
        [](char32_t x, const std::pair<char32_t, char32_t>& r) { return x < r.first; });
    --it;
    return c <= it->second;
}

bool newer_than_unicode9(char32_t c) {
    return c >= 0x7FD && (in_ranges(kNewerThanUnicode9, c) || in_ranges(kNewInUnicode15, c));
}

// Canonical combining class as HF sees it.
int combining_class(char32_t c) {
    if (newer_than_unicode9(c)) return 0;
    return utf8proc_get_property(static_cast<utf8proc_int32_t>(c))->combining_class;
}

bool is_composing(NormalForm form) {
    return form == NormalForm::kNfc || form == NormalForm::kNfkc;
}
bool is_compat(NormalForm form) {
    return form == NormalForm::kNfkc || form == NormalForm::kNfkd;
}

// Appends the full decomposition of c (canonical, or compatibility for NFKC/NFKD; Hangul
// syllables algorithmically) to out.
void decompose(char32_t c, NormalForm form, std::vector<char32_t>& out) {
    if (c < 0xC0 && !is_compat(form)) {  // nothing below U+00C0 has a canonical decomposition
        out.push_back(c);
        return;
    }
    if (newer_than_unicode9(c)) {
        out.push_back(c);
        return;
    }
    utf8proc_int32_t buf[32];
    int boundclass = 0;
    const int options = UTF8PROC_DECOMPOSE | (is_compat(form) ? UTF8PROC_COMPAT : 0);
    const utf8proc_ssize_t n =
        utf8proc_decompose_char(static_cast<utf8proc_int32_t>(c), buf, 32,
                                static_cast<utf8proc_option_t>(options), &boundclass);
    LATHE_CHECK(n > 0 && n <= 32, "utf8proc_decompose_char(U+{:04X}) returned {}", uint32_t(c), n);
    for (utf8proc_ssize_t i = 0; i < n; ++i) out.push_back(static_cast<char32_t>(buf[i]));
}

constexpr char32_t kHangulSBase = 0xAC00, kHangulLBase = 0x1100, kHangulVBase = 0x1161,
                   kHangulTBase = 0x11A7;
constexpr int kHangulLCount = 19, kHangulVCount = 21, kHangulTCount = 28,
              kHangulNCount = kHangulVCount * kHangulTCount,
              kHangulSCount = kHangulLCount * kHangulNCount;

// The primary composite of (a, b), or 0. Hangul is algorithmic; other pairs come from utf8proc
// (NFC of the two characters is one character exactly when they compose), memoized per thread.
char32_t compose_pair(char32_t a, char32_t b) {
    if (a >= kHangulLBase && a < kHangulLBase + kHangulLCount && b >= kHangulVBase &&
        b < kHangulVBase + kHangulVCount) {
        return kHangulSBase +
               ((a - kHangulLBase) * kHangulVCount + (b - kHangulVBase)) * kHangulTCount;
    }
    if (a >= kHangulSBase && a < kHangulSBase + kHangulSCount &&
        (a - kHangulSBase) % kHangulTCount == 0 && b > kHangulTBase &&
        b < kHangulTBase + kHangulTCount) {
        return a + (b - kHangulTBase);
    }
    if (newer_than_unicode9(a) || newer_than_unicode9(b)) return 0;
    const uint64_t key = (uint64_t(a) << 32) | b;
    thread_local std::unordered_map<uint64_t, char32_t> memo;
    if (auto it = memo.find(key); it != memo.end()) return it->second;
    std::string pair = encode(a);
    append(pair, b);
    utf8proc_uint8_t* result = nullptr;
    const utf8proc_ssize_t n =
        utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(pair.data()),
                     static_cast<utf8proc_ssize_t>(pair.size()), &result,
                     static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
    LATHE_CHECK(n >= 0, "utf8proc_map failed on valid UTF-8: {}", utf8proc_errmsg(n));
    const std::string_view r(reinterpret_cast<const char*>(result), static_cast<size_t>(n));
    char32_t composite = 0;
    int len = 0;
    if (!r.empty()) {
        const char32_t p = decode(r, 0, &len);
        if (static_cast<size_t>(len) == r.size() && !newer_than_unicode9(p)) composite = p;
    }
    std::free(result);
    if (memo.size() > 65536) memo.clear();
    memo.emplace(key, composite);
    return composite;
}

// Unicode normalization (UAX #15) with HF's character data: full decomposition, canonical
// ordering (a stable sort of each run of non-starters by combining class), and for NFC/NFKC the
// canonical composition algorithm.
void append_normalized_slow(std::string& out, std::string_view s, NormalForm form) {
    thread_local std::vector<char32_t> chars;
    thread_local std::vector<int> classes;
    chars.clear();
    size_t i = 0;
    while (i < s.size()) {
        int len;
        decompose(decode(s, i, &len), form, chars);
        i += static_cast<size_t>(len);
    }
    classes.resize(chars.size());
    for (size_t k = 0; k < chars.size(); ++k) classes[k] = combining_class(chars[k]);
    // Canonical ordering: insertion sort within runs of non-zero classes (stable).
    for (size_t k = 1; k < chars.size(); ++k) {
        if (classes[k] == 0) continue;
        size_t j = k;
        while (j > 0 && classes[j - 1] > classes[j]) {
            std::swap(classes[j - 1], classes[j]);
            std::swap(chars[j - 1], chars[j]);
            --j;
        }
    }
    if (is_composing(form) && !chars.empty()) {
        // Only a starter composes; text that begins with non-starters has none until one comes.
        bool have_starter = classes[0] == 0;
        size_t starter = 0;
        int last_class = 0;
        size_t w = 1;
        for (size_t k = 1; k < chars.size(); ++k) {
            const char32_t c = chars[k];
            const int cls = classes[k];
            // Not blocked: nothing between the starter and c, or everything between has a lower
            // (non-zero) class than c.
            if (have_starter && (last_class < cls || last_class == 0)) {
                if (const char32_t composite = compose_pair(chars[starter], c)) {
                    chars[starter] = composite;
                    continue;
                }
            }
            if (cls == 0) {
                have_starter = true;
                starter = w;
            }
            last_class = cls;
            chars[w++] = c;
        }
        chars.resize(w);
    }
    for (char32_t c : chars) append(out, c);
}

// Whether a character is "inert" under a normal form: a text made only of inert characters is
// already in that form. Inert means: combining class 0 (no reordering can involve it), the form
// maps it to itself, and, for the composing forms, it cannot be the second element of a
// composition (so it cannot merge with the character before it; Hangul vowel and trailing jamo
// compose algorithmically and are excluded by hand). Most text is made of inert characters, and
// checking them costs a table lookup instead of a full decompose/recompose.
bool compute_inert(char32_t c, NormalForm form) {
    if (newer_than_unicode9(c)) return true;
    const utf8proc_property_t* p = utf8proc_get_property(static_cast<utf8proc_int32_t>(c));
    if (p->combining_class != 0) return false;
    if (is_composing(form)) {
        if (p->comb_index != UINT16_MAX && p->comb_index >= 0x8000) return false;
        if ((c >= 0x1161 && c <= 0x1175) || (c >= 0x11A8 && c <= 0x11C2)) return false;
    }
    const std::string one = encode(c);
    std::string mapped;
    append_normalized_slow(mapped, one, form);
    return mapped == one;
}

// Per form, a lazily filled table over all code points: 0 unknown, 1 inert, 2 not inert.
class InertTable {
public:
    explicit InertTable(NormalForm form)
        : form_(form), states_(new std::atomic<uint8_t>[0x110000]) {
        for (size_t i = 0; i < 0x110000; ++i) states_[i].store(0, std::memory_order_relaxed);
    }
    bool inert(char32_t c) {
        uint8_t v = states_[c].load(std::memory_order_relaxed);
        if (v == 0) {
            v = compute_inert(c, form_) ? 1 : 2;
            states_[c].store(v, std::memory_order_relaxed);  // idempotent: races are harmless
        }
        return v == 1;
    }

private:
    NormalForm form_;
    std::unique_ptr<std::atomic<uint8_t>[]> states_;
};

InertTable& inert_table(NormalForm form) {
    static InertTable nfc(NormalForm::kNfc), nfd(NormalForm::kNfd), nfkc(NormalForm::kNfkc),
        nfkd(NormalForm::kNfkd);
    switch (form) {
        case NormalForm::kNfc:
            return nfc;
        case NormalForm::kNfd:
            return nfd;
        case NormalForm::kNfkc:
            return nfkc;
        case NormalForm::kNfkd:
            return nfkd;
    }
    return nfc;
}

}  // namespace

void append_normalized(std::string& out, std::string_view s, NormalForm form) {
    // Inert characters (ASCII always is) are copied as they are. The boundary before an inert
    // character is safe: normalizing the text on either side of it separately gives the same
    // result. So each run of non-inert characters, together with the inert character before it
    // (which may compose with them), is normalized on its own, up to the next inert character.
    InertTable* table = nullptr;
    size_t i = 0;
    size_t last_inert = std::string_view::npos;  // position of the inert character just copied
    size_t out_before_last_inert = out.size();
    while (i < s.size()) {
        const auto b = static_cast<uint8_t>(s[i]);
        if (b < 0x80) {
            // Copy the ASCII run; only its last character can start a segment.
            size_t j = i + 1;
            while (j < s.size() && static_cast<uint8_t>(s[j]) < 0x80) ++j;
            out.append(s.substr(i, j - i));
            last_inert = j - 1;
            out_before_last_inert = out.size() - 1;
            i = j;
            continue;
        }
        if (table == nullptr) table = &inert_table(form);
        int len;
        const char32_t c = decode(s, i, &len);
        if (table->inert(c)) {
            last_inert = i;
            out_before_last_inert = out.size();
            out.append(s.substr(i, static_cast<size_t>(len)));
            i += static_cast<size_t>(len);
            continue;
        }
        size_t begin = i;
        if (last_inert != std::string_view::npos) {
            begin = last_inert;
            out.resize(out_before_last_inert);
        }
        size_t j = i + static_cast<size_t>(len);
        while (j < s.size()) {
            if (static_cast<uint8_t>(s[j]) < 0x80) break;
            int l;
            if (table->inert(decode(s, j, &l))) break;
            j += static_cast<size_t>(l);
        }
        append_normalized_slow(out, s.substr(begin, j - begin), form);
        last_inert = std::string_view::npos;
        i = j;
    }
}

}  // namespace lathe::utf8
