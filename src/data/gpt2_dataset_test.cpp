#include "data/gpt2_dataset.h"

#include <gtest/gtest.h>

namespace lathe {
namespace {

// Token t of document d is d * 1000 + t, so a sample shows where each token came from.
std::vector<std::vector<int32_t>> numbered_documents(const std::vector<int32_t>& sizes) {
    std::vector<std::vector<int32_t>> docs;
    for (size_t d = 0; d < sizes.size(); ++d) {
        std::vector<int32_t> doc;
        for (int32_t t = 0; t < sizes[d]; ++t) doc.push_back(static_cast<int32_t>(d) * 1000 + t);
        docs.push_back(std::move(doc));
    }
    return docs;
}

IndexMappingRequest request(int64_t num_samples, int64_t seq_length, uint32_t seed,
                            DocumentRange docs) {
    IndexMappingRequest r;
    r.name = "train";
    r.data_prefix = "memory";
    r.documents = docs;
    r.num_samples = num_samples;
    r.seq_length = seq_length;
    r.seed = seed;
    return r;
}

TEST(Gpt2Dataset, SamplesFollowShuffleAndCrossDocuments) {
    // The small case of sampling_test.cpp: doc_idx [2, 1, 5, 0, 4, 3], sample_idx rows
    // (0,0) (1,2) (2,1) (3,1) (5,2) (5,6), shuffle_idx [2, 0, 4, 3, 1].
    const std::vector<int32_t> sizes = {3, 5, 2, 7, 0, 4};
    InMemoryDocuments docs("memory", numbered_documents(sizes));
    auto ds = Gpt2Dataset::create(request(5, 4, 1234, {0, 6}), docs, nullptr, false);
    ASSERT_TRUE(ds.ok()) << ds.status().to_string();
    EXPECT_EQ((*ds)->size(), 4);  // GPT-NeoX's len(): one less than the 5 samples built
    Sample s;
    // Sample 0 -> row 2: from doc_idx[2] = doc 5 offset 1 ... doc_idx[3] = doc 0 offset 1.
    ASSERT_TRUE((*ds)->get(s, 0).ok());
    EXPECT_EQ(s.sample_row, 2);
    EXPECT_EQ(s.tokens, (std::vector<int32_t>{5001, 5002, 5003, 0, 1}));
    ASSERT_EQ(s.documents.size(), 2u);
    EXPECT_EQ(s.documents[0].start, 0);
    EXPECT_EQ(s.documents[0].length, 3);
    EXPECT_EQ(s.documents[0].document, 5);
    EXPECT_EQ(s.documents[1].start, 3);
    EXPECT_EQ(s.documents[1].document, 0);
    EXPECT_TRUE(s.labels.empty());
    // Sample 2 -> row 4: doc_idx[5] = doc 3 from offset 2, to offset 6: inside one document.
    ASSERT_TRUE((*ds)->get(s, 2).ok());
    EXPECT_EQ(s.tokens, (std::vector<int32_t>{3002, 3003, 3004, 3005, 3006}));
    ASSERT_EQ(s.documents.size(), 1u);
    // Row 3 spans doc 0 (offset 1..2), the empty doc 4 (left out), doc 3 (offset 0..2).
    ASSERT_TRUE((*ds)->get(s, 3).ok());
    EXPECT_EQ(s.sample_row, 3);
    EXPECT_EQ(s.tokens, (std::vector<int32_t>{1, 2, 3000, 3001, 3002}));
    ASSERT_EQ(s.documents.size(), 2u);
    EXPECT_EQ(s.documents[1].document, 3);
    // The last shuffled sample is reachable by index, and past it GPT-NeoX wraps modulo len().
    ASSERT_TRUE((*ds)->get(s, 4).ok());
    EXPECT_EQ(s.sample_row, 1);
    Sample wrapped, direct;
    ASSERT_TRUE((*ds)->get(wrapped, 7).ok());
    ASSERT_TRUE((*ds)->get(direct, 7 % 4).ok());
    EXPECT_EQ(wrapped.tokens, direct.tokens);
}

TEST(Gpt2Dataset, LabelsAreReadInParallel) {
    const std::vector<int32_t> sizes = {4, 6, 3, 5};
    InMemoryDocuments docs("tokens", numbered_documents(sizes));
    // Labels: -100 on each document's first half (the "prompt"), the token itself after.
    auto label_docs = numbered_documents(sizes);
    for (auto& d : label_docs) {
        for (size_t t = 0; t < d.size() / 2; ++t) d[t] = -100;
    }
    InMemoryDocuments labels("labels", label_docs);
    auto ds = Gpt2Dataset::create(request(6, 3, 9, {0, 4}), docs, &labels, false);
    ASSERT_TRUE(ds.ok()) << ds.status().to_string();
    EXPECT_TRUE((*ds)->has_labels());
    Sample s;
    for (int64_t i = 0; i < (*ds)->size(); ++i) {
        ASSERT_TRUE((*ds)->get(s, i).ok());
        ASSERT_EQ(s.labels.size(), s.tokens.size());
        for (size_t k = 0; k < s.tokens.size(); ++k) {
            const int32_t doc = s.tokens[k] / 1000;
            const int32_t pos = s.tokens[k] % 1000;
            const int32_t expect = pos < sizes[doc] / 2 ? -100 : s.tokens[k];
            EXPECT_EQ(s.labels[k], expect) << "sample " << i << " position " << k;
        }
    }
}

TEST(Gpt2Dataset, MisalignedLabelFileIsAnError) {
    InMemoryDocuments docs("corpus_text_document", numbered_documents({4, 6, 3}));
    InMemoryDocuments fewer("corpus_label_document", numbered_documents({4, 6}));
    auto a = Gpt2Dataset::create(request(2, 3, 1, {0, 3}), docs, &fewer, false);
    ASSERT_FALSE(a.ok());
    EXPECT_NE(a.status().message().find("corpus_label_document"), std::string::npos);
    EXPECT_NE(a.status().message().find("2 documents"), std::string::npos);
    InMemoryDocuments shorter("corpus_label_document", numbered_documents({4, 5, 3}));
    auto b = Gpt2Dataset::create(request(2, 3, 1, {0, 3}), docs, &shorter, false);
    ASSERT_FALSE(b.ok());
    EXPECT_NE(b.status().message().find("document 1 has 5 labels but 6 tokens"), std::string::npos)
        << b.status().message();
}

TEST(Gpt2Dataset, MegatronFlavorCountsEverySample) {
    const std::vector<int32_t> sizes = {3, 5, 2, 7, 0, 4};
    InMemoryDocuments docs("memory", numbered_documents(sizes));
    auto r = request(5, 3, 7, {1, 5});
    r.flavor = IndexFlavor::kMegatronSeparateLastEpoch;
    auto ds = Gpt2Dataset::create(r, docs, nullptr, false);
    ASSERT_TRUE(ds.ok());
    EXPECT_EQ((*ds)->size(), (*ds)->mappings().num_samples());
}

}  // namespace
}  // namespace lathe
