// clang-format off
#include "ops/cuda/nvcc_compat.h"  // first: before any header that includes fmt
// clang-format on

#include <cuda_fp8.h>

#include "core/check.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/fp8_cast.h"
#include "ops/cuda/kernel_util.cuh"

namespace lathe::cuda {

namespace {

constexpr int kThreads = 256;

// |x|'s f32 bits from a bf16 pattern: unsigned maxima of these are maxima of the magnitudes, NaNs
// above every number (ops/cpu/fp8_cast.cpp reduces the same integers).
__device__ __forceinline__ unsigned magnitude_bits(unsigned short b) {
    return unsigned(b & 0x7FFFu) << 16;
}

__device__ __forceinline__ float bf16_bits_to_float(unsigned short b) {
    return __uint_as_float(unsigned(b) << 16);
}

// ops/fp8_cast.h's scale(G): the same correctly rounded fp32 division as the CPU's.
__device__ __forceinline__ float scale_from_amax(float amax, float fp8_max_value) {
    const float a = isnan(amax) ? amax : fmaxf(amax, kFp8AmaxFloor);
    return __fdiv_rn(fp8_max_value, a);
}

// Round to nearest even, saturating to the largest finite value (cvt.rn.satfinite).
template <bool kE4M3>
__device__ __forceinline__ unsigned char encode(float v) {
    return (unsigned char)__nv_cvt_float_to_fp8(v, __NV_SATFINITE, kE4M3 ? __NV_E4M3 : __NV_E5M2);
}

// Two values in one conversion (cvt.rn.satfinite.e4m3x2.f32 / e5m2x2: the same rounding and
// saturation as encode): lo's code in the low byte.
template <bool kE4M3>
__device__ __forceinline__ unsigned encode2(float lo, float hi) {
    return unsigned(__nv_cvt_float2_to_fp8x2(make_float2(lo, hi), __NV_SATFINITE,
                                             kE4M3 ? __NV_E4M3 : __NV_E5M2));
}

// Eight bf16 values (one 16-byte load) scaled and encoded to eight E4M3 codes (one 8-byte
// store), their largest magnitude folded into m.
template <bool kE4M3>
__device__ __forceinline__ uint2 encode8(uint4 w, float scale, unsigned& m) {
    const unsigned words[4] = {w.x, w.y, w.z, w.w};
    unsigned out[2] = {0, 0};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        const unsigned short lo = (unsigned short)(words[k] & 0xFFFFu);
        const unsigned short hi = (unsigned short)(words[k] >> 16);
        m = max(m, max(magnitude_bits(lo), magnitude_bits(hi)));
        out[k / 2] |= encode2<kE4M3>(__fmul_rn(bf16_bits_to_float(lo), scale),
                                     __fmul_rn(bf16_bits_to_float(hi), scale))
                      << (16 * (k % 2));
    }
    return make_uint2(out[0], out[1]);
}

// The max over the warp, then one atomicMax per warp into *out (order-independent).
__device__ __forceinline__ void warp_atomic_max(unsigned v, unsigned* out) {
    v = __reduce_max_sync(kFullMask, v);
    if (threadIdx.x % kWarpSize == 0 && v != 0) atomicMax(out, v);
}

__global__ void amax_kernel(const unsigned short* __restrict__ x, int64_t n, bool vec8,
                            unsigned* __restrict__ amax) {
    unsigned m = 0;
    const int64_t stride = int64_t(gridDim.x) * blockDim.x;
    if (vec8) {
        const uint4* xv = reinterpret_cast<const uint4*>(x);
        for (int64_t g = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; g < n / 8; g += stride) {
            const uint4 w = xv[g];
            const unsigned words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                m = max(m, magnitude_bits((unsigned short)(words[k] & 0xFFFFu)));
                m = max(m, magnitude_bits((unsigned short)(words[k] >> 16)));
            }
        }
    } else {
        for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
            m = max(m, magnitude_bits(x[i]));
    }
    warp_atomic_max(m, amax);
}

