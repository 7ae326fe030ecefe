// clang-format off
#include "ops/cuda/nvcc_compat.h"  // first: before any header that includes fmt
// clang-format on

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <vector>

#include "dist/communicator.h"
#include "dist/host_collectives.h"
#include "dist/nccl_communicator.h"
#include "ops/cuda/cuda_state.h"

#if defined(__NVCC__)
#pragma nv_diag_suppress 177
#endif

namespace lathe {
namespace {

// The staging path of dist/host_collectives.h on one GPU: an NCCL world of one (which takes no
// host buffers), on the communication stream. Sizes grow across calls, so the staging buffer is
// reallocated once between them.
TEST(HostCollectivesCuda, NcclWorldOfOneStagesThroughTheDevice) {
    ASSERT_TRUE(nccl_available());
    CudaState state(0);
    auto id = nccl_unique_id();
    ASSERT_TRUE(id.ok()) << id.status().to_string();
    auto made = nccl_communicator_create(*id, 0, 1, 0);
    ASSERT_TRUE(made.ok()) << made.status().to_string();
    Communicator& comm = **made;
    ASSERT_FALSE(comm.accepts(Device::kCpu));
    CUstream_st* s = state.comm_stream();

    for (size_t n : {size_t(3), size_t(4096), size_t(100'001)}) {
        std::vector<std::byte> mine(n), all(n, std::byte{0});
        for (size_t i = 0; i < n; ++i) mine[i] = std::byte(uint8_t(i * 131 + 7));
        ASSERT_TRUE(all_gather_bytes(comm, mine, all, s).ok()) << n;
        EXPECT_EQ(all, mine) << n;
    }
    const std::vector<double> d = {0.1, -2.5e300};
    std::vector<double> dall(2);
    ASSERT_TRUE(all_gather_values<double>(comm, d, dall, s).ok());
    EXPECT_EQ(dall, d);
    EXPECT_TRUE(barrier(comm, s).ok());
    auto max = all_reduce_max(comm, 41, s);
    ASSERT_TRUE(max.ok()) << max.status().to_string();
    EXPECT_EQ(*max, 41);
    auto sum = all_reduce_sum(comm, int64_t(-5), s);
    ASSERT_TRUE(sum.ok());
    EXPECT_EQ(*sum, -5);
    // Nothing went wrong in the background.
    EXPECT_TRUE(comm.async_error().ok());
}

// abort() ends the communicator; async_error() then reports nothing and destruction is safe.
TEST(NcclCommunicator, AbortThenDestroy) {
    CudaState state(0);
    auto id = nccl_unique_id();
    ASSERT_TRUE(id.ok());
    auto made = nccl_communicator_create(*id, 0, 1, 0);
    ASSERT_TRUE(made.ok()) << made.status().to_string();
    EXPECT_TRUE((*made)->async_error().ok());
    (*made)->abort();
    (*made)->abort();  // twice: nothing more
    EXPECT_TRUE((*made)->async_error().ok());
    made->reset();
}

}  // namespace
}  // namespace lathe
