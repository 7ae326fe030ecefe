// clang-format off
#include "ops/cuda/nvcc_compat.h"  // first: before any header that includes fmt
// clang-format on

#include <algorithm>

#include "core/check.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/cuda_state.h"
#include "ops/cuda/fp8_cast.h"
#include "ops/cuda/gemm.h"
#include "ops/cuda/kernel_util.cuh"
#include "ops/cuda/linear.h"
#include "ops/cuda/lm_head_cross_entropy.h"

namespace lathe::cuda {

namespace {

constexpr int32_t kIgnore = -100;  // ops/lm_head_cross_entropy.h's kIgnoreIndex
constexpr int kRowThreads = 512;
constexpr int kReduceThreads = 1024;
constexpr size_t kCountBytes = 256;  // the count's slot at the start of the scratch

// count[0] = number of targets != -100; every other target must index the vocabulary.
__global__ void cross_entropy_count_kernel(int* __restrict__ count,
                                           const int32_t* __restrict__ targets, int64_t N,
                                           int64_t V) {
    __shared__ int smem[32];
    int c = 0;
    for (int64_t n = threadIdx.x; n < N; n += blockDim.x) {
        const int32_t t = targets[n];
        if (t == kIgnore) continue;
        LATHE_DEVICE_CHECK(t >= 0 && t < V, "target %d at row %lld, vocabulary %lld", int(t),
                           (long long)n, (long long)V);
        ++c;
    }
    c = block_sum(c, smem);
    if (threadIdx.x == 0) *count = c;
}

constexpr float kLog2e = 1.4426950408889634f;

// 8 bf16 (one 16-byte vector) to fp32 and back (round to nearest even).
__device__ __forceinline__ void unpack8(float (&f)[8], const uint4& raw) {
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float2 p = __bfloat1622float2(h[i]);
        f[2 * i] = p.x;
        f[2 * i + 1] = p.y;
    }
}

__device__ __forceinline__ uint4 pack8(const float (&f)[8]) {
    uint4 raw;
    __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&raw);
#pragma unroll
    for (int i = 0; i < 4; ++i) h[i] = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
    return raw;
}

// What every row kernel shares: the row's place, its target and the backward's scale.
struct RowArgs {
    __nv_bfloat16* chunk;  // rows of ld bf16 logits; dlogits are written over them
    int64_t ld;
    int64_t V;
    int64_t row0;
    const int32_t* targets;
    const float* lse_in;  // backward only: the forward's lse
    float* lse_out;       // forward: lse per row
    float* losses;        // forward: loss per row
    const int* count;
    float dloss;
    bool write_dlogits;
    // FP8 head, current scaling: *amax = max over the written bf16 dlogits of |dlogit|'s f32
    // bits (zeroed by the caller; ops/cuda/fp8_cast.cu's amax, bit for bit). Null: not computed.
    unsigned* amax = nullptr;
    // Vocabulary shard: the chunk's columns are vocabulary ids vocab_begin .. vocab_begin + V.
    int64_t vocab_begin = 0;
};

// The column of row n's target in the chunk: outside [0, V) when the row is ignored (-1) or
// another shard of the vocabulary holds its target.
__device__ __forceinline__ int64_t target_column(const RowArgs& a, int32_t target) {
    return target == kIgnore ? -1 : int64_t(target) - a.vocab_begin;
}

// |b|'s f32 bits from a bf16 pattern, as ops/cuda/fp8_cast.cu's amax reduces them: unsigned
// maxima of these are maxima of the magnitudes, NaNs above every number.
__device__ __forceinline__ unsigned magnitude_bits(unsigned short b) {
    return unsigned(b & 0x7FFFu) << 16;
}

__device__ __forceinline__ unsigned magnitude_bits8(const uint4& raw) {
    const unsigned words[4] = {raw.x, raw.y, raw.z, raw.w};
    unsigned m = 0;
#pragma unroll
    for (int k = 0; k < 4; ++k)
        m = max(m, max(magnitude_bits((unsigned short)(words[k] & 0xFFFFu)),
                       magnitude_bits((unsigned short)(words[k] >> 16))));
    return m;
}

