// Lexer and parser of the jinja engine: the token rules and grammar of jinja2 3.1's lexer.py and
// parser.py, in the configuration transformers uses (trim_blocks, lstrip_blocks,
// keep_trailing_newline=False, newline_sequence "\n").

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "tokenizer/jinja_internal.h"

namespace lathe::jinja {
namespace {

[[noreturn]] void fail_at(int line, std::string message) {
    throw Error{std::move(message), line};
}

// --- lexer -----------------------------------------------------------------------------------

enum class Tok {
    kData,
    kVarBegin,
    kVarEnd,
    kBlockBegin,
    kBlockEnd,
    kName,
    kString,
    kInteger,
    kFloat,
    kOp,
    kEof,
};

struct Token {
    Tok type;
    std::string value;  // data text, name, decoded string, operator, number text
    int line;
    Value number;  // kInteger / kFloat
};

std::string describe(const Token& t) {
    switch (t.type) {
        case Tok::kData:
            return "template data";
        case Tok::kVarBegin:
            return "begin of print statement";
        case Tok::kVarEnd:
            return "end of print statement";
        case Tok::kBlockBegin:
            return "begin of statement block";
        case Tok::kBlockEnd:
            return "end of statement block";
        case Tok::kEof:
            return "end of template";
        case Tok::kString:
            return "string";
        case Tok::kInteger:
        case Tok::kFloat:
            return "number " + t.value;
        default:
            return "'" + t.value + "'";
    }
}

// The code point starting at s[i] and its byte length (input is valid UTF-8).
char32_t decode_at(std::string_view s, size_t i, size_t* len) {
    const auto b = static_cast<unsigned char>(s[i]);
    size_t n = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : 4;
    if (i + n > s.size()) n = s.size() - i;
    char32_t c = n == 1 ? b : n == 2 ? (b & 0x1f) : n == 3 ? (b & 0x0f) : (b & 0x07);
    for (size_t k = 1; k < n; ++k) c = (c << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3f);
    *len = n;
    return c;
}

// Skips Python-regex `\s*` (Unicode whitespace) from i.
size_t skip_space(std::string_view s, size_t i) {
    while (i < s.size()) {
        size_t n;
        if (!py_isspace(decode_at(s, i, &n))) break;
        i += n;
    }
    return i;
}

// Python str.rstrip() (Unicode whitespace).
std::string_view rstrip_space(std::string_view s) {
    size_t end = s.size();
    while (end > 0) {
        size_t start = end - 1;
        while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xc0) == 0x80) --start;
        size_t n;
        if (!py_isspace(decode_at(s, start, &n))) break;
        end = start;
    }
    return s.substr(0, end);
}

bool all_space(std::string_view s) {
    for (size_t i = 0; i < s.size();) {
        size_t n;
        if (!py_isspace(decode_at(s, i, &n))) return false;
        i += n;
    }
    return true;
}

