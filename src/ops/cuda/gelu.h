#pragma once
// CUDA GELU (ops/gelu.h has the math), erf or tanh form.
//   forward:  y = gelu(x);   backward: dx = dy * gelu'(x) (=)
// Any shape, n elements, bf16, fp32 math. y may be x and dx may be dy (in place): each thread
// reads its elements before writing them, so those pointers carry no restrict qualifier.
// Deterministic (elementwise). Enqueued on `stream`.

#include <cstdint>

#include "core/dtype.h"

struct CUstream_st;

namespace lathe::cuda {

void gelu_forward(bf16* y, const bf16* x, int64_t n, bool tanh_form, CUstream_st* stream);

void gelu_backward(bf16* dx, const bf16* dy, const bf16* x, int64_t n, bool tanh_form,
                   CUstream_st* stream);

}  // namespace lathe::cuda
