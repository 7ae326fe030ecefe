#pragma once
// The architecture registry (DESIGN.md, "Model families are data"). One entry per family, each
// defined in its own file (llama.cpp, mistral.cpp, qwen2.cpp, gpt_neox.cpp, gpt2.cpp), saying
// everything that differs between families:
//   config.json: key names, transformers' defaults, how heads, rotary and flags are read, the
//     family's rules, which family-only settings it has, what it writes (model/hf_config.h runs
//     the shared part and asks the family for the rest),
//   config.json -> ModelConfig (the switches of the shared block schedule, model/block.h),
//   ModelConfig -> parameter table (Hugging Face names and stored shapes, decay, init, layout),
//   what checkpoint loading skips and how align pads the vocabulary.
// No other file lists families or tests which family a config is.
// Adding a family touches: its own file (src/model/<family>.cpp, one ModelFamily entry), its
// line in model_families() (registry.cpp) with its declaration below, and tests
// (src/model/hf_config_test.cpp fixtures; model tests). A family with a config.json setting no
// family has yet also adds the field to HfModelConfig (model/hf_config.h).

#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "core/status.h"
#include "io/hf_config.h"
#include "model/hf_config.h"
#include "model/model_config.h"
#include "model/param_table.h"

namespace lathe {

// The config.json names of the settings every family has, as the family spells them.
struct HfKeyNames {
    std::string_view hidden_size = "hidden_size";
    std::string_view intermediate_size = "intermediate_size";
    std::string_view num_hidden_layers = "num_hidden_layers";
    std::string_view num_attention_heads = "num_attention_heads";
    std::string_view max_position_embeddings = "max_position_embeddings";
    std::string_view norm_eps = "rms_norm_eps";
    std::string_view hidden_act = "hidden_act";
    std::string_view rope_theta = "rope_theta";
    std::string_view partial_rotary_factor = "partial_rotary_factor";
};

// The HfModelConfig settings that only some families have (ModelFamily::hf_settings, a mask);
// another family's config refuses them, naming the first family of the registry that has them.
enum HfSetting : unsigned {
    kHfSlidingWindow = 1u << 0,     // sliding_window
    kHfWindowLayers = 1u << 1,      // use_sliding_window, max_window_layers
    kHfParallelResidual = 1u << 2,  // use_parallel_residual
};

struct ModelFamily {
    std::string_view model_type;         // config.json "model_type"
    std::string_view architecture;       // config.json "architectures"[0] lathe writes
    std::string_view base_model_prefix;  // "model.", "gpt_neox.", "transformer.": checkpoints
                                         // saved from the bare base model lack it

    // ---- config.json (model/hf_config.h runs the shared part around these) ----
    HfKeyNames hf_keys;
    // The values of the family's transformers config class with no arguments (head_dim and
    // `family` are set by hf_config_default).
    HfModelConfig (*hf_defaults)();
    // Reads the family's keys into `c` (its defaults, with the keys every family shares read):
    // sizes, norm and activation, heads, rotary, its own flags. Errors name r.where().
    Status (*hf_parse)(HfConfigReader& r, HfModelConfig& c);
    // The family's own rules, checked after the sizes, heads, norm and activation (nullptr:
    // none); the rotary and window checks follow for a family with rotary embedding (a family
    // without it refuses those settings here).
    Status (*hf_validate)(const HfModelConfig& c, const std::string& where);
    // Writes the family's keys (sizes, heads, rotary, flags) into config.json's object; the keys
    // every family shares are written already.
    void (*hf_write)(const HfModelConfig& c, nlohmann::json& out);
    bool hf_rms_norm = true;  // RMSNorm (else LayerNorm with bias)
    bool hf_rotary = true;    // RoPE (else learned absolute positions)
    // Whether the q/k/v and the output projections have biases, from the parsed keys.
    bool (*hf_qkv_bias)(const HfModelConfig& c);
    bool (*hf_out_bias)(const HfModelConfig& c);
    // The attention window of a layer (nullptr: full causal attention everywhere).
    std::optional<int64_t> (*hf_layer_window)(const HfModelConfig& c, int64_t layer) = nullptr;
    // The family-only settings this family has (HfSetting bits).
    unsigned hf_settings = 0;
    // intermediate_size = this x hidden_size when the config leaves it to the family (GPT-2's
    // n_inner null); 0: the intermediate size is its own key.
    int64_t hf_intermediate_per_hidden = 0;
    // The multiple its released checkpoints pad vocab_size to (1: none): align keeps it.
    int64_t vocab_multiple = 1;

    // ---- the model layer ----
    // Parsed config.json -> ModelConfig; refuses settings the model layer cannot run (naming
    // `source` and the key). The result is validated.
    Result<ModelConfig> (*config_from_hf)(const HfModelConfig& hf, std::string_view source);
    // The parameter table of a valid config, in the order checkpoints list the tensors.
    void (*build_params)(const ModelConfig& config, ParamTableBuilder& table);
    // Checkpoint tensors that are buffers, not parameters (rotary inv_freq, causal-mask biases
    // of old checkpoints): skipped on load without a warning. Suffixes of the tensor name.
    std::span<const std::string_view> ignored_suffixes;
};

// Every registered family.
std::span<const ModelFamily* const> model_families();

// The family for config.json's model_type; not found lists the supported ones.
Result<const ModelFamily*> model_family_find(std::string_view model_type);

// The model_type names of the registered families joined: "llama, mistral, ..." with `last`
// (" or ", " and ", ", ") before the last one.
std::string model_family_names(std::string_view separator, std::string_view last);

// A parsed config.json -> ModelConfig through its family's entry.
Result<ModelConfig> model_config_from_hf(const HfModelConfig& hf, std::string_view source);

// Parses config.json text (from `source`, a path for messages) and builds the ModelConfig.
// Errors: those of hf_config_parse (malformed JSON, a key of the wrong type, an unsupported
// architecture), and of the family.
Result<ModelConfig> model_config_from_hf_json(std::string_view json_text, std::string_view source);

// The same from a file, or a directory holding config.json.
Result<ModelConfig> model_config_from_hf_file(const std::string& path);

// The family of a config built by model_config_from_hf_*: the one that parsed its config.json
// (checked).
const ModelFamily& model_family_of(const ModelConfig& config);

// The parameter table of a valid config.
ParamTable model_param_table(const ModelConfig& config);

// The family entries, each defined in its own file.
const ModelFamily& llama_family();
const ModelFamily& mistral_family();
const ModelFamily& qwen2_family();
const ModelFamily& gpt_neox_family();
const ModelFamily& gpt2_family();

}  // namespace lathe
