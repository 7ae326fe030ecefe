// clang-format off
#include "ops/cuda/nvcc_compat.h"  // first: before any header that includes fmt
// clang-format on

#include "dist/peer_all_reduce.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/check.h"
#include "core/dtype.h"
#include "dist/consistency.h"
#include "dist/host_collectives.h"
#include "ops/cuda/cuda_check.h"

namespace lathe {

namespace {

// Each exchange buffer: kBlocks x kMaxRanks u32 flags (rank r's block b raises [b][r]), padded to
// kFlagBytes, then two slots of slot_bytes.
constexpr int64_t kFlagBytes = 4096;
static_assert(int64_t(PeerAllReduce::kBlocks) * PeerAllReduce::kMaxRanks * 4 <= kFlagBytes);

struct PeerBases {
    char* base[PeerAllReduce::kMaxRanks];
};

__device__ __forceinline__ void store_release_sys(uint32_t* p, uint32_t v) {
    asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ uint32_t load_acquire_sys(const uint32_t* p) {
    uint32_t v;
    asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ uint64_t global_ns() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__device__ __forceinline__ void add_bf16x8(float acc[8], uint4 v) {
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const float2 f = __bfloat1622float2(h[j]);
        acc[2 * j] += f.x;
        acc[2 * j + 1] += f.y;
    }
}

__global__ void __launch_bounds__(PeerAllReduce::kThreads)
    peer_sum_kernel(PeerBases peers, uint4* buf, int64_t nvec, int rank, int world, uint32_t* calls,
                    int64_t slot_bytes, uint64_t wait_ns) {
    __shared__ uint32_t call_shared;
    const int b = int(blockIdx.x);
    if (threadIdx.x == 0) call_shared = calls[b] + 1;
    __syncthreads();
    const uint32_t k = call_shared;
    const int64_t slot = kFlagBytes + int64_t(k & 1u) * slot_bytes;
    const int64_t per = (nvec + gridDim.x - 1) / gridDim.x;
    const int64_t lo = min(nvec, int64_t(b) * per), hi = min(nvec, lo + per);

    uint4* mine = reinterpret_cast<uint4*>(peers.base[rank] + slot);
    for (int64_t v = lo + threadIdx.x; v < hi; v += blockDim.x) mine[v] = buf[v];
    __syncthreads();
    if (int(threadIdx.x) < world) {
        const int r = int(threadIdx.x);
        // The block's copies (ordered before this thread by the barrier) reach system scope
        // before the flag does.
        __threadfence_system();
        store_release_sys(
            reinterpret_cast<uint32_t*>(peers.base[r]) + b * PeerAllReduce::kMaxRanks + rank, k);
        const uint32_t* flag =
            reinterpret_cast<const uint32_t*>(peers.base[rank]) + b * PeerAllReduce::kMaxRanks + r;
        const uint64_t start = global_ns();
        // A peer may already be at call k + 1 (it raised k, saw ours, finished): >= k, in
        // wrapping arithmetic.
        while (int32_t(load_acquire_sys(flag) - k) < 0) {
            if (global_ns() - start > wait_ns) __trap();
        }
    }
    __syncthreads();
    for (int64_t v = lo + threadIdx.x; v < hi; v += blockDim.x) {
        float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        for (int r = 0; r < world; ++r) {
            const uint4* src = reinterpret_cast<const uint4*>(peers.base[r] + slot);
            add_bf16x8(acc, __ldcg(src + v));
        }
        uint4 out;
        __nv_bfloat162* o = reinterpret_cast<__nv_bfloat162*>(&out);
#pragma unroll
        for (int j = 0; j < 4; ++j) o[j] = __floats2bfloat162_rn(acc[2 * j], acc[2 * j + 1]);
        buf[v] = out;
    }
    if (threadIdx.x == 0) calls[b] = k;
}

Status cuda_status(cudaError_t err, std::string_view what) {
    if (err == cudaSuccess) return ok_status();
    return internal_error("peer all-reduce ({}): CUDA error {} ({})", what, cudaGetErrorName(err),
                          cudaGetErrorString(err));
}

// What each rank tells the others at open().
struct Card {
    cudaIpcMemHandle_t handle;
    uint64_t pointer;
    int64_t pid;
    int32_t device;
    int32_t exported;  // 1: handle is valid
    char bus_id[32];   // cudaDeviceGetPCIBusId of the rank's device
    char host[64];     // host_name(), cut: pids and bus ids mean something on one machine only
};

int64_t slot_bytes_for(int64_t max_bytes) {
    return (max_bytes + 255) / 256 * 256;
}

// The self-check's inputs: small integers, so every partial sum is exact in bf16 and f32.
float check_value(int pass, int rank, int64_t i) {
    return pass == 0 ? float((i * 7 + rank * 5) % 23 - 11) : float((i * 3 + rank * 11) % 19 - 9);
}

}  // namespace

Result<std::unique_ptr<PeerAllReduce>> PeerAllReduce::open(Communicator& comm, int64_t max_bytes,
                                                           CUstream_st* stream,
                                                           std::string* why_not) {
    LATHE_CHECK(max_bytes >= 16 && max_bytes % 16 == 0);
    LATHE_CHECK(why_not != nullptr);
    // The same on every rank, so every rank returns here alike.
    if (comm.size() > kMaxRanks) {
        *why_not = fmt::format("{} ranks, more than the {} it joins", comm.size(), kMaxRanks);
        return std::unique_ptr<PeerAllReduce>();
    }
    if (!comm.accepts(Device::kCuda)) {
        *why_not = fmt::format("the {} communicator takes no GPU buffers", comm.backend());
        return std::unique_ptr<PeerAllReduce>();
    }
    std::unique_ptr<PeerAllReduce> p(new PeerAllReduce());
    p->rank_ = comm.rank();
    p->size_ = comm.size();
    p->max_bytes_ = max_bytes;
    LATHE_RETURN_IF_ERROR(cuda_status(cudaGetDevice(&p->device_), "cudaGetDevice"));
    const int64_t bytes = kFlagBytes + 2 * slot_bytes_for(max_bytes);
    LATHE_RETURN_IF_ERROR(cuda_status(cudaMalloc(&p->own_, size_t(bytes)), "cudaMalloc"));
    void* calls = nullptr;
    LATHE_RETURN_IF_ERROR(
        cuda_status(cudaMalloc(&calls, kBlocks * sizeof(uint32_t)), "cudaMalloc"));
    p->calls_ = static_cast<uint32_t*>(calls);
    LATHE_RETURN_IF_ERROR(cuda_status(cudaMemset(p->own_, 0, size_t(bytes)), "cudaMemset"));
    LATHE_RETURN_IF_ERROR(
        cuda_status(cudaMemset(p->calls_, 0, kBlocks * sizeof(uint32_t)), "cudaMemset"));
    // Zeroed flags before any peer can see the buffer (the gather below comes after).
    LATHE_RETURN_IF_ERROR(cuda_status(cudaDeviceSynchronize(), "cudaDeviceSynchronize"));

    Card mine{};
    mine.pointer = reinterpret_cast<uint64_t>(p->own_);
    mine.pid = int64_t(::getpid());
    mine.device = p->device_;
    mine.exported = cudaIpcGetMemHandle(&mine.handle, p->own_) == cudaSuccess ? 1 : 0;
    if (cudaDeviceGetPCIBusId(mine.bus_id, sizeof mine.bus_id, p->device_) != cudaSuccess)
        mine.bus_id[0] = '\0';
    (void)cudaGetLastError();  // a refused export is answered below, not left for the next check
    const std::string machine = host_name();
    std::memcpy(mine.host, machine.data(), std::min(machine.size(), sizeof mine.host - 1));
    LATHE_ASSIGN_OR_RETURN(const std::vector<Card> cards, all_gather_value(comm, mine, stream));

    std::string reason;
    p->peers_[p->rank_] = p->own_;
    for (int r = 0; r < p->size_ && reason.empty(); ++r) {
        if (r == p->rank_) continue;
        const Card& c = cards[size_t(r)];
        if (std::strncmp(c.host, mine.host, sizeof mine.host) != 0) {
            reason = fmt::format("rank {} is on another machine ({})", r,
                                 std::string(c.host, strnlen(c.host, sizeof c.host)));
            break;
        }
        if (c.pid == mine.pid) {
            // Ranks that are threads of this process: the pointer itself, with peer access.
            int can = 0;
            if (cudaDeviceCanAccessPeer(&can, p->device_, c.device) != cudaSuccess || can == 0) {
                reason = fmt::format("device {} cannot access device {} (rank {}) peer to peer",
                                     p->device_, c.device, r);
                break;
            }
            const cudaError_t e = cudaDeviceEnablePeerAccess(c.device, 0);
            if (e != cudaSuccess && e != cudaErrorPeerAccessAlreadyEnabled) {
                reason = fmt::format("cudaDeviceEnablePeerAccess to device {} (rank {}): {}",
                                     c.device, r, cudaGetErrorString(e));
                break;
            }
            (void)cudaGetLastError();
            p->peers_[r] = reinterpret_cast<void*>(c.pointer);
            continue;
        }
        if (c.exported == 0) {
            reason = fmt::format("rank {} could not export its buffer (cudaIpcGetMemHandle)", r);
            break;
        }
        int peer_device = -1, can = 0;
        if (cudaDeviceGetByPCIBusId(&peer_device, c.bus_id) != cudaSuccess ||
            cudaDeviceCanAccessPeer(&can, p->device_, peer_device) != cudaSuccess || can == 0) {
            (void)cudaGetLastError();
            reason = fmt::format(
                "rank {}'s GPU (PCI {}) is not visible here or not reachable "
                "peer to peer",
                r, c.bus_id);
            break;
        }
        void* opened = nullptr;
        const cudaError_t e =
            cudaIpcOpenMemHandle(&opened, c.handle, cudaIpcMemLazyEnablePeerAccess);
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            reason = fmt::format("cudaIpcOpenMemHandle of rank {}'s buffer: {}", r,
                                 cudaGetErrorString(e));
            break;
        }
        p->peers_[r] = opened;
        p->opened_ipc_[r] = true;
    }
    // Every rank learns whether any rank failed (and keeps NCCL alike).
    LATHE_ASSIGN_OR_RETURN(const int failed, all_reduce_max(comm, reason.empty() ? 0 : 1, stream));
    if (failed != 0) {
        *why_not = reason.empty() ? "another rank cannot reach its peers" : reason;
        return std::unique_ptr<PeerAllReduce>();
    }

