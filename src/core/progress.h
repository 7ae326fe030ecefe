#pragma once
// Progress display for long work: bytes, items (documents, steps), rate and ETA.
// On a terminal it redraws one line in place, a few times a second; otherwise (a log file, CI)
// it prints a plain line every `plain_interval_s` seconds. Thread-safe: workers call add().

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>

namespace lathe {

class Progress {
public:
    // total_bytes = 0 when unknown (stdin, compressed input): no ETA then, just rates.
    Progress(std::string label, uint64_t total_bytes, std::string item_name = "docs",
             double plain_interval_s = 10.0);
    ~Progress();
    Progress(const Progress&) = delete;
    Progress& operator=(const Progress&) = delete;

    void add(uint64_t bytes, uint64_t items);
    // Prints the final line (always, terminal or not).
    void finish();

    uint64_t bytes() const { return bytes_.load(); }
    uint64_t items() const { return items_.load(); }
    double elapsed_s() const;

    // Formats "12.3 MB", "1.2 GB"...; shared so every report reads the same.
    static std::string format_bytes(double bytes);
    static std::string format_count(double count);       // "1.2M", "34.5k"
    static std::string format_duration(double seconds);  // "1h02m", "3m05s", "12s"

private:
    void maybe_print(bool force);
    std::string line() const;

    std::string label_;
    std::string item_name_;
    uint64_t total_bytes_;
    double plain_interval_s_;
    bool tty_;
    bool finished_ = false;
    std::atomic<uint64_t> bytes_{0};
    std::atomic<uint64_t> items_{0};
    std::chrono::steady_clock::time_point start_;
    std::chrono::steady_clock::time_point last_print_;
    std::mutex print_mutex_;
};

}  // namespace lathe
