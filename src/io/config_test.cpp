#include "io/config.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
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
    const auto dir =
        std::filesystem::temp_directory_path() / ("lathe_cfg_" + std::to_string(getpid()));
    std::filesystem::create_directories(dir);
    const std::string a = (dir / "a.yaml").string(), b = (dir / "b.yaml").string();
    ASSERT_TRUE(
        file_write_atomic(a, "train: {steps: 10, log_interval: 2}\ndata: {path: p}\n").ok());
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

TEST(YamlCoreSchema, IntegersAreDecimalOctalWithPrefixOrHex) {
    struct Case {
        const char* text;
        int64_t value;
    };
    for (const Case& c :
         {Case{"0", 0}, Case{"10", 10}, Case{"010", 10}, Case{"-010", -10}, Case{"+7", 7},
          Case{"0o17", 15}, Case{"0o0", 0}, Case{"0x10", 16}, Case{"0xfF", 255},
          Case{"9223372036854775807", INT64_MAX}, Case{"-9223372036854775808", INT64_MIN},
          Case{"0x7fffffffffffffff", INT64_MAX}}) {
        const YamlCoreScalar r = yaml_core_resolve(c.text);
        EXPECT_EQ(r.type, YamlCoreType::kInt) << c.text;
        EXPECT_FALSE(r.out_of_range) << c.text;
        EXPECT_EQ(r.int_value, c.value) << c.text;
        EXPECT_EQ(r.float_value, double(c.value)) << c.text;
    }
    for (const char* big : {"9223372036854775808", "-9223372036854775809", "0x8000000000000000",
                            "0o1777777777777777777777", "123456789012345678901234567890"}) {
        const YamlCoreScalar r = yaml_core_resolve(big);
        EXPECT_EQ(r.type, YamlCoreType::kInt) << big;
        EXPECT_TRUE(r.out_of_range) << big;
    }
    // Not integers in the core schema: C's octal without 'o', signed or upper-case prefixes,
    // digits outside the base, separators.
    for (const char* s : {"0o8", "0O17", "0X10", "-0x10", "+0o7", "0x", "0o", "0b101", "1_000",
                          "1,000", " 1", "1 ", "- 1", "--1", "0x1g"}) {
        EXPECT_NE(yaml_core_resolve(s).type, YamlCoreType::kInt) << s;
    }
}

TEST(YamlCoreSchema, FloatsBooleansNullsAndStrings) {
    struct Case {
        const char* text;
        double value;
    };
    for (const Case& c :
         {Case{"1.5", 1.5}, Case{"-1.5", -1.5}, Case{"+.5", 0.5}, Case{"1.", 1.0},
          Case{"1e3", 1000.0}, Case{"3.0", 3.0}, Case{"6e-4", 6e-4}, Case{"1E+2", 100.0},
          Case{"010.5", 10.5}, Case{"1e-400", 0.0}, Case{"0.000e999999999999999999", 0.0}}) {
        const YamlCoreScalar r = yaml_core_resolve(c.text);
        EXPECT_EQ(r.type, YamlCoreType::kFloat) << c.text;
        EXPECT_FALSE(r.out_of_range) << c.text;
        EXPECT_EQ(r.float_value, c.value) << c.text;
    }
    for (const char* inf : {".inf", ".Inf", ".INF", "+.inf", "-.inf"}) {
        const YamlCoreScalar r = yaml_core_resolve(inf);
        EXPECT_EQ(r.type, YamlCoreType::kFloat) << inf;
        EXPECT_TRUE(std::isinf(r.float_value)) << inf;
        EXPECT_EQ(r.float_value < 0, inf[0] == '-') << inf;
    }
    for (const char* nan : {".nan", ".NaN", ".NAN"}) {
        EXPECT_EQ(yaml_core_resolve(nan).type, YamlCoreType::kFloat) << nan;
        EXPECT_TRUE(std::isnan(yaml_core_resolve(nan).float_value)) << nan;
    }
    EXPECT_TRUE(yaml_core_resolve("1e400").out_of_range);
    EXPECT_TRUE(yaml_core_resolve("-1.7e309").out_of_range);
    EXPECT_TRUE(yaml_core_resolve("0.0001e99999999999999999999").out_of_range);
    for (const char* t : {"true", "True", "TRUE"}) {
        EXPECT_EQ(yaml_core_resolve(t).type, YamlCoreType::kBool) << t;
        EXPECT_TRUE(yaml_core_resolve(t).bool_value) << t;
    }
    for (const char* f : {"false", "False", "FALSE"}) {
        EXPECT_EQ(yaml_core_resolve(f).type, YamlCoreType::kBool) << f;
        EXPECT_FALSE(yaml_core_resolve(f).bool_value) << f;
    }
    for (const char* n : {"", "~", "null", "Null", "NULL"}) {
        EXPECT_EQ(yaml_core_resolve(n).type, YamlCoreType::kNull) << n;
    }
    // Strings: YAML 1.1 booleans, C/Python spellings of special floats, hex floats, mixed case.
    for (const char* s :
         {"yes",  "no",    "on",    "off",   "y",        "n",    "tRUE", "nULL", "inf",
          "-inf", "nan",   "NaN",   ".iNf",  "infinity", "1e",   "e3",   ".",    "+",
          "-",    "1.2.3", "0x1p3", "1e3.5", "1_0",      "3 .0", ".e1"}) {
        EXPECT_EQ(yaml_core_resolve(s).type, YamlCoreType::kString) << s;
    }
}