// The warp's max, one atomicMax per warp (order-independent: the same bits every run).
__device__ __forceinline__ void warp_amax(unsigned m, unsigned* amax) {
    m = __reduce_max_sync(0xFFFFFFFFu, m);
    if (threadIdx.x % 32 == 0 && m != 0) atomicMax(amax, m);
}

__device__ __forceinline__ float dlogit_scale(const RowArgs& a, bool ignored) {
    const int total = *a.count;
    return ignored || total == 0 ? 0.0f : float(double(a.dloss) / double(total));
}

// Streams a row from global memory, kVec elements (16 bytes for kVec == 8) per access; each
// thread reads and writes only its own elements, so the in-place write needs no barrier.
// Forward (lse_in null): one read, per-thread online max/sum, fixed block reduction, lse and loss.
// Backward with lse_in: one read, one write. Forward + backward (only for rows too long to hold
// on chip, see held_row_kernel): the forward's read, then a second read (mostly from L2) and the
// write. Vector mode needs ld % 8 == 0 and a 16-byte aligned chunk; elements [V, round_up(V, 8))
// are the row's padding: never counted, written as 0.
template <int kVec>
__global__ void __launch_bounds__(kRowThreads) stream_row_kernel(RowArgs a) {
    __shared__ float smem[32];
    const int64_t n = a.row0 + blockIdx.x;
    __nv_bfloat16* row = a.chunk + int64_t(blockIdx.x) * a.ld;
    const bool ignored = a.targets[n] == kIgnore;
    const int64_t target = target_column(a, a.targets[n]);
    const int64_t V = a.V;
    const bool here = target >= 0 && target < V;
    float lse;
    if (a.lse_in != nullptr) {
        lse = a.lse_in[n];
    } else {
        // Read before any barrier, so before any thread of the block writes over the row.
        const float target_logit = threadIdx.x == 0 && here ? __bfloat162float(row[target]) : 0.0f;
        float m = -INFINITY, s = 0.0f;
        for (int64_t v = int64_t(threadIdx.x) * kVec; v < V; v += int64_t(kRowThreads) * kVec) {
            float l[kVec];
            if constexpr (kVec == 8) {
                unpack8(l, *reinterpret_cast<const uint4*>(row + v));
            } else {
                l[0] = __bfloat162float(row[v]);
            }
            float m8 = -INFINITY;
#pragma unroll
            for (int i = 0; i < kVec; ++i) {
                if (v + i >= V) l[i] = -INFINITY;
                m8 = fmaxf(m8, l[i]);
            }
            if (m8 > m) {
                s *= exp2f((m - m8) * kLog2e);  // 0 while m is -inf
                m = m8;
            }
            const float mb = m * kLog2e;
#pragma unroll
            for (int i = 0; i < kVec; ++i) s += exp2f(fmaf(l[i], kLog2e, -mb));
        }
        const float row_max = block_max(m, smem);
        s = m == -INFINITY ? 0.0f : s * exp2f((m - row_max) * kLog2e);
        const float sum = block_sum(s, smem);
        lse = row_max + logf(sum);
        if (threadIdx.x == 0) {
            a.lse_out[n] = lse;
            a.losses[n] = ignored ? 0.0f : lse - target_logit;
        }
    }
    if (!a.write_dlogits) return;
    const float scale = dlogit_scale(a, ignored);
    const float lb = lse * kLog2e;
    unsigned amax = 0;
    for (int64_t v = int64_t(threadIdx.x) * kVec; v < V; v += int64_t(kRowThreads) * kVec) {
        float l[kVec];
        if constexpr (kVec == 8) {
            unpack8(l, *reinterpret_cast<const uint4*>(row + v));
        } else {
            l[0] = __bfloat162float(row[v]);
        }
#pragma unroll
        for (int i = 0; i < kVec; ++i)
            l[i] = v + i >= V
                       ? 0.0f
                       : scale * exp2f(fmaf(l[i], kLog2e, -lb)) - (v + i == target ? scale : 0.0f);
        if constexpr (kVec == 8) {
            const uint4 raw = pack8(l);
            *reinterpret_cast<uint4*>(row + v) = raw;
            amax = max(amax, magnitude_bits8(raw));
        } else {
            const __nv_bfloat16 b = __float2bfloat16_rn(l[0]);
            row[v] = b;
            amax = max(amax, magnitude_bits(__bfloat16_as_ushort(b)));
        }
    }
    if (a.amax != nullptr) warp_amax(amax, a.amax);
}

