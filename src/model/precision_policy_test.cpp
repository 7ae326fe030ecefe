// The precision policy reaches the model through ModelShape: the default policy trains as it
// always does; a policy that marks any role fp8 is refused by Model::create on the CPU backend
// (fp8 linears run on CUDA only: model.h), for each block layout (gated MLP with a sequential
// residual, GELU MLP, parallel residual) and the LM head. (ops/linear_test.cpp checks that each
// linear op stops on an fp8 spec it has no kernel for, naming the role.)

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

TEST(PrecisionPolicy, AnFp8RoleOnTheCpuIsRefusedAtCreationNamingTheBackend) {
    for (std::string_view json : {kLlamaJson, kNeoxJson, kGpt2Json}) {
        const ModelConfig config = parse(json);
        for (LinearRole r : kRoles) {
            for (LinearPrecision x :
                 {LinearPrecision::kFp8PerTensor, LinearPrecision::kFp8Blockwise}) {
                ModelShape shape{1, 16, 0};
                shape.precision.set(r, x);
                Result<Model> m = Model::create(config, shape, cpu_context());
                ASSERT_FALSE(m.ok()) << config.model_type << " " << linear_role_name(r);
                EXPECT_NE(m.status().message().find("on the cpu backend"), std::string::npos)
                    << m.status().message();
            }
        }
    }
}

}  // namespace
}  // namespace lathe
