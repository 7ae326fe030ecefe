#include "io/hf_config.h"

#include <fmt/format.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "core/strings.h"
#include "io/file.h"
#include "io/json.h"

namespace lathe {

using Json = nlohmann::json;

std::optional<HfActivation> hf_activation_from_name(std::string_view name) {
    if (name == "silu" || name == "swish") return HfActivation::kSilu;
    if (name == "gelu") return HfActivation::kGelu;
    if (name == "gelu_new" || name == "gelu_pytorch_tanh" || name == "gelu_fast")
        return HfActivation::kGeluTanh;
    if (name == "relu") return HfActivation::kRelu;
    return std::nullopt;
}

std::string hf_json_kind(const Json& j) {
    if (j.is_null()) return "null";
    if (j.is_boolean()) return fmt::format("the boolean {}", j.get<bool>());
    if (j.is_number()) return fmt::format("the number {}", j.dump());
    if (j.is_string())
        return fmt::format("the string \"{}\"", escape_for_message(j.get<std::string>(), 40));
    if (j.is_array()) return "a list";
    return "an object";
}

Result<std::optional<HfRopeScaling>> hf_parse_rope_scaling(const Json& v, const std::string& key,
                                                           const std::string& where) {
    if (v.is_null()) return std::optional<HfRopeScaling>();
    if (!v.is_object())
        return invalid_argument_error("{}: key '{}' must be an object or null, got {}", where, key,
                                      hf_json_kind(v));
    const char* type_key = v.contains("rope_type") ? "rope_type" : "type";
    if (!v.contains(type_key)) {
        // transformers 5's rope_parameters always carries rope_type; a bare {"rope_theta": ...}
        // is the default rotary embedding.
        if (key == "rope_parameters") return std::optional<HfRopeScaling>();
        return invalid_argument_error("{}: key '{}' has no \"rope_type\"", where, key);
    }
    if (!v[type_key].is_string())
        return invalid_argument_error("{}: key '{}.{}' must be a string, got {}", where, key,
                                      type_key, hf_json_kind(v[type_key]));
    const std::string type = v[type_key].get<std::string>();
    if (type == "default") return std::optional<HfRopeScaling>();
    if (type != "llama3")
        return unimplemented_error(
            "{}: key '{}.{}' is \"{}\"; lathe implements the \"llama3\" rope scaling only "
            "(and \"default\", no scaling)",
            where, key, type_key, escape_for_message(type));
    HfRopeScaling r;
    const std::string sub = key + ".";
    auto number = [&](const char* name, double* out) -> Status {
        if (!v.contains(name))
            return invalid_argument_error(
                "{}: key '{}{}' is missing (llama3 rope scaling needs "
                "factor, low_freq_factor, high_freq_factor and "
                "original_max_position_embeddings)",
                where, sub, name);
        if (!v[name].is_number())
            return invalid_argument_error("{}: key '{}{}' must be a number, got {}", where, sub,
                                          name, hf_json_kind(v[name]));
        *out = v[name].get<double>();
        return ok_status();
    };
    LATHE_RETURN_IF_ERROR(number("factor", &r.factor));
    LATHE_RETURN_IF_ERROR(number("low_freq_factor", &r.low_freq_factor));
    LATHE_RETURN_IF_ERROR(number("high_freq_factor", &r.high_freq_factor));
    double original = 0;
    LATHE_RETURN_IF_ERROR(number("original_max_position_embeddings", &original));
    if (original != std::floor(original) || original < 1)
        return invalid_argument_error(
            "{}: key '{}original_max_position_embeddings' must be a "
            "positive integer, got {}",
            where, sub, v["original_max_position_embeddings"].dump());
    r.original_max_position_embeddings = int64_t(original);
    return std::optional<HfRopeScaling>(r);
}

HfConfigReader::HfConfigReader(std::unique_ptr<Json> root, std::string where)
    : root_(std::move(root)), where_(std::move(where)) {}
HfConfigReader::HfConfigReader(HfConfigReader&&) noexcept = default;
HfConfigReader& HfConfigReader::operator=(HfConfigReader&&) noexcept = default;
HfConfigReader::~HfConfigReader() = default;

Result<HfConfigReader> HfConfigReader::parse(std::string_view json_text, const std::string& where) {
    auto root = std::make_unique<Json>(json_parse<Json>(json_text));
    if (root->is_discarded())
        return invalid_argument_error("{}: not valid JSON: {}", where, json_problem(json_text));
    if (!root->is_object())
        return invalid_argument_error("{}: config.json must be a JSON object, got {}", where,
                                      hf_json_kind(*root));
    return HfConfigReader(std::move(root), where);
}

bool HfConfigReader::has(const std::string& key) {
    if (!root_->contains(key)) return false;
    consumed_.insert(key);
    return true;
}

bool HfConfigReader::is_null(const std::string& key) {
    return has(key) && (*root_)[key].is_null();
}

const Json& HfConfigReader::raw(const std::string& key) const {
    return root_->at(key);
}

const Json* HfConfigReader::peek(const std::string& key) const {
    auto it = root_->find(key);
    return it == root_->end() ? nullptr : &*it;
}

Status HfConfigReader::error(const std::string& key, const std::string& expected) const {
    return invalid_argument_error("{}: key '{}' must be {}, got {}", where_, key, expected,
                                  hf_json_kind(raw(key)));
}

Status HfConfigReader::int_key(const std::string& key, int64_t* out, int64_t min) {
    if (!has(key)) return ok_status();
    const Json& v = raw(key);
    const std::string expected = fmt::format("an integer >= {}", min);
    if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > INT64_MAX))
        return error(key, expected);
    if (v.get<int64_t>() < min) return error(key, expected);
    *out = v.get<int64_t>();
    return ok_status();
}

