// Builtins of the jinja engine: jinja2 3.1's filters and tests, the globals transformers adds
// (raise_exception, strftime_now) and the sandbox's view of Python str/list/dict methods, each
// with the semantics of its Python original (code-point strings, Python rounding, generators).
//
// Filters: abs attr batch capitalize center count d default dictsort e escape first float
//   forceescape format indent int items join last length list lower map max min reject
//   rejectattr replace reverse round safe select selectattr sort string sum title tojson trim
//   truncate unique upper wordcount.
// Tests: boolean callable defined divisibleby eq equalto escaped even false filter float ge gt
//   greaterthan in integer iterable le lessthan lower lt mapping ne none number odd sameas
//   sequence string test true undefined upper, and == != < <= > >=.
// Globals: range namespace dict raise_exception strftime_now.

#include <utf8proc.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <map>
#include <string>

#include "tokenizer/jinja_internal.h"

namespace lathe::jinja {

// --- generators ------------------------------------------------------------------------------

std::vector<Value> Generator::take_all() {
    std::vector<Value> rest(items_.begin() + long(pos_), items_.end());
    pos_ = items_.size();
    return rest;
}

bool Generator::take_one(Value& out) {
    if (pos_ >= items_.size()) return false;
    out = items_[pos_++];
    return true;
}

Value make_generator(std::string type, std::vector<Value> items) {
    return Value::object(std::make_shared<Generator>(std::move(type), std::move(items)));
}

namespace {

Generator* as_generator(const Value& v) {
    return v.kind() == Kind::kObject ? dynamic_cast<Generator*>(v.as_object()) : nullptr;
}

// --- small helpers ---------------------------------------------------------------------------

const std::string& need_string(const Value& v, const char* what) {
    if (!v.is_string()) throw_error(std::string(what) + " must be a string, not " + v.type_name());
    return v.as_string();
}

int64_t need_int(const Value& v, const char* what) {
    if (v.kind() != Kind::kInt && v.kind() != Kind::kBool)
        throw_error(std::string(what) + " must be an integer, not " + v.type_name());
    return v.as_int();
}

bool arg_bool(const Args& a, size_t i, std::string_view name, bool dflt) {
    const Value* v = a.get(i, name);
    return v ? v->truthy() : dflt;
}

// soft_str(): what jinja2 filters turn their input into (undefined -> "").
std::string soft_str(const Value& v) {
    return v.str();
}

std::u32string u32(const Value& v) {
    return utf8_decode(soft_str(v));
}

// Code point index of a byte offset in valid UTF-8.
int64_t cp_index(std::string_view s, size_t byte_off) {
    return int64_t(utf8_length(s.substr(0, byte_off)));
}

bool is_alnum_cp(char32_t c) {
    const auto cat = utf8proc_category(int32_t(c));
    return (cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO) ||
           (cat >= UTF8PROC_CATEGORY_ND && cat <= UTF8PROC_CATEGORY_NO);
}

// Follows a dotted attribute path ("function.name", "0") as jinja2's make_attrgetter does.
Value attr_path(const Value& item, const std::string& path) {
    Value cur = item;
    size_t start = 0;
    while (true) {
        const size_t dot = path.find('.', start);
        const std::string part =
            path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
        Value key;
        bool beyond_int64 = false;
        if (!part.empty() &&
            std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; })) {
            int64_t k = 0;
            beyond_int64 =
                std::from_chars(part.data(), part.data() + part.size(), k).ec != std::errc();
            key = Value::integer(k);
        } else {
            key = Value::string(part);
        }
        if (cur.is_undefined()) cur.fail_undefined();
        // Python's int has no bound; an index past int64 names no element of anything.
        cur = beyond_int64 ? Value::undefined(std::string("'") + cur.type_name() +
                                              " object' has no element " + part)
                           : get_item(cur, key);
        if (dot == std::string::npos) return cur;
        start = dot + 1;
    }
}

// Key for case-insensitive comparisons (jinja2's ignore_case: lower() strings).
Value fold(const Value& v, bool case_sensitive) {
    if (!case_sensitive && v.is_string()) return Value::string(py_lower(v.as_string()));
    return v;
}

Value html_escape(const Value& v) {
    std::string out;
    for (char c : soft_str(v)) {
        switch (c) {
            case '&':
                out += "&amp;";
                break;
            case '<':
                out += "&lt;";
                break;
            case '>':
                out += "&gt;";
                break;
            case '"':
                out += "&#34;";
                break;
            case '\'':
                out += "&#39;";
                break;
            default:
                out += c;
        }
    }
    return Value::string(std::move(out));
}

// Python's round-half-even `round(x, ndigits)` for floats.
double py_round(double x, int64_t ndigits) {
    const double p = std::pow(10.0, double(ndigits));
    const double y = x * p;
    double r = std::nearbyint(y);  // default rounding mode: half to even
    if (std::fabs(y - std::trunc(y)) != 0.5) r = std::round(y);
    return r / p;
}

// --- printf-style formatting (`"%s" % x`, |format) -------------------------------------------

std::string pad(std::string s, int64_t width, bool left, char fill = ' ') {
    const int64_t len = int64_t(utf8_length(s));
    if (width <= len) return s;
    check_string_size(uint64_t(width));
    const std::string padding(size_t(width - len), fill);
    return left ? s + padding : padding + s;
}

}  // namespace

std::string percent_format(const std::string& fmt, const Value& args) {
    std::vector<Value> pos;
    const Dict* named = nullptr;
    // As CPython: a tuple supplies the arguments; any other value with __getitem__ (dict, list)
    // is also a mapping for %(name)s, and then unused arguments are not an error.
    bool mapping_mode = false;
    if (args.kind() == Kind::kTuple) {
        pos = args.as_list();
    } else {
        if (args.kind() == Kind::kDict) named = &args.as_dict();
        mapping_mode =
            args.kind() == Kind::kDict || args.kind() == Kind::kList || args.is_undefined();
        pos.push_back(args);
    }
    size_t next_arg = 0;
    std::string out;
    for (size_t i = 0; i < fmt.size(); ++i) {
        if (fmt[i] != '%') {
            out += fmt[i];
            continue;
        }
        if (++i >= fmt.size()) throw_error("incomplete format");
        if (fmt[i] == '%') {
            out += '%';
            continue;
        }
        const Value* arg = nullptr;
        if (fmt[i] == '(') {
            const size_t close = fmt.find(')', i);
            if (close == std::string::npos || !named) throw_error("format requires a mapping");
            const Value* v = named->find(std::string_view(fmt).substr(i + 1, close - i - 1));
            if (!v) throw_error("format key '" + fmt.substr(i + 1, close - i - 1) + "' not found");
            arg = v;
            i = close + 1;
        }
        bool left = false, plus = false, zero = false, space = false, alt = false;
        for (; i < fmt.size() && std::strchr("-+ 0#", fmt[i]); ++i) {
            if (fmt[i] == '-') left = true;
            if (fmt[i] == '+') plus = true;
            if (fmt[i] == '0') zero = true;
            if (fmt[i] == ' ') space = true;
            if (fmt[i] == '#') alt = true;
        }
        int64_t width = 0;
        for (; i < fmt.size() && std::isdigit(static_cast<unsigned char>(fmt[i])); ++i)
            width = width * 10 + (fmt[i] - '0');
        int64_t prec = -1;
        if (i < fmt.size() && fmt[i] == '.') {
            prec = 0;
            for (++i; i < fmt.size() && std::isdigit(static_cast<unsigned char>(fmt[i])); ++i)
                prec = prec * 10 + (fmt[i] - '0');
        }
        if (i >= fmt.size()) throw_error("incomplete format");
        const char type = fmt[i];
        if (!arg) {
            if (next_arg >= pos.size()) throw_error("not enough arguments for format string");
            arg = &pos[next_arg++];
        }
        std::string piece;
        switch (type) {
            case 's':
                piece = arg->str();
                if (prec >= 0) piece = utf8_encode(utf8_decode(piece).substr(0, size_t(prec)));
                break;
            case 'r':
            case 'a':
                piece = arg->repr();
                break;
            case 'd':
            case 'i':
            case 'u':
            case 'x':
            case 'X':
            case 'o':
            case 'c':
            case 'f':
            case 'F':
            case 'e':
            case 'E':
            case 'g':
            case 'G': {
                if (arg->is_undefined()) arg->fail_undefined();
                if (!arg->is_number())
                    throw_error(std::string("%") + type +
                                " format: a real number is required, not " + arg->type_name());
                std::string spec = "%";
                if (plus) spec += '+';
                if (space) spec += ' ';
                if (alt) spec += '#';
                if (prec >= 0) spec += "." + std::to_string(prec);
                char buf[512];
                if (type == 'c') {
                    utf8_append(piece, char32_t(arg->as_int()));
                } else if (std::strchr("diuxXo", type)) {
                    const int64_t v = arg->kind() == Kind::kFloat
                                          ? int64_t(std::trunc(arg->as_double()))
                                          : arg->as_int();
                    spec += "ll";
                    spec += (type == 'i' || type == 'u') ? 'd' : type;
                    std::snprintf(buf, sizeof buf, spec.c_str(), (long long)v);
                    piece = buf;
                    if (alt && type == 'o') {  // Python writes 0o, C writes 0
                        const size_t z = piece.find('0');
                        if (z != std::string::npos) piece.insert(z + 1, "o");
                    }
                } else {
                    spec += type;
                    std::snprintf(buf, sizeof buf, spec.c_str(), arg->as_double());
                    piece = buf;
                }
                break;
            }
            default:
                throw_error(std::string("unsupported format character '") + type + "'");
        }
        if (zero && !left && std::strchr("diuxXofFeEgG", type) && int64_t(piece.size()) < width) {
            check_string_size(uint64_t(width));
            const size_t sign =
                (!piece.empty() && (piece[0] == '-' || piece[0] == '+' || piece[0] == ' ')) ? 1 : 0;
            piece.insert(sign, std::string(size_t(width) - piece.size(), '0'));
        }
        out += pad(piece, width, left);
    }
    if (!mapping_mode && next_arg < pos.size())
        throw_error("not all arguments converted during string formatting");
    return out;
}

