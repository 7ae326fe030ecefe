// ops/cuda/host_link.h in a build without CUDA: no device, said in link.error. Like the
// device_info stub it answers instead of stopping, as probing never stops (ops/device_info.h).

#include "ops/cuda/host_link.h"

namespace lathe {

void cuda::probe_host_link(HostLinkInfo& link, int device, bool, size_t) {
    link.ordinal = device;
    link.error =
        "this lathe was built without the CUDA backend (nvcc was not found, or "
        "-DLATHE_CUDA=OFF)";
}

}  // namespace lathe
