#include "run/compute_device.h"

#include <unistd.h>

#include <algorithm>
#include <string>

#include "core/log.h"
#include "model/memory_plan.h"
#include "ops/attention.h"
#include "ops/cuda/cuda_state.h"
#include "ops/cuda/device_count.h"
#include "ops/cuda/memory.h"
#include "ops/device_info.h"

namespace lathe {

// The device's CUDA state. In a build without CUDA none is ever made: compute_device_choose picks
// the CPU there, since the probe lists no GPU.
struct ComputeDevice::Cuda {
    explicit Cuda(int device) : state(device) {}
    CudaState state;
};

ComputeDevice::ComputeDevice() : ctx_(cpu_context()) {}
ComputeDevice::~ComputeDevice() = default;
ComputeDevice::ComputeDevice(ComputeDevice&&) noexcept = default;
ComputeDevice& ComputeDevice::operator=(ComputeDevice&&) noexcept = default;

Result<Backend> compute_device_choose(std::string_view want, std::string_view key,
                                      const GpuEnvironment& env, const char* cuda_attention_missing,
                                      std::string& fallback_note) {
    fallback_note.clear();
    if (!compute_device_name_valid(want))
        return invalid_argument_error("{}: '{}'; choose auto, cpu or cuda (cuda:N for GPU N)", key,
                                      want);
    if (want == "cpu") return Backend::kCpu;
    // cuda:N asks for cuda; which device is compute_device_index's business, and `env` lists it.
    if (want != "auto") want = "cuda";
    // A GPU is usable when the driver lists it and this build carries kernels for it (sm_90a by
    // default: an Ampere card is listed but unusable), and the model can run there whole.
    std::string why_not, what_to_do = "use auto or cpu";
    if (env.devices.empty()) {
        why_not = env.device_error.empty() ? "the driver reports no GPU here" : env.device_error;
    } else if (!env.devices[0].kernel_image_ok) {
        const GpuDeviceInfo& g = env.devices[0];
        why_not =
            fmt::format("this build has no kernels for GPU {} ({}, compute capability {}.{}): {}",
                        g.ordinal, g.name, g.cc_major, g.cc_minor, g.kernel_image_error);
    } else if (cuda_attention_missing != nullptr) {
        why_not = cuda_attention_missing;
        what_to_do = "run scripts/install-deps.sh and rebuild, or use cpu";
    }
    if (why_not.empty()) return Backend::kCuda;
    if (want == "cuda")
        return failed_precondition_error("{}: cuda, but {} (`lathe doctor` says more); {}", key,
                                         why_not, what_to_do);
    if (!env.no_gpu)
        fallback_note = fmt::format("{}: auto: {}; computing on the CPU", key, why_not);
    return Backend::kCpu;
}

bool compute_device_name_valid(std::string_view want) {
    if (want == "auto" || want == "cpu" || want == "cuda") return true;
    if (!want.starts_with("cuda:") || want.size() == 5) return false;
    for (const char c : want.substr(5))
        if (c < '0' || c > '9') return false;
    return want.size() <= 5 + 6;  // up to a million devices
}

Result<int> compute_device_index(std::string_view want, std::string_view key,
                                 const ProcessGroupInfo& group, int visible_devices) {
    if (!compute_device_name_valid(want) || want == "cpu")
        return invalid_argument_error("{}: '{}' names no CUDA device; choose auto, cuda or cuda:N",
                                      key, want);
    if (want.starts_with("cuda:")) {
        const int n = std::stoi(std::string(want.substr(5)));
        if (n >= visible_devices)
            return invalid_argument_error(
                "{}: {}, but {} GPU{} visible to this process (CUDA_VISIBLE_DEVICES counts); "
                "choose cuda:0 to cuda:{}",
                key, want, visible_devices, visible_devices == 1 ? " is" : "s are",
                std::max(0, visible_devices - 1));
        return n;
    }
    if (group.local_rank < visible_devices) return group.local_rank;
    if (visible_devices == 1) return 0;  // the launcher shows each process its own GPU
    return failed_precondition_error(
        "{}: {}: this process is {}, but only {} GPUs are visible on this machine: start at most "
        "{} processes per machine, or give each process its GPU with {}: cuda:N",
        key, want, group.describe(), visible_devices, visible_devices, key);
}

Result<ComputeDevice> ComputeDevice::open(std::string_view want, std::string_view key) {
    if (want == "cpu" || !compute_device_name_valid(want))
        return open(want, key, ProcessGroupInfo{});
    LATHE_ASSIGN_OR_RETURN(const ProcessGroupInfo group,
                           process_group_from_env(process_environment()));
    return open(want, key, group);
}

Result<ComputeDevice> ComputeDevice::open(std::string_view want, std::string_view key,
                                          const ProcessGroupInfo& group) {
    ComputeDevice d;
    if (want == "cpu" || !compute_device_name_valid(want)) {
        std::string none;  // cpu, or an unknown value (an error): no probe needed
        LATHE_RETURN_IF_ERROR(
            compute_device_choose(want, key, GpuEnvironment{}, nullptr, none).status());
        return d;
    }
    // Which GPU (none visible: 0, whose probe below says why it cannot be used), then the same
    // probe `lathe doctor` runs, of that GPU only.
    int device = 0;
    if (const int visible = cuda_visible_device_count(); visible > 0) {
        LATHE_ASSIGN_OR_RETURN(device, compute_device_index(want, key, group, visible));
    }
    const GpuEnvironment env = gpu_environment_probe(/*only_device=*/device);
    std::string note;
    LATHE_ASSIGN_OR_RETURN(
        const Backend backend,
        compute_device_choose(want, key, env, attention_unavailable_reason(Backend::kCuda), note));
    if (!note.empty()) log_warning("{}", note);
    if (backend == Backend::kCpu) return d;
    d.cuda_ = std::make_unique<Cuda>(device);
    d.ctx_ = d.cuda_->state.context();
    return d;
}

std::string ComputeDevice::describe() const {
    if (cuda_) {
        const int dev = cuda_->state.device();
        const CudaMemoryInfo info = cuda_memory_info(dev);
        return fmt::format("cuda:{} ({}, {})", dev, cuda_device_name(dev),
                           format_bytes(info.total_bytes));
    }
    return "cpu";
}

size_t ComputeDevice::available_memory_bytes() const {
    if (cuda_) return cuda_memory_info(cuda_->state.device()).free_bytes;
    const long pages = sysconf(_SC_PHYS_PAGES);
    const long page = sysconf(_SC_PAGE_SIZE);
    return pages > 0 && page > 0 ? size_t(pages) * size_t(page) : 0;
}

void ComputeDevice::synchronize() const {
    if (cuda_) cuda_->state.synchronize();
}

}  // namespace lathe
