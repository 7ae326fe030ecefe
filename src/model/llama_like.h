#pragma once
// What Llama, Mistral and Qwen2 share: reading and writing their config.json (sizes, grouped-
// query heads, rotary), the config mapping and the Llama parameter table (model.embed_tokens,
// model.layers.{i}.self_attn.{q,k,v,o}_proj, mlp.{gate,up,down}_proj, input_layernorm,
// post_attention_layernorm, model.norm, lm_head). Their differences (defaults, biases, sliding
// windows) are in each one's file. Internal to the model module.

#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "core/status.h"
#include "io/hf_config.h"
#include "model/hf_config.h"
#include "model/model_config.h"
#include "model/param_table.h"

namespace lathe {

// Reads the keys the Llama-like families share: sizes, norm and activation, heads, rotary.
// num_key_value_heads absent takes `absent_kv_heads` (the family config class's default, named
// `config_class` in messages; nullopt: num_attention_heads), null takes num_attention_heads;
// head_dim absent or null is hidden_size / num_attention_heads.
Status llama_like_read(HfConfigReader& r, HfModelConfig& c, std::optional<int64_t> absent_kv_heads,
                       std::string_view config_class);

// Writes the sizes, rotary keys and heads; head_dim only where it differs from hidden_size /
// num_attention_heads unless `head_dim_always`.
void llama_like_write(const HfModelConfig& c, nlohmann::json& out, bool head_dim_always);

// The rule of the Llama derivatives without Llama's attention_bias and mlp_bias keys.
Status llama_like_refuse_biases(const HfModelConfig& c, const std::string& where);

// The Llama-like ModelConfig of a parsed config.json (RMSNorm, RoPE, SwiGLU, biases and windows
// as model/hf_config.h reports them for the family); an activation other than silu is an
// unimplemented error naming hidden_act. Validated.
Result<ModelConfig> llama_like_config(const HfModelConfig& hf, std::string_view source);

// The Llama parameter table for `config` (biases per its switches).
void llama_like_params(const ModelConfig& config, ParamTableBuilder& table);

}  // namespace lathe
