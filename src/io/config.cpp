#include "io/config.h"

#include <fmt/format.h>

#include <charconv>
#include <cmath>

#include "core/check.h"
#include "core/strings.h"
#include "io/file.h"

namespace lathe {

const char* config_type_name(ConfigType type) {
    switch (type) {
        case ConfigType::kInt:
            return "an integer";
        case ConfigType::kFloat:
            return "a number";
        case ConfigType::kBool:
            return "a boolean (true/false)";
        case ConfigType::kString:
            return "a string";
        case ConfigType::kStringList:
            return "a string or a list of strings";
        case ConfigType::kFloatList:
            return "a list of numbers";
    }
    return "?";
}

ConfigSchema& ConfigSchema::add(ConfigKey key) {
    LATHE_CHECK(find(key.name) == nullptr, "duplicate config key {}", key.name);
    keys_.push_back(std::move(key));
    return *this;
}

const ConfigKey* ConfigSchema::find(std::string_view name) const {
    for (const ConfigKey& k : keys_) {
        if (k.name == name) return &k;
    }
    return nullptr;
}

std::vector<std::string> ConfigSchema::names() const {
    std::vector<std::string> out;
    out.reserve(keys_.size());
    for (const ConfigKey& k : keys_) out.push_back(k.name);
    return out;
}

namespace {

bool is_digit_in_base(char c, int base) {
    if (c >= '0' && c <= '9') return c - '0' < base;
    if (base == 16) return (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
    return false;
}

bool all_digits(std::string_view s, int base) {
    if (s.empty()) return false;
    for (char c : s) {
        if (!is_digit_in_base(c, base)) return false;
    }
    return true;
}

size_t count_digits(std::string_view s, size_t i) {
    size_t n = 0;
    while (i + n < s.size() && s[i + n] >= '0' && s[i + n] <= '9') ++n;
    return n;
}

// [-+]? ( \. [0-9]+ | [0-9]+ ( \. [0-9]* )? ) ( [eE] [-+]? [0-9]+ )?
bool matches_core_float(std::string_view s) {
    size_t i = 0;
    if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
    const size_t int_digits = count_digits(s, i);
    i += int_digits;
    size_t frac_digits = 0;
    if (i < s.size() && s[i] == '.') {
        ++i;
        frac_digits = count_digits(s, i);
        i += frac_digits;
    }
    if (int_digits == 0 && frac_digits == 0) return false;
    if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
        ++i;
        if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
        const size_t exp_digits = count_digits(s, i);
        if (exp_digits == 0) return false;
        i += exp_digits;
    }
    return i == s.size();
}

// For a core float that from_chars finds out of range: true when it is too large (rather than
// too close to zero), from the position of its first significant digit and its exponent.
bool core_float_overflows(std::string_view s) {
    size_t i = (s[0] == '+' || s[0] == '-') ? 1 : 0;
    int64_t magnitude = 0;  // decimal exponent of the first significant digit
    bool found = false;
    int64_t int_digits = 0;
    for (; i < s.size() && s[i] >= '0' && s[i] <= '9'; ++i, ++int_digits) {
        if (!found && s[i] != '0') {
            found = true;
            magnitude = -int_digits;  // completed by int_digits - 1 below
        }
    }
    if (found) magnitude += int_digits - 1;
    if (i < s.size() && s[i] == '.') {
        ++i;
        for (int64_t k = 1; i < s.size() && s[i] >= '0' && s[i] <= '9'; ++i, ++k) {
            if (!found && s[i] != '0') {
                found = true;
                magnitude = -k;
            }
        }
    }
    if (!found) return false;  // zero
    int64_t exponent = 0;
    if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
        ++i;
        const bool negative = s[i] == '-';
        if (s[i] == '+' || s[i] == '-') ++i;
        for (; i < s.size(); ++i)
            exponent = std::min<int64_t>(exponent * 10 + (s[i] - '0'), 1 << 30);
        if (negative) exponent = -exponent;
    }
    return magnitude + exponent > 0;
}

}  // namespace

