#pragma once
// What the dispatching op functions (src/ops/<op>.cpp) need to call the CUDA backend: the
// launchers' CudaState and the CUDA storage policy check. Included in every build: without CUDA,
// cuda_state_of and the launchers are the stubs of src/ops/cuda_stub/ (no_cuda.h).
//
// Storage policy of the CUDA backend (docs/CUDA.md): activations, weights and their bf16 copies
// are bf16; parameter gradients, master weights, optimizer moments and saved statistics (mean,
// rstd, lse, losses) are f32; ids are i32.

#include <initializer_list>
#include <string_view>

#include "core/check.h"
#include "core/tensor.h"
#include "ops/cuda/cuda_state.h"

namespace lathe::detail {

// Every non-null view given here holds `dtype`; stops naming the op and the view otherwise.
inline void op_expect_cuda_dtype(std::string_view op, DType dtype,
                                 std::initializer_list<ConstTensorView> views) {
    for (const ConstTensorView& v : views)
        LATHE_CHECK(v.is_null() || v.dtype() == dtype, "{}: the CUDA backend takes {} here, got {}",
                    op, dtype_name(dtype), v.to_string());
}

}  // namespace lathe::detail
