// GPT-NeoX / Pythia (GPTNeoXForCausalLM): LayerNorm with bias, parallel residual
// (use_parallel_residual, on by default), partial rotary (rotary_pct, 0.25 by default), GELU,
// an untied `embed_out` head, and the fused `query_key_value` weight stored as Hugging Face
// stores it: per head, its q, k and v rows interleaved (HfLayout::kQkvInterleavedPerHead; the
// arena keeps [q; k; v] for the ops). Its config.json spells the norm epsilon layer_norm_eps,
// the rotary base rotary_emb_base and the rotary share rotary_pct; released checkpoints pad the
// vocabulary to a multiple of 128.

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "model/registry.h"

namespace lathe {

namespace {

HfModelConfig gpt_neox_defaults() {  // GPTNeoXConfig()
    HfModelConfig c;
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
    return c;
}

Status gpt_neox_parse(HfConfigReader& r, HfModelConfig& c) {
    LATHE_RETURN_IF_ERROR(hf_read_sizes(r, c));
    LATHE_RETURN_IF_ERROR(hf_read_norm_and_activation(r, c));
    LATHE_RETURN_IF_ERROR(hf_derive_multi_head(c, r.where()));
    LATHE_RETURN_IF_ERROR(hf_read_rotary(r, c));
    LATHE_RETURN_IF_ERROR(r.bool_key("use_parallel_residual", &c.use_parallel_residual));
    return r.bool_key("attention_bias", &c.attention_bias);
}

void gpt_neox_write(const HfModelConfig& c, nlohmann::json& out) {
    hf_write_sizes_and_rotary(c, out);
    out["rotary_pct"] = c.partial_rotary_factor;
    out["use_parallel_residual"] = c.use_parallel_residual;
    out["attention_bias"] = c.attention_bias;
}

bool gpt_neox_attention_bias(const HfModelConfig& c) {
    return c.attention_bias;
}

Result<ModelConfig> gpt_neox_config(const HfModelConfig& hf, std::string_view source) {
    ModelConfig c = model_config_from_hf_common(hf);
    c.mlp = MlpKind::kGelu;
    LATHE_ASSIGN_OR_RETURN(c.gelu, model_config_plain_gelu(hf, "hidden_act", source));
    c.parallel_residual = hf.use_parallel_residual;
    LATHE_RETURN_IF_ERROR(model_config_validate(c, source));
    return c;
}

void gpt_neox_params(const ModelConfig& c, ParamTableBuilder& t) {
    const int64_t C = c.hidden_size, V = c.vocab_size, F = c.intermediate_size;
    t.add(ParamRole::kTokenEmbedding, -1, "gpt_neox.embed_in.weight", Shape{V, C},
          InitKind::kNormal);
    for (int l = 0; l < int(c.num_layers); ++l) {
        const std::string p = fmt::format("gpt_neox.layers.{}.", l);
        t.add(ParamRole::kNorm1Weight, l, p + "input_layernorm.weight", Shape{C}, InitKind::kOnes);
        t.add(ParamRole::kNorm1Bias, l, p + "input_layernorm.bias", Shape{C}, InitKind::kZeros);
        t.add(ParamRole::kNorm2Weight, l, p + "post_attention_layernorm.weight", Shape{C},
              InitKind::kOnes);
        t.add(ParamRole::kNorm2Bias, l, p + "post_attention_layernorm.bias", Shape{C},
              InitKind::kZeros);
        t.add(ParamRole::kQkvWeight, l, p + "attention.query_key_value.weight", Shape{3 * C, C},
              InitKind::kNormal, HfLayout::kQkvInterleavedPerHead, c.num_heads);
        if (c.qkv_bias)
            t.add(ParamRole::kQkvBias, l, p + "attention.query_key_value.bias", Shape{3 * C},
                  InitKind::kZeros, HfLayout::kQkvInterleavedPerHead, c.num_heads);
        t.add(ParamRole::kOutWeight, l, p + "attention.dense.weight", Shape{C, C},
              InitKind::kNormalScaledByDepth);
        if (c.out_bias)
            t.add(ParamRole::kOutBias, l, p + "attention.dense.bias", Shape{C}, InitKind::kZeros);
        t.add(ParamRole::kUpWeight, l, p + "mlp.dense_h_to_4h.weight", Shape{F, C},
              InitKind::kNormal);
        t.add(ParamRole::kUpBias, l, p + "mlp.dense_h_to_4h.bias", Shape{F}, InitKind::kZeros);
        t.add(ParamRole::kDownWeight, l, p + "mlp.dense_4h_to_h.weight", Shape{C, F},
              InitKind::kNormalScaledByDepth);
        t.add(ParamRole::kDownBias, l, p + "mlp.dense_4h_to_h.bias", Shape{C}, InitKind::kZeros);
    }
    t.add(ParamRole::kFinalNormWeight, -1, "gpt_neox.final_layer_norm.weight", Shape{C},
          InitKind::kOnes);
    t.add(ParamRole::kFinalNormBias, -1, "gpt_neox.final_layer_norm.bias", Shape{C},
          InitKind::kZeros);
    if (!c.tie_word_embeddings)
        t.add(ParamRole::kLmHead, -1, "embed_out.weight", Shape{V, C}, InitKind::kNormal);
}

// Pythia checkpoints carry the causal mask and rotary buffers of older transformers.
constexpr std::string_view kGptNeoxIgnored[] = {"attention.bias", "attention.masked_bias",
                                                "rotary_emb.inv_freq"};

}  // namespace

const ModelFamily& gpt_neox_family() {
    static const ModelFamily family{
        .model_type = "gpt_neox",
        .architecture = "GPTNeoXForCausalLM",
        .base_model_prefix = "gpt_neox.",
        .hf_keys = {.norm_eps = "layer_norm_eps",
                    .rope_theta = "rotary_emb_base",
                    .partial_rotary_factor = "rotary_pct"},
        .hf_defaults = &gpt_neox_defaults,
        .hf_parse = &gpt_neox_parse,
        .hf_validate = &hf_check_multi_head_with_mlp_bias,
        .hf_write = &gpt_neox_write,
        .hf_rms_norm = false,
        .hf_qkv_bias = &gpt_neox_attention_bias,
        .hf_out_bias = &gpt_neox_attention_bias,
        .hf_settings = kHfParallelResidual,
        .vocab_multiple = 128,
        .config_from_hf = &gpt_neox_config,
        .build_params = &gpt_neox_params,
        .ignored_suffixes = kGptNeoxIgnored,
    };
    return family;
}

}  // namespace lathe