// Forward + backward of one row read from HBM exactly once: the row (ceil(V / 8) 16-byte vectors)
// is held on chip (at most 64 registers a thread: two 512-thread blocks per SM), vector
// j = threadIdx.x + i * kThreads in thread threadIdx.x's registers for i < kRegVecs and in dynamic
// shared memory beyond (slot j - kRegVecs * kThreads, so consecutive threads touch consecutive
// 16-byte words). Then: max (no exponentials), sum of exp(l - max), lse
// and loss, and dlogits = scale * exp(l - lse) - scale * onehot written back over the same
// vectors, each by the thread that read it. Two exponentials per element, both from fp32 logits
// held on chip. Needs ld % 8 == 0 and a 16-byte aligned chunk; padding as in stream_row_kernel.
template <int kThreads, int kRegVecs>
__global__ void __launch_bounds__(kThreads, 2) held_row_kernel(RowArgs a) {
    extern __shared__ uint4 spill[];
    __shared__ float smem[32];
    const int64_t n = a.row0 + blockIdx.x;
    __nv_bfloat16* row_bf16 = a.chunk + int64_t(blockIdx.x) * a.ld;
    uint4* row = reinterpret_cast<uint4*>(row_bf16);
    const bool ignored = a.targets[n] == kIgnore;
    const int64_t target = target_column(a, a.targets[n]);
    const int V = int(a.V);
    const bool here = target >= 0 && target < V;
    const int nvec = (V + 7) / 8;
    const int tid = threadIdx.x;
    const float target_logit = tid == 0 && here ? __bfloat162float(row_bf16[target]) : 0.0f;

    uint4 held[kRegVecs];
#pragma unroll
    for (int i = 0; i < kRegVecs; ++i) {
        const int j = tid + i * kThreads;
        if (j < nvec) held[i] = row[j];
    }
#pragma unroll 4
    for (int j = tid + kRegVecs * kThreads; j < nvec; j += kThreads)
        spill[j - kRegVecs * kThreads] = row[j];

    // Element 8j + k of the row from vector j's raw bits; -inf past V.
    auto unpack = [&](float(&l)[8], const uint4& raw, int j) {
        unpack8(l, raw);
        if (8 * j + 8 > V) {
#pragma unroll
            for (int k = 0; k < 8; ++k)
                if (8 * j + k >= V) l[k] = -INFINITY;
        }
    };

    float m = -INFINITY;
#pragma unroll
    for (int i = 0; i < kRegVecs; ++i) {
        const int j = tid + i * kThreads;
        if (j < nvec) {
            float l[8];
            unpack(l, held[i], j);
#pragma unroll
            for (int k = 0; k < 8; ++k) m = fmaxf(m, l[k]);
        }
    }
    for (int j = tid + kRegVecs * kThreads; j < nvec; j += kThreads) {
        float l[8];
        unpack(l, spill[j - kRegVecs * kThreads], j);
#pragma unroll
        for (int k = 0; k < 8; ++k) m = fmaxf(m, l[k]);
    }
    const float row_max = block_max(m, smem);
    const float mb = row_max * kLog2e;

    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < kRegVecs; ++i) {
        const int j = tid + i * kThreads;
        if (j < nvec) {
            float l[8];
            unpack(l, held[i], j);
#pragma unroll
            for (int k = 0; k < 8; ++k) s += exp2f(fmaf(l[k], kLog2e, -mb));
        }
    }
    for (int j = tid + kRegVecs * kThreads; j < nvec; j += kThreads) {
        float l[8];
        unpack(l, spill[j - kRegVecs * kThreads], j);
#pragma unroll
        for (int k = 0; k < 8; ++k) s += exp2f(fmaf(l[k], kLog2e, -mb));
    }
    const float sum = block_sum(s, smem);
    const float lse = row_max + logf(sum);
    if (tid == 0) {
        a.lse_out[n] = lse;
        a.losses[n] = ignored ? 0.0f : lse - target_logit;
    }

    const float scale = dlogit_scale(a, ignored);
    const float lb = lse * kLog2e;
    unsigned amax = 0;
    auto dlogits = [&](const uint4& raw, int j) {
        float l[8];
        unpack8(l, raw);
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            const int v = 8 * j + k;
            l[k] = v >= V ? 0.0f
                          : scale * exp2f(fmaf(l[k], kLog2e, -lb)) - (v == target ? scale : 0.0f);
        }
        const uint4 out = pack8(l);
        row[j] = out;
        amax = max(amax, magnitude_bits8(out));
    };
