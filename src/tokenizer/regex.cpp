#include "tokenizer/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "core/check.h"
#include "core/strings.h"
#include "tokenizer/utf8.h"

namespace lathe {

namespace {

constexpr const char* kWordClassBody = "\\p{L}\\p{M}\\p{N}\\p{Pc}";
constexpr const char* kHexClassBody = "0-9a-fA-F";
// The JIT stack grows up to this size; deep backtracking over very long runs of one character
// class (a megabyte of spaces) needs more than PCRE2's 32 KiB default.
constexpr size_t kJitStackMaxBytes = 16u << 20;

// Per-thread match state, shared by every Regex. Only the whole match is read (HF splits and
// replaces on whole matches and ignores capturing groups), so match data holds one pair: for a
// pattern with groups, PCRE2 then fills that pair and returns 0 ("the vector is too small for
// every group"), which is a match like any positive count.
struct ThreadMatchState {
    pcre2_match_data* match_data = nullptr;
    pcre2_match_context* match_context = nullptr;
    pcre2_jit_stack* jit_stack = nullptr;
    ThreadMatchState() {
        match_data = pcre2_match_data_create(1, nullptr);
        match_context = pcre2_match_context_create(nullptr);
        jit_stack = pcre2_jit_stack_create(32 * 1024, kJitStackMaxBytes, nullptr);
        LATHE_CHECK(match_data && match_context && jit_stack, "PCRE2 allocation failed");
        pcre2_jit_stack_assign(match_context, nullptr, jit_stack);
    }
    ~ThreadMatchState() {
        pcre2_jit_stack_free(jit_stack);
        pcre2_match_context_free(match_context);
        pcre2_match_data_free(match_data);
    }
};

ThreadMatchState& thread_match_state() {
    thread_local ThreadMatchState state;
    return state;
}

bool is_hex(char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

}  // namespace

struct Regex::Code {
    pcre2_code* code = nullptr;
    bool jit = false;
    ~Code() { pcre2_code_free(code); }
};

Regex::Regex(std::unique_ptr<Code> code, std::string pattern)
    : code_(std::move(code)), pattern_(std::move(pattern)) {}
Regex::Regex(Regex&&) noexcept = default;
Regex& Regex::operator=(Regex&&) noexcept = default;
Regex::~Regex() = default;

std::string regex_translate_oniguruma(std::string_view p) {
    std::string out;
    out.reserve(p.size() + 16);
    bool in_class = false;
    size_t class_open = 0;  // position in `p` right after the '[' or '[^' that opened the class
    for (size_t i = 0; i < p.size(); ++i) {
        const char c = p[i];
        if (c == '\\' && i + 1 < p.size()) {
            const char e = p[i + 1];
            if (e == 's') {
                out += "\\p{White_Space}";
            } else if (e == 'S') {
                out += "\\P{White_Space}";
            } else if (e == 'w') {
                out += in_class ? std::string(kWordClassBody)
                                : std::string("[") + kWordClassBody + "]";
            } else if (e == 'W' && !in_class) {
                out += std::string("[^") + kWordClassBody + "]";
            } else if (e == 'h') {
                out +=
                    in_class ? std::string(kHexClassBody) : std::string("[") + kHexClassBody + "]";
            } else if (e == 'H' && !in_class) {
                out += std::string("[^") + kHexClassBody + "]";
            } else if (e == 'u' && i + 5 < p.size() && is_hex(p[i + 2]) && is_hex(p[i + 3]) &&
                       is_hex(p[i + 4]) && is_hex(p[i + 5])) {
                out += "\\x{";
                out.append(p.substr(i + 2, 4));
                out += "}";
                i += 4;
            } else {
                out += c;
                out += e;
            }
            ++i;
            continue;
        }
        if (in_class) {
            if (c == '[' && i + 1 < p.size() && p[i + 1] == ':') {
                // POSIX bracket [:alpha:] — copy through to its closing ":]".
                const size_t close = p.find(":]", i + 2);
                if (close != std::string_view::npos) {
                    out.append(p.substr(i, close + 2 - i));
                    i = close + 1;
                    continue;
                }
            }
            if (c == ']' && i != class_open) in_class = false;
            out += c;
            continue;
        }
        if (c == '[') {
            in_class = true;
            out += c;
            class_open = i + 1;
            if (i + 1 < p.size() && p[i + 1] == '^') {
                out += '^';
                ++i;
                class_open = i + 1;
            }
            continue;
        }
        if (c == '(' && i + 1 < p.size() && p[i + 1] == '?') {
            // Inline options "(?imx-imx)" or "(?imx-imx:": Oniguruma's m is PCRE2's s.
            size_t j = i + 2;
            while (j < p.size() && (p[j] == 'i' || p[j] == 'm' || p[j] == 'x' || p[j] == '-')) ++j;
            if (j > i + 2 && j < p.size() && (p[j] == ':' || p[j] == ')')) {
                out += "(?";
                for (size_t k = i + 2; k < j; ++k) out += p[k] == 'm' ? 's' : p[k];
                i = j - 1;
                continue;
            }
        }
        out += c;
    }
    return out;
}

Result<Regex> Regex::compile(const std::string& pcre2_pattern, std::string original,
                             uint32_t extra_options) {
    int err = 0;
    PCRE2_SIZE err_offset = 0;
    pcre2_code* code =
        pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pcre2_pattern.data()), pcre2_pattern.size(),
                      PCRE2_UTF | PCRE2_UCP | extra_options, &err, &err_offset, nullptr);
    if (code == nullptr) {
        PCRE2_UCHAR message[256];
        pcre2_get_error_message(err, message, sizeof(message));
        return invalid_argument_error(
            "invalid regex '{}': {} (at offset {} of its PCRE2 form '{}')", original,
            reinterpret_cast<const char*>(message), err_offset, pcre2_pattern);
    }
    auto holder = std::make_unique<Code>();
    holder->code = code;
    holder->jit = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
    return Regex(std::move(holder), std::move(original));
}

