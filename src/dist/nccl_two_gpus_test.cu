// dist_two_gpu_tests: two ranks on two GPUs of one machine, each rank a thread that opens its
// communicator as a process launched by torchrun would (environment map -> process group -> TCP
// rendezvous for the NCCL id -> NcclCommunicator on cuda:<local rank>), then every collective
// against the same math done on the host. Needs two GPUs; not part of scripts/gpu-check.sh (its
// machine has one): `dist_two_gpu_tests` on a machine with two.

// clang-format off
#include "ops/cuda/nvcc_compat.h"  // first: before any header that includes fmt
// clang-format on

#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmath>
#include <thread>
#include <vector>

#include "core/dtype.h"
#include "dist/communicator.h"
#include "dist/consistency.h"
#include "dist/host_collectives.h"
#include "dist/open.h"
#include "dist/process_group.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/cuda_state.h"

#if defined(__NVCC__)
#pragma nv_diag_suppress 177
#endif

namespace lathe {
namespace {

constexpr int kWorld = 2;

int free_port() {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
    socklen_t len = sizeof a;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    ::close(fd);
    return ntohs(a.sin_port);
}

float input(int rank, int64_t i) {
    return std::sin(0.37f * float(i) + 1.3f * float(rank)) * float(1 + (i + rank) % 5);
}

float stored(float x, DType dtype) {
    return dtype == DType::kF32 ? x : bf16_to_float(float_to_bf16(x));
}

std::vector<uint8_t> bytes_of(int rank, int64_t n, DType dtype) {
    std::vector<uint8_t> b(size_t(n) * dtype_size(dtype));
    for (int64_t i = 0; i < n; ++i) {
        if (dtype == DType::kF32)
            reinterpret_cast<float*>(b.data())[i] = input(rank, i);
        else
            reinterpret_cast<bf16*>(b.data())[i] = float_to_bf16(input(rank, i));
    }
    return b;
}

float read(const std::vector<uint8_t>& b, DType dtype, int64_t i) {
    return dtype == DType::kF32 ? reinterpret_cast<const float*>(b.data())[i]
                                : bf16_to_float(reinterpret_cast<const bf16*>(b.data())[i]);
}

// The bound of mpi_ranks_test.cpp: size - 1 roundings of the storage type over sum|x|, one more
// for avg's division; max is exact.
void expect_reduced(float got, ReduceOp op, DType dtype, int64_t i, const std::string& what) {
    const double u = dtype == DType::kF32 ? std::ldexp(1.0, -24) : std::ldexp(1.0, -8);
    double sum = 0, sum_abs = 0, max = -INFINITY;
    for (int r = 0; r < kWorld; ++r) {
        const double x = stored(input(r, i), dtype);
        sum += x;
        sum_abs += std::fabs(x);
        max = std::max(max, x);
    }
    double exact = sum, bound = u * (kWorld - 1) * sum_abs;
    if (op == ReduceOp::kAvg) {
        exact = sum / kWorld;
        bound = bound / kWorld + u * std::fabs(exact);
    } else if (op == ReduceOp::kMax) {
        exact = max;
        bound = 0;
    }
    EXPECT_LE(std::fabs(got - exact), bound) << what << " element " << i;
}

// One rank's whole test; failures are recorded by gtest from either thread.
void run_rank(int rank, int port) {
    const EnvMap env = {{"RANK", std::to_string(rank)},
                        {"WORLD_SIZE", std::to_string(kWorld)},
                        {"LOCAL_RANK", std::to_string(rank)},
                        {"MASTER_ADDR", "127.0.0.1"},
                        {"MASTER_PORT", std::to_string(port - 1)}};  // torchrun: port - 1 + 1
    auto group = process_group_from_env(env);
    ASSERT_TRUE(group.ok()) << group.status().to_string();
    CudaState state(group->local_rank);
    auto opened = communicator_open(*group, Backend::kCuda, group->local_rank, 60'000);
    ASSERT_TRUE(opened.ok()) << opened.status().to_string();
    Communicator& comm = **opened;
    ASSERT_EQ(comm.backend(), "nccl");
    ASSERT_EQ(comm.rank(), rank);
    ASSERT_EQ(comm.size(), kWorld);
    CUstream_st* s = state.comm_stream();
    constexpr int64_t chunk = 2053;
    const int64_t n = chunk * kWorld;
    for (DType dtype : {DType::kF32, DType::kBF16}) {
        const std::vector<uint8_t> host = bytes_of(rank, n, dtype);
        DeviceBuffer in(host.size()), out(host.size()), part(host.size() / kWorld);
        const TensorView vin = in.view(dtype, {n}), vout = out.view(dtype, {n}),
                         vpart = part.view(dtype, {chunk});
        for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax}) {
            const std::string what =
                fmt::format("rank {} {} {}", rank, dtype_name(dtype), reduce_op_name(op));
            LATHE_CUDA_CHECK(cudaMemcpy(vin.data(), host.data(), host.size(), cudaMemcpyDefault));
            // A pageable upload may return before its DMA lands; the comm stream does not wait.
            LATHE_CUDA_CHECK(cudaDeviceSynchronize());
            ASSERT_TRUE(comm.all_reduce(vout, vin, op, s).ok());
            ASSERT_TRUE(comm.reduce_scatter(vpart, vin, op, s).ok());
            state.synchronize_all();
            std::vector<uint8_t> got(host.size()), got_part(host.size() / kWorld);
            LATHE_CUDA_CHECK(cudaMemcpy(got.data(), vout.data(), got.size(), cudaMemcpyDefault));
            LATHE_CUDA_CHECK(
                cudaMemcpy(got_part.data(), vpart.data(), got_part.size(), cudaMemcpyDefault));
            for (int64_t i = 0; i < n; ++i)
                expect_reduced(read(got, dtype, i), op, dtype, i, "all_reduce " + what);
            for (int64_t j = 0; j < chunk; ++j)
                expect_reduced(read(got_part, dtype, j), op, dtype, rank * chunk + j,
                               "reduce_scatter " + what);
        }
        // all_gather in place: this rank's chunk already sits in its slot of out.
        LATHE_CUDA_CHECK(
            cudaMemcpy(static_cast<char*>(vout.data()) + rank * chunk * dtype_size(dtype),
                       host.data() + rank * chunk * dtype_size(dtype), chunk * dtype_size(dtype),
                       cudaMemcpyDefault));
        LATHE_CUDA_CHECK(cudaDeviceSynchronize());
        ASSERT_TRUE(comm.all_gather(vout, vout.slice(rank * chunk, (rank + 1) * chunk), s).ok());
        // broadcast from rank 1.
        LATHE_CUDA_CHECK(cudaMemcpy(vin.data(), host.data(), host.size(), cudaMemcpyDefault));
        LATHE_CUDA_CHECK(cudaDeviceSynchronize());
        ASSERT_TRUE(comm.broadcast(vin, 1, s).ok());
        state.synchronize_all();
        std::vector<uint8_t> gathered(host.size()), bcast(host.size());
        LATHE_CUDA_CHECK(cudaMemcpy(gathered.data(), vout.data(), host.size(), cudaMemcpyDefault));
        LATHE_CUDA_CHECK(cudaMemcpy(bcast.data(), vin.data(), host.size(), cudaMemcpyDefault));
        for (int r = 0; r < kWorld; ++r) {
            const std::vector<uint8_t> theirs = bytes_of(r, n, dtype);
            const size_t off = size_t(r * chunk) * dtype_size(dtype);
            EXPECT_TRUE(std::equal(gathered.begin() + off,
                                   gathered.begin() + off + chunk * dtype_size(dtype),
                                   theirs.begin() + off))
                << "all_gather chunk " << r << " on rank " << rank;
        }
        EXPECT_EQ(bcast, bytes_of(1, n, dtype)) << "broadcast on rank " << rank;
    }
    // Host values through the device (dist/host_collectives.h), then the consistency check.
    std::vector<std::byte> mine(37), all(37 * kWorld);
    for (size_t i = 0; i < mine.size(); ++i) mine[i] = std::byte(uint8_t(rank * 100 + i));
    ASSERT_TRUE(all_gather_bytes(comm, mine, all, s).ok());
    for (int r = 0; r < kWorld; ++r)
        for (size_t i = 0; i < mine.size(); ++i)
            ASSERT_EQ(all[r * mine.size() + i], std::byte(uint8_t(r * 100 + i))) << rank;
    ASSERT_TRUE(barrier(comm, s).ok());
    auto max = all_reduce_max(comm, rank == 1 ? 5 : -5, s);
    ASSERT_TRUE(max.ok()) << max.status().to_string();
    EXPECT_EQ(*max, 5);
    auto sum = all_reduce_sum(comm, 0.25 + rank, s);
    ASSERT_TRUE(sum.ok());
    EXPECT_EQ(*sum, 0.25 + (0.25 + 1));
    std::vector<RankItem> items = {{"binary", 1}, {"config", 2}};
    EXPECT_TRUE(check_same_across_ranks(comm, items, s).ok());
    if (rank == 1) items[1].hash = 3;
    const Status differs = check_same_across_ranks(comm, items, s);
    EXPECT_NE(differs.message().find("rank 1 on " + host_name() + " has a different config"),
              std::string::npos)
        << differs.to_string();
    EXPECT_TRUE(comm.async_error().ok());

    // A subgroup per rank: each alone.
    auto alone = comm.split(rank, 0);
    ASSERT_TRUE(alone.ok()) << alone.status().to_string();
    EXPECT_EQ((*alone)->size(), 1);
}

TEST(NcclTwoGpus, EveryCollectiveMatchesTheHostMath) {
    int devices = 0;
    LATHE_CUDA_CHECK(cudaGetDeviceCount(&devices));
    ASSERT_GE(devices, kWorld) << "dist_two_gpu_tests needs two GPUs";
    const int port = free_port();
    std::vector<std::thread> ranks;
    for (int r = 0; r < kWorld; ++r) ranks.emplace_back(run_rank, r, port);
    for (auto& t : ranks) t.join();
}

}  // namespace
}  // namespace lathe
