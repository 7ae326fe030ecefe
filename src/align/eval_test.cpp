#include "align/eval.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <numbers>
#include <vector>

#include "io/file.h"
#include "model/model.h"
#include "model/model_io.h"
#include "model/registry.h"
#include "tokenizer/tokenizer.h"

namespace lathe {
namespace {

namespace fs = std::filesystem;

std::string temp_dir(const std::string& name) {
    const auto dir =
        fs::temp_directory_path() / ("lathe_eval_test_" + std::to_string(::getpid())) / name;
    fs::create_directories(dir);
    return dir.string();
}

TEST(AlignBleu1, MatchesNltkSentenceBleu1) {
    // Values from nltk.translate.bleu_score.sentence_bleu([ref], hyp, (1, 0, 0, 0)).
    const std::vector<int32_t> ref = {1, 2, 3, 4};
    EXPECT_NEAR(align_bleu1(std::vector<int32_t>{1, 2, 3, 4}, ref), 1.0, 1e-12);
    // Shorter hypothesis: precision 1, brevity penalty exp(1 - 4/3).
    EXPECT_NEAR(align_bleu1(std::vector<int32_t>{1, 2, 3}, ref), std::exp(1.0 - 4.0 / 3.0), 1e-12);
    // Clipping: "1 1 1 1 1" against one "1": 1/5, longer than the reference (no penalty).
    EXPECT_NEAR(align_bleu1(std::vector<int32_t>{1, 1, 1, 1, 1}, ref), 0.2, 1e-12);
    // No overlap, or no hypothesis: 0.
    EXPECT_EQ(align_bleu1(std::vector<int32_t>{9, 9}, ref), 0.0);
    EXPECT_EQ(align_bleu1(std::vector<int32_t>{}, ref), 0.0);
}

TEST(AlignEval, DocumentsAndTokensPerByte) {
    const std::string dir = temp_dir("docs");
    const std::string path = dir + "/held.txt";
    ASSERT_TRUE(file_write_atomic(path, "hello world\n\nsecond doc here\nthird\n").ok());
    auto lines = align_read_documents(path, TextRecordFormat::kLines, 0);
    ASSERT_TRUE(lines.ok());
    EXPECT_EQ(lines->size(), 3u);  // the blank line is no document
    auto blocks = align_read_documents(path, TextRecordFormat::kBlocks, 0);
    ASSERT_TRUE(blocks.ok());
    EXPECT_EQ(blocks->size(), 2u);
    auto first = align_read_documents(path, TextRecordFormat::kLines, 1);
    ASSERT_TRUE(first.ok());
    EXPECT_EQ(first->size(), 1u);

    AlignEvalRequest req;
    req.documents = path;
    req.tokenizers = {std::string(LATHE_SHARED_DIR) + "/tokenizers/gpt2.json"};
    auto r = align_eval_run(cpu_context(), req);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    auto tok = Tokenizer::load(req.tokenizers[0]);
    ASSERT_TRUE(tok.ok());
    int64_t tokens = 0;
    for (const char* d : {"hello world", "second doc here", "third"})
        tokens += int64_t(tok->encode(d, false)->size());
    EXPECT_EQ(r->bytes, int64_t(std::string("hello worldsecond doc herethird").size()));
    EXPECT_EQ(r->tokenizers[0].tokens, tokens);
    EXPECT_NEAR(r->tokenizers[0].tokens_per_byte, double(tokens) / double(r->bytes), 1e-12);

    AlignEvalRequest none;
    none.documents = path;
    EXPECT_FALSE(align_eval_run(cpu_context(), none).ok());
}

// A model whose tied embedding is zero predicts the uniform distribution: every token costs ln V
// nats, so bits per byte is known exactly, and the window arithmetic is checked by the count.
TEST(AlignEval, BitsPerByteOfAUniformModel) {
    const std::string dir = temp_dir("uniform");
    const std::string json = R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": 50304, "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
        "num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": 64,
        "rms_norm_eps": 1e-5, "tie_word_embeddings": true, "bos_token_id": 50256, "eos_token_id": 50256})";
    auto config = model_config_from_hf_json(json, "test/config.json");
    ASSERT_TRUE(config.ok()) << config.status().to_string();
    {
        auto m = Model::create(*config, ModelShape{1, 4, 0}, cpu_context());
        ASSERT_TRUE(m.ok()) << m.status().to_string();
        m->init(1);
        std::vector<float> zeros(size_t(50304 * 16), 0.0f);
        model_write_param_hf(*m, "model.embed_tokens.weight",
                             ConstTensorView(zeros.data(), DType::kF32, Shape{50304, 16}));
        ASSERT_TRUE(model_save_hf(*m, dir).ok());
    }
    auto tok_text = file_read_all(std::string(LATHE_SHARED_DIR) + "/tokenizers/gpt2.json");
    ASSERT_TRUE(tok_text.ok());
    ASSERT_TRUE(file_write_atomic(dir + "/tokenizer.json", *tok_text).ok());
    auto tok = Tokenizer::load(dir + "/tokenizer.json");
    ASSERT_TRUE(tok.ok());

    const std::vector<std::string> docs = {
        "The quick brown fox jumps over the lazy dog, again and again and again.", "Short.",
        "Ünïcödé text costs more bytes than characters."};
    const int64_t T = 8;
    int64_t predicted = 0, windows = 0, bytes = 0;
    for (const std::string& d : docs) {
        const int64_t n = int64_t(tok->encode(d, true)->size());  // + the boundary token - 1
        predicted += n;
        windows += (n + T - 1) / T;
        bytes += int64_t(d.size());
    }
    auto r = align_bits_per_byte(cpu_context(), dir, docs, T, 3);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(r->predicted_tokens, predicted);
    EXPECT_EQ(r->windows, windows);
    const double want = double(predicted) * std::log(50304.0) / std::numbers::ln2 / double(bytes);
    EXPECT_NEAR(r->bits_per_byte, want, 1e-4 * want);

    // The window length changes nothing for a model without context use; too long a window is
    // refused.
    auto r1 = align_bits_per_byte(cpu_context(), dir, docs, 1, 2);
    ASSERT_TRUE(r1.ok());
    EXPECT_NEAR(r1->bits_per_byte, want, 1e-4 * want);
    EXPECT_FALSE(align_bits_per_byte(cpu_context(), dir, docs, 65, 2).ok());
}

}  // namespace
}  // namespace lathe
