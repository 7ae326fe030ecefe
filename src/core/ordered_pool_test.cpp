#include "core/ordered_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

namespace lathe {
namespace {

struct Item {
    int in = -1;
    int out = -1;
};

// Reads 0..n-1; work squares after a delay that makes later batches finish first; records what
// was written, and the most batches read but not yet written at any time.
struct PoolRun {
    int n = 0;
    int fail_at = -1;       // work fails on this batch
    int read_fail_at = -1;  // read fails when asked for this batch
    int next = 0;
    int written_count = 0;
    int max_pending = 0;
    std::vector<int> written;

    Status go(int threads) {
        auto make_worker = [this] {
            return [this](Item& b) -> Status {
                std::this_thread::sleep_for(std::chrono::microseconds(50 * ((n - b.in) % 7)));
                if (b.in == fail_at) return invalid_argument_error("batch {} failed", b.in);
                b.out = b.in * b.in;
                return ok_status();
            };
        };
        auto read = [this](Item& b) -> Result<bool> {
            if (next == read_fail_at) return io_error("read {} failed", next);
            if (next == n) return false;
            b.in = next++;
            b.out = -1;
            max_pending = std::max(max_pending, next - written_count);
            return true;
        };
        auto write = [this](Item& b) -> Status {
            written.push_back(b.out);
            ++written_count;
            return ok_status();
        };
        return ordered_parallel_map<Item>(threads, make_worker, read, write);
    }
};

std::vector<int> squares(int n) {
    std::vector<int> v;
    for (int i = 0; i < n; ++i) v.push_back(i * i);
    return v;
}

TEST(OrderedPool, WritesInInputOrder) {
    for (int threads : {1, 2, 4}) {
        PoolRun r;
        r.n = 200;
        ASSERT_TRUE(r.go(threads).ok()) << threads;
        EXPECT_EQ(r.written, squares(200)) << threads;
        // At most 2 batches per worker are read and not yet written (1 on the calling thread).
        EXPECT_LE(r.max_pending, threads <= 1 ? 1 : 2 * threads) << threads;
    }
}

TEST(OrderedPool, FirstFailingBatchStopsTheRun) {
    for (int threads : {1, 3}) {
        PoolRun r;
        r.n = 100;
        r.fail_at = 37;
        Status s = r.go(threads);
        EXPECT_EQ(s.message(), "batch 37 failed") << threads;
        EXPECT_EQ(r.written, squares(37)) << threads;
    }
}

TEST(OrderedPool, ReadErrorIsReturned) {
    for (int threads : {1, 2}) {
        PoolRun r;
        r.n = 50;
        r.read_fail_at = 20;
        Status s = r.go(threads);
        EXPECT_EQ(s.message(), "read 20 failed") << threads;
        EXPECT_LE(r.written.size(), 20u);
    }
}

TEST(OrderedPool, EmptyInput) {
    PoolRun r;
    EXPECT_TRUE(r.go(2).ok());
    EXPECT_TRUE(r.written.empty());
}

TEST(OrderedPool, EachWorkerIsMadeOnce) {
    std::atomic<int> made{0};
    int next = 0;
    int written = 0;
    auto make_worker = [&] {
        ++made;
        return [](int&) { return ok_status(); };
    };
    auto read = [&](int& b) -> Result<bool> {
        if (next == 64) return false;
        b = next++;
        return true;
    };
    auto write = [&](int&) {
        ++written;
        return ok_status();
    };
    ASSERT_TRUE(ordered_parallel_map<int>(3, make_worker, read, write).ok());
    EXPECT_EQ(made.load(), 3);
    EXPECT_EQ(written, 64);
}

}  // namespace
}  // namespace lathe
