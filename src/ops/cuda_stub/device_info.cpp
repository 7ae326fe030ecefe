// ops/cuda/device_info.h in a build without CUDA: the probe says so and finds no device. Unlike
// the launchers' stubs these answer instead of stopping, as probing never stops
// (ops/device_info.h).

#include "ops/cuda/device_info.h"

namespace lathe {

void cuda::probe_environment(GpuEnvironment& env, int) {
    env.cuda_build = false;
    env.no_gpu = true;
    env.device_error =
        "this lathe was built without the CUDA backend (nvcc was not found, or "
        "-DLATHE_CUDA=OFF)";
    env.cublaslt.detail = "not linked (build without CUDA)";
}

int64_t cuda::shared_memory_per_block_optin(int) {
    return 0;
}

bool cuda::memory_info(int, size_t&, size_t&) {
    return false;
}

std::vector<GpuSelfTestCheck> cuda::gpu_self_test(int, uint64_t) {
    return {};
}

}  // namespace lathe
