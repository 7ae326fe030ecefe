#pragma once
// Hugging Face config.json as one typed configuration, for every family of the registry
// (model/registry.h): parsed with the family's key names and transformers' defaults, checked
// with the family's rules, and written back in a form transformers loads. This file holds what
// the families share; what differs (key names, defaults, heads, rotary and window rules, biases,
// the keys written) each family says in its own file through its ModelFamily entry. The JSON
// reading itself (typed getters, rope_scaling objects, activation names) is io/hf_config.h.
//
// Defaults: a key that config.json leaves out takes the default of the family's transformers
// config class (transformers/src/transformers/models/*/configuration_*.py), including its quirks
// (each family's file lists its own).
// Both spellings of RoPE settings are read: the Hub's (rope_theta, rope_scaling, rotary_pct,
// rotary_emb_base, partial_rotary_factor) and transformers 5's rope_parameters; "dtype" as well as
// "torch_dtype". Values are checked (types, ranges, consistency of heads and sizes, settings lathe
// cannot honour such as other rope scaling types); every error names the file and the key.
//
// Keys lathe does not interpret are kept verbatim (JSON text) and written back, so HF -> lathe ->
// HF keeps them. Writing uses the Hub's spelling (rope_theta / rope_scaling / rotary_pct /
// torch_dtype), which every transformers version since the family appeared reads, emits every
// architectural key explicitly, and sorts keys with indent 2 as save_pretrained does.

#include <cstdint>
#include <map>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "io/hf_config.h"

namespace lathe {

struct ModelFamily;  // model/registry.h

struct HfModelConfig {
    // The family (model/registry.h) whose config.json this is.
    const ModelFamily* family = nullptr;

    // The generic names; each family's key for them is in its ModelFamily::hf_keys.
    int64_t vocab_size = 0;
    int64_t hidden_size = 0;
    int64_t intermediate_size = 0;
    int64_t num_hidden_layers = 0;
    int64_t num_attention_heads = 0;
    int64_t num_key_value_heads = 0;  // = num_attention_heads where the family has no GQA
    int64_t head_dim = 0;             // head_dim, or hidden_size / num_attention_heads
    int64_t max_position_embeddings = 0;
    double norm_eps = 0.0;  // the family's RMSNorm or LayerNorm epsilon
    // The activation as written: "silu", "gelu", "gelu_new", ... Kept as the name, so that a
    // round trip keeps e.g. "gelu_pytorch_tanh"; see activation().
    std::string hidden_act;

    // RoPE (0 and unused for a family with learned positions).
    double rope_theta = 0.0;
    // Share of each head's dimensions that rotate (1 for a family without rotary, unused).
    double partial_rotary_factor = 1.0;
    std::optional<HfRopeScaling> rope_scaling;

    bool tie_word_embeddings = false;
    // The attention_bias key, for the families that have one; has_qkv_bias() / has_out_bias()
    // say what it means for the family.
    bool attention_bias = false;
    // The mlp_bias key, or the family's fixed answer.
    bool mlp_bias = false;
    // Settings only some families have (ModelFamily::hf_settings says which): sliding_window as
    // written; use_sliding_window and max_window_layers (windows on the upper layers only);
    // use_parallel_residual. See sliding_window_for_layer().
    std::optional<int64_t> sliding_window;
    bool use_sliding_window = false;
    int64_t max_window_layers = 0;
    bool use_parallel_residual = false;

    std::optional<int64_t> bos_token_id;
    std::vector<int64_t> eos_token_ids;  // eos_token_id: one id, a list, or none
    // A single id (or none) that was written as a list ([id], []) and is written back so;
    // several ids are always a list.
    bool eos_token_id_is_list = false;
    std::optional<int64_t> pad_token_id;
    std::string torch_dtype;  // "bfloat16", "float32", ... ("" when absent)
    double initializer_range = 0.02;

    // Keys lathe does not interpret, as JSON text, written back unchanged.
    std::map<std::string, std::string> extra;

    // The family's names: "llama", ...; "LlamaForCausalLM", ...
    std::string_view model_type() const;
    std::string_view architecture() const;

    // Derived properties, by the family's rules.
    HfActivation activation() const;  // of hidden_act (checked: parse validated it)
    bool uses_rms_norm() const;       // else LayerNorm with bias
    bool uses_rotary() const;         // else learned absolute positions
    bool has_qkv_bias() const;
    bool has_out_bias() const;
    // Rotated dimensions per head: int(head_dim * partial_rotary_factor), as transformers.
    int64_t rotary_dim() const;
    // The attention window of layer `layer` (keys within `window` positions of the query), or
    // nullopt for full causal attention.
    std::optional<int64_t> sliding_window_for_layer(int64_t layer) const;

    bool operator==(const HfModelConfig&) const = default;
};

// The configuration transformers builds for this family from an empty config.json.
HfModelConfig hf_config_default(const ModelFamily& family);

// Parses config.json text. `source` names it in messages (a path). The family is the one of
// `families` (the registry's by default) that "architectures" names, or "model_type" when that is
// absent. Errors: kInvalidArgument naming the key for a malformed file, a wrong type or an
// inconsistent value; kUnimplemented for an architecture or setting lathe does not support
// (naming it and what lathe supports).
Result<HfModelConfig> hf_config_parse(std::string_view json_text, const std::string& source);
Result<HfModelConfig> hf_config_parse(std::string_view json_text, const std::string& source,
                                      std::span<const ModelFamily* const> families);

// Reads `path`: a config.json file, or a directory holding one.
Result<HfModelConfig> hf_config_load(const std::string& path);

// Checks `config` as parsing does (sizes, heads, activation, the family's rules, rotary and
// window settings); errors name `where` and the key.
Status hf_config_check(const HfModelConfig& config, const std::string& where);

// The config.json text for `config` (sorted keys, indent 2, trailing newline). Checks the config
// as parsing would (a config that would not parse back is a kInvalidArgument error naming the key).
Result<std::string> hf_config_to_json(const HfModelConfig& config);

// Writes hf_config_to_json(config) to `path` atomically.
Status hf_config_save(const std::string& path, const HfModelConfig& config);

// ---- Pieces the family files compose their ModelFamily hooks from ----

// "<where>: key '<key>' <what>" (kInvalidArgument).
Status hf_key_error(const std::string& where, std::string_view key, std::string_view what);

// Reads the five size keys (hidden, intermediate, layers, heads, positions) by the family's names.
Status hf_read_sizes(HfConfigReader& r, HfModelConfig& c);
// Reads the norm epsilon and the activation by the family's names.
Status hf_read_norm_and_activation(HfConfigReader& r, HfModelConfig& c);
// Plain multi-head attention: as many key/value heads as heads, head_dim = hidden / heads (which
// must divide).
Status hf_derive_multi_head(HfModelConfig& c, const std::string& source);
// Reads the rotary settings: the family's rope_theta and partial-rotary keys, rope_scaling, and
// transformers 5's rope_parameters (which must agree with them).
Status hf_read_rotary(HfConfigReader& r, HfModelConfig& c);
// Writes the five sizes, rope_theta and rope_scaling by the family's names.
void hf_write_sizes_and_rotary(const HfModelConfig& c, nlohmann::json& out);
// The rules of a family with plain multi-head attention and MLP biases (GPT-NeoX, GPT-2):
// num_key_value_heads equals the heads, hidden = heads x head_dim, mlp_bias is set.
Status hf_check_multi_head_with_mlp_bias(const HfModelConfig& c, const std::string& where);

}  // namespace lathe
