#pragma once
// The reference fp8 casts (ops/fp8_cast.h has the math): plain loops over host memory, fp32
// arithmetic, core/dtype.h's saturating round to nearest even. The CUDA casts are tested against
// these bit for bit.

#include <cstdint>

#include "ops/fp8_cast.h"

namespace lathe::cpu {

// amax(x) over n bf16 values: the largest |x| (bit for bit one of them with the sign cleared;
// NaN when x holds a NaN).
float fp8_amax(const bf16* x, int64_t n);
// The same over f32 values (the integer max of their magnitude bits): what an op's optional amax
// output (rmsnorm_forward's y_amax, swiglu_forward's out_amax) holds on the CPU backend.
float fp8_amax(const float* x, int64_t n);

// Writes q and/or qt, scale_inv, and amax as Fp8CastArgs says. Stops (LATHE_CHECK) on arguments
// outside it: a dtype other than E4M3/E5M2, neither q nor qt, no scale_inv, current scaling
// without an amax pointer.
void fp8_cast(const Fp8CastArgs& args);

// Writes q, scale_inv, qt, scale_inv_t as Fp8BlockCastArgs says; stops on arguments outside it.
void fp8_block_cast(const Fp8BlockCastArgs& args);

}  // namespace lathe::cpu