// The scale the cast uses: the given one (delayed) or the one from *amax (current).
__device__ __forceinline__ float cast_scale(const float* scale, const float* amax, float maxv) {
    return scale != nullptr ? *scale : scale_from_amax(*amax, maxv);
}

// q = cast(x * scale) elementwise over n values (8 per step when vec8); amax_out (delayed
// scaling, may be null) receives amax(x); block 0 writes scale_inv.
template <bool kE4M3>
__global__ void cast_kernel(const unsigned short* __restrict__ x, int64_t n, bool vec8,
                            const float* scale_in, const float* amax_in, float maxv,
                            unsigned char* __restrict__ q, unsigned* amax_out,
                            float* __restrict__ scale_inv) {
    const float scale = cast_scale(scale_in, amax_in, maxv);
    if (blockIdx.x == 0 && threadIdx.x == 0) *scale_inv = __fdiv_rn(1.0f, scale);
    unsigned m = 0;
    const int64_t stride = int64_t(gridDim.x) * blockDim.x;
    if (vec8) {
        const uint4* xv = reinterpret_cast<const uint4*>(x);
        uint2* qv = reinterpret_cast<uint2*>(q);
        for (int64_t g = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; g < n / 8; g += stride) {
            const uint4 w = xv[g];
            qv[g] = encode8<kE4M3>(w, scale, m);
        }
    } else {
        for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
            m = max(m, magnitude_bits(x[i]));
            q[i] = encode<kE4M3>(__fmul_rn(bf16_bits_to_float(x[i]), scale));
        }
    }
    if (amax_out != nullptr) warp_atomic_max(m, amax_out);
}

constexpr int kTile = 32;     // the transposing cast's tile side
constexpr int kTileRows = 8;  // its block is (32, 8): each thread handles 4 rows of the tile

// q (may be null) and qt from 32 x 32 tiles: each tile read once, its codes staged in shared
// memory and written transposed. Blocks: (ceil(cols / 32), ceil(rows / 32)).
template <bool kE4M3>
__global__ void cast_transpose_kernel(const unsigned short* __restrict__ x, int64_t rows,
                                      int64_t cols, const float* scale_in, const float* amax_in,
                                      float maxv, unsigned char* __restrict__ q,
                                      unsigned char* __restrict__ qt, unsigned* amax_out,
                                      float* __restrict__ scale_inv) {
    __shared__ unsigned char tile[kTile][kTile + 4];
    const float scale = cast_scale(scale_in, amax_in, maxv);
    if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0 && threadIdx.y == 0)
        *scale_inv = __fdiv_rn(1.0f, scale);
    const int64_t c0 = int64_t(blockIdx.x) * kTile, r0 = int64_t(blockIdx.y) * kTile;
    unsigned m = 0;
    for (int k = threadIdx.y; k < kTile; k += kTileRows) {
        const int64_t r = r0 + k, c = c0 + threadIdx.x;
        if (r < rows && c < cols) {
            const unsigned short b = x[r * cols + c];
            m = max(m, magnitude_bits(b));
            const unsigned char code = encode<kE4M3>(__fmul_rn(bf16_bits_to_float(b), scale));
            tile[k][threadIdx.x] = code;
            if (q != nullptr) q[r * cols + c] = code;
        }
    }
    __syncthreads();
    for (int k = threadIdx.y; k < kTile; k += kTileRows) {
        const int64_t c = c0 + k, r = r0 + threadIdx.x;
        if (r < rows && c < cols) qt[c * rows + r] = tile[threadIdx.x][k];
    }
    if (amax_out != nullptr) warp_atomic_max(m, amax_out);
}