#pragma unroll
    for (int i = 0; i < kRegVecs; ++i) {
        const int j = tid + i * kThreads;
        if (j < nvec) dlogits(held[i], j);
    }
    for (int j = tid + kRegVecs * kThreads; j < nvec; j += kThreads)
        dlogits(spill[j - kRegVecs * kThreads], j);
    if (a.amax != nullptr) warp_amax(amax, a.amax);
}

// loss[0] = sum_n losses[n] / count (0 when count is 0), the sum in fp64 in a fixed order.
__global__ void cross_entropy_mean_kernel(float* __restrict__ loss,
                                          const float* __restrict__ losses,
                                          const int* __restrict__ count, int64_t N) {
    __shared__ double smem[32];
    double s = 0.0;
    for (int64_t n = threadIdx.x; n < N; n += blockDim.x) s += double(losses[n]);
    s = block_sum(s, smem);
    if (threadIdx.x == 0) *loss = *count == 0 ? 0.0f : float(s / double(*count));
}

struct ChunkWork {
    float* lse_out = nullptr;
    float* losses = nullptr;
    const float* lse_in = nullptr;
    bool backward = false;
    float dloss = 0.0f;
    __nv_bfloat16* dx = nullptr;
    float* dweight = nullptr;
    bool dweight_accumulate = true;  // false: the first chunk writes dweight (beta 0)
};

// Registers per thread that hold the row in held_row_kernel: 8 vectors = 32 registers.
constexpr int kHeldRegVecs = 8;

template <int kThreads>
bool try_held(const RowArgs& a, int64_t rows, int64_t nvec, int64_t smem_cap, CUstream_st* stream) {
    const int64_t smem = std::max<int64_t>(0, nvec - int64_t(kHeldRegVecs) * kThreads) * 16;
    if (smem > smem_cap) return false;
    auto kernel = held_row_kernel<kThreads, kHeldRegVecs>;
    allow_dynamic_smem(kernel, size_t(smem));
    kernel<<<unsigned(rows), kThreads, size_t(smem), stream>>>(a);
    LATHE_CUDA_CHECK_LAUNCH();
    return true;
}

// The per-row kernel for one chunk. Forward only and backward only stream (each row is read
// once either way). Forward + backward holds the row on chip while it spills at most 48 KiB of
// shared memory beyond its 64 KiB of registers per 512 threads (V <= 65536: two rows per SM, one
// computing while the other loads), else streams it twice. A wider row held by one 1024-thread
// block per SM (Llama 3's 128256: 125 KiB of shared memory) ran its load, reductions and write
// one after another with nothing beside them: on an H200 its kernel took 4.36 ms of the 1B step
// against 3.66 ms streaming twice (docs/PERF.md).
void launch_rows(const RowArgs& a, int64_t rows, bool vec, CUstream_st* stream) {
    if (!vec) {
        stream_row_kernel<1><<<unsigned(rows), kRowThreads, 0, stream>>>(a);
        LATHE_CUDA_CHECK_LAUNCH();
        return;
    }
    if (a.write_dlogits && a.lse_in == nullptr) {
        const int64_t nvec = (a.V + 7) / 8;
        if (try_held<512>(a, rows, nvec, 48 * 1024, stream)) return;
    }
    stream_row_kernel<8><<<unsigned(rows), kRowThreads, 0, stream>>>(a);
    LATHE_CUDA_CHECK_LAUNCH();
}

