// clang-format off
#include "ops/cuda/nvcc_compat.h"  // first: before any header that includes fmt
// clang-format on

#include <gtest/gtest.h>

#include <limits>

#include "ops/argmax.h"
#include "ops/cuda/cuda_test_util.h"
#include "ops/cuda/memory.h"

namespace lathe {
namespace {

using namespace cudatest;

// The device's argmax of bf16 rows against the CPU reference over the same values widened: equal
// ids, row by row (a pick, not a sum: no tolerance). Rows hold planted ties of the maximum (the
// lowest index must win), NaNs above every finite value (they count as -inf), a row of only -inf
// and NaN (index 0), the maximum in the row's last element, +inf twice, zeros of both signs.
void check_argmax(int64_t N, int64_t V, uint64_t seed, bool offset) {
    SCOPED_TRACE(::testing::Message() << "N=" << N << " V=" << V << " offset=" << offset);
    CudaState state(0);
    optest::Rng rng(seed);
    // Values on a coarse grid, so that equal maxima also arise by chance.
    HostTensor x(DType::kF32, {N, V});
    float* v = x.as<float>();
    for (int64_t i = 0; i < N * V; ++i) v[i] = float(rng.integer(-64, 64)) / 8.0f;
    const float nan = std::numeric_limits<float>::quiet_NaN();
    const float inf = std::numeric_limits<float>::infinity();
    for (int64_t n = 0; n < N; ++n) {
        float* row = v + n * V;
        switch (n % 7) {
            case 0:  // ties of the maximum far apart; the first must win
                row[rng.integer(V / 2, V - 1)] = 20.0f;
                row[rng.integer(0, V / 2 - 1)] = 20.0f;
                break;
            case 1:  // NaNs above everything count as -inf
                row[rng.integer(0, V - 1)] = nan;
                row[rng.integer(0, V - 1)] = 30.0f;
                row[rng.integer(0, V - 1)] = nan;
                break;
            case 2:  // the last element
                row[V - 1] = 40.0f;
                break;
            case 3:  // only -inf and NaN: index 0
                for (int64_t i = 0; i < V; ++i) row[i] = i % 3 == 1 ? nan : -inf;
                break;
            case 4: {  // +inf twice: the first
                const int64_t second = rng.integer(V / 2, V - 1);
                row[second] = inf;
                row[rng.integer(0, V / 2 - 1)] = inf;
                break;
            }
            case 5:  // zeros of both signs compare equal: index 0
                for (int64_t i = 0; i < V; ++i) row[i] = i % 2 == 0 ? -0.0f : 0.0f;
                break;
            default:  // the grid's own maxima (many ties at 8.0)
                break;
        }
    }
    HostTensor want(DType::kI32, {N});
    argmax_rows(want.view(), x.view(), cpu_context());
    // `offset`: rows that start off a 16-byte boundary (the kernel's scalar path).
    DeviceTensor gx = device_tensor(DType::kBF16, {N * V + 1}, state);
    const TensorView rows(static_cast<bf16*>(gx.view.data()) + (offset ? 1 : 0), DType::kBF16,
                          Shape{N, V}, Device::kCuda);
    DeviceTensor staged = upload(x, DType::kBF16, state);
    cuda_copy_async(rows, staged.view, state.stream());
    DeviceTensor ids = device_tensor(DType::kI32, {N}, state);
    argmax_rows(ids.view, rows, state.context());
    const HostTensor got = download_raw(ids.view, state);
    for (int64_t n = 0; n < N; ++n)
        EXPECT_EQ(got.as<int32_t>()[n], want.as<int32_t>()[n]) << "row " << n;
}

TEST(CudaArgmax, MatchesCpuAtVocabularySizes) {
    check_argmax(14, 128256, 1, false);  // Llama 3: the 16-byte path
    check_argmax(10, 32000, 2, false);
    check_argmax(10, 50257, 3, false);  // GPT-2: V % 8 != 0, the scalar path
    check_argmax(7, 37, 4, false);      // fewer elements than threads
    check_argmax(7, 1024, 7, false);    // the 16-byte path with threads left without elements
}

TEST(CudaArgmax, RowsOffSixteenBytesTakeTheScalarPath) {
    check_argmax(10, 32000, 5, true);
}

TEST(CudaArgmax, BatchOfSixtyFourRows) {
    check_argmax(64, 128256, 6, false);
}

}  // namespace
}  // namespace lathe
