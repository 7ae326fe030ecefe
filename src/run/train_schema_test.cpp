#include "run/train_schema.h"

#include <gtest/gtest.h>

namespace lathe {
namespace {

TEST(TrainSchema, StableKeysExistAndTypoIsCaught) {
    const ConfigSchema schema = train_config_schema();
    for (const char* k : {"train.steps", "train.log_interval", "checkpoint.interval",
                          "checkpoint.keep_last", "data.path", "data.tokenizer"}) {
        EXPECT_NE(schema.find(k), nullptr) << k;
    }
    auto bad = Config::load_text(schema, "data: {path: p, tokenizer: t.json}\ntrain: {steps: 5, log_intreval: 1}\n", "x.yaml");
    ASSERT_FALSE(bad.ok());
    EXPECT_EQ(bad.status().message(), "x.yaml:2: unknown key 'train.log_intreval', did you mean 'train.log_interval'?");
}

}  // namespace
}  // namespace lathe