namespace {

// --- str.format (the sandbox allows it on plain strings) ------------------------------------

std::string brace_format(const std::string& fmt, const Args& args) {
    std::string out;
    size_t auto_index = 0;
    for (size_t i = 0; i < fmt.size(); ++i) {
        const char c = fmt[i];
        if (c == '}') {
            if (i + 1 < fmt.size() && fmt[i + 1] == '}')
                ++i;
            else
                throw_error("Single '}' encountered in format string");
            out += '}';
            continue;
        }
        if (c != '{') {
            out += c;
            continue;
        }
        if (i + 1 < fmt.size() && fmt[i + 1] == '{') {
            out += '{';
            ++i;
            continue;
        }
        const size_t close = fmt.find('}', i);
        if (close == std::string::npos) throw_error("Single '{' encountered in format string");
        std::string field = fmt.substr(i + 1, close - i - 1);
        i = close;
        char conv = 0;
        if (const size_t bang = field.find('!'); bang != std::string::npos) {
            conv = bang + 1 < field.size() ? field[bang + 1] : 0;
            field = field.substr(0, bang);
        }
        if (field.find(':') != std::string::npos)
            throw_error("format specifications in str.format() are not supported");
        Value v;
        if (field.empty()) {
            if (auto_index >= args.positional.size())
                throw_error("Replacement index out of range for positional args tuple");
            v = args.positional[auto_index++];
        } else if (std::all_of(field.begin(), field.end(),
                               [](char ch) { return ch >= '0' && ch <= '9'; })) {
            size_t k = 0;
            const bool fits =
                std::from_chars(field.data(), field.data() + field.size(), k).ec == std::errc();
            if (!fits || k >= args.positional.size())
                throw_error("Replacement index out of range for positional args tuple");
            v = args.positional[k];
        } else {
            const Value* kv = args.get(size_t(-1), field);
            if (!kv) throw_error("KeyError: '" + field + "' in str.format()");
            v = *kv;
        }
        out += conv == 'r' ? v.repr() : v.str();
    }
    return out;
}

// --- Python str methods ----------------------------------------------------------------------

std::vector<Value> split_whitespace(const std::u32string& s, int64_t maxsplit, bool from_right) {
    std::vector<std::u32string> parts;
    if (!from_right) {
        size_t i = 0;
        while (true) {
            while (i < s.size() && py_isspace(s[i])) ++i;
            if (i >= s.size()) break;
            if (maxsplit >= 0 && int64_t(parts.size()) == maxsplit) {
                parts.push_back(s.substr(i));
                break;
            }
            size_t j = i;
            while (j < s.size() && !py_isspace(s[j])) ++j;
            parts.push_back(s.substr(i, j - i));
            i = j;
        }
    } else {
        size_t i = s.size();
        while (true) {
            while (i > 0 && py_isspace(s[i - 1])) --i;
            if (i == 0) break;
            if (maxsplit >= 0 && int64_t(parts.size()) == maxsplit) {
                parts.push_back(s.substr(0, i));
                break;
            }
            size_t j = i;
            while (j > 0 && !py_isspace(s[j - 1])) --j;
            parts.push_back(s.substr(j, i - j));
            i = j;
        }
        std::reverse(parts.begin(), parts.end());
    }
    std::vector<Value> out;
    for (auto& p : parts) out.push_back(Value::string(utf8_encode(p)));
    return out;
}

std::vector<Value> split_sep(const std::string& s, const std::string& sep, int64_t maxsplit,
                             bool from_right) {
    if (sep.empty()) throw_error("empty separator");
    std::vector<std::string> parts;
    if (!from_right) {
        size_t start = 0;
        while (true) {
            if (maxsplit >= 0 && int64_t(parts.size()) == maxsplit) break;
            const size_t k = s.find(sep, start);
            if (k == std::string::npos) break;
            parts.push_back(s.substr(start, k - start));
            start = k + sep.size();
        }
        parts.push_back(s.substr(start));
    } else {
        size_t end = s.size();
        while (true) {
            if (maxsplit >= 0 && int64_t(parts.size()) == maxsplit) break;
            if (end < sep.size()) break;
            const size_t k = s.rfind(sep, end - sep.size());
            if (k == std::string::npos) break;
            parts.push_back(s.substr(k + sep.size(), end - k - sep.size()));
            end = k;
        }
        parts.push_back(s.substr(0, end));
        std::reverse(parts.begin(), parts.end());
    }
    std::vector<Value> out;
    for (auto& p : parts) out.push_back(Value::string(std::move(p)));
    return out;
}

std::string py_replace(const std::string& s, const std::string& old, const std::string& rep,
                       int64_t count) {
    std::string out;
    if (old.empty()) {
        // Python inserts `rep` before every code point and at the end.
        const std::u32string u = utf8_decode(s);
        int64_t n = 0;
        for (char32_t c : u) {
            if (count < 0 || n < count) {
                out += rep;
                ++n;
            }
            utf8_append(out, c);
        }
        if (count < 0 || n < count) out += rep;
        return out;
    }
    size_t start = 0;
    int64_t n = 0;
    while (count < 0 || n < count) {
        const size_t k = s.find(old, start);
        if (k == std::string::npos) break;
        out.append(s, start, k - start);
        out += rep;
        start = k + old.size();
        ++n;
    }
    out.append(s, start, std::string::npos);
    return out;
}

// Python's slice-index normalisation for start/end arguments of find/startswith/... .
std::u32string sub_range(const std::u32string& s, const Args& a, size_t first_index) {
    auto norm = [&](const Value* v, int64_t dflt) {
        if (!v || v->is_none()) return dflt;
        int64_t i = need_int(*v, "slice index");
        const int64_t n = int64_t(s.size());
        if (i < 0) i = std::max<int64_t>(0, i + n);
        return std::min(i, n);
    };
    const int64_t b = norm(a.get(first_index, "start"), 0);
    const int64_t e = norm(a.get(first_index + 1, "end"), int64_t(s.size()));
    if (e <= b) return {};
    return s.substr(size_t(b), size_t(e - b));
}

bool affix_match(const std::string& s, const Value& affix, const Args& a, bool prefix) {
    const std::u32string range = sub_range(utf8_decode(s), a, 1);
    const std::string hay = utf8_encode(range);
    auto one = [&](const Value& p) {
        const std::string& x = need_string(p, prefix ? "startswith argument" : "endswith argument");
        if (x.size() > hay.size()) return false;
        return prefix ? hay.compare(0, x.size(), x) == 0
                      : hay.compare(hay.size() - x.size(), x.size(), x) == 0;
    };
    if (affix.kind() == Kind::kTuple) {
        for (const auto& p : affix.as_list())
            if (one(p)) return true;
        return false;
    }
    return one(affix);
}

std::vector<Value> py_splitlines(const std::string& s, bool keepends) {
    const std::u32string u = utf8_decode(s);
    std::vector<Value> out;
    size_t start = 0;
    for (size_t i = 0; i < u.size(); ++i) {
        const char32_t c = u[i];
        const bool brk = c == U'\n' || c == U'\r' || c == 0x0b || c == 0x0c || c == 0x1c ||
                         c == 0x1d || c == 0x1e || c == 0x85 || c == 0x2028 || c == 0x2029;
        if (!brk) continue;
        size_t end = i + 1;
        if (c == U'\r' && i + 1 < u.size() && u[i + 1] == U'\n') end = i + 2;
        out.push_back(Value::string(utf8_encode(u.substr(start, (keepends ? end : i) - start))));
        start = end;
        i = end - 1;
    }
    if (start < u.size()) out.push_back(Value::string(utf8_encode(u.substr(start))));
    return out;
}

bool str_predicate(const std::string& s, std::string_view name, Value& out) {
    const std::u32string u = utf8_decode(s);
    auto all = [&](auto pred) {
        if (u.empty()) return false;
        for (char32_t c : u)
            if (!pred(c)) return false;
        return true;
    };
    auto cat = [](char32_t c) { return utf8proc_category(int32_t(c)); };
    bool r;
    if (name == "isspace")
        r = all(py_isspace);
    else if (name == "isalpha")
        r = all([&](char32_t c) {
            return cat(c) >= UTF8PROC_CATEGORY_LU && cat(c) <= UTF8PROC_CATEGORY_LO;
        });
    else if (name == "isalnum")
        r = all(is_alnum_cp);
    else if (name == "isdigit" || name == "isdecimal")
        r = all([&](char32_t c) { return cat(c) == UTF8PROC_CATEGORY_ND; });
    else if (name == "isnumeric")
        r = all([&](char32_t c) {
            return cat(c) >= UTF8PROC_CATEGORY_ND && cat(c) <= UTF8PROC_CATEGORY_NO;
        });
    else if (name == "islower" || name == "isupper") {
        // Python: at least one cased character and no cased character of the other case.
        bool cased = false, ok = true;
        for (char32_t c : u) {
            const auto k = cat(c);
            if (k == UTF8PROC_CATEGORY_LU || k == UTF8PROC_CATEGORY_LT) {
                if (name == "islower") ok = false;
                cased = true;
            } else if (k == UTF8PROC_CATEGORY_LL) {
                if (name == "isupper") ok = false;
                cased = true;
            }
        }
        r = cased && ok;
    } else {
        return false;
    }
    out = Value::boolean(r);
    return true;
}

bool call_str_method(const std::string& s, std::string_view name, Args& a, Value& out) {
    if (str_predicate(s, name, out)) {
        a.check(name, 0, {});
        return true;
    }
    if (name == "upper") {
        a.check(name, 0, {});
        out = Value::string(py_upper(s));
        return true;
    }
    if (name == "lower" || name == "casefold") {
        a.check(name, 0, {});
        out = Value::string(py_lower(s));
        return true;
    }
    if (name == "title") {
        a.check(name, 0, {});
        out = Value::string(py_title(s));
        return true;
    }
    if (name == "capitalize") {
        a.check(name, 0, {});
        out = Value::string(py_capitalize(s));
        return true;
    }
    if (name == "swapcase") {
        a.check(name, 0, {});
        std::string r;
        for (char32_t c : utf8_decode(s)) {
            const auto k = utf8proc_category(int32_t(c));
            std::string one = utf8_encode(std::u32string(1, c));
            r += k == UTF8PROC_CATEGORY_LU   ? py_lower(one)
                 : k == UTF8PROC_CATEGORY_LL ? py_upper(one)
                                             : one;
        }
        out = Value::string(std::move(r));
        return true;
    }
    if (name == "strip" || name == "lstrip" || name == "rstrip") {
        a.check(name, 1, {});
        const Value* chars = a.get(0, "");
        std::string set;
        const bool has = chars && !chars->is_none();
        if (has) set = need_string(*chars, "strip argument");
        out = Value::string(py_strip(s, has ? &set : nullptr, name != "rstrip", name != "lstrip"));
        return true;
    }
    if (name == "split" || name == "rsplit") {
        a.check(name, 2, {"sep", "maxsplit"});
        const Value* sep = a.get(0, "sep");
        const Value* maxv = a.get(1, "maxsplit");
        const int64_t maxsplit = maxv ? need_int(*maxv, "maxsplit") : -1;
        const bool right = name == "rsplit";
        if (!sep || sep->is_none())
            out = Value::list(split_whitespace(utf8_decode(s), maxsplit, right));
        else
            out = Value::list(split_sep(s, need_string(*sep, "separator"), maxsplit, right));
        return true;
    }
    if (name == "splitlines") {
        a.check(name, 1, {"keepends"});
        out = Value::list(py_splitlines(s, arg_bool(a, 0, "keepends", false)));
        return true;
    }
    if (name == "replace") {
        a.check(name, 3, {"count"});
        if (a.positional.size() < 2) throw_error("replace() takes at least 2 arguments");
        const Value* count = a.get(2, "count");
        out = Value::string(py_replace(s, need_string(a.positional[0], "replace() argument 1"),
                                       need_string(a.positional[1], "replace() argument 2"),
                                       count ? need_int(*count, "count") : -1));
        return true;
    }
    if (name == "startswith" || name == "endswith") {
        a.check(name, 3, {});
        if (a.positional.empty()) throw_error(std::string(name) + "() takes at least 1 argument");
        out = Value::boolean(affix_match(s, a.positional[0], a, name == "startswith"));
        return true;
    }
    if (name == "find" || name == "rfind" || name == "index" || name == "rindex" ||
        name == "count") {
        a.check(name, 3, {});
        if (a.positional.empty()) throw_error(std::string(name) + "() takes at least 1 argument");
        const std::string& sub = need_string(a.positional[0], "substring");
        const std::u32string full = utf8_decode(s);
        const std::u32string range_u = sub_range(full, a, 1);
        const std::string hay = utf8_encode(range_u);
        // Offset (in code points) of the searched range inside s.
        int64_t base = 0;
        if (const Value* st = a.get(1, "start"); st && !st->is_none()) {
            int64_t i = need_int(*st, "start");
            if (i < 0) i = std::max<int64_t>(0, i + int64_t(full.size()));
            base = std::min<int64_t>(i, int64_t(full.size()));
        }
        if (name == "count") {
            int64_t n = 0;
            if (sub.empty()) {
                n = int64_t(range_u.size()) + 1;
            } else {
                for (size_t k = hay.find(sub); k != std::string::npos;
                     k = hay.find(sub, k + sub.size()))
                    ++n;
            }
            out = Value::integer(n);
            return true;
        }
        const size_t k = (name == "find" || name == "index") ? hay.find(sub) : hay.rfind(sub);
        if (k == std::string::npos) {
            if (name == "index" || name == "rindex") throw_error("substring not found");
            out = Value::integer(-1);
        } else {
            out = Value::integer(base + cp_index(hay, k));
        }
        return true;
    }
    if (name == "join") {
        a.check(name, 1, {});
        if (a.positional.empty()) throw_error("join() takes exactly one argument");
        std::string r;
        size_t i = 0;
        for (const Value& item : iterate(a.positional[0])) {
            if (!item.is_string())
                throw_error("sequence item " + std::to_string(i) + ": expected str instance, " +
                            item.type_name() + " found");
            if (i++) r += s;
            r += item.as_string();
        }
        out = Value::string(std::move(r));
        return true;
    }
    if (name == "format") {
        out = Value::string(brace_format(s, a));
        return true;
    }
    if (name == "center" || name == "ljust" || name == "rjust") {
        a.check(name, 2, {});
        if (a.positional.empty()) throw_error(std::string(name) + "() takes at least 1 argument");
        const int64_t width = need_int(a.positional[0], "width");
        std::string fill = " ";
        if (a.positional.size() > 1) fill = need_string(a.positional[1], "fillchar");
        if (width > 0) check_string_size(uint64_t(width) * std::max<uint64_t>(fill.size(), 1));
        const int64_t len = int64_t(utf8_length(s));
        if (width <= len) {
            out = Value::string(s);
            return true;
        }
        const int64_t total = width - len;
        int64_t left = name == "ljust"   ? 0
                       : name == "rjust" ? total
                                         : total / 2 + (total & width & 1);
        std::string r;
        for (int64_t k = 0; k < left; ++k) r += fill;
        r += s;
        for (int64_t k = 0; k < total - left; ++k) r += fill;
        out = Value::string(std::move(r));
        return true;
    }
    if (name == "zfill") {
        a.check(name, 1, {});
        const int64_t width = a.positional.empty() ? 0 : need_int(a.positional[0], "width");
        std::string r = s;
        const int64_t len = int64_t(utf8_length(s));
        if (width > len) {
            check_string_size(uint64_t(width));
            const size_t at = (!r.empty() && (r[0] == '-' || r[0] == '+')) ? 1 : 0;
            r.insert(at, std::string(size_t(width - len), '0'));
        }
        out = Value::string(std::move(r));
        return true;
    }
    if (name == "partition" || name == "rpartition") {
        a.check(name, 1, {});
        if (a.positional.empty()) throw_error(std::string(name) + "() takes exactly one argument");
        const std::string& sep = need_string(a.positional[0], "separator");
        if (sep.empty()) throw_error("empty separator");
        const size_t k = name == "partition" ? s.find(sep) : s.rfind(sep);
        if (k == std::string::npos) {
            out = name == "partition"
                      ? Value::tuple({Value::string(s), Value::string(""), Value::string("")})
                      : Value::tuple({Value::string(""), Value::string(""), Value::string(s)});
        } else {
            out = Value::tuple({Value::string(s.substr(0, k)), Value::string(sep),
                                Value::string(s.substr(k + sep.size()))});
        }
        return true;
    }
    if (name == "removeprefix" || name == "removesuffix") {
        a.check(name, 1, {});
        if (a.positional.empty()) throw_error(std::string(name) + "() takes exactly one argument");
        const std::string& x = need_string(a.positional[0], "affix");
        std::string r = s;
        if (name == "removeprefix" && s.compare(0, x.size(), x) == 0) r = s.substr(x.size());
        if (name == "removesuffix" && !x.empty() && s.size() >= x.size() &&
            s.compare(s.size() - x.size(), x.size(), x) == 0)
            r = s.substr(0, s.size() - x.size());
        out = Value::string(std::move(r));
        return true;
    }
    return false;
}

bool is_str_method(std::string_view n) {
    static const char* const kNames[] = {
        "upper",   "lower",      "casefold",  "title",      "capitalize",   "swapcase",
        "strip",   "lstrip",     "rstrip",    "split",      "rsplit",       "splitlines",
        "replace", "startswith", "endswith",  "find",       "rfind",        "index",
        "rindex",  "count",      "join",      "format",     "center",       "ljust",
        "rjust",   "zfill",      "partition", "rpartition", "removeprefix", "removesuffix",
        "isspace", "isalpha",    "isalnum",   "isdigit",    "isdecimal",    "isnumeric",
        "islower", "isupper"};
    for (const char* k : kNames)
        if (n == k) return true;
    return false;
}

// Methods the immutable sandbox refuses (they would modify a list or dict).
bool is_unsafe_method(const Value& obj, std::string_view n) {
    if (obj.kind() == Kind::kList) {
        static const char* const kList[] = {"append",  "extend", "insert", "pop",        "remove",
                                            "reverse", "sort",   "clear",  "__setitem__"};
        for (const char* k : kList)
            if (n == k) return true;
    }
    if (obj.kind() == Kind::kDict) {
        static const char* const kDict[] = {"clear", "pop", "popitem", "setdefault", "update"};
        for (const char* k : kDict)
            if (n == k) return true;
    }
    return false;
}

bool is_container_method(const Value& obj, std::string_view n) {
    if (obj.kind() == Kind::kDict)
        return n == "get" || n == "keys" || n == "values" || n == "items" || n == "copy";
    if (obj.is_sequence())
        return n == "count" || n == "index" || (obj.kind() == Kind::kList && n == "copy");
    return false;
}

}  // namespace

