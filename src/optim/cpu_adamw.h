#pragma once
// CpuAdamW: the AdamW update of ops/adamw.h on the host, over every core, for optimizer offload
// (the FP32 masters and the moments of some parameters in pinned host memory, stepped on the CPU
// while the GPU runs).
//
// Math: per element, the sequence of ops/cpu/adamw.cpp and the CUDA kernel, in fp32, in this
// order (the scalars formed in fp64 and rounded to fp32 as those do; t = step >= 1):
//   g  = grads[i];  g = g * coef                 only when coef < 1 (clipping, below)
//   p  = params[i]; p = p * (1 - lr*wd)          only when wd != 0
//   mi = fma(1 - beta1, g - m, m)                when |1 - beta1| < 0.5, else
//        fma((1 - beta1) - 1, g - m, g)          (torch's lerp: one fused multiply-add)
//   vi = v * beta2 + ((1 - beta2) * g) * g
//   p  = p + (-(lr / (1 - beta1^t)) * mi) / (sqrt(vi) / sqrt(1 - beta2^t) + eps)
//   params[i] = p; m = mi; v = vi; params_bf16[i] = bf16(p) (round to nearest even)
// Every multiply, add, divide and square root is one correctly rounded IEEE fp32 operation (and
// the lerp one correctly rounded fma), with no other contraction (the file is compiled with
// -ffp-contract=off), on every path. The scalar path defines the result; the vector paths
// (AVX2+FMA and AVX-512 on x86-64, chosen at run time from CPUID; NEON on aarch64) perform the
// same operations lane by lane, so every path writes the same bits, and those are the bits of
// ops' CPU adamw_update_with_copy (and of the CUDA kernel, whose operations are the same
// correctly rounded ones) on the same inputs. Tests: optim/cpu_adamw_test.cpp.
//
// Clipping: with clip_norm (the global gradient norm, one f32 on the host) coef =
// grad_clip_coefficient(norm, max_norm) = min(1, max_norm / (norm + 1e-6)), 1 when the norm is
// not finite, and the gradients are scaled in registers (never written), as the CUDA kernel does.
//
// Moment storage (AdamWStateDType, optimizer.state_dtype):
//   kF32   m and v are f32, as ops/adamw.h.
//   kBF16  m and v are bf16: each load widens exactly (bits << 16), the update runs in fp32 as
//          above, each store rounds to nearest even (core/dtype.h float_to_bf16: ties to even,
//          overflow to infinity, NaN to a quiet NaN of the same sign). The masters stay f32.
//          Half the moment bytes; the moments carry 8 significant bits between steps.
//
// Buffers (CpuAdamWBuffers): flat host vectors of the same P elements (a parameter arena and its
// twins), read and written in place; segments name the [offset, offset + count) ranges to update
// with their group's lr and weight decay (inside [0, P), pairwise disjoint: checked), the rest is
// left alone. params_bf16 (may be null) is where the updated weights go as bf16, typically a
// pinned staging buffer copied to the GPU afterwards; the x86-64 vector paths write it with
// non-temporal stores (no read of the destination's cache lines first; the same values).
//
// Threads: a pool of threads() - 1 workers kept alive for the object's lifetime, plus the calling
// thread. step() splits the elements of the segments (in list order, as one concatenated range)
// into threads() contiguous parts of nearly equal length, part k to thread k, each part boundary
// a multiple of kCpuAdamWPageElems elements of that range, so a 4 KiB page of f32 or bf16 state
// is written by one thread (when the segment starts on a page). The partition depends only on
// the segment list and threads(); the result depends on neither (the update is elementwise).
// NUMA: zero_state() writes the zeros of the moments through the same partition, so under
// Linux's first-touch policy each page of fresh (untouched) memory lands on the node of the
// thread that later updates it; callers allocate the moments untouched (no memset, no
// cudaHostAlloc zero fill) and call zero_state() with the segments they step with. Threads are
// not pinned to cores (the OS keeps them where they ran); no libnuma.
//
// Ownership: CpuAdamW owns its threads only (move-only; the destructor joins them); the buffers
// belong to the caller. One step() at a time per object (not reentrant).

#include <cstdint>
#include <memory>
#include <span>

#include "core/dtype.h"
#include "core/status.h"
#include "model/host_memory_plan.h"
#include "ops/adamw.h"

namespace lathe {

// AdamWStateDType (optimizer.state_dtype) is model/host_memory_plan.h's.

// The inner loop's instruction set. kAuto picks the widest available one.
enum class CpuAdamWPath { kAuto, kScalar, kAvx2, kAvx512, kNeon };
const char* cpu_adamw_path_name(CpuAdamWPath path);  // "auto", "scalar", "avx2", ...
// Compiled into this binary for this architecture and supported by this CPU (kAuto: true).
bool cpu_adamw_path_available(CpuAdamWPath path);
// The path kAuto resolves to on this CPU.
CpuAdamWPath cpu_adamw_best_path();

// Elements per partition granule: one 4 KiB page of bf16, two of f32.
inline constexpr int64_t kCpuAdamWPageElems = 2048;

struct CpuAdamWBuffers {
    int64_t numel = 0;             // P
    float* params = nullptr;       // (P) f32 masters, updated in place
    void* m = nullptr;             // (P) first moment, f32 or bf16 as state_dtype
    void* v = nullptr;             // (P) second moment, likewise
    const float* grads = nullptr;  // (P) f32 gradients
    bf16* params_bf16 = nullptr;   // (P) bf16 copy of the updated weights, or null
    AdamWStateDType state_dtype = AdamWStateDType::kF32;
};

class CpuAdamW {
public:
    // threads: the threads that step (the caller included); 0 = std::thread::hardware_concurrency.
    // path: kAuto or one that cpu_adamw_path_available says is available.
    // Errors: threads < 0, an unavailable path (kInvalidArgument).
    static Result<CpuAdamW> create(int threads = 0, CpuAdamWPath path = CpuAdamWPath::kAuto);

    CpuAdamW(CpuAdamW&&) noexcept;
    CpuAdamW& operator=(CpuAdamW&&) noexcept;
    ~CpuAdamW();

    int threads() const;
    CpuAdamWPath path() const;  // resolved (never kAuto)

    // m = v = 0 over the segments, each part written by the thread step() gives it (first touch).
    void zero_state(const CpuAdamWBuffers& buf, std::span<const AdamWSegment> segments);

    // One AdamW update (the header's math) of every element of every segment. step >= 1
    // (checked). clip_norm null: no clipping.
    void step(const CpuAdamWBuffers& buf, std::span<const AdamWSegment> segments,
              const AdamWHyper& hyper, int64_t step, const float* clip_norm, float max_norm);

private:
    struct Impl;
    explicit CpuAdamW(std::unique_ptr<Impl> impl);
    std::unique_ptr<Impl> impl_;
};

}  // namespace lathe
