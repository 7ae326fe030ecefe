#pragma once
// The CUDA half of host_link_probe (ops/device_info.h): the device attributes that say how host
// memory reaches a GPU, and a timed pinned host -> device copy. Compiled when nvcc is there
// (LATHE_HAVE_CUDA); without it ops/cuda_stub/host_link.cpp answers "built without CUDA". Keeps
// CUDA headers out of the CPU-compiled caller, as ops/cuda/device_info.h does.

#include <cstddef>

#include "ops/device_info.h"

namespace lathe::cuda {

// Fills link's attributes (pageable access, host page tables, native host atomics, the NUMA
// nodes the runtime knows, the PCI bus id) for `device`, and with `measure_bandwidth` the best
// pinned host -> device bandwidth over a few copies of `copy_bytes`. Never stops: a failed query
// or allocation is written to link.error (the attributes read before it stay).
void probe_host_link(HostLinkInfo& link, int device, bool measure_bandwidth, size_t copy_bytes);

}  // namespace lathe::cuda
