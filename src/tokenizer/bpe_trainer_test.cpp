#include "tokenizer/bpe_trainer.h"

#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tokenizer/pre_tokenizer.h"

namespace lathe {
namespace {

using Merge = std::pair<std::string, std::string>;

WordCounts counts_of(const std::vector<std::pair<std::string, uint64_t>>& words) {
    WordCounts wc;
    for (const auto& [w, c] : words) wc.add(w, c);
    return wc;
}

BpeTrainerOptions options(int64_t vocab_size, uint64_t min_frequency = 0,
                          std::vector<std::string> special_tokens = {}, int threads = 1) {
    BpeTrainerOptions o;
    o.vocab_size = vocab_size;
    o.min_frequency = min_frequency;
    o.special_tokens = std::move(special_tokens);
    o.threads = threads;
    return o;
}

BpeTrainerResult train_ok(const WordCounts& wc, BpeTrainerOptions options) {
    auto r = bpe_train(wc, options);
    EXPECT_TRUE(r.ok()) << r.status().to_string();
    return r.ok() ? std::move(r).value() : BpeTrainerResult{};
}

std::vector<Merge> merge_strings(const BpeTrainerResult& r) {
    std::vector<Merge> out;
    for (const auto& [a, b] : r.merges) out.emplace_back(r.vocab[a], r.vocab[b]);
    return out;
}

// The id HF gives byte symbol `c` when there are no special tokens: printable bytes first, in
// order ('!' = 0 ... 'a' = 64), the 68 others after them (' ' = 188 + 32 = 220).
TEST(BpeTrainer, ByteSymbolsAreGpt2s) {
    EXPECT_EQ(bpe_byte_symbol('a'), "a");
    EXPECT_EQ(bpe_byte_symbol(' '), "\u0120");   // Ġ
    EXPECT_EQ(bpe_byte_symbol('\n'), "\u010a");  // Ċ
    EXPECT_EQ(bpe_byte_symbol(0xad), "\u0143");  // Ń: soft hyphen, the last unprintable byte
    EXPECT_EQ(bpe_byte_symbol(0xe9), "\u00e9");  // é stands for itself

    const auto r = train_ok(WordCounts(), options(256));
    ASSERT_EQ(r.vocab.size(), 256u);
    EXPECT_EQ(r.vocab[0], "!");
    EXPECT_EQ(r.vocab[64], "a");
    EXPECT_EQ(r.vocab[188], bpe_byte_symbol(0));
    EXPECT_EQ(r.vocab[220], "\u0120");
    EXPECT_EQ(r.stop_reason, BpeStopReason::kVocabSizeReached);
}

// HF's own trainer test (tokenizers/src/models/bpe/trainer.rs, test_train), byte-level: with
// min_frequency 2 the merges are r+e (3), a+re (2, wins the tie with i+s because 'a' < 'i'),
// i+s (2), then every pair left occurs once.
TEST(BpeTrainer, HfReferenceCorpus) {
    const auto wc = counts_of({{"roses", 1},
                               {"are", 2},
                               {"red", 1},
                               {"voilets", 1},
                               {"blue", 1},
                               {"BERT", 1},
                               {"is", 2},
                               {"big", 1},
                               {"and", 1},
                               {"so", 1},
                               {"GPT-2", 1}});
    const auto r = train_ok(wc, options(30000, 2, {}, 1));
    EXPECT_EQ(merge_strings(r), (std::vector<Merge>{{"r", "e"}, {"a", "re"}, {"i", "s"}}));
    ASSERT_EQ(r.vocab.size(), 259u);
    EXPECT_EQ(r.vocab[256], "re");
    EXPECT_EQ(r.vocab[257], "are");
    EXPECT_EQ(r.vocab[258], "is");
    EXPECT_EQ(r.stop_reason, BpeStopReason::kMinFrequency);
}

// The classic hug/pug/pun/bun/hugs corpus, merges worked out by hand:
//   u+g 20, u+n 16, h+ug 15, p+un 12, then p+ug 5 and hug+s 5 tie: (p=79, ug=256) < (hug=258,
//   s=82) so p+ug first; hug+s 5, b+un 4; then every word is one token.
TEST(BpeTrainer, HandCheckedMerges) {
    const auto wc = counts_of({{"hug", 10}, {"pug", 5}, {"pun", 12}, {"bun", 4}, {"hugs", 5}});
    const auto r = train_ok(wc, options(1000));
    EXPECT_EQ(merge_strings(r), (std::vector<Merge>{{"u", "g"},
                                                    {"u", "n"},
                                                    {"h", "ug"},
                                                    {"p", "un"},
                                                    {"p", "ug"},
                                                    {"hug", "s"},
                                                    {"b", "un"}}));
    EXPECT_EQ(r.vocab.size(), 263u);
    EXPECT_EQ(r.stop_reason, BpeStopReason::kNoPairsLeft);
    EXPECT_EQ(r.merge_steps, 7);
}

// Ties go to the smallest (left id, right id), ids in HF's alphabet order, not byte order:
// ' ' is byte 0x20 but id 220 ("Ġ"), so "zz" (89, 89) beats " a" (220, 64).
TEST(BpeTrainer, TiesBreakOnPairIds) {
    const auto wc = counts_of({{" a", 1}, {"zz", 1}, {"ac", 1}, {"ab", 1}});
    const auto r = train_ok(wc, options(256 + 4));
    EXPECT_EQ(merge_strings(r),
              (std::vector<Merge>{{"a", "b"}, {"a", "c"}, {"z", "z"}, {"\u0120", "a"}}));
    EXPECT_EQ(r.stop_reason, BpeStopReason::kVocabSizeReached);
}

TEST(BpeTrainer, MinFrequencyStops) {
    const auto wc = counts_of({{"ab", 3}, {"cd", 2}});
    auto r = train_ok(wc, options(1000, 3, {}, 1));
    EXPECT_EQ(merge_strings(r), (std::vector<Merge>{{"a", "b"}}));
    EXPECT_EQ(r.stop_reason, BpeStopReason::kMinFrequency);
    r = train_ok(wc, options(1000, 2, {}, 1));
    EXPECT_EQ(merge_strings(r), (std::vector<Merge>{{"a", "b"}, {"c", "d"}}));
    EXPECT_EQ(r.stop_reason, BpeStopReason::kNoPairsLeft);
}

TEST(BpeTrainer, SpecialTokensComeFirst) {
    const auto wc = counts_of({{"ab", 2}});
    const auto r = train_ok(wc, options(1000, 0, {"<s>", "<pad>", "<s>"}, 1));
    EXPECT_EQ(r.special_ids, (std::vector<int32_t>{0, 1, 0}));
    ASSERT_EQ(r.vocab.size(), 2u + 256u + 1u);
    EXPECT_EQ(r.vocab[0], "<s>");
    EXPECT_EQ(r.vocab[1], "<pad>");
    EXPECT_EQ(r.vocab[2], "!");
    EXPECT_EQ(r.vocab[2 + 64], "a");
    EXPECT_EQ(r.vocab[258], "ab");
    EXPECT_EQ(r.merges, (std::vector<std::pair<int32_t, int32_t>>{{2 + 64, 2 + 65}}));
}

// A merge whose string already is a token reuses that id, as HF does: no vocabulary entry is
// added, the merge is kept.
TEST(BpeTrainer, MergeOntoAnExistingTokenAddsNoEntry) {
    const auto wc = counts_of({{"ab", 3}});
    const auto r = train_ok(wc, options(1000, 0, {"ab"}, 1));
    EXPECT_EQ(r.vocab.size(), 257u);
    EXPECT_EQ(r.merges, (std::vector<std::pair<int32_t, int32_t>>{{1 + 64, 1 + 65}}));
    EXPECT_EQ(r.stop_reason, BpeStopReason::kNoPairsLeft);
}

// Overlapping occurrences: in "aaa", a+a merges once (left first); its count drops to 1 but no
// queue entry remains for it, so aa+a is next (HF's Word::merge semantics).
TEST(BpeTrainer, OverlappingPairs) {
    const auto r = train_ok(counts_of({{"aaa", 1}}), options(1000));
    EXPECT_EQ(merge_strings(r), (std::vector<Merge>{{"a", "a"}, {"aa", "a"}}));
    const auto r4 = train_ok(counts_of({{"aaaa", 1}}), options(1000));
    EXPECT_EQ(merge_strings(r4), (std::vector<Merge>{{"a", "a"}, {"aa", "aa"}}));
}

TEST(BpeTrainer, VocabSizeReachedExactly) {
    const auto wc = counts_of({{"the quick brown fox jumps over the lazy dog", 3},
                               {"pack my box with five dozen liquor jugs", 2}});
    for (int64_t extra : {1, 5, 20}) {
        const auto r = train_ok(wc, options(256 + extra));
        EXPECT_EQ(int64_t(r.vocab.size()), 256 + extra);
        EXPECT_EQ(int64_t(r.merges.size()), extra);
        EXPECT_EQ(r.stop_reason, BpeStopReason::kVocabSizeReached);
    }
}

TEST(BpeTrainer, CorpusTooSmallIsReported) {
    const auto wc = counts_of({{"abc", 1}, {"abd", 1}});
    const auto r = train_ok(wc, options(5000));
    EXPECT_LT(r.vocab.size(), 5000u);
    EXPECT_EQ(r.stop_reason, BpeStopReason::kNoPairsLeft);
    EXPECT_EQ(merge_strings(r), (std::vector<Merge>{{"a", "b"}, {"ab", "c"}, {"ab", "d"}}));
}

TEST(BpeTrainer, BadOptionsAreErrors) {
    WordCounts wc;
    auto r = bpe_train(wc, options(257, 0, {"<a>", "<b>"}, 1));
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("at least 258"), std::string::npos) << r.status().message();
    r = bpe_train(wc, options(300, 0, {""}, 1));
    ASSERT_FALSE(r.ok());
    r = bpe_train(wc, options(300, 0, {"\xff"}, 1));
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("UTF-8"), std::string::npos);
    r = bpe_train(wc, options(300, 0, {}, 0));
    ASSERT_FALSE(r.ok());
}

