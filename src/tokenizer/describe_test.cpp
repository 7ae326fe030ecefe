// tokenizer_describe on the shared GPT-2 tokenizer.json, and on files that are not one.
#include "tokenizer/describe.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace lathe {
namespace {

const std::string kGpt2 = std::string(LATHE_SHARED_DIR) + "/tokenizers/gpt2.json";

TEST(TokenizerDescribe, Gpt2) {
    ASSERT_TRUE(std::filesystem::exists(kGpt2)) << "no " << kGpt2 << " (required test data)";
    auto text = tokenizer_describe(kGpt2);
    ASSERT_TRUE(text.ok()) << text.status().message();
    EXPECT_NE(text->find("file:           " + kGpt2 + "\n"), std::string::npos) << *text;
    EXPECT_NE(text->find("model:          BPE, 50257 vocabulary entries, 50000 merges\n"),
              std::string::npos)
        << *text;
    EXPECT_NE(text->find("pre_tokenizer:  ByteLevel("), std::string::npos) << *text;
    EXPECT_NE(text->find("added tokens:   1 (1 special)\n  "), std::string::npos) << *text;
    EXPECT_NE(text->find("vocab size:     50257 (with added tokens)\n"), std::string::npos)
        << *text;
    EXPECT_NE(text->find("lathe:          loads"), std::string::npos) << *text;
}

TEST(TokenizerDescribe, NotATokenizerIsAnError) {
    const auto path = std::filesystem::temp_directory_path() /
                      ("lathe_describe_test_" + std::to_string(::getpid()) + ".json");
    std::ofstream(path) << "{\"vocab_size\": 5}";
    auto text = tokenizer_describe(path.string());
    std::filesystem::remove(path);
    EXPECT_FALSE(text.ok());
    EXPECT_FALSE(tokenizer_describe(path.string()).ok());  // missing
}

}  // namespace
}  // namespace lathe
