// Qwen2 (Qwen2ForCausalLM): Llama plus biases on the q, k and v projections (always; o_proj and
// the MLP have none). With use_sliding_window (false in every released Qwen2/Qwen2.5 checkpoint)
// the layers from max_window_layers up attend within sliding_window keys; the block schedule
// takes each layer's window. Qwen2Config's quirks: num_key_value_heads absent is 32, null is
// num_attention_heads; it has no head_dim key (the model reads it with getattr, defaulting to
// hidden_size / heads), so it is written only when it differs from that.

#include <nlohmann/json.hpp>

#include "model/llama_like.h"
#include "model/registry.h"

namespace lathe {

namespace {

HfModelConfig qwen2_defaults() {  // Qwen2Config()
    HfModelConfig c;
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
    return c;
}

std::optional<int64_t> qwen2_layer_window(const HfModelConfig& c, int64_t layer) {
    if (c.use_sliding_window && c.sliding_window && layer >= c.max_window_layers)
        return c.sliding_window;
    return std::nullopt;
}

Status qwen2_parse(HfConfigReader& r, HfModelConfig& c) {
    LATHE_RETURN_IF_ERROR(llama_like_read(r, c, 32, "Qwen2Config"));
    LATHE_RETURN_IF_ERROR(r.bool_key("use_sliding_window", &c.use_sliding_window));
    LATHE_RETURN_IF_ERROR(r.opt_int_key("sliding_window", &c.sliding_window, 1));
    LATHE_RETURN_IF_ERROR(r.int_key("max_window_layers", &c.max_window_layers, 0));
    if (r.has("layer_types") && !r.raw("layer_types").is_null()) {
        // transformers 5 spells the per-layer pattern out; lathe derives it, so it must be the
        // derived one.
        const nlohmann::json& lt = r.raw("layer_types");
        bool same = lt.is_array() && int64_t(lt.size()) == c.num_hidden_layers;
        for (int64_t i = 0; same && i < c.num_hidden_layers; ++i) {
            const char* want = qwen2_layer_window(c, i) ? "sliding_attention" : "full_attention";
            same = lt[size_t(i)].is_string() && lt[size_t(i)].get<std::string>() == want;
        }
        if (!same)
            return unimplemented_error(
                "{}: key 'layer_types' is not the pattern that use_sliding_window, "
                "sliding_window and max_window_layers give; lathe supports that pattern only",
                r.where());
    }
    return ok_status();
}

void qwen2_write(const HfModelConfig& c, nlohmann::json& out) {
    llama_like_write(c, out, /*head_dim_always=*/false);
    out["use_sliding_window"] = c.use_sliding_window;
    out["sliding_window"] = c.sliding_window ? nlohmann::json(*c.sliding_window) : nullptr;
    out["max_window_layers"] = c.max_window_layers;
}

bool qkv_bias(const HfModelConfig&) {
    return true;
}

bool no_out_bias(const HfModelConfig&) {
    return false;
}

constexpr std::string_view kQwen2Ignored[] = {"rotary_emb.inv_freq"};

}  // namespace

const ModelFamily& qwen2_family() {
    static const ModelFamily family{
        .model_type = "qwen2",
        .architecture = "Qwen2ForCausalLM",
        .base_model_prefix = "model.",
        .hf_keys = {},
        .hf_defaults = &qwen2_defaults,
        .hf_parse = &qwen2_parse,
        .hf_validate = &llama_like_refuse_biases,
        .hf_write = &qwen2_write,
        .hf_qkv_bias = &qkv_bias,
        .hf_out_bias = &no_out_bias,
        .hf_layer_window = &qwen2_layer_window,
        .hf_settings = kHfSlidingWindow | kHfWindowLayers,
        .config_from_hf = &llama_like_config,
        .build_params = &llama_like_params,
        .ignored_suffixes = kQwen2Ignored,
    };
    return family;
}

}  // namespace lathe
