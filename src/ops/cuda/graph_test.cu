// CudaGraph (ops/cuda/graph.h): which CUDA errors make a capture "refused" (the caller runs the
// work without a graph) and which are failures the caller returns; a capture CUDA invalidates
// leaves no error behind, so the next capture on the stream records and replays.
// clang-format off
#include "ops/cuda/nvcc_compat.h"  // first: before any header that includes fmt
// clang-format on

#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include "ops/cuda/cuda_check.h"
#include "ops/cuda/cuda_test_util.h"
#include "ops/cuda/graph.h"

namespace lathe {
namespace {

using namespace cudatest;

// The capture-specific errors, and errors of the device or the call that are not.
TEST(CudaGraph, OnlyCaptureSpecificErrorsAreRefusals) {
    for (const cudaError_t e :
         {cudaErrorStreamCaptureUnsupported, cudaErrorStreamCaptureInvalidated,
          cudaErrorStreamCaptureMerge, cudaErrorStreamCaptureUnjoined,
          cudaErrorStreamCaptureIsolation, cudaErrorStreamCaptureImplicit, cudaErrorCapturedEvent})
        EXPECT_TRUE(CudaGraph::capture_specific(e)) << cudaGetErrorName(e);
    for (const cudaError_t e :
         {cudaSuccess, cudaErrorMemoryAllocation, cudaErrorIllegalAddress, cudaErrorInvalidValue,
          cudaErrorLaunchFailure, cudaErrorIllegalState, cudaErrorStreamCaptureUnmatched,
          cudaErrorStreamCaptureWrongThread})
        EXPECT_FALSE(CudaGraph::capture_specific(e)) << cudaGetErrorName(e);
    EXPECT_TRUE(CudaGraph::capture_refused(Status(StatusCode::kUnimplemented, "refused")));
    EXPECT_FALSE(CudaGraph::capture_refused(Status(StatusCode::kInternal, "device")));
    EXPECT_FALSE(CudaGraph::capture_refused(ok_status()));
}

// A synchronization inside the capture invalidates it: end_capture's error is a refusal, the
// launches after it passed the checks, no error is left for the next call, and a capture of the
// same work then records and replays.
TEST(CudaGraph, AnInvalidatedCaptureIsRefusedAndLeavesTheStreamSound) {
    CudaState state(0);
    DeviceTensor buf = device_tensor(DType::kI32, {4}, state);
    ASSERT_TRUE(CudaGraph::begin_capture(state.stream()).ok());
    state.synchronize();  // not capturable: invalidates the capture, passes the check
    LATHE_CUDA_CHECK(cudaMemsetAsync(buf.view.data(), 0, 16, state.stream()));
    Result<CudaGraph> refused = CudaGraph::end_capture(state.stream());
    ASSERT_FALSE(refused.ok());
    EXPECT_TRUE(CudaGraph::capture_refused(refused.status())) << refused.status().to_string();
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);

    ASSERT_TRUE(CudaGraph::begin_capture(state.stream()).ok());
    LATHE_CUDA_CHECK(cudaMemsetAsync(buf.view.data(), 1, 16, state.stream()));
    Result<CudaGraph> g = CudaGraph::end_capture(state.stream());
    ASSERT_TRUE(g.ok()) << g.status().to_string();
    g->launch(state.stream());
    state.synchronize();
    const HostTensor got = download_raw(buf.view, state);
    for (int64_t i = 0; i < 4; ++i) EXPECT_EQ(got.as<int32_t>()[i], 0x01010101) << i;
}

}  // namespace
}  // namespace lathe