YamlCoreScalar yaml_core_resolve(std::string_view s) {
    YamlCoreScalar r;
    if (s.empty() || s == "~" || s == "null" || s == "Null" || s == "NULL") {
        r.type = YamlCoreType::kNull;
        return r;
    }
    if (s == "true" || s == "True" || s == "TRUE" || s == "false" || s == "False" || s == "FALSE") {
        r.type = YamlCoreType::kBool;
        r.bool_value = s[0] == 't' || s[0] == 'T';
        return r;
    }
    // Octal and hexadecimal: no sign, lower-case prefix only.
    if (s.size() > 2 && s[0] == '0' && (s[1] == 'o' || s[1] == 'x')) {
        const int base = s[1] == 'o' ? 8 : 16;
        const std::string_view digits = s.substr(2);
        if (all_digits(digits, base)) {
            r.type = YamlCoreType::kInt;
            const auto [end, ec] =
                std::from_chars(digits.data(), digits.data() + digits.size(), r.int_value, base);
            r.out_of_range = ec == std::errc::result_out_of_range;
            double value = 0.0;
            for (char c : digits) {
                value = value * base + (c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10);
            }
            r.float_value = value;
            return r;
        }
    }
    const std::string_view unsigned_part = (s[0] == '+' || s[0] == '-') ? s.substr(1) : s;
    // from_chars takes '-' but not '+'.
    const std::string_view parse_from = s[0] == '+' ? s.substr(1) : s;
    if (all_digits(unsigned_part, 10)) {
        r.type = YamlCoreType::kInt;
        const auto [end, ec] =
            std::from_chars(parse_from.data(), parse_from.data() + parse_from.size(), r.int_value);
        r.out_of_range = ec == std::errc::result_out_of_range;
        std::from_chars(parse_from.data(), parse_from.data() + parse_from.size(), r.float_value);
        return r;
    }
    if (unsigned_part == ".inf" || unsigned_part == ".Inf" || unsigned_part == ".INF") {
        r.type = YamlCoreType::kFloat;
        r.float_value = s[0] == '-' ? -INFINITY : INFINITY;
        return r;
    }
    if (s == ".nan" || s == ".NaN" || s == ".NAN") {
        r.type = YamlCoreType::kFloat;
        r.float_value = NAN;
        return r;
    }
    if (matches_core_float(s)) {
        r.type = YamlCoreType::kFloat;
        const auto [end, ec] =
            std::from_chars(parse_from.data(), parse_from.data() + parse_from.size(), r.float_value,
                            std::chars_format::general);
        if (ec == std::errc::result_out_of_range) {
            if (core_float_overflows(s)) {
                r.out_of_range = true;
            } else {
                r.float_value = s[0] == '-' ? -0.0 : 0.0;  // below the smallest double: zero
            }
        }
        return r;
    }
    return r;  // a string
}