// The same q (may be null) and qt as cast_transpose_kernel, at the memory's speed, for rows and
// cols multiples of 8 with 16-byte aligned x, 8-byte aligned q and 4-byte aligned qt (every FP8
// linear of a training step: model_check_fp8 asks for multiples of 16). 128 x 128 tiles, 256
// threads. Each thread issues its eight 16-byte loads of the tile before encoding any (32 KiB in
// flight a block), writes each load's 8 codes to q in one 8-byte store and stages them as words
// in shared memory; then each thread reads 4 words (4 rows x 4 columns of codes), transposes
// them with byte permutes and writes the 4 columns' 4 bytes, so that one store of a warp covers
// 128 contiguous bytes of a qt row, as a warp's q stores do of q rows. Staging: row r's word w
// (its columns 4w .. 4w + 3) sits at r * 32 + (w ^ (r / 4 % 32)), so that the 32 lanes of a
// warp, reading rows 4 lane .. 4 lane + 3 of one word column, hit 32 different banks. The 8B
// slice's casts take 11.9 ms a step on an H200 with these tiles and 13.6 ms with 64 x 64 tiles
// whose threads gather 8 codes of a column byte by byte (4-way bank conflicts) and store 64-byte
// qt segments (docs/PERF.md, FP8 training); the 32 x 32 kernel moves a byte a thread and reached
// about a quarter of the copy bandwidth on an H100.
constexpr int kWide = 128;
constexpr int kWideWords = kWide / 4;  // words of codes per staged row

template <bool kE4M3>
__global__ void __launch_bounds__(kThreads)
    cast_transpose_wide_kernel(const unsigned short* __restrict__ x, int64_t rows, int64_t cols,
                               const float* scale_in, const float* amax_in, float maxv,
                               unsigned char* __restrict__ q, unsigned char* __restrict__ qt,
                               unsigned* amax_out, float* __restrict__ scale_inv) {
    __shared__ unsigned tile[kWide * kWideWords];
    const float scale = cast_scale(scale_in, amax_in, maxv);
    if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) *scale_inv = __fdiv_rn(1.0f, scale);
    const int64_t c0 = int64_t(blockIdx.x) * kWide, r0 = int64_t(blockIdx.y) * kWide;
    constexpr int kGroups = kWide / 8;                   // 8-element groups per tile row
    constexpr int kPasses = kWide * kGroups / kThreads;  // 16-byte loads per thread
    uint4 w[kPasses];
#pragma unroll
    for (int pass = 0; pass < kPasses; ++pass) {
        const int t = pass * kThreads + int(threadIdx.x);
        const int64_t r = r0 + t / kGroups, c = c0 + 8 * (t % kGroups);
        if (r < rows && c < cols) w[pass] = *reinterpret_cast<const uint4*>(x + r * cols + c);
    }
    unsigned m = 0;
#pragma unroll
    for (int pass = 0; pass < kPasses; ++pass) {
        const int t = pass * kThreads + int(threadIdx.x);
        const int tr = t / kGroups, tg = t % kGroups;
        const int64_t r = r0 + tr, c = c0 + 8 * tg;
        if (r < rows && c < cols) {
            const uint2 codes = encode8<kE4M3>(w[pass], scale, m);
            const int swz = (tr / 4) % kWideWords;
            tile[tr * kWideWords + ((2 * tg) ^ swz)] = codes.x;
            tile[tr * kWideWords + ((2 * tg + 1) ^ swz)] = codes.y;
            if (q != nullptr) *reinterpret_cast<uint2*>(q + r * cols + c) = codes;
        }
    }
    __syncthreads();
    const int lane = int(threadIdx.x) % kWarpSize, warp = int(threadIdx.x) / kWarpSize;
    const int64_t r = r0 + 4 * lane;
#pragma unroll
    for (int k = 0; k < kWideWords / (kThreads / kWarpSize); ++k) {
        const int wc = warp + k * (kThreads / kWarpSize);  // word column: tile columns 4 wc ..
        const int64_t c = c0 + 4 * wc;
        if (r < rows && c < cols) {
            unsigned v[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) v[i] = tile[(4 * lane + i) * kWideWords + (wc ^ lane)];
            // out[j]'s byte i = v[i]'s byte j: column 4 wc + j of rows 4 lane .. 4 lane + 3.
            const unsigned lo01 = __byte_perm(v[0], v[1], 0x5140),
                           hi01 = __byte_perm(v[0], v[1], 0x7362),
                           lo23 = __byte_perm(v[2], v[3], 0x5140),
                           hi23 = __byte_perm(v[2], v[3], 0x7362);
            const unsigned out[4] = {
                __byte_perm(lo01, lo23, 0x5410), __byte_perm(lo01, lo23, 0x7632),
                __byte_perm(hi01, hi23, 0x5410), __byte_perm(hi01, hi23, 0x7632)};
#pragma unroll
            for (int j = 0; j < 4; ++j)
                *reinterpret_cast<unsigned*>(qt + (c + j) * rows + r) = out[j];
        }
    }
    if (amax_out != nullptr) warp_atomic_max(m, amax_out);
}

