// clang-format off
#include "ops/cuda/nvcc_compat.h"  // first: before any header that includes fmt
// clang-format on

#include "ops/cuda/cuda_check.h"
#include "ops/cuda/kernel_util.cuh"
#include "ops/cuda/residual.h"

namespace lathe::cuda {

namespace {

constexpr int kThreads = 256;

template <int kVec>
__global__ void residual_forward_kernel(__nv_bfloat16* out, const __nv_bfloat16* a,
                                        const __nv_bfloat16* b, int64_t n) {
    for (int64_t g = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; g < n / kVec;
         g += int64_t(gridDim.x) * blockDim.x) {
        float va[kVec], vb[kVec];
        load_bf16<kVec>(va, a + g * kVec);
        load_bf16<kVec>(vb, b + g * kVec);
#pragma unroll
        for (int i = 0; i < kVec; ++i) va[i] += vb[i];
        store_bf16<kVec>(out + g * kVec, va);
    }
}

// grad += dout, elementwise; grad and dout never alias (the dispatcher checks).
template <int kVec>
__global__ void residual_accumulate_kernel(__nv_bfloat16* __restrict__ grad,
                                           const __nv_bfloat16* __restrict__ dout, int64_t n) {
    for (int64_t g = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; g < n / kVec;
         g += int64_t(gridDim.x) * blockDim.x) {
        float vg[kVec], vd[kVec];
        load_bf16<kVec>(vg, grad + g * kVec);
        load_bf16<kVec>(vd, dout + g * kVec);
#pragma unroll
        for (int i = 0; i < kVec; ++i) vg[i] += vd[i];
        store_bf16<kVec>(grad + g * kVec, vg);
    }
}

void accumulate(bf16* grad, const bf16* dout, int64_t n, CUstream_st* stream) {
    auto* g = reinterpret_cast<__nv_bfloat16*>(grad);
    const auto* d = reinterpret_cast<const __nv_bfloat16*>(dout);
    if (vec8_ok(n, {grad, dout}))
        residual_accumulate_kernel<8>
            <<<blocks_for(n / 8, kThreads), kThreads, 0, stream>>>(g, d, n);
    else
        residual_accumulate_kernel<1><<<blocks_for(n, kThreads), kThreads, 0, stream>>>(g, d, n);
    LATHE_CUDA_CHECK_LAUNCH();
}

}  // namespace

void residual_forward(bf16* out, const bf16* a, const bf16* b, int64_t n, CUstream_st* stream) {
    if (n == 0) return;
    auto* o = reinterpret_cast<__nv_bfloat16*>(out);
    const auto* pa = reinterpret_cast<const __nv_bfloat16*>(a);
    const auto* pb = reinterpret_cast<const __nv_bfloat16*>(b);
    if (vec8_ok(n, {out, a, b}))
        residual_forward_kernel<8>
            <<<blocks_for(n / 8, kThreads), kThreads, 0, stream>>>(o, pa, pb, n);
    else
        residual_forward_kernel<1><<<blocks_for(n, kThreads), kThreads, 0, stream>>>(o, pa, pb, n);
    LATHE_CUDA_CHECK_LAUNCH();
}

void residual_backward(bf16* da, bf16* db, const bf16* dout, int64_t n, CUstream_st* stream) {
    if (n == 0) return;
    if (da != nullptr) accumulate(da, dout, n, stream);
    if (db != nullptr) accumulate(db, dout, n, stream);
}

}  // namespace lathe::cuda
