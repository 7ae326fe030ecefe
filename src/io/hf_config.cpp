#include "io/hf_config.h"

#include <fmt/format.h>

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "core/check.h"
#include "core/strings.h"
#include "io/file.h"

namespace lathe {

namespace {

using Json = nlohmann::json;

struct ArchInfo {
    HfArch arch;
    std::string_view class_name;
    std::string_view model_type;
};

constexpr ArchInfo kArchs[] = {
    {HfArch::kLlama, "LlamaForCausalLM", "llama"},
    {HfArch::kMistral, "MistralForCausalLM", "mistral"},
    {HfArch::kQwen2, "Qwen2ForCausalLM", "qwen2"},
    {HfArch::kGptNeoX, "GPTNeoXForCausalLM", "gpt_neox"},
    {HfArch::kGpt2, "GPT2LMHeadModel", "gpt2"},
};

std::string supported_list() {
    std::string s;
    for (const ArchInfo& a : kArchs) s += fmt::format("{}{}", s.empty() ? "" : ", ", a.class_name);
    return s;
}

bool is_llama_family(HfArch a) {
    return a == HfArch::kLlama || a == HfArch::kMistral || a == HfArch::kQwen2;
}

std::optional<HfActivation> activation_from_name(std::string_view name) {
    if (name == "silu" || name == "swish") return HfActivation::kSilu;
    if (name == "gelu") return HfActivation::kGelu;
    if (name == "gelu_new" || name == "gelu_pytorch_tanh" || name == "gelu_fast")
        return HfActivation::kGeluTanh;
    if (name == "relu") return HfActivation::kRelu;
    return std::nullopt;
}

std::string json_kind(const Json& j) {
    if (j.is_null()) return "null";
    if (j.is_boolean()) return fmt::format("the boolean {}", j.get<bool>());
    if (j.is_number()) return fmt::format("the number {}", j.dump());
    if (j.is_string())
        return fmt::format("the string \"{}\"", escape_for_message(j.get<std::string>(), 40));
    if (j.is_array()) return "a list";
    return "an object";
}

// The config.json key names that differ between families.
struct KeyNames {
    const char* hidden_size;
    const char* intermediate_size;
    const char* num_hidden_layers;
    const char* num_attention_heads;
    const char* max_position_embeddings;
    const char* norm_eps;
    const char* hidden_act;
    const char* rope_theta;
    const char* partial_rotary_factor;
};

KeyNames key_names(HfArch a) {
    switch (a) {
        case HfArch::kGpt2:
            return {"n_embd",
                    "n_inner",
                    "n_layer",
                    "n_head",
                    "n_positions",
                    "layer_norm_epsilon",
                    "activation_function",
                    "rope_theta",
                    "partial_rotary_factor"};
        case HfArch::kGptNeoX:
            return {"hidden_size",         "intermediate_size",       "num_hidden_layers",
                    "num_attention_heads", "max_position_embeddings", "layer_norm_eps",
                    "hidden_act",          "rotary_emb_base",         "rotary_pct"};
        default:
            return {"hidden_size",
                    "intermediate_size",
                    "num_hidden_layers",
                    "num_attention_heads",
                    "max_position_embeddings",
                    "rms_norm_eps",
                    "hidden_act",
                    "rope_theta",
                    "partial_rotary_factor"};
    }
}

// Reads typed keys of one JSON object and remembers which keys it consumed.
class KeyReader {
public:
    KeyReader(const Json& obj, const std::string& where) : obj_(obj), where_(where) {}

    // Whether `key` is present (null included); marks it consumed.
    bool has(const std::string& key) {
        if (!obj_.contains(key)) return false;
        consumed_.insert(key);
        return true;
    }
    bool is_null(const std::string& key) { return has(key) && obj_[key].is_null(); }
    const Json& raw(const std::string& key) { return obj_[key]; }

    Status error(const std::string& key, const std::string& expected) const {
        return invalid_argument_error("{}: key '{}' must be {}, got {}", where_, key, expected,
                                      json_kind(obj_[key]));
    }

