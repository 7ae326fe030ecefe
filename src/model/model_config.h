#pragma once
// ModelConfig: what the model layer needs to know about an architecture, made from a Hugging Face
// config.json (parsed by model/hf_config.h, with transformers' defaults) by the family's registry
// entry (model/registry.h).
//
// Dimension letters (STYLE.md): B batch, T sequence, C hidden_size, V vocab_size, H attention
// heads, Hkv key/value heads, D head_dim, L layers, F intermediate_size (the MLP's inner width).
//
// The config is the family's data turned into switches of the one shared block schedule
// (model/block.h): which norm, which MLP, which positions, which biases, which residual.
// A ModelConfig built by a family entry is valid (model_config_validate passed).

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/hf_config.h"
#include "ops/gelu.h"
#include "ops/rope.h"

namespace lathe {

enum class NormKind : uint8_t { kRmsNorm, kLayerNorm };  // LayerNorm carries a bias
enum class MlpKind : uint8_t { kSwiGlu, kGelu };         // gate/up/down vs fc/proj
enum class PositionKind : uint8_t { kRope, kLearned };   // RoPE in attention vs GPT-2's wpe

struct ModelConfig {
    std::string model_type;               // config.json "model_type": "llama", "gpt_neox", ...
    int64_t vocab_size = 0;               // V
    int64_t hidden_size = 0;              // C
    int64_t num_layers = 0;               // L
    int64_t num_heads = 0;                // H
    int64_t num_kv_heads = 0;             // Hkv (H for plain multi-head attention)
    int64_t head_dim = 0;                 // D (H * D need not equal C: Llama's head_dim key)
    int64_t intermediate_size = 0;        // F
    int64_t max_position_embeddings = 0;  // the longest sequence the model allows

    NormKind norm = NormKind::kRmsNorm;
    double norm_eps = 1e-6;
    MlpKind mlp = MlpKind::kSwiGlu;
    GeluKind gelu = GeluKind::kErf;  // kGelu only
    PositionKind position = PositionKind::kRope;
    RopeConfig rope;  // kRope only
    // Per layer: the keys a query sees, itself included; 0 = unlimited (Mistral: every layer;
    // Qwen2 with use_sliding_window: the layers from max_window_layers up).
    std::vector<int64_t> sliding_windows;

    bool qkv_bias = false;             // q/k/v projections have biases
    bool out_bias = false;             // the attention output projection has a bias
    bool mlp_bias = false;             // the MLP projections have biases
    bool tie_word_embeddings = false;  // the LM head is the token embedding
    bool parallel_residual = false;    // x + attn(ln1(x)) + mlp(ln2(x)) (GPT-NeoX)

    double initializer_range = 0.02;  // std of the normal init (model/init.h)

    // Vocabulary-parallel embedding and LM head (tensor-parallel training,
    // infer/tensor_parallel.h): the model holds rows [vocab_begin, vocab_begin + vocab_size) of a
    // vocabulary of vocab_total entries, and the token ids and targets it reads index the whole
    // vocabulary. vocab_total 0: vocab_size is the whole vocabulary. Not part of config.json.
    int64_t vocab_total = 0;
    int64_t vocab_begin = 0;

    // The config.json as parsed: written back with checkpoints (model/hf_config.h keeps the keys
    // lathe does not interpret), so HF -> lathe -> HF loses nothing.
    HfModelConfig hf;

    // The window of layer `layer` (0 = full causal attention).
    int64_t window(int layer) const { return sliding_windows[size_t(layer)]; }
    // The embedding and LM head hold a shard of the vocabulary (vocab_total above).
    bool vocab_parallel() const { return vocab_total != 0; }
    // The number of ids the tokens and targets may take: the whole vocabulary.
    int64_t vocab_ids() const { return vocab_parallel() ? vocab_total : vocab_size; }
};

// The parts every family shares, from a parsed config.json: sizes, norm (RMSNorm or LayerNorm
// with bias), positions (RoPE with its theta, partial rotary and llama3 scaling, or learned),
// biases, tying, per-layer windows. The family sets `mlp`, `gelu` and `parallel_residual` and
// checks what it cannot run. `model_type` is the family's.
ModelConfig model_config_from_hf_common(const HfModelConfig& hf);

// The GELU form of a family whose MLP is not gated (GPT-NeoX, GPT-2): "gelu" is erf, the tanh
// forms are tanh; relu and silu have no op there: unimplemented, naming `source` and `key`.
Result<GeluKind> model_config_plain_gelu(const HfModelConfig& hf, std::string_view key,
                                         std::string_view source);

// Ok, or invalid argument naming the config.json key at fault (all sizes positive, H divisible by
// Hkv, rope valid for kRope, ...). `source` (a path) prefixes the message.
Status model_config_validate(const ModelConfig& config, std::string_view source);

// Parameter count of the whole model (tied weights once), from the dimensions alone.
int64_t model_config_num_parameters(const ModelConfig& config);

// One line: "llama: L=16 C=2048 H=32 Hkv=8 D=64 F=8192 V=128256, rope theta 500000 (llama3), tied".
std::string model_config_summary(const ModelConfig& config);

}  // namespace lathe