namespace {

constexpr std::string_view kTagPrefix = "tag:yaml.org,2002:";

// The core-schema reading of a scalar node: a plain scalar is resolved by its text; a quoted one
// (tag "!") or one tagged !!str is a string; !!int, !!float, !!bool and !!null hold what their
// text says when it has that form. nullopt for any other tag, or a tag its text does not fit.
std::optional<YamlCoreScalar> resolve_node(const YAML::Node& node) {
    const std::string& tag = node.Tag();
    if (node.IsNull()) return YamlCoreScalar{YamlCoreType::kNull};
    if (!node.IsScalar()) return std::nullopt;
    if (tag == "?") return yaml_core_resolve(node.Scalar());
    if (tag == "!" || tag == std::string(kTagPrefix) + "str") return YamlCoreScalar{};
    if (!starts_with(tag, kTagPrefix)) return std::nullopt;
    const std::string_view name = std::string_view(tag).substr(kTagPrefix.size());
    YamlCoreScalar r = yaml_core_resolve(node.Scalar());
    if (name == "int" && r.type == YamlCoreType::kInt) return r;
    if (name == "float" && (r.type == YamlCoreType::kFloat || r.type == YamlCoreType::kInt)) {
        r.type = YamlCoreType::kFloat;
        return r;
    }
    if (name == "bool" && r.type == YamlCoreType::kBool) return r;
    if (name == "null" && r.type == YamlCoreType::kNull) return r;
    return std::nullopt;
}

const char* core_type_words(YamlCoreType t) {
    switch (t) {
        case YamlCoreType::kNull:
            return "null";
        case YamlCoreType::kBool:
            return "a boolean";
        case YamlCoreType::kInt:
            return "an integer";
        case YamlCoreType::kFloat:
            return "a float";
        case YamlCoreType::kString:
            return "a string";
    }
    return "?";
}

// A short flow-style rendering of a node for messages, bounded in depth and length (YAML
// aliases can make a node contain itself).
void render_node(const YAML::Node& node, int depth, std::string& out) {
    constexpr size_t kMaxChars = 120;
    if (out.size() > kMaxChars) return;
    if (depth > 4) {
        out += "...";
        return;
    }
    if (node.IsScalar()) {
        out += node.Scalar();
    } else if (node.IsNull()) {
        out += "null";
    } else if (node.IsSequence()) {
        out += '[';
        size_t i = 0;
        for (const auto& item : node) {
            if (i++ > 0) out += ", ";
            if (out.size() > kMaxChars) break;
            render_node(item, depth + 1, out);
        }
        out += ']';
    } else if (node.IsMap()) {
        out += '{';
        size_t i = 0;
        for (const auto& kv : node) {
            if (i++ > 0) out += ", ";
            if (out.size() > kMaxChars) break;
            render_node(kv.first, depth + 1, out);
            out += ": ";
            render_node(kv.second, depth + 1, out);
        }
        out += '}';
    }
}

std::string node_text(const YAML::Node& node) {
    std::string out;
    render_node(node, 0, out);
    return escape_for_message(out);
}

// Why `node` does not hold a value of `type`, in words ("" when it does). Strings and string
// lists take any scalar; numbers and booleans follow the core schema.
std::string scalar_problem(const YAML::Node& node, ConfigType type) {
    if (!node.IsScalar()) {
        return fmt::format("got {}", node.IsSequence() ? "a list"
                                     : node.IsMap()    ? "a map"
                                                       : "null");
    }
    const std::string text = escape_for_message(node.Scalar());
    const std::optional<YamlCoreScalar> r = resolve_node(node);
    if (!r.has_value()) {
        return fmt::format(
            "got '{}' with the tag '{}', which is not one of YAML 1.2's core "
            "schema tags for it (!!str, !!int, !!float, !!bool)",
            text, escape_for_message(node.Tag()));
    }
    const bool quoted = node.Tag() != "?";
    switch (type) {
        case ConfigType::kString:
        case ConfigType::kStringList:
            return "";
        case ConfigType::kBool:
            if (r->type == YamlCoreType::kBool) return "";
            break;
        case ConfigType::kInt:
            if (r->type == YamlCoreType::kInt) {
                if (!r->out_of_range) return "";
                return fmt::format(
                    "got {}, which is out of range (a 64-bit signed integer, "
                    "-9223372036854775808 to 9223372036854775807)",
                    text);
            }
            if (r->type == YamlCoreType::kFloat) {
                const double v = r->float_value;
                if (std::isfinite(v) && v == std::floor(v) && std::fabs(v) < 9.0e18) {
                    return fmt::format(
                        "got {}, which YAML 1.2 reads as a float; write the "
                        "integer {}",
                        text, static_cast<int64_t>(v));
                }
                return fmt::format("got {}, a float", text);
            }
            break;
        case ConfigType::kFloat:
        case ConfigType::kFloatList:
            if (r->type == YamlCoreType::kFloat || r->type == YamlCoreType::kInt) {
                if (r->type == YamlCoreType::kFloat && r->out_of_range) {
                    return fmt::format(
                        "got {}, which is out of range of a 64-bit float (write "
                        ".inf for infinity)",
                        text);
                }
                return "";
            }
            break;
    }
    if (quoted && r->type == YamlCoreType::kString) {
        const YamlCoreType inner = yaml_core_resolve(node.Scalar()).type;
        if (inner != YamlCoreType::kString) {
            return fmt::format("got the quoted string '{}'; write it without quotes to give {}",
                               text, core_type_words(inner));
        }
    }
    return fmt::format("got '{}' ({} in YAML 1.2)", text, core_type_words(r->type));
}

// Why `node` does not fit `type` ("" when it does).
std::string value_problem(const YAML::Node& node, ConfigType type) {
    if (type == ConfigType::kStringList || type == ConfigType::kFloatList) {
        if (type == ConfigType::kStringList && node.IsScalar()) return "";
        if (!node.IsSequence()) {
            return node.IsScalar() ? fmt::format("got '{}'", escape_for_message(node.Scalar()))
                                   : scalar_problem(node, type);
        }
        size_t i = 0;
        for (const auto& item : node) {
            const std::string p = scalar_problem(item, type);
            if (!p.empty()) return fmt::format("item {}: {}", i, p);
            ++i;
        }
        return "";
    }
    return scalar_problem(node, type);
}

// A copy of a checked value as plain, untagged scalars (tags and quotes have done their work),
// so that getters and to_yaml() see one form.
YAML::Node plain_copy(const YAML::Node& node) {
    if (node.IsScalar()) return YAML::Node(node.Scalar());
    YAML::Node out(YAML::NodeType::Sequence);
    for (const auto& item : node) out.push_back(YAML::Node(item.Scalar()));
    return out;
}

std::string where(const std::string& file, const YAML::Node& node) {
    const YAML::Mark m = node.Mark();
    if (m.line < 0) return file;
    return fmt::format("{}:{}", file, m.line + 1);
}

}  // namespace