    // Integer keys: absent leaves *out as it is (the default); null is an error (use opt_int).
    Status int_key(const std::string& key, int64_t* out, int64_t min = 1) {
        if (!has(key)) return ok_status();
        const Json& v = obj_[key];
        const std::string expected = fmt::format("an integer >= {}", min);
        if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > INT64_MAX))
            return error(key, expected);
        if (v.get<int64_t>() < min) return error(key, expected);
        *out = v.get<int64_t>();
        return ok_status();
    }
    // Integer or null: null gives nullopt.
    Status opt_int_key(const std::string& key, std::optional<int64_t>* out, int64_t min = 0) {
        if (!has(key)) return ok_status();
        if (obj_[key].is_null()) {
            out->reset();
            return ok_status();
        }
        int64_t v = 0;
        LATHE_RETURN_IF_ERROR(int_key(key, &v, min));
        *out = v;
        return ok_status();
    }
    // Numbers (integers accepted, as Python's float() does).
    Status float_key(const std::string& key, double* out) {
        if (!has(key)) return ok_status();
        if (!obj_[key].is_number()) return error(key, "a number");
        *out = obj_[key].get<double>();
        return ok_status();
    }
    Status bool_key(const std::string& key, bool* out) {
        if (!has(key)) return ok_status();
        if (!obj_[key].is_boolean()) return error(key, "true or false");
        *out = obj_[key].get<bool>();
        return ok_status();
    }
    Status string_key(const std::string& key, std::string* out) {
        if (!has(key)) return ok_status();
        if (!obj_[key].is_string()) return error(key, "a string");
        *out = obj_[key].get<std::string>();
        return ok_status();
    }

    const std::set<std::string>& consumed() const { return consumed_; }

private:
    const Json& obj_;
    const std::string& where_;
    std::set<std::string> consumed_;
};

// Reads a rope_scaling-style object ({"rope_type": "llama3", ...}; "type" is the legacy name of
// "rope_type"). `key` names it in messages. nullopt for no scaling ("default" or null).
Result<std::optional<HfRopeScaling>> parse_rope_scaling(const Json& v, const std::string& key,
                                                        const std::string& where) {
    if (v.is_null()) return std::optional<HfRopeScaling>();
    if (!v.is_object())
        return invalid_argument_error("{}: key '{}' must be an object or null, got {}", where, key,
                                      json_kind(v));
    const char* type_key = v.contains("rope_type") ? "rope_type" : "type";
    if (!v.contains(type_key)) {
        // transformers 5's rope_parameters always carries rope_type; a bare {"rope_theta": ...}
        // is the default rotary embedding.
        if (key == "rope_parameters") return std::optional<HfRopeScaling>();
        return invalid_argument_error("{}: key '{}' has no \"rope_type\"", where, key);
    }
    if (!v[type_key].is_string())
        return invalid_argument_error("{}: key '{}.{}' must be a string, got {}", where, key,
                                      type_key, json_kind(v[type_key]));
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
                                          name, json_kind(v[name]));
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

