#include "dist/watchdog.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "core/check.h"

namespace lathe {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

// A communicator of two ranks that moves nothing: its asynchronous error is whatever the test set,
// and abort() says on stderr that it ran (or, with abort_fails_a_check, fails a LATHE_CHECK as the
// thread waiting on an aborted NCCL collective may).
class FakeCommunicator final : public Communicator {
public:
    explicit FakeCommunicator(Status async = ok_status(), bool abort_fails_a_check = false)
        : async_(std::move(async)), abort_fails_(abort_fails_a_check) {}
    int rank() const override { return 0; }
    int size() const override { return 2; }
    std::string_view backend() const override { return "fake"; }
    bool accepts(Device) const override { return true; }
    Status async_error() override { return async_; }
    void abort() override {
        LATHE_CHECK(!abort_fails_, "the aborted collective's CUDA error");
        std::fprintf(stderr, "fake communicator aborted\n");
    }

private:
    Status do_all_reduce(TensorView, ConstTensorView, ReduceOp, CUstream_st*) override {
        LATHE_CHECK(false, "unused");
        return ok_status();
    }
    Status do_reduce_scatter(TensorView, ConstTensorView, ReduceOp, CUstream_st*) override {
        LATHE_CHECK(false, "unused");
        return ok_status();
    }
    Status do_all_gather(TensorView, ConstTensorView, CUstream_st*) override {
        LATHE_CHECK(false, "unused");
        return ok_status();
    }
    Status do_broadcast(TensorView, int, CUstream_st*) override {
        LATHE_CHECK(false, "unused");
        return ok_status();
    }
    Result<std::unique_ptr<Communicator>> do_split(int, int) override {
        LATHE_CHECK(false, "unused");
        return std::unique_ptr<Communicator>();
    }
    Status async_;
    bool abort_fails_;
};

constexpr const char* kWho = "rank 0 of 2 on host testhost";

// A wait that never completes within the test (the watchdog must end it long before).
void hang() {
    std::this_thread::sleep_for(std::chrono::seconds(30));
}

double seconds_since(Clock::time_point start) {
    return std::chrono::duration<double>(Clock::now() - start).count();
}

class WatchdogDeathTest : public ::testing::Test {
protected:
    // The child re-runs the test binary up to the death test: no thread of this process leaks in.
    void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

TEST_F(WatchdogDeathTest, ATimeoutPrintsOneLineAbortsAndExits) {
    const auto start = Clock::now();
    EXPECT_EXIT(
        {
            FakeCommunicator comm;
            Watchdog watchdog(&comm, milliseconds(200), kWho);
            auto guard = watchdog.arm(std::string("all-reduce of layer 5's gradients"));
            hang();
        },
        ::testing::ExitedWithCode(kWatchdogExitCode),
        "^lathe: error: rank 0 of 2 on host testhost: all-reduce of layer 5's gradients did not "
        "complete within 0\\.2 s \\(parallel\\.timeout_s\\); another rank has probably died, hung "
        "or run out of memory: look for its error above or in the launcher's output\n"
        "fake communicator aborted\n$");
    // The child started, waited 0.2 s and a poll (50 ms), and ended: far from the 30 s hang.
    EXPECT_LT(seconds_since(start), 10.0);
}

// The waiting thread may meet the aborted collective first: a check failing there once the
// watchdog has fired (here: in the communicator's abort, before the watchdog's own exit) ends
// the process with the watchdog's code, not SIGABRT.
TEST_F(WatchdogDeathTest, ACheckFailingAfterTheFiringExitsWithTheWatchdogsCode) {
    EXPECT_EXIT(
        {
            FakeCommunicator comm(ok_status(), /*abort_fails_a_check=*/true);
            Watchdog watchdog(&comm, milliseconds(200), kWho);
            auto guard = watchdog.arm(std::string("step 13"));
            hang();
        },
        ::testing::ExitedWithCode(kWatchdogExitCode),
        "did not complete within 0\\.2 s(.|\n)*internal check failed at .*the aborted "
        "collective's CUDA error\n$");
}

TEST_F(WatchdogDeathTest, AnAsynchronousErrorEndsTheWaitAtOnce) {
    const auto start = Clock::now();
    EXPECT_EXIT(
        {
            FakeCommunicator comm(internal_error(
                "NCCL (asynchronous error): NCCL error 6 (remote process exited or there was a "
                "network error)"));
            Watchdog watchdog(&comm, milliseconds(600'000), kWho);
            auto guard = watchdog.arm("barrier before the checkpoint");
            hang();
        },
        ::testing::ExitedWithCode(kWatchdogExitCode),
        "^lathe: error: rank 0 of 2 on host testhost: barrier before the checkpoint failed: NCCL "
        "\\(asynchronous error\\): NCCL error 6 \\(remote process exited or there was a network "
        "error\\); another rank has probably died.*\nfake communicator aborted\n$");
    // Found by the first poll (100 ms), not by the ten-minute timeout.
    EXPECT_LT(seconds_since(start), 10.0);
}

TEST_F(WatchdogDeathTest, TheOldestOfNestedGuardsIsNamed) {
    EXPECT_EXIT(
        {
            Watchdog watchdog(nullptr, milliseconds(300), kWho);
            auto outer = watchdog.arm("checkpoint commit");
            std::this_thread::sleep_for(milliseconds(100));
            { auto inner = watchdog.arm("barrier"); }
            auto later = watchdog.arm("all-gather of the shards");
            hang();
        },
        ::testing::ExitedWithCode(kWatchdogExitCode),
        "^lathe: error: [^\n]*: checkpoint commit did not complete within 0\\.3 s[^\n]*\n$");
}

TEST_F(WatchdogDeathTest, GuardsReleasedInTimeDoNothing) {
    EXPECT_EXIT(
        {
            // The communicator reports an error, but only armed waits look at it.
            FakeCommunicator comm(internal_error("a peer is gone"));
            Watchdog watchdog(&comm, milliseconds(100), kWho);
            for (int i = 0; i < 3; ++i) {
                auto guard = watchdog.arm("a quick wait");
            }
            std::this_thread::sleep_for(milliseconds(400));  // four timeouts, nothing armed
            std::fprintf(stderr, "still here\n");
            std::_Exit(0);
        },
        ::testing::ExitedWithCode(0), "^still here\n$");
}

TEST(Watchdog, ZeroTimeoutIsOff) {
    FakeCommunicator comm(internal_error("a peer is gone"));
    Watchdog watchdog(&comm, milliseconds(0), kWho);
    EXPECT_FALSE(watchdog.enabled());
    auto guard = watchdog.arm(std::string("anything"));
    std::this_thread::sleep_for(milliseconds(150));
    SUCCEED() << "not ended";
}

TEST(Watchdog, StopsPromptly) {
    // The destructor wakes the thread instead of waiting out its 100 ms poll: five watchdogs,
    // each destroyed while its thread sleeps, take about 5 x 20 ms, not 5 x 100 ms.
    const auto start = Clock::now();
    for (int i = 0; i < 5; ++i) {
        Watchdog watchdog(nullptr, milliseconds(600'000), kWho);
        EXPECT_TRUE(watchdog.enabled());
        EXPECT_EQ(watchdog.timeout(), milliseconds(600'000));
        auto guard = watchdog.arm("a wait");
        std::this_thread::sleep_for(milliseconds(20));
    }
    EXPECT_LT(seconds_since(start), 0.35);
}

TEST(Watchdog, RankDescriptionNamesRankSizeAndHost) {
    FakeCommunicator comm;
    const std::string d = rank_description(comm);
    EXPECT_EQ(d.rfind("rank 0 of 2 on host ", 0), 0u) << d;
    EXPECT_GT(d.size(), std::string("rank 0 of 2 on host ").size()) << d;
}

}  // namespace
}  // namespace lathe
