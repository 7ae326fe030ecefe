// GPT-NeoX / Pythia (GPTNeoXForCausalLM): LayerNorm with bias, parallel residual
// (use_parallel_residual, on by default), partial rotary (rotary_pct, 0.25 by default), GELU,
// an untied `embed_out` head, and the fused `query_key_value` weight stored as Hugging Face
// stores it: per head, its q, k and v rows interleaved (HfLayout::kQkvInterleavedPerHead; the
// arena keeps [q; k; v] for the ops).

#include <fmt/format.h>

#include "model/registry.h"

namespace lathe {

namespace {

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
    static const ModelFamily family{"gpt_neox",       "GPTNeoXForCausalLM", "gpt_neox.",
                                    &gpt_neox_config, &gpt_neox_params,     kGptNeoxIgnored};
    return family;
}

}  // namespace lathe