// Consistency checks shared by parse and write. `where` names the file (or "config").
Status validate(const HfModelConfig& c, const std::string& where) {
    const KeyNames k = key_names(c.arch);
    auto bad = [&](const char* key, std::string msg) {
        return invalid_argument_error("{}: key '{}' {}", where, key, msg);
    };
    const std::pair<const char*, int64_t> positive[] = {
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
        if (v < 1) return bad(key, fmt::format("must be >= 1, got {}", v));
    if (c.num_attention_heads % c.num_key_value_heads != 0)
        return bad(
            "num_key_value_heads",
            fmt::format("({}) must divide {} ({}) for grouped-query attention",
                        c.num_key_value_heads, k.num_attention_heads, c.num_attention_heads));
    if (!(c.norm_eps > 0) || !std::isfinite(c.norm_eps))
        return bad(k.norm_eps, fmt::format("must be a positive number, got {}", c.norm_eps));
    if (!activation_from_name(c.hidden_act))
        return unimplemented_error(
            "{}: key '{}' is \"{}\"; lathe implements silu (swish), gelu, gelu_new, "
            "gelu_pytorch_tanh, gelu_fast and relu",
            where, k.hidden_act, escape_for_message(c.hidden_act));
    if (!is_llama_family(c.arch)) {
        if (c.num_key_value_heads != c.num_attention_heads)
            return bad("num_key_value_heads",
                       fmt::format("is not a {} setting: it must equal {} ({}), got {}",
                                   hf_arch_class_name(c.arch), k.num_attention_heads,
                                   c.num_attention_heads, c.num_key_value_heads));
        if (c.head_dim * c.num_attention_heads != c.hidden_size)
            return bad(k.hidden_size,
                       fmt::format("({}) must equal {} ({}) x the head size ({}) in {}",
                                   c.hidden_size, k.num_attention_heads, c.num_attention_heads,
                                   c.head_dim, hf_arch_class_name(c.arch)));
        if (!c.mlp_bias)
            return bad("mlp_bias", fmt::format("is not a {} setting: its MLP always has biases",
                                               hf_arch_class_name(c.arch)));
    } else if (c.arch != HfArch::kLlama) {
        if (c.attention_bias || c.mlp_bias)
            return bad(c.attention_bias ? "attention_bias" : "mlp_bias",
                       fmt::format("is not a {} setting (only LlamaForCausalLM has it)",
                                   hf_arch_class_name(c.arch)));
    }
    if (c.arch == HfArch::kGpt2) {
        if (!c.attention_bias)
            return bad("attention_bias",
                       "is not a GPT2LMHeadModel setting: its attention always has biases");
        if (c.rope_scaling || c.use_sliding_window || c.sliding_window || c.use_parallel_residual)
            return invalid_argument_error(
                "{}: GPT2LMHeadModel has no rotary embedding, sliding "
                "window or parallel residual",
                where);
        return ok_status();
    }
    if (!(c.rope_theta > 0) || !std::isfinite(c.rope_theta))
        return bad(k.rope_theta, fmt::format("must be a positive number, got {}", c.rope_theta));
    if (!(c.partial_rotary_factor > 0 && c.partial_rotary_factor <= 1))
        return bad(k.partial_rotary_factor,
                   fmt::format("must be in (0, 1], got {}", c.partial_rotary_factor));
    const int64_t rot = c.rotary_dim();
    if (rot < 2 || rot % 2 != 0)
        return bad(k.partial_rotary_factor,
                   fmt::format("gives {} rotary dimensions of head_dim {}; rotate-half RoPE needs "
                               "an even number >= 2",
                               rot, c.head_dim));
    if (c.rope_scaling) {
        const HfRopeScaling& r = *c.rope_scaling;
        if (!(r.factor >= 1))
            return bad("rope_scaling", fmt::format("factor must be >= 1, got {}", r.factor));
        if (!(r.low_freq_factor > 0) || !(r.high_freq_factor > r.low_freq_factor))
            return bad("rope_scaling",
                       fmt::format("needs 0 < low_freq_factor < high_freq_factor, got {} and {}",
                                   r.low_freq_factor, r.high_freq_factor));
        if (r.original_max_position_embeddings < 1)
            return bad("rope_scaling", "original_max_position_embeddings must be >= 1");
    }
    if (c.sliding_window && *c.sliding_window < 1)
        return bad("sliding_window",
                   fmt::format("must be >= 1 or null, got {}", *c.sliding_window));
    if (c.arch != HfArch::kQwen2 && (c.use_sliding_window || c.max_window_layers != 0))
        return bad("use_sliding_window", "is a Qwen2ForCausalLM setting");
    if (c.arch != HfArch::kMistral && c.arch != HfArch::kQwen2 && c.sliding_window)
        return bad("sliding_window",
                   fmt::format("is not a {} setting", hf_arch_class_name(c.arch)));
    if (c.arch == HfArch::kQwen2 && c.max_window_layers < 0)
        return bad("max_window_layers", "must be >= 0");
    if (c.arch != HfArch::kGptNeoX && c.use_parallel_residual)
        return bad("use_parallel_residual", "is a GPTNeoXForCausalLM setting");
    return ok_status();
}

}  // namespace

std::string_view hf_arch_class_name(HfArch arch) {
    return kArchs[size_t(arch)].class_name;
}
std::string_view hf_arch_model_type(HfArch arch) {
    return kArchs[size_t(arch)].model_type;
}