// A pseudo-random corpus big enough that merges run on several threads; counts split across
// WordCounts parts and merged must train to the same result as one map on one thread.
TEST(BpeTrainer, SameResultWhateverTheThreadsAndCountingSplit) {
    uint64_t state = 12345;
    auto next = [&state] {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        return uint32_t(state >> 33);
    };
    std::vector<std::string> words;
    for (int i = 0; i < 60000; ++i) {
        std::string w = (next() % 3 == 0) ? " " : "";
        const int len = 1 + int(next() % 8);
        for (int k = 0; k < len; ++k) w += char('a' + (next() % 6) * (next() % 3));
        words.push_back(w);
    }
    WordCounts one;
    std::vector<WordCounts> parts(3);
    for (size_t i = 0; i < words.size(); ++i) {
        one.add(words[i]);
        parts[i % 3].add(words[i]);
    }
    WordCounts merged;
    merged.merge_from(parts, 2);
    EXPECT_EQ(merged.size(), one.size());
    EXPECT_EQ(merged.total(), one.total());
    EXPECT_EQ(merged.total(), words.size());
    EXPECT_EQ(merged.count(words[7]), one.count(words[7]));
    EXPECT_EQ(parts[0].size(), 0u);

    const auto r1 = train_ok(one, options(700));
    const auto r4 = train_ok(merged, options(700, 0, {}, 4));
    EXPECT_EQ(r1.vocab, r4.vocab);
    EXPECT_EQ(r1.merges, r4.merges);
    EXPECT_EQ(r1.vocab.size(), 700u);
}

