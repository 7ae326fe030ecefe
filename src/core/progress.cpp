#include "core/progress.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>

namespace lathe {

Progress::Progress(std::string label, uint64_t total_bytes, std::string item_name,
                   double plain_interval_s)
    : label_(std::move(label)),
      item_name_(std::move(item_name)),
      total_bytes_(total_bytes),
      plain_interval_s_(plain_interval_s),
      tty_(isatty(STDERR_FILENO) == 1),
      start_(std::chrono::steady_clock::now()),
      last_print_(start_) {}

Progress::~Progress() {
    if (tty_ && !finished_) std::fputc('\n', stderr);
}

double Progress::elapsed_s() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

void Progress::add(uint64_t bytes, uint64_t items) {
    bytes_.fetch_add(bytes, std::memory_order_relaxed);
    items_.fetch_add(items, std::memory_order_relaxed);
    maybe_print(false);
}

std::string Progress::format_bytes(double bytes) {
    const char* units[] = {"B", "kB", "MB", "GB", "TB"};
    int u = 0;
    while (bytes >= 1000.0 && u < 4) {
        bytes /= 1000.0;
        ++u;
    }
    return u == 0 ? fmt::format("{:.0f} {}", bytes, units[u])
                  : fmt::format("{:.1f} {}", bytes, units[u]);
}

std::string Progress::format_count(double count) {
    if (count >= 1e9) return fmt::format("{:.2f}G", count / 1e9);
    if (count >= 1e6) return fmt::format("{:.2f}M", count / 1e6);
    if (count >= 1e4) return fmt::format("{:.1f}k", count / 1e3);
    return fmt::format("{:.0f}", count);
}

std::string Progress::format_duration(double seconds) {
    const long s = static_cast<long>(seconds + 0.5);
    if (s >= 3600) return fmt::format("{}h{:02d}m", s / 3600, static_cast<int>((s % 3600) / 60));
    if (s >= 60) return fmt::format("{}m{:02d}s", s / 60, static_cast<int>(s % 60));
    return fmt::format("{}s", s);
}

std::string Progress::line() const {
    const double t = std::max(elapsed_s(), 1e-9);
    const double b = static_cast<double>(bytes_.load());
    const double n = static_cast<double>(items_.load());
    std::string out =
        fmt::format("{}: {} {}, {} ({}/s, {} {}/s)", label_, format_count(n), item_name_,
                    format_bytes(b), format_bytes(b / t), format_count(n / t), item_name_);
    if (total_bytes_ > 0) {
        const double frac = std::min(1.0, b / static_cast<double>(total_bytes_));
        out += fmt::format(" {:.1f}%", 100.0 * frac);
        if (frac > 0.0 && frac < 1.0) out += " ETA " + format_duration(t * (1.0 - frac) / frac);
    }
    out += " elapsed " + format_duration(t);
    return out;
}

void Progress::maybe_print(bool force) {
    const auto now = std::chrono::steady_clock::now();
    const double since = std::chrono::duration<double>(now - last_print_).count();
    const double interval = tty_ ? 0.25 : plain_interval_s_;
    if (!force && since < interval) return;
    std::unique_lock<std::mutex> lock(print_mutex_, std::try_to_lock);
    if (!lock.owns_lock()) return;
    last_print_ = now;
    const std::string text = line();
    if (tty_) {
        std::fprintf(stderr, "\r\033[K%s", text.c_str());
    } else {
        std::fprintf(stderr, "%s\n", text.c_str());
    }
    std::fflush(stderr);
}

void Progress::finish() {
    if (finished_) return;
    std::lock_guard<std::mutex> lock(print_mutex_);
    finished_ = true;
    const std::string text = line();
    if (tty_) {
        std::fprintf(stderr, "\r\033[K%s\n", text.c_str());
    } else {
        std::fprintf(stderr, "%s\n", text.c_str());
    }
    std::fflush(stderr);
}

}  // namespace lathe