HfActivation HfModelConfig::activation() const {
    const std::optional<HfActivation> a = activation_from_name(hidden_act);
    LATHE_CHECK(a.has_value(), "unsupported activation '{}' (hf_config_parse rejects it)",
                hidden_act);
    return *a;
}

bool HfModelConfig::uses_rms_norm() const {
    return is_llama_family(arch);
}
bool HfModelConfig::uses_rotary() const {
    return arch != HfArch::kGpt2;
}

bool HfModelConfig::has_qkv_bias() const {
    switch (arch) {
        case HfArch::kLlama:
            return attention_bias;
        case HfArch::kMistral:
            return false;
        case HfArch::kQwen2:
            return true;
        case HfArch::kGptNeoX:
            return attention_bias;
        case HfArch::kGpt2:
            return true;
    }
    return false;
}

bool HfModelConfig::has_out_bias() const {
    switch (arch) {
        case HfArch::kLlama:
            return attention_bias;
        case HfArch::kMistral:
            return false;
        case HfArch::kQwen2:
            return false;
        case HfArch::kGptNeoX:
            return attention_bias;
        case HfArch::kGpt2:
            return true;
    }
    return false;
}

int64_t HfModelConfig::rotary_dim() const {
    if (!uses_rotary()) return 0;
    return int64_t(double(head_dim) * partial_rotary_factor);  // Python's int(): truncation
}

std::optional<int64_t> HfModelConfig::sliding_window_for_layer(int64_t layer) const {
    if (arch == HfArch::kMistral) return sliding_window;
    if (arch == HfArch::kQwen2 && use_sliding_window && sliding_window &&
        layer >= max_window_layers)
        return sliding_window;
    return std::nullopt;
}

HfModelConfig hf_config_default(HfArch arch) {
    HfModelConfig c;
    c.arch = arch;
    c.initializer_range = 0.02;
    switch (arch) {
        case HfArch::kLlama:  // LlamaConfig()
            c.vocab_size = 32000;
            c.hidden_size = 4096;
            c.intermediate_size = 11008;
            c.num_hidden_layers = 32;
            c.num_attention_heads = 32;
            c.num_key_value_heads = 32;  // None -> num_attention_heads
            c.max_position_embeddings = 2048;
            c.norm_eps = 1e-6;
            c.hidden_act = "silu";
            c.rope_theta = 10000.0;
            c.bos_token_id = 1;
            c.eos_token_ids = {2};
            break;
        case HfArch::kMistral:  // MistralConfig()
            c.vocab_size = 32000;
            c.hidden_size = 4096;
            c.intermediate_size = 14336;
            c.num_hidden_layers = 32;
            c.num_attention_heads = 32;
            c.num_key_value_heads = 8;
            c.max_position_embeddings = 4096 * 32;
            c.norm_eps = 1e-6;
            c.hidden_act = "silu";
            c.rope_theta = 10000.0;
            c.sliding_window = 4096;
            c.bos_token_id = 1;
            c.eos_token_ids = {2};
            break;
        case HfArch::kQwen2:  // Qwen2Config()
            c.vocab_size = 151936;
            c.hidden_size = 4096;
            c.intermediate_size = 22016;
            c.num_hidden_layers = 32;
            c.num_attention_heads = 32;
            c.num_key_value_heads = 32;
            c.max_position_embeddings = 32768;
            c.norm_eps = 1e-6;
            c.hidden_act = "silu";
            c.rope_theta = 10000.0;
            c.use_sliding_window = false;
            c.sliding_window = 4096;
            c.max_window_layers = 28;
            break;
        case HfArch::kGptNeoX:  // GPTNeoXConfig()
            c.vocab_size = 50432;
            c.hidden_size = 6144;
            c.intermediate_size = 24576;
            c.num_hidden_layers = 44;
            c.num_attention_heads = 64;
            c.num_key_value_heads = 64;
            c.max_position_embeddings = 2048;
            c.norm_eps = 1e-5;
            c.hidden_act = "gelu";
            c.rope_theta = 10000.0;
            c.partial_rotary_factor = 0.25;
            c.attention_bias = true;
            c.mlp_bias = true;
            c.use_parallel_residual = true;
            c.bos_token_id = 0;
            c.eos_token_ids = {2};
            break;
        case HfArch::kGpt2:  // GPT2Config()
            c.vocab_size = 50257;
            c.hidden_size = 768;
            c.intermediate_size = 4 * 768;  // n_inner None
            c.num_hidden_layers = 12;
            c.num_attention_heads = 12;
            c.num_key_value_heads = 12;
            c.max_position_embeddings = 1024;
            c.norm_eps = 1e-5;
            c.hidden_act = "gelu_new";
            c.rope_theta = 0.0;
            c.attention_bias = true;
            c.mlp_bias = true;
            c.tie_word_embeddings = true;  // PretrainedConfig's default
            c.bos_token_id = 50256;
            c.eos_token_ids = {50256};
            break;
    }
    c.head_dim = c.hidden_size / c.num_attention_heads;
    return c;
}