Status Config::set_value(const ConfigKey& key, const YAML::Node& node, const std::string& source) {
    if (node.IsNull()) {
        // An explicit null clears the key back to "no value" (only meaningful without a default).
        values_.erase(key.name);
        if (!key.default_yaml.empty()) {
            values_[key.name] = Value{plain_copy(YAML::Load(key.default_yaml)), "default"};
        }
        return ok_status();
    }
    const std::string problem = value_problem(node, key.type);
    if (!problem.empty()) {
        return invalid_argument_error("{}: key '{}' must be {}, {} ({})", source, key.name,
                                      config_type_name(key.type), problem, key.help);
    }
    values_[key.name] = Value{plain_copy(node), source};
    return ok_status();
}

Status Config::merge_document(const YAML::Node& root, const std::string& file) {
    if (root.IsNull()) return ok_status();  // an empty file sets nothing
    if (!root.IsMap()) {
        return invalid_argument_error("{}: the top level must be a map of keys, got {}", file,
                                      node_text(root));
    }
    const std::vector<std::string> names = schema_->names();
    // Walk nested maps; a map whose dotted path is itself a key (no such key is map-typed) is an
    // error below through the type check.
    struct Item {
        std::string prefix;
        YAML::Node node;
    };
    std::vector<Item> stack{{"", root}};
    // Every dotted name the document sets: a key given twice (YAML 1.2 forbids it in one map;
    // `train.steps` beside `train: {steps: ...}` is the same key) would otherwise be one of the
    // two values without a word.
    std::set<std::string> seen;
    while (!stack.empty()) {
        Item item = stack.back();
        stack.pop_back();
        for (const auto& kv : item.node) {
            if (!kv.first.IsScalar()) {
                return invalid_argument_error("{}: a key must be a name, got {}",
                                              where(file, kv.first), node_text(kv.first));
            }
            const std::string part = kv.first.Scalar();
            const std::string name = item.prefix.empty() ? part : item.prefix + "." + part;
            if (!seen.insert(name).second) {
                return invalid_argument_error(
                    "{}: '{}' is given twice in this file; keep one (files given later, and "
                    "--set, override earlier ones)",
                    where(file, kv.first), name);
            }
            const ConfigKey* key = schema_->find(name);
            if (key != nullptr) {
                LATHE_RETURN_IF_ERROR(set_value(*key, kv.second, where(file, kv.first)));
                continue;
            }
            // Not a key: a section if some key starts with "name.", else unknown.
            bool is_section = false;
            for (const std::string& n : names) {
                if (n.size() > name.size() && n.compare(0, name.size(), name) == 0 &&
                    n[name.size()] == '.') {
                    is_section = true;
                    break;
                }
            }
            if (is_section && kv.second.IsMap()) {
                stack.push_back({name, kv.second});
                continue;
            }
            if (is_section) {
                return invalid_argument_error(
                    "{}: '{}' is a section; write its keys under it "
                    "(e.g. '{}.<key>: value')",
                    where(file, kv.first), name, name);
            }
            return invalid_argument_error("{}: unknown key '{}'{}", where(file, kv.first), name,
                                          did_you_mean(name, names));
        }
    }
    return ok_status();
}

Config Config::with_defaults(const ConfigSchema& schema) {
    Config cfg;
    cfg.schema_ = &schema;
    for (const ConfigKey& key : schema.keys()) {
        if (key.default_yaml.empty()) continue;
        YAML::Node node = YAML::Load(key.default_yaml);
        LATHE_CHECK(value_problem(node, key.type).empty(), "default of {} has the wrong type",
                    key.name);
        cfg.values_[key.name] = Value{plain_copy(node), "default"};
    }
    return cfg;
}

