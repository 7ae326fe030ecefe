// ops/cuda/kernel_profile.h in a build without CUDA: there is no GPU work to profile, so the
// start answers with an error (as probing does) instead of stopping.

#include "ops/cuda/kernel_profile.h"

namespace lathe {

std::string cuda::kernel_profile_start() {
    return "the kernel breakdown profiles GPU work, and this lathe was built without the CUDA "
           "backend (nvcc was not found, or -DLATHE_CUDA=OFF)";
}

std::string cuda::kernel_profile_stop(std::vector<KernelRecord>&) {
    return "no kernel profile is running";
}

}  // namespace lathe