bool call_method(const Value& obj, std::string_view name, Args& a, Value& out) {
    switch (obj.kind()) {
        case Kind::kString:
            return is_str_method(name) && call_str_method(obj.as_string(), name, a, out);
        case Kind::kDict: {
            const Dict& d = obj.as_dict();
            if (name == "get") {
                a.check(name, 2, {});
                if (a.positional.empty()) throw_error("get expected at least 1 argument, got 0");
                const Value* v = d.find(a.positional[0]);
                out = v ? *v : a.positional.size() > 1 ? a.positional[1] : Value::none();
                return true;
            }
            if (name == "keys" || name == "values" || name == "items") {
                a.check(name, 0, {});
                List l;
                for (const auto& [k, v] : d.items) {
                    if (name == "keys")
                        l.push_back(k);
                    else if (name == "values")
                        l.push_back(v);
                    else
                        l.push_back(Value::tuple({k, v}));
                }
                out = Value::list(std::move(l));
                return true;
            }
            if (name == "copy") {
                a.check(name, 0, {});
                out = obj;
                return true;
            }
            return false;
        }
        case Kind::kList:
        case Kind::kTuple: {
            const List& l = obj.as_list();
            if (name == "count" || name == "index") {
                a.check(name, 1, {});
                if (a.positional.empty())
                    throw_error(std::string(name) + "() takes exactly one argument");
                int64_t n = 0;
                for (size_t i = 0; i < l.size(); ++i) {
                    if (!equals(l[i], a.positional[0])) continue;
                    if (name == "index") {
                        out = Value::integer(int64_t(i));
                        return true;
                    }
                    ++n;
                }
                if (name == "index") throw_error(a.positional[0].repr() + " is not in list");
                out = Value::integer(n);
                return true;
            }
            if (name == "copy" && obj.kind() == Kind::kList) {
                a.check(name, 0, {});
                out = obj;
                return true;
            }
            return false;
        }
        default:
            return false;
    }
}