TEST(Config, IntKeysFollowTheCoreSchema) {
    const ConfigSchema schema = test_schema();
    const auto steps = [&](const std::string& value) {
        return Config::load_text(schema, "data.path: a\ntrain:\n  steps: " + value + "\n",
                                 "run.yaml");
    };
    EXPECT_EQ(steps("010")->get_int("train.steps"), 10);  // not octal 8
    EXPECT_EQ(steps("0o10")->get_int("train.steps"), 8);
    EXPECT_EQ(steps("0x10")->get_int("train.steps"), 16);
    EXPECT_EQ(steps("+12")->get_int("train.steps"), 12);
    EXPECT_EQ(steps("!!int 0x10")->get_int("train.steps"), 16);
    const std::vector<std::string> set = {"train.steps=010"};
    EXPECT_EQ(Config::load_text(schema, "data.path: a\n", "t.yaml", set)->get_int("train.steps"),
              10);

    struct Bad {
        const char* value;
        const char* message;
    };
    for (const Bad& b : {
             Bad{"1e3",
                 "run.yaml:3: key 'train.steps' must be an integer, got 1e3, which YAML "
                 "1.2 reads as a float; write the integer 1000 (optimizer steps)"},
             Bad{"3.0",
                 "run.yaml:3: key 'train.steps' must be an integer, got 3.0, which YAML "
                 "1.2 reads as a float; write the integer 3 (optimizer steps)"},
             Bad{"2.5",
                 "run.yaml:3: key 'train.steps' must be an integer, got 2.5, a float "
                 "(optimizer steps)"},
             Bad{"'10'",
                 "run.yaml:3: key 'train.steps' must be an integer, got the quoted "
                 "string '10'; write it without quotes to give an integer (optimizer "
                 "steps)"},
             Bad{"!!str 10",
                 "run.yaml:3: key 'train.steps' must be an integer, got the quoted "
                 "string '10'; write it without quotes to give an integer "
                 "(optimizer steps)"},
             Bad{"9223372036854775808",
                 "run.yaml:3: key 'train.steps' must be an integer, got 9223372036854775808, "
                 "which is out of range (a 64-bit signed integer, -9223372036854775808 to "
                 "9223372036854775807) (optimizer steps)"},
             Bad{"0O10",
                 "run.yaml:3: key 'train.steps' must be an integer, got '0O10' (a string "
                 "in YAML 1.2) (optimizer steps)"},
             Bad{"true",
                 "run.yaml:3: key 'train.steps' must be an integer, got 'true' (a boolean "
                 "in YAML 1.2) (optimizer steps)"},
             Bad{"[1]",
                 "run.yaml:3: key 'train.steps' must be an integer, got a list "
                 "(optimizer steps)"},
             Bad{"!!float 3",
                 "run.yaml:3: key 'train.steps' must be an integer, got 3, which "
                 "YAML 1.2 reads as a float; write the integer 3 (optimizer steps)"},
             Bad{"!!int 3.5",
                 "run.yaml:3: key 'train.steps' must be an integer, got '3.5' with "
                 "the tag 'tag:yaml.org,2002:int', which is not one of YAML 1.2's "
                 "core schema tags for it (!!str, !!int, !!float, !!bool) (optimizer "
                 "steps)"},
         }) {
        auto cfg = steps(b.value);
        ASSERT_FALSE(cfg.ok()) << b.value;
        EXPECT_EQ(cfg.status().message(), b.message) << b.value;
    }
}

