#include "tokenizer/jinja_value.h"

#include <utf8proc.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <cstdio>

namespace lathe::jinja {

void throw_error(std::string message) {
    throw Error{std::move(message), 0};
}

// --- Dict ------------------------------------------------------------------------------------

const Value* Dict::find(const Value& key) const {
    if (key.is_string()) return find(std::string_view(key.as_string()));
    for (const auto& [k, v] : items)
        if (equals(k, key)) return &v;
    return nullptr;
}

const Value* Dict::find(std::string_view key) const {
    for (const auto& [k, v] : items)
        if (k.is_string() && k.as_string() == key) return &v;
    return nullptr;
}

// --- Value construction ----------------------------------------------------------------------

Value Value::undefined(std::string hint) {
    Value v;
    if (!hint.empty()) v.str_ = std::make_shared<const std::string>(std::move(hint));
    return v;
}
Value Value::none() {
    Value v;
    v.kind_ = Kind::kNone;
    return v;
}
Value Value::boolean(bool b) {
    Value v;
    v.kind_ = Kind::kBool;
    v.b_ = b;
    return v;
}
Value Value::integer(int64_t i) {
    Value v;
    v.kind_ = Kind::kInt;
    v.i_ = i;
    return v;
}
Value Value::floating(double f) {
    Value v;
    v.kind_ = Kind::kFloat;
    v.f_ = f;
    return v;
}
void check_string_size(uint64_t bytes) {
    if (bytes > kMaxStringBytes)
        throw_error("string result too large (" + std::to_string(bytes) + " bytes; at most " +
                    std::to_string(kMaxStringBytes) + ")");
}

Value Value::string(std::string s) {
    check_string_size(s.size());
    return input_string(std::move(s));
}

Value Value::input_string(std::string s) {
    Value v;
    v.kind_ = Kind::kString;
    v.str_ = std::make_shared<const std::string>(std::move(s));
    return v;
}
Value Value::list(List items) {
    Value v;
    v.kind_ = Kind::kList;
    v.list_ = std::make_shared<const List>(std::move(items));
    return v;
}
Value Value::tuple(List items) {
    Value v;
    v.kind_ = Kind::kTuple;
    v.list_ = std::make_shared<const List>(std::move(items));
    return v;
}
Value Value::dict(Dict d) {
    Value v;
    v.kind_ = Kind::kDict;
    v.dict_ = std::make_shared<const Dict>(std::move(d));
    return v;
}
Value Value::object(std::shared_ptr<Object> o) {
    Value v;
    v.kind_ = Kind::kObject;
    v.obj_ = std::move(o);
    return v;
}

Value Value::from_json(const Json& j) {
    switch (j.type()) {
        case Json::value_t::null:
            return none();
        case Json::value_t::boolean:
            return boolean(j.get<bool>());
        case Json::value_t::number_integer:
            return integer(j.get<int64_t>());
        case Json::value_t::number_unsigned: {
            const uint64_t u = j.get<uint64_t>();
            // Python ints are unbounded; beyond int64 we keep the nearest double.
            if (u > uint64_t(INT64_MAX)) return floating(double(u));
            return integer(int64_t(u));
        }
        case Json::value_t::number_float:
            return floating(j.get<double>());
        case Json::value_t::string:
            return input_string(j.get<std::string>());
        case Json::value_t::array: {
            List items;
            items.reserve(j.size());
            for (const auto& e : j) items.push_back(from_json(e));
            return list(std::move(items));
        }
        case Json::value_t::object: {
            Dict d;
            d.items.reserve(j.size());
            for (const auto& [k, e] : j.items())
                d.items.emplace_back(input_string(k), from_json(e));
            return dict(std::move(d));
        }
        default:
            return undefined("a JSON value of an unsupported type");
    }
}

double Value::as_double() const {
    switch (kind_) {
        case Kind::kFloat:
            return f_;
        case Kind::kInt:
            return double(i_);
        case Kind::kBool:
            return b_ ? 1.0 : 0.0;
        default:
            return 0.0;
    }
}

const std::string& Value::undefined_hint() const {
    static const std::string kUnknown = "a value";
    return str_ ? *str_ : kUnknown;
}

void Value::fail_undefined() const {
    const std::string& h = undefined_hint();
    // Hints are either a bare variable name or a full sentence ("'dict object' has no ...").
    if (h.find(' ') == std::string::npos) throw_error("'" + h + "' is undefined");
    throw_error(h);
}

bool Value::truthy() const {
    switch (kind_) {
        case Kind::kUndefined:
        case Kind::kNone:
            return false;
        case Kind::kBool:
            return b_;
        case Kind::kInt:
            return i_ != 0;
        case Kind::kFloat:
            return f_ != 0.0;
        case Kind::kString:
            return !str_->empty();
        case Kind::kList:
        case Kind::kTuple:
            return !list_->empty();
        case Kind::kDict:
            return !dict_->items.empty();
        case Kind::kObject:
            return true;
    }
    return false;
}

const char* Value::type_name() const {
    switch (kind_) {
        case Kind::kUndefined:
            return "Undefined";
        case Kind::kNone:
            return "NoneType";
        case Kind::kBool:
            return "bool";
        case Kind::kInt:
            return "int";
        case Kind::kFloat:
            return "float";
        case Kind::kString:
            return "str";
        case Kind::kList:
            return "list";
        case Kind::kTuple:
            return "tuple";
        case Kind::kDict:
            return "dict";
        case Kind::kObject:
            return obj_->type_name();
    }
    return "object";
}

// --- str() / repr() --------------------------------------------------------------------------

std::string float_repr(double f) {
    if (std::isnan(f)) return "nan";
    if (std::isinf(f)) return f < 0 ? "-inf" : "inf";
    // The shortest digits that round-trip, as Python's repr picks them, then Python's layout:
    // positional for exponents in [-4, 16), scientific otherwise, always with a '.0' or exponent.
    std::array<char, 64> buf;
    auto res = std::to_chars(buf.data(), buf.data() + buf.size(), f, std::chars_format::scientific);
    std::string sci(buf.data(), res.ptr);
    std::string out;
    size_t pos = 0;
    if (sci[0] == '-') {
        out = "-";
        pos = 1;
    }
    const size_t e = sci.find('e');
    std::string digits;
    for (size_t i = pos; i < e; ++i)
        if (sci[i] != '.') digits += sci[i];
    int exponent = 0;
    const size_t exp_start =
        e + 1 + (sci[e + 1] == '+' ? 1 : 0);  // from_chars takes '-' but not '+'
    std::from_chars(sci.data() + exp_start, sci.data() + sci.size(), exponent);
    while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
    const int decpt = exponent + 1;
    const int nd = int(digits.size());
    if (decpt <= -4 || decpt > 16) {
        out += digits[0];
        if (nd > 1) out += "." + digits.substr(1);
        char eb[16];
        std::snprintf(eb, sizeof eb, "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
        out += eb;
    } else if (decpt <= 0) {
        out += "0." + std::string(size_t(-decpt), '0') + digits;
    } else if (decpt >= nd) {
        out += digits + std::string(size_t(decpt - nd), '0') + ".0";
    } else {
        out += digits.substr(0, size_t(decpt)) + "." + digits.substr(size_t(decpt));
    }
    return out;
}

namespace {

bool py_isprintable(char32_t c) {
    if (c == U' ') return true;
    switch (utf8proc_category(utf8proc_int32_t(c))) {
        case UTF8PROC_CATEGORY_CC:
        case UTF8PROC_CATEGORY_CF:
        case UTF8PROC_CATEGORY_CS:
        case UTF8PROC_CATEGORY_CO:
        case UTF8PROC_CATEGORY_CN:
        case UTF8PROC_CATEGORY_ZL:
        case UTF8PROC_CATEGORY_ZP:
        case UTF8PROC_CATEGORY_ZS:
            return false;
        default:
            return true;
    }
}

void append_string_repr(std::string& out, const std::string& s) {
    const bool has_single = s.find('\'') != std::string::npos;
    const bool has_double = s.find('"') != std::string::npos;
    const char quote = (has_single && !has_double) ? '"' : '\'';
    out += quote;
    char buf[16];
    for (char32_t c : utf8_decode(s)) {
        if (c == char32_t(quote) || c == U'\\') {
            out += '\\';
            out += char(c);
        } else if (c == U'\t') {
            out += "\\t";
        } else if (c == U'\n') {
            out += "\\n";
        } else if (c == U'\r') {
            out += "\\r";
        } else if (c < 0x20 || c == 0x7f) {
            std::snprintf(buf, sizeof buf, "\\x%02x", unsigned(c));
            out += buf;
        } else if (c < 0x7f || py_isprintable(c)) {
            utf8_append(out, c);
        } else if (c <= 0xff) {
            std::snprintf(buf, sizeof buf, "\\x%02x", unsigned(c));
            out += buf;
        } else if (c <= 0xffff) {
            std::snprintf(buf, sizeof buf, "\\u%04x", unsigned(c));
            out += buf;
        } else {
            std::snprintf(buf, sizeof buf, "\\U%08x", unsigned(c));
            out += buf;
        }
    }
    out += quote;
}

}  // namespace

void Value::append_str(std::string& out) const {
    switch (kind_) {
        case Kind::kUndefined:
            return;
        case Kind::kString:
            out += *str_;
            return;
        default:
            append_repr(out);
    }
}

void Value::append_repr(std::string& out) const {
    switch (kind_) {
        case Kind::kUndefined:
            out += "Undefined";
            return;
        case Kind::kNone:
            out += "None";
            return;
        case Kind::kBool:
            out += b_ ? "True" : "False";
            return;
        case Kind::kInt:
            out += std::to_string(i_);
            return;
        case Kind::kFloat:
            out += float_repr(f_);
            return;
        case Kind::kString:
            append_string_repr(out, *str_);
            return;
        case Kind::kList:
        case Kind::kTuple: {
            const bool tup = kind_ == Kind::kTuple;
            out += tup ? '(' : '[';
            for (size_t i = 0; i < list_->size(); ++i) {
                if (i) out += ", ";
                (*list_)[i].append_repr(out);
            }
            if (tup && list_->size() == 1) out += ',';
            out += tup ? ')' : ']';
            return;
        }
        case Kind::kDict: {
            out += '{';
            bool first = true;
            for (const auto& [k, v] : dict_->items) {
                if (!first) out += ", ";
                first = false;
                k.append_repr(out);
                out += ": ";
                v.append_repr(out);
            }
            out += '}';
            return;
        }
        case Kind::kObject:
            out += obj_->repr();
            return;
    }
}

std::string Value::str() const {
    std::string out;
    append_str(out);
    return out;
}

std::string Value::repr() const {
    std::string out;
    append_repr(out);
    return out;
}

// --- comparison ------------------------------------------------------------------------------

bool equals(const Value& a, const Value& b) {
    if (a.is_number() && b.is_number()) {
        if (a.kind() != Kind::kFloat && b.kind() != Kind::kFloat) return a.as_int() == b.as_int();
        return a.as_double() == b.as_double();
    }
    if (a.kind() != b.kind()) return false;
    switch (a.kind()) {
        case Kind::kUndefined:
        case Kind::kNone:
            return true;
        case Kind::kString:
            return a.as_string() == b.as_string();
        case Kind::kList:
        case Kind::kTuple: {
            const List& x = a.as_list();
            const List& y = b.as_list();
            if (x.size() != y.size()) return false;
            for (size_t i = 0; i < x.size(); ++i)
                if (!equals(x[i], y[i])) return false;
            return true;
        }
        case Kind::kDict: {
            const Dict& x = a.as_dict();
            const Dict& y = b.as_dict();
            if (x.items.size() != y.items.size()) return false;
            for (const auto& [k, v] : x.items) {
                const Value* other = y.find(k);
                if (!other || !equals(v, *other)) return false;
            }
            return true;
        }
        case Kind::kObject:
            return a.as_object() == b.as_object();
        default:
            return false;
    }
}

bool less_than(const Value& a, const Value& b) {
    if (a.is_undefined()) a.fail_undefined();
    if (b.is_undefined()) b.fail_undefined();
    if (a.is_number() && b.is_number()) {
        if (a.kind() != Kind::kFloat && b.kind() != Kind::kFloat) return a.as_int() < b.as_int();
        return a.as_double() < b.as_double();
    }
    if (a.is_string() && b.is_string()) return a.as_string() < b.as_string();  // code point order
    if (a.kind() == b.kind() && a.is_sequence()) {
        const List& x = a.as_list();
        const List& y = b.as_list();
        for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
            if (!equals(x[i], y[i])) return less_than(x[i], y[i]);
        }
        return x.size() < y.size();
    }
    throw_error(std::string("'<' not supported between instances of '") + a.type_name() +
                "' and '" + b.type_name() + "'");
}

// --- Args, Object ----------------------------------------------------------------------------

const Value* Args::get(size_t index, std::string_view name) const {
    for (const auto& [k, v] : keyword)
        if (k == name) return &v;
    if (index < positional.size()) return &positional[index];
    return nullptr;
}

void Args::check(std::string_view function, size_t max_positional,
                 std::initializer_list<std::string_view> keywords) const {
    if (positional.size() > max_positional)
        throw_error(std::string(function) + "() takes at most " + std::to_string(max_positional) +
                    " positional argument(s), " + std::to_string(positional.size()) + " given");
    for (const auto& [k, v] : keyword) {
        if (std::find(keywords.begin(), keywords.end(), k) == keywords.end())
            throw_error(std::string(function) + "() got an unexpected keyword argument '" + k +
                        "'");
    }
}

Value Object::get_attr(std::string_view name) const {
    return Value::undefined(std::string("'") + type_name() + "' object has no attribute '" +
                            std::string(name) + "'");
}
bool Object::set_attr(std::string_view, Value) {
    return false;
}
Value Object::call(Args&) {
    throw_error(std::string("'") + type_name() + "' object is not callable");
}
std::string Object::repr() const {
    return std::string("<") + type_name() + " object>";
}

Value Namespace::get_attr(std::string_view name) const {
    if (const Value* v = attrs.find(name)) return *v;
    return Object::get_attr(name);
}

bool Namespace::set_attr(std::string_view name, Value v) {
    for (auto& [k, old] : attrs.items) {
        if (k.is_string() && k.as_string() == name) {
            old = std::move(v);
            return true;
        }
    }
    attrs.items.emplace_back(Value::string(std::string(name)), std::move(v));
    return true;
}

std::string Namespace::repr() const {
    std::string out = "<Namespace ";
    Value::dict(attrs).append_repr(out);
    out += '>';
    return out;
}

// --- json.dumps ------------------------------------------------------------------------------

namespace {

void json_escape_string(std::string& out, const std::string& s, bool ensure_ascii) {
    out += '"';
    char buf[16];
    for (char32_t c : utf8_decode(s)) {
        switch (c) {
            case U'"':
                out += "\\\"";
                continue;
            case U'\\':
                out += "\\\\";
                continue;
            case U'\n':
                out += "\\n";
                continue;
            case U'\r':
                out += "\\r";
                continue;
            case U'\t':
                out += "\\t";
                continue;
            case U'\b':
                out += "\\b";
                continue;
            case U'\f':
                out += "\\f";
                continue;
            default:
                break;
        }
        if (c < 0x20 || (ensure_ascii && c >= 0x7f)) {
            if (c > 0xffff) {  // a UTF-16 surrogate pair, as Python writes it
                const char32_t v = c - 0x10000;
                std::snprintf(buf, sizeof buf, "\\u%04x\\u%04x", unsigned(0xd800 | (v >> 10)),
                              unsigned(0xdc00 | (v & 0x3ff)));
            } else {
                std::snprintf(buf, sizeof buf, "\\u%04x", unsigned(c));
            }
            out += buf;
        } else {
            utf8_append(out, c);
        }
    }
    out += '"';
}

std::string json_float(double f) {
    if (std::isnan(f)) return "NaN";
    if (std::isinf(f)) return f < 0 ? "-Infinity" : "Infinity";
    return float_repr(f);
}

std::string json_key(const Value& k) {
    switch (k.kind()) {
        case Kind::kString:
            return k.as_string();
        case Kind::kBool:
            return k.as_bool() ? "true" : "false";
        case Kind::kNone:
            return "null";
        case Kind::kInt:
            return std::to_string(k.as_int());
        case Kind::kFloat:
            return json_float(k.as_double());
        default:
            throw_error(std::string("keys must be str, int, float, bool or None, not ") +
                        k.type_name());
    }
}

struct JsonWriter {
    const JsonDumpOptions& opt;
    std::string indent_unit;
    std::string item_sep;
    std::string key_sep;
    std::string out;

