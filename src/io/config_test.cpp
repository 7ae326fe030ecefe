#include "io/config.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "io/file.h"

namespace lathe {
namespace {

ConfigSchema test_schema() {
    ConfigSchema s;
    s.add({"train.steps", ConfigType::kInt, "100", "optimizer steps"});
    s.add({"train.log_interval", ConfigType::kInt, "10", "steps between console lines"});
    s.add({"optimizer.lr", ConfigType::kFloat, "3e-4", "peak learning rate"});
    s.add({"train.bf16", ConfigType::kBool, "true", "bf16 compute"});
    s.add({"data.path", ConfigType::kStringList, "", "token-file prefixes", true});
    s.add({"data.tokenizer", ConfigType::kString, "", "tokenizer.json"});
    s.add({"data.weights", ConfigType::kFloatList, "[1.0]", "blend weights"});
    return s;
}

TEST(Config, DefaultsNestedMapsAndOverrides) {
    const ConfigSchema schema = test_schema();
    const std::vector<std::string> sets = {"train.steps=7", "data.weights=[0.3, 0.7]"};
    auto cfg = Config::load_text(schema,
                                 "train:\n  log_interval: 5\noptimizer: {lr: 1e-3}\n"
                                 "data:\n  path: [a, b]\n",
                                 "t.yaml", sets);
    ASSERT_TRUE(cfg.ok()) << cfg.status().to_string();
    EXPECT_EQ(cfg->get_int("train.steps"), 7);
    EXPECT_EQ(cfg->get_int("train.log_interval"), 5);
    EXPECT_DOUBLE_EQ(cfg->get_float("optimizer.lr"), 1e-3);
    EXPECT_TRUE(cfg->get_bool("train.bf16"));
    EXPECT_EQ(cfg->get_string_list("data.path"), (std::vector<std::string>{"a", "b"}));
    EXPECT_EQ(cfg->get_float_list("data.weights"), (std::vector<double>{0.3, 0.7}));
    EXPECT_FALSE(cfg->has("data.tokenizer"));
    EXPECT_EQ(cfg->source_of("train.steps"), "--set train.steps=7");
    EXPECT_EQ(cfg->source_of("train.log_interval"), "t.yaml:2");
    EXPECT_EQ(cfg->source_of("train.bf16"), "default");
}

TEST(Config, DottedKeysAndSingleStringForList) {
    const ConfigSchema schema = test_schema();
    auto cfg = Config::load_text(schema, "train.steps: 3\ndata.path: /x/y\n", "t.yaml");
    ASSERT_TRUE(cfg.ok()) << cfg.status().to_string();
    EXPECT_EQ(cfg->get_int("train.steps"), 3);
    EXPECT_EQ(cfg->get_string_list("data.path"), (std::vector<std::string>{"/x/y"}));
}

TEST(Config, UnknownKeyNamesFileLineAndSuggestion) {
    const ConfigSchema schema = test_schema();
    auto cfg = Config::load_text(schema, "data:\n  path: a\ntrain:\n  stpes: 5\n", "run.yaml");
    ASSERT_FALSE(cfg.ok());
    EXPECT_EQ(cfg.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(cfg.status().message(),
              "run.yaml:4: unknown key 'train.stpes', did you mean 'train.steps'?");
}

TEST(Config, WrongTypeNamesKeyAndType) {
    const ConfigSchema schema = test_schema();
    auto cfg = Config::load_text(schema, "data.path: a\ntrain:\n  steps: many\n", "run.yaml");
    ASSERT_FALSE(cfg.ok());
    EXPECT_NE(cfg.status().message().find("run.yaml:3: key 'train.steps' must be an integer"),
              std::string::npos)
        << cfg.status().message();
    auto b = Config::load_text(schema, "data.path: a\ntrain.bf16: yes\n", "run.yaml");
    ASSERT_FALSE(b.ok());  // YAML 1.2: 'yes' is a string, not a boolean
    auto m = Config::load_text(schema, "data.path: a\ntrain: 5\n", "run.yaml");
    ASSERT_FALSE(m.ok());
    EXPECT_NE(m.status().message().find("'train' is a section"), std::string::npos);
}

TEST(Config, OverrideErrors) {
    const ConfigSchema schema = test_schema();
    const std::vector<std::string> bad_key = {"train.setps=3"};
    auto a = Config::load_text(schema, "data.path: a\n", "t.yaml", bad_key);
    ASSERT_FALSE(a.ok());
    EXPECT_EQ(a.status().message(),
              "--set train.setps=3: unknown key 'train.setps', did you mean 'train.steps'?");
    const std::vector<std::string> no_eq = {"train.steps"};
    EXPECT_FALSE(Config::load_text(schema, "data.path: a\n", "t.yaml", no_eq).ok());
}

TEST(Config, RequiredKeyAndBadYaml) {
    const ConfigSchema schema = test_schema();
    auto a = Config::load_text(schema, "train.steps: 3\n", "t.yaml");
    ASSERT_FALSE(a.ok());
    EXPECT_NE(a.status().message().find("missing required key 'data.path'"), std::string::npos);
    auto b = Config::load_text(schema, "train: [1, 2\n", "t.yaml");
    ASSERT_FALSE(b.ok());
    EXPECT_NE(b.status().message().find("t.yaml:"), std::string::npos);
}

TEST(Config, FilesMergeLeftToRightAndYamlRoundTrips) {
    const auto dir = std::filesystem::temp_directory_path() / ("lathe_cfg_" + std::to_string(getpid()));
    std::filesystem::create_directories(dir);
    const std::string a = (dir / "a.yaml").string(), b = (dir / "b.yaml").string();
    ASSERT_TRUE(file_write_atomic(a, "train: {steps: 10, log_interval: 2}\ndata: {path: p}\n").ok());
    ASSERT_TRUE(file_write_atomic(b, "train: {steps: 20}\n").ok());
    const ConfigSchema schema = test_schema();
    const std::vector<std::string> files = {a, b};
    auto cfg = Config::load(schema, files, {});
    ASSERT_TRUE(cfg.ok()) << cfg.status().to_string();
    EXPECT_EQ(cfg->get_int("train.steps"), 20);
    EXPECT_EQ(cfg->get_int("train.log_interval"), 2);
    EXPECT_EQ(cfg->source_of("train.steps"), b + ":1");
    auto again = Config::load_text(schema, cfg->to_yaml(), "resolved.yaml");
    ASSERT_TRUE(again.ok()) << again.status().to_string();
    EXPECT_EQ(again->to_yaml(), cfg->to_yaml());
    const std::vector<std::string> missing = {a, (dir / "nope.yaml").string()};
    auto m = Config::load(schema, missing, {});
    ASSERT_FALSE(m.ok());
    EXPECT_EQ(m.status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace lathe
