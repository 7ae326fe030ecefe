#include "run/special_tokens.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "model/registry.h"
#include "tokenizer/tokenizer.h"

namespace lathe {
namespace {

namespace fs = std::filesystem;

const std::string kTokenizers = std::string(LATHE_SHARED_DIR) + "/tokenizers";

struct Loaded {
    Tokenizer tokenizer;
    TokenizerSpecialTokens specials;
};

Loaded load(const std::string& path) {
    auto tok = Tokenizer::load(path);
    EXPECT_TRUE(tok.ok()) << tok.status().message();
    auto sp = tokenizer_special_tokens(*tok, path);
    EXPECT_TRUE(sp.ok()) << sp.status().message();
    return Loaded{std::move(tok).value(), std::move(sp).value()};
}

std::string content(const std::optional<SpecialToken>& t) {
    return t ? t->content : "(none)";
}

// A folder holding only a copy of one shared tokenizer.json (no tokenizer_config.json).
class Alone : public ::testing::Test {
protected:
    void SetUp() override {
        dir_ = fs::temp_directory_path() / ("special_tokens_test_" + std::to_string(::getpid()));
        fs::create_directories(dir_);
    }
    void TearDown() override { fs::remove_all(dir_); }
    std::string copy(const std::string& name) {
        const fs::path to = dir_ / "tokenizer.json";
        fs::copy_file(kTokenizers + "/" + name, to, fs::copy_options::overwrite_existing);
        return to.string();
    }
    fs::path dir_;
};

TEST(SpecialTokens, FromTokenizerConfig) {
    // Each shared tokenizer_config.json beside NAME.json (NAME.tokenizer_config.json).
    Loaded l2 = load(kTokenizers + "/llama2.json");
    EXPECT_EQ(content(l2.specials.bos), "<s>");
    EXPECT_EQ(l2.specials.bos->id, 1);
    EXPECT_EQ(content(l2.specials.eos), "</s>");
    EXPECT_EQ(l2.specials.eos->id, 2);
    EXPECT_EQ(content(l2.specials.unk), "<unk>");
    EXPECT_FALSE(l2.specials.pad);
    EXPECT_NE(l2.specials.config_path.find("llama2.tokenizer_config.json"), std::string::npos);

    Loaded l3 = load(kTokenizers + "/llama3.json");
    EXPECT_EQ(l3.specials.bos->id, 128000);
    EXPECT_EQ(l3.specials.eos->id, 128001);

    Loaded q3 = load(kTokenizers + "/qwen3.json");
    EXPECT_FALSE(q3.specials.bos);  // null in the config
    EXPECT_EQ(content(q3.specials.eos), "<|im_end|>");
    EXPECT_EQ(q3.specials.eos->id, 151645);
    EXPECT_EQ(content(q3.specials.pad), "<|endoftext|>");
    EXPECT_EQ(q3.specials.pad->id, 151643);
}

TEST_F(Alone, FromTokenizerJson) {
    // GPT-NeoX-20B and GPT-2: <|endoftext|> is bos and eos.
    Loaded neox = load(copy("gpt-neox-20b.json"));
    EXPECT_TRUE(neox.specials.config_path.empty());
    EXPECT_EQ(neox.specials.eos->id, 0);
    EXPECT_EQ(neox.specials.bos->id, 0);
    EXPECT_FALSE(neox.specials.pad);
    Loaded gpt2 = load(copy("gpt2.json"));
    EXPECT_EQ(gpt2.specials.eos->id, 50256);
    EXPECT_EQ(gpt2.specials.bos->id, 50256);
    // Llama 2 alone: the post-processor's <s> is bos; nothing says which token ends a text.
    Loaded l2 = load(copy("llama2.json"));
    EXPECT_EQ(content(l2.specials.bos), "<s>");
    EXPECT_FALSE(l2.specials.eos);
    EXPECT_EQ(content(l2.specials.unk), "<unk>");
}

TEST_F(Alone, ConfigTokenMissingFromTheVocabularyIsLeftOut) {
    const std::string path = copy("gpt2.json");
    std::ofstream(dir_ / "tokenizer_config.json")
        << R"({"eos_token": "<nope>", "bos_token": {"content": "<|endoftext|>"}})";
    Loaded g = load(path);
    EXPECT_FALSE(g.specials.eos);
    EXPECT_EQ(g.specials.bos->id, 50256);
    std::ofstream(dir_ / "tokenizer_config.json") << R"({"eos_token": 5})";
    auto tok = Tokenizer::load(path);
    ASSERT_TRUE(tok.ok());
    auto bad = tokenizer_special_tokens(*tok, path);
    ASSERT_FALSE(bad.ok());
    EXPECT_NE(bad.status().message().find("'eos_token'"), std::string::npos);
    EXPECT_NE(bad.status().message().find("tokenizer_config.json"), std::string::npos);
}

TEST_F(Alone, ApplyFromTokenizerReplacesClassDefaults) {
    Loaded neox = load(copy("gpt-neox-20b.json"));
    HfModelConfig hf = hf_config_default(gpt_neox_family());  // bos 0, eos 2 ("!")
    const auto changes =
        special_ids_apply(hf, neox.tokenizer, neox.specials, SpecialIdsMode::kFromTokenizer);
    EXPECT_EQ(hf.bos_token_id, 0);
    EXPECT_EQ(hf.eos_token_ids, std::vector<int64_t>{0});
    EXPECT_FALSE(hf.pad_token_id);
    ASSERT_EQ(changes.size(), 1u);
    EXPECT_EQ(changes[0], "eos_token_id 2 ('!') -> 0 ('<|endoftext|>')");
}

TEST(SpecialTokens, ApplyKeepValidKeepsSpecialIdsAndRepairsOthers) {
    Loaded l3 = load(kTokenizers + "/llama3.json");
    // An instruct model's config: several eos ids, all special tokens: kept as they are.
    HfModelConfig hf = hf_config_default(llama_family());
    hf.bos_token_id = 128000;
    hf.eos_token_ids = {128001, 128008, 128009};
    HfModelConfig kept = hf;
    EXPECT_TRUE(
        special_ids_apply(kept, l3.tokenizer, l3.specials, SpecialIdsMode::kKeepValid).empty());
    EXPECT_EQ(kept, hf);
    // LlamaConfig's defaults 1 and 2 are '"' and '#' here: replaced by the tokenizer's.
    HfModelConfig defaults = hf_config_default(llama_family());
    const auto changes =
        special_ids_apply(defaults, l3.tokenizer, l3.specials, SpecialIdsMode::kKeepValid);
    EXPECT_EQ(changes.size(), 2u);
    EXPECT_EQ(defaults.bos_token_id, 128000);
    EXPECT_EQ(defaults.eos_token_ids, std::vector<int64_t>{128001});
    // A missing id stays missing in kKeepValid, and is filled in kFromTokenizer.
    Loaded q3 = load(kTokenizers + "/qwen3.json");
    HfModelConfig qwen = hf_config_default(qwen2_family());
    EXPECT_FALSE(qwen.pad_token_id);
    HfModelConfig keep = qwen;
    EXPECT_TRUE(
        special_ids_apply(keep, q3.tokenizer, q3.specials, SpecialIdsMode::kKeepValid).empty());
    EXPECT_FALSE(keep.pad_token_id);
    special_ids_apply(qwen, q3.tokenizer, q3.specials, SpecialIdsMode::kFromTokenizer);
    EXPECT_EQ(qwen.pad_token_id, 151643);
    EXPECT_EQ(qwen.eos_token_ids, std::vector<int64_t>{151645});
    EXPECT_FALSE(qwen.bos_token_id);
    // An id outside the vocabulary names no token: removed when the tokenizer has none.
    HfModelConfig far = hf_config_default(qwen2_family());
    far.bos_token_id = 999999;
    special_ids_apply(far, q3.tokenizer, q3.specials, SpecialIdsMode::kKeepValid);
    EXPECT_FALSE(far.bos_token_id);
}

TEST_F(Alone, ApplyFromTokenizerElseCarriedKeepsWhatTheTokenizerDoesNotDefine) {
    // Llama 2's tokenizer.json alone defines bos (<s>) but no eos: a carried eos stays, even one
    // that is not a special token; a carried bos gives way to the tokenizer's.
    Loaded l2 = load(copy("llama2.json"));
    HfModelConfig hf = hf_config_default(llama_family());
    hf.bos_token_id = 5;
    hf.eos_token_ids = {7};
    special_ids_apply(hf, l2.tokenizer, l2.specials, SpecialIdsMode::kFromTokenizerElseCarried);
    EXPECT_EQ(hf.bos_token_id, 1);
    EXPECT_EQ(hf.eos_token_ids, std::vector<int64_t>{7});
    // kFromTokenizer drops it: it names no special token.
    HfModelConfig fresh = hf_config_default(llama_family());
    fresh.eos_token_ids = {7};
    special_ids_apply(fresh, l2.tokenizer, l2.specials, SpecialIdsMode::kFromTokenizer);
    EXPECT_TRUE(fresh.eos_token_ids.empty());
}

TEST(SpecialTokens, TokenizerConfigText) {
    TokenizerSpecialTokens sp;
    sp.eos = SpecialToken{"<|endoftext|>", 0};
    sp.bos = sp.eos;
    const nlohmann::json j = nlohmann::json::parse(special_tokens_tokenizer_config(sp, 512));
    EXPECT_EQ(j["tokenizer_class"], "PreTrainedTokenizerFast");
    EXPECT_EQ(j["eos_token"], "<|endoftext|>");
    EXPECT_EQ(j["bos_token"], "<|endoftext|>");
    EXPECT_TRUE(j["pad_token"].is_null());
    EXPECT_TRUE(j["unk_token"].is_null());
    EXPECT_EQ(j["model_max_length"], 512);
}

}  // namespace
}  // namespace lathe
