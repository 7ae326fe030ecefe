#include "align/sgns.h"

#include <gtest/gtest.h>

#include <cmath>

#include "align/embed_test_util.h"
#include "align/sgns_step.h"

namespace lathe {
namespace {

using embedtest::write_docs;

EmbedVocab vocab_of(const IndexedDataset& data, int64_t min_count) {
    auto v = embed_count_vocab(data, min_count, 1);
    LATHE_CHECK(v.ok(), "{}", v.status().to_string());
    return std::move(v).value();
}

TEST(Sgns, TablesFollowFastText) {
    const auto data = write_docs("sgns_tables", embedtest::zipf_docs(300, 50, 100, 2));
    const EmbedVocab vocab = vocab_of(data, 1);
    SgnsOptions o;
    o.subsample = 1e-2;
    const SgnsTables t = sgns_make_tables(vocab, o);
    int64_t total = 0;
    for (int64_t c : vocab.count_of_row) total += c;
    for (size_t r = 0; r < vocab.count_of_row.size(); ++r) {
        const double f = double(vocab.count_of_row[r]) / double(total);
        EXPECT_FLOAT_EQ(t.keep[r], float(std::sqrt(1e-2 / f) + 1e-2 / f));
    }
    // Negatives: row r's share of the table ~ sqrt(count_r) / sum sqrt(count).
    std::vector<int64_t> seen(vocab.count_of_row.size(), 0);
    for (uint32_t r : t.negatives) ++seen[r];
    double z = 0;
    for (int64_t c : vocab.count_of_row) z += std::sqrt(double(c));
    for (size_t r = 0; r < seen.size(); ++r)
        EXPECT_NEAR(
            double(seen[r]) / double(t.negatives.size()),
            std::sqrt(double(vocab.count_of_row[r])) / z,
            0.01 * std::sqrt(double(vocab.count_of_row[r])) / z + 2.0 / double(t.negatives.size()));
    // Lookup tables against the functions.
    SgnsStepConfig c{};
    c.sigmoid = t.sigmoid.data();
    c.log = t.log.data();
    for (float x : {-9.0f, -3.0f, -0.1f, 0.0f, 0.7f, 5.0f, 9.0f})
        EXPECT_NEAR(sgns_sigmoid(c, x), 1.0 / (1.0 + std::exp(-x)), 0.02) << x;
    for (float x : {0.01f, 0.3f, 0.99f}) EXPECT_NEAR(sgns_log(c, x), std::log(x), 0.2) << x;
}

constexpr int kRing = 40;
constexpr int64_t kDim = 16;

struct RingRun {
    std::vector<double> losses;
    SgnsModel model;
    std::vector<int32_t> token_of_row;
};
RingRun train_ring(int threads, int epochs) {
    const auto data = write_docs("sgns_ring", embedtest::ring_docs(300, 40, kRing, 3));
    const EmbedVocab vocab = vocab_of(data, 5);
    auto corpus = sgns_load_corpus(data, vocab);
    LATHE_CHECK(corpus.ok());
    SgnsOptions o;
    o.dim = kDim;
    o.window = 3;
    o.epochs = epochs;
    o.threads = threads;
    o.subsample = 1e-2;  // 40 tokens of about equal frequency: keep about half of each
    const SgnsTables tables = sgns_make_tables(vocab, o);
    RingRun run;
    run.model = sgns_init(vocab.size(), kDim, 1);
    for (int e = 0; e < epochs; ++e)
        run.losses.push_back(sgns_epoch_hogwild_cpu(run.model, *corpus, tables, o, e));
    run.token_of_row = vocab.token_of_row;
    return run;
}

double ring_agreement(const RingRun& run) {
    return embedtest::nearest_neighbour_agreement(
        run.model.in, kDim, int64_t(run.token_of_row.size()), [&](int64_t a, int64_t b) {
            return embedtest::ring_distance(run.token_of_row[size_t(a)],
                                            run.token_of_row[size_t(b)], kRing) <= 2;
        });
}

TEST(Sgns, LearnsRingStructureAndLossFalls) {
    const RingRun one = train_ring(1, 10);
    EXPECT_LT(one.losses.back(), 0.9 * one.losses.front());
    EXPECT_GE(ring_agreement(one), 0.9);
    const RingRun again = train_ring(1, 10);
    EXPECT_EQ(again.model.in, one.model.in);  // one thread: deterministic
    const RingRun three = train_ring(3, 10);
    EXPECT_NEAR(three.losses.back(), one.losses.back(), 0.1 * one.losses.back());
    EXPECT_GE(ring_agreement(three), 0.9);
}

TEST(Sgns, InitialisationIsFastTexts) {
    const SgnsModel m = sgns_init(30, 10, 4);
    for (float v : m.in) {
        EXPECT_GE(v, -0.1f);
        EXPECT_LT(v, 0.1f);
    }
    for (float v : m.out) EXPECT_EQ(v, 0.0f);
}

}  // namespace
}  // namespace lathe