TEST(BpeTrainer, TokenizerJson) {
    const auto wc = counts_of({{"hug", 10}, {"\"q\\", 3}});
    const auto r = train_ok(wc, options(1000, 0, {"<|end|>", "<\"x\">"}, 1));
    const auto j = nlohmann::json::parse(bpe_trainer_tokenizer_json(r, BpePreTokenizerKind::kGpt2));
    ASSERT_EQ(j["added_tokens"].size(), 2u);
    EXPECT_EQ(j["added_tokens"][1]["content"], "<\"x\">");
    EXPECT_EQ(j["added_tokens"][1]["id"], 1);
    EXPECT_EQ(j["added_tokens"][1]["special"], true);
    EXPECT_EQ(j["model"]["type"], "BPE");
    EXPECT_EQ(j["model"]["vocab"].size(), r.vocab.size());
    // h+u and u+g tie at 10: h (71) < u (84), so h+u, then hu+g, then "+q (3) before q+\\.
    EXPECT_EQ(j["model"]["vocab"]["\"q"], 2 + 256 + 2);
    EXPECT_EQ(j["model"]["merges"][0], nlohmann::json::array({"h", "u"}));
    EXPECT_EQ(j["model"]["merges"].size(), r.merges.size());
    EXPECT_EQ(j["pre_tokenizer"]["type"], "ByteLevel");
    EXPECT_EQ(j["pre_tokenizer"]["use_regex"], true);
    EXPECT_EQ(j["decoder"]["type"], "ByteLevel");

    // The llama3 pre-tokenizer is the one Meta's tokenizer.json carries, escaping included.
    const auto l = nlohmann::json::parse(bpe_pre_tokenizer_json(BpePreTokenizerKind::kLlama3));
    std::ifstream in(std::string(LATHE_SHARED_DIR) + "/tokenizers/llama3.json");
    if (in) {
        std::stringstream ss;
        ss << in.rdbuf();
        const auto meta = nlohmann::json::parse(ss.str());
        EXPECT_EQ(l, meta["pre_tokenizer"]);
    }
    EXPECT_FALSE(bpe_pre_tokenizer_kind_from_name("gpt3").ok());
    EXPECT_EQ(*bpe_pre_tokenizer_kind_from_name("bytelevel-noregex"),
              BpePreTokenizerKind::kByteLevelNoRegex);
}

