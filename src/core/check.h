#pragma once
// Invariant checks: a broken invariant is a bug, not bad input, so it stops the process at once
// with file:line and the values involved. Bad input goes through Status (core/status.h).

#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>

namespace lathe {
namespace detail {
[[noreturn]] void check_failed(const char* file, int line, const char* cond,
                               const std::string& msg);
}  // namespace detail

// From the call on, a failed check still prints its line but ends the process with
// std::_Exit(code) instead of aborting. For a component that tears the process down on purpose
// (the watchdog, dist/watchdog.h, aborting a collective that other threads wait on): the checks
// that then fail on those threads (a CUDA error of the aborted collective's kernels) are
// consequences of the teardown, and the process must end with the teardown's code, not SIGABRT.
void set_check_exit_code(int code);
}  // namespace lathe

// LATHE_CHECK(n > 0, "n={}", n);
#define LATHE_CHECK(cond, ...)                                            \
    do {                                                                  \
        if (!(cond)) [[unlikely]]                                         \
            ::lathe::detail::check_failed(__FILE__, __LINE__, #cond,      \
                                          ::fmt::format("" __VA_ARGS__)); \
    } while (0)
