// GloVe training on the GPU: the CUDA twin of glove_epoch_hogwild_cpu (align/glove.h has the
// math). One warp per co-occurrence entry: lane l owns dimensions l, l + 32, ...; the dot product
// is reduced with an xor butterfly, so every lane holds the same sum; lane 0 computes diff from the
// biases and broadcasts it (other warps may be writing those biases: reading them once keeps the
// warp's branch uniform). Warps run Hogwild, as glove.c's threads do: updates to a row shared by
// two entries in flight race, and the result depends on timing. With one warp the kernel is
// deterministic and bitwise equal to the CPU's single-thread epoch: every operation is an explicit
// round-to-nearest intrinsic (__fadd_rn, __fmul_rn, ...), which nvcc never contracts into FMA.
//
// Memory traffic per entry: read and write w[a], c[b], gw[a], gc[b] (16 D bytes each way); the
// parameters of a 150k x 300 vocabulary (720 MB with AdaGrad sums) exceed L2, so the kernel is
// bound by HBM bandwidth on rows of rare tokens and by L2 on frequent ones.

// clang-format off
#include "ops/cuda/nvcc_compat.h"  // first: before any header that includes fmt
// clang-format on

#include <algorithm>
#include <vector>

#include "align/glove.h"
#include "core/check.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/cuda_state.h"  // CudaState, DeviceBuffer

namespace lathe {
namespace {

constexpr int kWarpSize = 32;
constexpr int kBlockThreads = 256;
constexpr unsigned kFullMask = 0xFFFFFFFFu;

__global__ void glove_epoch_hogwild_kernel(const GloveEntry* __restrict__ entries, int64_t n,
                                           float* __restrict__ w, float* __restrict__ c,
                                           float* __restrict__ bw, float* __restrict__ bc,
                                           float* __restrict__ gw, float* __restrict__ gc,
                                           float* __restrict__ gbw, float* __restrict__ gbc, int D,
                                           float lr, float clip,
                                           double* __restrict__ cost_per_warp) {
    const int lane = threadIdx.x & (kWarpSize - 1);
    const int64_t warp = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / kWarpSize;
    const int64_t warps = (int64_t(gridDim.x) * blockDim.x) / kWarpSize;
    double cost = 0.0;
    for (int64_t i = warp; i < n; i += warps) {
        const GloveEntry e = entries[i];
        float* wa = w + int64_t(e.row) * D;
        float* cb = c + int64_t(e.col) * D;
        float* gwa = gw + int64_t(e.row) * D;
        float* gcb = gc + int64_t(e.col) * D;
        float acc = 0.0f;
        for (int d = lane; d < D; d += kWarpSize) acc = __fadd_rn(acc, __fmul_rn(wa[d], cb[d]));
#pragma unroll
        for (int m = kWarpSize / 2; m >= 1; m /= 2)
            acc = __fadd_rn(acc, __shfl_xor_sync(kFullMask, acc, m));
        float diff = 0.0f;
        if (lane == 0) diff = __fsub_rn(__fadd_rn(__fadd_rn(acc, bw[e.row]), bc[e.col]), e.log_x);
        diff = __shfl_sync(kFullMask, diff, 0);
        const float fdiff = __fmul_rn(e.weight, diff);
        if (!isfinite(diff) || !isfinite(fdiff)) continue;  // uniform across the warp
        cost = __dadd_rn(cost, __dmul_rn(__dmul_rn(0.5, double(fdiff)), double(diff)));
        for (int d = lane; d < D; d += kWarpSize) {
            const float wd = wa[d];
            const float cd = cb[d];
            const float g1 = __fmul_rn(fminf(fmaxf(__fmul_rn(fdiff, cd), -clip), clip), lr);
            const float g2 = __fmul_rn(fminf(fmaxf(__fmul_rn(fdiff, wd), -clip), clip), lr);
            const float gwd = gwa[d];
            const float gcd = gcb[d];
            wa[d] = __fsub_rn(wd, __fdiv_rn(g1, __fsqrt_rn(gwd)));
            cb[d] = __fsub_rn(cd, __fdiv_rn(g2, __fsqrt_rn(gcd)));
            gwa[d] = __fadd_rn(gwd, __fmul_rn(g1, g1));
            gcb[d] = __fadd_rn(gcd, __fmul_rn(g2, g2));
        }
        if (lane == 0) {
            const float f2 = __fmul_rn(fdiff, fdiff);
            bw[e.row] = __fsub_rn(bw[e.row], __fdiv_rn(fdiff, __fsqrt_rn(gbw[e.row])));
            bc[e.col] = __fsub_rn(bc[e.col], __fdiv_rn(fdiff, __fsqrt_rn(gbc[e.col])));
            gbw[e.row] = __fadd_rn(gbw[e.row], f2);
            gbc[e.col] = __fadd_rn(gbc[e.col], f2);
        }
    }
    if (lane == 0) cost_per_warp[warp] = cost;
}

}  // namespace

struct GloveCuda::Buffers {
    DeviceBuffer entries, w, c, bw, bc, gw, gc, gbw, gbc, cost;
    cudaStream_t stream = nullptr;  // the CudaState's compute stream (not owned)
};

namespace {

void upload(DeviceBuffer& dst, const void* src, size_t bytes, cudaStream_t stream) {
    dst = DeviceBuffer(bytes);
    if (bytes > 0)
        LATHE_CUDA_CHECK(cudaMemcpyAsync(dst.data(), src, bytes, cudaMemcpyHostToDevice, stream));
}

void download_to(std::vector<float>& dst, const DeviceBuffer& src, cudaStream_t stream) {
    LATHE_CHECK(src.bytes() >= dst.size() * sizeof(float), "{} < {}", src.bytes(),
                dst.size() * sizeof(float));
    LATHE_CUDA_CHECK(cudaMemcpyAsync(dst.data(), src.data(), dst.size() * sizeof(float),
                                     cudaMemcpyDeviceToHost, stream));
}

}  // namespace

GloveCuda::GloveCuda(const Context& ctx, const GloveModel& model,
                     std::span<const GloveEntry> entries, int warps)
    : V_(model.V), D_(model.D), n_(int64_t(entries.size())) {
    LATHE_CHECK(V_ > 0 && D_ > 0 && D_ <= (int64_t{1} << 30), "V={} D={}", V_, D_);
    CudaState& state = cuda_state_of(ctx, "align glove");
    buffers_ = new Buffers();
    buffers_->stream = state.stream();
    cudaStream_t s = buffers_->stream;
    upload(buffers_->entries, entries.data(), entries.size_bytes(), s);
    upload(buffers_->w, model.w.data(), model.w.size() * sizeof(float), s);
    upload(buffers_->c, model.c.data(), model.c.size() * sizeof(float), s);
    upload(buffers_->bw, model.bw.data(), model.bw.size() * sizeof(float), s);
    upload(buffers_->bc, model.bc.data(), model.bc.size() * sizeof(float), s);
    upload(buffers_->gw, model.gw.data(), model.gw.size() * sizeof(float), s);
    upload(buffers_->gc, model.gc.data(), model.gc.size() * sizeof(float), s);
    upload(buffers_->gbw, model.gbw.data(), model.gbw.size() * sizeof(float), s);
    upload(buffers_->gbc, model.gbc.data(), model.gbc.size() * sizeof(float), s);
    if (warps <= 0) {
        // Fill the device: as many resident blocks as the occupancy calculator allows.
        int sms = 0, blocks_per_sm = 0;
        LATHE_CUDA_CHECK(
            cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, state.device()));
        LATHE_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
            &blocks_per_sm, glove_epoch_hogwild_kernel, kBlockThreads, 0));
        warps = std::max(1, sms * blocks_per_sm) * (kBlockThreads / kWarpSize);
        // Hogwild needs conflicts to be rare: with as many warps in flight as rows, most warps
        // update rows another warp is updating and the stale reads stall learning (a 40-token
        // vocabulary: cost 20x the CPU's; 4000 tokens and V / 4 warps: 1.6x). At most V / 16
        // warps: vocabularies above ~135k rows still fill an H100/H200, GPT-2's 50k-token
        // vocabulary on GCIDE (31k rows seen) runs ~1900 warps; whole blocks of warps.
        const int per_block = kBlockThreads / kWarpSize;
        const int64_t cap = std::max<int64_t>(per_block, (V_ / 16) / per_block * per_block);
        warps = int(std::min<int64_t>(warps, cap));
    }
    warps_ = warps;
    buffers_->cost = DeviceBuffer(size_t(warps_) * sizeof(double));
    LATHE_CUDA_CHECK(cudaStreamSynchronize(s));
}

