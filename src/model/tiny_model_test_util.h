#pragma once
// Tiny model configs and helpers shared by the CPU model and optimizer tests: HF config.json
// texts small enough to step on the CPU, their parse into a ModelConfig, and deterministic token
// ids. Test code only.

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string_view>
#include <utility>

#include "core/check.h"
#include "model/model.h"
#include "model/registry.h"

namespace lathe::tiny_model {

// Llama: two layers, GQA 4/2, untied head.
constexpr std::string_view kLlamaJson = R"({
  "architectures": ["LlamaForCausalLM"], "model_type": "llama",
  "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
  "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 32,
  "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": false
})";

// GPT-NeoX: one layer, partial rotary, parallel residual.
constexpr std::string_view kNeoxJson = R"({
  "architectures": ["GPTNeoXForCausalLM"], "model_type": "gpt_neox",
  "vocab_size": 40, "hidden_size": 24, "intermediate_size": 40, "num_hidden_layers": 1,
  "num_attention_heads": 3, "max_position_embeddings": 16, "rotary_pct": 0.5,
  "use_parallel_residual": true
})";

// GPT-2: one layer, learned positions, tied head.
constexpr std::string_view kGpt2Json = R"({
  "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
  "vocab_size": 50, "n_embd": 16, "n_layer": 1, "n_head": 2, "n_positions": 12
})";

// The ModelConfig of an HF config.json text; a parse error fails the test binary.
inline ModelConfig parse(std::string_view json) {
    Result<ModelConfig> c = model_config_from_hf_json(json, "test/config.json");
    LATHE_CHECK(c.ok(), "{}", c.status().to_string());
    return std::move(*c);
}

// Deterministic pseudo-random token ids in [0, n), shape (B, T); `salt` varies them.
inline HostTensor ids(int64_t B, int64_t T, int64_t n, int salt) {
    HostTensor t(DType::kI32, Shape{B, T});
    for (int64_t i = 0; i < B * T; ++i)
        t.as<int32_t>()[i] = int32_t((i * 7919 + salt * 104729) % n);
    return t;
}

// A CPU model of `shape`, initialized from seed 7.
inline Model make(const ModelConfig& config, const ModelShape& shape) {
    Result<Model> m = Model::create(config, shape, cpu_context());
    LATHE_CHECK(m.ok(), "{}", m.status().to_string());
    m->init(7);
    return std::move(*m);
}

// Zeroed f32 memory aligned as an arena's entries are (ArenaLayout::kDefaultAlignment): a window
// for the gradient and weight windows hooks.
struct Window {
    struct Free {
        void operator()(float* p) const { std::free(p); }
    };
    std::unique_ptr<float[], Free> data;
    int64_t n = 0;

    explicit Window(int64_t count) : n(count) {
        const size_t a = ArenaLayout::kDefaultAlignment;
        const size_t bytes = (size_t(std::max<int64_t>(n, 1)) * sizeof(float) + a - 1) / a * a;
        data.reset(static_cast<float*>(std::aligned_alloc(a, bytes)));
        std::memset(data.get(), 0, bytes);
    }
    TensorView view() const { return TensorView(data.get(), DType::kF32, Shape{n}); }
};

}  // namespace lathe::tiny_model
