// clang-format off
#include "ops/cuda/nvcc_compat.h"  // first: before any header that includes fmt
// clang-format on

#include <cub/device/device_radix_sort.cuh>

#include "core/check.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/cuda_state.h"
#include "ops/cuda/embedding.h"
#include "ops/cuda/kernel_util.cuh"

namespace lathe::cuda {

namespace {

constexpr int kForwardThreads = 256;  // 8 warps, one row each
constexpr int kRowsPerBlock = kForwardThreads / kWarpSize;

template <int kVec>
__global__ void embedding_forward_warp_per_row_kernel(
    __nv_bfloat16* __restrict__ out, const int32_t* __restrict__ tokens,
    const int32_t* __restrict__ positions, const __nv_bfloat16* __restrict__ wte,
    const __nv_bfloat16* __restrict__ wpe, int64_t N, int64_t T, int64_t C, int64_t V, int64_t P) {
    const int lane = threadIdx.x % kWarpSize;
    const int64_t n = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarpSize;
    if (n >= N) return;
    const int64_t tok = tokens[n];
    LATHE_DEVICE_CHECK(tok >= 0 && tok < V, "token id %lld at row %lld, vocabulary %lld",
                       (long long)tok, (long long)n, (long long)V);
    const __nv_bfloat16* e = wte + tok * C;
    const __nv_bfloat16* p = nullptr;
    if (wpe != nullptr) {
        const int64_t pos = positions ? int64_t(positions[n]) : n % T;
        LATHE_DEVICE_CHECK(pos >= 0 && pos < P, "position %lld at row %lld, table %lld",
                           (long long)pos, (long long)n, (long long)P);
        p = wpe + pos * C;
    }
    for (int64_t c = int64_t(lane) * kVec; c < C; c += kWarpSize * kVec) {
        float v[kVec];
        load_bf16<kVec>(v, e + c);
        if (p != nullptr) {
            float w[kVec];
            load_bf16<kVec>(w, p + c);
#pragma unroll
            for (int i = 0; i < kVec; ++i) v[i] += w[i];
        }
        store_bf16<kVec>(out + n * C + c, v);
    }
}

// ---- Backward: a stable sort of (id, row), then one ordered sum per id segment ----
//
// Bit-equality with the CPU twin needs every table element to be summed by one thread, starting
// from its old value and adding the rows in row order. A stable sort of the pairs (id(n), n) by id
// lines up each id's rows in row order (its "segment"); a thread owning (segment, column) then adds
// them one after another. No float atomics; the sort's output is unique (stable), so two runs give
// the same bits.

constexpr int kWindow = 64;           // sorted positions per block chunk, and per step of a walk
constexpr int kMaxSortThreads = 256;  // column threads per block
constexpr uint32_t kNoKey = 0xFFFFFFFFu;  // past the end (ids are < 2^31)

// The ids whose rows the table holds: [begin, begin + rows), at table row id - begin. The whole
// table (begin 0) for embedding_backward; a vocabulary shard for embedding_backward_shard, whose
// other ids are sorted like any id (each its own segment) but their segments load and store
// nothing.
struct HeldKeys {
    uint32_t begin;
    uint32_t rows;
    __device__ __forceinline__ bool held(uint32_t key) const { return key - begin < rows; }
    __device__ __forceinline__ int64_t row(uint32_t key) const { return int64_t(key - begin); }
};

// rows_in[n] = n, and every id is checked against [0, total) (an id outside it traps).
__global__ void embedding_sort_prepare_kernel(int32_t* __restrict__ rows_in,
                                              const int32_t* __restrict__ ids, int64_t N,
                                              int64_t total) {
    for (int64_t n = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; n < N;
         n += int64_t(gridDim.x) * blockDim.x) {
        const int64_t id = ids[n];
        LATHE_DEVICE_CHECK(id >= 0 && id < total, "id %lld at row %lld, ids below %lld",
                           (long long)id, (long long)n, (long long)total);
        rows_in[n] = int32_t(n);
    }
}

// Lane l gets the sorted keys and rows at base + l and base + 32 + l (kNoKey past the end).
__device__ __forceinline__ void fetch_window(uint32_t (&k)[2], int32_t (&r)[2],
                                             const uint32_t* __restrict__ keys,
                                             const int32_t* __restrict__ rows, int64_t base,
                                             int64_t N, int lane) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int64_t q = base + h * kWarpSize + lane;
        k[h] = q < N ? keys[q] : kNoKey;
        r[h] = q < N ? rows[q] : 0;
    }
}

