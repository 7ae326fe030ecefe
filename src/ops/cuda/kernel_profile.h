#pragma once
// The kernels, copies and sets a span of GPU work ran, with their device timestamps, from CUPTI's
// activity API (`lathe bench --kernel-breakdown N`; grouped by ops/kernel_groups.h).
//
// libcupti is opened with dlopen when a profile starts, not linked: a lathe on a machine with
// the CUDA driver and runtime alone runs everything else. It is looked for as LATHE_CUPTI (a
// path, when set), then "libcupti.so.13" on the loader's path, then under /usr/local/cuda
// (lib64, extras/CUPTI/lib64); a start that finds none is an error naming them.
// One profile at a time in a process: CUPTI's buffer callbacks carry no user data, so the
// records go to one process-wide collector. Profiling adds time to each launch, so the steps it
// records are not the ones a benchmark times.

#include <string>
#include <vector>

#include "ops/kernel_groups.h"

namespace lathe::cuda {

// As the other CUDA launchers (compiled by nvcc, without core/status.h), these answer with a
// message: empty on success, else what went wrong, which the caller turns into its error.
//
// Starts recording every kernel (concurrent kernel records), memcpy and memset of the process.
std::string kernel_profile_start();
// Flushes CUPTI's buffers, stops recording and moves the records since the start into `out` (the
// caller synchronizes the device first, so the work it wants is complete). Names demangled.
std::string kernel_profile_stop(std::vector<KernelRecord>& out);

}  // namespace lathe::cuda
