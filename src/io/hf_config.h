#pragma once
// Hugging Face config.json: parsed into one typed model configuration for the families lathe
// supports, and written back in a form transformers loads.
//
// Families (the "architectures" entry, or "model_type" when that is absent):
//   LlamaForCausalLM   (llama)    RMSNorm, RoPE (+ llama3 scaling), GQA, SwiGLU, bias flags
//   MistralForCausalLM (mistral)  Llama + sliding-window attention
//   Qwen2ForCausalLM   (qwen2)    Llama + q/k/v biases (+ sliding window on upper layers)
//   GPTNeoXForCausalLM (gpt_neox) LayerNorm, parallel residual, partial rotary, GELU
//   GPT2LMHeadModel    (gpt2)     learned positions, LayerNorm, tanh-GELU, tied output
//
// Defaults: a key that config.json leaves out takes the default of the family's transformers
// config class (transformers/src/transformers/models/*/configuration_*.py), including its quirks:
// Mistral's num_key_value_heads defaults to 8 and Qwen2's to 32 when the key is absent, but to
// num_attention_heads when it is null; GPT-2's n_inner null means 4 * n_embd; GPT-2 ties its
// embeddings by default (the PretrainedConfig default), the others do not.
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
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace lathe {

enum class HfArch : uint8_t { kLlama, kMistral, kQwen2, kGptNeoX, kGpt2 };

// "LlamaForCausalLM", ..., "GPT2LMHeadModel".
std::string_view hf_arch_class_name(HfArch arch);
// "llama", "mistral", "qwen2", "gpt_neox", "gpt2".
std::string_view hf_arch_model_type(HfArch arch);

// The activation of the MLP, from hidden_act (activation_function for GPT-2), by transformers'
// ACT2FN names: silu/swish -> kSilu; gelu -> kGelu (erf); gelu_new, gelu_pytorch_tanh, gelu_fast
// -> kGeluTanh (0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))); relu -> kRelu.
enum class HfActivation : uint8_t { kSilu, kGelu, kGeluTanh, kRelu };

// rope_scaling of type "llama3" (the only scaling lathe implements): frequencies below
// original_max_position_embeddings / low_freq_factor wavelengths are divided by `factor`, those
// above ... / high_freq_factor are kept, and the band between is interpolated.
struct HfRopeScaling {
    double factor = 8.0;
    double low_freq_factor = 1.0;
    double high_freq_factor = 4.0;
    int64_t original_max_position_embeddings = 8192;
    bool operator==(const HfRopeScaling&) const = default;
};

struct HfModelConfig {
    HfArch arch = HfArch::kLlama;

    int64_t vocab_size = 0;
    int64_t hidden_size = 0;              // GPT-2: n_embd
    int64_t intermediate_size = 0;        // GPT-2: n_inner, or 4 * n_embd when null
    int64_t num_hidden_layers = 0;        // GPT-2: n_layer
    int64_t num_attention_heads = 0;      // GPT-2: n_head
    int64_t num_key_value_heads = 0;      // = num_attention_heads for GPT-NeoX and GPT-2
    int64_t head_dim = 0;                 // head_dim, or hidden_size / num_attention_heads
    int64_t max_position_embeddings = 0;  // GPT-2: n_positions
    // rms_norm_eps (Llama, Mistral, Qwen2), layer_norm_eps (GPT-NeoX), layer_norm_epsilon (GPT-2).
    double norm_eps = 0.0;
    // hidden_act (activation_function for GPT-2) as written: "silu", "gelu", "gelu_new", ...
    // Kept as the name, so that a round trip keeps e.g. "gelu_pytorch_tanh"; see activation().
    std::string hidden_act;

    // RoPE. rope_theta is rotary_emb_base for GPT-NeoX; GPT-2 has no rotary embedding (0 here).
    double rope_theta = 0.0;
    // Share of each head's dimensions that rotate: rotary_pct for GPT-NeoX, partial_rotary_factor
    // (if given) for the others; 1 for GPT-2 (unused).
    double partial_rotary_factor = 1.0;
    std::optional<HfRopeScaling> rope_scaling;

    bool tie_word_embeddings = false;
    // The attention_bias key (Llama: q, k, v and o projections; GPT-NeoX: query_key_value and
    // dense). Mistral and Qwen2 have no such key: use has_qkv_bias() / has_out_bias().
    bool attention_bias = false;
    // The mlp_bias key (Llama); true for GPT-NeoX and GPT-2, false for Mistral and Qwen2.
    bool mlp_bias = false;
    // sliding_window as written (Mistral, Qwen2); for Qwen2 it applies only with
    // use_sliding_window, from layer max_window_layers up: see sliding_window_for_layer().
    std::optional<int64_t> sliding_window;
    bool use_sliding_window = false;     // Qwen2
    int64_t max_window_layers = 0;       // Qwen2
    bool use_parallel_residual = false;  // GPT-NeoX

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

    // Derived properties of the architecture.
    HfActivation activation() const;  // of hidden_act (checked: parse validated it)
    bool uses_rms_norm() const;       // Llama, Mistral, Qwen2 (else LayerNorm with bias)
    bool uses_rotary() const;         // all but GPT-2 (learned absolute positions)
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
HfModelConfig hf_config_default(HfArch arch);

// Parses config.json text. `source` names it in messages (a path). Errors: kInvalidArgument
// naming the key for a malformed file, a wrong type or an inconsistent value; kUnimplemented for
// an architecture or setting lathe does not support (naming it and what lathe supports).
Result<HfModelConfig> hf_config_parse(std::string_view json_text, const std::string& source);

// Reads `path`: a config.json file, or a directory holding one.
Result<HfModelConfig> hf_config_load(const std::string& path);

// The config.json text for `config` (sorted keys, indent 2, trailing newline). Checks the config
// as parsing would (a config that would not parse back is a kInvalidArgument error naming the key).
Result<std::string> hf_config_to_json(const HfModelConfig& config);

// Writes hf_config_to_json(config) to `path` atomically.
Status hf_config_save(const std::string& path, const HfModelConfig& config);

}  // namespace lathe