// Block (x, y): the segments of the sorted keys that start at a position in
// [64 x, 64 x + 64), columns [y w, y w + w) with w = blockDim.x, one column per thread. The threads
// walk the positions in order, 64 at a time, from the chunk's first segment start to the end of the
// last segment starting in the chunk (which may run far past the chunk: one id repeated everywhere
// is a single segment, walked by the block of the chunk where it starts). Each thread computes
// dtable[key, c] = (...(dtable[key, c] + dout[row_0, c]) + dout[row_1, c]) ... in sorted (= row)
// order: the CPU twin's additions exactly. Control flow depends on the keys only, so it is uniform
// over the block; threads past C stay in the walk (the lanes' shuffles need the whole warp) but
// load and store nothing. A segment whose key the table does not hold (HeldKeys) is walked the
// same way and loads and stores nothing.
__global__ void __launch_bounds__(kMaxSortThreads)
    embedding_backward_segments_kernel(float* __restrict__ dtable,
                                       const __nv_bfloat16* __restrict__ dout,
                                       const uint32_t* __restrict__ keys,
                                       const int32_t* __restrict__ rows, int64_t N, int64_t C,
                                       HeldKeys table) {
    const int lane = threadIdx.x % kWarpSize;
    const int64_t p0 = int64_t(blockIdx.x) * kWindow;
    const int64_t chunk_end = min(N, p0 + kWindow);
    // The chunk's first segment start (p == 0 or a key change), found by each warp with ballots.
    int64_t first = chunk_end;
    for (int64_t base = p0; base < chunk_end && first == chunk_end; base += kWarpSize) {
        const int64_t q = base + lane;
        const bool start = q < chunk_end && (q == 0 || keys[q] != keys[q - 1]);
        const unsigned ballot = __ballot_sync(kFullMask, start);
        if (ballot != 0) first = base + __ffs(ballot) - 1;
    }
    if (first == chunk_end) return;  // the whole chunk lies inside an earlier chunk's segment

    const int64_t col = int64_t(blockIdx.y) * blockDim.x + threadIdx.x;
    const bool active = col < C;
    const __nv_bfloat16* src = dout + (active ? col : 0);
    float* dst = dtable + (active ? col : 0);
    // Positions past the chunk still belong to this block while they carry the chunk's last key
    // (that segment started in the chunk: the chunk holds a start at or before it).
    const uint32_t last_key = keys[chunk_end - 1];
    uint32_t cur = keys[first];  // the open segment's key
    float acc = active && table.held(cur) ? dst[table.row(cur) * C] : 0.0f;
    int64_t p = first;
    uint32_t wk[2];
    int32_t wr[2];
    fetch_window(wk, wr, keys, rows, p, N, lane);
    while (true) {
        uint32_t nk[2];
        int32_t nr[2];
        fetch_window(nk, nr, keys, rows, p + kWindow, N, lane);  // in flight during this window
        if (__shfl_sync(kFullMask, wk[1], kWarpSize - 1) == cur) {
            // All 64 positions continue the open segment (sorted keys: the last equal to the open
            // one means all are; kNoKey past the end never is): 64 row loads, then the adds, or
            // nothing for a key the table does not hold (cur is the same in the whole block).
            if (table.held(cur)) {
                float v[kWindow];
#pragma unroll
                for (int j = 0; j < kWindow; ++j) {
                    const int64_t r = __shfl_sync(kFullMask, wr[j / kWarpSize], j % kWarpSize);
                    v[j] = active ? __bfloat162float(src[r * C]) : 0.0f;
                }
#pragma unroll
                for (int j = 0; j < kWindow; ++j) acc += v[j];
            }
        } else {
            // Segment ends and starts inside the window: per half, the rows and the old table rows
            // of the segments starting there are loaded first, then added in order.
            const uint32_t key31 = __shfl_sync(kFullMask, wk[0], kWarpSize - 1);
            unsigned in_mask[2], start_mask[2];
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int64_t q = p + h * kWarpSize + lane;
                const uint32_t up = __shfl_up_sync(kFullMask, wk[h], 1);
                const uint32_t prev = lane > 0 ? up : (h == 0 ? cur : key31);
                const bool in = q < N && (q < chunk_end || wk[h] == last_key);
                in_mask[h] = __ballot_sync(kFullMask, in);
                start_mask[h] = __ballot_sync(kFullMask, in && wk[h] != prev);
            }
            bool done = false;
#pragma unroll
            for (int h = 0; h < 2 && !done; ++h) {
                float v[kWarpSize], init[kWarpSize];
#pragma unroll
                for (int j = 0; j < kWarpSize; ++j) {
                    const int64_t r = __shfl_sync(kFullMask, wr[h], j);
                    const uint32_t k = __shfl_sync(kFullMask, wk[h], j);
                    const bool in = (in_mask[h] >> j) & 1u, start = (start_mask[h] >> j) & 1u;
                    const bool held = active && table.held(k);
                    v[j] = held && in ? __bfloat162float(src[r * C]) : 0.0f;
                    init[j] = held && start ? dst[table.row(k) * C] : 0.0f;
                }
#pragma unroll
                for (int j = 0; j < kWarpSize; ++j) {
                    if (!((in_mask[h] >> j) & 1u)) break;  // the mask is the same in every lane
                    if ((start_mask[h] >> j) & 1u) {
                        if (active && table.held(cur)) dst[table.row(cur) * C] = acc;
                        cur = __shfl_sync(kFullMask, wk[h], j);
                        acc = init[j];
                    }
                    acc += v[j];
                }
                done = in_mask[h] != kFullMask;
            }
            if (done) break;
        }
        p += kWindow;
#pragma unroll
        for (int h = 0; h < 2; ++h) wk[h] = nk[h], wr[h] = nr[h];
    }
    if (active && table.held(cur)) dst[table.row(cur) * C] = acc;
}