Value get_attr(const Value& obj, std::string_view name) {
    if (name.size() >= 2 && name.substr(0, 2) == "__")
        return Value::undefined(std::string("access to attribute '") + std::string(name) +
                                "' of '" + obj.type_name() + "' object is unsafe.");
    if (obj.kind() == Kind::kObject) return obj.as_object()->get_attr(name);
    const bool method = obj.is_string() ? is_str_method(name) : is_container_method(obj, name);
    if (method) {
        const std::string n(name);
        return Value::object(std::make_shared<Function>(n, [obj, n](Args& a) {
            Value out;
            call_method(obj, n, a, out);
            return out;
        }));
    }
    if (is_unsafe_method(obj, name))
        return Value::undefined(std::string("access to attribute '") + std::string(name) +
                                "' of '" + obj.type_name() + "' object is unsafe.");
    if (obj.kind() == Kind::kDict) {
        if (const Value* v = obj.as_dict().find(name)) return *v;
    }
    return Value::undefined(std::string("'") + obj.type_name() + " object' has no attribute '" +
                            std::string(name) + "'");
}

Value get_item(const Value& obj, const Value& key) {
    switch (obj.kind()) {
        case Kind::kDict:
            if (const Value* v = obj.as_dict().find(key)) return *v;
            break;
        case Kind::kList:
        case Kind::kTuple:
        case Kind::kString:
            if (key.kind() == Kind::kInt || key.kind() == Kind::kBool) {
                int64_t i = key.as_int();
                if (obj.is_string()) {
                    const std::u32string u = utf8_decode(obj.as_string());
                    const int64_t n = int64_t(u.size());
                    if (i < 0) i += n;
                    if (i >= 0 && i < n) return Value::string(utf8_encode(u.substr(size_t(i), 1)));
                } else {
                    const List& l = obj.as_list();
                    const int64_t n = int64_t(l.size());
                    if (i < 0) i += n;
                    if (i >= 0 && i < n) return l[size_t(i)];
                }
                return Value::undefined(std::string("'") + obj.type_name() +
                                        " object' has no element " + key.repr());
            }
            break;
        case Kind::kObject:
            if (key.is_string()) return obj.as_object()->get_attr(key.as_string());
            break;
        default:
            break;
    }
    if (key.is_string()) return get_attr(obj, key.as_string());
    return Value::undefined(std::string("'") + obj.type_name() + " object' has no element " +
                            key.repr());
}

Value call_value(const Value& callee, Args& args) {
    if (callee.is_undefined()) callee.fail_undefined();
    if (callee.kind() == Kind::kObject && callee.as_object()->callable())
        return callee.as_object()->call(args);
    throw_error(std::string("'") + callee.type_name() + "' object is not callable");
}

std::vector<Value> iterate(const Value& v) {
    switch (v.kind()) {
        case Kind::kUndefined:
            return {};
        case Kind::kList:
        case Kind::kTuple:
            return v.as_list();
        case Kind::kDict: {
            std::vector<Value> keys;
            for (const auto& [k, e] : v.as_dict().items) keys.push_back(k);
            return keys;
        }
        case Kind::kString: {
            std::vector<Value> chars;
            for (char32_t c : utf8_decode(v.as_string()))
                chars.push_back(Value::string(utf8_encode(std::u32string(1, c))));
            return chars;
        }
        case Kind::kObject:
            if (Generator* g = as_generator(v)) return g->take_all();
            [[fallthrough]];
        default:
            throw_error(std::string("'") + v.type_name() + "' object is not iterable");
    }
}

int64_t length_of(const Value& v) {
    switch (v.kind()) {
        case Kind::kUndefined:
            return 0;
        case Kind::kString:
            return int64_t(utf8_length(v.as_string()));
        case Kind::kList:
        case Kind::kTuple:
            return int64_t(v.as_list().size());
        case Kind::kDict:
            return int64_t(v.as_dict().items.size());
        default:
            throw_error(std::string("object of type '") + v.type_name() + "' has no len()");
    }
}

