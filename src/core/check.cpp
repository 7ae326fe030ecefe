#include "core/check.h"

#include <atomic>

namespace lathe {
namespace {

std::atomic<int> check_exit_code{0};  // 0: abort

}  // namespace

void set_check_exit_code(int code) {
    check_exit_code.store(code);
}

namespace detail {

void check_failed(const char* file, int line, const char* cond, const std::string& msg) {
    std::fprintf(stderr, "lathe: internal check failed at %s:%d: %s%s%s\n", file, line, cond,
                 msg.empty() ? "" : ": ", msg.c_str());
    std::fflush(stderr);
    if (const int code = check_exit_code.load(); code != 0) std::_Exit(code);
    std::abort();
}

}  // namespace detail
}  // namespace lathe