// kVec (1 or 2) consecutive values as fp32, and back; p aligned to kVec elements.
template <int kVec>
__device__ __forceinline__ void load_vec(float (&v)[kVec], const __nv_bfloat16* p) {
    if constexpr (kVec == 2) {
        const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(p));
        v[0] = f.x, v[1] = f.y;
    } else {
        v[0] = __bfloat162float(*p);
    }
}

template <int kVec>
__device__ __forceinline__ void load_vec(float (&v)[kVec], const float* p) {
    if constexpr (kVec == 2) {
        const float2 f = *reinterpret_cast<const float2*>(p);
        v[0] = f.x, v[1] = f.y;
    } else {
        v[0] = *p;
    }
}

template <int kVec>
__device__ __forceinline__ void store_vec(float* p, const float (&v)[kVec]) {
    if constexpr (kVec == 2)
        *reinterpret_cast<float2*>(p) = make_float2(v[0], v[1]);
    else
        *p = v[0];
}

// dwpe[t, c] += dout[b, t, c] for b = 0..B-1 in order (positions 0..T-1 in every sequence): each
// element summed by one thread in row order, as the CPU twin does. Thread = (t, kVec columns).
template <int kVec>
__global__ void embedding_backward_positions_kernel(float* __restrict__ dwpe,
                                                    const __nv_bfloat16* __restrict__ dout,
                                                    int64_t B, int64_t T, int64_t C) {
    constexpr int kUnroll = 8;
    const int64_t vecs = C / kVec;
    for (int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; idx < T * vecs;
         idx += int64_t(gridDim.x) * blockDim.x) {
        const int64_t t = idx / vecs, col = (idx % vecs) * kVec;
        float acc[kVec];
        load_vec<kVec>(acc, dwpe + t * C + col);
        const __nv_bfloat16* src = dout + t * C + col;
        for (int64_t b0 = 0; b0 < B; b0 += kUnroll) {
            float v[kUnroll][kVec];
#pragma unroll
            for (int j = 0; j < kUnroll; ++j) {
                if (b0 + j < B) {
                    load_vec<kVec>(v[j], src + (b0 + j) * T * C);
                } else {
#pragma unroll
                    for (int i = 0; i < kVec; ++i) v[j][i] = 0.0f;
                }
            }
#pragma unroll
            for (int j = 0; j < kUnroll; ++j) {
                if (b0 + j >= B) break;
#pragma unroll
                for (int i = 0; i < kVec; ++i) acc[i] += v[j][i];
            }
        }
        store_vec<kVec>(dwpe + t * C + col, acc);
    }
}

