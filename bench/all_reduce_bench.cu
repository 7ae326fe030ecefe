// clang-format off
#include "ops/cuda/nvcc_compat.h"  // first: before any header that includes fmt
// clang-format on

// Times the in-place bf16 sum of tensor-parallel decoding on G GPUs of one machine: NCCL's
// all_reduce against PeerAllReduce (dist/peer_all_reduce.h), each rank a thread with its own NCCL
// communicator, per call, for each buffer size. Each way is captured as one CUDA graph of kCalls
// calls (as the decode step replays them) on every rank, replayed 3 times untimed and 10 times
// timed with CUDA events; the median replay over kCalls is rank 0's time per call. Built with the
// tests (LATHE_CUDA_OPS_BENCH), packed by scripts/gpu-bundle.sh:
//
//   all_reduce_bench [--gpus G] [--bytes 16384,131072,...]
//
// Prints one Markdown table row per size: bytes, NCCL us, peer us, NCCL / peer.

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "dist/nccl_communicator.h"
#include "dist/peer_all_reduce.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/cuda_state.h"
#include "ops/cuda/graph.h"

namespace lathe {
namespace {

constexpr int kCalls = 50;

// Median microseconds per call of `calls` replayed from a graph (rank 0's; every rank runs it).
double time_graph(CUstream_st* s, const std::function<void()>& calls) {
    LATHE_CHECK(CudaGraph::begin_capture(s).ok(), "begin_capture");
    calls();
    Result<CudaGraph> g = CudaGraph::end_capture(s);
    LATHE_CHECK(g.ok(), "end_capture: {}", g.status().to_string());
    cudaEvent_t a, b;
    LATHE_CUDA_CHECK(cudaEventCreate(&a));
    LATHE_CUDA_CHECK(cudaEventCreate(&b));
    for (int i = 0; i < 3; ++i) g->launch(s);
    std::vector<double> us;
    for (int i = 0; i < 10; ++i) {
        LATHE_CUDA_CHECK(cudaEventRecord(a, s));
        g->launch(s);
        LATHE_CUDA_CHECK(cudaEventRecord(b, s));
        LATHE_CUDA_CHECK(cudaEventSynchronize(b));
        float ms = 0;
        LATHE_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
        us.push_back(1e3 * double(ms) / kCalls);
    }
    LATHE_CUDA_CHECK(cudaEventDestroy(a));
    LATHE_CUDA_CHECK(cudaEventDestroy(b));
    std::sort(us.begin(), us.end());
    return us[us.size() / 2];
}

void run_rank(int rank, int world, const NcclId& id, const std::vector<int64_t>& sizes,
              std::vector<std::pair<double, double>>* out) {
    CudaState state(rank);
    auto comm = nccl_communicator_create(id, rank, world, rank);
    LATHE_CHECK(comm.ok(), "rank {}: {}", rank, comm.status().to_string());
    CUstream_st* s = state.stream();
    const int64_t largest = *std::max_element(sizes.begin(), sizes.end());
    std::string why_not;
    auto peer = PeerAllReduce::open(**comm, largest, s, &why_not);
    LATHE_CHECK(peer.ok(), "rank {}: {}", rank, peer.status().to_string());
    LATHE_CHECK(*peer != nullptr, "rank {}: no peer all-reduce: {}", rank, why_not);
    DeviceBuffer buf(static_cast<size_t>(largest));
    // Zeros: repeated in-place sums stay finite (the time does not depend on the values).
    LATHE_CUDA_CHECK(cudaMemset(buf.data(), 0, size_t(largest)));
    for (const int64_t bytes : sizes) {
        const TensorView v(buf.data(), DType::kBF16, {bytes / 2}, Device::kCuda);
        const double nccl = time_graph(s, [&] {
            for (int i = 0; i < kCalls; ++i)
                LATHE_CHECK((*comm)->all_reduce(v, v, ReduceOp::kSum, s).ok(), "all_reduce");
        });
        const double p2p = time_graph(s, [&] {
            for (int i = 0; i < kCalls; ++i) (*peer)->sum(v, s);
        });
        if (rank == 0) out->emplace_back(nccl, p2p);
    }
    state.synchronize();
}

}  // namespace
}  // namespace lathe

int main(int argc, char** argv) {
    using namespace lathe;
    int world = 0;
    LATHE_CUDA_CHECK(cudaGetDeviceCount(&world));
    std::vector<int64_t> sizes = {16384, 65536, 131072, 262144, 524288, 1048576};
    const int devices = world;
    if (argc % 2 == 0) {
        std::fprintf(stderr, "usage: all_reduce_bench [--gpus G] [--bytes B,B,...]\n");
        return 2;
    }
    for (int i = 1; i + 1 < argc; i += 2) {
        if (std::strcmp(argv[i], "--gpus") == 0) {
            world = std::atoi(argv[i + 1]);
        } else if (std::strcmp(argv[i], "--bytes") == 0) {
            sizes.clear();
            for (const char* p = argv[i + 1]; *p != '\0';) {
                char* end = nullptr;
                sizes.push_back(std::strtoll(p, &end, 10));
                p = *end == ',' ? end + 1 : end;
            }
        } else {
            std::fprintf(stderr, "usage: all_reduce_bench [--gpus G] [--bytes B,B,...]\n");
            return 2;
        }
    }
    if (world < 2 || world > devices) {
        std::fprintf(stderr, "all_reduce_bench: --gpus %d: give 2 to the %d GPUs visible\n", world,
                     devices);
        return 2;
    }
    for (const int64_t b : sizes) {
        if (b < 16 || b % 16 != 0) {
            std::fprintf(stderr, "all_reduce_bench: --bytes %lld is not a multiple of 16\n",
                         static_cast<long long>(b));
            return 2;
        }
    }
    const Result<NcclId> id = nccl_unique_id();
    LATHE_CHECK(id.ok(), "{}", id.status().to_string());
    std::vector<std::pair<double, double>> rows;
    std::vector<std::thread> ranks;
    for (int r = 0; r < world; ++r)
        ranks.emplace_back(run_rank, r, world, std::cref(*id), std::cref(sizes), &rows);
    for (std::thread& t : ranks) t.join();
    std::printf(
        "| GPUs | bytes | NCCL us/call | peer us/call | NCCL / peer |\n|---|---|---|---|---|\n");
    for (size_t i = 0; i < sizes.size(); ++i) {
        std::printf("| %d | %lld | %.1f | %.1f | %.2f |\n", world, static_cast<long long>(sizes[i]),
                    rows[i].first, rows[i].second, rows[i].first / rows[i].second);
    }
    return 0;
}