bool contains(const Value& container, const Value& item) {
    switch (container.kind()) {
        case Kind::kUndefined:
            return false;
        case Kind::kString:
            if (!item.is_string())
                throw_error(std::string("'in <string>' requires string as left operand, not ") +
                            item.type_name());
            return container.as_string().find(item.as_string()) != std::string::npos;
        case Kind::kList:
        case Kind::kTuple:
            for (const auto& e : container.as_list())
                if (equals(e, item)) return true;
            return false;
        case Kind::kDict:
            if (item.kind() == Kind::kList || item.kind() == Kind::kDict)
                throw_error(std::string("unhashable type: '") + item.type_name() + "'");
            return container.as_dict().find(item) != nullptr;
        case Kind::kObject:
            if (Generator* g = as_generator(container)) {
                Value e;
                while (g->take_one(e))
                    if (equals(e, item)) return true;
                return false;
            }
            [[fallthrough]];
        default:
            throw_error(std::string("argument of type '") + container.type_name() +
                        "' is not iterable");
    }
}

// --- filters ---------------------------------------------------------------------------------

namespace {

Value f_abs(const Value& v, Args& a) {
    a.check("abs", 0, {});
    if (v.kind() == Kind::kFloat) return Value::floating(std::fabs(v.as_double()));
    if (v.is_number()) return Value::integer(std::llabs(v.as_int()));
    if (v.is_undefined()) v.fail_undefined();
    throw_error(std::string("bad operand type for abs(): '") + v.type_name() + "'");
}

Value f_attr(const Value& v, Args& a) {
    a.check("attr", 1, {"name"});
    const Value* n = a.get(0, "name");
    if (!n) throw_error("attr() needs a name");
    if (v.is_undefined()) v.fail_undefined();
    return get_attr(v, need_string(*n, "attribute name"));
}

Value f_batch(const Value& v, Args& a) {
    a.check("batch", 2, {"linecount", "fill_with"});
    const Value* n = a.get(0, "linecount");
    if (!n) throw_error("batch() needs a line count");
    const int64_t count = need_int(*n, "linecount");
    if (count <= 0) throw_error("batch() needs a positive line count");
    const Value* fill = a.get(1, "fill_with");
    std::vector<Value> out;
    List cur;
    for (Value& item : iterate(v)) {
        cur.push_back(std::move(item));
        if (int64_t(cur.size()) == count) {
            out.push_back(Value::list(std::move(cur)));
            cur.clear();
        }
    }
    if (!cur.empty()) {
        if (fill && !fill->is_none())
            while (int64_t(cur.size()) < count) cur.push_back(*fill);
        out.push_back(Value::list(std::move(cur)));
    }
    return make_generator("generator", std::move(out));
}

Value f_capitalize(const Value& v, Args& a) {
    a.check("capitalize", 0, {});
    return Value::string(py_capitalize(soft_str(v)));
}

Value f_center(const Value& v, Args& a) {
    a.check("center", 1, {"width"});
    const Value* w = a.get(0, "width");
    Args inner;
    inner.positional.push_back(w ? *w : Value::integer(80));
    Value out;
    call_str_method(soft_str(v), "center", inner, out);
    return out;
}

Value f_length(const Value& v, Args& a) {
    a.check("length", 0, {});
    return Value::integer(length_of(v));
}

Value f_default(const Value& v, Args& a) {
    a.check("default", 2, {"default_value", "boolean"});
    const Value* d = a.get(0, "default_value");
    const bool boolean = arg_bool(a, 1, "boolean", false);
    if (v.is_undefined() || (boolean && !v.truthy())) return d ? *d : Value::string("");
    return v;
}

Value f_dictsort(const Value& v, Args& a) {
    a.check("dictsort", 3, {"case_sensitive", "by", "reverse"});
    if (v.kind() != Kind::kDict) throw_error("dictsort() needs a mapping");
    const bool cs = arg_bool(a, 0, "case_sensitive", false);
    const Value* by = a.get(1, "by");
    const std::string by_s = by ? need_string(*by, "by") : "key";
    if (by_s != "key" && by_s != "value")
        throw_error("You can only sort by either 'key' or 'value'");
    const bool rev = arg_bool(a, 2, "reverse", false);
    std::vector<std::pair<Value, Value>> items = v.as_dict().items;
    const size_t pos = by_s == "key" ? 0 : 1;
    std::stable_sort(items.begin(), items.end(), [&](const auto& x, const auto& y) {
        const Value& l = pos == 0 ? x.first : x.second;
        const Value& r = pos == 0 ? y.first : y.second;
        return rev ? less_than(fold(r, cs), fold(l, cs)) : less_than(fold(l, cs), fold(r, cs));
    });
    List out;
    for (auto& [k, e] : items) out.push_back(Value::tuple({k, e}));
    return Value::list(std::move(out));
}

Value f_escape(const Value& v, Args& a) {
    a.check("escape", 0, {});
    return html_escape(v);
}

Value f_first(const Value& v, Args& a) {
    a.check("first", 0, {});
    if (Generator* g = as_generator(v)) {
        Value out;
        if (g->take_one(out)) return out;
        return Value::undefined("No first item, sequence was empty.");
    }
    std::vector<Value> items = iterate(v);
    if (items.empty()) return Value::undefined("No first item, sequence was empty.");
    return items[0];
}

Value f_last(const Value& v, Args& a) {
    a.check("last", 0, {});
    if (as_generator(v))
        throw_error(std::string("'") + v.type_name() + "' object is not reversible");
    std::vector<Value> items = iterate(v);
    if (items.empty()) return Value::undefined("No last item, sequence was empty.");
    return items.back();
}

// Python float(x) for the float/int filters; false when x does not convert.
bool to_float(const Value& v, double& out) {
    if (v.is_number()) {
        out = v.as_double();
        return true;
    }
    if (!v.is_string()) return false;
    const std::string t = py_strip(v.as_string(), nullptr, true, true);
    std::string clean;
    for (char c : t)
        if (c != '_') clean += c;
    if (clean.empty()) return false;
    const std::string low = py_lower(clean);
    if (low == "inf" || low == "+inf" || low == "infinity" || low == "+infinity") {
        out = INFINITY;
        return true;
    }
    if (low == "-inf" || low == "-infinity") {
        out = -INFINITY;
        return true;
    }
    if (low == "nan" || low == "+nan" || low == "-nan") {
        out = NAN;
        return true;
    }
    char* end = nullptr;
    out = std::strtod(clean.c_str(), &end);
    return end && *end == '\0' && clean.find_first_of("xXpP") == std::string::npos;
}

Value f_float(const Value& v, Args& a) {
    a.check("float", 1, {"default"});
    if (v.is_undefined()) v.fail_undefined();
    double f;
    if (to_float(v, f)) return Value::floating(f);
    const Value* d = a.get(0, "default");
    return d ? *d : Value::floating(0.0);
}

Value f_int(const Value& v, Args& a) {
    a.check("int", 2, {"default", "base"});
    if (v.is_undefined()) v.fail_undefined();
    const Value* d = a.get(0, "default");
    const Value dflt = d ? *d : Value::integer(0);
    const Value* b = a.get(1, "base");
    const int64_t base = b ? need_int(*b, "base") : 10;
    if (v.kind() == Kind::kInt || v.kind() == Kind::kBool) return Value::integer(v.as_int());
    if (v.kind() == Kind::kFloat) {
        const double f = v.as_double();
        if (!std::isfinite(f)) return dflt;
        if (std::fabs(f) >= 9.2e18)
            throw_error("integer overflow: lathe's template integers are 64-bit");
        return Value::integer(int64_t(std::trunc(f)));
    }
    if (v.is_string()) {
        std::string t = py_strip(v.as_string(), nullptr, true, true);
        std::string clean;
        for (char c : t)
            if (c != '_') clean += c;
        if (!clean.empty()) {
            errno = 0;
            char* end = nullptr;
            const long long i = std::strtoll(clean.c_str(), &end, int(base));
            if (errno == 0 && end && *end == '\0') return Value::integer(i);
        }
        double f;
        if (base == 10 && to_float(v, f) && std::isfinite(f)) {
            if (std::fabs(f) >= 9.2e18)
                throw_error("integer overflow: lathe's template integers are 64-bit");
            return Value::integer(int64_t(std::trunc(f)));
        }
    }
    return dflt;
}

Value f_format(const Value& v, Args& a) {
    if (!a.positional.empty() && !a.keyword.empty())
        throw_error("can't handle positional and keyword arguments at the same time");
    if (!a.keyword.empty()) {
        Dict d;
        for (auto& [k, e] : a.keyword) d.items.emplace_back(Value::string(k), e);
        return Value::string(percent_format(soft_str(v), Value::dict(std::move(d))));
    }
    return Value::string(percent_format(soft_str(v), Value::tuple(a.positional)));
}

Value f_indent(const Value& v, Args& a) {
    a.check("indent", 3, {"width", "first", "blank"});
    const Value* w = a.get(0, "width");
    std::string ind = "    ";
    if (w && !w->is_string())
        check_string_size(uint64_t(std::max<int64_t>(0, need_int(*w, "width"))));
    if (w)
        ind = w->is_string()
                  ? w->as_string()
                  : std::string(size_t(std::max<int64_t>(0, need_int(*w, "width"))), ' ');
    const bool first = arg_bool(a, 1, "first", false);
    const bool blank = arg_bool(a, 2, "blank", false);
    if (v.is_undefined()) v.fail_undefined();
    if (!v.is_string())
        throw_error(std::string("unsupported operand type(s) for +=: '") + v.type_name() +
                    "' and 'str'");
    std::string s = v.as_string() + "\n";  // jinja2 appends a newline and strips it at the end
    std::vector<Value> lines = py_splitlines(s, true);
    std::string rv;
    if (blank) {
        for (size_t i = 0; i < lines.size(); ++i) {
            if (i) rv += ind;
            rv += lines[i].as_string();
        }
    } else {
        for (size_t i = 0; i < lines.size(); ++i) {
            const std::string& line = lines[i].as_string();
            if (i && !py_strip(line, nullptr, true, true).empty()) rv += ind;
            rv += line;
        }
    }
    if (first) rv = ind + rv;
    if (!rv.empty() && rv.back() == '\n') rv.pop_back();  // rv[:-1] of the appended newline
    return Value::string(rv);
}

Value f_items(const Value& v, Args& a) {
    a.check("items", 0, {});
    if (v.is_undefined()) return make_generator("generator", {});
    if (v.kind() != Kind::kDict) throw_error("Can only get item pairs from a mapping.");
    std::vector<Value> out;
    for (const auto& [k, e] : v.as_dict().items) out.push_back(Value::tuple({k, e}));
    return make_generator("generator", std::move(out));
}

Value f_join(const Value& v, Args& a) {
    a.check("join", 2, {"d", "attribute"});
    const Value* d = a.get(0, "d");
    const std::string sep = d ? soft_str(*d) : "";
    const Value* attr = a.get(1, "attribute");
    std::string out;
    size_t i = 0;
    for (const Value& item : iterate(v)) {
        if (i++) out += sep;
        (attr ? attr_path(item, soft_str(*attr)) : item).append_str(out);
    }
    return Value::string(std::move(out));
}

Value f_list(const Value& v, Args& a) {
    a.check("list", 0, {});
    return Value::list(iterate(v));
}

Value f_lower(const Value& v, Args& a) {
    a.check("lower", 0, {});
    return Value::string(py_lower(soft_str(v)));
}

Value f_upper(const Value& v, Args& a) {
    a.check("upper", 0, {});
    return Value::string(py_upper(soft_str(v)));
}

// jinja2's map/select/reject/... iterate only a truthy input: a falsy one gives nothing.
std::vector<Value> iterate_if_truthy(const Value& v) {
    if (!v.truthy()) return {};
    return iterate(v);
}

Value f_map(const Value& v, Args& a) {
    std::vector<Value> items = iterate_if_truthy(v);
    std::vector<Value> out;
    if (a.positional.empty()) {
        const Value* attr = a.get(size_t(-1), "attribute");
        if (!attr) throw_error("map() needs a filter name or attribute=");
        a.check("map", 0, {"attribute", "default"});
        const Value* dflt = a.get(size_t(-1), "default");
        for (const Value& item : items) {
            Value r = attr_path(item, soft_str(*attr));
            if (r.is_undefined() && dflt) r = *dflt;
            out.push_back(std::move(r));
        }
    } else {
        const std::string& name = need_string(a.positional[0], "filter name");
        FilterFn f = find_filter(name);
        if (!f) throw_error("no filter named '" + name + "'");
        Args rest;
        rest.positional.assign(a.positional.begin() + 1, a.positional.end());
        rest.keyword = a.keyword;
        for (const Value& item : items) {
            Args copy = rest;
            out.push_back(f(item, copy));
        }
    }
    return make_generator("generator", std::move(out));
}

Value min_max(const Value& v, Args& a, bool want_max) {
    a.check(want_max ? "max" : "min", 2, {"case_sensitive", "attribute"});
    const bool cs = arg_bool(a, 0, "case_sensitive", false);
    const Value* attr = a.get(1, "attribute");
    std::vector<Value> items = iterate(v);
    if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
    size_t best = 0;
    auto key = [&](const Value& x) { return fold(attr ? attr_path(x, soft_str(*attr)) : x, cs); };
    for (size_t i = 1; i < items.size(); ++i) {
        if (want_max ? less_than(key(items[best]), key(items[i]))
                     : less_than(key(items[i]), key(items[best])))
            best = i;
    }
    return items[best];
}
Value f_max(const Value& v, Args& a) {
    return min_max(v, a, true);
}
Value f_min(const Value& v, Args& a) {
    return min_max(v, a, false);
}

// select / reject / selectattr / rejectattr.
Value select_common(const Value& v, Args& a, bool by_attr, bool keep) {
    std::vector<Value> items = iterate_if_truthy(v);
    size_t k = 0;
    std::string attr;
    if (by_attr) {
        if (a.positional.empty()) throw_error("selectattr/rejectattr need an attribute name");
        attr = soft_str(a.positional[k++]);
    }
    TestFn test = nullptr;
    Args targs;
    if (k < a.positional.size()) {
        const std::string& name = need_string(a.positional[k++], "test name");
        test = find_test(name);
        if (!test) throw_error("no test named '" + name + "'");
        targs.positional.assign(a.positional.begin() + long(k), a.positional.end());
        targs.keyword = a.keyword;
    }
    std::vector<Value> out;
    for (const Value& item : items) {
        const Value x = by_attr ? attr_path(item, attr) : item;
        bool ok;
        if (test) {
            Args copy = targs;
            ok = test(x, copy);
        } else {
            ok = x.truthy();
        }
        if (ok == keep) out.push_back(item);
    }
    return make_generator("generator", std::move(out));
}
Value f_select(const Value& v, Args& a) {
    return select_common(v, a, false, true);
}
Value f_reject(const Value& v, Args& a) {
    return select_common(v, a, false, false);
}
Value f_selectattr(const Value& v, Args& a) {
    return select_common(v, a, true, true);
}
Value f_rejectattr(const Value& v, Args& a) {
    return select_common(v, a, true, false);
}

Value f_replace(const Value& v, Args& a) {
    a.check("replace", 3, {"old", "new", "count"});
    const Value* o = a.get(0, "old");
    const Value* n = a.get(1, "new");
    if (!o || !n) throw_error("replace() needs old and new");
    const Value* c = a.get(2, "count");
    const int64_t count = (c && !c->is_none()) ? need_int(*c, "count") : -1;
    return Value::string(py_replace(soft_str(v), soft_str(*o), soft_str(*n), count));
}

Value f_reverse(const Value& v, Args& a) {
    a.check("reverse", 0, {});
    if (v.is_string()) {
        std::u32string u = utf8_decode(v.as_string());
        std::reverse(u.begin(), u.end());
        return Value::string(utf8_encode(u));
    }
    if (v.is_undefined()) return make_generator("reversed", {});
    if (as_generator(v)) {  // reversed() fails; jinja2 falls back to a reversed list
        std::vector<Value> items = iterate(v);
        std::reverse(items.begin(), items.end());
        return Value::list(std::move(items));
    }
    std::vector<Value> items = iterate(v);
    std::reverse(items.begin(), items.end());
    return make_generator(
        v.kind() == Kind::kDict ? "dict_reversekeyiterator" : "list_reverseiterator",
        std::move(items));
}

Value f_round(const Value& v, Args& a) {
    a.check("round", 2, {"precision", "method"});
    const Value* p = a.get(0, "precision");
    const int64_t prec = p ? need_int(*p, "precision") : 0;
    const Value* m = a.get(1, "method");
    const std::string method = m ? soft_str(*m) : "common";
    if (v.is_undefined()) v.fail_undefined();
    if (!v.is_number()) throw_error(std::string("round() needs a number, not ") + v.type_name());
    const double x = v.as_double();
    if (method == "common") {
        // Python's round() of an int is an int (exact for non-negative precision).
        if (v.kind() != Kind::kFloat && prec >= 0) return Value::integer(v.as_int());
        return Value::floating(py_round(x, prec));
    }
    if (method != "ceil" && method != "floor") throw_error("method must be common, ceil or floor");
    const double f = std::pow(10.0, double(prec));
    return Value::floating((method == "ceil" ? std::ceil(x * f) : std::floor(x * f)) / f);
}

Value f_safe(const Value& v, Args& a) {
    a.check("safe", 0, {});
    return Value::string(soft_str(v));
}

Value f_sort(const Value& v, Args& a) {
    a.check("sort", 3, {"reverse", "case_sensitive", "attribute"});
    const bool rev = arg_bool(a, 0, "reverse", false);
    const bool cs = arg_bool(a, 1, "case_sensitive", false);
    const Value* attr = a.get(2, "attribute");
    std::vector<Value> items = iterate(v);
    auto key = [&](const Value& x) { return fold(attr ? attr_path(x, soft_str(*attr)) : x, cs); };
    std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
        return rev ? less_than(key(y), key(x)) : less_than(key(x), key(y));
    });
    return Value::list(std::move(items));
}