    void newline(int level) {
        out += '\n';
        for (int i = 0; i < level; ++i) out += indent_unit;
    }

    void write(const Value& v, int level) {
        switch (v.kind()) {
            case Kind::kNone:
                out += "null";
                return;
            case Kind::kBool:
                out += v.as_bool() ? "true" : "false";
                return;
            case Kind::kInt:
                out += std::to_string(v.as_int());
                return;
            case Kind::kFloat:
                out += json_float(v.as_double());
                return;
            case Kind::kString:
                json_escape_string(out, v.as_string(), opt.ensure_ascii);
                return;
            case Kind::kList:
            case Kind::kTuple: {
                const List& l = v.as_list();
                if (l.empty()) {
                    out += "[]";
                    return;
                }
                out += '[';
                if (opt.has_indent) newline(level + 1);
                for (size_t i = 0; i < l.size(); ++i) {
                    if (i) {
                        out += item_sep;
                        if (opt.has_indent) newline(level + 1);
                    }
                    write(l[i], level + 1);
                }
                if (opt.has_indent) newline(level);
                out += ']';
                return;
            }
            case Kind::kDict: {
                const Dict& d = v.as_dict();
                if (d.items.empty()) {
                    out += "{}";
                    return;
                }
                std::vector<std::pair<std::string, const Value*>> entries;
                entries.reserve(d.items.size());
                for (const auto& [k, e] : d.items) entries.emplace_back(json_key(k), &e);
                if (opt.sort_keys)
                    std::stable_sort(
                        entries.begin(), entries.end(),
                        [](const auto& a, const auto& b) { return a.first < b.first; });
                out += '{';
                if (opt.has_indent) newline(level + 1);
                for (size_t i = 0; i < entries.size(); ++i) {
                    if (i) {
                        out += item_sep;
                        if (opt.has_indent) newline(level + 1);
                    }
                    json_escape_string(out, entries[i].first, opt.ensure_ascii);
                    out += key_sep;
                    write(*entries[i].second, level + 1);
                }
                if (opt.has_indent) newline(level);
                out += '}';
                return;
            }
            default:
                throw_error(std::string("Object of type ") + v.type_name() +
                            " is not JSON serializable");
        }
    }
};

}  // namespace

std::string json_dumps(const Value& v, const JsonDumpOptions& options) {
    JsonWriter w{options, {}, {}, {}, {}};
    if (options.has_indent)
        w.indent_unit =
            options.indent >= 0 ? std::string(size_t(options.indent), ' ') : options.indent_str;
    if (options.has_separators) {
        w.item_sep = options.item_separator;
        w.key_sep = options.key_separator;
    } else {
        w.item_sep = options.has_indent ? "," : ", ";
        w.key_sep = ": ";
    }
    w.write(v, 0);
    return std::move(w.out);
}

// --- UTF-8 and Python string functions -------------------------------------------------------

std::u32string utf8_decode(std::string_view s) {
    std::u32string out;
    out.reserve(s.size());
    size_t i = 0;
    while (i < s.size()) {
        const auto b = static_cast<unsigned char>(s[i]);
        char32_t c;
        size_t n;
        if (b < 0x80) {
            c = b;
            n = 1;
        } else if ((b >> 5) == 6) {
            c = b & 0x1f;
            n = 2;
        } else if ((b >> 4) == 14) {
            c = b & 0x0f;
            n = 3;
        } else if ((b >> 3) == 30) {
            c = b & 0x07;
            n = 4;
        } else {
            c = 0xfffd;  // not reachable for validated input
            n = 1;
        }
        if (i + n > s.size()) n = s.size() - i;
        for (size_t k = 1; k < n; ++k) c = (c << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3f);
        out.push_back(c);
        i += n;
    }
    return out;
}

void utf8_append(std::string& out, char32_t c) {
    if (c < 0x80) {
        out += char(c);
    } else if (c < 0x800) {
        out += char(0xc0 | (c >> 6));
        out += char(0x80 | (c & 0x3f));
    } else if (c < 0x10000) {
        out += char(0xe0 | (c >> 12));
        out += char(0x80 | ((c >> 6) & 0x3f));
        out += char(0x80 | (c & 0x3f));
    } else {
        out += char(0xf0 | (c >> 18));
        out += char(0x80 | ((c >> 12) & 0x3f));
        out += char(0x80 | ((c >> 6) & 0x3f));
        out += char(0x80 | (c & 0x3f));
    }
}

std::string utf8_encode(std::u32string_view s) {
    std::string out;
    out.reserve(s.size());
    for (char32_t c : s) utf8_append(out, c);
    return out;
}

size_t utf8_length(std::string_view s) {
    size_t n = 0;
    for (char ch : s)
        if ((static_cast<unsigned char>(ch) & 0xc0) != 0x80) ++n;
    return n;
}

bool py_isspace(char32_t c) {
    switch (c) {
        case 0x09:
        case 0x0a:
        case 0x0b:
        case 0x0c:
        case 0x0d:
        case 0x1c:
        case 0x1d:
        case 0x1e:
        case 0x1f:
        case 0x20:
        case 0x85:
        case 0xa0:
        case 0x1680:
        case 0x2028:
        case 0x2029:
        case 0x202f:
        case 0x205f:
        case 0x3000:
            return true;
        default:
            return c >= 0x2000 && c <= 0x200a;
    }
}

namespace {

struct SpecialCase {
    char32_t from;
    std::array<char32_t, 3> to;
};
#include "tokenizer/jinja_unicode_tables.inc"

template <size_t N>
bool append_special(std::string& out, char32_t c, const SpecialCase (&table)[N]) {
    const auto* it = std::lower_bound(std::begin(table), std::end(table), c,
                                      [](const SpecialCase& s, char32_t v) { return s.from < v; });
    if (it == std::end(table) || it->from != c) return false;
    for (char32_t t : it->to)
        if (t) utf8_append(out, t);
    return true;
}

void append_upper(std::string& out, char32_t c) {
    if (!append_special(out, c, kSpecialUpper))
        utf8_append(out, char32_t(utf8proc_toupper(int32_t(c))));
}
void append_lower(std::string& out, char32_t c) {
    if (!append_special(out, c, kSpecialLower))
        utf8_append(out, char32_t(utf8proc_tolower(int32_t(c))));
}
void append_title(std::string& out, char32_t c) {
    if (!append_special(out, c, kSpecialTitle))
        utf8_append(out, char32_t(utf8proc_totitle(int32_t(c))));
}

bool is_cased(char32_t c) {
    const auto cat = utf8proc_category(int32_t(c));
    return cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LL ||
           cat == UTF8PROC_CATEGORY_LT;
}

bool is_case_ignorable(char32_t c) {
    const auto cat = utf8proc_category(int32_t(c));
    return cat == UTF8PROC_CATEGORY_MN || cat == UTF8PROC_CATEGORY_ME ||
           cat == UTF8PROC_CATEGORY_CF || cat == UTF8PROC_CATEGORY_LM ||
           cat == UTF8PROC_CATEGORY_SK || c == U'\'' || c == U'.' || c == U':' || c == 0xb7 ||
           c == 0x2019;
}

// Python lowers capital sigma to final sigma at the end of a word (Unicode's Final_Sigma rule).
bool final_sigma(const std::u32string& s, size_t i) {
    size_t j = i;
    bool before = false;
    while (j > 0) {
        --j;
        if (is_case_ignorable(s[j])) continue;
        before = is_cased(s[j]);
        break;
    }
    if (!before) return false;
    for (size_t k = i + 1; k < s.size(); ++k) {
        if (is_case_ignorable(s[k])) continue;
        return !is_cased(s[k]);
    }
    return true;
}

}  // namespace

std::string py_upper(std::string_view s) {
    std::string out;
    out.reserve(s.size());
    for (char32_t c : utf8_decode(s)) append_upper(out, c);
    return out;
}

std::string py_lower(std::string_view s) {
    std::string out;
    out.reserve(s.size());
    const std::u32string u = utf8_decode(s);
    for (size_t i = 0; i < u.size(); ++i) {
        if (u[i] == 0x3a3 && final_sigma(u, i))
            utf8_append(out, 0x3c2);
        else
            append_lower(out, u[i]);
    }
    return out;
}

std::string py_capitalize(std::string_view s) {
    std::string out;
    const std::u32string u = utf8_decode(s);
    for (size_t i = 0; i < u.size(); ++i) {
        if (i == 0)
            append_title(out, u[i]);
        else if (u[i] == 0x3a3 && final_sigma(u, i))
            utf8_append(out, 0x3c2);
        else
            append_lower(out, u[i]);
    }
    return out;
}

std::string py_strip(std::string_view s, const std::string* chars, bool left, bool right) {
    const std::u32string u = utf8_decode(s);
    const std::u32string set = chars ? utf8_decode(*chars) : std::u32string();
    auto strip_it = [&](char32_t c) {
        return chars ? set.find(c) != std::u32string::npos : py_isspace(c);
    };
    size_t b = 0, e = u.size();
    if (left)
        while (b < e && strip_it(u[b])) ++b;
    if (right)
        while (e > b && strip_it(u[e - 1])) --e;
    return utf8_encode(std::u32string_view(u).substr(b, e - b));
}

std::string py_title(std::string_view s) {
    std::string out;
    bool prev_cased = false;
    for (char32_t c : utf8_decode(s)) {
        if (prev_cased)
            append_lower(out, c);
        else
            append_title(out, c);
        prev_cased = is_cased(c);
    }
    return out;
}

}  // namespace lathe::jinja