Result<HfModelConfig> hf_config_parse(std::string_view json_text, const std::string& source) {
    Json root;
    try {
        root = Json::parse(json_text.begin(), json_text.end());
    } catch (const Json::exception& e) {
        return invalid_argument_error("{}: not valid JSON: {}", source, e.what());
    }
    if (!root.is_object())
        return invalid_argument_error("{}: config.json must be a JSON object, got {}", source,
                                      json_kind(root));
    KeyReader r(root, source);

    // The family: from "architectures", else from "model_type"; the two must agree.
    std::optional<HfArch> arch;
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
            for (const ArchInfo& info : kArchs)
                if (!arch && info.class_name == names.back()) arch = info.arch;
        }
        if (!arch)
            return unimplemented_error("{}: key 'architectures' is [{}]; lathe supports {}", source,
                                       fmt::join(names, ", "), supported_list());
    } else if (!model_type.empty()) {
        for (const ArchInfo& info : kArchs)
            if (info.model_type == model_type) arch = info.arch;
        if (!arch)
            return unimplemented_error(
                "{}: key 'model_type' is \"{}\"; lathe supports llama, "
                "mistral, qwen2, gpt_neox and gpt2",
                source, escape_for_message(model_type));
    } else {
        return invalid_argument_error(
            "{}: neither 'architectures' nor 'model_type' says which "
            "model this is",
            source);
    }
    if (!model_type.empty() && model_type != hf_arch_model_type(*arch))
        return invalid_argument_error(
            "{}: key 'model_type' is \"{}\" but 'architectures' names {} (model_type \"{}\")",
            source, escape_for_message(model_type), hf_arch_class_name(*arch),
            hf_arch_model_type(*arch));

    HfModelConfig c = hf_config_default(*arch);
    const KeyNames k = key_names(c.arch);
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

    // Sizes.
    const bool gpt2 = c.arch == HfArch::kGpt2;
    if (gpt2) {
        // GPT2Config maps the generic names onto its own (attribute_map), so either spelling sets
        // the value; both at once must agree.
        const std::pair<const char*, int64_t*> aliases[] = {
            {"hidden_size", &c.hidden_size},
            {"num_hidden_layers", &c.num_hidden_layers},
            {"num_attention_heads", &c.num_attention_heads},
            {"max_position_embeddings", &c.max_position_embeddings},
        };
        const char* own[] = {"n_embd", "n_layer", "n_head", "n_positions"};
        for (size_t i = 0; i < 4; ++i) {
            int64_t a = -1, b = -1;
            LATHE_RETURN_IF_ERROR(r.int_key(own[i], &a));
            LATHE_RETURN_IF_ERROR(r.int_key(aliases[i].first, &b));
            if (a >= 0 && b >= 0 && a != b)
                return invalid_argument_error("{}: keys '{}' ({}) and '{}' ({}) disagree", source,
                                              own[i], a, aliases[i].first, b);
            if (a >= 0)
                *aliases[i].second = a;
            else if (b >= 0)
                *aliases[i].second = b;
        }
        std::optional<int64_t> n_inner;
        LATHE_RETURN_IF_ERROR(r.opt_int_key("n_inner", &n_inner, 1));
        if (!n_inner && c.hidden_size > std::numeric_limits<int64_t>::max() / 4) {
            return invalid_argument_error(
                "{}: key 'n_embd' ({}) is too large: the default n_inner, 4 * n_embd, does not "
                "fit a 64-bit integer",
                source, c.hidden_size);
        }
        c.intermediate_size = n_inner ? *n_inner : 4 * c.hidden_size;
    } else {
        LATHE_RETURN_IF_ERROR(r.int_key(k.hidden_size, &c.hidden_size));
        LATHE_RETURN_IF_ERROR(r.int_key(k.intermediate_size, &c.intermediate_size));
        LATHE_RETURN_IF_ERROR(r.int_key(k.num_hidden_layers, &c.num_hidden_layers));
        LATHE_RETURN_IF_ERROR(r.int_key(k.num_attention_heads, &c.num_attention_heads));
        LATHE_RETURN_IF_ERROR(r.int_key(k.max_position_embeddings, &c.max_position_embeddings));
    }
    LATHE_RETURN_IF_ERROR(r.float_key(k.norm_eps, &c.norm_eps));
    LATHE_RETURN_IF_ERROR(r.string_key(k.hidden_act, &c.hidden_act));

    // Heads.
    c.num_key_value_heads = c.num_attention_heads;
    std::string kv_origin = "given";
    if (is_llama_family(c.arch)) {
        if (!r.has("num_key_value_heads")) {
            // The class default when the key is absent: None (Llama), 8 (Mistral), 32 (Qwen2).
            c.num_key_value_heads = c.arch == HfArch::kMistral ? 8
                                    : c.arch == HfArch::kQwen2 ? 32
                                                               : c.num_attention_heads;
            kv_origin = fmt::format("the {} default, as the key is absent",
                                    c.arch == HfArch::kMistral ? "MistralConfig" : "Qwen2Config");
        } else if (!r.is_null("num_key_value_heads")) {
            LATHE_RETURN_IF_ERROR(r.int_key("num_key_value_heads", &c.num_key_value_heads));
        }
        if (c.num_key_value_heads > c.num_attention_heads ||
            c.num_attention_heads % c.num_key_value_heads != 0)
            return invalid_argument_error(
                "{}: key 'num_key_value_heads' ({}, {}) must divide num_attention_heads ({})",
                source, c.num_key_value_heads, kv_origin, c.num_attention_heads);
        std::optional<int64_t> head_dim;
        LATHE_RETURN_IF_ERROR(r.opt_int_key("head_dim", &head_dim, 1));
        if (head_dim) {
            c.head_dim = *head_dim;
        } else {
            if (c.hidden_size % c.num_attention_heads != 0)
                return invalid_argument_error(
                    "{}: key 'hidden_size' ({}) is not a multiple of num_attention_heads ({}); "
                    "set head_dim",
                    source, c.hidden_size, c.num_attention_heads);
            c.head_dim = c.hidden_size / c.num_attention_heads;
        }
    } else {
        if (c.hidden_size % c.num_attention_heads != 0)
            return invalid_argument_error("{}: key '{}' ({}) is not a multiple of {} ({})", source,
                                          k.hidden_size, c.hidden_size, k.num_attention_heads,
                                          c.num_attention_heads);
        c.head_dim = c.hidden_size / c.num_attention_heads;
    }

    // RoPE: the Hub's keys, and transformers 5's rope_parameters; both at once must agree.
    if (c.uses_rotary()) {
        std::optional<double> theta, partial;
        std::optional<HfRopeScaling> scaling;
        bool have_scaling = false;
        if (r.has(k.rope_theta)) {
            double v = 0;
            LATHE_RETURN_IF_ERROR(r.float_key(k.rope_theta, &v));
            theta = v;
        }
        if (r.has(k.partial_rotary_factor)) {
            double v = 0;
            LATHE_RETURN_IF_ERROR(r.float_key(k.partial_rotary_factor, &v));
            partial = v;
        }
        if (r.has("rope_scaling")) {
            LATHE_ASSIGN_OR_RETURN(
                scaling, parse_rope_scaling(r.raw("rope_scaling"), "rope_scaling", source));
            have_scaling = true;
        }
        if (r.has("rope_parameters") && !r.raw("rope_parameters").is_null()) {
            const Json& p = r.raw("rope_parameters");
            LATHE_ASSIGN_OR_RETURN(std::optional<HfRopeScaling> s2,
                                   parse_rope_scaling(p, "rope_parameters", source));
            if (have_scaling && s2 != scaling)
                return invalid_argument_error(
                    "{}: keys 'rope_scaling' and 'rope_parameters' "
                    "describe different rope scaling",
                    source);
            scaling = s2;
            auto merge = [&](const char* sub, const char* legacy,
                             std::optional<double>* into) -> Status {
                if (!p.contains(sub)) return ok_status();
                if (!p[sub].is_number())
                    return invalid_argument_error(
                        "{}: key 'rope_parameters.{}' must be a number, "
                        "got {}",
                        source, sub, json_kind(p[sub]));
                const double v = p[sub].get<double>();
                if (*into && **into != v)
                    return invalid_argument_error(
                        "{}: keys '{}' ({}) and 'rope_parameters.{}' ({}) "
                        "disagree",
                        source, legacy, **into, sub, v);
                *into = v;
                return ok_status();
            };
            LATHE_RETURN_IF_ERROR(merge("rope_theta", k.rope_theta, &theta));
            LATHE_RETURN_IF_ERROR(
                merge("partial_rotary_factor", k.partial_rotary_factor, &partial));
        }
        if (theta) c.rope_theta = *theta;
        if (partial) c.partial_rotary_factor = *partial;
        c.rope_scaling = scaling;
    }

    // Family flags.
    switch (c.arch) {
        case HfArch::kLlama:
            LATHE_RETURN_IF_ERROR(r.bool_key("attention_bias", &c.attention_bias));
            LATHE_RETURN_IF_ERROR(r.bool_key("mlp_bias", &c.mlp_bias));
            break;
        case HfArch::kMistral:
            LATHE_RETURN_IF_ERROR(r.opt_int_key("sliding_window", &c.sliding_window, 1));
            // MistralConfig ignores layer_types (it applies sliding_window to every layer).
            r.has("layer_types");
            break;
        case HfArch::kQwen2: {
            LATHE_RETURN_IF_ERROR(r.bool_key("use_sliding_window", &c.use_sliding_window));
            LATHE_RETURN_IF_ERROR(r.opt_int_key("sliding_window", &c.sliding_window, 1));
            LATHE_RETURN_IF_ERROR(r.int_key("max_window_layers", &c.max_window_layers, 0));
            if (r.has("layer_types") && !r.raw("layer_types").is_null()) {
                // transformers 5 spells the per-layer pattern out; lathe derives it, so it must
                // be the derived one.
                const Json& lt = r.raw("layer_types");
                bool same = lt.is_array() && int64_t(lt.size()) == c.num_hidden_layers;
                for (int64_t i = 0; same && i < c.num_hidden_layers; ++i) {
                    const char* want =
                        c.sliding_window_for_layer(i) ? "sliding_attention" : "full_attention";
                    same = lt[size_t(i)].is_string() && lt[size_t(i)].get<std::string>() == want;
                }
                if (!same)
                    return unimplemented_error(
                        "{}: key 'layer_types' is not the pattern that use_sliding_window, "
                        "sliding_window and max_window_layers give; lathe supports that pattern "
                        "only",
                        source);
            }
            break;
        }
        case HfArch::kGptNeoX:
            LATHE_RETURN_IF_ERROR(r.bool_key("use_parallel_residual", &c.use_parallel_residual));
            LATHE_RETURN_IF_ERROR(r.bool_key("attention_bias", &c.attention_bias));
            break;
        case HfArch::kGpt2: {
            // Settings GPT-2 checkpoints never change and lathe does not implement; left in
            // `extra` (so written back), but refused when set otherwise.
            const std::pair<const char*, bool> fixed[] = {
                {"scale_attn_weights", true},
                {"scale_attn_by_inverse_layer_idx", false},
                {"add_cross_attention", false},
            };
            for (const auto& [key, want] : fixed) {
                if (!root.contains(key)) continue;
                if (!root[key].is_boolean()) return r.error(key, "true or false");
                if (root[key].get<bool>() != want)
                    return unimplemented_error(
                        "{}: key '{}' is {}; lathe implements GPT-2 with {} only", source, key,
                        !want, want);
            }
            break;
        }
    }

    // Everything else is kept verbatim.
    for (auto it = root.begin(); it != root.end(); ++it)
        if (!r.consumed().count(it.key())) c.extra[it.key()] = it.value().dump();

    LATHE_RETURN_IF_ERROR(validate(c, source));
    return c;
}

