// clang-format off
#include "ops/cuda/nvcc_compat.h"  // first: before any header that includes fmt
// clang-format on

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <string>

#include "ops/cuda/device_info.h"

namespace lathe::cuda {
namespace {

// Compiled with the same architecture flags as every other kernel of the library, so asking the
// runtime for its attributes on a device tells whether lathe's kernels can run there at all (a
// binary built for sm_90a has no image an sm_80 or sm_100 device accepts).
__global__ void device_info_probe_kernel(int* out) {
    if (out != nullptr) *out = 1;
}

std::string error_text(cudaError_t err) {
    return std::string(cudaGetErrorName(err)) + ": " + cudaGetErrorString(err);
}

}  // namespace

void probe_environment(GpuEnvironment& env, int only_device) {
    env.cuda_build = true;
    // Both version queries work without a device; the driver's is 0 when no driver is installed.
    if (cudaDriverGetVersion(&env.driver_version) != cudaSuccess) env.driver_version = 0;
    if (cudaRuntimeGetVersion(&env.runtime_version) != cudaSuccess) env.runtime_version = 0;
    env.cublaslt.found = true;
    env.cublaslt.version = library_version_string(cublasLtGetVersion());
    env.cublaslt.detail = "linked";

    int count = 0;
    const cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess) {
        env.device_error = "cudaGetDeviceCount: " + error_text(err);
        env.no_gpu = err == cudaErrorNoDevice || env.driver_version == 0;
        // Without libcuda the runtime says "driver version is insufficient": say what it means.
        if (env.driver_version == 0)
            env.device_error = "no CUDA driver installed (" + env.device_error + ")";
        // The failed call leaves a sticky "last error" that the next checked call would report.
        (void)cudaGetLastError();
        return;
    }
    env.no_gpu = count == 0;
    for (int d = 0; d < count; ++d) {
        if (only_device >= 0 && d != only_device) continue;
        GpuDeviceInfo info;
        info.ordinal = d;
        cudaDeviceProp prop{};
        const cudaError_t perr = cudaGetDeviceProperties(&prop, d);
        if (perr != cudaSuccess) {
            info.name = "(cudaGetDeviceProperties failed: " + error_text(perr) + ")";
            info.kernel_image_error = info.name;
            (void)cudaGetLastError();
            env.devices.push_back(std::move(info));
            continue;
        }
        info.name = prop.name;
        info.cc_major = prop.major;
        info.cc_minor = prop.minor;
        info.sm_count = prop.multiProcessorCount;
        info.total_memory_bytes = prop.totalGlobalMem;
        size_t free_bytes = 0, total_bytes = 0;
        if (memory_info(d, free_bytes, total_bytes)) info.free_memory_bytes = free_bytes;
        cudaFuncAttributes attr{};
        const cudaError_t ferr = cudaSetDevice(d) == cudaSuccess
                                     ? cudaFuncGetAttributes(&attr, device_info_probe_kernel)
                                     : cudaGetLastError();
        info.kernel_image_ok = ferr == cudaSuccess;
        if (!info.kernel_image_ok) {
            info.kernel_image_error = error_text(ferr);
            (void)cudaGetLastError();
        }
        env.devices.push_back(std::move(info));
    }
}

int64_t shared_memory_per_block_optin(int device) {
    int bytes = 0;
    if (cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) !=
        cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return bytes;
}

bool memory_info(int device, size_t& free_bytes, size_t& total_bytes) {
    if (cudaSetDevice(device) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    size_t f = 0, t = 0;
    if (cudaMemGetInfo(&f, &t) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    free_bytes = f;
    total_bytes = t;
    return true;
}

}  // namespace lathe::cuda