Value f_string(const Value& v, Args& a) {
    a.check("string", 0, {});
    return Value::string(soft_str(v));
}

Value f_sum(const Value& v, Args& a) {
    a.check("sum", 2, {"attribute", "start"});
    const Value* attr = a.get(0, "attribute");
    const Value* start = a.get(1, "start");
    Value total = start ? *start : Value::integer(0);
    for (const Value& item : iterate(v)) {
        const Value x = attr ? attr_path(item, soft_str(*attr)) : item;
        if (!x.is_number() || !total.is_number())
            throw_error(std::string("unsupported operand type(s) for +: '") + total.type_name() +
                        "' and '" + x.type_name() + "'");
        if (x.kind() == Kind::kFloat || total.kind() == Kind::kFloat)
            total = Value::floating(total.as_double() + x.as_double());
        else
            total = Value::integer(total.as_int() + x.as_int());
    }
    return total;
}

Value f_title(const Value& v, Args& a) {
    a.check("title", 0, {});
    // jinja2: split at runs of [-\s({[<], upper() the first character of each piece, lower() the
    // rest.
    const std::u32string u = u32(v);
    std::string out;
    auto is_sep = [](char32_t c) {
        return py_isspace(c) || c == U'-' || c == U'(' || c == U'{' || c == U'[' || c == U'<';
    };
    size_t i = 0;
    while (i < u.size()) {
        size_t j = i;
        const bool sep = is_sep(u[i]);
        while (j < u.size() && is_sep(u[j]) == sep) ++j;
        const std::u32string piece = u.substr(i, j - i);
        if (sep) {
            out += utf8_encode(piece);
        } else {
            out += py_upper(utf8_encode(piece.substr(0, 1)));
            out += py_lower(utf8_encode(piece.substr(1)));
        }
        i = j;
    }
    return Value::string(std::move(out));
}

