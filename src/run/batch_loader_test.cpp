// BatchLoader: the loader thread hands out exactly the micro-batches filling them on the calling
// thread gives, in order, whatever the read-ahead depth; a read error reaches the caller with the
// micro-batch it belongs to; stopping early (a signal, an error elsewhere) ends the thread.

#include "run/batch_loader.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "data/sampling.h"

namespace lathe {
namespace {

// A sample source whose sample i is a pure function of i (two documents per sample, so the
// per-document ids are exercised), failing from index `fail_from` on as a truncated token file
// would; `delay` slows each read (the caller then waits on the loader).
class CountingSource final : public SampleSource {
public:
    CountingSource(int64_t size, int64_t T, int64_t fail_from = -1,
                   std::chrono::microseconds delay = {})
        : size_(size), T_(T), fail_from_(fail_from), delay_(delay) {}
    int64_t size() const override { return size_; }
    int64_t seq_length() const override { return T_; }
    bool has_labels() const override { return false; }
    Status get(Sample& out, int64_t index) const override {
        reads_.fetch_add(1);
        if (delay_.count() > 0) std::this_thread::sleep_for(delay_);
        if (fail_from_ >= 0 && index >= fail_from_)
            return data_loss_error("tokens.bin: document {} runs past the end of the file", index);
        out.tokens.resize(size_t(T_ + 1));
        for (int64_t t = 0; t <= T_; ++t)
            out.tokens[size_t(t)] = int32_t((index * 131 + t * 7) % 1000);
        out.labels.clear();
        const int64_t cut = 1 + index % (T_ - 1);
        out.documents = {{0, cut, index}, {cut, T_ + 1 - cut, index + 1}};
        return ok_status();
    }
    int64_t reads() const { return reads_.load(); }

private:
    int64_t size_, T_, fail_from_;
    std::chrono::microseconds delay_;
    mutable std::atomic<int64_t> reads_{0};
};

TEST(BatchLoader, HandsOutTheMicroBatchesOfTheSequentialOrder) {
    const int64_t B = 3, T = 8, size = 20;
    const CountingSource source(size, T);
    for (int depth : {1, 2, 5}) {
        for (bool per_doc : {false, true}) {
            BatchLoader loader(source, 4, 17, B, T, per_doc, depth);
            for (int64_t i = 4; i < 17; ++i) {
                Result<const BatchBuffers*> got = loader.next(i);
                ASSERT_TRUE(got.ok()) << got.status().to_string();
                BatchBuffers want;
                Result<int64_t> first = gpt_neox_micro_batch_start(i, B, 1, 0, size);
                ASSERT_TRUE(first.ok());
                ASSERT_TRUE(fill_batch(source, *first, B, T, per_doc, want).ok());
                EXPECT_EQ((*got)->tokens, want.tokens) << depth << " " << i;
                EXPECT_EQ((*got)->targets, want.targets) << depth << " " << i;
                EXPECT_EQ((*got)->docs, want.docs) << depth << " " << i;
                EXPECT_EQ((*got)->docs.empty(), !per_doc);
            }
        }
    }
}

TEST(BatchLoader, AReadErrorReachesTheCallerAtItsMicroBatch) {
    const int64_t B = 2, T = 6;
    // Samples from 9 on fail: micro-batches 0..3 (samples 0..7) are whole, 4 (8, 9) fails.
    const CountingSource source(40, T, 9);
    BatchLoader loader(source, 0, 10, B, T, false, 2);
    for (int64_t i = 0; i < 4; ++i) ASSERT_TRUE(loader.next(i).ok()) << i;
    Result<const BatchBuffers*> bad = loader.next(4);
    ASSERT_FALSE(bad.ok());
    EXPECT_EQ(bad.status().code(), StatusCode::kDataLoss);
    EXPECT_NE(bad.status().message().find("tokens.bin: document 9 runs past the end of the file"),
              std::string::npos)
        << bad.status().to_string();
}

TEST(BatchLoader, ADatasetSmallerThanABatchIsTheSameErrorAsOnTheCallingThread) {
    const CountingSource source(3, 6);
    BatchLoader loader(source, 0, 2, 4, 6, false);
    Result<const BatchBuffers*> bad = loader.next(0);
    ASSERT_FALSE(bad.ok());
    Result<int64_t> direct = gpt_neox_micro_batch_start(0, 4, 1, 0, 3);
    ASSERT_FALSE(direct.ok());
    EXPECT_EQ(bad.status().to_string(), direct.status().to_string());
}

TEST(BatchLoader, ReadsAheadAtMostDepthAndStopsWhenDestroyed) {
    const int64_t B = 2, T = 6;
    const CountingSource source(1000, T, -1, std::chrono::microseconds(200));
    {
        BatchLoader loader(source, 0, 400, B, T, false, 2);
        ASSERT_TRUE(loader.next(0).ok());
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        // Holding micro-batch 0, the thread filled 1 and 2 and waits: 3 micro-batches read.
        EXPECT_EQ(source.reads(), 3 * B);
    }  // destroyed with 397 micro-batches unread: must not hang
    EXPECT_LE(source.reads(), 4 * B);
}

}  // namespace
}  // namespace lathe