GloveCuda::~GloveCuda() {
    if (buffers_ == nullptr) return;
    // The buffers go back only once the state's stream is done with them.
    cudaStreamSynchronize(buffers_->stream);
    delete buffers_;
}

double GloveCuda::epoch(double lr, double grad_clip) {
    if (n_ == 0) return 0.0;
    Buffers& b = *buffers_;
    const int threads_per_block = warps_ == 1 ? kWarpSize : kBlockThreads;
    const int warps_per_block = threads_per_block / kWarpSize;
    LATHE_CHECK(warps_ % warps_per_block == 0, "warps={} per block={}", warps_, warps_per_block);
    const int blocks = warps_ / warps_per_block;
    glove_epoch_hogwild_kernel<<<blocks, threads_per_block, 0, b.stream>>>(
        static_cast<const GloveEntry*>(b.entries.data()), n_, static_cast<float*>(b.w.data()),
        static_cast<float*>(b.c.data()), static_cast<float*>(b.bw.data()),
        static_cast<float*>(b.bc.data()), static_cast<float*>(b.gw.data()),
        static_cast<float*>(b.gc.data()), static_cast<float*>(b.gbw.data()),
        static_cast<float*>(b.gbc.data()), int(D_), float(lr), float(grad_clip),
        static_cast<double*>(b.cost.data()));
    LATHE_CUDA_CHECK_LAUNCH();
    std::vector<double> cost(size_t(warps_), 0.0);
    LATHE_CUDA_CHECK(cudaMemcpyAsync(cost.data(), b.cost.data(), cost.size() * sizeof(double),
                                     cudaMemcpyDeviceToHost, b.stream));
    LATHE_CUDA_CHECK(cudaStreamSynchronize(b.stream));
    double total = 0.0;
    for (double x : cost) total += x;  // warp order: deterministic for a given warp count
    return total / double(n_);
}

void GloveCuda::download(GloveModel& model) const {
    LATHE_CHECK(model.V == V_ && model.D == D_, "model {}x{} vs device {}x{}", model.V, model.D, V_,
                D_);
    const Buffers& b = *buffers_;
    download_to(model.w, b.w, b.stream);
    download_to(model.c, b.c, b.stream);
    download_to(model.bw, b.bw, b.stream);
    download_to(model.bc, b.bc, b.stream);
    download_to(model.gw, b.gw, b.stream);
    download_to(model.gc, b.gc, b.stream);
    download_to(model.gbw, b.gbw, b.stream);
    download_to(model.gbc, b.gbc, b.stream);
    LATHE_CUDA_CHECK(cudaStreamSynchronize(b.stream));
}

}  // namespace lathe
