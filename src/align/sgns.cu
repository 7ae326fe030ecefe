// Skip-gram with negative sampling on the GPU: the CUDA twin of sgns_epoch_hogwild_cpu (sgns.h
// has the math, sgns_step.h the control flow both share). One warp per centre position: lane l
// owns dimensions l, l + 32, ... of the vectors and of the warp's gradient buffer (shared memory);
// dot products reduce with an xor butterfly so every lane holds the same value and takes the same
// branches. Warp k takes positions k, k + warps, ..., so all warps sweep the corpus together and
// the learning rate decays with p / N. Hogwild across warps (fastText's threads are too); one
// warp is deterministic and bitwise equal to one CPU thread (explicit round-to-nearest intrinsics,
// never contracted into FMA; the same counter-based draws; the same lookup tables).

// clang-format off
#include "ops/cuda/nvcc_compat.h"  // first: before any header that includes fmt
// clang-format on

#include <algorithm>
#include <vector>

#include "align/sgns.h"
#include "align/sgns_step.h"
#include "core/check.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/cuda_state.h"  // CudaState, DeviceBuffer
#include "ops/cuda/kernel_util.cuh"

namespace lathe {
namespace {

constexpr int kWarpSize = 32;
constexpr int kBlockThreads = 256;
constexpr unsigned kFullMask = 0xFFFFFFFFu;

// sgns_step.h's Math on one warp. grad points at this warp's D floats of shared memory; each lane
// touches only its own dimensions, so no synchronisation is needed.
struct WarpSgnsMath {
    float* in;
    float* out;
    float* grad;
    int D;
    int lane;

    __device__ float dot_out_in(uint32_t t, uint32_t w) const {
        const float* o = out + int64_t(t) * D;
        const float* h = in + int64_t(w) * D;
        float acc = 0.0f;
        for (int d = lane; d < D; d += kWarpSize) acc = __fadd_rn(acc, __fmul_rn(o[d], h[d]));
#pragma unroll
        for (int m = kWarpSize / 2; m >= 1; m /= 2)
            acc = __fadd_rn(acc, __shfl_xor_sync(kFullMask, acc, m));
        return acc;
    }
    __device__ void clear_grad() {
        for (int d = lane; d < D; d += kWarpSize) grad[d] = 0.0f;
    }
    __device__ void update_target(uint32_t t, uint32_t w, float a) {
        float* o = out + int64_t(t) * D;
        const float* h = in + int64_t(w) * D;
        for (int d = lane; d < D; d += kWarpSize) {
            const float od = o[d];
            grad[d] = __fadd_rn(grad[d], __fmul_rn(a, od));
            o[d] = __fadd_rn(od, __fmul_rn(a, h[d]));
        }
        __syncwarp();  // the next dot product reads out[t] written by other lanes
    }
    __device__ void apply_grad(uint32_t w) {
        float* h = in + int64_t(w) * D;
        for (int d = lane; d < D; d += kWarpSize) h[d] = __fadd_rn(h[d], grad[d]);
        __syncwarp();
    }
};

__global__ void sgns_epoch_hogwild_kernel(SgnsStepConfig cfg,
                                          const int64_t* __restrict__ doc_offsets, int64_t docs,
                                          int64_t n, float* in, float* out, int D,
                                          double* __restrict__ loss_per_warp,
                                          long long* __restrict__ updates_per_warp) {
    extern __shared__ float grad_smem[];
    const int lane = threadIdx.x & (kWarpSize - 1);
    const int warp_in_block = threadIdx.x / kWarpSize;
    const int64_t warp = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / kWarpSize;
    const int64_t warps = (int64_t(gridDim.x) * blockDim.x) / kWarpSize;
    WarpSgnsMath math{in, out, grad_smem + int64_t(warp_in_block) * D, D, lane};
    SgnsStepResult acc;
    int64_t doc = 0;
    for (int64_t p = warp; p < n; p += warps) {
        // The document holding p: doc_offsets[doc] <= p < doc_offsets[doc + 1] (binary search,
        // then forward from the last one, since p only grows).
        if (doc_offsets[doc + 1] <= p) {
            int64_t lo = doc, hi = docs;  // answer in [lo, hi)
            while (hi - lo > 1) {
                const int64_t mid = lo + (hi - lo) / 2;
                if (doc_offsets[mid] <= p)
                    lo = mid;
                else
                    hi = mid;
            }
            doc = lo;
        }
        const double progress = double(p) / double(n);
        sgns_step(cfg, math, p, doc_offsets[doc], doc_offsets[doc + 1], progress, acc);
    }
    if (lane == 0) {
        loss_per_warp[warp] = acc.loss;
        updates_per_warp[warp] = acc.updates;
    }
}

template <typename T>
std::unique_ptr<DeviceBuffer> upload(const std::vector<T>& v, cudaStream_t stream) {
    auto d = std::make_unique<DeviceBuffer>(v.size() * sizeof(T));
    if (!v.empty())
        LATHE_CUDA_CHECK(cudaMemcpyAsync(d->data(), v.data(), v.size() * sizeof(T),
                                         cudaMemcpyHostToDevice, stream));
    return d;
}

}  // namespace

struct SgnsCuda::Buffers {
    std::unique_ptr<DeviceBuffer> rows, doc_offsets, keep, negatives, sigmoid, log, in, out, loss,
        updates;
    int64_t n = 0, docs = 0;
    cudaStream_t stream = nullptr;  // the CudaState's compute stream (not owned)
};

SgnsCuda::SgnsCuda(const Context& ctx, const SgnsModel& model, const SgnsCorpus& corpus,
                   const SgnsTables& tables, int warps)
    : V_(model.V), D_(model.D) {
    LATHE_CHECK(V_ > 0 && D_ > 0 && D_ <= 4096, "V={} D={}", V_, D_);
    CudaState& state = cuda_state_of(ctx, "align sgns");
    buffers_ = new Buffers();
    Buffers& b = *buffers_;
    b.stream = state.stream();
    b.rows = upload(corpus.rows, b.stream);
    b.doc_offsets = upload(corpus.doc_offsets, b.stream);
    b.keep = upload(tables.keep, b.stream);
    b.negatives = upload(tables.negatives, b.stream);
    b.sigmoid = upload(tables.sigmoid, b.stream);
    b.log = upload(tables.log, b.stream);
    b.in = upload(model.in, b.stream);
    b.out = upload(model.out, b.stream);
    b.n = int64_t(corpus.rows.size());
    b.docs = int64_t(corpus.doc_offsets.size()) - 1;
    const size_t smem = size_t(kBlockThreads / kWarpSize) * size_t(D_) * sizeof(float);
    cuda::allow_dynamic_smem(sgns_epoch_hogwild_kernel, smem);
    if (warps <= 0) {
        int sms = 0, blocks_per_sm = 0;
        LATHE_CUDA_CHECK(
            cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, state.device()));
        LATHE_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
            &blocks_per_sm, sgns_epoch_hogwild_kernel, kBlockThreads, smem));
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
    b.loss = std::make_unique<DeviceBuffer>(size_t(warps_) * sizeof(double));
    b.updates = std::make_unique<DeviceBuffer>(size_t(warps_) * sizeof(long long));
    LATHE_CUDA_CHECK(cudaStreamSynchronize(b.stream));
}

