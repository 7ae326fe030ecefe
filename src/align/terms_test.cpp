#include "align/terms.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "align/stage_cache.h"
#include "core/status.h"
#include "io/file.h"
#include "tokenizer/tokenizer.h"

namespace lathe {
namespace {

namespace fs = std::filesystem;

std::map<std::string, int> emit_all(const std::vector<std::string_view>& pieces, int max_ngram) {
    std::map<std::string, int> out;
    terms_emit_candidates(pieces, max_ngram, [&](std::string_view k) { ++out[std::string(k)]; });
    return out;
}

TEST(TermsCandidates, WordsNeedALeadingSpace) {
    EXPECT_TRUE(terms_is_word(" heart"));
    EXPECT_TRUE(terms_is_word(" (PCD)"));
    EXPECT_FALSE(terms_is_word("heart"));  // start of a document or after punctuation
    EXPECT_FALSE(terms_is_word(" "));
    EXPECT_FALSE(terms_is_word("  x"));  // a second space
    EXPECT_FALSE(terms_is_word(" \n"));
    EXPECT_TRUE(terms_is_ngram_part(" heart"));
    EXPECT_TRUE(terms_is_ngram_part(" caf\xc3\xa9"));
    EXPECT_FALSE(terms_is_ngram_part(" (PCD)"));
    EXPECT_FALSE(terms_is_ngram_part(" e.g"));
}

TEST(TermsCandidates, NgramsJoinPiecesWithTheirOwnSpaces) {
    // "Acute heart failure, and heart failure" as byte-level pieces decoded to raw bytes.
    const std::vector<std::string_view> pieces = {"Acute", " heart", " failure", ",",
                                                  " and",  " heart", " failure"};
    auto got = emit_all(pieces, 3);
    EXPECT_EQ(got[" heart"], 2);
    EXPECT_EQ(got[" heart failure"], 2);
    EXPECT_EQ(got[" and heart failure"], 1);
    EXPECT_EQ(got[" and heart"], 1);
    EXPECT_EQ(got.count("Acute"), 0u);  // no leading space
    EXPECT_EQ(got.count("Acute heart"), 0u);
    EXPECT_EQ(got.count(" failure, and"), 0u);  // punctuation breaks n-grams
    EXPECT_EQ(got.count(" failure and"), 0u);
    EXPECT_EQ(got.size(), 6u);  // heart, failure, and, heart failure, and heart, and heart failure
}

TEST(TermsCandidates, MaxNgramLimitsLength) {
    const std::vector<std::string_view> pieces = {" a1", " b2", " c3", " d4"};
    auto one = emit_all(pieces, 1);
    EXPECT_EQ(one.size(), 4u);
    auto two = emit_all(pieces, 2);
    EXPECT_EQ(two.size(), 7u);
    EXPECT_EQ(two.count(" a1 b2 c3"), 0u);
    auto three = emit_all(pieces, 3);
    EXPECT_EQ(three.size(), 9u);
    EXPECT_EQ(three[" b2 c3 d4"], 1);
    EXPECT_EQ(three.count(" a1 b2 c3 d4"), 0u);
}

class TermsRunTest : public ::testing::Test {
protected:
    void SetUp() override {
        dir_ = (fs::temp_directory_path() /
                ("lathe_terms_test_" + std::to_string(::getpid()) + "_" +
                 ::testing::UnitTest::GetInstance()->current_test_info()->name()))
                   .string();
        fs::remove_all(dir_);
        fs::create_directories(dir_);
        tokenizer_ = std::string(LATHE_SHARED_DIR) + "/tokenizers/gpt-neox-20b.json";
    }
    void TearDown() override { fs::remove_all(dir_); }
    std::string path(const std::string& name) const { return dir_ + "/" + name; }
    TermsOptions options() const {
        TermsOptions o;
        o.source_tokenizer = tokenizer_;
        o.corpus = {path("domain.txt")};
        o.output = path("target.json");
        o.top_k = 5;
        o.min_count = 3;
        o.threads = 2;
        o.show_progress = false;
        return o;
    }
    std::string dir_;
    std::string tokenizer_;
};

TEST_F(TermsRunTest, MinesScoresAndWritesATokenizerThatUsesTheTerms) {
    ASSERT_TRUE(fs::exists(tokenizer_))
        << tokenizer_ << " missing"
        << " (required test data: ../shared, scripts/install-deps.sh)";
    std::string text;
    for (int i = 0; i < 20; ++i) {
        text += "The patient had amoxicillin clavulanate and left ventricular hypokinesis.\n";
        text += "Nephrolithiasis and nephrolithiasis were seen.\n";
    }
    text += "A rare word: pseudohypoparathyroidism pseudohypoparathyroidism.\n";
    ASSERT_TRUE(file_write_atomic(path("domain.txt"), text).ok());
    auto r = align_terms_run(options());
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(r->documents, 41u);
    ASSERT_EQ(r->terms.size(), 5u);
    auto source = Tokenizer::load(tokenizer_);
    ASSERT_TRUE(source.ok());
    std::map<std::string, const Term*> by_text;
    for (size_t i = 0; i < r->terms.size(); ++i) {
        const Term& t = r->terms[i];
        by_text[t.text] = &t;
        EXPECT_EQ(t.id, source->vocab_size() + static_cast<int32_t>(i));
        auto ids = source->encode(t.text, false);
        ASSERT_TRUE(ids.ok());
        EXPECT_EQ(*ids, t.source_ids);
        EXPECT_DOUBLE_EQ(t.score, static_cast<double>(t.count) * (t.source_ids.size() - 1));
        if (i > 0) {
            EXPECT_GE(r->terms[i - 1].score, t.score);
        }
    }
    // Under gpt-neox-20b: " amoxicillin clavulanate" is 8 pieces, 20 times: score 140, third
    // after the two 3-grams around it (9 pieces: 160).
    ASSERT_TRUE(by_text.count(" amoxicillin clavulanate"));
    EXPECT_EQ(by_text[" amoxicillin clavulanate"]->count, 20u);
    EXPECT_EQ(by_text[" amoxicillin clavulanate"]->source_ids.size(), 8u);
    EXPECT_EQ(r->terms[2].text, " amoxicillin clavulanate");
    EXPECT_EQ(by_text.count(" pseudohypoparathyroidism"), 0u);  // count 2 < min count 3

    // The target encodes the phrase as one token and decodes back to the text.
    auto target = Tokenizer::load(path("target.json"));
    ASSERT_TRUE(target.ok()) << target.status().to_string();
    EXPECT_EQ(target->vocab_size(), source->vocab_size() + 5);
    const std::string sentence = "Given amoxicillin clavulanate today.";
    auto ids = target->encode(sentence, false);
    ASSERT_TRUE(ids.ok());
    EXPECT_NE(std::find(ids->begin(), ids->end(), by_text[" amoxicillin clavulanate"]->id),
              ids->end());
    EXPECT_LT(ids->size(), source->encode(sentence, false)->size());
    auto back = target->decode(*ids, false);
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, sentence);
    // Everything but the added tokens is the source file, byte for byte.
    auto src_json = nlohmann::json::parse(*file_read_all(tokenizer_));
    auto tgt_json = nlohmann::json::parse(*file_read_all(path("target.json")));
    EXPECT_EQ(tgt_json["added_tokens"].size(), src_json["added_tokens"].size() + 5);
    tgt_json["added_tokens"] = src_json["added_tokens"];
    EXPECT_EQ(tgt_json, src_json);