TEST(Config, FloatBoolAndListKeysFollowTheCoreSchema) {
    const ConfigSchema schema = test_schema();
    const auto load = [&](const std::string& body) {  // data.path is required: given once
        return Config::load_text(
            schema, body.starts_with("data.path:") ? "\n" + body : "data.path: a\n" + body,
            "run.yaml");
    };
    EXPECT_DOUBLE_EQ(load("optimizer.lr: 3\n")->get_float("optimizer.lr"), 3.0);  // int is a number
    EXPECT_DOUBLE_EQ(load("optimizer.lr: 0x10\n")->get_float("optimizer.lr"), 16.0);
    EXPECT_DOUBLE_EQ(load("optimizer.lr: .5\n")->get_float("optimizer.lr"), 0.5);
    EXPECT_TRUE(std::isinf(load("optimizer.lr: -.Inf\n")->get_float("optimizer.lr")));
    EXPECT_TRUE(std::isnan(load("optimizer.lr: .NaN\n")->get_float("optimizer.lr")));
    EXPECT_FALSE(load("train.bf16: FALSE\n")->get_bool("train.bf16"));
    EXPECT_EQ(load("data.weights: [1, 0x2, .5e1]\n")->get_float_list("data.weights"),
              (std::vector<double>{1.0, 2.0, 5.0}));
    // A string key takes any scalar as its text; a quoted one too.
    EXPECT_EQ(load("data.tokenizer: 010\n")->get_string("data.tokenizer"), "010");
    EXPECT_EQ(load("data.tokenizer: 'null'\n")->get_string("data.tokenizer"), "null");
    EXPECT_FALSE(load("data.tokenizer: ~\n")->has("data.tokenizer"));

    for (const auto& [body, message] : std::vector<std::pair<std::string, std::string>>{
             {"optimizer.lr: inf\n",
              "run.yaml:2: key 'optimizer.lr' must be a number, got 'inf' "
              "(a string in YAML 1.2) (peak learning rate)"},
             {"optimizer.lr: 1e999\n",
              "run.yaml:2: key 'optimizer.lr' must be a number, got 1e999, which is out of range "
              "of a 64-bit float (write .inf for infinity) (peak learning rate)"},
             {"optimizer.lr: '0.1'\n",
              "run.yaml:2: key 'optimizer.lr' must be a number, got the quoted string '0.1'; "
              "write it without quotes to give a float (peak learning rate)"},
             {"train.bf16: yes\n",
              "run.yaml:2: key 'train.bf16' must be a boolean (true/false), "
              "got 'yes' (a string in YAML 1.2) (bf16 compute)"},
             {"train.bf16: 1\n",
              "run.yaml:2: key 'train.bf16' must be a boolean (true/false), "
              "got '1' (an integer in YAML 1.2) (bf16 compute)"},
             {"data.weights: [1, nan]\n",
              "run.yaml:2: key 'data.weights' must be a list of numbers, item 1: got 'nan' (a "
              "string in YAML 1.2) (blend weights)"},
             {"data.weights: 1\n",
              "run.yaml:2: key 'data.weights' must be a list of numbers, "
              "got '1' (blend weights)"},
             {"data.path: [a, {b: c}]\n",
              "run.yaml:2: key 'data.path' must be a string or a list of strings, item 1: got a "
              "map (token-file prefixes)"},
             {"data.tokenizer: !custom x\n",
              "run.yaml:2: key 'data.tokenizer' must be a string, got 'x' with the tag '!custom', "
              "which is not one of YAML 1.2's core schema tags for it (!!str, !!int, !!float, "
              "!!bool) (tokenizer.json)"},
         }) {
        auto cfg = load(body);
        ASSERT_FALSE(cfg.ok()) << body;
        EXPECT_EQ(cfg.status().message(), message) << body;
    }
}

