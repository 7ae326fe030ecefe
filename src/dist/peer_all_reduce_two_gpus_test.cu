// dist_two_gpu_tests: PeerAllReduce (dist/peer_all_reduce.h) on two GPUs of one machine, each
// rank a thread with its NCCL communicator, against the host's sum of the same bf16 inputs in
// rank order in f32, rounded once: the same bits, eagerly and replayed from a CUDA graph. Needs
// two GPUs (scripts/gpu-check.sh's dist part).

// clang-format off
#include "ops/cuda/nvcc_compat.h"  // first: before any header that includes fmt
// clang-format on

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "core/dtype.h"
#include "dist/nccl_communicator.h"
#include "dist/peer_all_reduce.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/cuda_state.h"
#include "ops/cuda/graph.h"

namespace lathe {
namespace {

constexpr int kWorld = 2;
constexpr int64_t kMaxBytes = 256 * 1024;

// Rank r's input of call `call`: normal draws of varying scale, so sums round.
std::vector<bf16> input(int rank, int call, int64_t n) {
    std::mt19937 gen(uint32_t(1000 * call + rank));
    std::normal_distribution<float> d(0.0f, 1.0f + float(call % 5));
    std::vector<bf16> v(static_cast<size_t>(n));
    for (bf16& x : v) x = float_to_bf16(d(gen));
    return v;
}

std::vector<uint16_t> expected(int call, int64_t n) {
    std::vector<std::vector<bf16>> in;
    for (int r = 0; r < kWorld; ++r) in.push_back(input(r, call, n));
    std::vector<uint16_t> bits(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
        float acc = 0.0f;
        for (int r = 0; r < kWorld; ++r) acc += bf16_to_float(in[size_t(r)][size_t(i)]);
        bits[size_t(i)] = float_to_bf16(acc).bits;
    }
    return bits;
}

void upload(void* dev, const std::vector<bf16>& v, CUstream_st* s) {
    LATHE_CUDA_CHECK(cudaMemcpyAsync(dev, v.data(), v.size() * 2, cudaMemcpyHostToDevice, s));
}

std::vector<uint16_t> download(const void* dev, int64_t n, CUstream_st* s) {
    std::vector<uint16_t> bits(static_cast<size_t>(n));
    LATHE_CUDA_CHECK(cudaMemcpyAsync(bits.data(), dev, size_t(n) * 2, cudaMemcpyDeviceToHost, s));
    LATHE_CUDA_CHECK(cudaStreamSynchronize(s));
    return bits;
}

void run_rank(int rank, const NcclId& id, bool peer_access) {
    CudaState state(rank);
    auto comm = nccl_communicator_create(id, rank, kWorld, rank);
    ASSERT_TRUE(comm.ok()) << comm.status().to_string();
    CUstream_st* s = state.stream();
    std::string why_not;
    auto opened = PeerAllReduce::open(**comm, kMaxBytes, s, &why_not);
    ASSERT_TRUE(opened.ok()) << opened.status().to_string();
    if (!peer_access) {
        // Both ranks say no alike, with the reason.
        EXPECT_EQ(*opened, nullptr);
        EXPECT_NE(why_not.find("peer"), std::string::npos) << why_not;
        return;
    }
    ASSERT_NE(*opened, nullptr) << why_not;
    PeerAllReduce& peer = **opened;
    EXPECT_EQ(peer.rank(), rank);
    EXPECT_EQ(peer.size(), kWorld);

    DeviceBuffer buf(kMaxBytes), other(kMaxBytes);
    EXPECT_FALSE(peer.fits(ConstTensorView(buf.data(), DType::kF32, {64}, Device::kCuda)));
    EXPECT_FALSE(peer.fits(ConstTensorView(buf.data(), DType::kBF16, {12}, Device::kCuda)));
    EXPECT_FALSE(peer.fits(
        ConstTensorView(static_cast<char*>(buf.data()) + 2, DType::kBF16, {8}, Device::kCuda)));
    EXPECT_FALSE(
        peer.fits(ConstTensorView(buf.data(), DType::kBF16, {kMaxBytes / 2 + 8}, Device::kCuda)));

    // Eager: sizes from one vector to the largest, in and out of the block partition's tails, and
    // both slots many times over.
    const int64_t sizes[] = {8, 56, 8 * 1003, 8192, kMaxBytes / 2};
    int call = 0;
    for (int round = 0; round < 6; ++round) {
        for (const int64_t n : sizes) {
            ++call;
            upload(buf.data(), input(rank, call, n), s);
            peer.sum(TensorView(buf.data(), DType::kBF16, {n}, Device::kCuda), s);
            ASSERT_EQ(download(buf.data(), n, s), expected(call, n))
                << "rank " << rank << " call " << call << " numel " << n;
        }
    }

    // Replayed: one graph of two sums of different sizes on different buffers, new inputs
    // uploaded before each replay.
    const int64_t n1 = 8 * 4096, n2 = 8 * 5;
    ASSERT_TRUE(CudaGraph::begin_capture(s).ok());
    peer.sum(TensorView(buf.data(), DType::kBF16, {n1}, Device::kCuda), s);
    peer.sum(TensorView(other.data(), DType::kBF16, {n2}, Device::kCuda), s);
    Result<CudaGraph> graph = CudaGraph::end_capture(s);
    ASSERT_TRUE(graph.ok()) << graph.status().to_string();
    for (int replay = 0; replay < 10; ++replay) {
        const int c1 = 100 + 2 * replay, c2 = c1 + 1;
        upload(buf.data(), input(rank, c1, n1), s);
        upload(other.data(), input(rank, c2, n2), s);
        graph->launch(s);
        ASSERT_EQ(download(buf.data(), n1, s), expected(c1, n1)) << "replay " << replay;
        ASSERT_EQ(download(other.data(), n2, s), expected(c2, n2)) << "replay " << replay;
    }
    state.synchronize();
}

TEST(PeerAllReduceTwoGpus, SumsBitForBitTheHostsRankOrderSumEagerlyAndInAGraph) {
    int devices = 0;
    LATHE_CUDA_CHECK(cudaGetDeviceCount(&devices));
    ASSERT_GE(devices, kWorld) << "dist_two_gpu_tests needs two GPUs";
    int can01 = 0, can10 = 0;
    LATHE_CUDA_CHECK(cudaDeviceCanAccessPeer(&can01, 0, 1));
    LATHE_CUDA_CHECK(cudaDeviceCanAccessPeer(&can10, 1, 0));
    Result<NcclId> id = nccl_unique_id();
    ASSERT_TRUE(id.ok()) << id.status().to_string();
    std::vector<std::thread> ranks;
    for (int r = 0; r < kWorld; ++r)
        ranks.emplace_back(run_rank, r, std::cref(*id), can01 != 0 && can10 != 0);
    for (std::thread& t : ranks) t.join();
}

}  // namespace
}  // namespace lathe
