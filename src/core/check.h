#pragma once
// Invariant checks: a broken invariant is a bug, not bad input, so it stops the process at once
// with file:line and the values involved. Bad input goes through Status (core/status.h).

#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>

namespace lathe::detail {
[[noreturn]] void check_failed(const char* file, int line, const char* cond,
                               const std::string& msg);
}  // namespace lathe::detail

// LATHE_CHECK(n > 0, "n={}", n);
#define LATHE_CHECK(cond, ...)                                            \
    do {                                                                  \
        if (!(cond)) [[unlikely]]                                         \
            ::lathe::detail::check_failed(__FILE__, __LINE__, #cond,      \
                                          ::fmt::format("" __VA_ARGS__)); \
    } while (0)
