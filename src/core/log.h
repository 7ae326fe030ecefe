#pragma once
// Logging to stderr: "HH:MM:SS level message". One process-wide level, set once by cli/ from
// --verbose/--quiet before any work starts; messages below it cost one comparison.

#include <fmt/format.h>

#include <string_view>

namespace lathe {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3, kSilent = 4 };

void log_set_level(LogLevel level);
LogLevel log_level();
void log_write(LogLevel level, std::string_view message);

template <typename... Args>
void log_debug(fmt::format_string<Args...> f, Args&&... args) {
    if (log_level() <= LogLevel::kDebug)
        log_write(LogLevel::kDebug, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void log_info(fmt::format_string<Args...> f, Args&&... args) {
    if (log_level() <= LogLevel::kInfo)
        log_write(LogLevel::kInfo, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void log_warning(fmt::format_string<Args...> f, Args&&... args) {
    if (log_level() <= LogLevel::kWarning)
        log_write(LogLevel::kWarning, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void log_error(fmt::format_string<Args...> f, Args&&... args) {
    if (log_level() <= LogLevel::kError)
        log_write(LogLevel::kError, fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace lathe
