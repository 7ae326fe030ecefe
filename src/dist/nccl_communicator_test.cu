// clang-format off
#include "ops/cuda/nvcc_compat.h"  // first: before any header that includes fmt
// clang-format on

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <vector>

#include "core/dtype.h"
#include "dist/communicator.h"
#include "dist/nccl_communicator.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/cuda_state.h"

#if defined(__NVCC__)
#pragma nv_diag_suppress 177
#endif

namespace lathe {
namespace {

// Host values that are exact in bf16 too, so one rank's identity is checked bit for bit.
std::vector<float> values(int64_t n, float shift) {
    std::vector<float> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i)
        v[size_t(i)] = bf16_to_float(float_to_bf16(shift + 0.25f * float(i % 37) - 3.0f));
    return v;
}

// n elements of `dtype` on the device holding `host` (converted), and a download back to f32.
struct Dev {
    DeviceBuffer buf;
    TensorView view;
};

Dev upload(const std::vector<float>& host, DType dtype, int64_t n_total = -1) {
    const int64_t n = n_total < 0 ? int64_t(host.size()) : n_total;
    Dev d{DeviceBuffer(size_t(n) * dtype_size(dtype)), {}};
    d.view = d.buf.view(dtype, {n});
    std::vector<uint8_t> bytes(size_t(n) * dtype_size(dtype), 0xFF);  // NaN beyond host
    for (size_t i = 0; i < host.size(); ++i) {
        if (dtype == DType::kF32)
            reinterpret_cast<float*>(bytes.data())[i] = host[i];
        else
            reinterpret_cast<bf16*>(bytes.data())[i] = float_to_bf16(host[i]);
    }
    LATHE_CUDA_CHECK(cudaMemcpy(d.view.data(), bytes.data(), bytes.size(), cudaMemcpyHostToDevice));
    // From pageable memory cudaMemcpy may return before the DMA lands; the collectives run on
    // non-blocking streams, which do not wait for it.
    LATHE_CUDA_CHECK(cudaDeviceSynchronize());
    return d;
}

std::vector<float> download(ConstTensorView v) {
    std::vector<uint8_t> bytes(v.bytes());
    LATHE_CUDA_CHECK(cudaMemcpy(bytes.data(), v.data(), bytes.size(), cudaMemcpyDeviceToHost));
    std::vector<float> out(size_t(v.numel()));
    for (size_t i = 0; i < out.size(); ++i)
        out[i] = v.dtype() == DType::kF32 ? reinterpret_cast<float*>(bytes.data())[i]
                                          : bf16_to_float(reinterpret_cast<bf16*>(bytes.data())[i]);
    return out;
}

std::unique_ptr<Communicator> nccl_world_of_one(int device) {
    auto id = nccl_unique_id();
    LATHE_CHECK(id.ok(), "{}", id.status().to_string());
    auto comm = nccl_communicator_create(*id, 0, 1, device);
    LATHE_CHECK(comm.ok(), "{}", comm.status().to_string());
    return std::move(*comm);
}

// A world of one on one GPU: every collective is the identity, on the communication stream,
// ordered after compute and before compute with CudaState::wait_for. Run for NCCL and for the
// local communicator with CUDA buffers (which copies on the stream).
void check_identity(Communicator& comm, CudaState& state, const char* name) {
    CUstream_st* s = state.comm_stream();
    constexpr int64_t n = 4099;
    for (DType dtype : {DType::kF32, DType::kBF16}) {
        const std::vector<float> host = values(n, 0.5f);
        for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax}) {
            Dev in = upload(host, dtype), out = upload({}, dtype, n);
            state.wait_for(s, state.stream());
            ASSERT_TRUE(comm.all_reduce(out.view, in.view, op, s).ok());
            ASSERT_TRUE(comm.all_reduce(in.view, in.view, op, s).ok());  // in place
            Dev scattered = upload({}, dtype, n);
            ASSERT_TRUE(comm.reduce_scatter(scattered.view, in.view, op, s).ok());
            state.wait_for(state.stream(), s);
            state.synchronize_all();
            EXPECT_EQ(download(out.view), host)
                << name << " all_reduce " << dtype_name(dtype) << " " << reduce_op_name(op);
            EXPECT_EQ(download(in.view), host) << name << " in place";
            EXPECT_EQ(download(scattered.view), host) << name << " reduce_scatter";
        }
        Dev in = upload(host, dtype), gathered = upload({}, dtype, n);
        ASSERT_TRUE(comm.all_gather(gathered.view, in.view, s).ok());
        ASSERT_TRUE(comm.broadcast(in.view, 0, s).ok());
        state.synchronize_all();
        EXPECT_EQ(download(gathered.view), host) << name << " all_gather";
        EXPECT_EQ(download(in.view), host) << name << " broadcast";
    }
}

TEST(NcclCommunicator, WorldOfOneOnOneGpu) {
    ASSERT_TRUE(nccl_available());
    CudaState state(0);
    std::unique_ptr<Communicator> comm = nccl_world_of_one(0);
    EXPECT_EQ(comm->backend(), "nccl");
    EXPECT_EQ(comm->rank(), 0);
    EXPECT_EQ(comm->size(), 1);
    EXPECT_TRUE(comm->accepts(Device::kCuda));
    EXPECT_FALSE(comm->accepts(Device::kCpu));
    check_identity(*comm, state, "nccl");
}

TEST(NcclCommunicator, SplitOfOne) {
    CudaState state(0);
    std::unique_ptr<Communicator> comm = nccl_world_of_one(0);
    auto sub = comm->split(7, 0);
    ASSERT_TRUE(sub.ok()) << sub.status().to_string();
    ASSERT_NE(sub->get(), nullptr);
    EXPECT_EQ((*sub)->backend(), "nccl");
    EXPECT_EQ((*sub)->size(), 1);
    check_identity(**sub, state, "nccl split");
    sub->reset();  // before the communicator it came from
    auto none = comm->split(Communicator::kNoColor, 0);
    ASSERT_TRUE(none.ok()) << none.status().to_string();
    EXPECT_EQ(none->get(), nullptr);
}

TEST(LocalCommunicatorCuda, CopiesOnTheStream) {
    CudaState state(0);
    LocalCommunicator comm;
    EXPECT_TRUE(comm.accepts(Device::kCuda));
    check_identity(comm, state, "local");
}

TEST(NcclCommunicator, BadRankIsAnError) {
    NcclId id{};
    auto comm = nccl_communicator_create(id, 2, 2, 0);
    ASSERT_FALSE(comm.ok());
    EXPECT_NE(comm.status().message().find("rank 2 of a world of 2"), std::string::npos);
}

}  // namespace
}  // namespace lathe