bool is_name_start(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
bool is_name_char(char c) {
    return is_name_start(c) || (c >= '0' && c <= '9');
}
bool is_digit(char c) {
    return c >= '0' && c <= '9';
}

class Lexer {
public:
    explicit Lexer(std::string_view raw) {
        // jinja2 splits on \r\n, \r and \n, drops one trailing newline (keep_trailing_newline is
        // False) and joins with "\n".
        std::string s;
        s.reserve(raw.size());
        for (size_t i = 0; i < raw.size(); ++i) {
            if (raw[i] == '\r') {
                s += '\n';
                if (i + 1 < raw.size() && raw[i + 1] == '\n') ++i;
            } else {
                s += raw[i];
            }
        }
        if (!s.empty() && s.back() == '\n') s.pop_back();
        src_ = std::move(s);
    }

    std::vector<Token> run() {
        const std::string_view s = src_;
        while (pos_ < s.size()) {
            size_t i = find_tag(pos_);
            if (i == std::string::npos) {
                emit_data(s.substr(pos_));
                pos_ = s.size();
                break;
            }
            const char kind = s[i + 1];
            size_t after = i + 2;
            char sign = 0;
            if (after < s.size() && (s[after] == '-' || s[after] == '+')) sign = s[after++];
            std::string_view text = s.substr(pos_, i - pos_);
            const int text_newlines = int(std::count(text.begin(), text.end(), '\n'));
            // A raw block: {% raw %} ... {% endraw %}, emitted as data.
            if (kind == '%') {
                size_t r = skip_space(s, after);
                if (s.compare(r, 3, "raw") == 0 && (r + 3 >= s.size() || !is_name_char(s[r + 3]))) {
                    text = strip_before_tag(text, sign, kind);
                    emit_data(text);
                    line_ += text_newlines;
                    lex_raw(r + 3);
                    continue;
                }
            }
            text = strip_before_tag(text, sign, kind);
            emit_data(text);
            line_ += text_newlines;
            pos_ = after;
            if (kind == '#') {
                lex_comment();
            } else {
                lex_tag(kind == '{');
            }
        }
        tokens_.push_back(Token{Tok::kEof, "", line_, {}});
        return std::move(tokens_);
    }

private:
    size_t find_tag(size_t from) const {
        for (size_t i = src_.find('{', from); i != std::string::npos; i = src_.find('{', i + 1)) {
            if (i + 1 < src_.size() &&
                (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#'))
                return i;
        }
        return std::string::npos;
    }

    // jinja2's handling of the text before a tag: '-' strips all whitespace before it;
    // lstrip_blocks removes spaces and tabs between a line start and a block or comment tag.
    std::string_view strip_before_tag(std::string_view text, char sign, char kind) const {
        if (sign == '-') return rstrip_space(text);
        if (sign == '+' || kind == '{') return text;
        const size_t nl = text.rfind('\n');
        const size_t l_pos = nl == std::string_view::npos ? 0 : nl + 1;
        if ((l_pos > 0 || line_starting_) && l_pos < text.size() && all_space(text.substr(l_pos)))
            return text.substr(0, l_pos);
        return text;
    }

    void emit_data(std::string_view text) {
        if (!text.empty()) tokens_.push_back(Token{Tok::kData, std::string(text), line_, {}});
    }

    void count_lines(size_t from, size_t to) {
        line_ += int(std::count(src_.begin() + long(from), src_.begin() + long(to), '\n'));
    }

    // After a block/comment end marker: "-" strips following whitespace, a plain end removes one
    // newline (trim_blocks), "+" keeps everything.
    size_t after_block_end(size_t end, char sign) {
        if (sign == '-') return skip_space(src_, end);
        if (sign == '+') return end;
        if (end < src_.size() && src_[end] == '\n') return end + 1;
        return end;
    }

    void lex_comment() {
        const int start_line = line_;
        for (size_t k = pos_; k + 1 < src_.size(); ++k) {
            char sign = 0;
            size_t mark = k;
            if ((src_[k] == '-' || src_[k] == '+') && src_.compare(k + 1, 2, "#}") == 0) {
                sign = src_[k];
                mark = k + 1;
            } else if (src_.compare(k, 2, "#}") != 0) {
                continue;
            }
            const size_t end = after_block_end(mark + 2, sign);
            count_lines(pos_, end);
            line_starting_ = end > 0 && src_[end - 1] == '\n';
            pos_ = end;
            return;
        }
        fail_at(start_line, "missing end of comment tag '#}'");
    }

    void lex_raw(size_t r) {
        // {% raw %} header: optional '-' before the end, then the body up to {% endraw %}.
        const int start_line = line_;
        size_t p = skip_space(src_, r);
        char sign = 0;
        if (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) sign = src_[p++];
        if (src_.compare(p, 2, "%}") != 0) fail_at(line_, "expected '%}' after 'raw'");
        size_t body = sign == '-' ? skip_space(src_, p + 2) : p + 2;
        count_lines(pos_, body);
        for (size_t i = src_.find("{%", body); i != std::string::npos; i = src_.find("{%", i + 1)) {
            size_t q = i + 2;
            char esign = 0;
            if (q < src_.size() && (src_[q] == '-' || src_[q] == '+')) esign = src_[q++];
            q = skip_space(src_, q);
            if (src_.compare(q, 6, "endraw") != 0) continue;
            q = skip_space(src_, q + 6);
            char csign = 0;
            if (q < src_.size() && (src_[q] == '-' || src_[q] == '+')) csign = src_[q++];
            if (src_.compare(q, 2, "%}") != 0) continue;
            std::string_view text = std::string_view(src_).substr(body, i - body);
            const int nl = int(std::count(text.begin(), text.end(), '\n'));
            emit_data(strip_before_tag(text, esign, '%'));
            line_ += nl;
            const size_t end = after_block_end(q + 2, csign);
            count_lines(i, end);
            line_starting_ = end > 0 && src_[end - 1] == '\n';
            pos_ = end;
            return;
        }
        fail_at(start_line, "missing '{% endraw %}' for the raw block");
    }

    void lex_tag(bool variable) {
        const int start_line = line_;
        tokens_.push_back(Token{variable ? Tok::kVarBegin : Tok::kBlockBegin, "", line_, {}});
        std::vector<char> balance;
        const std::string_view s = src_;
        while (true) {
            if (pos_ >= s.size())
                fail_at(start_line,
                        std::string("unexpected end of template: the tag opened here has no ") +
                            (variable ? "'}}'" : "'%}'"));
            if (balance.empty()) {
                if (variable) {
                    if (s.compare(pos_, 3, "-}}") == 0) {
                        close_tag(Tok::kVarEnd, skip_space(s, pos_ + 3));
                        return;
                    }
                    if (s.compare(pos_, 2, "}}") == 0) {
                        close_tag(Tok::kVarEnd, pos_ + 2);
                        return;
                    }
                } else {
                    if ((s[pos_] == '-' || s[pos_] == '+') && s.compare(pos_ + 1, 2, "%}") == 0) {
                        close_tag(Tok::kBlockEnd, after_block_end(pos_ + 3, s[pos_]));
                        return;
                    }
                    if (s.compare(pos_, 2, "%}") == 0) {
                        close_tag(Tok::kBlockEnd, after_block_end(pos_ + 2, 0));
                        return;
                    }
                }
            }
            size_t n;
            if (py_isspace(decode_at(s, pos_, &n))) {
                const size_t e = skip_space(s, pos_);
                count_lines(pos_, e);
                pos_ = e;
                continue;
            }
            const char c = s[pos_];
            if (is_digit(c)) {
                lex_number();
                continue;
            }
            if (is_name_start(c)) {
                size_t e = pos_;
                while (e < s.size() && is_name_char(s[e])) ++e;
                tokens_.push_back(
                    Token{Tok::kName, std::string(s.substr(pos_, e - pos_)), line_, {}});
                pos_ = e;
                continue;
            }
            if (c == '\'' || c == '"') {
                lex_string(c);
                continue;
            }
            static const char* const kOps[] = {"//", "**", "==", "!=", ">=", "<=", "+", "-", "/",
                                               "*",  "%",  "~",  "[",  "]",  "(",  ")", "{", "}",
                                               ">",  "<",  "=",  ".",  ":",  "|",  ",", ";"};
            bool matched = false;
            for (const char* op : kOps) {
                const size_t len = std::strlen(op);
                if (s.compare(pos_, len, op) != 0) continue;
                const std::string o(op);
                if (o == "(" || o == "[" || o == "{") {
                    balance.push_back(o == "(" ? ')' : o == "[" ? ']' : '}');
                } else if (o == ")" || o == "]" || o == "}") {
                    if (balance.empty()) fail_at(line_, "unexpected '" + o + "'");
                    if (balance.back() != o[0])
                        fail_at(line_, "unexpected '" + o + "', expected '" +
                                           std::string(1, balance.back()) + "'");
                    balance.pop_back();
                }
                tokens_.push_back(Token{Tok::kOp, o, line_, {}});
                pos_ += len;
                matched = true;
                break;
            }
            if (!matched)
                fail_at(line_, "unexpected character '" + std::string(s.substr(pos_, n)) + "'");
        }
    }

    void close_tag(Tok type, size_t end) {
        tokens_.push_back(Token{type, "", line_, {}});
        count_lines(pos_, end);
        line_starting_ = end > 0 && src_[end - 1] == '\n';
        pos_ = end;
    }

    void lex_number() {
        const std::string_view s = src_;
        size_t e = pos_;
        auto digits = [&](size_t& p, auto pred) {
            // digits possibly separated by single underscores
            const size_t start = p;
            while (p < s.size() &&
                   (pred(s[p]) || (s[p] == '_' && p + 1 < s.size() && pred(s[p + 1]) && p > start)))
                ++p;
            return p > start;
        };
        auto dec = [](char ch) { return ch >= '0' && ch <= '9'; };
        // Prefixed integers: 0b, 0o, 0x.
        if (s[e] == '0' && e + 1 < s.size() && std::strchr("bBoOxX", s[e + 1])) {
            const char p = char(s[e + 1] | 0x20);
            size_t q = e + 2;
            if (q < s.size() && s[q] == '_') ++q;
            auto pred = [p](char ch) {
                if (p == 'b') return ch == '0' || ch == '1';
                if (p == 'o') return ch >= '0' && ch <= '7';
                return (ch >= '0' && ch <= '9') || ((ch | 0x20) >= 'a' && (ch | 0x20) <= 'f');
            };
            if (digits(q, pred)) {
                std::string text;
                for (size_t k = e + 2; k < q; ++k)
                    if (s[k] != '_') text += s[k];
                const int base = p == 'b' ? 2 : p == 'o' ? 8 : 16;
                push_int(std::string(s.substr(e, q - e)), text, base);
                pos_ = q;
                return;
            }
        }
        digits(e, dec);
        size_t f = e;
        bool is_float = false;
        if (f + 1 < s.size() && s[f] == '.' && dec(s[f + 1])) {
            ++f;
            digits(f, dec);
            is_float = true;
        }
        if (f < s.size() && (s[f] == 'e' || s[f] == 'E')) {
            size_t g = f + 1;
            if (g < s.size() && (s[g] == '+' || s[g] == '-')) ++g;
            if (g < s.size() && dec(s[g])) {
                digits(g, dec);
                f = g;
                is_float = true;
            }
        }
        std::string text;
        for (size_t k = pos_; k < (is_float ? f : e); ++k)
            if (s[k] != '_') text += s[k];
        if (is_float) {
            // strtod, as Python's float(): inf past the largest double, the nearest subnormal or 0
            // below the smallest.
            tokens_.push_back(Token{Tok::kFloat, text, line_,
                                    Value::floating(std::strtod(text.c_str(), nullptr))});
            pos_ = f;
        } else {
            push_int(text, text, 10);
            pos_ = e;
        }
    }

    void push_int(const std::string& shown, const std::string& digits, int base) {
        errno = 0;
        char* end = nullptr;
        const unsigned long long v = std::strtoull(digits.c_str(), &end, base);
        if (errno != 0 || v > uint64_t(INT64_MAX))
            fail_at(line_, "integer literal " + shown + " does not fit in 64 bits");
        tokens_.push_back(Token{Tok::kInteger, shown, line_, Value::integer(int64_t(v))});
    }

    // A string literal, decoded as jinja2 does (Python's unicode-escape codec).
    void lex_string(char quote) {
        const std::string_view s = src_;
        const int start_line = line_;
        size_t p = pos_ + 1;
        std::string out;
        while (true) {
            if (p >= s.size()) fail_at(start_line, "unterminated string literal");
            const char c = s[p];
            if (c == quote) break;
            if (c == '\n') ++line_;
            if (c != '\\') {
                out += c;
                ++p;
                continue;
            }
            if (p + 1 >= s.size()) fail_at(start_line, "unterminated string literal");
            const char e = s[p + 1];
            p += 2;
            auto hex = [&](int count) {
                uint32_t v = 0;
                for (int k = 0; k < count; ++k) {
                    if (p >= s.size() || !std::isxdigit(static_cast<unsigned char>(s[p])))
                        fail_at(line_,
                                "truncated \\" + std::string(1, e) + " escape in a string literal");
                    const char h = s[p++];
                    v = v * 16 + uint32_t(is_digit(h) ? h - '0' : (h | 0x20) - 'a' + 10);
                }
                return v;
            };
            switch (e) {
                case '\n':
                    ++line_;
                    break;  // line continuation
                case '\\':
                    out += '\\';
                    break;
                case '\'':
                    out += '\'';
                    break;
                case '"':
                    out += '"';
                    break;
                case 'a':
                    out += '\a';
                    break;
                case 'b':
                    out += '\b';
                    break;
                case 'f':
                    out += '\f';
                    break;
                case 'n':
                    out += '\n';
                    break;
                case 'r':
                    out += '\r';
                    break;
                case 't':
                    out += '\t';
                    break;
                case 'v':
                    out += '\v';
                    break;
                case 'x':
                    utf8_append(out, hex(2));
                    break;
                case 'u':
                    utf8_append(out, hex(4));
                    break;
                case 'U': {
                    const uint32_t v = hex(8);
                    if (v > 0x10ffff)
                        fail_at(line_, "illegal Unicode character in a string literal");
                    utf8_append(out, v);
                    break;
                }
                case 'N':
                    fail_at(line_, "\\N{...} escapes are not supported in string literals");
                default:
                    if (e >= '0' && e <= '7') {
                        uint32_t v = uint32_t(e - '0');
                        for (int k = 0; k < 2 && p < s.size() && s[p] >= '0' && s[p] <= '7'; ++k)
                            v = v * 8 + uint32_t(s[p++] - '0');
                        utf8_append(out, v);
                    } else {
                        // Python keeps unknown escapes as they are.
                        out += '\\';
                        out += e;
                    }
            }
        }
        tokens_.push_back(Token{Tok::kString, std::move(out), start_line, {}});
        pos_ = p + 1;
    }

    std::string src_;
    size_t pos_ = 0;
    int line_ = 1;
    bool line_starting_ = true;
    std::vector<Token> tokens_;
};

// --- parser ----------------------------------------------------------------------------------

class Parser {
public:
    explicit Parser(std::vector<Token> tokens) : toks_(std::move(tokens)) {}

    Body parse() {
        Body body = subparse({});
        return body;
    }

private:
    const Token& cur() const { return toks_[i_]; }
    const Token& look() const { return toks_[std::min(i_ + 1, toks_.size() - 1)]; }
    const Token& next() {
        const Token& t = toks_[i_];
        if (i_ + 1 < toks_.size()) ++i_;
        return t;
    }
    bool is_name(const Token& t, const char* name) const {
        return t.type == Tok::kName && t.value == name;
    }
    bool is_op(const Token& t, const char* op) const { return t.type == Tok::kOp && t.value == op; }
    bool skip_name(const char* name) {
        if (!is_name(cur(), name)) return false;
        next();
        return true;
    }
    bool skip_op(const char* op) {
        if (!is_op(cur(), op)) return false;
        next();
        return true;
    }
    [[noreturn]] void fail(const std::string& msg) const { fail_at(cur().line, msg); }
    void expect_op(const char* op) {
        if (!skip_op(op)) fail(std::string("expected '") + op + "', got " + describe(cur()));
    }
    const Token& expect(Tok type, const char* what) {
        if (cur().type != type) fail(std::string("expected ") + what + ", got " + describe(cur()));
        return next();
    }
    std::string expect_name() { return expect(Tok::kName, "a name").value; }
    void expect_name(const char* name) {
        if (!skip_name(name)) fail(std::string("expected '") + name + "', got " + describe(cur()));
    }
    void expect_block_end() { expect(Tok::kBlockEnd, "'%}' (end of statement block)"); }

    static ExprPtr make(ExprKind kind, int line) {
        auto e = std::make_unique<Expr>();
        e->kind = kind;
        e->line = line;
        return e;
    }
    static StmtPtr make_stmt(StmtKind kind, int line) {
        auto s = std::make_unique<Stmt>();
        s->kind = kind;
        s->line = line;
        return s;
    }

    // --- statements ---

    // Parses until one of `end_tags` starts a block (left as the current token) or the end.
    Body subparse(const std::vector<const char*>& end_tags) {
        Nest nest(this);
        Body body;
        while (true) {
            const Token& t = cur();
            if (t.type == Tok::kEof) {
                if (!end_tags.empty()) fail_eof(end_tags);
                return body;
            }
            if (t.type == Tok::kData) {
                auto s = make_stmt(StmtKind::kText, t.line);
                s->text = t.value;
                next();
                body.push_back(std::move(s));
            } else if (t.type == Tok::kVarBegin) {
                next();
                auto s = make_stmt(StmtKind::kPrint, t.line);
                s->expr = parse_tuple(false, true, {}, false);
                expect(Tok::kVarEnd, "'}}' (end of print statement)");
                body.push_back(std::move(s));
            } else if (t.type == Tok::kBlockBegin) {
                next();
                for (const char* tag : end_tags)
                    if (is_name(cur(), tag)) return body;
                parse_statement(body);
                expect_block_end();
            } else {
                fail("unexpected " + describe(t));
            }
        }
    }

    [[noreturn]] void fail_eof(const std::vector<const char*>& end_tags) const {
        std::string msg = "unexpected end of template; expected ";
        for (size_t k = 0; k < end_tags.size(); ++k) {
            if (k) msg += k + 1 == end_tags.size() ? " or " : ", ";
            msg += std::string("'{% ") + end_tags[k] + " %}'";
        }
        if (!open_.empty())
            msg += " to close the '" + open_.back().first + "' block opened on line " +
                   std::to_string(open_.back().second);
        fail_at(cur().line, msg);
    }

    // Body of a block statement: expects the tag's '%}' then parses up to an end tag.
    Body parse_statements(const std::vector<const char*>& end_tags, bool drop_needle) {
        skip_op(":");
        expect_block_end();
        Body body = subparse(end_tags);
        if (drop_needle) next();
        return body;
    }

    struct OpenBlock {
        Parser* p;
        OpenBlock(Parser* parser, const std::string& tag, int line) : p(parser) {
            p->open_.emplace_back(tag, line);
        }
        ~OpenBlock() { p->open_.pop_back(); }
    };

    void parse_statement(Body& out) {
        const Token& t = cur();
        if (t.type != Tok::kName) fail("expected a tag name, got " + describe(t));
        const std::string tag = t.value;
        const int line = t.line;
        if (tag == "for") return out.push_back(parse_for());
        if (tag == "if") return out.push_back(parse_if());
        if (tag == "set") return out.push_back(parse_set());
        if (tag == "macro") return out.push_back(parse_macro());
        if (tag == "filter") return out.push_back(parse_filter_block());
        if (tag == "with") return out.push_back(parse_with());
        if (tag == "call") return out.push_back(parse_call_block());
        if (tag == "print") {
            next();
            auto s = make_stmt(StmtKind::kPrint, line);
            List dummy;
            std::vector<ExprPtr> items;
            while (cur().type != Tok::kBlockEnd) {
                if (!items.empty()) expect_op(",");
                items.push_back(parse_expression(true));
            }
            if (items.size() == 1) {
                s->expr = std::move(items[0]);
            } else {
                auto tup = make(ExprKind::kTuple, line);
                tup->args = std::move(items);
                s->expr = std::move(tup);
            }
            return out.push_back(std::move(s));
        }
        if (tag == "break" || tag == "continue") {
            next();
            if (loop_depth_ == 0) fail_at(line, "'" + tag + "' outside of a for loop");
            return out.push_back(
                make_stmt(tag == "break" ? StmtKind::kBreak : StmtKind::kContinue, line));
        }
        if (tag == "generation") {
            next();
            OpenBlock ob(this, tag, line);
            auto s = make_stmt(StmtKind::kGeneration, line);
            s->body = parse_statements({"endgeneration"}, true);
            return out.push_back(std::move(s));
        }
        static const char* const kUnsupported[] = {"block", "extends",    "include", "import",
                                                   "from",  "autoescape", "do"};
        for (const char* u : kUnsupported)
            if (tag == u) fail("the '" + tag + "' tag is not supported in chat templates");
        std::string msg = "unknown tag '" + tag + "'";
        if (!open_.empty())
            msg += " (the innermost open block is '" + open_.back().first + "' from line " +
                   std::to_string(open_.back().second) + ")";
        fail(msg);
    }

    // Assignment targets: names (or ns.attr when allowed), comma-separated.
    void parse_targets(Stmt& s, bool with_namespace, const char* end_name, std::string* ns_attr) {
        bool first = true;
        while (true) {
            if (!first) {
                if (!skip_op(",")) break;
                s.target_tuple = true;
                if (cur().type == Tok::kBlockEnd || is_op(cur(), "=") ||
                    (end_name && is_name(cur(), end_name)))
                    break;
            }
            first = false;
            const std::string name = expect_name();
            if (name == "true" || name == "false" || name == "none" || name == "True" ||
                name == "False" || name == "None")
                fail("can't assign to the constant '" + name + "'");
            if (with_namespace && ns_attr && is_op(cur(), ".")) {
                next();
                *ns_attr = expect_name();
                s.targets.push_back(name);
                if (is_op(cur(), ",")) fail("can't assign to a namespace attribute inside a tuple");
                return;
            }
            s.targets.push_back(name);
        }
    }

    StmtPtr parse_for() {
        const int line = next().line;
        OpenBlock ob(this, "for", line);
        auto s = make_stmt(StmtKind::kFor, line);
        parse_targets(*s, false, "in", nullptr);
        expect_name("in");
        s->expr = parse_tuple(false, false, {"recursive"}, false);
        if (skip_name("if")) s->cond = parse_expression(true);
        if (is_name(cur(), "recursive")) fail("recursive for loops are not supported");
        ++loop_depth_;
        s->body = parse_statements({"endfor", "else"}, false);
        --loop_depth_;
        if (next().value == "else") s->else_body = parse_statements({"endfor"}, true);
        return s;
    }

    StmtPtr parse_if() {
        const int line = next().line;
        OpenBlock ob(this, "if", line);
        auto s = make_stmt(StmtKind::kIf, line);
        ++soft_;
        while (true) {
            ExprPtr test = parse_tuple(false, false, {}, false);
            Body body = parse_statements({"elif", "else", "endif"}, false);
            s->branches.emplace_back(std::move(test), std::move(body));
            const Token& t = next();
            if (t.value == "elif") continue;
            if (t.value == "else") s->else_body = parse_statements({"endif"}, true);
            break;
        }
        --soft_;
        return s;
    }

    StmtPtr parse_set() {
        const int line = next().line;
        auto s = make_stmt(StmtKind::kSet, line);
        std::string attr;
        parse_targets(*s, true, nullptr, &attr);
        if (skip_op("=")) {
            s->expr = parse_tuple(false, true, {}, false);
            if (!attr.empty()) {
                s->kind = StmtKind::kSetAttr;
                s->text = attr;
            }
            return s;
        }
        if (!attr.empty() || s->targets.size() != 1) fail("a block set needs one variable name");
        OpenBlock ob(this, "set", line);
        s->kind = StmtKind::kSetBlock;
        while (is_op(cur(), "|")) {
            next();
            s->filters.push_back(parse_filter_call(nullptr));
        }
        s->body = parse_statements({"endset"}, true);
        return s;
    }

    StmtPtr parse_macro() {
        const int line = next().line;
        OpenBlock ob(this, "macro", line);
        auto s = make_stmt(StmtKind::kMacro, line);
        s->text = expect_name();
        parse_signature(*s);
        const int saved_loop = loop_depth_;
        loop_depth_ = 0;
        s->body = parse_statements({"endmacro"}, true);
        loop_depth_ = saved_loop;
        find_special_names(*s);
        return s;
    }

    StmtPtr parse_call_block() {
        const int line = next().line;
        OpenBlock ob(this, "call", line);
        auto s = make_stmt(StmtKind::kCallBlock, line);
        if (is_op(cur(), "(")) parse_signature(*s);
        s->expr = parse_expression(true);
        if (s->expr->kind != ExprKind::kCall) fail_at(line, "expected a macro call after 'call'");
        const int saved_loop = loop_depth_;
        loop_depth_ = 0;
        s->body = parse_statements({"endcall"}, true);
        loop_depth_ = saved_loop;
        find_special_names(*s);
        return s;
    }

    // jinja2 lets a macro take a caller, extra positional and extra keyword arguments only when
    // its body mentions `caller`, `varargs`, `kwargs`.
    static void scan_names(const Expr* e, Stmt& s) {
        if (!e) return;
        if (e->kind == ExprKind::kName) {
            if (e->name == "caller") s.catch_caller = true;
            if (e->name == "varargs") s.catch_varargs = true;
            if (e->name == "kwargs") s.catch_kwargs = true;
        }
        for (const Expr* x : {e->a.get(), e->b.get(), e->c.get(), e->d.get()}) scan_names(x, s);
        for (const ExprPtr& x : e->args) scan_names(x.get(), s);
        for (const auto& kv : e->kwargs) scan_names(kv.second.get(), s);
    }
    static void scan_body(const Body& body, Stmt& s) {
        for (const StmtPtr& st : body) {
            scan_names(st->expr.get(), s);
            scan_names(st->cond.get(), s);
            for (const auto& [c, b] : st->branches) {
                scan_names(c.get(), s);
                scan_body(b, s);
            }
            for (const ExprPtr& v : st->values) scan_names(v.get(), s);
            for (const ExprPtr& f : st->filters) scan_names(f.get(), s);
            scan_body(st->body, s);
            scan_body(st->else_body, s);
        }
    }
    static void find_special_names(Stmt& s) { scan_body(s.body, s); }

    void parse_signature(Stmt& s) {
        expect_op("(");
        bool seen_default = false;
        while (!is_op(cur(), ")")) {
            if (!s.targets.empty()) expect_op(",");
            if (is_op(cur(), ")")) break;
            s.targets.push_back(expect_name());
            if (skip_op("=")) {
                s.values.push_back(parse_expression(true));
                seen_default = true;
            } else {
                if (seen_default) fail("non-default argument follows default argument");
                s.values.push_back(nullptr);
            }
        }
        expect_op(")");
    }

    StmtPtr parse_filter_block() {
        const int line = next().line;
        OpenBlock ob(this, "filter", line);
        auto s = make_stmt(StmtKind::kFilterBlock, line);
        s->filters.push_back(parse_filter_call(nullptr));
        while (is_op(cur(), "|")) {
            next();
            s->filters.push_back(parse_filter_call(nullptr));
        }
        s->body = parse_statements({"endfilter"}, true);
        return s;
    }

    StmtPtr parse_with() {
        const int line = next().line;
        OpenBlock ob(this, "with", line);
        auto s = make_stmt(StmtKind::kWith, line);
        while (cur().type != Tok::kBlockEnd) {
            if (!s->targets.empty()) expect_op(",");
            s->targets.push_back(expect_name());
            expect_op("=");
            s->values.push_back(parse_expression(true));
        }
        s->body = parse_statements({"endwith"}, true);
        return s;
    }

    // --- expressions (jinja2 precedence) ---

    bool is_tuple_end(const std::vector<const char*>& extra_end) const {
        const Token& t = cur();
        if (t.type == Tok::kVarEnd || t.type == Tok::kBlockEnd || is_op(t, ")")) return true;
        for (const char* e : extra_end)
            if (is_name(t, e)) return true;
        return false;
    }

    ExprPtr parse_tuple(bool simplified, bool with_condexpr,
                        const std::vector<const char*>& extra_end, bool explicit_parens) {
        const int line = cur().line;
        std::vector<ExprPtr> items;
        bool is_tuple = false;
        while (true) {
            if (!items.empty()) expect_op(",");
            if (is_tuple_end(extra_end)) break;
            items.push_back(simplified ? parse_primary() : parse_expression(with_condexpr));
            if (is_op(cur(), ",")) {
                is_tuple = true;
            } else {
                break;
            }
        }
        if (!is_tuple) {
            if (!items.empty()) return std::move(items[0]);
            if (!explicit_parens) fail("expected an expression, got " + describe(cur()));
        }
        auto t = make(ExprKind::kTuple, line);
        t->args = std::move(items);
        return t;
    }

    ExprPtr parse_expression(bool with_condexpr) {
        Nest nest(this);
        return with_condexpr ? parse_condexpr() : parse_or();
    }

    ExprPtr parse_condexpr() {
        ExprPtr expr1 = parse_or();
        while (is_name(cur(), "if")) {
            const int line = next().line;
            ++soft_;
            auto node = make(ExprKind::kCond, line);
            node->a = parse_or();
            node->b = std::move(expr1);
            if (skip_name("else")) node->c = parse_condexpr();
            --soft_;
            expr1 = std::move(node);
        }
        return expr1;
    }

    ExprPtr parse_or() {
        ExprPtr left = parse_and();
        while (is_name(cur(), "or")) {
            auto node = make(ExprKind::kOr, next().line);
            node->a = std::move(left);
            node->b = parse_and();
            left = std::move(node);
        }
        return left;
    }

    ExprPtr parse_and() {
        ExprPtr left = parse_not();
        while (is_name(cur(), "and")) {
            auto node = make(ExprKind::kAnd, next().line);
            node->a = std::move(left);
            node->b = parse_not();
            left = std::move(node);
        }
        return left;
    }

    ExprPtr parse_not() {
        Nest nest(this);
        if (is_name(cur(), "not")) {
            auto node = make(ExprKind::kNot, next().line);
            node->a = parse_not();
            return node;
        }
        return parse_compare();
    }

    ExprPtr parse_compare() {
        const int line = cur().line;
        ExprPtr expr = parse_math1();
        std::vector<ExprPtr> operands;
        std::vector<CmpOp> ops;
        while (true) {
            const Token& t = cur();
            CmpOp op;
            if (is_op(t, "=="))
                op = CmpOp::kEq;
            else if (is_op(t, "!="))
                op = CmpOp::kNe;
            else if (is_op(t, "<"))
                op = CmpOp::kLt;
            else if (is_op(t, "<="))
                op = CmpOp::kLe;
            else if (is_op(t, ">"))
                op = CmpOp::kGt;
            else if (is_op(t, ">="))
                op = CmpOp::kGe;
            else if (is_name(t, "in"))
                op = CmpOp::kIn;
            else if (is_name(t, "not") && is_name(look(), "in")) {
                next();
                op = CmpOp::kNotIn;
            } else {
                break;
            }
            next();
            ops.push_back(op);
            operands.push_back(parse_math1());
        }
        if (ops.empty()) return expr;
        auto node = make(ExprKind::kCompare, line);
        node->args.push_back(std::move(expr));
        for (auto& o : operands) node->args.push_back(std::move(o));
        node->cmp_ops = std::move(ops);
        return node;
    }

    ExprPtr binary(BinOp op, ExprPtr left, ExprPtr right, int line) {
        auto node = make(ExprKind::kBinary, line);
        node->bin_op = op;
        node->a = std::move(left);
        node->b = std::move(right);
        return node;
    }

    ExprPtr parse_math1() {
        ExprPtr left = parse_concat();
        while (is_op(cur(), "+") || is_op(cur(), "-")) {
            const BinOp op = cur().value == "+" ? BinOp::kAdd : BinOp::kSub;
            const int line = next().line;
            left = binary(op, std::move(left), parse_concat(), line);
        }
        return left;
    }

    ExprPtr parse_concat() {
        const int line = cur().line;
        std::vector<ExprPtr> args;
        args.push_back(parse_math2());
        while (is_op(cur(), "~")) {
            next();
            args.push_back(parse_math2());
        }
        if (args.size() == 1) return std::move(args[0]);
        auto node = make(ExprKind::kConcat, line);
        node->args = std::move(args);
        return node;
    }

    ExprPtr parse_math2() {
        ExprPtr left = parse_pow();
        while (true) {
            BinOp op;
            if (is_op(cur(), "*"))
                op = BinOp::kMul;
            else if (is_op(cur(), "/"))
                op = BinOp::kDiv;
            else if (is_op(cur(), "//"))
                op = BinOp::kFloorDiv;
            else if (is_op(cur(), "%"))
                op = BinOp::kMod;
            else
                break;
            const int line = next().line;
            left = binary(op, std::move(left), parse_pow(), line);
        }
        return left;
    }

    ExprPtr parse_pow() {
        ExprPtr left = parse_unary(true);
        while (is_op(cur(), "**")) {
            const int line = next().line;
            left = binary(BinOp::kPow, std::move(left), parse_unary(true), line);
        }
        return left;
    }

    ExprPtr parse_unary(bool with_filter) {
        Nest nest(this);
        ExprPtr node;
        if (is_op(cur(), "-") || is_op(cur(), "+")) {
            const bool neg = cur().value == "-";
            node = make(neg ? ExprKind::kNeg : ExprKind::kPos, next().line);
            node->a = parse_unary(false);
        } else {
            node = parse_primary();
        }
        node = parse_postfix(std::move(node));
        if (with_filter) node = parse_filter_expr(std::move(node));
        return node;
    }

    ExprPtr parse_primary() {
        const Token& t = cur();
        const int line = t.line;
        if (t.type == Tok::kName) {
            next();
            auto node = make(ExprKind::kConst, line);
            if (t.value == "true" || t.value == "True") {
                node->value = Value::boolean(true);
            } else if (t.value == "false" || t.value == "False") {
                node->value = Value::boolean(false);
            } else if (t.value == "none" || t.value == "None") {
                node->value = Value::none();
            } else {
                node->kind = ExprKind::kName;
                node->name = t.value;
            }
            return node;
        }
        if (t.type == Tok::kString) {
            std::string s;
            while (cur().type == Tok::kString) s += next().value;
            auto node = make(ExprKind::kConst, line);
            node->value = Value::string(std::move(s));
            return node;
        }
        if (t.type == Tok::kInteger || t.type == Tok::kFloat) {
            auto node = make(ExprKind::kConst, line);
            node->value = next().number;
            return node;
        }
        if (is_op(t, "(")) {
            next();
            ExprPtr node = parse_tuple(false, true, {}, true);
            expect_op(")");
            return node;
        }
        if (is_op(t, "[")) {
            next();
            auto node = make(ExprKind::kList, line);
            while (!is_op(cur(), "]")) {
                if (!node->args.empty()) expect_op(",");
                if (is_op(cur(), "]")) break;
                node->args.push_back(parse_expression(true));
            }
            expect_op("]");
            return node;
        }
        if (is_op(t, "{")) {
            next();
            auto node = make(ExprKind::kDict, line);
            while (!is_op(cur(), "}")) {
                if (!node->args.empty()) expect_op(",");
                if (is_op(cur(), "}")) break;
                node->args.push_back(parse_expression(true));
                expect_op(":");
                node->args.push_back(parse_expression(true));
            }
            expect_op("}");
            return node;
        }
        fail("unexpected " + describe(t) + " where an expression should start");
    }

    ExprPtr parse_postfix(ExprPtr node) {
        while (true) {
            if (is_op(cur(), ".") || is_op(cur(), "[")) {
                node = parse_subscript(std::move(node));
            } else if (is_op(cur(), "(")) {
                node = parse_call(std::move(node));
            } else {
                return node;
            }
        }
    }

    ExprPtr parse_filter_expr(ExprPtr node) {
        while (true) {
            if (is_op(cur(), "|")) {
                next();
                node = parse_filter_call(std::move(node));
            } else if (is_name(cur(), "is")) {
                node = parse_test(std::move(node));
            } else if (is_op(cur(), "(")) {
                node = parse_call(std::move(node));
            } else {
                return node;
            }
        }
    }

    ExprPtr parse_subscript(ExprPtr node) {
        const Token& t = next();
        const int line = t.line;
        if (t.value == ".") {
            const Token& attr = cur();
            if (attr.type == Tok::kName) {
                next();
                auto n = make(ExprKind::kGetattr, line);
                n->a = std::move(node);
                n->name = attr.value;
                return n;
            }
            if (attr.type != Tok::kInteger)
                fail("expected a name or number after '.', got " + describe(attr));
            auto key = make(ExprKind::kConst, attr.line);
            key->value = next().number;
            auto n = make(ExprKind::kGetitem, line);
            n->a = std::move(node);
            n->b = std::move(key);
            return n;
        }
        std::vector<ExprPtr> args;
        while (!is_op(cur(), "]")) {
            if (!args.empty()) expect_op(",");
            args.push_back(parse_subscribed());
        }
        expect_op("]");
        auto n = make(ExprKind::kGetitem, line);
        n->a = std::move(node);
        if (args.size() == 1) {
            n->b = std::move(args[0]);
        } else {
            auto tup = make(ExprKind::kTuple, line);
            tup->args = std::move(args);
            n->b = std::move(tup);
        }
        return n;
    }

    ExprPtr parse_subscribed() {
        const int line = cur().line;
        ExprPtr start;
        if (!is_op(cur(), ":")) {
            ExprPtr node = parse_expression(true);
            if (!is_op(cur(), ":")) return node;
            start = std::move(node);
        }
        next();  // ':'
        auto slice = make(ExprKind::kSlice, line);
        slice->a = std::move(start);
        if (!is_op(cur(), "]") && !is_op(cur(), ",") && !is_op(cur(), ":"))
            slice->b = parse_expression(true);
        if (skip_op(":")) {
            if (!is_op(cur(), "]") && !is_op(cur(), ",")) slice->c = parse_expression(true);
        }
        return slice;
    }

    void parse_call_args(Expr& node) {
        expect_op("(");
        bool require_comma = false;
        while (!is_op(cur(), ")")) {
            if (require_comma) {
                expect_op(",");
                if (is_op(cur(), ")")) break;
            }
            if (is_op(cur(), "*")) {
                if (node.c || node.d) fail("invalid syntax for function call expression");
                next();
                node.c = parse_expression(true);
            } else if (is_op(cur(), "**")) {
                if (node.d) fail("invalid syntax for function call expression");
                next();
                node.d = parse_expression(true);
            } else if (cur().type == Tok::kName && is_op(look(), "=")) {
                if (node.d) fail("invalid syntax for function call expression");
                std::string key = next().value;
                next();
                node.kwargs.emplace_back(std::move(key), parse_expression(true));
            } else {
                if (!node.kwargs.empty() || node.c || node.d)
                    fail("invalid syntax for function call expression");
                node.args.push_back(parse_expression(true));
            }
            require_comma = true;
        }
        expect_op(")");
    }

    ExprPtr parse_call(ExprPtr callee) {
        auto node = make(ExprKind::kCall, cur().line);
        node->a = std::move(callee);
        parse_call_args(*node);
        return node;
    }

    std::string dotted_name() {
        std::string name = expect_name();
        while (is_op(cur(), ".")) {
            next();
            name += "." + expect_name();
        }
        return name;
    }

    ExprPtr parse_filter_call(ExprPtr input) {
        const int line = cur().line;
        auto node = make(ExprKind::kFilter, line);
        node->name = dotted_name();
        node->a = std::move(input);
        node->filter = find_filter(node->name);
        if (!node->filter && soft_ == 0) fail_at(line, "no filter named '" + node->name + "'");
        if (is_op(cur(), "(")) parse_call_args(*node);
        return node;
    }

    ExprPtr parse_test(ExprPtr input) {
        const int line = next().line;  // 'is'
        const bool negated = skip_name("not");
        auto node = make(ExprKind::kTest, line);
        node->name = dotted_name();
        node->a = std::move(input);
        node->test = find_test(node->name);
        if (!node->test && soft_ == 0) fail_at(line, "no test named '" + node->name + "'");
        const Token& t = cur();
        if (is_op(t, "(")) {
            parse_call_args(*node);
        } else if ((t.type == Tok::kName || t.type == Tok::kString || t.type == Tok::kInteger ||
                    t.type == Tok::kFloat || is_op(t, "[") || is_op(t, "{")) &&
                   !is_name(t, "else") && !is_name(t, "or") && !is_name(t, "and")) {
            if (is_name(t, "is")) fail("tests cannot be chained with 'is'");
            node->args.push_back(parse_postfix(parse_primary()));
        }
        if (!negated) return node;
        auto n = make(ExprKind::kNot, line);
        n->a = std::move(node);
        return n;
    }

    // Nesting limit for expressions and blocks: the parser and the interpreter recurse once per
    // level, and a template (untrusted input) must not be able to exhaust the stack.
    static constexpr int kMaxNesting = 256;
    struct Nest {
        Parser* p;
        explicit Nest(Parser* parser) : p(parser) {
            if (++p->nesting_ > kMaxNesting)
                p->fail("expressions or blocks nested more than " + std::to_string(kMaxNesting) +
                        " deep");
        }
        ~Nest() { --p->nesting_; }
    };

    std::vector<Token> toks_;
    size_t i_ = 0;
    int nesting_ = 0;
    int soft_ = 0;        // inside if-blocks / inline ifs: unknown filters fail only when run
    int loop_depth_ = 0;  // break/continue are only valid inside loops
    std::vector<std::pair<std::string, int>> open_;
};

// --- scope analysis --------------------------------------------------------------------------
//
// jinja2 decides at compile time which scope each name belongs to (idtracking.py). Most of the
// time that agrees with looking names up through the enclosing scopes at run time, which is what
// the interpreter does. It differs when a scope's first use of a name is an unconditional
// assignment and no enclosing scope knows the name: jinja2 then starts the name as undefined in
// that scope, hiding a template variable of the same name from everything that reads it before
// the assignment (e.g. a nested loop). This pass finds those names per scope, replicating
// jinja2's Symbols bookkeeping, so the interpreter can bind them to undefined on entry.

class Symbols {
public:
    enum class Load { kParam, kResolve, kAlias, kUndefined };

    explicit Symbols(const Symbols* parent) : parent_(parent) {}

    bool find_ref(const std::string& name) const {
        for (const Symbols* s = this; s; s = s->parent_)
            if (s->refs_.count(name)) return true;
        return false;
    }
    void store(const std::string& name) {
        stores_.insert(name);
        if (refs_.count(name)) return;
        refs_[name] = (parent_ && parent_->find_ref(name)) ? Load::kAlias : Load::kUndefined;
    }
    void declare_param(const std::string& name) {
        stores_.insert(name);
        refs_[name] = Load::kParam;
    }
    void load(const std::string& name) {
        if (!find_ref(name)) refs_[name] = Load::kResolve;
    }
    void branch_update(const std::vector<Symbols>& branches) {
        std::set<std::string> stores;
        for (const Symbols& b : branches) stores.insert(b.stores_.begin(), b.stores_.end());
        for (const std::string& s : stores_) stores.erase(s);
        for (const Symbols& b : branches) {
            for (const auto& [k, v] : b.refs_) refs_[k] = v;
            stores_.insert(b.stores_.begin(), b.stores_.end());
        }
        for (const std::string& name : stores)
            refs_[name] = (parent_ && parent_->find_ref(name)) ? Load::kAlias : Load::kResolve;
    }
    std::vector<std::string> undefined_names() const {
        std::vector<std::string> out;
        for (const auto& [k, v] : refs_)
            if (v == Load::kUndefined) out.push_back(k);
        return out;
    }

private:
    const Symbols* parent_;
    std::map<std::string, Load> refs_;
    std::set<std::string> stores_;
};

void visit_expr(const Expr* e, Symbols& sym) {
    if (!e) return;
    if (e->kind == ExprKind::kName) sym.load(e->name);
    visit_expr(e->a.get(), sym);
    visit_expr(e->b.get(), sym);
    visit_expr(e->c.get(), sym);
    visit_expr(e->d.get(), sym);
    for (const ExprPtr& x : e->args) visit_expr(x.get(), sym);
    for (const auto& kv : e->kwargs) visit_expr(kv.second.get(), sym);
}

// Statements of one scope are analysed first; the scopes they open (loop bodies, macros, ...)
// afterwards, against the finished symbols of this scope, as jinja2 does when it compiles them.
void analyze_body(Body& body, Symbols& sym, std::vector<Stmt*>& children);

std::vector<std::string> analyze_scope(Body& body, const Symbols* parent,
                                       const std::vector<std::string>& params,
                                       const std::vector<ExprPtr>* param_defaults = nullptr);

void analyze_children(Stmt& s, const Symbols* parent) {
    switch (s.kind) {
        case StmtKind::kFor: {
            std::vector<std::string> params = s.targets;
            params.push_back("loop");
            s.scope_undefined = analyze_scope(s.body, parent, params);
            s.else_scope_undefined = analyze_scope(s.else_body, parent, {});
            return;
        }
        case StmtKind::kMacro:
        case StmtKind::kCallBlock: {
            std::vector<std::string> params = s.targets;
            if (s.catch_caller) params.push_back("caller");
            if (s.catch_varargs) params.push_back("varargs");
            if (s.catch_kwargs) params.push_back("kwargs");
            s.scope_undefined = analyze_scope(s.body, parent, params, &s.values);
            return;
        }
        case StmtKind::kWith:
            s.scope_undefined = analyze_scope(s.body, parent, s.targets);
            return;
        case StmtKind::kSetBlock:
        case StmtKind::kFilterBlock:
        case StmtKind::kGeneration:
            s.scope_undefined = analyze_scope(s.body, parent, {});
            return;
        default:
            return;
    }
}

std::vector<std::string> analyze_scope(Body& body, const Symbols* parent,
                                       const std::vector<std::string>& params,
                                       const std::vector<ExprPtr>* param_defaults) {
    Symbols sym(parent);
    for (const std::string& p : params) sym.declare_param(p);
    if (param_defaults)
        for (const ExprPtr& d : *param_defaults) visit_expr(d.get(), sym);
    std::vector<Stmt*> children;
    analyze_body(body, sym, children);
    for (Stmt* c : children) analyze_children(*c, &sym);
    return sym.undefined_names();
}

void analyze_stmt(Stmt& s, Symbols& sym, std::vector<Stmt*>& children) {
    switch (s.kind) {
        case StmtKind::kText:
        case StmtKind::kBreak:
        case StmtKind::kContinue:
            return;
        case StmtKind::kPrint:
            visit_expr(s.expr.get(), sym);
            return;
        case StmtKind::kIf: {
            // jinja2: the if's test in this scope; the body, the elif chain (each elif a nested
            // if) and the else each in a copy, merged by branch_update.
            visit_expr(s.branches[0].first.get(), sym);
            std::vector<Symbols> branches;
            branches.push_back(sym);
            analyze_body(s.branches[0].second, branches.back(), children);
            branches.push_back(sym);
            for (size_t i = 1; i < s.branches.size(); ++i) {
                Symbols& elif = branches.back();
                visit_expr(s.branches[i].first.get(), elif);
                std::vector<Symbols> inner;
                inner.push_back(elif);
                analyze_body(s.branches[i].second, inner.back(), children);
                inner.push_back(elif);
                inner.push_back(elif);
                elif.branch_update(inner);
            }
            branches.push_back(sym);
            analyze_body(s.else_body, branches.back(), children);
            sym.branch_update(branches);
            return;
        }
        case StmtKind::kFor:
            // The loop's inline `if` is its own scope and only reads names: nothing to record.
            visit_expr(s.expr.get(), sym);
            children.push_back(&s);
            return;
        case StmtKind::kSet:
            visit_expr(s.expr.get(), sym);
            for (const std::string& t : s.targets) sym.store(t);
            return;
        case StmtKind::kSetAttr:
            visit_expr(s.expr.get(), sym);
            sym.load(s.targets[0]);
            return;
        case StmtKind::kSetBlock:
            sym.store(s.targets[0]);
            for (const ExprPtr& f : s.filters) visit_expr(f.get(), sym);
            children.push_back(&s);
            return;
        case StmtKind::kMacro:
            sym.store(s.text);
            children.push_back(&s);
            return;
        case StmtKind::kFilterBlock:
            for (const ExprPtr& f : s.filters) visit_expr(f.get(), sym);
            children.push_back(&s);
            return;
        case StmtKind::kWith:
            for (const ExprPtr& v : s.values) visit_expr(v.get(), sym);
            children.push_back(&s);
            return;
        case StmtKind::kGeneration:
            children.push_back(&s);
            return;
        case StmtKind::kCallBlock:
            visit_expr(s.expr.get(), sym);
            children.push_back(&s);
            return;
    }
}

void analyze_body(Body& body, Symbols& sym, std::vector<Stmt*>& children) {
    for (StmtPtr& s : body) analyze_stmt(*s, sym, children);
}

}  // namespace

ParsedTemplate parse_template(std::string_view source) {
    Lexer lexer(source);
    Parser parser(lexer.run());
    ParsedTemplate t;
    t.body = parser.parse();
    t.root_undefined = analyze_scope(t.body, nullptr, {});
    return t;
}

}  // namespace lathe::jinja
