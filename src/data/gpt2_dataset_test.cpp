#include "data/gpt2_dataset.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "data/indexed_dataset.h"

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

// ---- token ids against a vocabulary ------------------------------------------------------------

TEST(TokenDocumentsIds, InMemoryFindsTheFirstIdOutside) {
    InMemoryDocuments docs("memory", {{1, 2, 3}, {4, 9, 5, 12}, {-100, 0}});
    auto none = docs.find_id_outside(13, /*negative_ok=*/true);
    ASSERT_TRUE(none.ok());
    EXPECT_FALSE(none->has_value());
    auto big = docs.find_id_outside(9, true);  // 9 and 12 are outside; 9 comes first
    ASSERT_TRUE(big.ok() && big->has_value());
    EXPECT_EQ((*big)->id, 9);
    EXPECT_EQ((*big)->document, 1);
    EXPECT_EQ((*big)->position, 1);
    auto negative = docs.find_id_outside(13, /*negative_ok=*/false);
    ASSERT_TRUE(negative.ok() && negative->has_value());
    EXPECT_EQ((*negative)->id, -100);
    EXPECT_EQ((*negative)->document, 2);
    EXPECT_EQ((*negative)->position, 0);
}

class IndexedIds : public ::testing::Test {
protected:
    void SetUp() override {
        dir_ = std::filesystem::temp_directory_path() /
               ("lathe_gpt2_ids_" + std::to_string(::getpid()) + "_" +
                ::testing::UnitTest::GetInstance()->current_test_info()->name());
        std::filesystem::create_directories(dir_);
    }
    void TearDown() override { std::filesystem::remove_all(dir_); }

    std::unique_ptr<TokenDocuments> write(const std::string& name, TokenDType dtype,
                                          const std::vector<std::vector<int32_t>>& docs) {
        const std::string prefix = (dir_ / name).string();
        auto w = IndexedDatasetWriter::create(prefix, dtype);
        EXPECT_TRUE(w.ok()) << w.status().to_string();
        for (const auto& d : docs) EXPECT_TRUE(w->add_document(d).ok());
        EXPECT_TRUE(w->finalize().ok());
        EXPECT_TRUE(w->commit().ok());
        auto opened = open_indexed_token_documents(prefix);
        EXPECT_TRUE(opened.ok()) << opened.status().to_string();
        return std::move(opened).value();
    }

    std::filesystem::path dir_;
};

TEST_F(IndexedIds, ScanFindsTheFirstIdOutsideAcrossThreadStretches) {
    // 3 M tokens, so the scan splits the file into stretches (one per core, 2^20 tokens or more
    // each); the two bad ids sit in the last part, the second past the first.
    std::vector<std::vector<int32_t>> docs(3);
    for (int d = 0; d < 3; ++d) docs[d].assign(1 << 20, d + 7);
    docs[2][1000] = 70000;
    docs[2][2000] = 80000;
    auto file = write("big", TokenDType::kInt32, docs);
    auto found = file->find_id_outside(65536, false);
    ASSERT_TRUE(found.ok()) << found.status().to_string();
    ASSERT_TRUE(found->has_value());
    EXPECT_EQ((*found)->id, 70000);
    EXPECT_EQ((*found)->document, 2);
    EXPECT_EQ((*found)->position, 1000);
    auto fits = file->find_id_outside(80001, false);
    ASSERT_TRUE(fits.ok());
    EXPECT_FALSE(fits->has_value());
    // The default (read() per document) agrees with the scan.
    auto slow = file->TokenDocuments::find_id_outside(65536, false);
    ASSERT_TRUE(slow.ok() && slow->has_value());
    EXPECT_EQ((*slow)->id, 70000);
    EXPECT_EQ((*slow)->position, 1000);
}

TEST_F(IndexedIds, Uint16AndLabels) {
    auto small = write("u16", TokenDType::kUInt16, {{1, 2}, {3, 400, 5}});
    auto found = small->find_id_outside(384, false);
    ASSERT_TRUE(found.ok() && found->has_value());
    EXPECT_EQ((*found)->id, 400);
    EXPECT_EQ((*found)->document, 1);
    EXPECT_EQ((*found)->position, 1);
    auto wide_vocab = small->find_id_outside(65536, false);  // uint16 cannot hold more
    ASSERT_TRUE(wide_vocab.ok());
    EXPECT_FALSE(wide_vocab->has_value());

    auto labels = write("labels", TokenDType::kInt32, {{-100, -100, 7}, {-100, 3}});
    auto ok = labels->find_id_outside(8, /*negative_ok=*/true);
    ASSERT_TRUE(ok.ok());
    EXPECT_FALSE(ok->has_value());
    auto as_tokens = labels->find_id_outside(8, /*negative_ok=*/false);
    ASSERT_TRUE(as_tokens.ok() && as_tokens->has_value());
    EXPECT_EQ((*as_tokens)->id, -100);
    auto too_big = labels->find_id_outside(7, true);
    ASSERT_TRUE(too_big.ok() && too_big->has_value());
    EXPECT_EQ((*too_big)->id, 7);
    EXPECT_EQ((*too_big)->position, 2);
}

}  // namespace
}  // namespace lathe
