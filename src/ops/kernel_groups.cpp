// Kernel-time breakdown: see kernel_groups.h.

#include "ops/kernel_groups.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

namespace lathe {
namespace {

struct GroupRule {
    std::string_view group;
    std::array<std::string_view, 9> needles;  // empty entries end the list
};

// In match order (kernel_groups.h): attention before gemm, since cuDNN's attention kernels
// carry "sm90" and wgmma names too; fp8 casts before the generic "cast".
constexpr std::array<GroupRule, 8> kRules = {{
    {"communication", {"nccl"}},
    {"attention",
     {"cudnn", "fmha", "flash", "sdpa", "attention", "decode_split", "decode_combine",
      "docs_bias"}},
    {"gemm", {"gemm", "gemv", "nvjet", "cutlass", "xmma", "cublas"}},
    {"optimizer", {"adamw", "grad_scale", "sum_of_squares", "norm_from_partials"}},
    {"lm_head_ce", {"cross_entropy", "held_row", "stream_row"}},
    {"norms", {"rmsnorm", "layernorm"}},
    {"fp8_casts", {"amax", "cast_transpose", "block_cast", "scales_to_gemm", "fp8", "cast_kernel"}},
    {"elementwise",
     {"rope", "swiglu", "gelu", "residual", "embedding", "cast", "column_partials", "fill",
      "add_one"}},
}};

}  // namespace

std::string_view kernel_group(std::string_view name, bool is_copy) {
    if (is_copy) return "copies";
    std::string lower(name);
    std::transform(lower.begin(), lower.end(), lower.begin(),
                   [](unsigned char c) { return char(std::tolower(c)); });
    // "cast_kernel" counts only as a whole name (after "::" or a space: the FP8 cast's
    // cast_kernel<...>), so that another op's "..._cast_kernel" is not taken for it.
    for (const GroupRule& rule : kRules) {
        for (std::string_view needle : rule.needles) {
            if (needle.empty()) break;
            const size_t at = lower.find(needle);
            if (at == std::string::npos) continue;
            if (needle == "cast_kernel" && at > 0 && lower[at - 1] != ' ' && lower[at - 1] != ':')
                continue;
            return rule.group;
        }
    }
    return "other";
}

KernelBreakdown summarize_kernels(std::span<const KernelRecord> records, int top_n) {
    KernelBreakdown out;
    if (records.empty()) return out;
    std::map<std::string_view, KernelTotal> groups;
    std::map<std::string, KernelTotal> kernels;
    // In start order: busy is the union of [start, end); an idle stretch before a record's start
    // (after the latest end so far) is its gap.
    std::vector<size_t> order(records.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return records[a].start_ns < records[b].start_ns; });
    uint64_t busy = 0, first = records[order[0]].start_ns, cur_start = first, cur_end = first;
    for (const size_t i : order) {
        const KernelRecord& r = records[i];
        const uint64_t end = std::max(r.end_ns, r.start_ns);
        double gap = 0;
        if (r.start_ns > cur_end) {
            gap = double(r.start_ns - cur_end) * 1e-6;
            busy += cur_end - cur_start;
            cur_start = r.start_ns;
        }
        cur_end = std::max(cur_end, end);
        const double ms = double(end - r.start_ns) * 1e-6;
        const std::string_view g = kernel_group(r.name, r.is_copy);
        KernelTotal& gt = groups[g];
        gt.name = std::string(g);
        gt.ms += ms;
        gt.count += 1;
        gt.gap_ms += gap;
        KernelTotal& kt = kernels[r.name];
        kt.name = r.name;
        kt.ms += ms;
        kt.count += 1;
        kt.gap_ms += gap;
    }
    busy += cur_end - cur_start;
    out.busy_ms = double(busy) * 1e-6;
    out.span_ms = double(cur_end - first) * 1e-6;
    const auto by_time = [](const KernelTotal& a, const KernelTotal& b) {
        return a.ms != b.ms ? a.ms > b.ms : a.name < b.name;
    };
    const auto by_gap = [](const KernelTotal& a, const KernelTotal& b) {
        return a.gap_ms != b.gap_ms ? a.gap_ms > b.gap_ms : a.name < b.name;
    };
    const size_t keep = size_t(std::max(top_n, 0));
    for (auto& [_, t] : groups) out.groups.push_back(t);
    std::sort(out.groups.begin(), out.groups.end(), by_time);
    for (auto& [_, t] : kernels) out.top.push_back(t);
    out.by_gap = out.top;
    std::sort(out.top.begin(), out.top.end(), by_time);
    if (out.top.size() > keep) out.top.resize(keep);
    std::sort(out.by_gap.begin(), out.by_gap.end(), by_gap);
    if (out.by_gap.size() > keep) out.by_gap.resize(keep);
    return out;
}

std::string kernel_trace_json(std::span<const KernelRecord> records) {
    using json = nlohmann::ordered_json;
    uint64_t t0 = UINT64_MAX;
    std::set<uint32_t> streams;
    for (const KernelRecord& r : records) {
        t0 = std::min(t0, r.start_ns);
        streams.insert(r.stream);
    }
    json events = json::array();
    for (const uint32_t s : streams)
        events.push_back({{"name", "thread_name"},
                          {"ph", "M"},
                          {"pid", 0},
                          {"tid", s},
                          {"args", {{"name", fmt::format("stream {}", s)}}}});
    for (const KernelRecord& r : records)
        events.push_back({{"name", r.name},
                          {"cat", std::string(kernel_group(r.name, r.is_copy))},
                          {"ph", "X"},
                          {"ts", double(r.start_ns - t0) / 1e3},
                          {"dur", double(r.end_ns - std::min(r.start_ns, r.end_ns)) / 1e3},
                          {"pid", 0},
                          {"tid", r.stream}});
    return json{{"traceEvents", std::move(events)}, {"displayTimeUnit", "ns"}}.dump();
}

}  // namespace lathe