// How the f32 scratch (Nc, V) is used: bf16 rows of ld elements, as many as its bytes hold.
struct ChunkLayout {
    int64_t ld;    // row stride in bf16 elements
    int64_t rows;  // rows per chunk
    bool vec;      // 16-byte vector kernels apply
};

ChunkLayout chunk_layout(const void* scratch, int64_t V, int64_t Nc) {
    const int64_t bytes = Nc * V * int64_t(sizeof(float));
    const int64_t padded = (V + 7) / 8 * 8;
    if (reinterpret_cast<uintptr_t>(scratch) % 16 == 0 && bytes >= 2 * padded)
        return {padded, bytes / (2 * padded), true};
    return {V, 2 * Nc, false};  // a misaligned scratch, or V < 7 with Nc = 1
}

void run_chunks(CudaState& state, CUstream_st* stream, const ChunkWork& w, const int* count,
                const bf16* x, const int32_t* targets, const bf16* weight, float* scratch,
                int64_t N, int64_t C, int64_t V, int64_t Nc, int64_t vocab_begin = 0) {
    const ChunkLayout layout = chunk_layout(scratch, V, Nc);
    auto* chunk = reinterpret_cast<__nv_bfloat16*>(scratch);
    for (int64_t r0 = 0; r0 < N; r0 += layout.rows) {
        const int64_t rows = std::min(layout.rows, N - r0);
        const bf16* xc = x + r0 * C;
        GemmArgs logits;  // (rows, V) bf16 = x_chunk . weight^T, fp32 accumulation
        logits.M = rows, logits.N = V, logits.K = C;
        logits.A = xc, logits.lda = C;
        logits.B = weight, logits.ldb = C, logits.trans_b = true;
        logits.D = chunk, logits.ldd = layout.ld, logits.d_dtype = DType::kBF16;
        gemm(state, stream, logits);
        RowArgs a{chunk,     layout.ld, V,     r0,      targets,   w.lse_in,
                  w.lse_out, w.losses,  count, w.dloss, w.backward};
        a.vocab_begin = vocab_begin;
        launch_rows(a, rows, layout.vec, stream);
        if (!w.backward) continue;
        GemmArgs dx;  // (rows, C) bf16 = dlogits (rows, V; row stride ld) . weight (V, C)
        dx.M = rows, dx.N = C, dx.K = V;
        dx.A = chunk, dx.lda = layout.ld;
        dx.B = weight, dx.ldb = C;
        dx.D = w.dx + r0 * C, dx.ldd = C, dx.d_dtype = DType::kBF16;
        gemm(state, stream, dx);
        if (w.dweight == nullptr) continue;
        GemmArgs dw;  // (V, C) f32 += dlogits^T (V, rows) . x_chunk (rows, C)
        dw.M = V, dw.N = C, dw.K = rows;
        dw.A = chunk, dw.lda = layout.ld, dw.trans_a = true;
        dw.B = xc, dw.ldb = C;
        dw.D = w.dweight, dw.ldd = C, dw.d_dtype = DType::kF32;
        dw.beta = w.dweight_accumulate || r0 > 0 ? 1.0f : 0.0f;
        gemm(state, stream, dw);
    }
}

// x (rows, cols) bf16 -> codes q and/or qt of tensor t of the head (its amax and scale_inv in
// the scalar slot at `slot`): current scaling from x's amax (amax_ready: the producer wrote it
// into the slot), delayed with the head's scale of t, the amax joining the step's.
// ready_amax: where the producer left it (read only), else the slot (written by the row kernel).
void head_cast(const bf16* x, int64_t rows, int64_t cols, DType dtype, void* q, void* qt,
               float* slot, const LmHeadFp8& f, int t, bool amax_ready, CUstream_st* stream,
               const float* ready_amax = nullptr) {
    Fp8CastArgs c;
    c.rows = rows, c.cols = cols, c.x = x, c.dtype = dtype, c.q = q, c.qt = qt;
    c.amax = ready_amax != nullptr ? const_cast<float*>(ready_amax) : slot;
    c.amax_ready = amax_ready;
    c.scale_inv = slot + 4;
    if (f.delayed_scale != nullptr) c.scale = f.delayed_scale + t;
    fp8_cast(c, stream);
    if (f.delayed_scale != nullptr) fp8_amax_max_into(f.step_amax + t, slot, stream);
}

