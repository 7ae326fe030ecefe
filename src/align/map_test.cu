// The CUDA top-2 (align/map.cu) against its CPU twin on fresh random inputs. Label gpu.
// clang-format off
#include "ops/cuda/nvcc_compat.h"  // first: before any header that includes fmt
// clang-format on

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "align/map.h"
#include "ops/cuda/cuda_state.h"

namespace lathe {
namespace {

std::vector<float> random_matrix(int64_t rows, int64_t cols, std::mt19937_64& rng) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> m(size_t(rows * cols));
    for (float& x : m) x = normal(rng);
    return m;
}

// Runs both backends and checks they agree: the same best (and second) column wherever the CPU's
// margin to the next candidate exceeds what fp32 GEMM rounding can move, and scores within it.
//
// The bound: a score is a K-term fp32 dot product (the CUDA GEMM in plain fp32, no TF32; the CPU
// twin in fp32 too), and any summation order errs by at most gamma_K * sum_k |a_k b_k| with
// gamma_K = K u / (1 - K u), u = 2^-24 (the standard worst-case bound; FMA only tightens it).
// Both backends err, so they differ by at most 2 gamma_K sum_k |a_k b_k|, and by Cauchy-Schwarz
// sum_k |a_k b_k| <= ||a|| ||b||: row i's scores agree within 2 gamma_K ||a_i|| max_j ||b_j||
// (K = 300, unit normals: about 1.1e-2; the typical error, a random walk, is far smaller).
void compare(const Context& ctx, int64_t M, int64_t N, int64_t K, int64_t tile_rows,
             int64_t tile_cols, uint64_t seed, bool duplicate_columns) {
    std::mt19937_64 rng(seed);
    std::vector<float> A = random_matrix(M, K, rng), B = random_matrix(N, K, rng);
    if (duplicate_columns) {  // exact ties: column j+1 equals column j for every even j
        for (int64_t j = 0; j + 1 < N; j += 2)
            std::copy(B.begin() + j * K, B.begin() + (j + 1) * K, B.begin() + (j + 1) * K);
    }
    std::vector<AlignTop2> cpu(static_cast<size_t>(M)), gpu(static_cast<size_t>(M));
    align_top2_cpu(cpu, A.data(), M, B.data(), N, K, 64, 1000);
    ASSERT_TRUE(align_top2_cuda(ctx, gpu, A.data(), M, B.data(), N, K, tile_rows, tile_cols).ok());
    const double u = std::ldexp(1.0, -24), gamma = double(K) * u / (1.0 - double(K) * u);
    auto norm = [K](const float* v) {
        double s = 0;
        for (int64_t k = 0; k < K; ++k) s += double(v[k]) * double(v[k]);
        return std::sqrt(s);
    };
    double b_max = 0;
    for (int64_t j = 0; j < N; ++j) b_max = std::max(b_max, norm(B.data() + j * K));
    int64_t checked = 0;
    for (int64_t i = 0; i < M; ++i) {
        const AlignTop2& c = cpu[size_t(i)];
        const AlignTop2& g = gpu[size_t(i)];
        const double tol = 2.0 * gamma * norm(A.data() + i * K) * b_max;
        EXPECT_NEAR(c.best_score, g.best_score, tol) << "row " << i;
        if (duplicate_columns) {
            // Ties go to the lower column on both: best is even, second is best + 1.
            EXPECT_EQ(c.best, g.best) << "row " << i;
            EXPECT_EQ(g.second, g.best + 1) << "row " << i;
            ++checked;
            continue;
        }
        if (c.best_score - c.second_score > 2 * tol) {
            EXPECT_EQ(c.best, g.best) << "row " << i;
            ++checked;
        }
    }
    EXPECT_GT(checked, M / 2);
}

TEST(AlignTop2Cuda, MatchesCpuAcrossTiles) {
    if (!align_top2_cuda_available()) GTEST_SKIP() << "no GPU";
    CudaState state(0);
    const Context ctx = state.context();
    compare(ctx, 1000, 3001, 300, 128, 512, 1,
            false);                                  // several row and column tiles, ragged edges
    compare(ctx, 77, 5, 16, 4096, 8192, 2, false);   // one tile bigger than the problem
    compare(ctx, 513, 2000, 64, 100, 300, 3, true);  // exact ties across tile boundaries
}

TEST(AlignTop2Cuda, LargeVocabularyShape) {
    if (!align_top2_cuda_available()) GTEST_SKIP() << "no GPU";
    CudaState state(0);
    const Context ctx = state.context();
    // A slice of a 152k x 50k alignment with the default tiles.
    compare(ctx, 20000, 50304, 300, 16384, 8192, 4, false);
}

TEST(AlignTop2Cuda, SingleColumnHasNoSecond) {
    if (!align_top2_cuda_available()) GTEST_SKIP() << "no GPU";
    CudaState state(0);
    const Context ctx = state.context();
    std::vector<float> A = {1, 2, 3, 4}, B = {1, 1};
    std::vector<AlignTop2> out(2);
    ASSERT_TRUE(align_top2_cuda(ctx, out, A.data(), 2, B.data(), 1, 2).ok());
    EXPECT_EQ(out[0].best, 0);
    EXPECT_EQ(out[0].second, -1);
    EXPECT_FLOAT_EQ(out[1].best_score, 7.0f);
    EXPECT_TRUE(std::isinf(out[1].second_score));
}

TEST(AlignTop2Cuda, ShortDeviceMemoryIsAnError) {
    if (!align_top2_cuda_available()) GTEST_SKIP() << "no GPU";
    CudaState state(0);
    const Context ctx = state.context();
    // One 200000 x 200000 f32 score tile is 160 GB: more than any GPU holds; the call says so
    // instead of stopping, and leaves the state usable.
    const int64_t n = 200000;
    std::vector<float> A(static_cast<size_t>(n), 1.0f), B(static_cast<size_t>(n), 1.0f);
    std::vector<AlignTop2> out(static_cast<size_t>(n));
    const Status s = align_top2_cuda(ctx, out, A.data(), n, B.data(), n, 1, n, n);
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(s.message().find("cannot allocate"), std::string::npos) << s.message();
    std::vector<float> a = {1, 2, 3, 4}, b = {1, 1};
    std::vector<AlignTop2> small(2);
    ASSERT_TRUE(align_top2_cuda(ctx, small, a.data(), 2, b.data(), 1, 2).ok());
    EXPECT_FLOAT_EQ(small[1].best_score, 7.0f);
}

}  // namespace
}  // namespace lathe
