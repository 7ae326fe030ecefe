#pragma once
// Hugging Face config.json, family-agnostic: the JSON object with typed getters whose errors name
// the file and the key, the pieces of it that mean the same in every transformers config
// (activation names, the llama3 rope_scaling object), finding config.json in a checkpoint
// directory, and the text save_pretrained writes. Which keys a family has, their defaults and
// rules live with the family (model/hf_config.h, model/registry.h); this layer lists none.

#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <set>
#include <string>
#include <string_view>

#include "core/status.h"

namespace lathe {

// The activation of the MLP, by transformers' ACT2FN names: silu/swish -> kSilu; gelu -> kGelu
// (erf); gelu_new, gelu_pytorch_tanh, gelu_fast -> kGeluTanh (0.5 x (1 + tanh(sqrt(2/pi) (x +
// 0.044715 x^3)))); relu -> kRelu.
enum class HfActivation : uint8_t { kSilu, kGelu, kGeluTanh, kRelu };

// The activation of an ACT2FN name, or nullopt for one lathe does not implement.
std::optional<HfActivation> hf_activation_from_name(std::string_view name);

// rope_scaling of type "llama3" (the only scaling lathe implements): frequencies below
// original_max_position_embeddings / low_freq_factor wavelengths are divided by `factor`, those
// above ... / high_freq_factor are kept, and the band between is interpolated.
struct HfRopeScaling {
    double factor = 8.0;
    double low_freq_factor = 1.0;
    double high_freq_factor = 4.0;
    int64_t original_max_position_embeddings = 8192;
    bool operator==(const HfRopeScaling&) const = default;
};

// A JSON value described for a message: "null", "the number 2.5", "the string \"x\"", "a list".
std::string hf_json_kind(const nlohmann::json& value);

// Reads a rope_scaling-style object ({"rope_type": "llama3", ...}; "type" is the legacy name of
// "rope_type"). `key` names it in messages, `where` the file. nullopt for no scaling ("default",
// null, or a rope_parameters object without rope_type). Errors: kInvalidArgument for a malformed
// object, kUnimplemented for a scaling type other than llama3.
Result<std::optional<HfRopeScaling>> hf_parse_rope_scaling(const nlohmann::json& value,
                                                           const std::string& key,
                                                           const std::string& where);

// One config.json object, read key by key. Every getter marks its key consumed, so that the keys
// nobody interpreted can be kept verbatim (unconsumed()). Messages are "<where>: key '<key>' ...".
class HfConfigReader {
public:
    // Parses `json_text` (from `where`, a path for messages). Errors: kInvalidArgument for text
    // that is not JSON or not a JSON object.
    static Result<HfConfigReader> parse(std::string_view json_text, const std::string& where);

    HfConfigReader(HfConfigReader&&) noexcept;
    HfConfigReader& operator=(HfConfigReader&&) noexcept;
    ~HfConfigReader();

    const std::string& where() const { return where_; }

    // Whether `key` is present (null included); marks it consumed.
    bool has(const std::string& key);
    // Present and null; marks it consumed.
    bool is_null(const std::string& key);
    // The value of a present key (check has() first).
    const nlohmann::json& raw(const std::string& key) const;
    // The value of `key` without consuming it, or nullptr when absent.
    const nlohmann::json* peek(const std::string& key) const;

    // kInvalidArgument: "<where>: key '<key>' must be <expected>, got <what it is>".
    Status error(const std::string& key, const std::string& expected) const;

    // Integer keys: absent leaves *out as it is (the default); null is an error (use
    // opt_int_key); a value below `min` is an error.
    Status int_key(const std::string& key, int64_t* out, int64_t min = 1);
    // Integer or null: null gives nullopt.
    Status opt_int_key(const std::string& key, std::optional<int64_t>* out, int64_t min = 0);
    // Numbers (integers accepted, as Python's float() does).
    Status float_key(const std::string& key, double* out);
    Status bool_key(const std::string& key, bool* out);
    Status string_key(const std::string& key, std::string* out);

    // The keys no getter touched, each as its JSON text.
    std::map<std::string, std::string> unconsumed() const;

private:
    HfConfigReader(std::unique_ptr<nlohmann::json> root, std::string where);

    std::unique_ptr<nlohmann::json> root_;  // a JSON object
    std::string where_;
    std::set<std::string> consumed_;
};

// Where the config.json of `path` is: `path` itself when it names a .json file or is not a
// directory, else path/config.json. kNotFound for a directory without one.
Result<std::string> hf_config_file_of(const std::string& path);

// `object` as save_pretrained writes it: json.dumps(indent=2, sort_keys=True) plus a newline.
std::string hf_config_text(const nlohmann::json& object);

}  // namespace lathe