// Short words live in their hash slot, long ones in the arena; both kinds, added one by one or
// many at once, count the same, and entries() lists each word once whatever the insertion order.
TEST(WordCounts, AddAndAddManyAgree) {
    const std::vector<std::string> words = {"a",
                                            "",
                                            "abcdefgh",
                                            "abcdefghi",
                                            "a",
                                            std::string("\0x", 2),
                                            std::string("\0", 1),
                                            "abcdefghi",
                                            std::string(300, 'z'),
                                            "a"};
    WordCounts one(4);
    WordCounts many(4);
    for (const auto& w : words) one.add(w);
    std::vector<std::string_view> views(words.begin(), words.end());
    many.add_many(views);
    for (const WordCounts* wc : {&one, &many}) {
        EXPECT_EQ(wc->size(), 6u);
        EXPECT_EQ(wc->total(), 9u);
        EXPECT_EQ(wc->count("a"), 3u);
        EXPECT_EQ(wc->count("abcdefghi"), 2u);
        EXPECT_EQ(wc->count(std::string_view("\0", 1)), 1u);
        EXPECT_EQ(wc->count(std::string_view("\0x", 2)), 1u);
        EXPECT_EQ(wc->count(std::string(300, 'z')), 1u);
        EXPECT_EQ(wc->count("abcdefg"), 0u);
    }
    EXPECT_EQ(one.entries(), many.entries());
    WordCounts reversed(4);
    for (auto it = words.rbegin(); it != words.rend(); ++it) reversed.add(*it);
    EXPECT_EQ(reversed.entries(), one.entries());
}

// Batches of documents from a list, `per_batch` at a time.
BpeBatchReader reader_of(const std::vector<std::string>& docs, size_t per_batch) {
    auto next = std::make_shared<size_t>(0);
    return [&docs, per_batch, next](BpeDocumentBatch& batch) -> Result<bool> {
        batch.origin = "docs";
        for (size_t k = 0; k < per_batch && *next < docs.size(); ++k, ++*next) {
            batch.text += docs[*next];
            batch.ends.push_back(batch.text.size());
            batch.lines.push_back(*next + 1);
        }
        return batch.size() > 0;
    };
}

// Words are the pre-tokenizer's pieces turned back into bytes: GPT-2's regex keeps the space in
// front of a word, and "Ġworld" is counted as " world".
TEST(BpeCountWords, CountsPreTokenizerPiecesAsBytes) {
    auto pt = pre_tokenizer_from_json(bpe_pre_tokenizer_json(BpePreTokenizerKind::kGpt2), "test");
    ASSERT_TRUE(pt.ok()) << pt.status().to_string();
    const std::vector<std::string> docs = {"Hello world, hello world!", "caf\xc3\xa9  world\n", ""};
    for (int threads : {1, 3}) {
        BpeCountStats stats;
        auto wc =
            bpe_count_words(**pt, reader_of(docs, 1), threads, BpeOnError::kFail, nullptr, &stats);
        ASSERT_TRUE(wc.ok()) << wc.status().to_string();
        EXPECT_EQ(wc->count(" world"), 3u);
        EXPECT_EQ(wc->count("Hello"), 1u);
        EXPECT_EQ(wc->count(","), 1u);
        EXPECT_EQ(wc->count("caf\xc3\xa9"), 1u);
        EXPECT_EQ(wc->count(" "), 1u);  // "  world": the first space stands alone
        EXPECT_EQ(wc->count("\n"), 1u);
        EXPECT_EQ(wc->total(), 10u);
        EXPECT_EQ(stats.documents, 3u);
        EXPECT_EQ(stats.bytes, docs[0].size() + docs[1].size());
        EXPECT_EQ(stats.skipped, 0u);
    }
}

