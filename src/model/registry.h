#pragma once
// The architecture registry (DESIGN.md, "Model families are data"). One entry per family, each
// defined in its own file (llama.cpp, mistral.cpp, qwen2.cpp, gpt_neox.cpp, gpt2.cpp):
//   config.json (io/hf_config.h parses it, with transformers' defaults) -> ModelConfig,
//   ModelConfig -> parameter table (Hugging Face names and stored shapes, decay, init, layout),
// while the block schedule (model/block.h) is shared and reads the ModelConfig's switches.
// Adding an architecture is one new file with one entry, its listing in registry.cpp, and tests.

#include <span>
#include <string>
#include <string_view>

#include "core/status.h"
#include "model/model_config.h"
#include "model/param_table.h"

namespace lathe {

struct ModelFamily {
    std::string_view model_type;         // config.json "model_type"
    std::string_view architecture;       // config.json "architectures"[0] lathe writes
    std::string_view base_model_prefix;  // "model.", "gpt_neox.", "transformer.": checkpoints
                                         // saved from the bare base model lack it
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

// A parsed config.json -> ModelConfig through its family's entry.
Result<ModelConfig> model_config_from_hf(const HfModelConfig& hf, std::string_view source);

// Parses config.json text (from `source`, a path for messages) and builds the ModelConfig.
// Errors: those of hf_config_parse (malformed JSON, a key of the wrong type, an unsupported
// architecture), and of the family.
Result<ModelConfig> model_config_from_hf_json(std::string_view json_text, std::string_view source);

// The same from a file, or a directory holding config.json.
Result<ModelConfig> model_config_from_hf_file(const std::string& path);

// The family of a config built by model_config_from_hf_* (checked).
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
