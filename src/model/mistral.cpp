// Mistral (MistralForCausalLM): Llama plus sliding-window attention (`sliding_window` keys seen
// by each query, itself included, on every layer; null turns it off, as Mistral-7B-v0.2 and
// later do). No biases. MistralConfig's quirk: num_key_value_heads absent is 8, null is
// num_attention_heads.

#include <nlohmann/json.hpp>

#include "model/llama_like.h"
#include "model/registry.h"

namespace lathe {

namespace {

HfModelConfig mistral_defaults() {  // MistralConfig()
    HfModelConfig c;
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
    return c;
}

Status mistral_parse(HfConfigReader& r, HfModelConfig& c) {
    LATHE_RETURN_IF_ERROR(llama_like_read(r, c, 8, "MistralConfig"));
    LATHE_RETURN_IF_ERROR(r.opt_int_key("sliding_window", &c.sliding_window, 1));
    // MistralConfig ignores layer_types (it applies sliding_window to every layer).
    r.has("layer_types");
    return ok_status();
}

void mistral_write(const HfModelConfig& c, nlohmann::json& out) {
    llama_like_write(c, out, /*head_dim_always=*/true);
    out["sliding_window"] = c.sliding_window ? nlohmann::json(*c.sliding_window) : nullptr;
}

bool no_bias(const HfModelConfig&) {
    return false;
}

std::optional<int64_t> mistral_layer_window(const HfModelConfig& c, int64_t) {
    return c.sliding_window;
}

constexpr std::string_view kMistralIgnored[] = {"rotary_emb.inv_freq"};

}  // namespace

const ModelFamily& mistral_family() {
    static const ModelFamily family{
        .model_type = "mistral",
        .architecture = "MistralForCausalLM",
        .base_model_prefix = "model.",
        .hf_keys = {},
        .hf_defaults = &mistral_defaults,
        .hf_parse = &mistral_parse,
        .hf_validate = &llama_like_refuse_biases,
        .hf_write = &mistral_write,
        .hf_qkv_bias = &no_bias,
        .hf_out_bias = &no_bias,
        .hf_layer_window = &mistral_layer_window,
        .hf_settings = kHfSlidingWindow,
        .config_from_hf = &llama_like_config,
        .build_params = &llama_like_params,
        .ignored_suffixes = kMistralIgnored,
    };
    return family;
}

}  // namespace lathe
