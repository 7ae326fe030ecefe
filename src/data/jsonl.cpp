#include "data/jsonl.h"

#include <simdjson.h>

#include <cstring>
#include <optional>
#include <vector>

#include "core/strings.h"
#include "io/input.h"
#include "io/json.h"
#include "tokenizer/utf8.h"

namespace lathe {

namespace od = simdjson::ondemand;

namespace {

const char* json_type_name(od::json_type t) {
    switch (t) {
        case od::json_type::array:
            return "an array";
        case od::json_type::object:
            return "an object";
        case od::json_type::number:
            return "a number";
        case od::json_type::string:
            return "a string";
        case od::json_type::boolean:
            return "a boolean";
        case od::json_type::null:
            return "null";
    }
    return "?";
}

// RFC 8259 number grammar: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
bool is_json_number(std::string_view s) {
    while (!s.empty() &&
           (s.back() == ' ' || s.back() == '\t' || s.back() == '\n' || s.back() == '\r')) {
        s.remove_suffix(1);
    }
    size_t i = 0;
    const auto digit = [&](size_t k) { return k < s.size() && s[k] >= '0' && s[k] <= '9'; };
    if (i < s.size() && s[i] == '-') ++i;
    if (!digit(i)) return false;
    if (s[i] == '0') {
        ++i;
    } else {
        while (digit(i)) ++i;
    }
    if (i < s.size() && s[i] == '.') {
        ++i;
        if (!digit(i)) return false;
        while (digit(i)) ++i;
    }
    if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
        ++i;
        if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
        if (!digit(i)) return false;
        while (digit(i)) ++i;
    }
    return i == s.size();
}

// Visits every value below `v` so that the whole line is checked, not only what is used.
// On-Demand parses lazily: a value that is skipped is only checked structurally.
simdjson::error_code validate_value(od::value v) {
    od::json_type t;
    if (auto e = v.type().get(t)) return e;
    switch (t) {
        case od::json_type::array: {
            od::array a;
            if (auto e = v.get_array().get(a)) return e;
            for (auto element : a) {
                od::value ev;
                if (auto e = element.get(ev)) return e;
                if (auto e = validate_value(ev)) return e;
            }
            return simdjson::SUCCESS;
        }
        case od::json_type::object: {
            od::object o;
            if (auto e = v.get_object().get(o)) return e;
            for (auto field : o) {
                od::field f;
                if (auto e = std::move(field).get(f)) return e;
                std::string_view k;
                if (auto e = f.unescaped_key().get(k)) return e;
                if (auto e = validate_value(f.value())) return e;
            }
            return simdjson::SUCCESS;
        }
        case od::json_type::number: {
            std::string_view raw = v.raw_json_token();
            return is_json_number(raw) ? simdjson::SUCCESS : simdjson::NUMBER_ERROR;
        }
        case od::json_type::string: {
            std::string_view s;
            return v.get_string().get(s);
        }
        case od::json_type::boolean: {
            bool b;
            return v.get_bool().get(b) ? simdjson::T_ATOM_ERROR : simdjson::SUCCESS;
        }
        case od::json_type::null: {
            bool is_null = false;
            if (auto e = v.is_null().get(is_null)) return e;
            return is_null ? simdjson::SUCCESS : simdjson::N_ATOM_ERROR;
        }
    }
    return simdjson::INCORRECT_TYPE;
}

}  // namespace

struct JsonlFieldReader::Impl {
    od::parser parser;
    std::string buffer;  // the line followed by SIMDJSON_PADDING bytes

    od::document doc;
    // Parses `line`; on failure returns the message for the caller.
    Result<od::document*> iterate(std::string_view line) {
        buffer.resize(line.size() + simdjson::SIMDJSON_PADDING);
        std::memcpy(buffer.data(), line.data(), line.size());
        std::memset(buffer.data() + line.size(), 0, simdjson::SIMDJSON_PADDING);
        if (auto e = parser.iterate(buffer.data(), line.size(), buffer.size()).get(doc)) {
            return json_error(e, line, nullptr);
        }
        return &doc;
    }

