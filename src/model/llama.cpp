// Llama (LlamaForCausalLM): RMSNorm, RoPE (rope_theta, llama3 rope_scaling), grouped-query
// attention, SwiGLU, tied or untied embeddings, attention_bias (q, k, v, o) and mlp_bias
// (gate, up, down). Also the shared Llama-like keys and parameter table (llama_like.h).
// LlamaConfig's num_key_value_heads None means num_attention_heads.

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "model/llama_like.h"
#include "model/registry.h"

namespace lathe {

Status llama_like_read(HfConfigReader& r, HfModelConfig& c, std::optional<int64_t> absent_kv_heads,
                       std::string_view config_class) {
    const std::string& source = r.where();
    LATHE_RETURN_IF_ERROR(hf_read_sizes(r, c));
    LATHE_RETURN_IF_ERROR(hf_read_norm_and_activation(r, c));
    c.num_key_value_heads = c.num_attention_heads;
    std::string kv_origin = "given";
    if (!r.has("num_key_value_heads")) {
        c.num_key_value_heads = absent_kv_heads.value_or(c.num_attention_heads);
        kv_origin = fmt::format("the {} default, as the key is absent", config_class);
    } else if (!r.is_null("num_key_value_heads")) {
        LATHE_RETURN_IF_ERROR(r.int_key("num_key_value_heads", &c.num_key_value_heads));
    }
    if (c.num_key_value_heads > c.num_attention_heads ||
        c.num_attention_heads % c.num_key_value_heads != 0)
        return invalid_argument_error(
            "{}: key 'num_key_value_heads' ({}, {}) must divide num_attention_heads ({})", source,
            c.num_key_value_heads, kv_origin, c.num_attention_heads);
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
    return hf_read_rotary(r, c);
}

void llama_like_write(const HfModelConfig& c, nlohmann::json& out, bool head_dim_always) {
    hf_write_sizes_and_rotary(c, out);
    out["num_key_value_heads"] = c.num_key_value_heads;
    if (head_dim_always || c.head_dim * c.num_attention_heads != c.hidden_size)
        out["head_dim"] = c.head_dim;
    if (c.partial_rotary_factor != 1.0) out["partial_rotary_factor"] = c.partial_rotary_factor;
}

Status llama_like_refuse_biases(const HfModelConfig& c, const std::string& where) {
    if (c.attention_bias || c.mlp_bias)
        return hf_key_error(where, c.attention_bias ? "attention_bias" : "mlp_bias",
                            fmt::format("is not a {} setting (only {} has it)", c.architecture(),
                                        llama_family().architecture));
    return ok_status();
}

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

HfModelConfig llama_defaults() {  // LlamaConfig()
    HfModelConfig c;
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
    return c;
}

Status llama_parse(HfConfigReader& r, HfModelConfig& c) {
    LATHE_RETURN_IF_ERROR(llama_like_read(r, c, std::nullopt, "LlamaConfig"));
    LATHE_RETURN_IF_ERROR(r.bool_key("attention_bias", &c.attention_bias));
    return r.bool_key("mlp_bias", &c.mlp_bias);
}

void llama_write(const HfModelConfig& c, nlohmann::json& out) {
    llama_like_write(c, out, /*head_dim_always=*/true);
    out["attention_bias"] = c.attention_bias;
    out["mlp_bias"] = c.mlp_bias;
}

bool llama_attention_bias(const HfModelConfig& c) {
    return c.attention_bias;
}

constexpr std::string_view kLlamaIgnored[] = {"rotary_emb.inv_freq"};

}  // namespace

const ModelFamily& llama_family() {
    static const ModelFamily family{
        .model_type = "llama",
        .architecture = "LlamaForCausalLM",
        .base_model_prefix = "model.",
        .hf_keys = {},
        .hf_defaults = &llama_defaults,
        .hf_parse = &llama_parse,
        .hf_validate = nullptr,
        .hf_write = &llama_write,
        .hf_qkv_bias = &llama_attention_bias,
        .hf_out_bias = &llama_attention_bias,
        .config_from_hf = &llama_like_config,
        .build_params = &llama_like_params,
        .ignored_suffixes = kLlamaIgnored,
    };
    return family;
}

}  // namespace lathe