Status Config::apply_override(const std::string& ov) {
    const size_t eq = ov.find('=');
    if (eq == std::string::npos || eq == 0) {
        return invalid_argument_error("--set {}: expected key=value", ov);
    }
    const std::string key_name(trim(std::string_view(ov).substr(0, eq)));
    const ConfigKey* key = schema_->find(key_name);
    if (key == nullptr) {
        return invalid_argument_error("--set {}: unknown key '{}'{}", ov, key_name,
                                      did_you_mean(key_name, schema_->names()));
    }
    YAML::Node node;
    try {
        node = YAML::Load(ov.substr(eq + 1));
    } catch (const YAML::Exception& e) {
        return invalid_argument_error("--set {}: value is not valid YAML: {}", ov, e.msg);
    } catch (const std::exception& e) {
        return invalid_argument_error("--set {}: value cannot be read as YAML: {}", ov, e.what());
    }
    // "--set k=" means the empty string, not null.
    if (node.IsNull() && ov.size() == eq + 1) node = YAML::Node(std::string());
    return set_value(*key, node, "--set " + ov);
}

Status Config::check_required() const {
    for (const ConfigKey& key : schema_->keys()) {
        if (key.required && !has(key.name)) {
            return invalid_argument_error(
                "missing required key '{}' ({}); set it in a config file "
                "or with --set {}=...",
                key.name, key.help, key.name);
        }
    }
    return ok_status();
}

namespace {
// The YAML documents of `text`: its '---' and '...' markers (always at a line's start: no
// scalar may hold them there) and the content around them. yaml-cpp's Load reads the first
// document alone (and its LoadAll can loop forever on some malformed input).
int yaml_document_count(std::string_view text) {
    int docs = 0;
    bool open = false;  // a document has begun and not ended
    if (text.starts_with("\xEF\xBB\xBF")) text.remove_prefix(3);  // a UTF-8 byte order mark
    for (std::string_view line : split(text, '\n')) {
        if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
        const auto marker = [&](std::string_view m) {
            return line.starts_with(m) && (line.size() == 3 || line[3] == ' ' || line[3] == '\t');
        };
        if (marker("---")) {
            ++docs;
            open = true;
        } else if (marker("...")) {
            open = false;
        } else if (!open && !trim(line).empty() && trim(line)[0] != '#' && line[0] != '%') {
            ++docs;  // content without a '---' before it
            open = true;
        }
    }
    return docs;
}

Result<YAML::Node> parse_yaml(const std::string& text, const std::string& name) {
    try {
        YAML::Node root = YAML::Load(text);
        if (const int docs = yaml_document_count(text); docs > 1) {
            return invalid_argument_error(
                "{}: holds {} YAML documents (separated by '---'); a config is one: merge them, "
                "or give them as separate files (merged left to right)",
                name, docs);
        }
        return root;
    } catch (const YAML::Exception& e) {
        return invalid_argument_error("{}:{}: not valid YAML: {}", name, e.mark.line + 1, e.msg);
    } catch (const std::exception& e) {
        return invalid_argument_error("{}: cannot read as YAML: {}", name, e.what());
    }
}
}  // namespace

Result<Config> Config::load_text(const ConfigSchema& schema, const std::string& yaml_text,
                                 const std::string& name, std::span<const std::string> overrides) {
    Config cfg = with_defaults(schema);
    LATHE_ASSIGN_OR_RETURN(YAML::Node root, parse_yaml(yaml_text, name));
    LATHE_RETURN_IF_ERROR(cfg.merge_document(root, name));
    for (const std::string& ov : overrides) LATHE_RETURN_IF_ERROR(cfg.apply_override(ov));
    LATHE_RETURN_IF_ERROR(cfg.check_required());
    return cfg;
}

Result<Config> Config::load(const ConfigSchema& schema, std::span<const std::string> files,
                            std::span<const std::string> overrides) {
    Config cfg = with_defaults(schema);
    for (const std::string& path : files) {
        LATHE_ASSIGN_OR_RETURN(std::string text, file_read_all(path));
        LATHE_ASSIGN_OR_RETURN(YAML::Node root, parse_yaml(text, path));
        LATHE_RETURN_IF_ERROR(cfg.merge_document(root, path));
    }
    for (const std::string& ov : overrides) LATHE_RETURN_IF_ERROR(cfg.apply_override(ov));
    LATHE_RETURN_IF_ERROR(cfg.check_required());
    return cfg;
}

