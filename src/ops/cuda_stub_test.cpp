// The CUDA backend of a build without CUDA (ops/cuda_stub/): a dispatching op handed a CUDA
// context reaches the launcher's stub, which stops naming the launcher and the missing backend.
// Views over host memory marked as device memory pass the shared checks; the stub never reads them.

#include <gtest/gtest.h>

#include "ops/context.h"
#include "ops/gelu.h"

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
#endif
}

}  // namespace
}  // namespace lathe
