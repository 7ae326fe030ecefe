#pragma once
// Include this first in every .cu file that (directly or through core/ headers) includes fmt.
//
// fmt 9 switches its constexpr support off when it sees nvcc (FMT_USE_CONSTEXPR), but keeps a few
// functions `constexpr` that then call helpers which are no longer constexpr; nvcc's host pass in
// C++20 rejects that ("call to non-constexpr function ... ignore_unused"). The host compiler that
// builds the .cpp files (g++) compiles fmt with FMT_USE_CONSTEXPR=1, so defining it here makes
// both kinds of translation unit see the same fmt. (The cleaner home is a CUDA-only compile
// definition in CMakeLists.txt; see docs/CUDA.md.)
#if defined(__NVCC__) && !defined(FMT_USE_CONSTEXPR)
#define FMT_USE_CONSTEXPR 1
#endif
