#include "io/config.h"

#include <fmt/format.h>

#include <cmath>

#include "core/check.h"
#include "core/strings.h"
#include "io/file.h"

namespace lathe {

const char* config_type_name(ConfigType type) {
    switch (type) {
        case ConfigType::kInt: return "an integer";
        case ConfigType::kFloat: return "a number";
        case ConfigType::kBool: return "a boolean (true/false)";
        case ConfigType::kString: return "a string";
        case ConfigType::kStringList: return "a string or a list of strings";
        case ConfigType::kFloatList: return "a list of numbers";
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

// YAML 1.2 core-schema booleans only: "yes"/"on" are strings, which avoids the Norway problem.
std::optional<bool> parse_bool(const std::string& s) {
    if (s == "true" || s == "True" || s == "TRUE") return true;
    if (s == "false" || s == "False" || s == "FALSE") return false;
    return std::nullopt;
}

std::optional<int64_t> parse_int(const std::string& s) {
    if (s.empty()) return std::nullopt;
    size_t pos = 0;
    try {
        const long long v = std::stoll(s, &pos, 0);
        if (pos == s.size()) return static_cast<int64_t>(v);
    } catch (...) {
    }
    // Accept integral floats written like 1e6 (common for step counts), nothing else.
    try {
        const double d = std::stod(s, &pos);
        if (pos == s.size() && std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.0e18) {
            return static_cast<int64_t>(d);
        }
    } catch (...) {
    }
    return std::nullopt;
}

std::optional<double> parse_float(const std::string& s) {
    if (s.empty()) return std::nullopt;
    if (s == ".inf" || s == "inf") return INFINITY;
    if (s == "-.inf" || s == "-inf") return -INFINITY;
    size_t pos = 0;
    try {
        const double d = std::stod(s, &pos);
        if (pos == s.size()) return d;
    } catch (...) {
    }
    return std::nullopt;
}

bool scalar_has_type(const YAML::Node& node, ConfigType type) {
    if (!node.IsScalar()) return false;
    const std::string& s = node.Scalar();
    switch (type) {
        case ConfigType::kInt: return parse_int(s).has_value();
        case ConfigType::kFloat: return parse_float(s).has_value();
        case ConfigType::kBool: return parse_bool(s).has_value();
        case ConfigType::kString: return true;
        case ConfigType::kStringList: return true;
        case ConfigType::kFloatList: return false;
    }
    return false;
}

bool node_has_type(const YAML::Node& node, ConfigType type) {
    if (type == ConfigType::kStringList) {
        if (node.IsScalar()) return true;
        if (!node.IsSequence()) return false;
        for (const auto& item : node) {
            if (!item.IsScalar()) return false;
        }
        return true;
    }
    if (type == ConfigType::kFloatList) {
        if (!node.IsSequence()) return false;
        for (const auto& item : node) {
            if (!scalar_has_type(item, ConfigType::kFloat)) return false;
        }
        return true;
    }
    return scalar_has_type(node, type);
}

std::string where(const std::string& file, const YAML::Node& node) {
    const YAML::Mark m = node.Mark();
    if (m.line < 0) return file;
    return fmt::format("{}:{}", file, m.line + 1);
}

std::string node_text(const YAML::Node& node) {
    YAML::Emitter e;
    e.SetMapFormat(YAML::Flow);
    e.SetSeqFormat(YAML::Flow);
    e << node;
    return e.c_str();
}

}  // namespace

Status Config::set_value(const ConfigKey& key, const YAML::Node& node, const std::string& source) {
    if (node.IsNull()) {
        // An explicit null clears the key back to "no value" (only meaningful without a default).
        values_.erase(key.name);
        if (!key.default_yaml.empty()) {
            values_[key.name] = Value{YAML::Load(key.default_yaml), "default"};
        }
        return ok_status();
    }
    if (!node_has_type(node, key.type)) {
        return invalid_argument_error("{}: key '{}' must be {}, got '{}' ({})", source, key.name,
                                      config_type_name(key.type), escape_for_message(node_text(node)),
                                      key.help);
    }
    values_[key.name] = Value{YAML::Clone(node), source};
    return ok_status();
}

Status Config::merge_document(const YAML::Node& root, const std::string& file) {
    if (root.IsNull()) return ok_status();  // an empty file sets nothing
    if (!root.IsMap()) {
        return invalid_argument_error("{}: the top level must be a map of keys, got {}", file,
                                      escape_for_message(node_text(root)));
    }
    const std::vector<std::string> names = schema_->names();
    // Walk nested maps; a map whose dotted path is itself a key (no such key is map-typed) is an
    // error below through the type check.
    struct Item {
        std::string prefix;
        YAML::Node node;
    };
    std::vector<Item> stack{{"", root}};
    while (!stack.empty()) {
        Item item = stack.back();
        stack.pop_back();
        for (const auto& kv : item.node) {
            const std::string part = kv.first.as<std::string>();
            const std::string name = item.prefix.empty() ? part : item.prefix + "." + part;
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
                return invalid_argument_error("{}: '{}' is a section; write its keys under it "
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
        LATHE_CHECK(node_has_type(node, key.type), "default of {} has the wrong type", key.name);
        cfg.values_[key.name] = Value{node, "default"};
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
    }
    // "--set k=" means the empty string, not null.
    if (node.IsNull() && ov.size() == eq + 1) node = YAML::Node(std::string());
    return set_value(*key, node, "--set " + ov);
}

Status Config::check_required() const {
    for (const ConfigKey& key : schema_->keys()) {
        if (key.required && !has(key.name)) {
            return invalid_argument_error("missing required key '{}' ({}); set it in a config file "
                                          "or with --set {}=...",
                                          key.name, key.help, key.name);
        }
    }
    return ok_status();
}

namespace {
Result<YAML::Node> parse_yaml(const std::string& text, const std::string& name) {
    try {
        return YAML::Load(text);
    } catch (const YAML::Exception& e) {
        return invalid_argument_error("{}:{}: not valid YAML: {}", name, e.mark.line + 1, e.msg);
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

bool Config::has(std::string_view name) const { return values_.find(name) != values_.end(); }

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
    return *parse_int(values_.find(name)->second.node.Scalar());
}

double Config::get_float(std::string_view name) const {
    key_or_die(name, ConfigType::kFloat);
    return *parse_float(values_.find(name)->second.node.Scalar());
}

bool Config::get_bool(std::string_view name) const {
    key_or_die(name, ConfigType::kBool);
    return *parse_bool(values_.find(name)->second.node.Scalar());
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
    for (const auto& item : values_.find(name)->second.node) out.push_back(*parse_float(item.Scalar()));
    return out;
}

std::string Config::source_of(std::string_view name) const {
    const auto it = values_.find(name);
    return it == values_.end() ? "unset" : it->second.source;
}

std::string Config::to_yaml() const {
    YAML::Node root(YAML::NodeType::Map);
    for (const ConfigKey& key : schema_->keys()) {
        const auto it = values_.find(key.name);
        if (it == values_.end()) continue;
        const std::vector<std::string_view> parts = split(key.name, '.');
        YAML::Node cur = root;
        for (size_t i = 0; i + 1 < parts.size(); ++i) {
            const std::string p(parts[i]);
            if (!cur[p]) cur[p] = YAML::Node(YAML::NodeType::Map);
            cur.reset(cur[p]);  // rebind; plain assignment would overwrite the node's content
        }
        cur[std::string(parts.back())] = it->second.node;
    }
    YAML::Emitter e;
    e << root;
    return std::string(e.c_str()) + "\n";
}

}  // namespace lathe