SgnsCuda::~SgnsCuda() {
    if (buffers_ == nullptr) return;
    // The buffers go back only once the state's stream is done with them.
    cudaStreamSynchronize(buffers_->stream);
    delete buffers_;
}

double SgnsCuda::epoch(const SgnsOptions& options, int epoch) {
    Buffers& b = *buffers_;
    if (b.n == 0) return 0.0;
    SgnsStepConfig c{};
    c.rows = static_cast<uint32_t*>(b.rows->data());
    c.keep = static_cast<float*>(b.keep->data());
    c.negatives = static_cast<uint32_t*>(b.negatives->data());
    c.negatives_size = b.negatives->bytes() / sizeof(uint32_t);
    c.sigmoid = static_cast<float*>(b.sigmoid->data());
    c.log = static_cast<float*>(b.log->data());
    c.seed = options.seed;
    c.epoch = epoch;
    c.epochs = options.epochs;
    c.window = options.window;
    c.negative = options.negative;
    c.lr = options.lr;
    const int threads = warps_ == 1 ? kWarpSize : kBlockThreads;
    const int per_block = threads / kWarpSize;
    LATHE_CHECK(warps_ % per_block == 0, "warps={}", warps_);
    const size_t smem = size_t(per_block) * size_t(D_) * sizeof(float);
    sgns_epoch_hogwild_kernel<<<warps_ / per_block, threads, smem, b.stream>>>(
        c, static_cast<int64_t*>(b.doc_offsets->data()), b.docs, b.n,
        static_cast<float*>(b.in->data()), static_cast<float*>(b.out->data()), int(D_),
        static_cast<double*>(b.loss->data()), static_cast<long long*>(b.updates->data()));
    LATHE_CUDA_CHECK_LAUNCH();
    std::vector<double> loss(static_cast<size_t>(warps_));
    std::vector<long long> updates(static_cast<size_t>(warps_));
    LATHE_CUDA_CHECK(cudaMemcpyAsync(loss.data(), b.loss->data(), loss.size() * sizeof(double),
                                     cudaMemcpyDeviceToHost, b.stream));
    LATHE_CUDA_CHECK(cudaMemcpyAsync(updates.data(), b.updates->data(),
                                     updates.size() * sizeof(long long), cudaMemcpyDeviceToHost,
                                     b.stream));
    LATHE_CUDA_CHECK(cudaStreamSynchronize(b.stream));
    double total = 0;
    long long count = 0;
    for (size_t i = 0; i < loss.size(); ++i) total += loss[i], count += updates[i];
    return count > 0 ? total / double(count) : 0.0;
}

void SgnsCuda::download(SgnsModel& model) const {
    LATHE_CHECK(model.V == V_ && model.D == D_, "model {}x{} vs device {}x{}", model.V, model.D, V_,
                D_);
    const Buffers& b = *buffers_;
    LATHE_CUDA_CHECK(cudaMemcpyAsync(model.in.data(), b.in->data(), model.in.size() * sizeof(float),
                                     cudaMemcpyDeviceToHost, b.stream));
    LATHE_CUDA_CHECK(cudaMemcpyAsync(model.out.data(), b.out->data(),
                                     model.out.size() * sizeof(float), cudaMemcpyDeviceToHost,
                                     b.stream));
    LATHE_CUDA_CHECK(cudaStreamSynchronize(b.stream));
}

}  // namespace lathe