// Blockwise: one CTA of 256 threads per 128 x 128 tile of x, staged in shared memory (zeros
// beyond the edges, which change no maximum).
constexpr int kB = int(kFp8BlockSize);
constexpr int kPitch = kB + 2;  // bf16 elements per staged row (breaks bank alignment of columns)

template <bool kE4M3>
__global__ void block_cast_kernel(const unsigned short* __restrict__ x, int64_t rows, int64_t cols,
                                  bool square, float maxv, unsigned char* __restrict__ q,
                                  float* __restrict__ scale_inv, unsigned char* __restrict__ qt,
                                  float* __restrict__ scale_inv_t) {
    __shared__ unsigned short tile[kB * kPitch];
    __shared__ unsigned warp_max_bits[kThreads / kWarpSize];
    const int64_t bi = blockIdx.y, bj = blockIdx.x;
    const int64_t r0 = bi * kB, c0 = bj * kB;
    const int64_t rb = (rows + kB - 1) / kB, cb = (cols + kB - 1) / kB;
    const int nr = int(rows - r0 < kB ? rows - r0 : kB), nc = int(cols - c0 < kB ? cols - c0 : kB);
    unsigned m = 0;
    for (int i = threadIdx.x; i < kB * kB; i += kThreads) {
        const int r = i / kB, c = i % kB;
        const unsigned short b = (r < nr && c < nc) ? x[(r0 + r) * cols + c0 + c] : 0;
        tile[r * kPitch + c] = b;
        m = max(m, magnitude_bits(b));
    }
    __syncthreads();
    const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
    constexpr int kWarps = kThreads / kWarpSize;
    if (square) {
        m = __reduce_max_sync(kFullMask, m);
        if (lane == 0) warp_max_bits[warp] = m;
        __syncthreads();
        unsigned all = 0;
#pragma unroll
        for (int w = 0; w < kWarps; ++w) all = max(all, warp_max_bits[w]);
        const float scale = scale_from_amax(__uint_as_float(all), maxv);
        if (threadIdx.x == 0) scale_inv[bi * cb + bj] = __fdiv_rn(1.0f, scale);
        for (int i = threadIdx.x; i < nr * kB; i += kThreads) {
            const int r = i / kB, c = i % kB;
            if (c < nc)
                q[(r0 + r) * cols + c0 + c] =
                    encode<kE4M3>(__fmul_rn(bf16_bits_to_float(tile[r * kPitch + c]), scale));
        }
        if (qt != nullptr)
            for (int i = threadIdx.x; i < nc * kB; i += kThreads) {
                const int c = i / kB, r = i % kB;
                if (r < nr)
                    qt[(c0 + c) * rows + r0 + r] =
                        encode<kE4M3>(__fmul_rn(bf16_bits_to_float(tile[r * kPitch + c]), scale));
            }
        return;
    }
    // 1 x 128: a warp per row of the tile (each lane 4 elements), then a warp per column.
    if (q != nullptr)
        for (int r = warp; r < nr; r += kWarps) {
            unsigned rm = 0;
#pragma unroll
            for (int k = 0; k < kB / kWarpSize; ++k)
                rm = max(rm, magnitude_bits(tile[r * kPitch + lane + k * kWarpSize]));
            rm = __reduce_max_sync(kFullMask, rm);
            const float scale = scale_from_amax(__uint_as_float(rm), maxv);
            if (lane == 0) scale_inv[(r0 + r) * cb + bj] = __fdiv_rn(1.0f, scale);
#pragma unroll
            for (int k = 0; k < kB / kWarpSize; ++k) {
                const int c = lane + k * kWarpSize;
                if (c < nc)
                    q[(r0 + r) * cols + c0 + c] =
                        encode<kE4M3>(__fmul_rn(bf16_bits_to_float(tile[r * kPitch + c]), scale));
            }
        }
    if (qt != nullptr)
        for (int c = warp; c < nc; c += kWarps) {
            unsigned cm = 0;
#pragma unroll
            for (int k = 0; k < kB / kWarpSize; ++k)
                cm = max(cm, magnitude_bits(tile[(lane + k * kWarpSize) * kPitch + c]));
            cm = __reduce_max_sync(kFullMask, cm);
            const float scale = scale_from_amax(__uint_as_float(cm), maxv);
            if (lane == 0) scale_inv_t[(c0 + c) * rb + bi] = __fdiv_rn(1.0f, scale);
#pragma unroll
            for (int k = 0; k < kB / kWarpSize; ++k) {
                const int r = lane + k * kWarpSize;
                if (r < nr)
                    qt[(c0 + c) * rows + r0 + r] =
                        encode<kE4M3>(__fmul_rn(bf16_bits_to_float(tile[r * kPitch + c]), scale));
            }
        }
}