// transformers' tojson: json.dumps(x, ensure_ascii=False, indent=None, separators=None,
// sort_keys=False), every option overridable.
Value f_tojson(const Value& v, Args& a) {
    a.check("tojson", 4, {"ensure_ascii", "indent", "separators", "sort_keys"});
    JsonDumpOptions o;
    o.ensure_ascii = arg_bool(a, 0, "ensure_ascii", false);
    if (const Value* ind = a.get(1, "indent"); ind && !ind->is_none()) {
        o.has_indent = true;
        if (ind->is_string()) {
            o.indent = -1;
            o.indent_str = ind->as_string();
        } else {
            o.indent = int(std::max<int64_t>(0, need_int(*ind, "indent")));
        }
    }
    if (const Value* sep = a.get(2, "separators"); sep && !sep->is_none()) {
        std::vector<Value> parts = iterate(*sep);
        if (parts.size() != 2)
            throw_error("separators must be an (item_separator, key_separator) pair");
        o.has_separators = true;
        o.item_separator = need_string(parts[0], "item separator");
        o.key_separator = need_string(parts[1], "key separator");
    }
    o.sort_keys = arg_bool(a, 3, "sort_keys", false);
    return Value::string(json_dumps(v, o));
}

Value f_trim(const Value& v, Args& a) {
    a.check("trim", 1, {"chars"});
    const Value* c = a.get(0, "chars");
    if (c && !c->is_none()) {
        const std::string chars = soft_str(*c);
        return Value::string(py_strip(soft_str(v), &chars, true, true));
    }
    return Value::string(py_strip(soft_str(v), nullptr, true, true));
}

Value f_truncate(const Value& v, Args& a) {
    a.check("truncate", 4, {"length", "killwords", "end", "leeway"});
    const Value* l = a.get(0, "length");
    const int64_t length = l ? need_int(*l, "length") : 255;
    const bool killwords = arg_bool(a, 1, "killwords", false);
    const Value* e = a.get(2, "end");
    const std::string end = e ? soft_str(*e) : "...";
    const Value* lw = a.get(3, "leeway");
    const int64_t leeway = (lw && !lw->is_none()) ? need_int(*lw, "leeway") : 5;
    const int64_t end_len = int64_t(utf8_length(end));
    if (length < end_len)
        throw_error("expected length >= " + std::to_string(end_len) + ", got " +
                    std::to_string(length));
    if (leeway < 0) throw_error("expected leeway >= 0, got " + std::to_string(leeway));
    if (length_of(v) <= length + leeway) return v;  // short values come back as they are
    if (!v.is_string()) throw_error(std::string("truncate cannot shorten a ") + v.type_name());
    const std::u32string s = u32(v);
    std::u32string head = s.substr(0, size_t(length - end_len));
    if (!killwords) {
        const size_t sp = head.rfind(U' ');
        if (sp != std::u32string::npos) head = head.substr(0, sp);
    }
    return Value::string(utf8_encode(head) + end);
}

Value f_unique(const Value& v, Args& a) {
    a.check("unique", 2, {"case_sensitive", "attribute"});
    const bool cs = arg_bool(a, 0, "case_sensitive", false);
    const Value* attr = a.get(1, "attribute");
    std::vector<Value> seen, out;
    for (const Value& item : iterate(v)) {
        const Value k = fold(attr ? attr_path(item, soft_str(*attr)) : item, cs);
        if (k.kind() == Kind::kList || k.kind() == Kind::kDict)
            throw_error(std::string("unhashable type: '") + k.type_name() + "'");
        bool dup = false;
        for (const Value& s : seen)
            if (equals(s, k)) dup = true;
        if (dup) continue;
        seen.push_back(k);
        out.push_back(item);
    }
    return make_generator("generator", std::move(out));
}

Value f_wordcount(const Value& v, Args& a) {
    a.check("wordcount", 0, {});
    int64_t n = 0;
    bool in_word = false;
    for (char32_t c : u32(v)) {
        const bool w = c == U'_' || is_alnum_cp(c);
        if (w && !in_word) ++n;
        in_word = w;
    }
    return Value::integer(n);
}

struct NamedFilter {
    const char* name;
    FilterFn fn;
};
constexpr NamedFilter kFilters[] = {
    {"abs", f_abs},           {"attr", f_attr},
    {"batch", f_batch},       {"capitalize", f_capitalize},
    {"center", f_center},     {"count", f_length},
    {"d", f_default},         {"default", f_default},
    {"dictsort", f_dictsort}, {"e", f_escape},
    {"escape", f_escape},     {"first", f_first},
    {"float", f_float},       {"forceescape", f_escape},
    {"format", f_format},     {"indent", f_indent},
    {"int", f_int},           {"items", f_items},
    {"join", f_join},         {"last", f_last},
    {"length", f_length},     {"list", f_list},
    {"lower", f_lower},       {"map", f_map},
    {"max", f_max},           {"min", f_min},
    {"reject", f_reject},     {"rejectattr", f_rejectattr},
    {"replace", f_replace},   {"reverse", f_reverse},
    {"round", f_round},       {"safe", f_safe},
    {"select", f_select},     {"selectattr", f_selectattr},
    {"sort", f_sort},         {"string", f_string},
    {"sum", f_sum},           {"title", f_title},
    {"tojson", f_tojson},     {"trim", f_trim},
    {"truncate", f_truncate}, {"unique", f_unique},
    {"upper", f_upper},       {"wordcount", f_wordcount},
};

// --- tests -----------------------------------------------------------------------------------

const Value& test_arg(Args& a, const char* test) {
    if (a.positional.empty()) throw_error(std::string("test '") + test + "' needs an argument");
    return a.positional[0];
}