Result<Regex> Regex::from_oniguruma(std::string_view pattern) {
    return compile(regex_translate_oniguruma(pattern), std::string(pattern), PCRE2_MULTILINE);
}

Result<Regex> Regex::from_pcre2(std::string_view pattern) {
    return compile(std::string(pattern), std::string(pattern), 0);
}

Regex Regex::from_literal(std::string_view literal) {
    std::string escaped;
    for (char c : literal) {
        const auto u = static_cast<unsigned char>(c);
        if (u < 0x80 && !((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') ||
                          (c >= 'A' && c <= 'Z') || c == ' ' || c == '_')) {
            // Escape every ASCII punctuation and control character by code point.
            escaped += fmt::format("\\x{{{:x}}}", u);
        } else {
            escaped += c;
        }
    }
    Result<Regex> r = compile(escaped, std::string(literal), 0);
    LATHE_CHECK(r.ok(), "escaped literal failed to compile: {}", r.status().message());
    return std::move(r).value();
}

bool Regex::search(std::string_view text, size_t start, size_t* match_begin,
                   size_t* match_end) const {
    ThreadMatchState& st = thread_match_state();
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    int rc;
    if (code_->jit) {
        rc = pcre2_jit_match(code_->code, subject, text.size(), start, 0, st.match_data,
                             st.match_context);
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
            // Fall back to the interpreter, whose backtracking lives on the heap.
            rc = pcre2_match(code_->code, subject, text.size(), start,
                             PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, st.match_data, nullptr);
        }
    } else {
        rc = pcre2_match(code_->code, subject, text.size(), start, PCRE2_NO_UTF_CHECK,
                         st.match_data, nullptr);
    }
    if (rc == PCRE2_ERROR_NOMATCH) return false;
    if (rc == PCRE2_ERROR_MATCHLIMIT || rc == PCRE2_ERROR_DEPTHLIMIT ||
        rc == PCRE2_ERROR_HEAPLIMIT) {
        throw RegexLimitExceeded(fmt::format(
            "the tokenizer's pattern '{}' gave up on this text of {} bytes (PCRE2 error {}: it "
            "backtracks too far, e.g. over a run of millions of spaces)",
            escape_for_message(pattern_, 60), text.size(), rc));
    }
    LATHE_CHECK(rc >= 0, "PCRE2 match of '{}' failed with code {} on {} bytes", pattern_, rc,
                text.size());
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(st.match_data);
    *match_begin = ov[0];
    *match_end = ov[1];
    return true;
}

Status regex_limit_text_error(const RegexLimitExceeded& e) {
    return invalid_argument_error("{}; split or shorten the text", e.what());
}

size_t Regex::next_char_len(std::string_view text, size_t i) {
    return static_cast<size_t>(utf8::char_len(static_cast<uint8_t>(text[i])));
}

}  // namespace lathe
