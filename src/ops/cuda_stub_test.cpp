// The CUDA backend of a build without CUDA (ops/cuda_stub/): a dispatching op handed a CUDA
// context reaches the launcher's stub, which stops naming the launcher and the missing backend.
// Views over host memory marked as device memory pass the shared checks; the stub never reads them.

#include <gtest/gtest.h>

#include "ops/context.h"
#include "ops/device_info.h"
#include "ops/gelu.h"
#include "ops/rmsnorm.h"

namespace lathe {
namespace {

TEST(CudaStubDeathTest, ACudaOpInABuildWithoutCudaStopsNamingTheLauncher) {
#if LATHE_HAVE_CUDA
    GTEST_SKIP() << "this build has the CUDA backend; the stubs are linked only without it";
#else
    bf16 storage[8] = {};
    const TensorView x(storage, DType::kBF16, Shape{2, 4}, Device::kCuda);
    Context cuda;
    cuda.backend = Backend::kCuda;
    EXPECT_DEATH(gelu_forward(x, x, GeluKind::kErf, cuda),
                 "cuda::gelu_forward: this lathe was built without CUDA");
    // An op that needs the CudaState stops at cuda_state_of, before its launcher.
    bf16 weight_storage[4] = {};
    float rstd_storage[2] = {};
    const TensorView weight(weight_storage, DType::kBF16, Shape{4}, Device::kCuda);
    const TensorView rstd(rstd_storage, DType::kF32, Shape{2}, Device::kCuda);
    EXPECT_DEATH(rmsnorm_backward(x, TensorView(), x, x, weight, rstd, GradMode::kOverwrite, cuda),
                 "cuda_state_of: this lathe was built without CUDA");
#endif
}

// The device probe answers in every build: a build without CUDA says so and finds no device.
TEST(CudaStub, TheDeviceProbeSaysWhetherThisBuildHasCuda) {
    const GpuEnvironment env = gpu_environment_probe(-1);
#if LATHE_HAVE_CUDA
    EXPECT_TRUE(env.cuda_build);
#else
    EXPECT_FALSE(env.cuda_build);
    EXPECT_TRUE(env.no_gpu);
    EXPECT_TRUE(env.devices.empty());
    EXPECT_NE(env.device_error.find("built without the CUDA backend"), std::string::npos)
        << env.device_error;
    size_t free_bytes = 1, total_bytes = 1;
    EXPECT_FALSE(gpu_memory_info(0, free_bytes, total_bytes));
    EXPECT_TRUE(gpu_self_test(0, 1).empty());
#endif
}

}  // namespace
}  // namespace lathe
