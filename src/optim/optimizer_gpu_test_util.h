#pragma once
// What optim/'s GPU tests (CTest label gpu) share: one CudaState per test suite, a small Llama on
// it, batches that depend on a salt, and the bytes of a device view for bit-exact comparisons.
// For .cu tests, after ops/cuda/nvcc_compat.h.

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "model/model.h"
#include "model/registry.h"
#include "ops/cuda/cuda_state.h"
#include "ops/cuda/memory.h"

namespace lathe::optim_gpu_test {

constexpr int64_t kB = 2, kT = 64, kVocab = 384;

// A fixture whose tests share one CudaState, made before the suite's first test and freed after
// its last.
class CudaSuite : public ::testing::Test {
protected:
    static void SetUpTestSuite() { state_ = new CudaState(0); }
    static void TearDownTestSuite() {
        delete state_;
        state_ = nullptr;
    }
    static inline CudaState* state_ = nullptr;
};

// A Llama of width 128 over a kVocab-token vocabulary with `layers` layers, for kB x kT batches
// on `ctx`; its masters on the host from `offload_fraction` of the vector on (model.h). Not
// initialised.
inline Model make_llama(const Context& ctx, int layers, bool masters_on_host = false,
                        double offload_fraction = 1.0) {
    const std::string json = R"({"architectures": ["LlamaForCausalLM"],
  "model_type": "llama", "vocab_size": 384, "hidden_size": 128, "intermediate_size": 256,
  "num_hidden_layers": )" + std::to_string(layers) +
                             R"(, "num_attention_heads": 4, "num_key_value_heads": 2,
  "max_position_embeddings": 128, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
  "tie_word_embeddings": false})";
    Result<ModelConfig> c = model_config_from_hf_json(json, "test/config.json");
    LATHE_CHECK(c.ok(), "{}", c.status().to_string());
    ModelShape shape;
    shape.batch = kB;
    shape.seq_len = kT;
    shape.masters_on_host = masters_on_host;
    shape.offload_fraction = offload_fraction;
    Result<Model> m = Model::create(*c, shape, ctx);
    LATHE_CHECK(m.ok(), "{}", m.status().to_string());
    return std::move(*m);
}

// kB x kT tokens and targets that depend on `salt`.
struct SaltedBatch {
    HostTensor tokens{DType::kI32, Shape{kB, kT}}, targets{DType::kI32, Shape{kB, kT}};
    ModelBatch batch() const { return ModelBatch{tokens.view(), targets.view(), {}, {}}; }
};

inline SaltedBatch salted_batch(int salt) {
    SaltedBatch b;
    for (int64_t i = 0; i < kB * kT; ++i) {
        b.tokens.as<int32_t>()[i] = int32_t((i * 7919 + salt * 104729) % kVocab);
        b.targets.as<int32_t>()[i] = int32_t((i * 104729 + salt * 7919) % kVocab);
    }
    return b;
}

// The bytes of a device view, copied on the state's stream.
inline std::vector<uint8_t> device_bytes(ConstTensorView v, CudaState& state) {
    std::vector<uint8_t> out(v.bytes());
    cuda_copy_sync(TensorView(out.data(), DType::kU8, Shape{int64_t(out.size())}),
                   ConstTensorView(v.data(), DType::kU8, Shape{int64_t(v.bytes())}, Device::kCuda),
                   state.stream());
    return out;
}

}  // namespace lathe::optim_gpu_test
