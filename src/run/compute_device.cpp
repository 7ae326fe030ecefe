#include "run/compute_device.h"

#include <unistd.h>

#include "core/log.h"
#include "model/memory_plan.h"
#include "ops/attention.h"
#include "ops/device_info.h"

#if LATHE_HAVE_CUDA
#include "ops/cuda/cuda_state.h"
#include "ops/cuda/memory.h"
#endif

namespace lathe {

struct ComputeDevice::Cuda {
#if LATHE_HAVE_CUDA
    explicit Cuda(int device) : state(device) {}
    CudaState state;
#endif
};

ComputeDevice::ComputeDevice() : ctx_(cpu_context()) {}
ComputeDevice::~ComputeDevice() = default;
ComputeDevice::ComputeDevice(ComputeDevice&&) noexcept = default;
ComputeDevice& ComputeDevice::operator=(ComputeDevice&&) noexcept = default;

Result<Backend> compute_device_choose(std::string_view want, std::string_view key,
                                      const GpuEnvironment& env, const char* cuda_attention_missing,
                                      std::string& fallback_note) {
    fallback_note.clear();
    if (want != "auto" && want != "cpu" && want != "cuda")
        return invalid_argument_error("{}: '{}'; choose auto, cpu or cuda", key, want);
    if (want == "cpu") return Backend::kCpu;
    // A GPU is usable when the driver lists it and this build carries kernels for it (sm_90a by
    // default: an Ampere card is listed but unusable), and the model can run there whole.
    std::string why_not, what_to_do = "use auto or cpu";
    if (env.devices.empty()) {
        why_not = env.device_error.empty() ? "the driver reports no GPU here" : env.device_error;
    } else if (!env.devices[0].kernel_image_ok) {
        const GpuDeviceInfo& g = env.devices[0];
        why_not =
            fmt::format("this build has no kernels for GPU 0 ({}, compute capability {}.{}): {}",
                        g.name, g.cc_major, g.cc_minor, g.kernel_image_error);
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

Result<ComputeDevice> ComputeDevice::open(std::string_view want, std::string_view key) {
    ComputeDevice d;
    if (want != "auto" && want != "cuda") {
        std::string none;  // cpu, or an unknown value (an error): no probe needed
        LATHE_RETURN_IF_ERROR(
            compute_device_choose(want, key, GpuEnvironment{}, nullptr, none).status());
        return d;
    }
    // The same probe `lathe doctor` runs.
    const GpuEnvironment env = gpu_environment_probe(/*only_device=*/0);
    std::string note;
    LATHE_ASSIGN_OR_RETURN(
        const Backend backend,
        compute_device_choose(want, key, env, attention_unavailable_reason(Backend::kCuda), note));
    if (!note.empty()) log_warning("{}", note);
    if (backend == Backend::kCpu) return d;
#if LATHE_HAVE_CUDA
    d.cuda_ = std::make_unique<Cuda>(0);
    d.ctx_ = d.cuda_->state.context();
#endif
    return d;
}

std::string ComputeDevice::describe() const {
#if LATHE_HAVE_CUDA
    if (cuda_) {
        const int dev = cuda_->state.device();
        const CudaMemoryInfo info = cuda_memory_info(dev);
        return fmt::format("cuda:{} ({}, {})", dev, cuda_device_name(dev),
                           format_bytes(info.total_bytes));
    }
#endif
    return "cpu";
}

size_t ComputeDevice::available_memory_bytes() const {
#if LATHE_HAVE_CUDA
    if (cuda_) return cuda_memory_info(cuda_->state.device()).free_bytes;
#endif
    const long pages = sysconf(_SC_PHYS_PAGES);
    const long page = sysconf(_SC_PAGE_SIZE);
    return pages > 0 && page > 0 ? size_t(pages) * size_t(page) : 0;
}

void ComputeDevice::synchronize() const {
#if LATHE_HAVE_CUDA
    if (cuda_) cuda_->state.synchronize();
#endif
}

}  // namespace lathe