// The scaled product D = sa sb (A (M, K) . B (N, K)^T) in cuBLASLt's fp8 "TN" layout.
GemmArgs fp8_tn(const void* A, DType a_dtype, int64_t lda, const float* a_scale, const void* B,
                int64_t ldb, const float* b_scale, int64_t M, int64_t N, int64_t K) {
    GemmArgs g;
    g.M = M, g.N = N, g.K = K;
    g.A = A, g.a_dtype = a_dtype, g.lda = lda, g.a_scale = a_scale;
    g.B = B, g.b_dtype = DType::kE4M3, g.ldb = ldb, g.b_scale = b_scale, g.trans_b = true;
    return g;
}

// run_chunks with the three GEMMs in FP8 per tensor (the header's "FP8"). The chunk's bytes:
// rows bf16 logits / dlogits (ld = V), then dlogits' codes q (rows, V) and qt (V, rows): 4 bytes
// a logit, the f32 scratch's own size, so rows = Nc rounded down to a multiple of 16 (the FP8
// GEMMs' leading dimensions and 16-byte offsets into xqt).
void run_chunks_fp8(CudaState& state, CUstream_st* stream, const ChunkWork& w, const int* count,
                    const bf16* x, const int32_t* targets, float* scratch, int64_t N, int64_t C,
                    int64_t V, int64_t Nc, const LmHeadFp8& f) {
    const int64_t chunk_rows = Nc / 16 * 16;
    LATHE_CHECK(reinterpret_cast<uintptr_t>(scratch) % 16 == 0,
                "FP8 LM head: the chunk scratch must be 16-byte aligned");
    auto* chunk = reinterpret_cast<__nv_bfloat16*>(scratch);
    unsigned char* dlq = reinterpret_cast<unsigned char*>(scratch) + chunk_rows * V * 2;
    unsigned char* dlqt = dlq + chunk_rows * V;
    float* x_slot = f.scalars + 0;
    float* w_slot = f.scalars + 8;
    float* dy_slot = f.scalars + 16;
    // x once for every chunk: xq for the logits, xqt (C, N) for the weight gradient (one read of x
    // after its amax pass; delayed: one read).
    const bool fused_amax = f.delayed_scale == nullptr;
    const bool x_ready = fused_amax && f.x_amax != nullptr;
    head_cast(x, N, C, DType::kE4M3, f.xq, w.backward && w.dweight != nullptr ? f.xqt : nullptr,
              x_slot, f, 0, x_ready, stream, x_ready ? f.x_amax : nullptr);
    for (int64_t r0 = 0; r0 < N; r0 += chunk_rows) {
        const int64_t rows = std::min(chunk_rows, N - r0);
        // (rows, V) bf16 = sx sw (xq_chunk . wq^T)
        GemmArgs logits = fp8_tn(static_cast<const unsigned char*>(f.xq) + r0 * C, DType::kE4M3, C,
                                 x_slot + 4, f.wq, C, w_slot + 4, rows, V, C);
        logits.D = chunk, logits.ldd = V, logits.d_dtype = DType::kBF16;
        gemm(state, stream, logits);
        RowArgs a{chunk,     V,        V,     r0,      targets,   w.lse_in,
                  w.lse_out, w.losses, count, w.dloss, w.backward};
        // Current scaling: the row kernel that writes dlogits computes their amax, so their
        // cast reads them once (2 bytes a logit) instead of twice.
        if (w.backward && fused_amax) {
            LATHE_CUDA_CHECK(cudaMemsetAsync(dy_slot, 0, sizeof(float), stream));
            a.amax = reinterpret_cast<unsigned*>(dy_slot);
        }
        launch_rows(a, rows, /*vec=*/true, stream);
        if (!w.backward) continue;
        head_cast(reinterpret_cast<const bf16*>(chunk), rows, V, f.grad_dtype, dlq,
                  w.dweight != nullptr ? dlqt : nullptr, dy_slot, f, 2, fused_amax, stream);
        // (rows, C) bf16 = sdl sw (dlq (rows, V) . wqt (C, V)^T)
        GemmArgs dx = fp8_tn(dlq, f.grad_dtype, V, dy_slot + 4, f.wqt, V, w_slot + 4, rows, C, V);
        dx.D = w.dx + r0 * C, dx.ldd = C, dx.d_dtype = DType::kBF16;
        gemm(state, stream, dx);
        if (w.dweight == nullptr) continue;
        // (V, C) f32 += sdl sx (dlqt (V, rows) . xqt[:, r0 : r0 + rows] (C, rows; row stride N)^T)
        // (= for the first chunk without dweight_accumulate)
        GemmArgs dw =
            fp8_tn(dlqt, f.grad_dtype, rows, dy_slot + 4,
                   static_cast<const unsigned char*>(f.xqt) + r0, N, x_slot + 4, V, C, rows);
        dw.D = w.dweight, dw.ldd = C, dw.d_dtype = DType::kF32;
        dw.beta = w.dweight_accumulate || r0 > 0 ? 1.0f : 0.0f;
        gemm(state, stream, dw);
    }
}

