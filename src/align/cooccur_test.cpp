#include "align/cooccur.h"

#include <gtest/gtest.h>

#include <map>

#include "align/embed_test_util.h"

namespace lathe {
namespace {

using embedtest::write_docs;
using embedtest::zipf_docs;

// The specification in plain loops: every ordered pair of kept tokens within the window of one
// document, weighted 1/distance, distances counted over kept tokens only.
std::map<std::pair<uint32_t, uint32_t>, double> reference_cooccur(
    const std::vector<std::vector<int32_t>>& docs, const EmbedVocab& vocab, int window,
    bool weighting) {
    std::map<std::pair<uint32_t, uint32_t>, double> x;
    for (const auto& doc : docs) {
        std::vector<uint32_t> rows;
        for (int32_t id : doc)
            if (vocab.row_of_token[size_t(id)] >= 0)
                rows.push_back(uint32_t(vocab.row_of_token[size_t(id)]));
        for (size_t p = 0; p < rows.size(); ++p)
            for (size_t q = 0; q < rows.size(); ++q) {
                const size_t dist = p > q ? p - q : q - p;
                if (dist == 0 || dist > size_t(window)) continue;
                x[{rows[p], rows[q]}] += weighting ? 1.0 / double(dist) : 1.0;
            }
    }
    return x;
}

TEST(EmbedVocab, OrdersByCountAndDropsRareTokens) {
    const auto data = write_docs("vocab", {{5, 5, 5, 2, 2, 9}, {2, 5, 7, 7, 7}, {9}});
    auto vocab = embed_count_vocab(data, 2, 2);
    ASSERT_TRUE(vocab.ok()) << vocab.status().to_string();
    // counts: 5 -> 4, 2 -> 3, 7 -> 3, 9 -> 2; ties by id.
    EXPECT_EQ(vocab->token_of_row, (std::vector<int32_t>{5, 2, 7, 9}));
    EXPECT_EQ(vocab->count_of_row, (std::vector<int64_t>{4, 3, 3, 2}));
    EXPECT_EQ(vocab->corpus_tokens, 12);
    EXPECT_EQ(vocab->documents, 3);
    EXPECT_EQ(vocab->row_of_token[7], 2);
    EXPECT_EQ(vocab->row_of_token[0], -1);

    auto none = embed_count_vocab(data, 5, 1);
    ASSERT_FALSE(none.ok());
    EXPECT_NE(none.status().message().find("--min-count"), std::string::npos);
}

TEST(Cooccur, MatchesPlainLoopsForAnyThreadCount) {
    const auto docs = zipf_docs(300, 40, 400, 11);
    const auto data = write_docs("zipf", docs);
    auto vocab = embed_count_vocab(data, 3, 2);
    ASSERT_TRUE(vocab.ok());
    ASSERT_LT(vocab->size(), 400);  // some ids fall below min_count and take no position
    for (bool weighting : {true, false}) {
        const auto ref = reference_cooccur(docs, *vocab, 5, weighting);
        std::vector<CooccurEntry> first;
        for (int threads : {1, 3}) {
            CooccurOptions options;
            options.window = 5;
            options.distance_weighting = weighting;
            options.threads = threads;
            const auto x = cooccur_count(data, *vocab, options);
            ASSERT_EQ(x.size(), ref.size());
            size_t i = 0;
            for (const auto& [key, v] : ref) {
                ASSERT_EQ(x[i].row, key.first) << i;
                ASSERT_EQ(x[i].col, key.second) << i;
                EXPECT_NEAR(x[i].value, v, 1e-6 * v) << key.first << "," << key.second;
                ++i;
            }
            if (threads == 1) {
                first = x;
            } else {  // no table overflowed: bitwise the same for any thread count
                for (size_t j = 0; j < x.size(); ++j) EXPECT_EQ(x[j].value, first[j].value);
            }
        }
    }
}

TEST(Cooccur, SmallMemoryLimitSpillsRunsAndMergesThem) {
    const auto docs = zipf_docs(400, 60, 200, 5);
    const auto data = write_docs("spill", docs);
    auto vocab = embed_count_vocab(data, 1, 1);
    ASSERT_TRUE(vocab.ok());
    CooccurOptions options;
    options.window = 8;
    options.threads = 2;
    options.memory_bytes = 2 * 1024 * 16;  // 1024 slots per thread: forces many flushes
    const auto x = cooccur_count(data, *vocab, options);
    const auto ref = reference_cooccur(docs, *vocab, 8, true);
    ASSERT_GT(ref.size(), 4000u);
    ASSERT_EQ(x.size(), ref.size());
    size_t i = 0;
    for (const auto& [key, v] : ref) {
        ASSERT_EQ(x[i].row, key.first);
        ASSERT_EQ(x[i].col, key.second);
        EXPECT_NEAR(x[i].value, v, 1e-6 * v);
        ++i;
    }
}

TEST(Cooccur, WindowsNeverCrossDocuments) {
    const auto data = write_docs("bounds", {{1, 2}, {3, 4}, {1, 2}, {3, 4}});
    auto vocab = embed_count_vocab(data, 1, 1);
    ASSERT_TRUE(vocab.ok());
    const auto x = cooccur_count(data, *vocab, CooccurOptions{});
    // Only (1,2), (2,1), (3,4), (4,3), each twice at distance 1.
    ASSERT_EQ(x.size(), 4u);
    for (const auto& e : x) {
        const int32_t a = vocab->token_of_row[e.row];
        const int32_t b = vocab->token_of_row[e.col];
        EXPECT_TRUE((a == 1 && b == 2) || (a == 2 && b == 1) || (a == 3 && b == 4) ||
                    (a == 4 && b == 3))
            << a << "," << b;
        EXPECT_EQ(e.value, 2.0f);
    }
}

}  // namespace
}  // namespace lathe
