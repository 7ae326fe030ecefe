// The prepare pipeline with a real tokenizer (GPT-2 from the shared test data): order under many
// threads and tiny batches, error lines, skip counts, cancellation, EOD resolution.
#include "data/prepare.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "data/indexed_dataset.h"
#include "tokenizer/tokenizer.h"

namespace lathe {
namespace {

const std::string kGpt2 = std::string(LATHE_SHARED_DIR) + "/tokenizers/gpt2.json";
const std::string kLlama3 = std::string(LATHE_SHARED_DIR) + "/tokenizers/llama3.json";

std::string temp_dir() {
    const auto dir = std::filesystem::temp_directory_path() /
                     ("lathe_prepare_test_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    return dir.string();
}

std::string write_file(const std::string& name, const std::string& bytes) {
    const std::string path = temp_dir() + "/" + name;
    std::ofstream(path, std::ios::binary) << bytes;
    return path;
}

std::string read_file(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {});
}

PrepareOptions options(const std::vector<std::string>& inputs, const std::string& name) {
    PrepareOptions o;
    o.tokenizer_path = kGpt2;
    o.inputs = inputs;
    o.output_prefix = temp_dir() + "/" + name;
    o.show_progress = false;
    return o;
}

// 3000 numbered JSONL documents of varied length.
std::string numbered_jsonl(int n) {
    std::string out;
    for (int i = 0; i < n; ++i) {
        std::string text = "document " + std::to_string(i);
        for (int k = 0; k < i % 17; ++k) text += " word" + std::to_string(k);
        out += "{\"text\": \"" + text + "\"}\n";
    }
    return out;
}

TEST(Prepare, OrderIsKeptWithManyThreadsAndTinyBatches) {
    ASSERT_TRUE(std::filesystem::exists(kGpt2))
        << "no " << kGpt2 << " (required test data: ../shared, scripts/install-deps.sh)";
    const std::string src = write_file("numbered.jsonl", numbered_jsonl(3000));
    PrepareOptions one = options({src}, "one");
    one.threads = 1;
    one.append_eod = true;
    auto a = prepare_run(one);
    ASSERT_TRUE(a.ok()) << a.status().to_string();
    PrepareOptions many = options({src}, "many");
    many.threads = 7;
    many.batch_bytes = 64;  // a handful of records per batch: hundreds of batches to reorder
    many.append_eod = true;
    auto b = prepare_run(many);
    ASSERT_TRUE(b.ok()) << b.status().to_string();
    EXPECT_EQ(a->documents, 3000u);
    EXPECT_EQ(b->documents, 3000u);
    EXPECT_EQ(a->tokens, b->tokens);
    EXPECT_EQ(read_file(one.output_prefix + ".bin"), read_file(many.output_prefix + ".bin"));
    EXPECT_EQ(read_file(one.output_prefix + ".idx"), read_file(many.output_prefix + ".idx"));

    // Spot-check against the tokenizer directly: document i is "document i ..." + EOD.
    auto tok = Tokenizer::load(kGpt2);
    ASSERT_TRUE(tok.ok());
    auto ds = IndexedDataset::open(many.output_prefix);
    ASSERT_TRUE(ds.ok()) << ds.status().to_string();
    for (uint64_t i : {0u, 1u, 1234u, 2999u}) {
        std::vector<int64_t> got;
        ds->read_document(i, got);
        ASSERT_FALSE(got.empty());
        EXPECT_EQ(got.back(), 50256);
        std::vector<int32_t> ids(got.begin(), got.end() - 1);
        auto text = tok->decode(ids, false);
        ASSERT_TRUE(text.ok());
        EXPECT_EQ(text->rfind("document " + std::to_string(i), 0), 0u) << *text;
    }
}

TEST(Prepare, FirstBadRecordInInputOrderIsReportedWithFileAndLine) {
    ASSERT_TRUE(std::filesystem::exists(kGpt2))
        << "no " << kGpt2 << " (required test data: ../shared, scripts/install-deps.sh)";
    std::string body = numbered_jsonl(500);
    body += "{\"text\": 5}\n";  // line 501
    body += numbered_jsonl(500);
    body += "{\"txt\": \"typo\"}\n";  // line 1002
    const std::string src = write_file("bad_late.jsonl", body);
    PrepareOptions o = options({write_file("fine.jsonl", numbered_jsonl(10)), src}, "bad");
    o.threads = 4;
    o.batch_bytes = 100;
    auto r = prepare_run(o);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find(src + ":501: field \"text\" is a number"),
              std::string::npos)
        << r.status().message();
    EXPECT_FALSE(std::filesystem::exists(o.output_prefix + ".bin"));
    EXPECT_FALSE(std::filesystem::exists(o.output_prefix + ".idx"));

