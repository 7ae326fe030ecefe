// GPT-2 (GPT2LMHeadModel): learned absolute positions (`wpe`), LayerNorm, tanh-GELU
// ("gelu_new"), a head tied to `wte`. Hugging Face stores its Conv1D weights transposed,
// [in, out]; the arena keeps [out, in] for the linear op (HfLayout::kTransposed), with the HF
// names and stored shapes in the table. c_attn's output columns are [q | k | v], so its bias is
// stored as the arena has it.
// Its config.json names the sizes n_embd, n_inner, n_layer, n_head and n_positions (GPT2Config
// maps the generic names onto them, so either spelling is read), the epsilon layer_norm_epsilon
// and the activation activation_function; n_inner null means 4 * n_embd, and the embeddings are
// tied by default (the PretrainedConfig default).

#include <fmt/format.h>

#include <limits>
#include <nlohmann/json.hpp>

#include "model/registry.h"

namespace lathe {

namespace {

constexpr int64_t kInnerPerEmbd = 4;  // n_inner null

HfModelConfig gpt2_defaults() {  // GPT2Config()
    HfModelConfig c;
    c.vocab_size = 50257;
    c.hidden_size = 768;
    c.intermediate_size = kInnerPerEmbd * 768;  // n_inner None
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
    return c;
}

Status gpt2_parse(HfConfigReader& r, HfModelConfig& c) {
    const std::string& source = r.where();
    // GPT2Config maps the generic names onto its own (attribute_map), so either spelling sets the
    // value; both at once must agree.
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
    if (!n_inner && c.hidden_size > std::numeric_limits<int64_t>::max() / kInnerPerEmbd) {
        return invalid_argument_error(
            "{}: key 'n_embd' ({}) is too large: the default n_inner, 4 * n_embd, does not "
            "fit a 64-bit integer",
            source, c.hidden_size);
    }
    c.intermediate_size = n_inner ? *n_inner : kInnerPerEmbd * c.hidden_size;
    LATHE_RETURN_IF_ERROR(hf_read_norm_and_activation(r, c));
    LATHE_RETURN_IF_ERROR(hf_derive_multi_head(c, source));
    // Settings GPT-2 checkpoints never change and lathe does not implement; left in `extra` (so
    // written back), but refused when set otherwise.
    const std::pair<const char*, bool> fixed[] = {
        {"scale_attn_weights", true},
        {"scale_attn_by_inverse_layer_idx", false},
        {"add_cross_attention", false},
    };
    for (const auto& [key, want] : fixed) {
        const nlohmann::json* v = r.peek(key);
        if (!v) continue;
        if (!v->is_boolean()) return r.error(key, "true or false");
        if (v->get<bool>() != want)
            return unimplemented_error("{}: key '{}' is {}; lathe implements GPT-2 with {} only",
                                       source, key, !want, want);
    }
    return ok_status();
}

Status gpt2_validate(const HfModelConfig& c, const std::string& where) {
    LATHE_RETURN_IF_ERROR(hf_check_multi_head_with_mlp_bias(c, where));
    if (!c.attention_bias)
        return hf_key_error(where, "attention_bias",
                            "is not a GPT2LMHeadModel setting: its attention always has biases");
    if (c.rope_scaling || c.use_sliding_window || c.sliding_window || c.use_parallel_residual)
        return invalid_argument_error(
            "{}: GPT2LMHeadModel has no rotary embedding, sliding "
            "window or parallel residual",
            where);
    return ok_status();
}

void gpt2_write(const HfModelConfig& c, nlohmann::json& out) {
    out["n_embd"] = c.hidden_size;
    out["n_layer"] = c.num_hidden_layers;
    out["n_head"] = c.num_attention_heads;
    out["n_positions"] = c.max_position_embeddings;
    out["n_inner"] = c.intermediate_size == kInnerPerEmbd * c.hidden_size
                         ? nlohmann::json(nullptr)
                         : nlohmann::json(c.intermediate_size);
}

bool always_bias(const HfModelConfig&) {
    return true;
}

Result<ModelConfig> gpt2_config(const HfModelConfig& hf, std::string_view source) {
    // gpt2_parse has refused the attention variants lathe does not compute
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
    static const ModelFamily family{
        .model_type = "gpt2",
        .architecture = "GPT2LMHeadModel",
        .base_model_prefix = "transformer.",
        .hf_keys = {.hidden_size = "n_embd",
                    .intermediate_size = "n_inner",
                    .num_hidden_layers = "n_layer",
                    .num_attention_heads = "n_head",
                    .max_position_embeddings = "n_positions",
                    .norm_eps = "layer_norm_epsilon",
                    .hidden_act = "activation_function"},
        .hf_defaults = &gpt2_defaults,
        .hf_parse = &gpt2_parse,
        .hf_validate = &gpt2_validate,
        .hf_write = &gpt2_write,
        .hf_rms_norm = false,
        .hf_rotary = false,
        .hf_qkv_bias = &always_bias,
        .hf_out_bias = &always_bias,
        .hf_intermediate_per_hidden = kInnerPerEmbd,
        .config_from_hf = &gpt2_config,
        .build_params = &gpt2_params,
        .ignored_suffixes = kGpt2Ignored,
    };
    return family;
}

}  // namespace lathe
