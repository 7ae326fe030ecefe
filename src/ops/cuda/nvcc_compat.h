#pragma once
// Include this first in every .cu file (before any header that includes fmt): it makes the
// project's host headers compile under nvcc as they do under g++.
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

// nvcc warns (2810) where a function returning a [[nodiscard]] class by reference has its result
// unused, which includes every plain assignment `status = other` (core/status.h); g++ does not.
#if defined(__NVCC__)
#pragma nv_diag_suppress 2810
#endif