bool t_defined(const Value& v, Args&) {
    return !v.is_undefined();
}
bool t_undefined(const Value& v, Args&) {
    return v.is_undefined();
}
bool t_none(const Value& v, Args&) {
    return v.is_none();
}
bool t_boolean(const Value& v, Args&) {
    return v.kind() == Kind::kBool;
}
bool t_true(const Value& v, Args&) {
    return v.kind() == Kind::kBool && v.as_bool();
}
bool t_false(const Value& v, Args&) {
    return v.kind() == Kind::kBool && !v.as_bool();
}
bool t_integer(const Value& v, Args&) {
    return v.kind() == Kind::kInt;
}
bool t_float(const Value& v, Args&) {
    return v.kind() == Kind::kFloat;
}
bool t_number(const Value& v, Args&) {
    return v.is_number();
}
bool t_string(const Value& v, Args&) {
    return v.is_string();
}
bool t_mapping(const Value& v, Args&) {
    return v.kind() == Kind::kDict;
}
bool t_sequence(const Value& v, Args&) {
    return v.is_undefined() || v.is_string() || v.is_sequence() || v.kind() == Kind::kDict;
}
bool t_iterable(const Value& v, Args&) {
    return v.is_undefined() || v.is_string() || v.is_sequence() || v.kind() == Kind::kDict ||
           as_generator(v);
}
// Python's callable(): jinja2's Undefined has __call__ (which raises), so it counts.
bool t_callable(const Value& v, Args&) {
    return v.is_undefined() || (v.kind() == Kind::kObject && v.as_object()->callable());
}
bool t_escaped(const Value&, Args&) {
    return false;
}
bool t_lower(const Value& v, Args&) {
    Value out;
    str_predicate(soft_str(v), "islower", out);
    return out.as_bool();
}
bool t_upper(const Value& v, Args&) {
    Value out;
    str_predicate(soft_str(v), "isupper", out);
    return out.as_bool();
}
// Python's `value % m == r` for the odd/even/divisibleby tests (floats included).
bool mod_equals(const Value& v, int64_t m, int64_t r) {
    if (v.is_undefined()) v.fail_undefined();
    if (!v.is_number())
        throw_error(std::string("unsupported operand type(s) for %: '") + v.type_name() +
                    "' and 'int'");
    if (v.kind() == Kind::kFloat) {
        double x = std::fmod(v.as_double(), double(m));
        if (x != 0.0 && ((x < 0) != (m < 0))) x += double(m);
        return x == double(r);
    }
    int64_t x = v.as_int() % m;
    if (x != 0 && ((x < 0) != (m < 0))) x += m;
    return x == r;
}
bool t_odd(const Value& v, Args&) {
    return mod_equals(v, 2, 1);
}
bool t_even(const Value& v, Args&) {
    return mod_equals(v, 2, 0);
}
bool t_divisibleby(const Value& v, Args& a) {
    const int64_t m = need_int(test_arg(a, "divisibleby"), "divisibleby argument");
    if (m == 0) throw_error("integer modulo by zero");
    return mod_equals(v, m, 0);
}
bool t_sameas(const Value& v, Args& a) {
    const Value& o = test_arg(a, "sameas");
    if (v.kind() != o.kind()) return false;
    switch (v.kind()) {
        case Kind::kNone:
        case Kind::kUndefined:
            return true;
        case Kind::kBool:
        case Kind::kInt:
            return v.as_int() == o.as_int();
        case Kind::kObject:
            return v.as_object() == o.as_object();
        default:
            return false;
    }
}
bool t_in(const Value& v, Args& a) {
    return contains(test_arg(a, "in"), v);
}
bool t_eq(const Value& v, Args& a) {
    return equals(v, test_arg(a, "eq"));
}
bool t_ne(const Value& v, Args& a) {
    return !equals(v, test_arg(a, "ne"));
}
bool t_lt(const Value& v, Args& a) {
    return less_than(v, test_arg(a, "lt"));
}
bool t_le(const Value& v, Args& a) {
    const Value& o = test_arg(a, "le");
    return less_than(v, o) || equals(v, o);
}
bool t_gt(const Value& v, Args& a) {
    return less_than(test_arg(a, "gt"), v);
}
bool t_ge(const Value& v, Args& a) {
    const Value& o = test_arg(a, "ge");
    return less_than(o, v) || equals(v, o);
}
bool t_filter(const Value& v, Args&) {
    return v.is_string() && find_filter(v.as_string()) != nullptr;
}
bool t_test(const Value& v, Args&) {
    return v.is_string() && find_test(v.as_string()) != nullptr;
}

struct NamedTest {
    const char* name;
    TestFn fn;
};
constexpr NamedTest kTests[] = {
    {"boolean", t_boolean},
    {"callable", t_callable},
    {"defined", t_defined},
    {"divisibleby", t_divisibleby},
    {"eq", t_eq},
    {"equalto", t_eq},
    {"==", t_eq},
    {"escaped", t_escaped},
    {"even", t_even},
    {"false", t_false},
    {"filter", t_filter},
    {"float", t_float},
    {"ge", t_ge},
    {">=", t_ge},
    {"gt", t_gt},
    {"greaterthan", t_gt},
    {">", t_gt},
    {"in", t_in},
    {"integer", t_integer},
    {"iterable", t_iterable},
    {"le", t_le},
    {"<=", t_le},
    {"lessthan", t_lt},
    {"lower", t_lower},
    {"lt", t_lt},
    {"<", t_lt},
    {"mapping", t_mapping},
    {"ne", t_ne},
    {"!=", t_ne},
    {"none", t_none},
    {"number", t_number},
    {"odd", t_odd},
    {"sameas", t_sameas},
    {"sequence", t_sequence},
    {"string", t_string},
    {"test", t_test},
    {"true", t_true},
    {"undefined", t_undefined},
    {"upper", t_upper},
};

// --- globals ---------------------------------------------------------------------------------

thread_local std::optional<std::tm> g_render_time;

Value g_range(Args& a) {
    a.check("range", 3, {});
    if (a.positional.empty()) throw_error("range expected at least 1 argument, got 0");
    int64_t start = 0, stop, step = 1;
    if (a.positional.size() == 1) {
        stop = need_int(a.positional[0], "range() argument");
    } else {
        start = need_int(a.positional[0], "range() argument");
        stop = need_int(a.positional[1], "range() argument");
        if (a.positional.size() > 2) step = need_int(a.positional[2], "range() argument");
    }
    if (step == 0) throw_error("range() arg 3 must not be zero");
    List out;
    constexpr int64_t kMaxRange = 100000;  // jinja2 sandbox MAX_RANGE
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
        if (int64_t(out.size()) >= kMaxRange)
            throw_error("Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
        out.push_back(Value::integer(i));
    }
    return Value::list(std::move(out));
}

Dict dict_from_args(Args& a, const char* what) {
    Dict d;
    if (a.positional.size() > 1)
        throw_error(std::string(what) + " expected at most 1 positional argument");
    auto put = [&](const Value& k, const Value& v) {
        for (auto& [ek, ev] : d.items) {
            if (equals(ek, k)) {
                ev = v;
                return;
            }
        }
        d.items.emplace_back(k, v);
    };
    if (!a.positional.empty()) {
        const Value& src = a.positional[0];
        if (src.kind() == Kind::kDict) {
            for (const auto& [k, v] : src.as_dict().items) put(k, v);
        } else {
            for (const Value& pair : iterate(src)) {
                std::vector<Value> kv = iterate(pair);
                if (kv.size() != 2) throw_error(std::string(what) + " needs pairs of (key, value)");
                put(kv[0], kv[1]);
            }
        }
    }
    for (auto& [k, v] : a.keyword) put(Value::string(k), v);
    return d;
}

Value g_namespace(Args& a) {
    auto ns = std::make_shared<Namespace>();
    ns->attrs = dict_from_args(a, "namespace()");
    return Value::object(std::move(ns));
}

Value g_dict(Args& a) {
    return Value::dict(dict_from_args(a, "dict()"));
}

Value g_raise_exception(Args& a) {
    std::string msg = a.positional.empty() ? std::string() : a.positional[0].str();
    throw Error{std::move(msg), 0, true};
}

Value g_strftime_now(Args& a) {
    a.check("strftime_now", 1, {});
    if (a.positional.empty()) throw_error("strftime_now() needs a format");
    const std::string& fmt = need_string(a.positional[0], "strftime_now format");
    std::tm tm{};
    if (g_render_time) {
        tm = *g_render_time;
    } else {
        const std::time_t t = std::time(nullptr);
        localtime_r(&t, &tm);
    }
    std::string buf(256 + fmt.size() * 8, '\0');
    const size_t n = fmt.empty() ? 0 : std::strftime(buf.data(), buf.size(), fmt.c_str(), &tm);
    buf.resize(n);
    return Value::string(buf);
}

}  // namespace

FilterFn find_filter(std::string_view name) {
    for (const auto& f : kFilters)
        if (name == f.name) return f.fn;
    return nullptr;
}

TestFn find_test(std::string_view name) {
    for (const auto& t : kTests)
        if (name == t.name) return t.fn;
    return nullptr;
}

Value find_global(std::string_view name) {
    using Fn = Value (*)(Args&);
    static const std::pair<const char*, Fn> kGlobals[] = {
        {"range", g_range},
        {"namespace", g_namespace},
        {"dict", g_dict},
        {"raise_exception", g_raise_exception},
        {"strftime_now", g_strftime_now},
    };
    for (const auto& [n, fn] : kGlobals)
        if (name == n) return Value::object(std::make_shared<Function>(n, fn));
    return Value::undefined(std::string(name));
}

void set_render_time(const std::optional<std::tm>& now) {
    g_render_time = now;
}

}  // namespace lathe::jinja