    o.on_error = OnError::kSkip;
    auto s = prepare_run(o);
    ASSERT_TRUE(s.ok()) << s.status().to_string();
    EXPECT_EQ(s->skipped, 2u);
    EXPECT_EQ(s->documents, 1010u);
    ASSERT_EQ(s->skipped_examples.size(), 2u);
    EXPECT_NE(s->skipped_examples[1].find(src + ":1002: no \"text\" field"), std::string::npos);
}

TEST(Prepare, CancelledRunLeavesNothing) {
    ASSERT_TRUE(std::filesystem::exists(kGpt2))
        << "no " << kGpt2 << " (required test data: ../shared, scripts/install-deps.sh)";
    const std::string src = write_file("cancel.jsonl", numbered_jsonl(2000));
    std::atomic<bool> cancel{true};
    PrepareOptions o = options({src}, "cancelled");
    o.cancel = &cancel;
    auto r = prepare_run(o);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kCancelled);
    for (const auto& e : std::filesystem::directory_iterator(temp_dir())) {
        EXPECT_EQ(e.path().filename().string().rfind("cancelled", 0), std::string::npos)
            << e.path();
    }
}

TEST(Prepare, EodResolution) {
    ASSERT_TRUE(std::filesystem::exists(kLlama3))
        << "no " << kLlama3 << " (required test data: ../shared, scripts/install-deps.sh)";
    auto gpt2 = Tokenizer::load(kGpt2);
    auto llama3 = Tokenizer::load(kLlama3);
    ASSERT_TRUE(gpt2.ok() && llama3.ok());
    auto g = prepare_resolve_eod(*gpt2, kGpt2, std::nullopt);
    ASSERT_TRUE(g.ok());
    EXPECT_EQ(g->id, 50256);
    auto l = prepare_resolve_eod(*llama3, kLlama3, std::nullopt);
    ASSERT_TRUE(l.ok()) << l.status().to_string();
    EXPECT_EQ(l->token, "<|end_of_text|>");
    EXPECT_NE(l->source.find("llama3.tokenizer_config.json"), std::string::npos);
    auto forced = prepare_resolve_eod(*gpt2, kGpt2, std::string("<|endoftext|>"));
    ASSERT_TRUE(forced.ok());
    EXPECT_EQ(forced->source, "--eod-token");
    auto missing = prepare_resolve_eod(*gpt2, kGpt2, std::string("</s>"));
    ASSERT_FALSE(missing.ok());
    EXPECT_NE(missing.status().message().find("'</s>' is not a token of"), std::string::npos);
    EXPECT_EQ(prepare_find_tokenizer_config(kGpt2), std::nullopt);
}

TEST(Prepare, FormatNames) {
    for (const char* name : {"auto", "jsonl", "text", "text-blocks", "chat"}) {
        auto f = prepare_format_from_name(name);
        ASSERT_TRUE(f.ok());
        EXPECT_STREQ(prepare_format_name(*f), name);
    }
    EXPECT_FALSE(prepare_format_from_name("txt").ok());
}

}  // namespace
}  // namespace lathe
