#include "data/sampling.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <numeric>

#include "io/file.h"

// The expected index arrays are those of GPT-NeoX's _build_index_mappings formulas under numpy
// 2.4.6, pinned here for a few small cases; tests/test_gpt2_dataset.py compares lathe with the
// files GPT-NeoX's own code wrote (tests/fixtures/gpt2_dataset) at scale.

namespace lathe {
namespace {

std::string temp_dir(const std::string& name) {
    const auto dir = std::filesystem::temp_directory_path() /
                     ("lathe_sampling_test_" + std::to_string(::getpid())) / name;
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    return dir.string();
}

std::vector<int64_t> all(const IndexArray& a) {
    std::vector<int64_t> out;
    for (int64_t i = 0; i < a.size(); ++i) out.push_back(a.at(i));
    return out;
}

const std::vector<int32_t> kSizes = {3, 5, 2, 7, 0, 4};

TEST(SplitDocumentRanges, MatchesGptNeox) {
    // Values of GPT-NeoX's get_train_valid_test_split_(string, size) under CPython 3.11.
    EXPECT_EQ(*split_document_ranges("969, 30, 1", 1000),
              (std::array<int64_t, 4>{0, 969, 999, 1000}));
    EXPECT_EQ(*split_document_ranges("98/2/0", 50), (std::array<int64_t, 4>{0, 49, 50, 50}));
    EXPECT_EQ(*split_document_ranges("1", 7), (std::array<int64_t, 4>{0, 7, 7, 7}));
    // round(1.5) == 2, then the overshoot of 1 moves every later boundary down
    EXPECT_EQ(*split_document_ranges("0.5,0.5", 3), (std::array<int64_t, 4>{0, 1, 3, 3}));
    // round(2.5) == 2 (half to even) twice, so the total falls short by one
    EXPECT_EQ(*split_document_ranges("1,1,2", 10), (std::array<int64_t, 4>{0, 3, 5, 10}));
    // pieces after the third are parsed, then ignored
    EXPECT_EQ(*split_document_ranges("1,1,1,5", 10), (std::array<int64_t, 4>{0, 4, 7, 10}));
    EXPECT_EQ(*split_document_ranges("2,1,1", 3), (std::array<int64_t, 4>{0, 1, 2, 3}));
}

TEST(SplitDocumentRanges, BadStringsNameThePiece) {
    for (const char* bad : {"969,,1", "a,b,c", "969,30/1", "inf", "-1,2,3", "1_000,1", ""}) {
        auto r = split_document_ranges(bad, 100);
        ASSERT_FALSE(r.ok()) << bad;
        EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
        EXPECT_NE(r.status().message().find("split"), std::string::npos);
    }
    auto zero = split_document_ranges("0,0,0", 100);
    ASSERT_FALSE(zero.ok());
    EXPECT_NE(zero.status().message().find("sum to 0"), std::string::npos);
}

TEST(GptIndex, NumEpochsIsTheSmallestThatGivesEnoughSamples) {
    // Python's loop, run directly.
    auto loop = [](int64_t tokens, int64_t sl, int64_t ns) {
        int64_t e = 0, total = 0;
        while (true) {
            ++e;
            total += tokens;
            if ((total - 1) / sl >= ns) return e;
        }
    };
    for (int64_t tokens : {2, 3, 17, 1000, 4097})
        for (int64_t sl : {1, 2, 7, 128, 2048})
            for (int64_t ns : {0, 1, 5, 99, 1000, 12345}) {
                EXPECT_EQ(gpt_num_epochs(tokens, sl, ns), loop(tokens, sl, ns))
                    << tokens << " " << sl << " " << ns;
            }
}

TEST(GptIndex, SmallCaseMatchesReference) {
    IndexMappingRequest r;
    r.name = "train";
    r.data_prefix = "unused";
    r.documents = {0, 6};
    r.num_samples = 5;
    r.seq_length = 4;
    r.seed = 1234;
    auto m = gpt_build_index_mappings(r, kSizes);
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    EXPECT_EQ(m->num_epochs, 1);
    EXPECT_EQ(all(m->doc_idx), (std::vector<int64_t>{2, 1, 5, 0, 4, 3}));
    EXPECT_EQ(all(m->sample_idx), (std::vector<int64_t>{0, 0, 1, 2, 2, 1, 3, 1, 5, 2, 5, 6}));
    EXPECT_EQ(all(m->shuffle_idx), (std::vector<int64_t>{2, 0, 4, 3, 1}));
    EXPECT_EQ(m->sample_idx.dtype(), NpyDtype::kInt32);
    EXPECT_EQ(m->shuffle_idx.dtype(), NpyDtype::kUint32);
}

TEST(GptIndex, ManyEpochsMatchReference) {
    IndexMappingRequest r;
    r.name = "train";
    r.documents = {0, 6};
    r.num_samples = 40;
    r.seq_length = 5;
    r.seed = 99;
    auto m = gpt_build_index_mappings(r, kSizes);
    ASSERT_TRUE(m.ok());
    EXPECT_EQ(m->num_epochs, 10);
    EXPECT_EQ(all(m->doc_idx),
              (std::vector<int64_t>{4, 4, 1, 0, 0, 1, 0, 2, 0, 4, 3, 4, 1, 4, 3, 0, 0, 1, 5, 2,
                                    5, 3, 5, 0, 3, 5, 2, 4, 1, 3, 4, 1, 3, 2, 1, 5, 3, 3, 2, 2,
                                    0, 0, 2, 1, 1, 2, 5, 2, 4, 5, 5, 5, 4, 0, 2, 3, 4, 3, 5, 1}));
    EXPECT_EQ(all(m->sample_idx),
              (std::vector<int64_t>{0,  0, 3,  0, 4,  2, 5,  4, 7,  1, 10, 1, 10, 6, 12, 4, 14, 4,
                                    15, 2, 17, 1, 18, 1, 20, 0, 21, 1, 21, 6, 23, 0, 24, 2, 25, 0,
                                    26, 1, 28, 4, 29, 4, 31, 2, 32, 2, 33, 0, 34, 3, 35, 3, 36, 4,
                                    37, 2, 38, 0, 40, 1, 42, 0, 43, 3, 44, 3, 46, 1, 49, 0, 50, 1,
                                    51, 2, 54, 0, 55, 3, 57, 1, 57, 6, 59, 0}));
    EXPECT_EQ(all(m->shuffle_idx),
              (std::vector<int64_t>{15, 1,  16, 14, 26, 36, 39, 6,  37, 33, 8,  40, 17, 20,
                                    25, 28, 13, 7,  3,  0,  24, 10, 5,  22, 23, 9,  4,  12,
                                    32, 11, 30, 31, 34, 21, 29, 27, 18, 19, 2,  38, 35}));
}

TEST(GptIndex, SeparateLastEpochIsMegatronOnly) {
    IndexMappingRequest r;
    r.name = "train";
    r.documents = {1, 5};
    r.num_samples = 5;
    r.seq_length = 3;
    r.seed = 7;
    // GPT-NeoX: one shuffle over both epochs.
    auto neox = gpt_build_index_mappings(r, kSizes);
    ASSERT_TRUE(neox.ok());
    EXPECT_FALSE(neox->separate_last_epoch);
    EXPECT_EQ(all(neox->doc_idx), (std::vector<int64_t>{3, 2, 1, 3, 4, 2, 1, 4}));
    EXPECT_EQ(all(neox->shuffle_idx), (std::vector<int64_t>{6, 3, 4, 8, 5, 2, 1, 0, 7}));
    // Megatron: the last epoch holds 1 sample < int(0.8 * 4), so it is shuffled apart.
    r.flavor = IndexFlavor::kMegatronSeparateLastEpoch;
    auto meg = gpt_build_index_mappings(r, kSizes);
    ASSERT_TRUE(meg.ok());
    EXPECT_TRUE(meg->separate_last_epoch);
    EXPECT_EQ(all(meg->doc_idx), (std::vector<int64_t>{3, 2, 1, 4, 4, 2, 1, 3}));
    EXPECT_EQ(all(meg->sample_idx),
              (std::vector<int64_t>{0, 0, 0, 3, 0, 6, 2, 0, 2, 3, 5, 1, 6, 2, 7, 0, 7, 3, 7, 6}));
    EXPECT_EQ(all(meg->shuffle_idx), (std::vector<int64_t>{3, 1, 0, 2, 7, 5, 4, 8, 6}));
}

// Invariants that hold for any sizes: the pieces of every sample sum to seq_length + 1, the
// samples tile the shuffled document stream with one shared token between neighbours, and the
// shuffle is a permutation.
TEST(GptIndex, SamplesTileTheDocumentStream) {
    std::vector<int32_t> sizes;
    NumpyRandomState gen(3);
    for (int i = 0; i < 300; ++i) sizes.push_back(static_cast<int32_t>(gen.interval(40)));
    for (int64_t sl : {2, 3, 7, 64}) {
        for (uint32_t seed : {0u, 5u}) {
            IndexMappingRequest r;
            r.name = "t";
            r.documents = {10, 290};
            r.num_samples = 700;
            r.seq_length = sl;
            r.seed = seed;
            auto m = gpt_build_index_mappings(r, sizes);
            ASSERT_TRUE(m.ok()) << m.status().to_string();
            ASSERT_GE(m->num_samples(), 700);
            // Flatten the stream (document, offset) of doc_idx.
            std::vector<std::pair<int64_t, int64_t>> stream;
            for (int64_t i = 0; i < m->doc_idx.size(); ++i) {
                const int64_t d = m->doc_idx.at(i);
                ASSERT_GE(d, 10);
                ASSERT_LT(d, 290);
                for (int64_t t = 0; t < sizes[d]; ++t) stream.push_back({d, t});
            }
            int64_t position = 0;
            for (int64_t s = 0; s < m->num_samples(); ++s) {
                int64_t total = 0;
                for (const SamplePiece& p : gpt_sample_pieces(*m, sizes, s)) {
                    ASSERT_GE(p.length, 0);
                    for (int64_t t = 0; t < p.length; ++t) {
                        if (p.length == 0) break;
                        ASSERT_LT(position + total, int64_t(stream.size()));
                        const auto expect = stream[position + total];
                        ASSERT_EQ(expect.first, p.document);
                        ASSERT_EQ(expect.second, p.offset + t);
                        ++total;
                    }
                }
                ASSERT_EQ(total, sl + 1) << "sample " << s;
                position += sl;  // the last token is the next sample's first
            }
            std::vector<int64_t> shuffled = all(m->shuffle_idx);
            std::sort(shuffled.begin(), shuffled.end());
            std::vector<int64_t> expect(shuffled.size());
            std::iota(expect.begin(), expect.end(), int64_t{0});
            ASSERT_EQ(shuffled, expect);
        }
    }
}

TEST(GptIndex, FixedEpochsAndDtypeThresholds) {
    IndexMappingRequest r;
    r.name = "train";
    r.documents = {0, 6};
    r.num_epochs = 3;
    r.seq_length = 4;
    auto m = gpt_build_index_mappings(r, kSizes);
    ASSERT_TRUE(m.ok());
    EXPECT_EQ(m->num_epochs, 3);
    EXPECT_EQ(m->num_samples(), (3 * 21 - 1) / 4);
    EXPECT_EQ(index_cache_paths(r).doc_idx,
              "_train_indexmap_Nonens_4sl_0s_packedpi_ac_doc_idx.npy");
    // 2 * (S + 1) < 2^31 - 1 in float64 decides int32.
    // S = T - 1 for seq_length 1: 2 * (1073741822 + 1) < 2147483647, 2 * (1073741823 + 1) is not
    EXPECT_EQ(gpt_sample_idx_dtype(1, 1073741823, 1), NpyDtype::kInt32);
    EXPECT_EQ(gpt_sample_idx_dtype(1, 1073741824, 1), NpyDtype::kInt64);
    EXPECT_EQ(gpt_shuffle_idx_dtype(4294967293), NpyDtype::kUint32);
    EXPECT_EQ(gpt_shuffle_idx_dtype(4294967294), NpyDtype::kInt64);
}

TEST(GptIndex, BadRequestsAreInvalidArguments) {
    IndexMappingRequest r;
    r.name = "train";
    r.data_prefix = "/data/x";
    r.documents = {0, 6};
    r.num_samples = 5;
    r.seq_length = 1;  // GPT-NeoX's helper asserts seq_length > 1
    EXPECT_EQ(gpt_build_index_mappings(r, kSizes).status().code(), StatusCode::kInvalidArgument);
    r.seq_length = 4;
    r.documents = {4, 5};  // one empty document
    auto empty = gpt_build_index_mappings(r, kSizes);
    ASSERT_FALSE(empty.ok());
    EXPECT_NE(empty.status().message().find("/data/x"), std::string::npos);
    r.documents = {0, 7};
    EXPECT_FALSE(gpt_build_index_mappings(r, kSizes).ok());
    r.documents = {0, 6};
    r.num_samples.reset();
    EXPECT_FALSE(gpt_build_index_mappings(r, kSizes).ok());
}

TEST(GptIndexCache, NamesFollowGptNeoxVersions) {
    IndexMappingRequest r;
    r.name = "valid";
    r.data_prefix = "/d/pile_text_document";
    r.num_samples = 1234;
    r.seq_length = 2048;
    r.seed = 1;
    EXPECT_EQ(index_cache_paths(r).sample_idx,
              "/d/pile_text_document_valid_indexmap_1234ns_2048sl_1s_packedpi_ac_sample_idx.npy");
    r.allow_chopped = false;
    EXPECT_EQ(index_cache_paths(r).shuffle_idx,
              "/d/pile_text_document_valid_indexmap_1234ns_2048sl_1s_packedpi_shuffle_idx.npy");
    r.naming = CacheNaming::kLegacy;
    EXPECT_EQ(index_cache_paths(r).doc_idx,
              "/d/pile_text_document_valid_indexmap_1234ns_2048sl_1s_doc_idx.npy");
}

TEST(GptIndexCache, BuildsWritesThenReuses) {
    const std::string dir = temp_dir("reuse");
    IndexMappingRequest r;
    r.name = "train";
    r.data_prefix = dir + "/corpus";
    r.documents = {0, 6};
    r.num_samples = 40;
    r.seq_length = 5;
    r.seed = 99;
    auto first = gpt_load_or_build_index_mappings(r, kSizes);
    ASSERT_TRUE(first.ok()) << first.status().to_string();
    EXPECT_FALSE(first->loaded_from_cache);
    const IndexCachePaths paths = index_cache_paths(r);
    ASSERT_TRUE(file_exists(paths.doc_idx));
    ASSERT_TRUE(file_exists(paths.sample_idx));
    ASSERT_TRUE(file_exists(paths.shuffle_idx));
    auto in_memory = gpt_build_index_mappings(r, kSizes);
    EXPECT_EQ(all(first->shuffle_idx), all(in_memory->shuffle_idx));

    auto second = gpt_load_or_build_index_mappings(r, kSizes);
    ASSERT_TRUE(second.ok());
    EXPECT_TRUE(second->loaded_from_cache);
    EXPECT_EQ(all(second->doc_idx), all(in_memory->doc_idx));
    EXPECT_EQ(all(second->sample_idx), all(in_memory->sample_idx));
    EXPECT_EQ(all(second->shuffle_idx), all(in_memory->shuffle_idx));

    // A missing file means "not cached": all three are rebuilt, identically.
    std::filesystem::remove(paths.shuffle_idx);
    auto third = gpt_load_or_build_index_mappings(r, kSizes);
    ASSERT_TRUE(third.ok());
    EXPECT_FALSE(third->loaded_from_cache);
    EXPECT_EQ(all(third->shuffle_idx), all(in_memory->shuffle_idx));
}

TEST(GptIndexCache, CorruptOrStaleCacheIsAnErrorNamingTheFile) {
    const std::string dir = temp_dir("corrupt");
    IndexMappingRequest r;
    r.name = "train";
    r.data_prefix = dir + "/corpus";
    r.documents = {0, 6};
    r.num_samples = 40;
    r.seq_length = 5;
    r.seed = 99;
    ASSERT_TRUE(gpt_load_or_build_index_mappings(r, kSizes).ok());
    const IndexCachePaths paths = index_cache_paths(r);

    // Truncated sample_idx.
    const std::string sample_bytes = *file_read_all(paths.sample_idx);
    ASSERT_TRUE(
        file_write_atomic(paths.sample_idx, sample_bytes.substr(0, sample_bytes.size() - 8)).ok());
    auto truncated = gpt_load_or_build_index_mappings(r, kSizes);
    ASSERT_FALSE(truncated.ok());
    EXPECT_EQ(truncated.status().code(), StatusCode::kDataLoss);
    EXPECT_NE(truncated.status().message().find(paths.sample_idx), std::string::npos);
    EXPECT_NE(truncated.status().message().find("delete"), std::string::npos);
    ASSERT_TRUE(file_write_atomic(paths.sample_idx, sample_bytes).ok());

    // Same name, other data: document sizes changed so the epochs no longer match.
    std::vector<int32_t> other = kSizes;
    other[3] = 70;
    auto stale = gpt_load_or_build_index_mappings(r, other);
    ASSERT_FALSE(stale.ok());
    EXPECT_EQ(stale.status().code(), StatusCode::kDataLoss);
    EXPECT_NE(stale.status().message().find(paths.doc_idx), std::string::npos)
        << stale.status().message();

    // A shuffle_idx that is not a permutation.
    const std::vector<uint32_t> dup(41, 3);
    const int64_t shape[] = {41};
    ASSERT_TRUE(npy_write(paths.shuffle_idx, std::span<const uint32_t>(dup), shape).ok());
    auto not_perm = gpt_load_or_build_index_mappings(r, kSizes);
    ASSERT_FALSE(not_perm.ok());
    EXPECT_NE(not_perm.status().message().find(paths.shuffle_idx), std::string::npos);
    EXPECT_NE(not_perm.status().message().find("permutation"), std::string::npos);
}

TEST(GptIndexCache, UnwritableFolderIsAnIoErrorNamingTheFile) {
    IndexMappingRequest r;
    r.name = "train";
    r.data_prefix = "/nonexistent-lathe-folder/corpus";
    r.documents = {0, 6};
    r.num_samples = 5;
    r.seq_length = 4;
    auto m = gpt_load_or_build_index_mappings(r, kSizes);
    ASSERT_FALSE(m.ok());
    EXPECT_EQ(m.status().code(), StatusCode::kIoError);
    EXPECT_NE(m.status().message().find("/nonexistent-lathe-folder/corpus_train_indexmap"),
              std::string::npos);
}

TEST(GptNeoxLoaderOrder, MicroBatchesTileGlobalBatchesAndCycle) {
    // 2 ranks x 3 samples per micro-batch over 20 samples: 3 global batches per pass (2 dropped).
    EXPECT_EQ(*gpt_neox_micro_batch_start(0, 3, 2, 0, 20), 0);
    EXPECT_EQ(*gpt_neox_micro_batch_start(0, 3, 2, 1, 20), 3);
    EXPECT_EQ(*gpt_neox_micro_batch_start(1, 3, 2, 0, 20), 6);
    EXPECT_EQ(*gpt_neox_micro_batch_start(2, 3, 2, 1, 20), 15);
    EXPECT_EQ(*gpt_neox_micro_batch_start(3, 3, 2, 0, 20), 0);  // the second pass repeats
    EXPECT_EQ(gpt_neox_micro_batch_start(0, 3, 2, 0, 5).status().code(),
              StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace lathe
