// GPT-2 (GPT2LMHeadModel): learned absolute positions (`wpe`), LayerNorm, tanh-GELU
// ("gelu_new"), a head tied to `wte`. Hugging Face stores its Conv1D weights transposed,
// [in, out]; the arena keeps [out, in] for the linear op (HfLayout::kTransposed), with the HF
// names and stored shapes in the table. c_attn's output columns are [q | k | v], so its bias is
// stored as the arena has it.

#include <fmt/format.h>

#include "model/registry.h"

namespace lathe {

namespace {

Result<ModelConfig> gpt2_config(const HfModelConfig& hf, std::string_view source) {
    // io/hf_config.h has refused the attention variants lathe does not compute
    // (scale_attn_by_inverse_layer_idx, cross attention, unscaled attention).
    ModelConfig c = model_config_from_hf_common(hf);
    c.mlp = MlpKind::kGelu;
    LATHE_ASSIGN_OR_RETURN(c.gelu, model_config_plain_gelu(hf, "activation_function", source));
    LATHE_RETURN_IF_ERROR(model_config_validate(c, source));
    return c;
}

void gpt2_params(const ModelConfig& c, ParamTableBuilder& t) {
    const int64_t C = c.hidden_size, V = c.vocab_size, F = c.intermediate_size;
    const int64_t P = c.max_position_embeddings;
    t.add(ParamRole::kTokenEmbedding, -1, "transformer.wte.weight", Shape{V, C}, InitKind::kNormal);
    t.add(ParamRole::kPositionEmbedding, -1, "transformer.wpe.weight", Shape{P, C},
          InitKind::kNormal);
    for (int l = 0; l < int(c.num_layers); ++l) {
        const std::string p = fmt::format("transformer.h.{}.", l);
        t.add(ParamRole::kNorm1Weight, l, p + "ln_1.weight", Shape{C}, InitKind::kOnes);
        t.add(ParamRole::kNorm1Bias, l, p + "ln_1.bias", Shape{C}, InitKind::kZeros);
        t.add(ParamRole::kQkvWeight, l, p + "attn.c_attn.weight", Shape{C, 3 * C},
              InitKind::kNormal, HfLayout::kTransposed);
        t.add(ParamRole::kQkvBias, l, p + "attn.c_attn.bias", Shape{3 * C}, InitKind::kZeros);
        t.add(ParamRole::kOutWeight, l, p + "attn.c_proj.weight", Shape{C, C},
              InitKind::kNormalScaledByDepth, HfLayout::kTransposed);
        t.add(ParamRole::kOutBias, l, p + "attn.c_proj.bias", Shape{C}, InitKind::kZeros);
        t.add(ParamRole::kNorm2Weight, l, p + "ln_2.weight", Shape{C}, InitKind::kOnes);
        t.add(ParamRole::kNorm2Bias, l, p + "ln_2.bias", Shape{C}, InitKind::kZeros);
        t.add(ParamRole::kUpWeight, l, p + "mlp.c_fc.weight", Shape{C, F}, InitKind::kNormal,
              HfLayout::kTransposed);
        t.add(ParamRole::kUpBias, l, p + "mlp.c_fc.bias", Shape{F}, InitKind::kZeros);
        t.add(ParamRole::kDownWeight, l, p + "mlp.c_proj.weight", Shape{F, C},
              InitKind::kNormalScaledByDepth, HfLayout::kTransposed);
        t.add(ParamRole::kDownBias, l, p + "mlp.c_proj.bias", Shape{C}, InitKind::kZeros);
    }
    t.add(ParamRole::kFinalNormWeight, -1, "transformer.ln_f.weight", Shape{C}, InitKind::kOnes);
    t.add(ParamRole::kFinalNormBias, -1, "transformer.ln_f.bias", Shape{C}, InitKind::kZeros);
    if (!c.tie_word_embeddings)
        t.add(ParamRole::kLmHead, -1, "lm_head.weight", Shape{V, C}, InitKind::kNormal);
}

// Checkpoints from older transformers carry the causal-mask buffers.
constexpr std::string_view kGpt2Ignored[] = {"attn.bias", "attn.masked_bias"};

}  // namespace

const ModelFamily& gpt2_family() {
    static const ModelFamily family{"gpt2",       "GPT2LMHeadModel", "transformer.",
                                    &gpt2_config, &gpt2_params,      kGpt2Ignored};
    return family;
}

}  // namespace lathe
