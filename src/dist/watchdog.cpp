#include "dist/watchdog.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <memory>

#include "core/check.h"
#include "dist/consistency.h"

namespace lathe {

namespace {

constexpr std::chrono::milliseconds kMaxPoll{100};

constexpr std::string_view kLikelyCause =
    "another rank has probably died, hung or run out of memory: look for its error above or in "
    "the launcher's output";

}  // namespace

std::string rank_description(const Communicator& comm) {
    return fmt::format("rank {} of {} on host {}", comm.rank(), comm.size(), host_name());
}

Watchdog::Guard::Guard(Watchdog* watchdog, const char* what, std::string owned)
    : watchdog_(watchdog), owned_(std::move(owned)), what_(what) {
    if (watchdog_ == nullptr) return;
    if (what_ == nullptr) what_ = owned_.c_str();
    deadline_ = Clock::now() + watchdog_->timeout_;
    watchdog_->add(this);
}

Watchdog::Guard::~Guard() {
    if (watchdog_ != nullptr) watchdog_->remove(this);
}

Watchdog::Watchdog(Communicator* comm, std::chrono::milliseconds timeout, std::string who)
    : comm_(comm),
      timeout_(std::max(timeout, std::chrono::milliseconds(0))),
      poll_(std::clamp(timeout_ / 4, std::chrono::milliseconds(1), kMaxPoll)),
      who_(std::move(who)) {
    if (enabled()) thread_ = std::thread([this] { run(); });
}

Watchdog::~Watchdog() {
    {
        std::lock_guard lock(mu_);
        LATHE_CHECK(armed_.empty(), "a watchdog destroyed with {} guards armed", armed_.size());
        stop_ = true;
    }
    wake_.notify_all();
    if (thread_.joinable()) thread_.join();
}

Watchdog::Guard Watchdog::arm(const char* what) {
    return Guard(enabled() ? this : nullptr, what, std::string());
}

Watchdog::Guard Watchdog::arm(std::string what) {
    if (!enabled()) return Guard(nullptr, nullptr, std::string());
    return Guard(this, nullptr, std::move(what));
}

void Watchdog::add(Guard* guard) {
    std::lock_guard lock(mu_);
    armed_.push_back(guard);
}

void Watchdog::remove(Guard* guard) {
    std::lock_guard lock(mu_);
    // Usually the last one (guards nest).
    auto it = std::find(armed_.rbegin(), armed_.rend(), guard);
    LATHE_CHECK(it != armed_.rend(), "a watchdog guard released twice");
    armed_.erase(std::next(it).base());
}

void Watchdog::run() {
    std::unique_lock lock(mu_);
    while (!stop_) {
        wake_.wait_for(lock, poll_);
        if (stop_ || armed_.empty()) continue;
        // The guard whose deadline comes first (the oldest, as every guard gets the same timeout).
        const Guard* first = *std::min_element(
            armed_.begin(), armed_.end(),
            [](const Guard* a, const Guard* b) { return a->deadline_ < b->deadline_; });
        if (Clock::now() >= first->deadline_) {
            const std::string line = fmt::format(
                "lathe: error: {}: {} did not complete within {:g} s (parallel.timeout_s); {}",
                who_, first->what_, std::chrono::duration<double>(timeout_).count(), kLikelyCause);
            lock.unlock();
            fire(line);
        }
        if (comm_ == nullptr) continue;
        // Polled without the lock, so that arming never waits for the library.
        const std::string what = first->what_;
        lock.unlock();
        const Status error = comm_->async_error();
        if (!error.ok())
            fire(fmt::format("lathe: error: {}: {} failed: {}; {}", who_, what, error.message(),
                             kLikelyCause));
        lock.lock();
    }
}

void Watchdog::fire(const std::string& line) {
    std::fprintf(stderr, "%s\n", line.c_str());
    std::fflush(stderr);
    // A check that fails on another thread from here on (the waiting thread meeting the aborted
    // collective's CUDA error before this thread exits) ends the process with this code too.
    set_check_exit_code(kWatchdogExitCode);
    if (comm_ != nullptr) {
        // abort() may itself hang on a dead peer: it runs on a thread of its own, given a grace.
        auto done = std::make_shared<std::atomic<bool>>(false);
        std::thread([comm = comm_, done] {
            comm->abort();
            done->store(true);
        }).detach();
        const auto give_up = Clock::now() + kAbortGrace;
        while (!done->load() && Clock::now() < give_up)
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    std::_Exit(kWatchdogExitCode);
}

}  // namespace lathe
