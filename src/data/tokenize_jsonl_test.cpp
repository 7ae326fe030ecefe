// tokenize_jsonl with the shared GPT-2 tokenizer: the ids are Tokenizer::encode's, line order is
// kept whatever the thread count, decode inverts encode, and a bad line is an error naming the
// file and line that leaves no output.
#include "data/tokenize_jsonl.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "core/temp_files_test_util.h"
#include "tokenizer/tokenizer.h"

namespace lathe {
namespace {

const std::string kGpt2 = std::string(LATHE_SHARED_DIR) + "/tokenizers/gpt2.json";

const testutil::TempFiles kTemp("lathe_tokenize_jsonl_test");

std::vector<std::string> texts(int n) {
    std::vector<std::string> out;
    for (int i = 0; i < n; ++i) {
        std::string t = "line " + std::to_string(i) + ":";
        for (int k = 0; k < i % 13; ++k) t += " w" + std::to_string(k * i);
        out.push_back(t);
    }
    return out;
}

TokenizeJsonlOptions options(const std::string& input, const std::string& output, int threads) {
    TokenizeJsonlOptions o;
    o.tokenizer = kGpt2;
    o.input = input;
    o.output = output;
    o.threads = threads;
    o.show_progress = false;
    return o;
}

TEST(TokenizeJsonl, EncodesAsTheTokenizerInOrderOnAnyThreadCount) {
    ASSERT_TRUE(std::filesystem::exists(kGpt2)) << "no " << kGpt2 << " (required test data)";
    auto tok = Tokenizer::load(kGpt2);
    ASSERT_TRUE(tok.ok()) << tok.status().message();
    const std::vector<std::string> lines = texts(9000);  // several batches of kBatchLines
    std::string input, expected;
    std::vector<int32_t> ids;
    for (const std::string& t : lines) {
        input += "{\"text\": \"" + t + "\"}\n";
        ASSERT_TRUE(tok->encode(t, /*add_special=*/false, ids).ok());
        expected += "{\"ids\":[";
        for (size_t i = 0; i < ids.size(); ++i) {
            expected += (i ? "," : "") + std::to_string(ids[i]);
        }
        expected += "]}\n";
    }
    const std::string in = kTemp.write("in.jsonl", input);
    for (int threads : {1, 3}) {
        const std::string out = kTemp.path("out" + std::to_string(threads) + ".jsonl");
        Status s = tokenize_jsonl(options(in, out, threads));
        ASSERT_TRUE(s.ok()) << s.message();
        EXPECT_EQ(testutil::read_whole_file(out), expected) << threads << " threads";
    }
}

TEST(TokenizeJsonl, DecodeInvertsEncode) {
    ASSERT_TRUE(std::filesystem::exists(kGpt2)) << "no " << kGpt2 << " (required test data)";
    const std::string in = kTemp.write(
        "rt.jsonl", "{\"text\": \"Hello, world!\"}\n{\"text\": \"caf\\u00e9 \\\"q\\\"\"}\n");
    const std::string ids = kTemp.path("rt_ids.jsonl");
    ASSERT_TRUE(tokenize_jsonl(options(in, ids, 2)).ok());
    TokenizeJsonlOptions dec = options(ids, kTemp.path("rt_text.jsonl"), 2);
    dec.decode = true;
    Status s = tokenize_jsonl(dec);
    ASSERT_TRUE(s.ok()) << s.message();
    EXPECT_EQ(testutil::read_whole_file(dec.output),
              "{\"text\":\"Hello, world!\"}\n{\"text\":\"caf\xc3\xa9 \\\"q\\\"\"}\n");
}

TEST(TokenizeJsonl, BadLineNamesFileAndLineAndLeavesNoOutput) {
    ASSERT_TRUE(std::filesystem::exists(kGpt2)) << "no " << kGpt2 << " (required test data)";
    std::string input;
    for (int i = 0; i < 5000; ++i) input += "{\"text\": \"ok\"}\n";
    input += "{\"txt\": \"no text field\"}\n";
    const std::string in = kTemp.write("bad.jsonl", input);
    const std::string out = kTemp.path("bad_out.jsonl");
    std::filesystem::remove(out);
    for (int threads : {1, 4}) {
        Status s = tokenize_jsonl(options(in, out, threads));
        ASSERT_FALSE(s.ok());
        EXPECT_NE(s.message().find(in + ":5001: "), std::string::npos) << s.message();
        EXPECT_FALSE(std::filesystem::exists(out));
    }
    TokenizeJsonlOptions dec =
        options(kTemp.write("bad_ids.jsonl", "{\"ids\": [1, -2]}\n"), out, 1);
    dec.decode = true;
    Status s = tokenize_jsonl(dec);
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.message().find(":1: field 'ids' element 1 is not an id"), std::string::npos)
        << s.message();
}

}  // namespace
}  // namespace lathe
