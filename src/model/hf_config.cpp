#include "model/hf_config.h"

#include <fmt/format.h>

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

#include "core/check.h"
#include "core/strings.h"
#include "io/file.h"
#include "model/registry.h"

namespace lathe {

using Json = nlohmann::json;

namespace {

const ModelFamily& family_of(const HfModelConfig& c) {
    LATHE_CHECK(c.family != nullptr, "an HfModelConfig without its family");
    return *c.family;
}

// The first registered family that has the family-only `setting`.
std::string_view setting_owner(HfSetting setting) {
    for (const ModelFamily* f : model_families())
        if (f->hf_settings & setting) return f->architecture;
    return "another family's";
}

// The family that "architectures" (else "model_type") names, among `families`; the two must
// agree.
Result<const ModelFamily*> find_family(HfConfigReader& r,
                                       std::span<const ModelFamily* const> families) {
    const std::string& source = r.where();
    const ModelFamily* family = nullptr;
    std::string model_type;
    LATHE_RETURN_IF_ERROR(r.string_key("model_type", &model_type));
    if (r.has("architectures") && !r.raw("architectures").is_null()) {
        const Json& a = r.raw("architectures");
        if (!a.is_array() || a.empty())
            return r.error("architectures", "a non-empty list of class names");
        std::vector<std::string> names;
        for (const Json& n : a) {
            if (!n.is_string()) return r.error("architectures", "a list of strings");
            names.push_back(n.get<std::string>());
            for (const ModelFamily* f : families)
                if (!family && f->architecture == names.back()) family = f;
        }
        if (!family) {
            std::string supported;
            for (const ModelFamily* f : families)
                supported += fmt::format("{}{}", supported.empty() ? "" : ", ", f->architecture);
            return unimplemented_error("{}: key 'architectures' is [{}]; lathe supports {}", source,
                                       fmt::join(names, ", "), supported);
        }
    } else if (!model_type.empty()) {
        for (const ModelFamily* f : families)
            if (f->model_type == model_type) family = f;
        if (!family) {
            std::string supported;
            for (size_t i = 0; i < families.size(); ++i)
                supported += fmt::format("{}{}",
                                         i == 0                     ? ""
                                         : i + 1 == families.size() ? " and "
                                                                    : ", ",
                                         families[i]->model_type);
            return unimplemented_error("{}: key 'model_type' is \"{}\"; lathe supports {}", source,
                                       escape_for_message(model_type), supported);
        }
    } else {
        return invalid_argument_error(
            "{}: neither 'architectures' nor 'model_type' says which "
            "model this is",
            source);
    }
    if (!model_type.empty() && model_type != family->model_type)
        return invalid_argument_error(
            "{}: key 'model_type' is \"{}\" but 'architectures' names {} (model_type \"{}\")",
            source, escape_for_message(model_type), family->architecture, family->model_type);
    return family;
}

// The keys every transformers config has: vocabulary, init, tying, special tokens, dtype.
Status read_shared_keys(HfConfigReader& r, HfModelConfig& c) {
    const std::string& source = r.where();
    LATHE_RETURN_IF_ERROR(r.int_key("vocab_size", &c.vocab_size));
    LATHE_RETURN_IF_ERROR(r.float_key("initializer_range", &c.initializer_range));
    LATHE_RETURN_IF_ERROR(r.bool_key("tie_word_embeddings", &c.tie_word_embeddings));
    LATHE_RETURN_IF_ERROR(r.opt_int_key("bos_token_id", &c.bos_token_id));
    LATHE_RETURN_IF_ERROR(r.opt_int_key("pad_token_id", &c.pad_token_id));
    if (r.has("eos_token_id")) {
        const Json& e = r.raw("eos_token_id");
        c.eos_token_ids.clear();
        // Several ids are always written as a list; the flag keeps [id] and [] as lists too.
        c.eos_token_id_is_list = e.is_array() && e.size() <= 1;
        if (e.is_array()) {
            for (const Json& id : e) {
                if (!id.is_number_unsigned())
                    return r.error("eos_token_id", "a token id, a list of token ids or null");
                c.eos_token_ids.push_back(id.get<int64_t>());
            }
        } else if (!e.is_null()) {
            std::optional<int64_t> id;
            LATHE_RETURN_IF_ERROR(r.opt_int_key("eos_token_id", &id));
            c.eos_token_ids.push_back(*id);
        }
    }
    // transformers 5 writes "dtype", earlier versions "torch_dtype".
    for (const char* key : {"torch_dtype", "dtype"}) {
        if (r.is_null(key) || !r.has(key)) continue;
        std::string v;
        LATHE_RETURN_IF_ERROR(r.string_key(key, &v));
        if (!c.torch_dtype.empty() && c.torch_dtype != v)
            return invalid_argument_error(
                "{}: keys 'torch_dtype' (\"{}\") and 'dtype' (\"{}\") "
                "disagree",
                source, c.torch_dtype, v);
        c.torch_dtype = v;
    }
    return ok_status();
}

// The rotary checks of a family with RoPE.
Status check_rotary(const HfModelConfig& c, const std::string& where) {
    const HfKeyNames& k = family_of(c).hf_keys;
    if (!(c.rope_theta > 0) || !std::isfinite(c.rope_theta))
        return hf_key_error(where, k.rope_theta,
                            fmt::format("must be a positive number, got {}", c.rope_theta));
    if (!(c.partial_rotary_factor > 0 && c.partial_rotary_factor <= 1))
        return hf_key_error(where, k.partial_rotary_factor,
                            fmt::format("must be in (0, 1], got {}", c.partial_rotary_factor));
    const int64_t rot = c.rotary_dim();
    if (rot < 2 || rot % 2 != 0)
        return hf_key_error(
            where, k.partial_rotary_factor,
            fmt::format("gives {} rotary dimensions of head_dim {}; rotate-half RoPE needs "
                        "an even number >= 2",
                        rot, c.head_dim));
    if (c.rope_scaling) {
        const HfRopeScaling& r = *c.rope_scaling;
        if (!(r.factor >= 1))
            return hf_key_error(where, "rope_scaling",
                                fmt::format("factor must be >= 1, got {}", r.factor));
        if (!(r.low_freq_factor > 0) || !(r.high_freq_factor > r.low_freq_factor))
            return hf_key_error(
                where, "rope_scaling",
                fmt::format("needs 0 < low_freq_factor < high_freq_factor, got {} and {}",
                            r.low_freq_factor, r.high_freq_factor));
        if (r.original_max_position_embeddings < 1)
            return hf_key_error(where, "rope_scaling",
                                "original_max_position_embeddings must be >= 1");
    }
    return ok_status();
}

// The family-only settings: valid values in the family that has them, refused in the others.
Status check_family_settings(const HfModelConfig& c, const std::string& where) {
    const ModelFamily& f = family_of(c);
    if (c.sliding_window && *c.sliding_window < 1)
        return hf_key_error(where, "sliding_window",
                            fmt::format("must be >= 1 or null, got {}", *c.sliding_window));
    if (!(f.hf_settings & kHfWindowLayers) && (c.use_sliding_window || c.max_window_layers != 0))
        return hf_key_error(where, "use_sliding_window",
                            fmt::format("is a {} setting", setting_owner(kHfWindowLayers)));
    if (!(f.hf_settings & kHfSlidingWindow) && c.sliding_window)
        return hf_key_error(where, "sliding_window",
                            fmt::format("is not a {} setting", f.architecture));
    if ((f.hf_settings & kHfWindowLayers) && c.max_window_layers < 0)
        return hf_key_error(where, "max_window_layers", "must be >= 0");
    if (!(f.hf_settings & kHfParallelResidual) && c.use_parallel_residual)
        return hf_key_error(where, "use_parallel_residual",
                            fmt::format("is a {} setting", setting_owner(kHfParallelResidual)));
    return ok_status();
}

}  // namespace

std::string_view HfModelConfig::model_type() const {
    return family_of(*this).model_type;
}
std::string_view HfModelConfig::architecture() const {
    return family_of(*this).architecture;
}

HfActivation HfModelConfig::activation() const {
    const std::optional<HfActivation> a = hf_activation_from_name(hidden_act);
    LATHE_CHECK(a.has_value(), "unsupported activation '{}' (hf_config_parse rejects it)",
                hidden_act);
    return *a;
}

bool HfModelConfig::uses_rms_norm() const {
    return family_of(*this).hf_rms_norm;
}
bool HfModelConfig::uses_rotary() const {
    return family_of(*this).hf_rotary;
}
bool HfModelConfig::has_qkv_bias() const {
    return family_of(*this).hf_qkv_bias(*this);
}
bool HfModelConfig::has_out_bias() const {
    return family_of(*this).hf_out_bias(*this);
}

int64_t HfModelConfig::rotary_dim() const {
    if (!uses_rotary()) return 0;
    return int64_t(double(head_dim) * partial_rotary_factor);  // Python's int(): truncation
}

std::optional<int64_t> HfModelConfig::sliding_window_for_layer(int64_t layer) const {
    const ModelFamily& f = family_of(*this);
    if (!f.hf_layer_window) return std::nullopt;
    return f.hf_layer_window(*this, layer);
}

HfModelConfig hf_config_default(const ModelFamily& family) {
    HfModelConfig c = family.hf_defaults();
    c.family = &family;
    c.head_dim = c.hidden_size / c.num_attention_heads;
    return c;
}

Status hf_config_check(const HfModelConfig& c, const std::string& where) {
    const ModelFamily& f = family_of(c);
    const HfKeyNames& k = f.hf_keys;
    const std::pair<std::string_view, int64_t> positive[] = {
        {"vocab_size", c.vocab_size},
        {k.hidden_size, c.hidden_size},
        {k.intermediate_size, c.intermediate_size},
        {k.num_hidden_layers, c.num_hidden_layers},
        {k.num_attention_heads, c.num_attention_heads},
        {"num_key_value_heads", c.num_key_value_heads},
        {"head_dim", c.head_dim},
        {k.max_position_embeddings, c.max_position_embeddings},
    };
    for (const auto& [key, v] : positive)
        if (v < 1) return hf_key_error(where, key, fmt::format("must be >= 1, got {}", v));
    if (c.num_attention_heads % c.num_key_value_heads != 0)
        return hf_key_error(
            where, "num_key_value_heads",
            fmt::format("({}) must divide {} ({}) for grouped-query attention",
                        c.num_key_value_heads, k.num_attention_heads, c.num_attention_heads));
    if (!(c.norm_eps > 0) || !std::isfinite(c.norm_eps))
        return hf_key_error(where, k.norm_eps,
                            fmt::format("must be a positive number, got {}", c.norm_eps));
    if (!hf_activation_from_name(c.hidden_act))
        return unimplemented_error(
            "{}: key '{}' is \"{}\"; lathe implements silu (swish), gelu, gelu_new, "
            "gelu_pytorch_tanh, gelu_fast and relu",
            where, k.hidden_act, escape_for_message(c.hidden_act));
    if (f.hf_validate) LATHE_RETURN_IF_ERROR(f.hf_validate(c, where));
    if (!f.hf_rotary) return ok_status();
    LATHE_RETURN_IF_ERROR(check_rotary(c, where));
    return check_family_settings(c, where);
}

Result<HfModelConfig> hf_config_parse(std::string_view json_text, const std::string& source) {
    return hf_config_parse(json_text, source, model_families());
}

Result<HfModelConfig> hf_config_parse(std::string_view json_text, const std::string& source,
                                      std::span<const ModelFamily* const> families) {
    LATHE_ASSIGN_OR_RETURN(HfConfigReader r, HfConfigReader::parse(json_text, source));
    LATHE_ASSIGN_OR_RETURN(const ModelFamily* family, find_family(r, families));
    HfModelConfig c = hf_config_default(*family);
    LATHE_RETURN_IF_ERROR(read_shared_keys(r, c));
    LATHE_RETURN_IF_ERROR(family->hf_parse(r, c));
    // Everything else is kept verbatim.
    c.extra = r.unconsumed();
    LATHE_RETURN_IF_ERROR(hf_config_check(c, source));
    return c;
}

Result<HfModelConfig> hf_config_load(const std::string& path) {
    LATHE_ASSIGN_OR_RETURN(const std::string file, hf_config_file_of(path));
    LATHE_ASSIGN_OR_RETURN(std::string text, file_read_all(file));
    return hf_config_parse(text, file);
}

Result<std::string> hf_config_to_json(const HfModelConfig& c) {
    LATHE_RETURN_IF_ERROR(hf_config_check(c, "config"));
    const ModelFamily& f = family_of(c);
    Json out = Json::object();
    for (const auto& [key, text] : c.extra) {
        try {
            out[key] = Json::parse(text);
        } catch (const Json::exception& e) {
            return invalid_argument_error("config: extra key '{}' holds invalid JSON text: {}", key,
                                          e.what());
        }
    }
    out["architectures"] = {std::string(f.architecture)};
    out["model_type"] = std::string(f.model_type);
    out["vocab_size"] = c.vocab_size;
    out["initializer_range"] = c.initializer_range;
    out["tie_word_embeddings"] = c.tie_word_embeddings;
    out["bos_token_id"] = c.bos_token_id ? Json(*c.bos_token_id) : Json(nullptr);
    if (c.eos_token_id_is_list || c.eos_token_ids.size() > 1)
        out["eos_token_id"] = c.eos_token_ids;
    else if (c.eos_token_ids.size() == 1)
        out["eos_token_id"] = c.eos_token_ids[0];
    else
        out["eos_token_id"] = nullptr;
    if (c.pad_token_id) out["pad_token_id"] = *c.pad_token_id;
    if (!c.torch_dtype.empty()) out["torch_dtype"] = c.torch_dtype;
    out.erase("dtype");  // torch_dtype is the one spelling written
    out[std::string(f.hf_keys.norm_eps)] = c.norm_eps;
    out[std::string(f.hf_keys.hidden_act)] = c.hidden_act;
    f.hf_write(c, out);
    return hf_config_text(out);
}

Status hf_config_save(const std::string& path, const HfModelConfig& config) {
    LATHE_ASSIGN_OR_RETURN(std::string text, hf_config_to_json(config));
    return file_write_atomic(path, text);
}

Status hf_key_error(const std::string& where, std::string_view key, std::string_view what) {
    return invalid_argument_error("{}: key '{}' {}", where, key, what);
}

Status hf_read_sizes(HfConfigReader& r, HfModelConfig& c) {
    const HfKeyNames& k = family_of(c).hf_keys;
    LATHE_RETURN_IF_ERROR(r.int_key(std::string(k.hidden_size), &c.hidden_size));
    LATHE_RETURN_IF_ERROR(r.int_key(std::string(k.intermediate_size), &c.intermediate_size));
    LATHE_RETURN_IF_ERROR(r.int_key(std::string(k.num_hidden_layers), &c.num_hidden_layers));
    LATHE_RETURN_IF_ERROR(r.int_key(std::string(k.num_attention_heads), &c.num_attention_heads));
    return r.int_key(std::string(k.max_position_embeddings), &c.max_position_embeddings);
}

Status hf_read_norm_and_activation(HfConfigReader& r, HfModelConfig& c) {
    const HfKeyNames& k = family_of(c).hf_keys;
    LATHE_RETURN_IF_ERROR(r.float_key(std::string(k.norm_eps), &c.norm_eps));
    return r.string_key(std::string(k.hidden_act), &c.hidden_act);
}

Status hf_derive_multi_head(HfModelConfig& c, const std::string& source) {
    const HfKeyNames& k = family_of(c).hf_keys;
    c.num_key_value_heads = c.num_attention_heads;
    if (c.hidden_size % c.num_attention_heads != 0)
        return invalid_argument_error("{}: key '{}' ({}) is not a multiple of {} ({})", source,
                                      k.hidden_size, c.hidden_size, k.num_attention_heads,
                                      c.num_attention_heads);
    c.head_dim = c.hidden_size / c.num_attention_heads;
    return ok_status();
}

Status hf_read_rotary(HfConfigReader& r, HfModelConfig& c) {
    // The Hub's keys, and transformers 5's rope_parameters; both at once must agree.
    const std::string& source = r.where();
    const std::string theta_key(family_of(c).hf_keys.rope_theta);
    const std::string partial_key(family_of(c).hf_keys.partial_rotary_factor);
    std::optional<double> theta, partial;
    std::optional<HfRopeScaling> scaling;
    bool have_scaling = false;
    if (r.has(theta_key)) {
        double v = 0;
        LATHE_RETURN_IF_ERROR(r.float_key(theta_key, &v));
        theta = v;
    }
    if (r.has(partial_key)) {
        double v = 0;
        LATHE_RETURN_IF_ERROR(r.float_key(partial_key, &v));
        partial = v;
    }
    if (r.has("rope_scaling")) {
        LATHE_ASSIGN_OR_RETURN(
            scaling, hf_parse_rope_scaling(r.raw("rope_scaling"), "rope_scaling", source));
        have_scaling = true;
    }
    if (r.has("rope_parameters") && !r.raw("rope_parameters").is_null()) {
        const Json& p = r.raw("rope_parameters");
        LATHE_ASSIGN_OR_RETURN(std::optional<HfRopeScaling> s2,
                               hf_parse_rope_scaling(p, "rope_parameters", source));
        if (have_scaling && s2 != scaling)
            return invalid_argument_error(
                "{}: keys 'rope_scaling' and 'rope_parameters' "
                "describe different rope scaling",
                source);
        scaling = s2;
        auto merge = [&](const char* sub, const std::string& legacy,
                         std::optional<double>* into) -> Status {
            if (!p.contains(sub)) return ok_status();
            if (!p[sub].is_number())
                return invalid_argument_error(
                    "{}: key 'rope_parameters.{}' must be a number, "
                    "got {}",
                    source, sub, hf_json_kind(p[sub]));
            const double v = p[sub].get<double>();
            if (*into && **into != v)
                return invalid_argument_error(
                    "{}: keys '{}' ({}) and 'rope_parameters.{}' ({}) "
                    "disagree",
                    source, legacy, **into, sub, v);
            *into = v;
            return ok_status();
        };
        LATHE_RETURN_IF_ERROR(merge("rope_theta", theta_key, &theta));
        LATHE_RETURN_IF_ERROR(merge("partial_rotary_factor", partial_key, &partial));
    }
    if (theta) c.rope_theta = *theta;
    if (partial) c.partial_rotary_factor = *partial;
    c.rope_scaling = scaling;
    return ok_status();
}

void hf_write_sizes_and_rotary(const HfModelConfig& c, Json& out) {
    const HfKeyNames& k = family_of(c).hf_keys;
    out[std::string(k.hidden_size)] = c.hidden_size;
    out[std::string(k.intermediate_size)] = c.intermediate_size;
    out[std::string(k.num_hidden_layers)] = c.num_hidden_layers;
    out[std::string(k.num_attention_heads)] = c.num_attention_heads;
    out[std::string(k.max_position_embeddings)] = c.max_position_embeddings;
    out[std::string(k.rope_theta)] = c.rope_theta;
    if (c.rope_scaling) {
        const HfRopeScaling& s = *c.rope_scaling;
        out["rope_scaling"] = {
            {"rope_type", "llama3"},
            {"factor", s.factor},
            {"low_freq_factor", s.low_freq_factor},
            {"high_freq_factor", s.high_freq_factor},
            {"original_max_position_embeddings", s.original_max_position_embeddings}};
    } else {
        out["rope_scaling"] = nullptr;
    }
}

Status hf_check_multi_head_with_mlp_bias(const HfModelConfig& c, const std::string& where) {
    const ModelFamily& f = family_of(c);
    const HfKeyNames& k = f.hf_keys;
    if (c.num_key_value_heads != c.num_attention_heads)
        return hf_key_error(
            where, "num_key_value_heads",
            fmt::format("is not a {} setting: it must equal {} ({}), got {}", f.architecture,
                        k.num_attention_heads, c.num_attention_heads, c.num_key_value_heads));
    if (c.head_dim * c.num_attention_heads != c.hidden_size)
        return hf_key_error(
            where, k.hidden_size,
            fmt::format("({}) must equal {} ({}) x the head size ({}) in {}", c.hidden_size,
                        k.num_attention_heads, c.num_attention_heads, c.head_dim, f.architecture));
    if (!c.mlp_bias)
        return hf_key_error(
            where, "mlp_bias",
            fmt::format("is not a {} setting: its MLP always has biases", f.architecture));
    return ok_status();
}

}  // namespace lathe