bool aligned(const void* p, uintptr_t bytes) {
    return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

void check_common(DType t, int64_t rows, int64_t cols, const void* x, const char* what) {
    LATHE_CHECK(is_fp8(t), "cuda::{}: the fp8 dtype must be e4m3 or e5m2, not {}", what,
                dtype_name(t));
    LATHE_CHECK(rows >= 0 && cols >= 0 && (x != nullptr || rows * cols == 0),
                "cuda::{}: no input ({} x {})", what, rows, cols);
}

}  // namespace

void fp8_amax(const bf16* x, int64_t n, float* amax, CUstream_st* stream) {
    LATHE_CUDA_CHECK(cudaMemsetAsync(amax, 0, sizeof(float), stream));
    if (n == 0) return;
    const bool vec8 = vec8_ok(n, {x});
    const unsigned blocks = blocks_for(vec8 ? n / 8 : n, kThreads, 132 * 8);
    amax_kernel<<<blocks, kThreads, 0, stream>>>(reinterpret_cast<const unsigned short*>(x), n,
                                                 vec8, reinterpret_cast<unsigned*>(amax));
    LATHE_CUDA_CHECK_LAUNCH();
}

void fp8_cast(const Fp8CastArgs& a, CUstream_st* stream) {
    check_common(a.dtype, a.rows, a.cols, a.x, "fp8_cast");
    LATHE_CHECK(a.q != nullptr || a.qt != nullptr, "cuda::fp8_cast: neither q nor qt to write");
    LATHE_CHECK(a.scale_inv != nullptr, "cuda::fp8_cast: no scale_inv to write");
    LATHE_CHECK(a.scale != nullptr || a.amax != nullptr,
                "cuda::fp8_cast: current scaling needs an amax pointer");
    const int64_t n = a.rows * a.cols;
    const auto* x = reinterpret_cast<const unsigned short*>(a.x);
    unsigned* amax_out = nullptr;
    if (a.scale == nullptr) {
        if (!a.amax_ready) fp8_amax(a.x, n, a.amax, stream);
    } else if (a.amax != nullptr) {
        LATHE_CUDA_CHECK(cudaMemsetAsync(a.amax, 0, sizeof(float), stream));
        amax_out = reinterpret_cast<unsigned*>(a.amax);
    }
    const float* amax_in = a.scale == nullptr ? a.amax : nullptr;
    const float maxv = fp8_max(a.dtype);
    const bool e4m3 = a.dtype == DType::kE4M3;
    auto* q = static_cast<unsigned char*>(a.q);
    auto* qt = static_cast<unsigned char*>(a.qt);
    if (qt == nullptr) {
        const bool vec8 = vec8_ok(n, {a.x, a.q});
        const unsigned blocks = blocks_for(vec8 ? n / 8 : n, kThreads, 132 * 16);
        if (e4m3)
            cast_kernel<true><<<blocks, kThreads, 0, stream>>>(x, n, vec8, a.scale, amax_in, maxv,
                                                               q, amax_out, a.scale_inv);
        else
            cast_kernel<false><<<blocks, kThreads, 0, stream>>>(x, n, vec8, a.scale, amax_in, maxv,
                                                                q, amax_out, a.scale_inv);
    } else if (a.rows % 8 == 0 && a.cols % 8 == 0 && aligned(a.x, 16) &&
               (q == nullptr || aligned(q, 8)) && aligned(qt, 4)) {
        const dim3 grid(unsigned(std::max<int64_t>(1, (a.cols + kWide - 1) / kWide)),
                        unsigned(std::max<int64_t>(1, (a.rows + kWide - 1) / kWide)));
        if (e4m3)
            cast_transpose_wide_kernel<true><<<grid, kThreads, 0, stream>>>(
                x, a.rows, a.cols, a.scale, amax_in, maxv, q, qt, amax_out, a.scale_inv);
        else
            cast_transpose_wide_kernel<false><<<grid, kThreads, 0, stream>>>(
                x, a.rows, a.cols, a.scale, amax_in, maxv, q, qt, amax_out, a.scale_inv);
    } else {
        const dim3 grid(unsigned(std::max<int64_t>(1, (a.cols + kTile - 1) / kTile)),
                        unsigned(std::max<int64_t>(1, (a.rows + kTile - 1) / kTile)));
        const dim3 block(kTile, kTileRows);
        if (e4m3)
            cast_transpose_kernel<true><<<grid, block, 0, stream>>>(
                x, a.rows, a.cols, a.scale, amax_in, maxv, q, qt, amax_out, a.scale_inv);
        else
            cast_transpose_kernel<false><<<grid, block, 0, stream>>>(
                x, a.rows, a.cols, a.scale, amax_in, maxv, q, qt, amax_out, a.scale_inv);
    }
    LATHE_CUDA_CHECK_LAUNCH();
}