Result<HfModelConfig> hf_config_load(const std::string& path) {
    std::string file = path;
    if (!ends_with(path, ".json")) {
        const std::string in_dir = (ends_with(path, "/") ? path : path + "/") + "config.json";
        if (file_exists(in_dir))
            file = in_dir;
        else if (file_exists(path + "/."))
            return not_found_error(
                "{}: no config.json in this directory: not a Hugging Face "
                "checkpoint",
                path);
    }
    LATHE_ASSIGN_OR_RETURN(std::string text, file_read_all(file));
    return hf_config_parse(text, file);
}

Result<std::string> hf_config_to_json(const HfModelConfig& c) {
    LATHE_RETURN_IF_ERROR(validate(c, "config"));
    Json out = Json::object();
    for (const auto& [key, text] : c.extra) {
        try {
            out[key] = Json::parse(text);
        } catch (const Json::exception& e) {
            return invalid_argument_error("config: extra key '{}' holds invalid JSON text: {}", key,
                                          e.what());
        }
    }
    const KeyNames k = key_names(c.arch);
    out["architectures"] = {std::string(hf_arch_class_name(c.arch))};
    out["model_type"] = std::string(hf_arch_model_type(c.arch));
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
    out[k.norm_eps] = c.norm_eps;
    out[k.hidden_act] = c.hidden_act;
    if (c.arch == HfArch::kGpt2) {
        out["n_embd"] = c.hidden_size;
        out["n_layer"] = c.num_hidden_layers;
        out["n_head"] = c.num_attention_heads;
        out["n_positions"] = c.max_position_embeddings;
        out["n_inner"] =
            c.intermediate_size == 4 * c.hidden_size ? Json(nullptr) : Json(c.intermediate_size);
    } else {
        out[k.hidden_size] = c.hidden_size;
        out[k.intermediate_size] = c.intermediate_size;
        out[k.num_hidden_layers] = c.num_hidden_layers;
        out[k.num_attention_heads] = c.num_attention_heads;
        out[k.max_position_embeddings] = c.max_position_embeddings;
        out[k.rope_theta] = c.rope_theta;
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
    switch (c.arch) {
        case HfArch::kLlama:
        case HfArch::kMistral:
        case HfArch::kQwen2:
            out["num_key_value_heads"] = c.num_key_value_heads;
            // Qwen2Config has no head_dim (the model reads it with getattr, defaulting to
            // hidden_size / heads), so Qwen2 writes it only when it differs from that.
            if (c.arch != HfArch::kQwen2 || c.head_dim * c.num_attention_heads != c.hidden_size)
                out["head_dim"] = c.head_dim;
            if (c.partial_rotary_factor != 1.0)
                out["partial_rotary_factor"] = c.partial_rotary_factor;
            break;
        case HfArch::kGptNeoX:
            out["rotary_pct"] = c.partial_rotary_factor;
            out["use_parallel_residual"] = c.use_parallel_residual;
            out["attention_bias"] = c.attention_bias;
            break;
        case HfArch::kGpt2:
            break;
    }
    if (c.arch == HfArch::kLlama) {
        out["attention_bias"] = c.attention_bias;
        out["mlp_bias"] = c.mlp_bias;
    }
    if (c.arch == HfArch::kMistral)
        out["sliding_window"] = c.sliding_window ? Json(*c.sliding_window) : Json(nullptr);
    if (c.arch == HfArch::kQwen2) {
        out["use_sliding_window"] = c.use_sliding_window;
        out["sliding_window"] = c.sliding_window ? Json(*c.sliding_window) : Json(nullptr);
        out["max_window_layers"] = c.max_window_layers;
    }
    // json.dumps(config, indent=2, sort_keys=True) + "\n", as save_pretrained writes it.
    return out.dump(2, ' ', true) + "\n";
}

Status hf_config_save(const std::string& path, const HfModelConfig& config) {
    LATHE_ASSIGN_OR_RETURN(std::string text, hf_config_to_json(config));
    return file_write_atomic(path, text);
}

}  // namespace lathe
