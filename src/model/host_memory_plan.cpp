#include "model/host_memory_plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <fstream>
#include <sstream>

#include "core/strings.h"
#include "model/memory_plan.h"

namespace lathe {

const char* optimizer_offload_name(OptimizerOffload o) {
    return o == OptimizerOffload::kCpu ? "cpu" : "none";
}

const char* offload_schedule_name(OffloadSchedule s) {
    switch (s) {
        case OffloadSchedule::kSerial:
            return "serial";
        case OffloadSchedule::kOverlapped:
            return "overlapped";
        case OffloadSchedule::kDelayed:
            return "delayed";
    }
    return "?";
}

const char* adamw_state_dtype_name(AdamWStateDType d) {
    return d == AdamWStateDType::kBF16 ? "bf16" : "fp32";
}

size_t adamw_state_dtype_bytes(AdamWStateDType d) {
    return d == AdamWStateDType::kBF16 ? 2 : 4;
}

std::string HostMemoryPlan::to_string() const {
    std::string out =
        fmt::format("host memory plan (optimizer offload: {} of {} parameters on the CPU)\n",
                    offloaded_params, params);
    const auto row = [&](std::string_view name, int64_t bytes) {
        out += fmt::format("  {:<30} {:>16} B  {:>12}\n", name, bytes, format_bytes(size_t(bytes)));
    };
    row("masters (f32)", master_bytes);
    if (master_mirror_bytes > 0) row("master mirror (f32, GPU part)", master_mirror_bytes);
    row("moments", moment_bytes);
    row("gradient landing (f32)", grad_landing_bytes);
    row("weight staging (bf16)", weight_staging_bytes);
    row("total pinned", pinned_bytes());
    row("GPU bytes saved", gpu_bytes_saved);
    return out;
}

Result<HostMemoryPlan> host_memory_plan(int64_t params, int64_t offload_begin,
                                        const OffloadSettings& settings) {
    if (params < 0) return invalid_argument_error("host memory plan: {} parameters", params);
    if (offload_begin < 0 || offload_begin > params)
        return invalid_argument_error("host memory plan: offload from element {} of {}",
                                      offload_begin, params);
    if (!(settings.fraction > 0.0 && settings.fraction <= 1.0))
        return invalid_argument_error(
            "'optimizer.offload_fraction' must be in (0, 1] (the fraction of the parameters whose "
            "AdamW state lives in host memory), got {}",
            settings.fraction);
    HostMemoryPlan plan;
    plan.params = params;
    if (settings.offload == OptimizerOffload::kNone) return plan;
    const int64_t n = params - offload_begin;
    const int64_t state = int64_t(adamw_state_dtype_bytes(settings.state_dtype));
    plan.offloaded_params = n;
    plan.master_bytes = 4 * n;
    plan.master_mirror_bytes = 4 * offload_begin;
    plan.moment_bytes = 2 * state * n;
    plan.grad_landing_bytes = 4 * n;
    plan.weight_staging_bytes = 2 * n;
    plan.gpu_bytes_saved = 12 * n;  // the f32 master and the two f32 moments on the GPU
    return plan;
}

int64_t HostMemoryAvailable::bytes() const {
    return cgroup_room ? std::min(mem_available, *cgroup_room) : mem_available;
}

namespace {

Result<int64_t> parse_count(std::string_view text, std::string_view what) {
    const std::string_view t = trim(text);
    int64_t v = 0;
    const auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
    if (ec != std::errc() || end != t.data() + t.size() || v < 0)
        return invalid_argument_error("{}: '{}' is not a byte count", what, t);
    return v;
}

// The contents of `path`, or "" when it cannot be opened (procfs and sysfs files report size 0,
// so they are read as a stream).
std::string read_small_file(const std::string& path) {
    std::ifstream in(path);
    if (!in) return "";
    std::ostringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

}  // namespace

Result<HostMemoryAvailable> host_memory_available_from(std::string_view meminfo,
                                                       std::string_view v2_max,
                                                       std::string_view v2_current,
                                                       std::string_view v1_limit,
                                                       std::string_view v1_usage) {
    HostMemoryAvailable out;
    bool found = false;
    int64_t mem_total = 0;
    for (std::string_view line : split(meminfo, '\n')) {
        // "MemAvailable:   12345678 kB"
        const size_t colon = line.find(':');
        if (colon == std::string_view::npos) continue;
        const std::string_view key = line.substr(0, colon);
        if (key != "MemAvailable" && key != "MemTotal") continue;
        std::string_view value = trim(line.substr(colon + 1));
        if (!value.ends_with("kB"))
            return invalid_argument_error("/proc/meminfo: '{}' is not in kB", line);
        LATHE_ASSIGN_OR_RETURN(const int64_t kb,
                               parse_count(value.substr(0, value.size() - 2), "/proc/meminfo"));
        if (key == "MemTotal") {
            mem_total = kb * 1024;
        } else {
            out.mem_available = kb * 1024;
            found = true;
        }
    }
    if (!found) return invalid_argument_error("/proc/meminfo: no MemAvailable line");
    if (!trim(v2_max).empty() && trim(v2_max) != "max") {
        LATHE_ASSIGN_OR_RETURN(const int64_t limit, parse_count(v2_max, "cgroup memory.max"));
        LATHE_ASSIGN_OR_RETURN(
            const int64_t used,
            parse_count(v2_current.empty() ? "0" : v2_current, "cgroup memory.current"));
        out.cgroup_room = std::max<int64_t>(0, limit - used);
        out.cgroup_source = "cgroup v2 memory.max";
    } else if (!trim(v1_limit).empty()) {
        LATHE_ASSIGN_OR_RETURN(const int64_t limit,
                               parse_count(v1_limit, "cgroup memory.limit_in_bytes"));
        // v1 reports "no limit" as a huge page-rounded number: above the machine's memory.
        if (mem_total == 0 || limit < mem_total) {
            LATHE_ASSIGN_OR_RETURN(
                const int64_t used,
                parse_count(v1_usage.empty() ? "0" : v1_usage, "cgroup memory.usage_in_bytes"));
            out.cgroup_room = std::max<int64_t>(0, limit - used);
            out.cgroup_source = "cgroup v1 memory.limit_in_bytes";
        }
    }
    return out;
}

Result<HostMemoryAvailable> host_memory_available() {
    const std::string meminfo = read_small_file("/proc/meminfo");
    if (meminfo.empty()) return io_error("cannot read /proc/meminfo");
    // /proc/self/cgroup: "0::/path" (v2) or "N:memory:/path" (v1, among other controllers).
    std::string v2_dir, v1_dir;
    for (std::string_view line : split(read_small_file("/proc/self/cgroup"), '\n')) {
        const size_t a = line.find(':');
        const size_t b = a == std::string_view::npos ? a : line.find(':', a + 1);
        if (b == std::string_view::npos) continue;
        const std::string_view controllers = line.substr(a + 1, b - a - 1);
        const std::string path(line.substr(b + 1));
        if (line.substr(0, a) == "0" && controllers.empty()) v2_dir = "/sys/fs/cgroup" + path;
        for (std::string_view c : split(controllers, ','))
            if (c == "memory") v1_dir = "/sys/fs/cgroup/memory" + path;
    }
    // Inside a container the cgroup namespace shows its own root as "/", which is the mount.
    const std::string v2_max = v2_dir.empty() ? "" : read_small_file(v2_dir + "/memory.max");
    const std::string v2_cur = v2_dir.empty() ? "" : read_small_file(v2_dir + "/memory.current");
    const std::string v1_lim =
        v1_dir.empty() ? "" : read_small_file(v1_dir + "/memory.limit_in_bytes");
    const std::string v1_use =
        v1_dir.empty() ? "" : read_small_file(v1_dir + "/memory.usage_in_bytes");
    return host_memory_available_from(meminfo, v2_max, v2_cur, v1_lim, v1_use);
}

Status host_memory_check(const HostMemoryPlan& plan, const HostMemoryAvailable& avail) {
    const int64_t need = plan.pinned_bytes();
    if (need <= avail.bytes()) return ok_status();
    const auto gib = [](int64_t b) { return double(b) / double(int64_t(1) << 30); };
    const std::string where = avail.cgroup_room && *avail.cgroup_room < avail.mem_available
                                  ? fmt::format("the room under the {} limit", avail.cgroup_source)
                                  : std::string("MemAvailable in /proc/meminfo");
    return failed_precondition_error(
        "optimizer offload needs {:.2f} GiB of pinned host memory (masters {:.2f}, moments {:.2f}, "
        "gradient landing {:.2f}, weight staging {:.2f} for {} parameters{}), {:.2f} GiB "
        "available ({}); lower optimizer.offload_fraction or use optimizer.state_dtype: bf16",
        gib(need), gib(plan.master_bytes), gib(plan.moment_bytes), gib(plan.grad_landing_bytes),
        gib(plan.weight_staging_bytes), plan.offloaded_params,
        plan.master_mirror_bytes > 0
            ? fmt::format("; master mirror {:.2f} for the {} on the GPU",
                          gib(plan.master_mirror_bytes), plan.params - plan.offloaded_params)
            : std::string(),
        gib(avail.bytes()), where);
}

}  // namespace lathe