bool Config::has(std::string_view name) const {
    return values_.find(name) != values_.end();
}

const ConfigKey& Config::key_or_die(std::string_view name, ConfigType type) const {
    const ConfigKey* key = schema_->find(name);
    LATHE_CHECK(key != nullptr, "config key {} is not in the schema", name);
    LATHE_CHECK(key->type == type, "config key {} is a {}, read as {}", name,
                config_type_name(key->type), config_type_name(type));
    LATHE_CHECK(has(name), "config key {} has no value (check has() first)", name);
    return *key;
}

int64_t Config::get_int(std::string_view name) const {
    key_or_die(name, ConfigType::kInt);
    return yaml_core_resolve(values_.find(name)->second.node.Scalar()).int_value;
}

double Config::get_float(std::string_view name) const {
    key_or_die(name, ConfigType::kFloat);
    return yaml_core_resolve(values_.find(name)->second.node.Scalar()).float_value;
}

bool Config::get_bool(std::string_view name) const {
    key_or_die(name, ConfigType::kBool);
    return yaml_core_resolve(values_.find(name)->second.node.Scalar()).bool_value;
}

std::string Config::get_string(std::string_view name) const {
    key_or_die(name, ConfigType::kString);
    return values_.find(name)->second.node.Scalar();
}

std::vector<std::string> Config::get_string_list(std::string_view name) const {
    key_or_die(name, ConfigType::kStringList);
    const YAML::Node& node = values_.find(name)->second.node;
    if (node.IsScalar()) return {node.Scalar()};
    std::vector<std::string> out;
    for (const auto& item : node) out.push_back(item.Scalar());
    return out;
}

std::vector<double> Config::get_float_list(std::string_view name) const {
    key_or_die(name, ConfigType::kFloatList);
    std::vector<double> out;
    for (const auto& item : values_.find(name)->second.node) {
        out.push_back(yaml_core_resolve(item.Scalar()).float_value);
    }
    return out;
}

std::string Config::source_of(std::string_view name) const {
    const auto it = values_.find(name);
    return it == values_.end() ? "unset" : it->second.source;
}

namespace {

// Keys grouped by their dotted sections, in schema order of first appearance.
struct YamlSection {
    std::vector<std::pair<std::string, const ConfigKey*>>
        leaves_and_sections;  // key == nullptr: section
    std::map<std::string, YamlSection> sections;
};

void emit_scalar(YAML::Emitter& e, const std::string& text, bool is_string) {
    // A string that the core schema would read as something else ("10", "true") is quoted so
    // that the file reads back the same under any YAML 1.2 reader.
    if (is_string && yaml_core_resolve(text).type != YamlCoreType::kString) {
        e << YAML::DoubleQuoted << text;
    } else {
        e << text;
    }
}

}  // namespace

std::string Config::to_yaml() const {
    YamlSection root;
    for (const ConfigKey& key : schema_->keys()) {
        if (values_.find(key.name) == values_.end()) continue;
        const std::vector<std::string_view> parts = split(key.name, '.');
        YamlSection* cur = &root;
        for (size_t i = 0; i + 1 < parts.size(); ++i) {
            const std::string p(parts[i]);
            if (cur->sections.find(p) == cur->sections.end()) {
                cur->leaves_and_sections.emplace_back(p, nullptr);
            }
            cur = &cur->sections[p];
        }
        cur->leaves_and_sections.emplace_back(std::string(parts.back()), &key);
    }
    YAML::Emitter e;
    const auto emit_section = [&](const auto& self, const YamlSection& section) -> void {
        e << YAML::BeginMap;
        for (const auto& [name, key] : section.leaves_and_sections) {
            e << YAML::Key << name << YAML::Value;
            if (key == nullptr) {
                self(self, section.sections.at(name));
                continue;
            }
            const YAML::Node& node = values_.find(key->name)->second.node;
            const bool is_string =
                key->type == ConfigType::kString || key->type == ConfigType::kStringList;
            if (node.IsSequence()) {
                e << YAML::BeginSeq;
                for (const auto& item : node) emit_scalar(e, item.Scalar(), is_string);
                e << YAML::EndSeq;
            } else {
                emit_scalar(e, node.Scalar(), is_string);
            }
        }
        e << YAML::EndMap;
    };
    emit_section(emit_section, root);
    return std::string(e.c_str()) + "\n";
}

}  // namespace lathe
