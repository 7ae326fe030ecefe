// bpe_train_files: a trained file loads and encodes its corpus' frequent words as single tokens,
// JSONL and text inputs give the same tokenizer, bad options fail before any input is read, and a
// bad JSONL line is an error naming the file and line.
#include "tokenizer/bpe_train_files.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "core/temp_files_test_util.h"
#include "tokenizer/tokenizer.h"

namespace lathe {
namespace {

const testutil::TempFiles kTemp("lathe_bpe_train_files_test");

std::vector<std::string> documents() {
    std::vector<std::string> docs;
    for (int i = 0; i < 200; ++i) {
        docs.push_back("the lathe turns wood " + std::to_string(i % 7) + " lathe lathe");
    }
    return docs;
}

BpeTrainFilesOptions options(const std::vector<std::string>& inputs, const std::string& output) {
    BpeTrainFilesOptions o;
    o.vocab_size = 270;
    o.inputs = inputs;
    o.output = output;
    o.threads = 2;
    o.show_progress = false;
    return o;
}

TEST(BpeTrainFiles, TextAndJsonlGiveTheSameLoadableTokenizer) {
    std::string text, jsonl = "\n";  // a blank line is no document
    for (const std::string& d : documents()) {
        text += d + "\n\n";
        jsonl += "{\"id\": 1, \"text\": \"" + d + "\"}\n";
    }
    const auto from_text = options({kTemp.write("corpus.txt", text)}, kTemp.path("from_text.json"));
    const auto from_jsonl =
        options({kTemp.write("corpus.jsonl", jsonl)}, kTemp.path("from_jsonl.json"));
    Status s = bpe_train_files(from_text);
    ASSERT_TRUE(s.ok()) << s.message();
    s = bpe_train_files(from_jsonl);
    ASSERT_TRUE(s.ok()) << s.message();
    EXPECT_EQ(testutil::read_whole_file(from_text.output),
              testutil::read_whole_file(from_jsonl.output));

    auto tok = Tokenizer::load(from_text.output);
    ASSERT_TRUE(tok.ok()) << tok.status().message();
    EXPECT_EQ(tok->vocab_size(), 270);
    std::vector<int32_t> ids;
    ASSERT_TRUE(tok->encode(" lathe", /*add_special=*/false, ids).ok());
    EXPECT_EQ(ids.size(), 1u);  // the most frequent word became one token
}

TEST(BpeTrainFiles, BadOptionsFailBeforeReading) {
    const std::string missing = kTemp.path("no_such_input.txt");
    BpeTrainFilesOptions o = options({missing}, kTemp.path("unused.json"));
    o.format = "csv";
    Status s = bpe_train_files(o);
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.message().find("--format: unknown format 'csv'"), std::string::npos);
    o = options({missing}, kTemp.path("unused.json"));
    o.on_error = "ignore";
    EXPECT_NE(bpe_train_files(o).message().find("--on-error: expected fail or skip"),
              std::string::npos);
    o = options({missing}, kTemp.path("unused.json"));
    o.special_tokens = {"<s>", ""};
    EXPECT_NE(bpe_train_files(o).message().find("--special-tokens: an empty name"),
              std::string::npos);
    o = options({}, kTemp.path("unused.json"));
    EXPECT_NE(bpe_train_files(o).message().find("--input: give at least one file"),
              std::string::npos);
    EXPECT_FALSE(std::filesystem::exists(kTemp.path("unused.json")));
}

TEST(BpeTrainFiles, BadJsonlLineNamesFileAndLine) {
    const std::string in =
        kTemp.write("bad.jsonl", "{\"text\": \"fine\"}\n{\"body\": \"no text\"}\n");
    Status s = bpe_train_files(options({in}, kTemp.path("bad.json")));
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.message().find(in + ":2: no field 'text'"), std::string::npos) << s.message();
    EXPECT_FALSE(std::filesystem::exists(kTemp.path("bad.json")));
}

}  // namespace
}  // namespace lathe
