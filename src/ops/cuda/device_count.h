#pragma once
// How many GPUs this process sees, for choosing one before any CUDA state exists (defined in
// ops/cuda/cuda_state.cu; CPU-visible, no CUDA headers).

namespace lathe {

// The number of CUDA devices this process sees (cudaGetDeviceCount, after CUDA_VISIBLE_DEVICES);
// 0 when there are none or the runtime cannot reach a driver. Creates no CUDA context.
int cuda_visible_device_count();

}  // namespace lathe