    // The self-check: two calls (both slots) over the largest buffer, against the exact sums.
    const int64_t n = max_bytes / 2;
    std::vector<bf16> host(static_cast<size_t>(n)), got(static_cast<size_t>(n));
    void* dev = nullptr;
    LATHE_RETURN_IF_ERROR(cuda_status(cudaMalloc(&dev, size_t(max_bytes)), "cudaMalloc"));
    std::string wrong;
    Status status = ok_status();
    for (int pass = 0; pass < 2 && status.ok() && wrong.empty(); ++pass) {
        for (int64_t i = 0; i < n; ++i)
            host[size_t(i)] = float_to_bf16(check_value(pass, p->rank_, i));
        status = cuda_status(
            cudaMemcpyAsync(dev, host.data(), size_t(max_bytes), cudaMemcpyHostToDevice, stream),
            "copy in");
        if (!status.ok()) break;
        p->sum(TensorView(dev, DType::kBF16, {n}, Device::kCuda), stream);
        status = cuda_status(
            cudaMemcpyAsync(got.data(), dev, size_t(max_bytes), cudaMemcpyDeviceToHost, stream),
            "copy out");
        if (status.ok()) status = cuda_status(cudaStreamSynchronize(stream), "self-check");
        for (int64_t i = 0; i < n && status.ok(); ++i) {
            float want = 0;
            for (int r = 0; r < p->size_; ++r) want += check_value(pass, r, i);
            const float g = bf16_to_float(got[size_t(i)]);
            if (g != want) {
                wrong = fmt::format("element {} of call {} is {}, the exact sum {}", i, pass + 1, g,
                                    want);
                break;
            }
        }
    }
    cudaFree(dev);
    LATHE_RETURN_IF_ERROR(status);
    LATHE_ASSIGN_OR_RETURN(const int bad, all_reduce_max(comm, wrong.empty() ? 0 : 1, stream));
    if (bad != 0) {
        return internal_error("peer all-reduce self-check on rank {}: {}", p->rank_,
                              wrong.empty() ? "another rank's sums are wrong" : wrong);
    }
    return Result<std::unique_ptr<PeerAllReduce>>(std::move(p));
}

PeerAllReduce::~PeerAllReduce() {
    int current = 0;
    const bool switched = cudaGetDevice(&current) == cudaSuccess && current != device_ &&
                          cudaSetDevice(device_) == cudaSuccess;
    // No kernel of this object may still read or write the buffers.
    (void)cudaDeviceSynchronize();
    for (int r = 0; r < size_; ++r)
        if (opened_ipc_[r]) (void)cudaIpcCloseMemHandle(peers_[r]);
    if (own_ != nullptr) (void)cudaFree(own_);
    if (calls_ != nullptr) (void)cudaFree(calls_);
    (void)cudaGetLastError();
    if (switched) (void)cudaSetDevice(current);
}

bool PeerAllReduce::fits(ConstTensorView buf) const {
    const int64_t bytes = buf.numel() * int64_t(dtype_size(buf.dtype()));
    return buf.dtype() == DType::kBF16 && buf.device() == Device::kCuda && bytes <= max_bytes_ &&
           bytes % 16 == 0 && reinterpret_cast<uintptr_t>(buf.data()) % 16 == 0;
}

void PeerAllReduce::sum(TensorView buf, CUstream_st* stream) {
    LATHE_CHECK(fits(buf));
    PeerBases bases{};
    for (int r = 0; r < size_; ++r) bases.base[r] = static_cast<char*>(peers_[r]);
    const int64_t nvec = buf.numel() * 2 / 16;
    peer_sum_kernel<<<kBlocks, kThreads, 0, stream>>>(
        bases, static_cast<uint4*>(buf.data()), nvec, rank_, size_, calls_,
        slot_bytes_for(max_bytes_), uint64_t(kPeerWaitSeconds * 1e9));
    LATHE_CUDA_CHECK_LAUNCH();
}

}  // namespace lathe
