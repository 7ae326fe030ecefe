#include "io/hf_config.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "io/file.h"

namespace lathe {
namespace {

namespace fs = std::filesystem;

HfConfigReader reader(std::string_view text) {
    auto r = HfConfigReader::parse(text, "/ckpt/config.json");
    EXPECT_TRUE(r.ok()) << r.status().to_string();
    return std::move(*r);
}

void expect_message(const Status& s, StatusCode code, const std::string& needle) {
    ASSERT_FALSE(s.ok()) << "no error, wanted: " << needle;
    EXPECT_EQ(s.code(), code) << s.to_string();
    EXPECT_EQ(s.message().find("/ckpt/config.json: "), 0u) << s.message();
    EXPECT_NE(s.message().find(needle), std::string::npos)
        << "no '" << needle << "' in: " << s.message();
}

TEST(HfConfigReader, RefusesTextThatIsNotAnObject) {
    expect_message(HfConfigReader::parse("{\"a\": ", "/ckpt/config.json").status(),
                   StatusCode::kInvalidArgument, "not valid JSON");
    expect_message(HfConfigReader::parse("[1, 2]", "/ckpt/config.json").status(),
                   StatusCode::kInvalidArgument, "config.json must be a JSON object, got a list");
}

TEST(HfConfigReader, TypedKeysKeepDefaultsAndNameTheKey) {
    HfConfigReader r = reader(R"({"n": 7, "f": 2, "b": true, "s": "x", "o": null,
                                  "neg": -1, "big": 18446744073709551615, "other": [1]})");
    int64_t n = 0, missing = 42;
    double f = 0;
    bool b = false;
    std::string s;
    std::optional<int64_t> o = 5;
    EXPECT_TRUE(r.int_key("n", &n).ok());
    EXPECT_EQ(n, 7);
    EXPECT_TRUE(r.int_key("absent", &missing).ok());
    EXPECT_EQ(missing, 42);                  // absent: the default stays
    EXPECT_TRUE(r.float_key("f", &f).ok());  // an integer is a number
    EXPECT_EQ(f, 2.0);
    EXPECT_TRUE(r.bool_key("b", &b).ok());
    EXPECT_TRUE(b);
    EXPECT_TRUE(r.string_key("s", &s).ok());
    EXPECT_EQ(s, "x");
    EXPECT_TRUE(r.opt_int_key("o", &o).ok());
    EXPECT_FALSE(o.has_value());
    expect_message(r.int_key("neg", &n), StatusCode::kInvalidArgument,
                   "key 'neg' must be an integer >= 1, got the number -1");
    expect_message(r.int_key("big", &n), StatusCode::kInvalidArgument, "key 'big' must be");
    expect_message(r.int_key("s", &n), StatusCode::kInvalidArgument,
                   "key 's' must be an integer >= 1, got the string \"x\"");
    expect_message(r.bool_key("n", &b), StatusCode::kInvalidArgument,
                   "key 'n' must be true or false, got the number 7");
    expect_message(r.float_key("b", &f), StatusCode::kInvalidArgument,
                   "key 'b' must be a number, got the boolean true");
    expect_message(r.string_key("o", &s), StatusCode::kInvalidArgument,
                   "key 'o' must be a string, got null");
    // What nobody read is kept as JSON text; peek() does not consume.
    ASSERT_NE(r.peek("other"), nullptr);
    EXPECT_EQ(r.peek("nope"), nullptr);
    EXPECT_EQ(r.unconsumed(), (std::map<std::string, std::string>{{"other", "[1]"}}));
}

TEST(HfConfigReader, RopeScalingObjects) {
    const nlohmann::json llama3 = {{"rope_type", "llama3"},
                                   {"factor", 32.0},
                                   {"low_freq_factor", 1.0},
                                   {"high_freq_factor", 4.0},
                                   {"original_max_position_embeddings", 8192}};
    auto s = hf_parse_rope_scaling(llama3, "rope_scaling", "/ckpt/config.json");
    ASSERT_TRUE(s.ok()) << s.status().to_string();
    EXPECT_EQ(**s, (HfRopeScaling{32.0, 1.0, 4.0, 8192}));
    EXPECT_FALSE(hf_parse_rope_scaling(nullptr, "rope_scaling", "x")->has_value());
    EXPECT_FALSE(hf_parse_rope_scaling({{"rope_theta", 1e4}}, "rope_parameters", "x")->has_value());
    expect_message(
        hf_parse_rope_scaling({{"type", "linear"}}, "rope_scaling", "/ckpt/config.json").status(),
        StatusCode::kUnimplemented, "key 'rope_scaling.type' is \"linear\"");
    expect_message(
        hf_parse_rope_scaling({{"rope_type", "llama3"}}, "rope_scaling", "/ckpt/config.json")
            .status(),
        StatusCode::kInvalidArgument, "key 'rope_scaling.factor' is missing");
    EXPECT_EQ(hf_activation_from_name("gelu_pytorch_tanh"), HfActivation::kGeluTanh);
    EXPECT_EQ(hf_activation_from_name("quick_gelu"), std::nullopt);
}

TEST(HfConfigReader, FileOfADirectoryAndTheWrittenText) {
    const fs::path dir =
        fs::temp_directory_path() / fmt::format("lathe_hf_reader_test_{}", ::getpid());
    fs::remove_all(dir);
    fs::create_directories(dir / "empty");
    ASSERT_TRUE(file_write_atomic((dir / "config.json").string(), "{}").ok());
    EXPECT_EQ(*hf_config_file_of(dir.string()), (dir / "config.json").string());
    EXPECT_EQ(*hf_config_file_of((dir / "x.json").string()), (dir / "x.json").string());
    const Status empty = hf_config_file_of((dir / "empty").string()).status();
    EXPECT_EQ(empty.code(), StatusCode::kNotFound);
    EXPECT_NE(empty.message().find("no config.json in this directory"), std::string::npos);
    fs::remove_all(dir);
    EXPECT_EQ(hf_config_text({{"b", 1.0}, {"a", nullptr}}), "{\n  \"a\": null,\n  \"b\": 1.0\n}\n");
}

}  // namespace
}  // namespace lathe