void check_fp8(const char* op, const LmHeadFp8& f, int64_t N, int64_t C, int64_t V, int64_t Nc) {
    LATHE_CHECK(N % 16 == 0 && C % 16 == 0 && V % 16 == 0 && Nc >= 16,
                "{}: the FP8 LM head needs N (tokens {}), C (hidden {}) and V (vocabulary {}) "
                "multiples of 16 and a chunk of at least 16 rows (Nc = {})",
                op, N, C, V, Nc);
    LATHE_CHECK(f.wq && f.wqt && f.xq && f.xqt && f.scalars && (!f.delayed_scale || f.step_amax),
                "{}: FP8 LM head without its buffers", op);
}

// The count slot and, when asked, two N-float arrays from the state's scratch.
struct OpScratch {
    int* count;
    float* first;
    float* second;
};

OpScratch op_scratch(CudaState& state, int64_t N, int arrays, const char* op) {
    char* base = static_cast<char*>(state.scratch(kCountBytes + size_t(arrays * N) * 4, op));
    float* f = reinterpret_cast<float*>(base + kCountBytes);
    return {reinterpret_cast<int*>(base), f, f + N};
}

void count_targets(int* count, const int32_t* targets, int64_t N, int64_t V, CUstream_st* stream) {
    cross_entropy_count_kernel<<<1, kReduceThreads, 0, stream>>>(count, targets, N, V);
    LATHE_CUDA_CHECK_LAUNCH();
}

void mean_loss(float* loss, const float* losses, const int* count, int64_t N, CUstream_st* stream) {
    cross_entropy_mean_kernel<<<1, kReduceThreads, 0, stream>>>(loss, losses, count, N);
    LATHE_CUDA_CHECK_LAUNCH();
}

void check_sizes(const char* op, int64_t N, int64_t Nc, int64_t V) {
    LATHE_CHECK(N < INT32_MAX && Nc < INT32_MAX / 2 && Nc >= 1 && V >= 1 && V < (int64_t(1) << 30),
                "{}: N={} Nc={} V={}", op, N, Nc, V);
}

}  // namespace

void lm_head_cross_entropy_forward(float* loss, float* losses, float* lse, const bf16* x,
                                   const int32_t* targets, const bf16* weight, float* scratch,
                                   int64_t N, int64_t C, int64_t V, int64_t Nc, CudaState& state,
                                   CUstream_st* stream, const LmHeadFp8* fp8, int64_t vocab_begin,
                                   int64_t vocab_total) {
    constexpr const char* kOp = "lm_head_cross_entropy_forward";
    check_sizes(kOp, N, Nc, V);
    if (fp8) check_fp8(kOp, *fp8, N, C, V, Nc);
    LATHE_CHECK(fp8 == nullptr || vocab_total == 0, "{}: an FP8 head of a vocabulary shard", kOp);
    const OpScratch s = op_scratch(state, N, losses ? 0 : 1, kOp);
    count_targets(s.count, targets, N, vocab_total == 0 ? V : vocab_total, stream);
    ChunkWork w;
    w.lse_out = lse;
    w.losses = losses ? losses : s.first;
    if (fp8)
        run_chunks_fp8(state, stream, w, s.count, x, targets, scratch, N, C, V, Nc, *fp8);
    else
        run_chunks(state, stream, w, s.count, x, targets, weight, scratch, N, C, V, Nc,
                   vocab_begin);
    mean_loss(loss, w.losses, s.count, N, stream);
}