TEST(Config, AKeyGivenTwiceAndSeveralDocumentsAreErrors) {
    const ConfigSchema schema = test_schema();
    for (const auto& [text, message] : std::vector<std::pair<std::string, std::string>>{
             {"data.path: a\ntrain:\n  steps: 3\n  steps: 2\n",
              "run.yaml:4: 'train.steps' is given twice in this file; keep one (files given "
              "later, and --set, override earlier ones)"},
             {"data.path: a\ntrain.steps: 3\ntrain:\n  steps: 2\n",
              "run.yaml:4: 'train.steps' is given twice in this file; keep one (files given "
              "later, and --set, override earlier ones)"},
             {"data.path: a\n---\ndata.path: b\n",
              "run.yaml: holds 2 YAML documents (separated by '---'); a config is one: merge "
              "them, or give them as separate files (merged left to right)"},
         }) {
        auto cfg = Config::load_text(schema, text, "run.yaml");
        ASSERT_FALSE(cfg.ok()) << text;
        EXPECT_EQ(cfg.status().message(), message) << text;
    }
    auto two = Config::load_text(schema, "---\n---\ndata.path: a\n", "run.yaml");
    ASSERT_FALSE(two.ok());
    EXPECT_NE(two.status().message().find("holds 2 YAML documents"), std::string::npos);
    // One document behind a leading '---' (after comments, or ended by '...') is one document.
    EXPECT_TRUE(Config::load_text(schema, "---\ndata.path: a\n", "run.yaml").ok());
    EXPECT_TRUE(Config::load_text(schema, "# c\n---\ndata.path: a\n...\n", "run.yaml").ok());
    EXPECT_TRUE(Config::load_text(schema, "\xEF\xBB\xBF# c\n---\ndata.path: a\n", "run.yaml").ok());
    // The fuzzer's input on which yaml-cpp's LoadAll looped: read as one document, in time.
    (void)Config::load_text(schema, "# a---\n, b\nx: 1\n", "run.yaml");
}

TEST(Config, OddKeysAndSelfReferencesAreErrors) {
    const ConfigSchema schema = test_schema();
    for (const char* text : {"[a, b]: 1\n", "? {a: 1}\n: 2\n", "~: 3\n", "&a [*a]\n",
                             "data: {path: &a [*a]}\n", "train: &t {steps: 1, log: *t}\n",
                             "&m {data: *m}\n", "data.path: a\ntrain.steps: &x [*x]\n"}) {
        auto cfg = Config::load_text(schema, text, "odd.yaml");
        ASSERT_FALSE(cfg.ok()) << text;
        EXPECT_EQ(cfg.status().message().rfind("odd.yaml", 0), 0u) << cfg.status().message();
    }
}

TEST(Config, ToYamlQuotesStringsThatReadAsOtherTypes) {
    const ConfigSchema schema = test_schema();
    auto cfg = Config::load_text(
        schema, "data:\n  path: ['10', 'true', plain]\n  tokenizer: '0x1F'\ntrain.steps: 0x10\n",
        "t.yaml");
    ASSERT_TRUE(cfg.ok()) << cfg.status().to_string();
    const std::string yaml = cfg->to_yaml();
    EXPECT_NE(yaml.find("\"10\""), std::string::npos) << yaml;
    EXPECT_NE(yaml.find("\"true\""), std::string::npos) << yaml;
    EXPECT_NE(yaml.find("tokenizer: \"0x1F\""), std::string::npos) << yaml;
    const YAML::Node reread = YAML::Load(yaml);
    EXPECT_EQ(reread["data"]["path"][0].Tag(), "!") << yaml;  // quoted: a string for any reader
    EXPECT_EQ(reread["data"]["path"][2].Tag(), "?") << yaml;
    auto again = Config::load_text(schema, yaml, "resolved.yaml");
    ASSERT_TRUE(again.ok()) << again.status().to_string();
    EXPECT_EQ(again->get_string_list("data.path"),
              (std::vector<std::string>{"10", "true", "plain"}));
    EXPECT_EQ(again->get_int("train.steps"), 16);
    EXPECT_EQ(again->to_yaml(), yaml);
}

}  // namespace
}  // namespace lathe
