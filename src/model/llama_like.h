#pragma once
// What Llama, Mistral and Qwen2 share: the config mapping and the Llama parameter table
// (model.embed_tokens, model.layers.{i}.self_attn.{q,k,v,o}_proj, mlp.{gate,up,down}_proj,
// input_layernorm, post_attention_layernorm, model.norm, lm_head). Their differences (biases,
// sliding windows) are in the parsed config already (io/hf_config.h).
// Internal to the model module.

#include <string_view>

#include "core/status.h"
#include "io/hf_config.h"
#include "model/model_config.h"
#include "model/param_table.h"

namespace lathe {

// The Llama-like ModelConfig of a parsed config.json (RMSNorm, RoPE, SwiGLU, biases and windows
// as io/hf_config.h reports them for the family); an activation other than silu is an
// unimplemented error naming hidden_act. Validated.
Result<ModelConfig> llama_like_config(const HfModelConfig& hf, std::string_view source);

// The Llama parameter table for `config` (biases per its switches).
void llama_like_params(const ModelConfig& config, ParamTableBuilder& table);

}  // namespace lathe
