// clang-format off
#include "ops/cuda/nvcc_compat.h"  // first: before any header that includes fmt
// clang-format on

#include <gtest/gtest.h>

#include "ops/cuda/cuda_test_util.h"
#include "ops/embedding.h"

namespace lathe {
namespace {

using namespace cudatest;

struct EmbeddingCase {
    int64_t B, T, C, V, P;
    bool wpe;        // learned positions (GPT-2)
    bool positions;  // explicit positions or 0..T-1
    int64_t distinct;  // tokens drawn from this many ids, so most repeat
};

void check_embedding(const EmbeddingCase& c, uint64_t seed) {
    SCOPED_TRACE(::testing::Message() << "B=" << c.B << " T=" << c.T << " C=" << c.C
                                      << " V=" << c.V << " wpe=" << c.wpe
                                      << " positions=" << c.positions);
    CudaState state(0);
    const Context gpu = state.context(), cpu = cpu_context();
    optest::Rng rng(seed);
    HostTensor tokens(DType::kI32, {c.B, c.T}), pos(DType::kI32, {c.B, c.T});
    for (int64_t i = 0; i < tokens.numel(); ++i) {
        // A few ids spread over the whole table (first and last chunk included).
        const int64_t k = rng.integer(0, c.distinct - 1);
        tokens.as<int32_t>()[i] = int32_t(k == 0 ? c.V - 1 : (k * 7919) % c.V);
        pos.as<int32_t>()[i] = int32_t(rng.integer(0, c.P - 1));
    }
    const HostTensor wte = random_bf16_values(rng, {c.V, c.C});
    const HostTensor wpe = random_bf16_values(rng, {c.P, c.C});
    const HostTensor dout = random_bf16_values(rng, {c.B, c.T, c.C});
    const HostTensor dwte0 = optest::random_tensor(rng, {c.V, c.C});
    const HostTensor dwpe0 = optest::random_tensor(rng, {c.P, c.C});
    const ConstTensorView pos_view = c.positions ? pos.view() : ConstTensorView();
    const ConstTensorView wpe_view = c.wpe ? wpe.view() : ConstTensorView();

    HostTensor out_ref(DType::kF32, {c.B, c.T, c.C});
    embedding_forward(out_ref.view(), tokens.view(), pos_view, wte.view(), wpe_view, cpu);
    HostTensor dwte_ref = optest::copy_tensor(dwte0.view());
    HostTensor dwpe_ref = optest::copy_tensor(dwpe0.view());
    embedding_backward(dwte_ref.view(), c.wpe ? dwpe_ref.view() : TensorView(), dout.view(),
                       tokens.view(), pos_view, cpu);

    DeviceTensor gtok = upload(tokens, DType::kI32, state), gpos = upload(pos, DType::kI32, state);
    DeviceTensor gwte = upload(wte, DType::kBF16, state), gwpe = upload(wpe, DType::kBF16, state);
    DeviceTensor gdout = upload(dout, DType::kBF16, state);
    const ConstTensorView gpos_view = c.positions ? ConstTensorView(gpos.view) : ConstTensorView();
    DeviceTensor out = device_tensor(DType::kBF16, {c.B, c.T, c.C}, state);
    embedding_forward(out.view, gtok.view, gpos_view, gwte.view,
                      c.wpe ? ConstTensorView(gwpe.view) : ConstTensorView(), gpu);
    const HostTensor out_gpu = download_f32(out.view, state);
    if (c.wpe)
        EXPECT_TRUE(matches(out_gpu, out_ref, kBf16Rounded));
    else
        EXPECT_TRUE(bitwise_equal(out_gpu, out_ref));  // a plain copy of bf16 rows

    DeviceTensor dwte = upload(dwte0, DType::kF32, state), dwpe = upload(dwpe0, DType::kF32, state);
    embedding_backward(dwte.view, c.wpe ? dwpe.view : TensorView(), gdout.view, gtok.view,
                       gpos_view, gpu);
    // The same fp32 additions in the same row order as the CPU twin: equal bits.
    EXPECT_TRUE(bitwise_equal(download_f32(dwte.view, state), dwte_ref));
    if (c.wpe) EXPECT_TRUE(bitwise_equal(download_f32(dwpe.view, state), dwpe_ref));
    else EXPECT_TRUE(bitwise_equal(download_f32(dwpe.view, state), dwpe0));  // untouched
}

TEST(CudaEmbedding, MatchesCpuTokensOnly) {
    check_embedding({4, 64, 96, 1000, 64, false, false, 40}, 51);
}

TEST(CudaEmbedding, MatchesCpuWithLearnedPositions) {
    check_embedding({4, 64, 96, 1000, 64, true, false, 40}, 52);
}

TEST(CudaEmbedding, MatchesCpuWithExplicitPositionsWideRows) {
    // C = 1500: two column slices per table chunk, the scalar path (C % 8 != 0) forward.
    check_embedding({2, 50, 1500, 300, 80, true, true, 7}, 53);
}

TEST(CudaEmbedding, MatchesCpuOneTokenEverywhere) {
    check_embedding({3, 200, 64, 500, 200, false, false, 1}, 54);  // every row hits one table row
}

}  // namespace
}  // namespace lathe
