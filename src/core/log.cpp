#include "core/log.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <mutex>

namespace lathe {
namespace {
std::atomic<LogLevel> g_level{LogLevel::kInfo};  // process-wide setting, written once by cli/
std::mutex g_write_mutex;                        // keeps concurrent lines whole
const char* level_tag(LogLevel level) {
    switch (level) {
        case LogLevel::kDebug:
            return "debug";
        case LogLevel::kInfo:
            return "info ";
        case LogLevel::kWarning:
            return "warn ";
        case LogLevel::kError:
            return "error";
        case LogLevel::kSilent:
            return "";
    }
    return "";
}
}  // namespace

void log_set_level(LogLevel level) {
    g_level.store(level, std::memory_order_relaxed);
}
LogLevel log_level() {
    return g_level.load(std::memory_order_relaxed);
}

void log_write(LogLevel level, std::string_view message) {
    const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
    std::tm tm{};
    localtime_r(&now, &tm);
    std::lock_guard<std::mutex> lock(g_write_mutex);
    std::fprintf(stderr, "%02d:%02d:%02d %s %.*s\n", tm.tm_hour, tm.tm_min, tm.tm_sec,
                 level_tag(level), static_cast<int>(message.size()), message.data());
    std::fflush(stderr);
}

}  // namespace lathe
