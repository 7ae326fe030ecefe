#include "run/metrics.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <utility>

#include "core/log.h"
#include "core/strings.h"
#include "io/file.h"
#include "io/json.h"

namespace lathe {
namespace {

std::string json_number(double v) {
    if (std::isnan(v)) return "NaN";  // JSON has no NaN; Python's json reads this spelling
    if (std::isinf(v)) return v > 0 ? "Infinity" : "-Infinity";
    return fmt::format("{:.17g}", v);
}

std::string json_number(float v) {
    if (!std::isfinite(v)) return json_number(static_cast<double>(v));
    return fmt::format("{:.9g}", v);  // round-trips a float exactly
}

}  // namespace

std::string metrics_line(const std::vector<std::pair<std::string, MetricValue>>& fields) {
    std::string out = "{";
    for (size_t i = 0; i < fields.size(); ++i) {
        if (i > 0) out += ", ";
        out += nlohmann::json(fields[i].first).dump();
        out += ": ";
        const MetricValue& v = fields[i].second;
        if (const auto* n = std::get_if<int64_t>(&v))
            out += std::to_string(*n);
        else if (const auto* d = std::get_if<double>(&v))
            out += json_number(*d);
        else if (const auto* f = std::get_if<float>(&v))
            out += json_number(*f);
        else
            out += nlohmann::json(std::get<std::string>(v)).dump();
    }
    out += "}";
    return out;
}

Result<MetricsLog> MetricsLog::open(const std::string& path, int64_t keep_through_step) {
    std::string kept;
    if (keep_through_step >= 0 && file_exists(path)) {
        LATHE_ASSIGN_OR_RETURN(std::string text, file_read_all(path));
        const std::vector<std::string_view> lines = split(text, '\n');
        size_t last = 0;  // 1 + the index of the last non-blank line
        for (size_t i = 0; i < lines.size(); ++i)
            if (!trim(lines[i]).empty()) last = i + 1;
        for (size_t i = 0; i < last; ++i) {
            const std::string_view line = lines[i];
            if (trim(line).empty()) continue;
            const auto j = json_parse<nlohmann::json>(line);
            if (j.is_discarded() || !j.is_object() || !j.contains("step") ||
                !j["step"].is_number_integer()) {
                // The last line cut by a kill mid-write: dropped. Any other: the file was edited
                // or damaged there; the lines after it are the run's and are kept.
                if (i + 1 == last) break;
                log_warning(
                    "{}:{}: not a metrics line (no integer \"step\"); dropped, the lines "
                    "after it kept",
                    path, i + 1);
                continue;
            }
            if (j["step"].get<int64_t>() > keep_through_step) break;
            kept.append(line);
            kept.push_back('\n');
        }
    }
    if (keep_through_step >= 0) {
        LATHE_RETURN_IF_ERROR(file_write_atomic(path, kept));
    } else {
        LATHE_RETURN_IF_ERROR(file_write_atomic(path, ""));
    }
    MetricsLog m;
    m.path_ = path;
    m.file_ = std::fopen(path.c_str(), "ab");
    if (m.file_ == nullptr)
        return io_error("{}: cannot open for appending: {}", path, std::strerror(errno));
    return m;
}

MetricsLog::MetricsLog(MetricsLog&& other) noexcept
    : path_(std::move(other.path_)), file_(std::exchange(other.file_, nullptr)) {}

MetricsLog& MetricsLog::operator=(MetricsLog&& other) noexcept {
    if (this != &other) {
        if (file_ != nullptr) std::fclose(file_);
        path_ = std::move(other.path_);
        file_ = std::exchange(other.file_, nullptr);
    }
    return *this;
}

MetricsLog::~MetricsLog() {
    if (file_ != nullptr) std::fclose(file_);
}

Status MetricsLog::write(const std::vector<std::pair<std::string, MetricValue>>& fields) {
    if (file_ == nullptr) return failed_precondition_error("metrics log is not open");
    const std::string line = metrics_line(fields) + "\n";
    if (std::fwrite(line.data(), 1, line.size(), file_) != line.size() || std::fflush(file_) != 0) {
        return io_error("{}: write failed: {}", path_, std::strerror(errno));
    }
    return ok_status();
}

}  // namespace lathe
