#pragma once
// Warp-level tensor-core helpers (inline PTX, sm_80 and later): ldmatrix, mma.sync m16n8k16 with
// bf16 inputs and f32 accumulation, and cp.async 16-byte copies with zero fill. Internal to .cu
// files.
//
// Fragment layouts of m16n8k16 (PTX ISA, "Matrix fragments for mma.m16n8k16"), lane = 4 gid + tig:
//   A (16 x 16, row-major), four bf16x2 registers: a0 (gid, 2 tig..+1), a1 (gid + 8, 2 tig..+1),
//     a2 (gid, 8 + 2 tig..+1), a3 (gid + 8, 8 + 2 tig..+1);
//   B (16 x 8, column-major), two: b0 (k = 2 tig..+1, n = gid), b1 (k = 8 + 2 tig..+1, n = gid);
//   C (16 x 8, f32), four: c0 (gid, 2 tig), c1 (gid, 2 tig + 1), c2 (gid + 8, 2 tig),
//     c3 (gid + 8, 2 tig + 1).
// The low half of a bf16x2 register holds the lower column (or k).

#include <cuda_bf16.h>

#include <cstdint>

namespace lathe::cuda {

__device__ __forceinline__ uint32_t shared_address(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Four 8 x 8 bf16 matrices from shared memory: lane l gives the address of row l % 8 of matrix
// l / 8 (16 contiguous bytes); r[i] is matrix i's fragment: thread t holds row t / 4, columns
// 2 (t % 4) and 2 (t % 4) + 1.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(shared_address(row))
                 : "memory");
}

// The same, each matrix transposed: thread t holds rows 2 (t % 4) and 2 (t % 4) + 1 of column
// t / 4.
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(shared_address(row))
                 : "memory");
}

// c += a b: m16n8k16, bf16 inputs (exact products), f32 accumulation.
__device__ __forceinline__ void mma_bf16_m16n8k16(float (&c)[4], const uint32_t (&a)[4],
                                                  uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// (lo, hi) rounded to nearest even bf16, as one bf16x2 register (lo in the low half).
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&h);
}

// 16 bytes from global to shared memory, asynchronously (cp.async.cg: through L2 only). With
// `bytes` 0 it writes 16 zero bytes and reads nothing (src must still be a valid address).
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, int bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_address(dst)),
                 "l"(src), "r"(bytes)
                 : "memory");
}

__device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// Waits until at most kPending of this thread's committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

}  // namespace lathe::cuda