void fp8_block_cast(const Fp8BlockCastArgs& a, CUstream_st* stream) {
    check_common(a.dtype, a.rows, a.cols, a.x, "fp8_block_cast");
    LATHE_CHECK(a.q != nullptr || a.qt != nullptr,
                "cuda::fp8_block_cast: neither q nor qt to write");
    LATHE_CHECK(a.q == nullptr || a.scale_inv != nullptr,
                "cuda::fp8_block_cast: q without scale_inv");
    LATHE_CHECK(a.block == Fp8Block::k128x128 || a.qt == nullptr || a.scale_inv_t != nullptr,
                "cuda::fp8_block_cast: a 1x128 qt without scale_inv_t");
    LATHE_CHECK(a.block == Fp8Block::k1x128 || a.q != nullptr,
                "cuda::fp8_block_cast: 128x128 blocks write qt next to q (its scales are q's)");
    if (a.rows == 0 || a.cols == 0) return;
    const dim3 grid(unsigned(fp8_blocks(a.cols)), unsigned(fp8_blocks(a.rows)));
    const auto* x = reinterpret_cast<const unsigned short*>(a.x);
    const bool square = a.block == Fp8Block::k128x128;
    auto* q = static_cast<unsigned char*>(a.q);
    auto* qt = static_cast<unsigned char*>(a.qt);
    if (a.dtype == DType::kE4M3)
        block_cast_kernel<true><<<grid, kThreads, 0, stream>>>(
            x, a.rows, a.cols, square, fp8_max(a.dtype), q, a.scale_inv, qt, a.scale_inv_t);
    else
        block_cast_kernel<false><<<grid, kThreads, 0, stream>>>(
            x, a.rows, a.cols, square, fp8_max(a.dtype), q, a.scale_inv, qt, a.scale_inv_t);
    LATHE_CUDA_CHECK_LAUNCH();
}

}  // namespace lathe::cuda