size_t align_up(size_t bytes) {
    return (bytes + 255) / 256 * 256;
}

// The sort's pieces inside the state's scratch: sorted keys, the row indices before and after,
// and CUB's temporary storage.
struct SortScratch {
    uint32_t* keys_out;
    int32_t* rows_in;
    int32_t* rows_out;
    void* temp;
    size_t temp_bytes;
};

int key_bits(int64_t rows) {
    int bits = 1;
    while (bits < 31 && (int64_t(1) << bits) < rows) ++bits;
    return bits;
}

size_t cub_sort_bytes(int64_t N, int bits) {
    size_t bytes = 0;
    // CUB's size query is host arithmetic (no device work); it depends on N and the key bits.
    LATHE_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
        nullptr, bytes, static_cast<const uint32_t*>(nullptr), static_cast<uint32_t*>(nullptr),
        static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr), int(N), 0, bits));
    return bytes;
}

SortScratch sort_scratch(CudaState& state, int64_t N, int bits) {
    SortScratch s{};
    s.temp_bytes = cub_sort_bytes(N, bits);
    const size_t array = align_up(size_t(N) * 4);
    const size_t total = 3 * array + align_up(s.temp_bytes);
    LATHE_CHECK(total <= CudaState::kScratchBytes,
                "embedding_backward: sorting {} ids needs {} bytes of op scratch, more than "
                "CudaState::kScratchBytes ({}); use fewer tokens per micro-batch",
                N, total, CudaState::kScratchBytes);
    char* base = static_cast<char*>(state.scratch(total, "embedding_backward"));
    s.keys_out = reinterpret_cast<uint32_t*>(base);
    s.rows_in = reinterpret_cast<int32_t*>(base + array);
    s.rows_out = reinterpret_cast<int32_t*>(base + 2 * array);
    s.temp = base + 3 * array;
    return s;
}

// dtable (rows, C) += the dout rows of each id in [begin, begin + rows), at row id - begin; ids
// (N) i32 checked against [0, total); the other ids add nothing.
void backward_sorted(CudaState& state, CUstream_st* stream, float* dtable,
                     const __nv_bfloat16* dout, const int32_t* ids, int64_t N, int64_t C,
                     int64_t begin, int64_t rows, int64_t total) {
    const int bits = key_bits(total);
    SortScratch s = sort_scratch(state, N, bits);
    embedding_sort_prepare_kernel<<<blocks_for(N, 256), 256, 0, stream>>>(s.rows_in, ids, N, total);
    LATHE_CUDA_CHECK_LAUNCH();
    // Checked ids are in [0, total): as unsigned keys of `bits` bits they sort as the ids do.
    LATHE_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
        s.temp, s.temp_bytes, reinterpret_cast<const uint32_t*>(ids), s.keys_out, s.rows_in,
        s.rows_out, int(N), 0, bits, stream));
    const int64_t slices = (C + kMaxSortThreads - 1) / kMaxSortThreads;
    LATHE_CHECK(slices <= 65535, "embedding_backward: C={} is too wide", C);
    // Column slices of equal width (C = 768: 3 x 256 threads; C = 2048: 8 x 256).
    const int threads = int((C + slices - 1) / slices + kWarpSize - 1) / kWarpSize * kWarpSize;
    const dim3 grid(blocks_for(N, kWindow, INT32_MAX), unsigned(slices));
    const HeldKeys table{uint32_t(begin), uint32_t(rows)};
    embedding_backward_segments_kernel<<<grid, threads, 0, stream>>>(dtable, dout, s.keys_out,
                                                                     s.rows_out, N, C, table);
    LATHE_CUDA_CHECK_LAUNCH();
}

