#pragma once
// The watchdog: a thread that bounds every blocking wait on other ranks, so that a rank that died,
// hangs or ran out of memory stops the job with a message instead of leaving the others waiting
// forever.
//
// The code that waits on other ranks (a collective, a stream synchronization after one, a barrier)
// arms the watchdog around the wait:
//
//   Watchdog watchdog(comm, std::chrono::seconds(settings.timeout_s), rank_description(*comm));
//   ...
//   {
//       auto guard = watchdog.arm("all-reduce of the gradients");   // RAII
//       LATHE_RETURN_IF_ERROR(comm->all_reduce(...));
//       cuda_state.synchronize(comm_stream);
//   }                                                                // disarmed
//
// While at least one guard is armed the thread wakes every min(100 ms, timeout / 4) and fires when
//   - the oldest armed guard has been armed longer than the timeout, or
//   - the communicator reports an asynchronous error (Communicator::async_error: NCCL's
//     ncclCommGetAsyncError, e.g. a peer whose connection dropped).
// Firing prints ONE line to stderr and ends the process:
//   lathe: error: WHO: WHAT did not complete within T s (parallel.timeout_s); another rank has
//   probably died, hung or run out of memory: look for its error above or in the launcher's output
// (or "WHAT failed: ERROR; another rank has ..." for an asynchronous error), then
// Communicator::abort() (NCCL: ncclCommAbort; MPI: MPI_Abort, which ends every rank of the job),
// given at most kAbortGrace to return, then std::_Exit(kWatchdogExitCode) without running
// destructors or atexit handlers (they could wait on the dead communicator again). From the
// firing on, a LATHE_CHECK that fails on another thread (the thread that waited, meeting the CUDA
// error of the aborted collective's kernels first) also exits with kWatchdogExitCode
// (set_check_exit_code, core/check.h), not SIGABRT: the process ends with the watchdog's code
// whichever thread gets there first.
// WHO names this process ("rank 1 of 4 on host gpu07", rank_description), WHAT the wait, as armed.
// A timeout of 0 turns the watchdog off: no thread, arm() does nothing.
//
// Cost: arm() and a guard's release each take an uncontended mutex and touch a small vector (no
// allocation once the vector has grown, none for a `const char*` WHAT); the thread sleeps between
// checks and calls async_error() only while armed. Guards may be armed from several threads and
// nested; each one is checked against its own deadline.
//
// Ownership: the trainer owns the Watchdog; the communicator must outlive it (the destructor stops
// and joins the thread); a guard must not outlive its Watchdog.

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "dist/communicator.h"

namespace lathe {

// The exit status of a process the watchdog ended: kCommAbortExitCode (124, as timeout(1) gives).
inline constexpr int kWatchdogExitCode = kCommAbortExitCode;

// How long the watchdog waits for Communicator::abort() before it exits anyway.
inline constexpr std::chrono::seconds kAbortGrace{10};

// "rank R of N on host H" for WHO: the communicator's rank and size, gethostname.
std::string rank_description(const Communicator& comm);

class Watchdog {
public:
    using Clock = std::chrono::steady_clock;

    // An armed wait: disarmed when destroyed. Neither copied nor moved (arm() returns it by
    // guaranteed copy elision: `auto guard = watchdog.arm(...)`).
    class Guard {
    public:
        Guard(const Guard&) = delete;
        Guard& operator=(const Guard&) = delete;
        ~Guard();

    private:
        friend class Watchdog;
        Guard(Watchdog* watchdog, const char* what, std::string owned);
        Watchdog* watchdog_;  // null: the watchdog is off
        std::string owned_;   // WHAT when the caller handed over a std::string
        const char* what_;
        Clock::time_point deadline_;
    };

    // comm may be null (nothing to poll or abort). timeout 0 = off.
    Watchdog(Communicator* comm, std::chrono::milliseconds timeout, std::string who);
    ~Watchdog();
    Watchdog(const Watchdog&) = delete;
    Watchdog& operator=(const Watchdog&) = delete;

    // Arms a wait described by `what`: a string that outlives the guard (a literal; not copied)...
    Guard arm(const char* what);
    // ...or one the guard keeps.
    Guard arm(std::string what);

    bool enabled() const { return timeout_.count() > 0; }
    std::chrono::milliseconds timeout() const { return timeout_; }

private:
    void add(Guard* guard);
    void remove(Guard* guard);
    void run();
    [[noreturn]] void fire(const std::string& line);

    Communicator* comm_;
    std::chrono::milliseconds timeout_;
    std::chrono::milliseconds poll_;
    std::string who_;
    std::mutex mu_;
    std::condition_variable wake_;
    bool stop_ = false;
    std::vector<Guard*> armed_;  // guarded by mu_
    std::thread thread_;
};

}  // namespace lathe
