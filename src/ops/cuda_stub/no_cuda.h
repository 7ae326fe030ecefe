#pragma once
// The CUDA backend of a build without CUDA. Each src/ops/cuda_stub/<op>.cpp defines the launchers
// declared in src/ops/cuda/<op>.h, with the same signatures, as a call to no_cuda(): the
// dispatching op functions (src/ops/<op>.cpp) then call the CUDA launcher under `case
// Backend::kCuda:` in every build, without a preprocessor conditional. CMakeLists.txt links these
// files only when nvcc is not there (LATHE_HAVE_CUDA off) and compiles them in every build, so a
// stub that no longer matches its declaration fails the CUDA build too: each stub is defined by its
// qualified name
// (`void cuda::gelu_forward(...)`), which the compiler accepts only for a declared function.
//
// Reaching a stub is a bug in the caller: a build without CUDA has no CudaState to make a CUDA
// context from, and run/ refuses a CUDA device there with a Status error before any op runs.

#include <string_view>

#include "core/check.h"

namespace lathe::detail {

// Stops: `launcher` was called in a build without the CUDA backend.
[[noreturn]] inline void no_cuda(std::string_view launcher) {
    LATHE_CHECK(false,
                "{}: this lathe was built without CUDA (nvcc was not found, or -DLATHE_CUDA=OFF)",
                launcher);
    __builtin_unreachable();
}

}  // namespace lathe::detail