TEST(BpeCountWords, InvalidUtf8FailsOrIsSkipped) {
    auto pt = pre_tokenizer_from_json(bpe_pre_tokenizer_json(BpePreTokenizerKind::kLlama3), "t");
    ASSERT_TRUE(pt.ok()) << pt.status().to_string();
    // Document 3 starts at line 3 (reader_of numbers documents as lines); its bad byte is on the
    // document's second line, so line 4.
    const std::vector<std::string> docs = {"fine", "also fine", "ok\ncaf\xe9", "end end"};
    auto wc = bpe_count_words(**pt, reader_of(docs, 2), 2, BpeOnError::kFail, nullptr, nullptr);
    ASSERT_FALSE(wc.ok());
    EXPECT_NE(wc.status().message().find("docs:4: not valid UTF-8 (byte 0xe9)"), std::string::npos)
        << wc.status().message();

    BpeCountStats stats;
    wc = bpe_count_words(**pt, reader_of(docs, 2), 2, BpeOnError::kSkip, nullptr, &stats);
    ASSERT_TRUE(wc.ok()) << wc.status().to_string();
    EXPECT_EQ(stats.skipped, 1u);
    EXPECT_EQ(stats.first_skipped, "docs:4");
    EXPECT_EQ(stats.documents, 3u);
    EXPECT_EQ(wc->count(" end"), 1u);
    EXPECT_EQ(wc->count("caf"), 0u);
}

// A pre-tokenizer pattern that backtracks exponentially gives up on document 3 (line 3) in a
// worker thread: the error comes back to the caller naming the line (kFail), or the document is
// left out and counted (kSkip).
TEST(BpeCountWords, PatternThatGivesUpFailsOrIsSkipped) {
    auto pt = pre_tokenizer_from_json(
        R"({"type":"Sequence","pretokenizers":[{"type":"Split","pattern":{"Regex":"(a|aa)+$"},)"
        R"("behavior":"Isolated","invert":false},{"type":"ByteLevel","add_prefix_space":false,)"
        R"("trim_offsets":true,"use_regex":false}]})",
        "t");
    ASSERT_TRUE(pt.ok()) << pt.status().to_string();
    const std::vector<std::string> docs = {"b aa", "b", std::string(100, 'a') + "b", "baa"};
    for (int threads : {1, 2}) {
        auto wc =
            bpe_count_words(**pt, reader_of(docs, 1), threads, BpeOnError::kFail, nullptr, nullptr);
        ASSERT_FALSE(wc.ok());
        EXPECT_NE(wc.status().message().find("docs:3: the tokenizer's pattern '(a|aa)+$' gave up"),
                  std::string::npos)
            << wc.status().message();
        EXPECT_NE(wc.status().message().find("--on-error skip"), std::string::npos)
            << wc.status().message();

        BpeCountStats stats;
        wc = bpe_count_words(**pt, reader_of(docs, 1), threads, BpeOnError::kSkip, nullptr, &stats);
        ASSERT_TRUE(wc.ok()) << wc.status().to_string();
        EXPECT_EQ(stats.skipped, 1u);
        EXPECT_EQ(stats.first_skipped, "docs:3");
        EXPECT_EQ(stats.documents, 3u);
        EXPECT_EQ(wc->count("aa"), 2u);
        EXPECT_EQ(wc->count("b"), 2u);
    }
}

TEST(BpeCountWords, ReaderErrorsComeBack) {
    auto pt = pre_tokenizer_from_json(bpe_pre_tokenizer_json(BpePreTokenizerKind::kGpt2), "t");
    ASSERT_TRUE(pt.ok());
    auto wc = bpe_count_words(
        **pt, [](BpeDocumentBatch&) -> Result<bool> { return io_error("disk on fire"); }, 2,
        BpeOnError::kFail, nullptr, nullptr);
    ASSERT_FALSE(wc.ok());
    EXPECT_EQ(wc.status().message(), "disk on fire");
}

}  // namespace
}  // namespace lathe
