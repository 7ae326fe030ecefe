#pragma once
// DIR/metrics.jsonl: one JSON object per logged step, appended and flushed line by line so that a
// killed run keeps every line it printed. Floats are written with 9 significant digits
// (max_digits10 for float), so a loss read back parses to the same float bit for bit.
//
// On resume the file is cut back to the lines whose step is <= the checkpoint's step, so a resumed
// run's file reads as if the run had never stopped.

#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "core/status.h"

namespace lathe {

using MetricValue = std::variant<int64_t, double, float, std::string>;

class MetricsLog {
public:
    // Opens DIR/metrics.jsonl for appending, first dropping lines with "step" > keep_through_step
    // (pass -1 to start empty).
    static Result<MetricsLog> open(const std::string& path, int64_t keep_through_step);
    MetricsLog() = default;
    MetricsLog(MetricsLog&& other) noexcept;
    MetricsLog& operator=(MetricsLog&& other) noexcept;
    MetricsLog(const MetricsLog&) = delete;
    MetricsLog& operator=(const MetricsLog&) = delete;
    ~MetricsLog();

    // Appends {"k": v, ...} in the given order and flushes.
    Status write(const std::vector<std::pair<std::string, MetricValue>>& fields);

private:
    std::string path_;
    std::FILE* file_ = nullptr;
};

// The JSON text of one line (exposed for tests).
std::string metrics_line(const std::vector<std::pair<std::string, MetricValue>>& fields);

}  // namespace lathe
