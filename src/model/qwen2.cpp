// Qwen2 (Qwen2ForCausalLM): Llama plus biases on the q, k and v projections (always; o_proj and
// the MLP have none). With use_sliding_window (false in every released Qwen2/Qwen2.5 checkpoint)
// the layers from max_window_layers up attend within sliding_window keys; io/hf_config.h works
// out which layers, the block schedule takes each layer's window.

#include "model/llama_like.h"
#include "model/registry.h"

namespace lathe {

namespace {

constexpr std::string_view kQwen2Ignored[] = {"rotary_emb.inv_freq"};

}  // namespace

const ModelFamily& qwen2_family() {
    static const ModelFamily family{
        "qwen2",      "Qwen2ForCausalLM", "model.", &llama_like_config, &llama_like_params,
        kQwen2Ignored};
    return family;
}

}  // namespace lathe