    // Reports.
    auto tsv = file_read_all(path("target.terms.tsv"));
    ASSERT_TRUE(tsv.ok());
    EXPECT_EQ(tsv->rfind("term\tcount\tpieces\tscore\tid\n", 0), 0u);
    EXPECT_NE(tsv->find(fmt::format("\n amoxicillin clavulanate\t20\t8\t140\t{}\n",
                                    by_text[" amoxicillin clavulanate"]->id)),
              std::string::npos)
        << *tsv;
    auto nt = file_read_all(path("target.new_tokens.json"));
    ASSERT_TRUE(nt.ok());
    auto j = nlohmann::json::parse(*nt);
    EXPECT_EQ(j["tokens"].size(), 5u);
    EXPECT_EQ(j["source_vocab_size"].get<int>(), source->vocab_size());
    EXPECT_EQ(j["tokens"][0]["id"].get<int>(), source->vocab_size());

    // A second run is skipped; a changed setting reruns.
    auto again = align_terms_run(options());
    ASSERT_TRUE(again.ok());
    EXPECT_TRUE(again->skipped_up_to_date);
    auto o = options();
    o.top_k = 3;
    auto changed = align_terms_run(o);
    ASSERT_TRUE(changed.ok());
    EXPECT_FALSE(changed->skipped_up_to_date);
    EXPECT_EQ(changed->terms.size(), 3u);
}

TEST_F(TermsRunTest, TokenizerConfigIsCopiedWithTheTerms) {
    const std::string shared = std::string(LATHE_SHARED_DIR) + "/tokenizers/";
    ASSERT_TRUE(fs::exists(shared + "qwen3.tokenizer_config.json"))
        << "qwen3 missing"
        << " (required test data: ../shared, scripts/install-deps.sh)";
    fs::copy_file(shared + "qwen3.json", path("qwen3.json"));
    fs::copy_file(shared + "qwen3.tokenizer_config.json", path("qwen3.tokenizer_config.json"));
    std::string text;
    for (int i = 0; i < 10; ++i) text += "the amoxicillin clavulanate dose\n";
    ASSERT_TRUE(file_write_atomic(path("domain.txt"), text).ok());
    auto o = options();
    o.source_tokenizer = path("qwen3.json");
    o.output = path("out/tokenizer.json");
    o.top_k = 2;
    auto r = align_terms_run(o);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    ASSERT_EQ(r->terms.size(), 2u);
    ASSERT_TRUE(fs::exists(path("out/tokenizer_config.json")));
    auto src = nlohmann::json::parse(*file_read_all(path("qwen3.tokenizer_config.json")));
    auto cfg = nlohmann::json::parse(*file_read_all(path("out/tokenizer_config.json")));
    EXPECT_EQ(cfg["chat_template"], src["chat_template"]);
    EXPECT_EQ(cfg["eos_token"], src["eos_token"]);
    EXPECT_EQ(cfg["added_tokens_decoder"].size(), src["added_tokens_decoder"].size() + 2);
    const auto& entry = cfg["added_tokens_decoder"][std::to_string(r->terms[0].id)];
    EXPECT_EQ(entry["content"].get<std::string>(), r->terms[0].text);
    EXPECT_FALSE(entry["special"].get<bool>());
    EXPECT_EQ(align_terms_tokenizer_config_path(path("x/t.json")),
              path("x/t.tokenizer_config.json"));
    // The manifest lists it, so deleting it reruns the stage.
    EXPECT_TRUE(align_terms_run(o)->skipped_up_to_date);
    fs::remove(path("out/tokenizer_config.json"));
    auto again = align_terms_run(o);
    ASSERT_TRUE(again.ok());
    EXPECT_FALSE(again->skipped_up_to_date);
    EXPECT_TRUE(fs::exists(path("out/tokenizer_config.json")));
}

TEST_F(TermsRunTest, GeneralCorpusDropsGeneralWords) {
    ASSERT_TRUE(fs::exists(tokenizer_))
        << tokenizer_ << " missing"
        << " (required test data: ../shared, scripts/install-deps.sh)";
    std::string domain, general;
    for (int i = 0; i < 10; ++i) {
        domain += "the hypokinesis and dyskinesia here\n";
        general += "a dyskinesia dyskinesia\n";  // far more frequent per piece than in the domain
    }
    ASSERT_TRUE(file_write_atomic(path("domain.txt"), domain).ok());
    ASSERT_TRUE(file_write_atomic(path("general.txt"), general).ok());
    auto o = options();
    o.top_k = 100;
    o.max_ngram = 1;
    auto plain = align_terms_run(o);
    ASSERT_TRUE(plain.ok()) << plain.status().to_string();
    o.general_corpus = {path("general.txt")};
    auto weighted = align_terms_run(o);
    ASSERT_TRUE(weighted.ok()) << weighted.status().to_string();
    auto has = [](const TermsReport& r, const std::string& s) {
        return std::any_of(r.terms.begin(), r.terms.end(),
                           [&](const Term& t) { return t.text == s; });
    };
    EXPECT_TRUE(has(*plain, " hypokinesis"));
    EXPECT_TRUE(has(*weighted, " hypokinesis"));
    // " remarkable" is as frequent in the general corpus (per piece, about): ratio <= 1, dropped.
    EXPECT_TRUE(has(*plain, " dyskinesia"));
    EXPECT_FALSE(has(*weighted, " dyskinesia"));
    // p_domain = 10/50, p_general = (0 + 0.5)/30: score = 10 x 3 x log(12).
    for (const Term& t : weighted->terms) {
        if (t.text == " hypokinesis") {
            EXPECT_NEAR(t.score, 10 * 3 * std::log(12.0), 1e-9);
        }
    }
}

TEST_F(TermsRunTest, PruningBoundsTheTableAndKeepsFrequentTerms) {
    ASSERT_TRUE(fs::exists(tokenizer_))
        << tokenizer_ << " missing"
        << " (required test data: ../shared, scripts/install-deps.sh)";
    std::string text;
    for (int i = 0; i < 300; ++i) {
        // One frequent word, many words seen once (distinct numbers).
        std::string rare = " qx";
        for (int x = i; x > 0 || rare.size() == 3; x /= 26) rare += static_cast<char>('a' + x % 26);
        text += "the angioplasty" + rare + "\n";
    }
    ASSERT_TRUE(file_write_atomic(path("domain.txt"), text).ok());
    auto o = options();
    o.max_table_entries = 64;
    o.min_count = 2;
    o.max_ngram = 1;
    o.threads = 1;
    auto r = align_terms_run(o);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_GT(r->pruned, 0);
    ASSERT_FALSE(r->terms.empty());
    EXPECT_EQ(r->terms[0].text, " angioplasty");
    // Pruning only ever lowers a count: at most 300, and this one was never pruned away.
    EXPECT_EQ(r->terms[0].count, 300u);
    for (const Term& t : r->terms) EXPECT_EQ(t.text.find(" q"), std::string::npos) << t.text;
}

TEST_F(TermsRunTest, BadInputIsAClearError) {
    ASSERT_TRUE(fs::exists(tokenizer_))
        << tokenizer_ << " missing"
        << " (required test data: ../shared, scripts/install-deps.sh)";
    ASSERT_TRUE(file_write_atomic(path("domain.txt"), "ok line\nbad \xff byte\n").ok());
    auto r = align_terms_run(options());
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("domain.txt:2"), std::string::npos) << r.status().message();
    EXPECT_FALSE(fs::exists(path("target.json")));
    auto o = options();
    o.skip_bad_documents = true;
    auto skipped = align_terms_run(o);
    ASSERT_TRUE(skipped.ok()) << skipped.status().to_string();
    EXPECT_EQ(skipped->skipped, 1u);

