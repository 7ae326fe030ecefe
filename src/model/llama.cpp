// Llama (LlamaForCausalLM): RMSNorm, RoPE (rope_theta, llama3 rope_scaling), grouped-query
// attention, SwiGLU, tied or untied embeddings, attention_bias (q, k, v, o) and mlp_bias
// (gate, up, down). Also the shared Llama-like keys and parameter table (llama_like.h).

#include <fmt/format.h>

#include "model/llama_like.h"
#include "model/registry.h"

namespace lathe {

Result<ModelConfig> llama_like_config(const HfModelConfig& hf, std::string_view source) {
    ModelConfig c = model_config_from_hf_common(hf);
    if (hf.activation() != HfActivation::kSilu)
        return unimplemented_error(
            "{}: config.json key 'hidden_act' is '{}'; {} models in lathe "
            "use 'silu' (SwiGLU)",
            source, hf.hidden_act, c.model_type);
    c.mlp = MlpKind::kSwiGlu;
    LATHE_RETURN_IF_ERROR(model_config_validate(c, source));
    return c;
}

void llama_like_params(const ModelConfig& c, ParamTableBuilder& t) {
    const int64_t C = c.hidden_size, V = c.vocab_size, F = c.intermediate_size;
    const int64_t q_rows = c.num_heads * c.head_dim, kv_rows = c.num_kv_heads * c.head_dim;
    t.add(ParamRole::kTokenEmbedding, -1, "model.embed_tokens.weight", Shape{V, C},
          InitKind::kNormal);
    for (int l = 0; l < int(c.num_layers); ++l) {
        const std::string p = fmt::format("model.layers.{}.", l);
        t.add(ParamRole::kNorm1Weight, l, p + "input_layernorm.weight", Shape{C}, InitKind::kOnes);
        t.add_stacked(ParamRole::kQkvWeight, l, p + "self_attn.qkv_proj.weight",
                      {{p + "self_attn.q_proj.weight", Shape{q_rows, C}, InitKind::kNormal},
                       {p + "self_attn.k_proj.weight", Shape{kv_rows, C}, InitKind::kNormal},
                       {p + "self_attn.v_proj.weight", Shape{kv_rows, C}, InitKind::kNormal}});
        if (c.qkv_bias)
            t.add_stacked(ParamRole::kQkvBias, l, p + "self_attn.qkv_proj.bias",
                          {{p + "self_attn.q_proj.bias", Shape{q_rows}, InitKind::kZeros},
                           {p + "self_attn.k_proj.bias", Shape{kv_rows}, InitKind::kZeros},
                           {p + "self_attn.v_proj.bias", Shape{kv_rows}, InitKind::kZeros}});
        t.add(ParamRole::kOutWeight, l, p + "self_attn.o_proj.weight", Shape{C, q_rows},
              InitKind::kNormalScaledByDepth);
        if (c.out_bias)
            t.add(ParamRole::kOutBias, l, p + "self_attn.o_proj.bias", Shape{C}, InitKind::kZeros);
        t.add(ParamRole::kNorm2Weight, l, p + "post_attention_layernorm.weight", Shape{C},
              InitKind::kOnes);
        t.add_stacked(ParamRole::kUpWeight, l, p + "mlp.gate_up_proj.weight",
                      {{p + "mlp.gate_proj.weight", Shape{F, C}, InitKind::kNormal},
                       {p + "mlp.up_proj.weight", Shape{F, C}, InitKind::kNormal}});
        if (c.mlp_bias)
            t.add_stacked(ParamRole::kUpBias, l, p + "mlp.gate_up_proj.bias",
                          {{p + "mlp.gate_proj.bias", Shape{F}, InitKind::kZeros},
                           {p + "mlp.up_proj.bias", Shape{F}, InitKind::kZeros}});
        t.add(ParamRole::kDownWeight, l, p + "mlp.down_proj.weight", Shape{C, F},
              InitKind::kNormalScaledByDepth);
        if (c.mlp_bias)
            t.add(ParamRole::kDownBias, l, p + "mlp.down_proj.bias", Shape{C}, InitKind::kZeros);
    }
    t.add(ParamRole::kFinalNormWeight, -1, "model.norm.weight", Shape{C}, InitKind::kOnes);
    if (!c.tie_word_embeddings)
        t.add(ParamRole::kLmHead, -1, "lm_head.weight", Shape{V, C}, InitKind::kNormal);
}

namespace {

constexpr std::string_view kLlamaIgnored[] = {"rotary_emb.inv_freq"};

}  // namespace

const ModelFamily& llama_family() {
    static const ModelFamily family{
        "llama",      "LlamaForCausalLM", "model.", &llama_like_config, &llama_like_params,
        kLlamaIgnored};
    return family;
}

}  // namespace lathe
