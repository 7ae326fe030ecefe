// Kernel-time breakdown: see kernel_groups.h.

#include "ops/kernel_groups.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <map>
#include <utility>

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
    std::vector<std::pair<uint64_t, uint64_t>> spans;
    spans.reserve(records.size());
    for (const KernelRecord& r : records) {
        const uint64_t end = std::max(r.end_ns, r.start_ns);
        const double ms = double(end - r.start_ns) * 1e-6;
        const std::string_view g = kernel_group(r.name, r.is_copy);
        KernelTotal& gt = groups[g];
        gt.name = std::string(g);
        gt.ms += ms;
        gt.count += 1;
        KernelTotal& kt = kernels[r.name];
        kt.name = r.name;
        kt.ms += ms;
        kt.count += 1;
        spans.emplace_back(r.start_ns, end);
    }
    std::sort(spans.begin(), spans.end());
    uint64_t busy = 0, cur_start = spans[0].first, cur_end = spans[0].second;
    for (size_t i = 1; i < spans.size(); ++i) {
        if (spans[i].first > cur_end) {
            busy += cur_end - cur_start;
            cur_start = spans[i].first;
            cur_end = spans[i].second;
        } else {
            cur_end = std::max(cur_end, spans[i].second);
        }
    }
    busy += cur_end - cur_start;
    uint64_t last_end = 0;
    for (const auto& s : spans) last_end = std::max(last_end, s.second);
    out.busy_ms = double(busy) * 1e-6;
    out.span_ms = double(last_end - spans[0].first) * 1e-6;
    const auto by_time = [](const KernelTotal& a, const KernelTotal& b) {
        return a.ms != b.ms ? a.ms > b.ms : a.name < b.name;
    };
    for (auto& [_, t] : groups) out.groups.push_back(t);
    std::sort(out.groups.begin(), out.groups.end(), by_time);
    for (auto& [_, t] : kernels) out.top.push_back(t);
    std::sort(out.top.begin(), out.top.end(), by_time);
    if (int64_t(out.top.size()) > top_n) out.top.resize(size_t(std::max(top_n, 0)));
    return out;
}

}  // namespace lathe