void lm_head_cross_entropy_backward(bf16* dx, float* dweight, bool dweight_accumulate,
                                    const bf16* x, const int32_t* targets, const bf16* weight,
                                    const float* lse, float dloss, float* scratch, int64_t N,
                                    int64_t C, int64_t V, int64_t Nc, CudaState& state,
                                    CUstream_st* stream, const LmHeadFp8* fp8, int64_t vocab_begin,
                                    int64_t vocab_total) {
    constexpr const char* kOp = "lm_head_cross_entropy_backward";
    check_sizes(kOp, N, Nc, V);
    if (fp8) check_fp8(kOp, *fp8, N, C, V, Nc);
    LATHE_CHECK(fp8 == nullptr || vocab_total == 0, "{}: an FP8 head of a vocabulary shard", kOp);
    const OpScratch s = op_scratch(state, N, 0, kOp);
    count_targets(s.count, targets, N, vocab_total == 0 ? V : vocab_total, stream);
    ChunkWork w;
    w.lse_in = lse;
    w.backward = true;
    w.dloss = dloss;
    w.dx = reinterpret_cast<__nv_bfloat16*>(dx);
    w.dweight = dweight;
    w.dweight_accumulate = dweight_accumulate;
    if (fp8)
        run_chunks_fp8(state, stream, w, s.count, x, targets, scratch, N, C, V, Nc, *fp8);
    else
        run_chunks(state, stream, w, s.count, x, targets, weight, scratch, N, C, V, Nc,
                   vocab_begin);
}

void lm_head_cross_entropy_forward_backward(float* loss, float* losses, bf16* dx, float* dweight,
                                            bool dweight_accumulate, const bf16* x,
                                            const int32_t* targets, const bf16* weight, float dloss,
                                            float* scratch, int64_t N, int64_t C, int64_t V,
                                            int64_t Nc, CudaState& state, CUstream_st* stream,
                                            const LmHeadFp8* fp8) {
    constexpr const char* kOp = "lm_head_cross_entropy_forward_backward";
    check_sizes(kOp, N, Nc, V);
    if (fp8) check_fp8(kOp, *fp8, N, C, V, Nc);
    const OpScratch s = op_scratch(state, N, 2, kOp);
    count_targets(s.count, targets, N, V, stream);
    ChunkWork w;
    w.lse_out = s.first;
    w.losses = losses ? losses : s.second;
    w.backward = true;
    w.dloss = dloss;
    w.dx = reinterpret_cast<__nv_bfloat16*>(dx);
    w.dweight = dweight;
    w.dweight_accumulate = dweight_accumulate;
    if (fp8)
        run_chunks_fp8(state, stream, w, s.count, x, targets, scratch, N, C, V, Nc, *fp8);
    else
        run_chunks(state, stream, w, s.count, x, targets, weight, scratch, N, C, V, Nc);
    mean_loss(loss, w.losses, s.count, N, stream);
}

void cross_entropy_rows_forward_backward(bf16* logits, float* losses, float* lse,
                                         const int32_t* targets, const int* count, float dloss,
                                         int64_t rows, int64_t V, int64_t ld, CUstream_st* stream) {
    LATHE_CHECK(rows >= 1 && rows < INT32_MAX && V >= 1 && V < (int64_t(1) << 30) && ld >= V,
                "cross_entropy_rows_forward_backward: rows={} V={} ld={}", rows, V, ld);
    const bool vec = ld % 8 == 0 && reinterpret_cast<uintptr_t>(logits) % 16 == 0;
    RowArgs a{reinterpret_cast<__nv_bfloat16*>(logits),
              ld,
              V,
              0,
              targets,
              nullptr,
              lse,
              losses,
              count,
              dloss,
              true};
    launch_rows(a, rows, vec, stream);
}

}  // namespace lathe::cuda
