// clang-format off
#include "ops/cuda/nvcc_compat.h"  // first: before any header that includes fmt
// clang-format on

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <utility>

#include "ops/cuda/cuda_check.h"
#include "ops/cuda/cuda_state.h"
#include "ops/cuda/cuda_test_util.h"
#include "ops/embedding.h"
#include "ops/op_test.h"

namespace lathe {
namespace {

using namespace cudatest;

TEST(CudaState, ContextPointsAtTheState) {
    CudaState state(0);
    const Context ctx = state.context();
    EXPECT_EQ(ctx.backend, Backend::kCuda);
    EXPECT_EQ(ctx.device, 0);
    EXPECT_EQ(ctx.stream, state.stream());
    EXPECT_NE(ctx.stream, nullptr);
    EXPECT_EQ(ctx.cuda, &state);
    EXPECT_EQ(&cuda_state_of(ctx, "test"), &state);
    EXPECT_EQ(state.workspace_bytes(), CudaState::kWorkspaceBytes);
    EXPECT_NE(state.cublaslt(), nullptr);
}

TEST(CudaState, DeviceBufferMovesOwnership) {
    DeviceBuffer a(1000);
    void* p = a.data();
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 256, 0u);
    DeviceBuffer b(std::move(a));
    EXPECT_EQ(a.data(), nullptr);
    EXPECT_EQ(a.bytes(), 0u);
    EXPECT_EQ(b.data(), p);
    EXPECT_EQ(b.bytes(), 1000u);
    DeviceBuffer empty(0);
    EXPECT_EQ(empty.data(), nullptr);
    const TensorView v = b.view(DType::kF32, {250});
    EXPECT_EQ(v.device(), Device::kCuda);
    EXPECT_EQ(v.data(), p);
}

TEST(CudaState, CopyRoundTripAndPoison) {
    CudaState state(0);
    optest::Rng rng(1);
    const HostTensor h = optest::random_tensor(rng, {3, 5});
    DeviceTensor d = upload(h, DType::kF32, state);
    EXPECT_TRUE(bitwise_equal(download_f32(d.view, state), h));
    cuda_fill_bytes(d.view, 0xFF, state.stream());
    const HostTensor poisoned = download_f32(d.view, state);
    for (int64_t i = 0; i < poisoned.numel(); ++i) EXPECT_TRUE(std::isnan(poisoned.as<float>()[i]));
}

// Spins on the device for about `ns` nanoseconds: holds a stream back so that work on another
// stream, if unordered, would overtake it.
__global__ void spin_kernel(unsigned long long ns) {
    const unsigned long long start = clock64();
    // clock64 counts SM cycles; 2 GHz bounds an H100's boost clock from above, so this spins at
    // least `ns` nanoseconds.
    while (clock64() - start < ns * 2) {
    }
}

// out[i] = in[i] + 1.
__global__ void add_one_kernel(float* out, const float* in, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in[i] + 1.0f;
}

TEST(CudaState, ThreeDistinctStreams) {
    CudaState state(0);
    EXPECT_NE(state.copy_stream(), nullptr);
    EXPECT_NE(state.comm_stream(), nullptr);
    EXPECT_NE(state.copy_stream(), state.stream());
    EXPECT_NE(state.comm_stream(), state.stream());
    EXPECT_NE(state.copy_stream(), state.comm_stream());
    // Ops run on compute: the context does not hand out the other two.
    EXPECT_EQ(state.context().stream, state.stream());
    state.wait_for(state.stream(), state.stream());  // ordering a stream with itself is a no-op
    state.synchronize_all();
}

// A copy on the copy stream, held back by a spinning kernel, then ordered before a kernel on the
// compute stream by wait_for: the kernel reads the copied values, not the poison before them.
// And back: the compute result, ordered before a copy on the communication stream, arrives whole.
// Without the orders the reader would run during the 50 ms spin and see NaN.
TEST(CudaState, EventOrdersACopyBeforeAKernelOnAnotherStream) {
    CudaState state(0);
    constexpr int n = 1 << 16;
    optest::Rng rng(3);
    const HostTensor h = optest::random_tensor(rng, {n});
    DeviceTensor src = upload(h, DType::kF32, state);
    DeviceTensor dst = device_tensor(DType::kF32, {n}, state);  // poisoned: NaN
    DeviceTensor out = device_tensor(DType::kF32, {n}, state);
    DeviceTensor back = device_tensor(DType::kF32, {n}, state);
    state.synchronize();  // the uploads and poison are done before the streams race

    spin_kernel<<<1, 1, 0, state.copy_stream()>>>(50'000'000ull);
    LATHE_CUDA_CHECK(cudaGetLastError());
    LATHE_CUDA_CHECK(cudaMemcpyAsync(dst.view.data(), src.view.data(), dst.view.bytes(),
                                     cudaMemcpyDeviceToDevice, state.copy_stream()));
    state.wait_for(state.stream(), state.copy_stream());
    add_one_kernel<<<n / 256, 256, 0, state.stream()>>>(out.view.as<float>(), dst.view.as<float>(),
                                                        n);
    LATHE_CUDA_CHECK(cudaGetLastError());

    spin_kernel<<<1, 1, 0, state.stream()>>>(50'000'000ull);
    CudaEvent ready;
    ready.record(state.stream());
    ready.wait(state.comm_stream());
    LATHE_CUDA_CHECK(cudaMemcpyAsync(back.view.data(), out.view.data(), back.view.bytes(),
                                     cudaMemcpyDeviceToDevice, state.comm_stream()));
    // Only the communication stream is waited for: its copy must have waited for compute.
    LATHE_CUDA_CHECK(cudaStreamSynchronize(state.comm_stream()));

    HostTensor got(DType::kF32, {n});
    LATHE_CUDA_CHECK(
        cudaMemcpy(got.view().data(), back.view.data(), back.view.bytes(), cudaMemcpyDefault));
    int wrong = 0;
    for (int64_t i = 0; i < n; ++i)
        if (got.as<float>()[i] != h.as<float>()[i] + 1.0f) ++wrong;  // f32 + 1, exact on both sides
    EXPECT_EQ(wrong, 0) << "of " << n << " elements; first: " << got.as<float>()[0] << " vs "
                        << h.as<float>()[0] + 1.0f;
}

class CudaStateDeathTest : public ::testing::Test {
protected:
    void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

TEST_F(CudaStateDeathTest, FailingCallStopsWithTheCallAndError) {
    EXPECT_DEATH(LATHE_CUDA_CHECK(cudaSetDevice(12345)),
                 "cuda_state_test.cu.*cudaSetDevice\\(12345\\).*cudaErrorInvalidDevice");
}

TEST_F(CudaStateDeathTest, ScratchOverflowNamesTheOp) {
    CudaState state(0);
    EXPECT_DEATH(state.scratch(CudaState::kScratchBytes + 1, "some_op"), "some_op.*kScratchBytes");
}

TEST_F(CudaStateDeathTest, ContextWithoutStateStops) {
    Context ctx;
    ctx.backend = Backend::kCuda;
    EXPECT_DEATH(cuda_state_of(ctx, "some_op"), "some_op: a CUDA context without a CudaState");
}

TEST_F(CudaStateDeathTest, WaitForAForeignStreamStops) {
    CudaState state(0);
    EXPECT_DEATH(state.wait_for(state.stream(), nullptr), "wait_for: both streams must be");
}

TEST_F(CudaStateDeathTest, OpOnAnotherStreamStops) {
    CudaState state(0);
    Context ctx = state.context();
    ctx.stream = nullptr;  // the legacy default stream
    EXPECT_DEATH(cuda_state_of(ctx, "some_op"), "some_op: the context's stream is not");
}

TEST_F(CudaStateDeathTest, BadTokenIdTrapsTheKernel) {
    // A device-side check traps the kernel; the next checked call stops the process.
    EXPECT_DEATH(
        {
            CudaState state(0);
            const HostTensor tokens = optest::ids_of({1, 2}, {3, 7});  // V = 5: 7 is out of range
            optest::Rng rng(2);
            DeviceTensor t = upload(tokens, DType::kI32, state);
            DeviceTensor wte = upload(optest::random_tensor(rng, {5, 8}), DType::kBF16, state);
            DeviceTensor out = device_tensor(DType::kBF16, {1, 2, 8}, state);
            embedding_forward(out.view, t.view, ConstTensorView(), wte.view, ConstTensorView(),
                              state.context());
            state.synchronize();
        },
        "(cudaStreamSynchronize|cudaGetLastError).*CUDA error");
}

}  // namespace
}  // namespace lathe
