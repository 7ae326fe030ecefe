// The precision policy reaches every linear of the model: a policy that marks one role fp8 stops
// the first op of that role, naming it (no backend has an fp8 linear kernel), for each block
// layout (gated MLP with a sequential residual, GELU MLP, parallel residual) and the LM head; the
// default policy trains as it always does.

#include "model/precision_policy.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "core/check.h"
#include "model/model.h"
#include "model/registry.h"
#include "model/tiny_model_test_util.h"

namespace lathe {
namespace {

constexpr std::string_view kLlamaJson = R"({
  "architectures": ["LlamaForCausalLM"], "model_type": "llama",
  "vocab_size": 32, "hidden_size": 16, "intermediate_size": 24, "num_hidden_layers": 1,
  "num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": 16
})";

using tiny_model::kGpt2Json;
using tiny_model::kNeoxJson;
using tiny_model::parse;

constexpr LinearRole kRoles[] = {LinearRole::kQkv, LinearRole::kAttnOut, LinearRole::kMlpUp,
                                 LinearRole::kMlpDown, LinearRole::kLmHead};

// One training step's forward and backward of a (1, 4) batch under `policy`; returns the loss.
float train_step(const ModelConfig& config, const PrecisionPolicy& policy) {
    ModelShape shape{1, 4, 0};
    shape.precision = policy;
    Result<Model> m = Model::create(config, shape, cpu_context());
    LATHE_CHECK(m.ok(), "{}", m.status().to_string());
    m->init(3);
    HostTensor tokens(DType::kI32, Shape{1, 4}), targets(DType::kI32, Shape{1, 4});
    for (int64_t i = 0; i < 4; ++i) {
        tokens.as<int32_t>()[i] = int32_t(i + 1);
        targets.as<int32_t>()[i] = int32_t(i + 2);
    }
    return m->forward_backward(ModelBatch{tokens.view(), targets.view(), {}, {}});
}

TEST(PrecisionPolicy, DefaultIsNativeEverywhere) {
    const PrecisionPolicy p;
    for (LinearRole r : kRoles) {
        EXPECT_EQ(p.of(r), LinearPrecision::kNative) << linear_role_name(r);
        EXPECT_EQ(p.spec(r).role, linear_role_name(r));
    }
    EXPECT_EQ(ModelShape{}.precision, p);
    EXPECT_TRUE(std::isfinite(train_step(parse(kLlamaJson), p)));
}

TEST(PrecisionPolicy, AnFp8RoleStopsItsLinearNamingTheRole) {
    GTEST_FLAG_SET(death_test_style, "threadsafe");
    for (std::string_view json : {kLlamaJson, kNeoxJson, kGpt2Json}) {
        const ModelConfig config = parse(json);
        for (LinearRole r : kRoles) {
            PrecisionPolicy p;
            p.set(r, LinearPrecision::kFp8PerTensor);
            const std::string want = "fp8 linear: no kernel for fp8_per_tensor \\(" +
                                     std::string(linear_role_name(r)) + "\\) on the cpu backend";
            EXPECT_DEATH(train_step(config, p), want) << config.model_type;
        }
        PrecisionPolicy blockwise;
        blockwise.set(LinearRole::kMlpDown, LinearPrecision::kFp8Blockwise);
        EXPECT_DEATH(train_step(config, blockwise), "no kernel for fp8_blockwise \\(mlp_down\\)")
            << config.model_type;
    }
}

}  // namespace
}  // namespace lathe
