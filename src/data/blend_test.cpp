#include "data/blend.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <map>

#include "io/file.h"

// Expected numbers: numpy 2.4.6 / CPython 3.11 running GPT-NeoX's formulas
// (get_normalized_weights_and_num_samples, BlendableDataset + build_blending_indices,
// weights_by_num_docs); tests/test_gpt2_dataset.py compares lathe's blends with GPT-NeoX's own
// code at scale.

namespace lathe {
namespace {

std::string temp_dir(const std::string& name) {
    const auto dir = std::filesystem::temp_directory_path() /
                     ("lathe_blend_test_" + std::to_string(::getpid())) / name;
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    return dir.string();
}

TEST(NumpyPairwiseSum, MatchesNumpyToTheLastBit) {
    // np.sum(np.array([0.1] * 10)) == 1.0 (a left-to-right sum gives 0.9999999999999999)
    const std::vector<double> tenths(10, 0.1);
    EXPECT_EQ(numpy_pairwise_sum(tenths), 1.0);
    double sequential = 0.0;
    for (double x : tenths) sequential += x;
    EXPECT_NE(sequential, 1.0);
    // np.sum(np.array([0.1 * i for i in range(1, 301)])) == 4515.0 (the recursive halves)
    std::vector<double> ramp;
    for (int i = 1; i <= 300; ++i) ramp.push_back(0.1 * i);
    EXPECT_EQ(numpy_pairwise_sum(ramp), 4515.0);
}

TEST(BlendWeights, NormalizedWithSpareSamples) {
    const std::vector<double> w = {0.3, 0.2, 0.5};
    auto n = gpt_normalized_weights_and_num_samples(w, 1000);
    ASSERT_TRUE(n.ok());
    EXPECT_EQ(n->weights, (std::vector<double>{0.3, 0.2, 0.5}));
    EXPECT_EQ(n->num_samples[0], 302);
    EXPECT_EQ(n->num_samples[1], 201);
    EXPECT_EQ(n->num_samples[2], 503);
    auto epochs = gpt_normalized_weights_and_num_samples(w, std::nullopt);
    ASSERT_TRUE(epochs.ok());
    EXPECT_FALSE(epochs->num_samples[0].has_value());
    const std::vector<double> zero = {0.0, 0.0};
    EXPECT_FALSE(gpt_normalized_weights_and_num_samples(zero, 10).ok());
    const std::vector<double> negative = {1.0, -1.0};
    EXPECT_FALSE(gpt_normalized_weights_and_num_samples(negative, 10).ok());
}

TEST(BlendWeights, ByNumberOfDocuments) {
    const std::vector<int64_t> docs = {100, 10, 1};
    EXPECT_EQ(gpt_weights_by_num_docs(docs, 0.3),
              (std::vector<double>{0.12324838644870928, 0.5671656639253286, 0.30958594962596214}));
    const std::vector<int64_t> equal = {5, 5};
    EXPECT_EQ(gpt_weights_by_num_docs(equal, 1.0), (std::vector<double>{0.5, 0.5}));
    const std::vector<int64_t> one = {7};
    EXPECT_EQ(gpt_weights_by_num_docs(one, 0.3), (std::vector<double>{1.0}));
}

TEST(BlendingIndices, MatchGptNeoxHelper) {
    const std::vector<double> w = {0.3, 0.2, 0.5};
    const BlendingIndices b = gpt_build_blending_indices(w, 20);
    EXPECT_EQ(b.dataset_index,
              (std::vector<uint8_t>{2, 0, 1, 2, 0, 2, 1, 2, 0, 2, 0, 2, 1, 2, 0, 2, 1, 2, 0, 2}));
    EXPECT_EQ(b.dataset_sample_index,
              (std::vector<int64_t>{0, 0, 0, 1, 1, 2, 1, 3, 2, 4, 3, 5, 2, 6, 4, 7, 3, 8, 5, 9}));
    // Equal weights: ties go to the lowest index, so the datasets take turns.
    const std::vector<double> thirds = {1.0 / 3, 1.0 / 3, 1.0 / 3};
    const BlendingIndices t = gpt_build_blending_indices(thirds, 12);
    EXPECT_EQ(t.dataset_index, (std::vector<uint8_t>{0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2}));
    // Over a long run every dataset's share approaches its weight.
    const BlendingIndices long_run = gpt_build_blending_indices(w, 100000);
    std::map<int, int64_t> count;
    for (uint8_t d : long_run.dataset_index) count[d]++;
    EXPECT_NEAR(count[0] / 100000.0, 0.3, 1e-4);
    EXPECT_NEAR(count[2] / 100000.0, 0.5, 1e-4);
}

// Three tiny corpora that say which file each token came from (file * 100000 + doc * 100 + t).
std::unique_ptr<TokenDocuments> corpus(int file, int docs, int doc_size) {
    std::vector<std::vector<int32_t>> d;
    for (int i = 0; i < docs; ++i) {
        std::vector<int32_t> doc;
        for (int t = 0; t < doc_size + (i % 3); ++t) doc.push_back(file * 100000 + i * 100 + t);
        d.push_back(std::move(doc));
    }
    return std::make_unique<InMemoryDocuments>("file" + std::to_string(file), std::move(d));
}

std::unique_ptr<TokenDocuments> named_corpus(const std::string& name, int file, int docs,
                                             int doc_size) {
    auto c = corpus(file, docs, doc_size);
    std::vector<std::vector<int32_t>> d;
    for (int64_t i = 0; i < int64_t(c->sizes().size()); ++i) {
        std::vector<int32_t> doc(c->sizes()[i]);
        (void)c->read(i, 0, doc);
        d.push_back(std::move(doc));
    }
    return std::make_unique<InMemoryDocuments>(name, std::move(d));
}

TEST(BlendedDataset, SamplesComeFromTheChosenDataset) {
    auto a = corpus(1, 20, 5);
    auto b = corpus(2, 30, 7);
    IndexMappingRequest r;
    r.name = "train_0";
    r.data_prefix = "file1";
    r.documents = {0, 20};
    r.num_samples = 10;
    r.seq_length = 4;
    auto da = Gpt2Dataset::create(r, *a, nullptr, false);
    r.name = "train_1";
    r.data_prefix = "file2";
    r.documents = {0, 30};
    r.num_samples = 30;
    auto db = Gpt2Dataset::create(r, *b, nullptr, false);
    ASSERT_TRUE(da.ok() && db.ok());
    const std::vector<double> w = {0.25, 0.75};
    auto blend = BlendedDataset::create({da->get(), db->get()}, w);
    ASSERT_TRUE(blend.ok()) << blend.status().to_string();
    EXPECT_EQ((*blend)->size(), (*da)->size() + (*db)->size());
    Sample s, direct;
    for (int64_t k = 0; k < (*blend)->size() + 5; ++k) {
        ASSERT_TRUE((*blend)->get(s, k).ok());
        const int64_t kk = k % (*blend)->size();
        const int which = (*blend)->indices().dataset_index[kk];
        ASSERT_EQ(s.tokens[0] / 100000, which + 1);
        const Gpt2Dataset* member = which == 0 ? da->get() : db->get();
        ASSERT_TRUE(member->get(direct, (*blend)->indices().dataset_sample_index[kk]).ok());
        ASSERT_EQ(s.tokens, direct.tokens);
    }
    const std::vector<double> one = {1.0};
    EXPECT_FALSE(BlendedDataset::create({da->get(), db->get()}, one).ok());
}

TEST(GptNeoxDatasets, SplitModeAndListModeWithLabels) {
    const std::string dir = temp_dir("assemble");
    auto open = [&](const std::string& prefix) -> Result<std::unique_ptr<TokenDocuments>> {
        if (prefix == dir + "/a") return named_corpus(prefix, 1, 40, 6);
        if (prefix == dir + "/b") return named_corpus(prefix, 2, 25, 9);
        if (prefix == dir + "/a_label") return named_corpus(prefix, 3, 40, 6);
        return not_found_error("{}: no such token file", prefix);
    };
    GptNeoxDataArgs args;
    args.data_path = dir + "/a";
    args.split = "90,8,2";
    args.seq_length = 8;
    args.seed = 5;
    args.train_iters = 10;
    args.train_batch_size = 2;
    args.eval_interval = 5;
    args.eval_iters = 1;
    auto split = gpt_neox_build_datasets(args, open);
    ASSERT_TRUE(split.ok()) << split.status().to_string();
    // 40 documents: [0, 36) [36, 39) [39, 40)
    ASSERT_NE(split->train(), nullptr);
    ASSERT_NE(split->valid(), nullptr);
    ASSERT_NE(split->test(), nullptr);
    EXPECT_GE(split->train()->size(), 20 - 1);
    EXPECT_TRUE(file_exists(dir + "/a_train_indexmap_20ns_8sl_5s_packedpi_ac_doc_idx.npy"));
    // valid: (10 // 5 + 1) * 1 * 2 = 6 samples; test: 1 * 2 = 2
    EXPECT_TRUE(file_exists(dir + "/a_valid_indexmap_6ns_8sl_5s_packedpi_ac_sample_idx.npy"));
    EXPECT_TRUE(file_exists(dir + "/a_test_indexmap_2ns_8sl_5s_packedpi_ac_shuffle_idx.npy"));
    const auto& test_ds = split->datasets[2];
    EXPECT_EQ(test_ds->request().documents.begin, 39);

    GptNeoxDataArgs lists = args;
    lists.data_path.clear();
    lists.train_data_paths = {dir + "/a", dir + "/b"};
    lists.valid_data_paths = {dir + "/b"};
    lists.test_data_paths = {dir + "/b"};
    lists.train_data_weights = {1.0, 3.0};
    auto blended = gpt_neox_build_datasets(lists, open);
    ASSERT_TRUE(blended.ok()) << blended.status().to_string();
    // train: 20 samples * (0.25, 0.75) * 1.005 -> ceil 5.025 = 6, ceil 15.075 = 16
    EXPECT_TRUE(file_exists(dir + "/a_train_0_indexmap_6ns_8sl_5s_packedpi_ac_doc_idx.npy"));
    EXPECT_TRUE(file_exists(dir + "/b_train_1_indexmap_16ns_8sl_5s_packedpi_ac_doc_idx.npy"));
    EXPECT_TRUE(file_exists(dir + "/b_valid_0_indexmap_7ns_8sl_5s_packedpi_ac_doc_idx.npy"));

    // Labels: per-dataset label files in parallel (here a file of the same shape).
    lists.train_data_paths = {dir + "/a"};
    lists.train_data_weights.clear();
    lists.train_label_data_paths = {dir + "/a_label"};
    auto labelled = gpt_neox_build_datasets(lists, open);
    ASSERT_TRUE(labelled.ok()) << labelled.status().to_string();
    ASSERT_TRUE(labelled->train()->has_labels());
    EXPECT_FALSE(labelled->valid()->has_labels());
    Sample s;
    ASSERT_TRUE(labelled->train()->get(s, 3).ok());
    for (size_t k = 0; k < s.tokens.size(); ++k) {
        EXPECT_EQ(s.labels[k], s.tokens[k] + 200000);  // the same position of file 3
    }
    // A label file that does not line up with its token file.
    lists.train_label_data_paths = {dir + "/b"};
    auto misaligned = gpt_neox_build_datasets(lists, open);
    ASSERT_FALSE(misaligned.ok());
    EXPECT_NE(misaligned.status().message().find(dir + "/b"), std::string::npos)
        << misaligned.status().message();
}

TEST(GptNeoxDatasets, ArgumentErrorsNameTheArgument) {
    auto open = [](const std::string& prefix) -> Result<std::unique_ptr<TokenDocuments>> {
        return corpus(1, 10, 5);
    };
    GptNeoxDataArgs args;
    args.train_iters = 1;
    auto none = gpt_neox_build_datasets(args, open);
    ASSERT_FALSE(none.ok());
    EXPECT_NE(none.status().message().find("data_path"), std::string::npos);
    args.data_path = "x";
    args.train_data_paths = {"y"};
    EXPECT_FALSE(gpt_neox_build_datasets(args, open).ok());
    args.data_path.clear();
    args.valid_data_paths = {"y"};
    args.test_data_paths = {"y"};
    args.train_data_weights = {1.0, 2.0};
    auto weights = gpt_neox_build_datasets(args, open);
    ASSERT_FALSE(weights.ok());
    EXPECT_NE(weights.status().message().find("train_data_weights"), std::string::npos);
    args.train_data_weights.clear();
    args.train_epochs = 1;
    auto both = gpt_neox_build_datasets(args, open);
    ASSERT_FALSE(both.ok());
    EXPECT_NE(both.status().message().find("train_iters"), std::string::npos);
}

}  // namespace
}  // namespace lathe