    ASSERT_TRUE(file_write_atomic(path("domain.txt"), "").ok());
    auto empty = align_terms_run(options());
    ASSERT_FALSE(empty.ok());
    EXPECT_NE(empty.status().message().find("no documents"), std::string::npos);

    auto llama2 = options();
    llama2.source_tokenizer = std::string(LATHE_SHARED_DIR) + "/tokenizers/llama2.json";
    ASSERT_TRUE(file_write_atomic(path("domain.txt"), "some text\n").ok());
    if (fs::exists(llama2.source_tokenizer)) {
        auto no_byte_level = align_terms_run(llama2);
        ASSERT_FALSE(no_byte_level.ok());
        EXPECT_NE(no_byte_level.status().message().find("byte-level"), std::string::npos);
    }
    auto bad_k = options();
    bad_k.top_k = 0;
    EXPECT_FALSE(align_terms_run(bad_k).ok());
}

// A source tokenizer whose pre-tokenizer or normalizer pattern backtracks exponentially gives up
// on line 2 (in a worker thread): a bad document like any other, an error naming the file and
// line, or skipped and counted under skip_bad_documents.
TEST_F(TermsRunTest, PatternThatGivesUpIsABadDocument) {
    ASSERT_TRUE(fs::exists(tokenizer_))
        << tokenizer_ << " missing"
        << " (required test data: ../shared, scripts/install-deps.sh)";
    std::string text = "The patient had amoxicillin clavulanate.\n" + std::string(100, 'a') + "b\n";
    for (int i = 0; i < 10; ++i) text += "The patient had amoxicillin clavulanate.\n";
    ASSERT_TRUE(file_write_atomic(path("domain.txt"), text).ok());
    const nlohmann::json split = nlohmann::json::parse(
        R"({"type": "Split", "pattern": {"Regex": "(a|aa)+$"}, "behavior": "Isolated",
            "invert": false})");
    const nlohmann::json replace = nlohmann::json::parse(
        R"({"type": "Replace", "pattern": {"Regex": "(a|aa)+$"}, "content": "x"})");
    const nlohmann::json gpt_neox = nlohmann::json::parse(*file_read_all(tokenizer_));
    nlohmann::json in_pre_tokenizer = gpt_neox;
    in_pre_tokenizer["pre_tokenizer"] = {{"type", "Sequence"},
                                         {"pretokenizers", {split, gpt_neox["pre_tokenizer"]}}};
    nlohmann::json in_normalizer = gpt_neox;
    in_normalizer["normalizer"] = {{"type", "Sequence"},
                                   {"normalizers", {gpt_neox["normalizer"], replace}}};
    for (const auto& [name, tok] :
         {std::pair{"pre_tokenizer", in_pre_tokenizer}, std::pair{"normalizer", in_normalizer}}) {
        SCOPED_TRACE(name);
        const std::string tok_path = path(std::string(name) + ".json");
        ASSERT_TRUE(file_write_atomic(tok_path, tok.dump()).ok());
        TermsOptions o = options();
        o.source_tokenizer = tok_path;
        o.output = path(std::string(name) + ".target.json");
        auto r = align_terms_run(o);
        ASSERT_FALSE(r.ok());
        EXPECT_NE(r.status().message().find("domain.txt:2: the tokenizer's pattern '(a|aa)+$'"),
                  std::string::npos)
            << r.status().message();
        EXPECT_NE(r.status().message().find("--on-error skip"), std::string::npos)
            << r.status().message();
        EXPECT_FALSE(fs::exists(o.output));
        o.skip_bad_documents = true;
        auto skipped = align_terms_run(o);
        ASSERT_TRUE(skipped.ok()) << skipped.status().to_string();
        EXPECT_EQ(skipped->skipped, 1u);
        EXPECT_EQ(skipped->documents, 11u);
    }
}

TEST_F(TermsRunTest, JsonlInputWithKey) {
    ASSERT_TRUE(fs::exists(tokenizer_))
        << tokenizer_ << " missing"
        << " (required test data: ../shared, scripts/install-deps.sh)";
    std::string text;
    for (int i = 0; i < 5; ++i) text += "{\"id\": 1, \"body\": \"new cardiomyopathy cases\"}\n";
    ASSERT_TRUE(file_write_atomic(path("domain.jsonl"), text).ok());
    auto o = options();
    o.corpus = {path("domain.jsonl")};
    o.json_key = "body";
    auto r = align_terms_run(o);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(r->documents, 5u);
    ASSERT_FALSE(r->terms.empty());
    EXPECT_EQ(r->terms[0].text, " cardiomyopathy cases");
    o.json_key = "text";
    o.force = true;
    auto missing = align_terms_run(o);
    ASSERT_FALSE(missing.ok());
    EXPECT_NE(missing.status().message().find("domain.jsonl:1"), std::string::npos)
        << missing.status().message();
}

}  // namespace
}  // namespace lathe