Status HfConfigReader::opt_int_key(const std::string& key, std::optional<int64_t>* out,
                                   int64_t min) {
    if (!has(key)) return ok_status();
    if (raw(key).is_null()) {
        out->reset();
        return ok_status();
    }
    int64_t v = 0;
    LATHE_RETURN_IF_ERROR(int_key(key, &v, min));
    *out = v;
    return ok_status();
}

Status HfConfigReader::float_key(const std::string& key, double* out) {
    if (!has(key)) return ok_status();
    if (!raw(key).is_number()) return error(key, "a number");
    *out = raw(key).get<double>();
    return ok_status();
}

Status HfConfigReader::bool_key(const std::string& key, bool* out) {
    if (!has(key)) return ok_status();
    if (!raw(key).is_boolean()) return error(key, "true or false");
    *out = raw(key).get<bool>();
    return ok_status();
}

Status HfConfigReader::string_key(const std::string& key, std::string* out) {
    if (!has(key)) return ok_status();
    if (!raw(key).is_string()) return error(key, "a string");
    *out = raw(key).get<std::string>();
    return ok_status();
}

std::map<std::string, std::string> HfConfigReader::unconsumed() const {
    std::map<std::string, std::string> out;
    for (auto it = root_->begin(); it != root_->end(); ++it)
        if (!consumed_.count(it.key())) out[it.key()] = it.value().dump();
    return out;
}

Result<std::string> hf_config_file_of(const std::string& path) {
    if (ends_with(path, ".json")) return path;
    const std::string in_dir = (ends_with(path, "/") ? path : path + "/") + "config.json";
    if (file_exists(in_dir)) return in_dir;
    if (file_exists(path + "/."))
        return not_found_error(
            "{}: no config.json in this directory: not a Hugging Face "
            "checkpoint",
            path);
    return path;
}

std::string hf_config_text(const Json& object) {
    // json.dumps(config, indent=2, sort_keys=True) + "\n", as save_pretrained writes it.
    return object.dump(2, ' ', true) + "\n";
}

}  // namespace lathe
