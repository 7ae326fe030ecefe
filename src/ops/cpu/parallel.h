#pragma once
// OpenMP for the CPU reference ops, spelled so that a build without OpenMP compiles the same loops
// serially without unknown-pragma warnings. Every parallel loop in ops/cpu gives each iteration
// its own outputs and reduces in a fixed order, so results do not depend on the thread count.
//
// LATHE_OMP_PARALLEL_FOR(work): a parallel for over the next loop when `work` (roughly the
// number of multiply-adds the loop does) is worth waking threads for; small loops run serially,
// which keeps tests fast on a shared, busy machine where a parallel region can cost milliseconds.

#include <cstdint>

namespace lathe::cpu {
inline constexpr int64_t kMinParallelWork = int64_t(1) << 15;
}  // namespace lathe::cpu

#define LATHE_PRAGMA_(x) _Pragma(#x)
#ifdef _OPENMP
#define LATHE_OMP_PARALLEL_FOR(work) \
    LATHE_PRAGMA_(omp parallel for schedule(static) if ((work) >= ::lathe::cpu::kMinParallelWork))
#else
#define LATHE_OMP_PARALLEL_FOR(work)
#endif
