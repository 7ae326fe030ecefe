// Mistral (MistralForCausalLM): Llama plus sliding-window attention (`sliding_window` keys seen
// by each query, itself included; null turns it off, as Mistral-7B-v0.2 and later do). No biases.

#include "model/llama_like.h"
#include "model/registry.h"

namespace lathe {

namespace {

constexpr std::string_view kMistralIgnored[] = {"rotary_emb.inv_freq"};

}  // namespace

const ModelFamily& mistral_family() {
    static const ModelFamily family{"mistral",          "MistralForCausalLM", "model.",
                                    &llama_like_config, &llama_like_params,   kMistralIgnored};
    return family;
}

}  // namespace lathe
