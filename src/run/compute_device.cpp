#include "run/compute_device.h"

#include <unistd.h>

#include "core/log.h"
#include "model/memory_plan.h"

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
#if LATHE_HAVE_CUDA
    const int gpus = cuda_device_count();
    if (gpus == 0) {
        if (want == "cuda")
            return failed_precondition_error("{}: cuda, but the driver reports no GPU here "
                                             "(`lathe doctor` says more); use auto or cpu",
                                             key);
        return d;
    }
    d.cuda_ = std::make_unique<Cuda>(0);
    d.ctx_ = d.cuda_->state.context();
    return d;
#else
    if (want == "cuda")
        return failed_precondition_error("{}: cuda, but this lathe was built without CUDA (nvcc "
                                         "was not found when it was configured); use auto or cpu",
                                         key);
    return d;
#endif
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