    // An error message for a simdjson failure on `line`, with a byte column where known.
    Status json_error(simdjson::error_code e, std::string_view line, od::document* d) {
        if (e == simdjson::UTF8_ERROR) {
            if (const std::optional<utf8::InvalidAt> bad = utf8::find_invalid(line)) {
                return invalid_argument_error(
                    "invalid UTF-8 at byte column {} (byte 0x{:02x}); the input must be UTF-8",
                    bad->column, bad->byte);
            }
            return invalid_argument_error("invalid UTF-8; the input must be UTF-8");
        }
        std::string where;
        // Where an object or array is left open, the position simdjson reports is its start,
        // which points nowhere useful; say nothing then.
        if (d != nullptr && e != simdjson::INCOMPLETE_ARRAY_OR_OBJECT) {
            const char* loc = nullptr;
            if (!d->current_location().get(loc) && loc >= buffer.data() &&
                loc <= buffer.data() + line.size()) {
                where = fmt::format(" near byte column {}", loc - buffer.data() + 1);
            }
        }
        if (e == simdjson::STRING_ERROR) {
            return invalid_argument_error(
                "not valid JSON{}: a string has an invalid escape or an unpaired \\uD800-\\uDFFF "
                "surrogate",
                where);
        }
        if (e == simdjson::NUMBER_ERROR) {
            return invalid_argument_error("not valid JSON{}: a malformed number", where);
        }
        return invalid_argument_error("not valid JSON{}: {}", where, simdjson::error_message(e));
    }
};

JsonlFieldReader::JsonlFieldReader(std::string key)
    : key_(std::move(key)), impl_(std::make_unique<Impl>()) {}
JsonlFieldReader::JsonlFieldReader(JsonlFieldReader&&) noexcept = default;
JsonlFieldReader& JsonlFieldReader::operator=(JsonlFieldReader&&) noexcept = default;
JsonlFieldReader::~JsonlFieldReader() = default;

Result<std::string_view> JsonlFieldReader::extract(std::string_view line) {
    if (is_blank_line(line)) {
        return invalid_argument_error("empty line, expected a JSON object with a \"{}\" field",
                                      key_);
    }
    Impl& m = *impl_;
    LATHE_ASSIGN_OR_RETURN(od::document * doc, m.iterate(line));
    od::json_type top;
    if (auto e = doc->type().get(top)) return m.json_error(e, line, doc);
    if (top != od::json_type::object) {
        // On-demand parsing types a value by its first byte ("not json" reads as a null, "12abc"
        // as a number): a line that is not JSON at all says so (an array is one by its '[').
        if (top != od::json_type::array) {
            const std::string problem = json_problem(line);
            if (!problem.empty()) return invalid_argument_error("not valid JSON: {}", problem);
        }
        return invalid_argument_error("expected a JSON object with a \"{}\" field, found {}", key_,
                                      json_type_name(top));
    }
    od::object obj;
    if (auto e = doc->get_object().get(obj)) return m.json_error(e, line, doc);

    bool has_text = false;
    std::string_view text;
    bool has_wrong_type = false;  // the last value of the key is not a string
    od::json_type wrong_type = od::json_type::null;
    std::vector<std::string> keys;
    size_t key_count = 0;
    for (auto field_result : obj) {
        od::field field;
        if (auto e = std::move(field_result).get(field)) return m.json_error(e, line, doc);
        std::string_view k;
        if (auto e = field.unescaped_key().get(k)) return m.json_error(e, line, doc);
        ++key_count;
        if (keys.size() < 8) keys.emplace_back(k);
        od::value v = field.value();
        if (k == key_) {
            od::json_type t;
            if (auto e = v.type().get(t)) return m.json_error(e, line, doc);
            if (t == od::json_type::string) {
                std::string_view s;
                if (auto e = v.get_string().get(s)) return m.json_error(e, line, doc);
                text = s;
                has_text = true;
                has_wrong_type = false;
                continue;
            }
            wrong_type = t;
            has_wrong_type = true;
            has_text = false;
        }
        if (auto e = validate_value(v)) return m.json_error(e, line, doc);
    }
    // On-Demand reports no position once the whole document is consumed; a position here means
    // text follows the object.
    const char* rest = nullptr;
    if (doc->current_location().get(rest) == simdjson::SUCCESS) {
        return invalid_argument_error("not valid JSON: unexpected text after the object");
    }
    if (has_wrong_type) {
        return invalid_argument_error("field \"{}\" is {}, expected a string", key_,
                                      json_type_name(wrong_type));
    }
    if (!has_text) {
        std::string listed;
        for (const std::string& k : keys) {
            if (!listed.empty()) listed += ", ";
            listed += "\"" + escape_for_message(k, 40) + "\"";
        }
        if (key_count > keys.size()) listed += ", ...";
        return invalid_argument_error("no \"{}\" field (the object has {})", key_,
                                      key_count == 0 ? std::string("no keys") : "keys " + listed);
    }
    return text;
}

bool JsonlFieldReader::has_field(std::string_view line, std::string_view key) {
    Impl& m = *impl_;
    auto doc = m.iterate(line);
    if (!doc.ok()) return false;
    od::object obj;
    if ((*doc)->get_object().get(obj)) return false;
    for (auto field_result : obj) {
        od::field field;
        if (std::move(field_result).get(field)) return false;
        std::string_view k;
        if (field.unescaped_key().get(k)) return false;
        if (k == key) return true;
    }
    return false;
}

}  // namespace lathe
