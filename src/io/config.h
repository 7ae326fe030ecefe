#pragma once
// Configuration files: YAML, several files merged left to right, then `--set key=value` overrides.
//
// A command declares its keys in a ConfigSchema (dotted names such as "train.steps", a type, a
// default and one line of help). Nested YAML maps are flattened into dotted names. Loading checks
// every key and value against the schema before any work starts:
//   - an unknown key is an error naming the file, the line and the closest valid key;
//   - a value of the wrong type is an error naming the file, the line, the key and the type;
//   - a key marked required that no file or override sets is an error naming it.
// Later files and overrides win; a list value replaces the whole list (no element-wise merge).

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"

namespace lathe {

enum class ConfigType { kInt, kFloat, kBool, kString, kStringList, kFloatList };

// How YAML 1.2's core schema (spec 1.2.2, section 10.3.2) reads a plain (unquoted, untagged)
// scalar; config values are typed by this reading, never by C literal rules:
//   null   null Null NULL ~ (and the empty scalar)
//   bool   true True TRUE false False FALSE          ("yes", "on", "y" are strings)
//   int    [-+]?[0-9]+ (decimal: "010" is ten), 0o[0-7]+ (octal), 0x[0-9a-fA-F]+ (hex)
//   float  [-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?, [-+]?(.inf|.Inf|.INF),
//          .nan .NaN .NAN                             ("inf", "nan", "1e", "0x1p3" are strings)
//   string everything else
// A quoted scalar is always a string.
enum class YamlCoreType { kNull, kBool, kInt, kFloat, kString };

struct YamlCoreScalar {
    YamlCoreType type = YamlCoreType::kString;
    bool bool_value = false;    // kBool
    int64_t int_value = 0;      // kInt, when !out_of_range
    double float_value = 0.0;   // kFloat (and kInt, converted), when !out_of_range
    bool out_of_range = false;  // kInt outside int64, or kFloat beyond the largest double
};

YamlCoreScalar yaml_core_resolve(std::string_view plain);

const char* config_type_name(ConfigType type);

struct ConfigKey {
    std::string name;  // dotted: "train.steps"
    ConfigType type;
    std::string default_yaml;  // YAML text of the default ("100", "[a, b]"); "" = no default
    std::string help;          // one line for `--help` and error messages
    bool required = false;     // must be set by a file or an override
};

class ConfigSchema {
public:
    // Adds a key; a duplicate name is a programming error (checked).
    ConfigSchema& add(ConfigKey key);
    const ConfigKey* find(std::string_view name) const;
    std::vector<std::string> names() const;
    const std::vector<ConfigKey>& keys() const { return keys_; }

private:
    std::vector<ConfigKey> keys_;
};

// Where a value came from, for messages: "run.yaml:12", "--set train.steps=5", "default".
struct ConfigSource {
    std::string where;
};

class Config {
public:
    // Loads and validates. `files` are YAML paths merged left to right; `overrides` are
    // "key=value" strings whose value is parsed as YAML ("5", "true", "[a, b]", "text").
    static Result<Config> load(const ConfigSchema& schema, std::span<const std::string> files,
                               std::span<const std::string> overrides);
    // Same from YAML text (tests, embedded defaults); `name` stands in for the file name.
    static Result<Config> load_text(const ConfigSchema& schema, const std::string& yaml_text,
                                    const std::string& name,
                                    std::span<const std::string> overrides = {});

    // Typed getters. Asking for a key the schema lacks, or with the wrong type, is a programming
    // error (checked); a key with no value (no default, not set) too: use has() first.
    bool has(std::string_view name) const;
    int64_t get_int(std::string_view name) const;
    double get_float(std::string_view name) const;
    bool get_bool(std::string_view name) const;
    std::string get_string(std::string_view name) const;
    std::vector<std::string> get_string_list(std::string_view name) const;
    std::vector<double> get_float_list(std::string_view name) const;
    // "default", "a.yaml:3" or "--set k=v".
    std::string source_of(std::string_view name) const;

    // The resolved configuration as YAML (nested maps, every key with a value), for run folders
    // and checkpoints. Reloading it with the same schema gives the same values.
    std::string to_yaml() const;

    const ConfigSchema& schema() const { return *schema_; }

private:
    struct Value {
        YAML::Node node;
        std::string source;
    };
    static Config with_defaults(const ConfigSchema& schema);
    Status apply_override(const std::string& override_text);
    Status check_required() const;
    Status set_value(const ConfigKey& key, const YAML::Node& node, const std::string& source);
    Status merge_document(const YAML::Node& root, const std::string& file);
    const ConfigKey& key_or_die(std::string_view name, ConfigType type) const;

    const ConfigSchema* schema_ = nullptr;
    std::map<std::string, Value, std::less<>> values_;
};

}  // namespace lathe
