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
    auto bad = Config::load_text(
        schema, "data: {path: p, tokenizer: t.json}\ntrain: {steps: 5, log_intreval: 1}\n",
        "x.yaml");
    ASSERT_FALSE(bad.ok());
    EXPECT_EQ(bad.status().message(),
              "x.yaml:2: unknown key 'train.log_intreval', did you mean 'train.log_interval'?");
}

TEST(TrainSchema, ResumeCompatibilityCoversTheRule) {
    const ConfigSchema schema = train_config_schema();
    // What an exact resume depends on.
    for (const char* k :
         {"model.hidden_size", "model.family", "model.vocab_size", "data.path", "data.seq_length",
          "data.tokenizer", "data.split", "data.weights", "data.label_path", "train.seed",
          "train.micro_batch_size", "train.gradient_accumulation_steps", "checkpoint.init_from"}) {
        ASSERT_NE(schema.find(k), nullptr) << k;
        EXPECT_FALSE(train_key_resume_compatible(k)) << k;
    }
    // What may change.
    for (const char* k :
         {"optimizer.lr", "optimizer.min_lr", "lr.warmup", "lr.decay_style", "train.steps",
          "train.log_interval", "train.eval_interval", "checkpoint.interval",
          "checkpoint.keep_last", "train.device", "train.threads"}) {
        ASSERT_NE(schema.find(k), nullptr) << k;
        EXPECT_TRUE(train_key_resume_compatible(k)) << k;
    }
    // A key outside the schema (a typo in the list, or a key the schema does not have) is not
    // compatible.
    EXPECT_FALSE(train_key_resume_compatible("train.stepz"));
}

TEST(TrainSchema, ConfigChangesNameKeysAndValues) {
    const ConfigSchema schema = train_config_schema();
    const std::string base =
        "data: {path: p, tokenizer: t.json, seq_length: 32}\ntrain: {steps: 5, seed: "
        "7}\noptimizer: {lr: 3.0e-3}\n";
    auto before = Config::load_text(schema, base, "run.yaml");
    ASSERT_TRUE(before.ok()) << before.status().to_string();
    auto same = Config::load_text(schema, before->to_yaml(), "again.yaml");
    ASSERT_TRUE(same.ok()) << same.status().to_string();
    EXPECT_TRUE(train_config_changes(*before, *same).empty());

    auto after =
        Config::load_text(schema, base, "new.yaml",
                          std::vector<std::string>{"optimizer.lr=1e-3", "data.seq_length=16",
                                                   "data.path=[p, q]", "model.hidden_size=64"});
    ASSERT_TRUE(after.ok()) << after.status().to_string();
    const std::vector<TrainConfigChange> changes = train_config_changes(*before, *after);
    ASSERT_EQ(changes.size(), 4u);
    // Schema order: model, data, ..., optimizer.
    EXPECT_EQ(changes[0].key, "model.hidden_size");
    EXPECT_EQ(changes[0].before, "(unset)");
    EXPECT_EQ(changes[0].after, "64");
    EXPECT_FALSE(changes[0].compatible);
    EXPECT_EQ(changes[1].key, "data.path");
    EXPECT_EQ(changes[1].before, "[p]");
    EXPECT_EQ(changes[1].after, "[p, q]");
    EXPECT_EQ(changes[2].key, "data.seq_length");
    EXPECT_EQ(changes[2].before, "32");
    EXPECT_EQ(changes[2].after, "16");
    EXPECT_FALSE(changes[2].compatible);
    EXPECT_EQ(changes[3].key, "optimizer.lr");
    EXPECT_EQ(changes[3].before, "0.003");
    EXPECT_EQ(changes[3].after, "0.001");
    EXPECT_TRUE(changes[3].compatible);
}

}  // namespace
}  // namespace lathe
