// `lathe doctor [--json]`: what this machine and this build offer for training on a GPU, a short
// numerics self-test of the CUDA ops against their CPU twins, and one verdict line.
//
// Exit code: 0 when lathe can work here, GPU or not (a machine without a GPU, or a build without
// CUDA, is a valid place to tokenize, prepare data, convert, and train small models on the CPU);
// 1 when a GPU is there but lathe cannot use it: the self-test failed, this binary has no kernels
// for the GPU's architecture, the GPU lacks bf16, the driver is too old for the runtime, or this
// build has no CUDA attention (cudnn-frontend was not there when it was configured), without which
// no model runs on the GPU.
#include <fmt/format.h>

#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/command.h"
#include "model/memory_plan.h"
#include "ops/attention.h"
#include "ops/cuda/fp8_linear.h"
#include "ops/device_info.h"

namespace lathe {
namespace {

// What runs without a GPU: every command, the training ones on the CPU reference backend.
constexpr const char* kCpuWork =
    "tokenize, tokenizer, prepare, data, chat, convert and align run as usual; train, eval and "
    "bench run on the CPU reference backend (fine for small models, slow for real ones)";

// Seed of the self-test's inputs: fixed, so a failure reproduces.
constexpr uint64_t kSelfTestSeed = 20261126;

struct DeviceReport {
    const GpuDeviceInfo* info = nullptr;
    HostLinkInfo host_link;  // coherence of its link to the host, pinned copy bandwidth
    std::vector<GpuSelfTestCheck> checks;
    std::string problem;  // why lathe cannot use this device; empty when it can
    // The FP8 line (cuda::fp8_self_test: one FP8 GEMM against the CPU reference, or why the GPU
    // has none); empty where the device is not usable. Not a readiness problem: bf16 training
    // does not need it, and train.precision fp8 runs the same test before its first step.
    std::string fp8_line;
    bool fp8_ok = false;
};

enum class Readiness { kGpuReady, kCpuOnly, kNotReady };

struct Report {
    GpuEnvironment env;
    std::vector<DeviceReport> devices;
    // Why this build cannot run attention on CUDA (ops/attention.h), null when it can.
    const char* cuda_attention_missing = nullptr;
    Readiness readiness = Readiness::kCpuOnly;
    std::string verdict;
};

std::string cc_string(const GpuDeviceInfo& d) {
    return fmt::format("{}.{}", d.cc_major, d.cc_minor);
}

std::string check_summary(const GpuSelfTestCheck& c) {
    return fmt::format(
        "{}: {} (max error {:.3g} at scale {:.3g}; allowed {:.3g} x |ref| + {:.3g} "
        "x scale{})",
        c.name, c.passed ? "pass" : "FAIL", c.max_abs_error, c.max_ref, c.rel_tolerance,
        c.abs_tolerance,
        c.failing_elements > 0 ? fmt::format("; {} elements beyond it", c.failing_elements)
                               : std::string());
}

Report make_report() {
    Report r;
    r.env = gpu_environment_probe();
    r.cuda_attention_missing = attention_unavailable_reason(Backend::kCuda);
    for (const GpuDeviceInfo& d : r.env.devices) {
        DeviceReport dr;
        dr.info = &d;
        dr.host_link = host_link_probe(d.ordinal, /*measure_bandwidth=*/true);
        if (!d.has_bf16()) {
            dr.problem = fmt::format(
                "compute capability {} has no bf16 tensor cores (lathe needs "
                "8.0 or later, and is built for Hopper, 9.0)",
                cc_string(d));
        } else if (!d.kernel_image_ok) {
            dr.problem = fmt::format(
                "this binary has no kernels for compute capability {} ({}); "
                "rebuild with -DCMAKE_CUDA_ARCHITECTURES={}{}",
                cc_string(d), d.kernel_image_error, d.cc_major, d.cc_minor);
        } else {
            dr.checks = gpu_self_test(d.ordinal, kSelfTestSeed);
            dr.fp8_line = cuda::fp8_self_test(d.ordinal, dr.fp8_ok);
            for (const GpuSelfTestCheck& c : dr.checks) {
                if (!c.passed && dr.problem.empty())
                    dr.problem = "the numerics self-test failed: " + check_summary(c);
            }
        }
        r.devices.push_back(std::move(dr));
    }

    if (!r.env.cuda_build) {
        r.readiness = Readiness::kCpuOnly;
        r.verdict = fmt::format(
            "ready: CPU only, this build has no CUDA backend (rebuild where "
            "nvcc is installed for GPU training); {}",
            kCpuWork);
        return r;
    }
    if (r.env.devices.empty()) {
        // No driver, or no device (none, or all hidden by CUDA_VISIBLE_DEVICES), is simply a
        // machine without a GPU; a driver that cannot serve the runtime is an installation
        // problem on a machine that probably has one.
        if (!r.env.no_gpu) {
            r.readiness = Readiness::kNotReady;
            r.verdict = fmt::format(
                "not ready: the CUDA driver ({}) lists no usable GPU ({}); "
                "lathe's runtime is CUDA {}",
                r.env.driver_version > 0
                    ? "supports CUDA " + cuda_version_string(r.env.driver_version)
                    : std::string("none"),
                r.env.device_error, cuda_version_string(r.env.runtime_version));
        } else {
            r.readiness = Readiness::kCpuOnly;
            r.verdict = fmt::format(
                "ready: CPU only, no GPU ({}); {}",
                r.env.device_error.empty() ? "no CUDA device" : r.env.device_error, kCpuWork);
        }
        return r;
    }
    std::vector<std::string> ready, broken;
    for (const DeviceReport& dr : r.devices) {
        const GpuDeviceInfo& d = *dr.info;
        if (dr.problem.empty()) {
            ready.push_back(fmt::format("GPU {} {} (sm_{}{}{})", d.ordinal, d.name, d.cc_major,
                                        d.cc_minor, d.has_fp8() ? ", fp8" : ""));
        } else {
            broken.push_back(fmt::format("GPU {} {}: {}", d.ordinal, d.name, dr.problem));
        }
    }
    if (!broken.empty()) {
        r.readiness = Readiness::kNotReady;
        std::string joined;
        for (const std::string& b : broken) joined += (joined.empty() ? "" : "; ") + b;
        r.verdict = "not ready: " + joined;
        return r;
    }
    std::string joined;
    for (const std::string& g : ready) joined += (joined.empty() ? "" : ", ") + g;
    if (r.cuda_attention_missing != nullptr) {
        // The GPU works, but no model can run on it: `auto` computes on the CPU.
        r.readiness = Readiness::kNotReady;
        r.verdict = fmt::format(
            "not ready: {} passed the self-test, but {}; train, eval and bench "
            "with device auto run on the CPU, and device cuda is refused",
            joined, r.cuda_attention_missing);
        return r;
    }
    r.readiness = Readiness::kGpuReady;
    r.verdict = fmt::format("ready: GPU training on {} GPU{} ({}), self-test passed{}",
                            ready.size(), ready.size() == 1 ? "" : "s", joined,
                            r.env.nccl.found ? "" : "; NCCL not found, so one GPU per run");
    return r;
}

nlohmann::ordered_json library_json(const GpuLibraryInfo& lib) {
    nlohmann::ordered_json j;
    j["found"] = lib.found;
    j["version"] =
        lib.found ? nlohmann::ordered_json(lib.version) : nlohmann::ordered_json(nullptr);
    j["detail"] = lib.detail;
    return j;
}

// The host link in words: bandwidth and NUMA placement ("-" for a node the system does not have).
std::string host_link_line(const HostLinkInfo& link) {
    auto node = [](int n) { return n >= 0 ? std::to_string(n) : std::string("-"); };
    return fmt::format(
        "host link: pinned host->device {} ({} copies); host NUMA node {}, GPU memory NUMA "
        "node {}",
        link.pinned_h2d_bytes_per_s > 0
            ? fmt::format("{:.1f} GB/s", link.pinned_h2d_bytes_per_s / 1e9)
            : std::string("not measured"),
        format_bytes(link.pinned_copy_bytes), node(link.host_numa_node), node(link.gpu_numa_node));
}

nlohmann::ordered_json host_link_json(const HostLinkInfo& link) {
    using json = nlohmann::ordered_json;
    return {{"coherent", host_memory_coherent(link)},
            {"summary", host_coherence_summary(link)},
            {"pageable_memory_access", link.pageable_memory_access},
            {"uses_host_page_tables", link.uses_host_page_tables},
            {"host_native_atomics", link.host_native_atomics},
            {"host_memory_path", choose_host_memory_path(link) == HostMemoryPath::kSystemAllocated
                                     ? "system_allocated"
                                     : "page_locked"},
            {"host_numa_node", link.host_numa_node},
            {"gpu_numa_node", link.gpu_numa_node},
            {"pci_bus_id", link.pci_bus_id},
            {"pinned_h2d_bytes_per_s", link.pinned_h2d_bytes_per_s},
            {"pinned_copy_bytes", link.pinned_copy_bytes},
            {"error", link.error.empty() ? json(nullptr) : json(link.error)}};
}

std::string readiness_name(Readiness r) {
    switch (r) {
        case Readiness::kGpuReady:
            return "gpu_ready";
        case Readiness::kCpuOnly:
            return "cpu_only";
        case Readiness::kNotReady:
            return "not_ready";
    }
    return "not_ready";
}

std::string report_json(const Report& r) {
    using json = nlohmann::ordered_json;
    json j;
    j["lathe_version"] = LATHE_VERSION;
    j["cuda_build"] = r.env.cuda_build;
    j["driver_cuda_version"] =
        r.env.driver_version > 0 ? json(cuda_version_string(r.env.driver_version)) : json(nullptr);
    j["driver_version"] = r.env.driver_release.empty() ? json(nullptr) : json(r.env.driver_release);
    j["runtime_cuda_version"] = r.env.runtime_version > 0
                                    ? json(cuda_version_string(r.env.runtime_version))
                                    : json(nullptr);
    j["device_error"] = r.env.device_error.empty() ? json(nullptr) : json(r.env.device_error);
    j["no_gpu"] = r.env.no_gpu;
    json devices = json::array();
    json self_test = json::array();
    // Whether every listed GPU shares coherent memory with the CPU; null without a GPU.
    json coherent = r.devices.empty() ? json(nullptr) : json(true);
    for (const DeviceReport& dr : r.devices) {
        const GpuDeviceInfo& d = *dr.info;
        devices.push_back({{"index", d.ordinal},
                           {"name", d.name},
                           {"compute_capability", cc_string(d)},
                           {"sm_count", d.sm_count},
                           {"memory_bytes", d.total_memory_bytes},
                           {"free_memory_bytes", d.free_memory_bytes},
                           {"bf16", d.has_bf16()},
                           {"fp8", d.has_fp8()},
                           {"kernels", d.kernel_image_ok},
                           {"host_link", host_link_json(dr.host_link)},
                           {"fp8_self_test", dr.fp8_line.empty() ? json(nullptr)
                                                                 : json{{"passed", dr.fp8_ok},
                                                                        {"line", dr.fp8_line}}},
                           {"problem", dr.problem.empty() ? json(nullptr) : json(dr.problem)}});
        if (!host_memory_coherent(dr.host_link)) coherent = false;
        for (const GpuSelfTestCheck& c : dr.checks) {
            self_test.push_back({{"device", d.ordinal},
                                 {"name", c.name},
                                 {"passed", c.passed},
                                 {"max_abs_error", c.max_abs_error},
                                 {"max_ref", c.max_ref},
                                 {"rel_tolerance", c.rel_tolerance},
                                 {"abs_tolerance", c.abs_tolerance},
                                 {"failing_elements", c.failing_elements}});
        }
    }
    j["devices"] = devices;
    j["coherent_cpu_gpu_memory"] = coherent;
    j["libraries"] = {{"cublaslt", library_json(r.env.cublaslt)},
                      {"cudnn", library_json(r.env.cudnn)},
                      {"nccl", library_json(r.env.nccl)}};
    j["self_test"] = self_test;
    j["cuda_attention"] = {
        {"available", r.cuda_attention_missing == nullptr},
        {"detail", r.cuda_attention_missing == nullptr
                       ? json("cuDNN fused flash attention (cudnn-frontend graphs)")
                       : json(r.cuda_attention_missing)}};
    j["status"] = readiness_name(r.readiness);
    j["verdict"] = r.verdict;
    return j.dump();
}

std::string library_line(const GpuLibraryInfo& lib) {
    return lib.found ? fmt::format("{} ({})", lib.version, lib.detail)
                     : fmt::format("not found: {}", lib.detail);
}

void print_report(const Report& r) {
    std::string out;
    auto row = [&out](std::string_view key, const std::string& value) {
        out += fmt::format("{:<11}{}\n", key, value);
    };
    row("lathe", fmt::format("{} (CUDA backend: {})", LATHE_VERSION,
                             r.env.cuda_build ? "built" : "not built"));
    if (r.env.cuda_build) {
        row("driver",
            r.env.driver_version > 0
                ? fmt::format("{}supports CUDA {}",
                              r.env.driver_release.empty() ? "" : r.env.driver_release + ", ",
                              cuda_version_string(r.env.driver_version))
                : std::string("no CUDA driver"));
        row("runtime", fmt::format("CUDA {}", cuda_version_string(r.env.runtime_version)));
    }
    row("cuBLASLt", r.env.cublaslt.found ? library_line(r.env.cublaslt) : r.env.cublaslt.detail);
    row("cuDNN", library_line(r.env.cudnn));
    row("NCCL", library_line(r.env.nccl));
    row("attention", r.cuda_attention_missing == nullptr
                         ? std::string("CUDA: cuDNN fused flash attention (built)")
                         : fmt::format("CUDA: not available: {}", r.cuda_attention_missing));
    if (r.devices.empty()) row("GPU", "none: " + r.env.device_error);
    for (const DeviceReport& dr : r.devices) {
        const GpuDeviceInfo& d = *dr.info;
        row(fmt::format("GPU {}", d.ordinal),
            fmt::format("{}: compute capability {}, {} SMs, {} ({} free)", d.name, cc_string(d),
                        d.sm_count, format_bytes(d.total_memory_bytes),
                        format_bytes(d.free_memory_bytes)));
        row("", fmt::format("bf16 tensor cores: {}; fp8 tensor cores: {}; lathe kernels: {}",
                            d.has_bf16() ? "yes" : "no", d.has_fp8() ? "yes" : "no",
                            d.kernel_image_ok ? "yes" : "no (" + d.kernel_image_error + ")"));
        row("", "coherent CPU-GPU memory: " + host_coherence_summary(dr.host_link));
        row("", host_link_line(dr.host_link));
        for (const GpuSelfTestCheck& c : dr.checks) row("self-test", check_summary(c));
        if (!dr.fp8_line.empty()) row("self-test", dr.fp8_line);
    }
    if (r.devices.empty()) row("", "coherent CPU-GPU memory: no GPU");
    out += r.verdict + "\n";
    std::fputs(out.c_str(), stdout);
}

}  // namespace

void cli_add_doctor(CLI::App& parent, CommandAction& action) {
    CLI::App* cmd = parent.add_subcommand(
        "doctor", "Check this machine and build for GPU training, with a numerics self-test");
    cmd->footer(
        "Reports the GPUs (compute capability, SMs, memory, bf16/fp8 tensor cores, whether this "
        "build has kernels for them, whether each shares coherent memory with the CPU and its "
        "measured pinned host->device bandwidth), the driver, the CUDA runtime, cuBLASLt, cuDNN "
        "and NCCL "
        "versions, whether this build runs attention on CUDA (cuDNN), a self-test of CUDA ops "
        "against the CPU reference, and one verdict line. Exit code 0 when lathe can work here (a "
        "machine without a GPU included), 1 when a GPU is "
        "there but unusable.");
    auto json = std::make_shared<bool>(false);
    cmd->add_flag("--json", *json, "Print one JSON object instead of the table");
    cmd->callback([json, &action] {
        action = [json]() -> Status {
            const Report r = make_report();
            if (*json) {
                std::printf("%s\n", report_json(r).c_str());
            } else {
                print_report(r);
            }
            std::fflush(stdout);
            if (r.readiness == Readiness::kNotReady)
                return failed_precondition_error(
                    "lathe doctor: a GPU is present but not usable "
                    "(see the verdict above)");
            return ok_status();
        };
    });
}

}  // namespace lathe
