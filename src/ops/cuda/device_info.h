#pragma once
// The CUDA half of ops/device_info.h: what only the CUDA runtime and cuBLASLt can tell. Compiled
// when nvcc is there (LATHE_HAVE_CUDA); without it ops/cuda_stub/device_info.cpp answers "built
// without CUDA". ops/device_info.cpp calls it and adds what dlopen finds.
// Like the launchers' headers, it keeps CUDA headers out of the CPU-compiled caller.

#include <cstddef>
#include <cstdint>
#include <vector>

#include "ops/device_info.h"

namespace lathe::cuda {

// Fills env.driver_version, runtime_version, device_error, devices (every device the runtime
// lists, with its free memory now and whether this binary has kernel code for it) and cublaslt
// (cublasLtGetVersion of the linked library). Never stops: a failing query becomes device_error.
// `only_device` >= 0 lists that device only (none when it does not exist).
void probe_environment(GpuEnvironment& env, int only_device);

// cudaMemGetInfo on `device` (made current); false when the call fails.
bool memory_info(int device, size_t& free_bytes, size_t& total_bytes);

// The most shared memory one block may use on `device` (cudaDevAttrMaxSharedMemoryPerBlockOptin,
// bytes), or 0 when the query fails.
int64_t shared_memory_per_block_optin(int device);

// gpu_self_test of ops/device_info.h (ops/cuda/self_checks.cu); without CUDA, no checks.
std::vector<GpuSelfTestCheck> gpu_self_test(int device, uint64_t seed);

}  // namespace lathe::cuda
