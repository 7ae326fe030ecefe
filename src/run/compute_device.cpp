#include "run/compute_device.h"

#include <unistd.h>

#include "core/log.h"
#include "model/memory_plan.h"
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

Result<ComputeDevice> ComputeDevice::open(std::string_view want, std::string_view key) {
    if (want != "auto" && want != "cpu" && want != "cuda")
        return invalid_argument_error("{}: '{}'; choose auto, cpu or cuda", key, want);
    ComputeDevice d;
    if (want == "cpu") return d;
    // The same probe `lathe doctor` runs: a GPU is usable when the driver lists it and this
    // build carries kernels for it (sm_90a by default: an Ampere card is listed but unusable).
    const GpuEnvironment env = gpu_environment_probe(/*only_device=*/0);
    std::string why_not;
    if (env.devices.empty()) {
        why_not = env.device_error.empty() ? "the driver reports no GPU here" : env.device_error;
    } else if (!env.devices[0].kernel_image_ok) {
        const GpuDeviceInfo& g = env.devices[0];
        why_not = fmt::format("this build has no kernels for GPU 0 ({}, compute capability {}.{}): {}",
                              g.name, g.cc_major, g.cc_minor, g.kernel_image_error);
    }
    if (!why_not.empty()) {
        if (want == "cuda")
            return failed_precondition_error("{}: cuda, but {} (`lathe doctor` says more); use auto "
                                             "or cpu",
                                             key, why_not);
        if (!env.no_gpu) log_warning("{}: auto: {}; computing on the CPU", key, why_not);
        return d;
    }
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