void backward_positions(float* dwpe, const __nv_bfloat16* dout, int64_t B, int64_t T, int64_t C,
                        CUstream_st* stream) {
    const bool vec2 = C % 2 == 0 && reinterpret_cast<uintptr_t>(dout) % 4 == 0 &&
                      reinterpret_cast<uintptr_t>(dwpe) % 8 == 0;
    const int64_t work = T * (vec2 ? C / 2 : C);
    const unsigned blocks = blocks_for(work, 256);
    if (vec2)
        embedding_backward_positions_kernel<2><<<blocks, 256, 0, stream>>>(dwpe, dout, B, T, C);
    else
        embedding_backward_positions_kernel<1><<<blocks, 256, 0, stream>>>(dwpe, dout, B, T, C);
    LATHE_CUDA_CHECK_LAUNCH();
}

}  // namespace

void embedding_forward(bf16* out, const int32_t* tokens, const int32_t* positions, const bf16* wte,
                       const bf16* wpe, int64_t B, int64_t T, int64_t C, int64_t V, int64_t P,
                       CUstream_st* stream) {
    const int64_t N = B * T;
    if (N == 0) return;
    auto* o = reinterpret_cast<__nv_bfloat16*>(out);
    const auto* e = reinterpret_cast<const __nv_bfloat16*>(wte);
    const auto* p = reinterpret_cast<const __nv_bfloat16*>(wpe);
    const unsigned blocks = blocks_for(N, kRowsPerBlock, INT32_MAX);
    if (vec8_ok(C, {out, wte, wpe}))
        embedding_forward_warp_per_row_kernel<8>
            <<<blocks, kForwardThreads, 0, stream>>>(o, tokens, positions, e, p, N, T, C, V, P);
    else
        embedding_forward_warp_per_row_kernel<1>
            <<<blocks, kForwardThreads, 0, stream>>>(o, tokens, positions, e, p, N, T, C, V, P);
    LATHE_CUDA_CHECK_LAUNCH();
}

size_t embedding_backward_scratch_bytes(int64_t N, int64_t rows) {
    if (N <= 0) return 0;
    return 3 * align_up(size_t(N) * 4) + align_up(cub_sort_bytes(N, key_bits(rows)));
}

void embedding_backward(float* dwte, float* dwpe, const bf16* dout, const int32_t* tokens,
                        const int32_t* positions, int64_t B, int64_t T, int64_t C, int64_t V,
                        int64_t P, CudaState& state, CUstream_st* stream) {
    const int64_t N = B * T;
    if (N == 0) return;
    LATHE_CHECK(N < INT32_MAX, "embedding_backward: {} rows do not fit the row index", N);
    const auto* g = reinterpret_cast<const __nv_bfloat16*>(dout);
    if (dwte != nullptr) backward_sorted(state, stream, dwte, g, tokens, N, C, 0, V, V);
    if (dwpe == nullptr) return;
    if (positions != nullptr) {
        backward_sorted(state, stream, dwpe, g, positions, N, C, 0, P, P);
    } else {
        LATHE_CHECK(T <= P,
                    "embedding_backward: sequences of T={} tokens need positions 0..{}, the "
                    "position table has {} rows",
                    T, T - 1, P);
        backward_positions(dwpe, g, B, T, C, stream);
    }
}

void embedding_backward_shard(float* dwte, const bf16* dout, const int32_t* ids, int64_t N,
                              int64_t C, int64_t begin, int64_t V, int64_t total, CudaState& state,
                              CUstream_st* stream) {
    if (N == 0) return;
    LATHE_CHECK(N < INT32_MAX, "embedding_backward_shard: {} rows do not fit the row index", N);
    LATHE_CHECK(begin >= 0 && V >= 1 && begin + V <= total && total <= INT32_MAX,
                "embedding_backward_shard: rows {} .. {} of {}", begin, begin + V, total);
    backward_sorted(state, stream, dwte, reinterpret_cast<const __nv_bfloat16*>(dout), ids, N, C,
                    begin, V, total);
}

}  // namespace lathe::cuda
