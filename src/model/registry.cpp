#include "model/registry.h"

#include <array>

#include "core/check.h"

namespace lathe {

std::span<const ModelFamily* const> model_families() {
    static const std::array<const ModelFamily*, 5> families = {
        &llama_family(), &mistral_family(), &qwen2_family(), &gpt_neox_family(), &gpt2_family()};
    return families;
}

Result<const ModelFamily*> model_family_find(std::string_view model_type) {
    for (const ModelFamily* f : model_families())
        if (f->model_type == model_type) return f;
    return unimplemented_error("model_type '{}' is not supported; lathe knows {}", model_type,
                               model_family_names(", ", ", "));
}

std::string model_family_names(std::string_view separator, std::string_view last) {
    const std::span<const ModelFamily* const> families = model_families();
    std::string names;
    for (size_t i = 0; i < families.size(); ++i) {
        if (i > 0) names += i + 1 == families.size() ? last : separator;
        names += families[i]->model_type;
    }
    return names;
}

Result<ModelConfig> model_config_from_hf(const HfModelConfig& hf, std::string_view source) {
    LATHE_CHECK(hf.family != nullptr, "an HfModelConfig without its family");
    return hf.family->config_from_hf(hf, source);
}

Result<ModelConfig> model_config_from_hf_json(std::string_view json_text, std::string_view source) {
    LATHE_ASSIGN_OR_RETURN(const HfModelConfig hf, hf_config_parse(json_text, std::string(source)));
    return model_config_from_hf(hf, source);
}

Result<ModelConfig> model_config_from_hf_file(const std::string& path) {
    LATHE_ASSIGN_OR_RETURN(const HfModelConfig hf, hf_config_load(path));
    return model_config_from_hf(hf, path);
}

const ModelFamily& model_family_of(const ModelConfig& config) {
    // The family that parsed its config.json (registered or not), else the registry's entry.
    if (config.hf.family != nullptr && config.hf.family->model_type == config.model_type)
        return *config.hf.family;
    Result<const ModelFamily*> family = model_family_find(config.model_type);
    LATHE_CHECK(family.ok(), "{}", family.status().to_string());
    return **family;
}

ParamTable model_param_table(const ModelConfig& config) {
    ParamTableBuilder builder;
    model_family_of(config).build_params(config, builder);
    return std::move(builder).finish();
}

}  // namespace lathe
