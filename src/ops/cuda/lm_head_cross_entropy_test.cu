// clang-format off
#include "ops/cuda/nvcc_compat.h"  // first: before any header that includes fmt
// clang-format on

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "ops/cpu/fp8_cast.h"
#include "ops/cuda/cuda_test_util.h"
#include "ops/cuda/vocab_parallel.h"
#include "ops/fp8_cast.h"
#include "ops/linear.h"
#include "ops/lm_head_cross_entropy.h"
#include "ops/vocab_parallel.h"

namespace lathe {
namespace {

using namespace cudatest;

struct LmHeadCase {
    int64_t N, C, V, Nc;
    double ignored;  // fraction of targets that are -100
};

// What the CUDA op computes, in fp64 from the logits it actually sees: x . W^T rounded once to
// bf16 (cuBLASLt's fp32 accumulator rounded to the bf16 chunk). Also, per row, the largest
// |logit| and |target logit| of the fp32 logits, for the bounds against the fp32 CPU twin.
struct Bf16LogitsReference {
    HostTensor lse, losses, dx, dw;  // f32
    double loss = 0;
    std::vector<double> max_abs, target_abs;
};

Bf16LogitsReference bf16_logits_reference(const HostTensor& x, const HostTensor& w,
                                          const HostTensor& targets, const HostTensor& dw0,
                                          float dloss, int64_t N, int64_t C, int64_t V) {
    Bf16LogitsReference r{HostTensor(DType::kF32, {N}),
                          HostTensor(DType::kF32, {N}),
                          HostTensor(DType::kF32, {N, C}),
                          optest::copy_tensor(dw0.view()),
                          0.0,
                          std::vector<double>(size_t(N)),
                          std::vector<double>(size_t(N))};
    const float* xs = x.as<float>();
    const float* ws = w.as<float>();
    const int32_t* t = targets.as<int32_t>();
    int64_t count = 0;
    for (int64_t n = 0; n < N; ++n) count += t[n] != kIgnoreIndex;
    const double scale = count == 0 ? 0.0 : double(dloss) / double(count);
    std::vector<double> l(static_cast<size_t>(V)), dlog(static_cast<size_t>(N * V));
    double loss_sum = 0;
    for (int64_t n = 0; n < N; ++n) {
        double m = -INFINITY, max_abs = 0;
        for (int64_t v = 0; v < V; ++v) {
            double d = 0;
            for (int64_t c = 0; c < C; ++c) d += double(xs[n * C + c]) * double(ws[v * C + c]);
            max_abs = std::max(max_abs, std::fabs(d));
            l[size_t(v)] = bf16_to_float(float_to_bf16(float(d)));
            m = std::max(m, l[size_t(v)]);
        }
        double s = 0;
        for (int64_t v = 0; v < V; ++v) s += std::exp(l[size_t(v)] - m);
        const double lse = m + std::log(s);
        const bool ignored = t[n] == kIgnoreIndex;
        const double loss = ignored ? 0.0 : lse - l[size_t(t[n])];
        r.lse.as<float>()[n] = float(lse);
        r.losses.as<float>()[n] = float(loss);
        loss_sum += loss;
        r.max_abs[size_t(n)] = max_abs;
        if (!ignored) {
            double d = 0;
            for (int64_t c = 0; c < C; ++c) d += double(xs[n * C + c]) * double(ws[t[n] * C + c]);
            r.target_abs[size_t(n)] = std::fabs(d);
        }
        for (int64_t v = 0; v < V; ++v)
            dlog[size_t(n * V + v)] =
                ignored ? 0.0 : scale * (std::exp(l[size_t(v)] - lse) - (v == t[n] ? 1.0 : 0.0));
    }
    r.loss = count == 0 ? 0.0 : loss_sum / double(count);
    for (int64_t n = 0; n < N; ++n)
        for (int64_t c = 0; c < C; ++c) {
            double d = 0;
            for (int64_t v = 0; v < V; ++v) d += dlog[size_t(n * V + v)] * double(ws[v * C + c]);
            r.dx.as<float>()[n * C + c] = float(d);
        }
    float* dw = r.dw.as<float>();
    for (int64_t v = 0; v < V; ++v)
        for (int64_t c = 0; c < C; ++c) {
            double d = 0;
            for (int64_t n = 0; n < N; ++n) d += dlog[size_t(n * V + v)] * double(xs[n * C + c]);
            dw[v * C + c] = float(double(dw[v * C + c]) + d);
        }
    return r;
}

// The per-row lse or losses against the fp32 CPU twin: bf16 logits move each logit by at most
// u|l|, so lse by at most u max_v|l_v| (1-Lipschitz in the max norm) and a loss by at most
// u (max_v|l_v| + |l_target|); 1e-5 relative on top for fp32 arithmetic.
::testing::AssertionResult within_bf16_logit_bound(const HostTensor& got, const HostTensor& twin,
                                                   const Bf16LogitsReference& r, bool loss) {
    for (int64_t n = 0; n < got.numel(); ++n) {
        const double g = got.as<float>()[n], t = twin.as<float>()[n];
        const double bound =
            kBf16Unit * (r.max_abs[size_t(n)] + (loss ? r.target_abs[size_t(n)] : 0)) +
            1e-5 * (1 + std::fabs(t));
        if (!(std::fabs(g - t) <= bound))
            return ::testing::AssertionFailure()
                   << "row " << n << ": got " << g << ", CPU twin " << t << ", bound " << bound;
    }
    return ::testing::AssertionSuccess();
}

// The per-row lse or losses against the fp64 reference from the same bf16 logits: fp32 accuracy
// (2e-5 relative), except on the rare row where cuBLASLt's fp32 sum and the fp64 one round a
// logit to neighbouring bf16 values (one ulp, 2u|l|): at most 2% of rows (at least one) may
// differ by up to that much (the target's ulp plus the largest logit's), none by more. A kernel
// that drops or double-counts part of a row moves nearly every row far beyond 2e-5.
::testing::AssertionResult close_to_bf16_reference(const HostTensor& got, const HostTensor& ref,
                                                   const Bf16LogitsReference& r) {
    int64_t loose = 0;
    for (int64_t n = 0; n < got.numel(); ++n) {
        const double g = got.as<float>()[n], f = ref.as<float>()[n];
        const double d = std::fabs(g - f), tight = 2e-5 * (1 + std::fabs(f));
        if (d <= tight) continue;
        ++loose;
        const double one_ulp = 2 * kBf16Unit * (r.target_abs[size_t(n)] + r.max_abs[size_t(n)]);
        if (!(d <= tight + one_ulp))
            return ::testing::AssertionFailure()
                   << "row " << n << ": got " << g << ", bf16-logit reference " << f;
    }
    if (loose > std::max<int64_t>(1, got.numel() / 50))
        return ::testing::AssertionFailure()
               << loose << " of " << got.numel() << " rows beyond 2e-5 relative";
    return ::testing::AssertionSuccess() << loose << " rows with a logit rounded the other way";
}

// A case's random inputs from `seed`: targets (a fraction c.ignored of them -100), x and the
// weight rounded to bf16, and the weight gradient the backward adds to; rng draws whatever else
// the check needs.
struct LmHeadInputs {
    optest::Rng rng;
    HostTensor targets, x, w, dw0;
    float dloss = 0.7f;
};

LmHeadInputs lm_head_inputs(const LmHeadCase& c, uint64_t seed) {
    optest::Rng rng(seed);
    HostTensor targets(DType::kI32, {c.N});
    for (int64_t n = 0; n < c.N; ++n)
        targets.as<int32_t>()[n] =
            rng.uniform(0.0f, 1.0f) < c.ignored ? kIgnoreIndex : int32_t(rng.integer(0, c.V - 1));
    HostTensor x = random_bf16_values(rng, {c.N, c.C});
    HostTensor w = random_bf16_values(rng, {c.V, c.C}, -0.5f, 0.5f);
    HostTensor dw0 = optest::random_tensor(rng, {c.V, c.C}, -0.01f, 0.01f);
    return {rng, std::move(targets), std::move(x), std::move(w), std::move(dw0)};
}

void check_lm_head(const LmHeadCase& c, uint64_t seed) {
    SCOPED_TRACE(::testing::Message() << "N=" << c.N << " C=" << c.C << " V=" << c.V
                                      << " Nc=" << c.Nc << " ignored=" << c.ignored);
    CudaState state(0);
    const Context gpu = state.context(), cpu = cpu_context();
    LmHeadInputs in = lm_head_inputs(c, seed);
    const HostTensor &targets = in.targets, &x = in.x, &w = in.w, &dw0 = in.dw0;
    const float dloss = in.dloss;

    // The fp32 CPU twin (loss and lse bounds) and the fp64 reference from bf16 logits.
    HostTensor scratch(DType::kF32, {c.Nc, c.V});
    HostTensor loss_ref(DType::kF32, {1}), losses_ref(DType::kF32, {c.N}),
        lse_ref(DType::kF32, {c.N});
    lm_head_cross_entropy_forward(loss_ref.view(), losses_ref.view(), lse_ref.view(), x.view(),
                                  targets.view(), w.view(), scratch.view(), cpu);
    const Bf16LogitsReference ref = bf16_logits_reference(x, w, targets, dw0, dloss, c.N, c.C, c.V);

    DeviceTensor gx = upload(x, DType::kBF16, state), gw = upload(w, DType::kBF16, state);
    DeviceTensor gt = upload(targets, DType::kI32, state);
    DeviceTensor gscratch = device_tensor(DType::kF32, {c.Nc, c.V}, state);
    DeviceTensor loss = device_tensor(DType::kF32, {1}, state);
    DeviceTensor losses = device_tensor(DType::kF32, {c.N}, state);
    DeviceTensor lse = device_tensor(DType::kF32, {c.N}, state);
    lm_head_cross_entropy_forward(loss.view, losses.view, lse.view, gx.view, gt.view, gw.view,
                                  gscratch.view, gpu);
    const HostTensor losses_gpu = download_f32(losses.view, state);
    const HostTensor lse_gpu = download_f32(lse.view, state);
    const double loss_gpu = download_f32(loss.view, state).as<float>()[0];
    EXPECT_TRUE(within_bf16_logit_bound(losses_gpu, losses_ref, ref, true));
    EXPECT_TRUE(within_bf16_logit_bound(lse_gpu, lse_ref, ref, false));
    EXPECT_TRUE(close_to_bf16_reference(losses_gpu, ref.losses, ref));
    EXPECT_TRUE(close_to_bf16_reference(lse_gpu, ref.lse, ref));
    {
        // The mean: the mean of the per-row bounds against the twin; against the bf16-logit
        // reference fp32 accuracy plus at most 2% of rows off by their one-ulp allowance. fp32
        // accuracy of a mean of N <= 70 row losses summed in different orders: a random walk of
        // sqrt(N) 2^-24 ~ 5e-7 of the loss, the worst case N 2^-24 ~ 4e-6; 1e-5 (twin) and 2e-5
        // (the fp64 reference, one more fp32 rounding per row) relative, in the 1 + |loss| form
        // for losses near zero.
        double twin_bound = 0, ulp_max = 0;
        int64_t count = 0;
        for (int64_t n = 0; n < c.N; ++n) {
            if (targets.as<int32_t>()[n] == kIgnoreIndex) continue;
            ++count;
            twin_bound += kBf16Unit * (ref.max_abs[size_t(n)] + ref.target_abs[size_t(n)]);
            ulp_max = std::max(
                ulp_max, 2 * kBf16Unit * (ref.max_abs[size_t(n)] + ref.target_abs[size_t(n)]));
        }
        if (count > 0) twin_bound /= double(count);
        const double twin = loss_ref.as<float>()[0];
        EXPECT_LE(std::fabs(loss_gpu - twin), twin_bound + 1e-5 * (1 + std::fabs(twin)));
        EXPECT_LE(std::fabs(loss_gpu - ref.loss),
                  2e-5 * (1 + std::fabs(ref.loss)) +
                      (count > 0 ? double(std::max<int64_t>(1, c.N / 50)) * ulp_max / double(count)
                                 : 0.0));
    }

    // Without per-row losses (the op keeps its own).
    DeviceTensor loss2 = device_tensor(DType::kF32, {1}, state);
    lm_head_cross_entropy_forward(loss2.view, TensorView(), lse.view, gx.view, gt.view, gw.view,
                                  gscratch.view, gpu);
    EXPECT_TRUE(bitwise_equal(download_raw(loss2.view, state), download_raw(loss.view, state)));

    // Gradients against the reference computed from the same bf16 logits: the bf16
    // dlogits (one rounding) feeding an fp32-accumulated GEMM.
    DeviceTensor dx = device_tensor(DType::kBF16, {c.N, c.C}, state);
    DeviceTensor dw = upload(dw0, DType::kF32, state);
    lm_head_cross_entropy_backward(dx.view, dw.view, gx.view, gt.view, gw.view, lse.view, dloss,
                                   gscratch.view, gpu);
    const HostTensor dx_gpu = download_f32(dx.view, state), dw_gpu = download_f32(dw.view, state);
    EXPECT_TRUE(matches(dx_gpu, ref.dx, kBf16Derived));
    EXPECT_TRUE(matches(dw_gpu, ref.dw, kBf16Derived));

    // Forward and backward in one pass (the row held on chip, or streamed twice for huge V): the
    // same loss bits (the same max/sum order is not required, so compare with the bounds), and
    // the same gradients up to the softmax being formed from the fresh sum.
    DeviceTensor loss3 = device_tensor(DType::kF32, {1}, state);
    DeviceTensor losses3 = device_tensor(DType::kF32, {c.N}, state);
    DeviceTensor dx3 = device_tensor(DType::kBF16, {c.N, c.C}, state);
    DeviceTensor dw3 = upload(dw0, DType::kF32, state);
    lm_head_cross_entropy_forward_backward(loss3.view, losses3.view, dx3.view, dw3.view, gx.view,
                                           gt.view, gw.view, dloss, gscratch.view, gpu);
    const HostTensor losses3_gpu = download_f32(losses3.view, state);
    EXPECT_TRUE(within_bf16_logit_bound(losses3_gpu, losses_ref, ref, true));
    EXPECT_TRUE(close_to_bf16_reference(losses3_gpu, ref.losses, ref));
    // The two kernels sum the row in different orders (online vs max first): fp32 rounding only.
    EXPECT_TRUE(matches(losses3_gpu, losses_gpu, kF32Sum));
    EXPECT_TRUE(matches(download_f32(loss3.view, state), download_f32(loss.view, state), kF32Sum));
    EXPECT_TRUE(matches(download_f32(dx3.view, state), ref.dx, kBf16Derived));
    EXPECT_TRUE(matches(download_f32(dw3.view, state), ref.dw, kBf16Derived));

    // Determinism, both paths.
    DeviceTensor dx4 = device_tensor(DType::kBF16, {c.N, c.C}, state);
    DeviceTensor dw4 = upload(dw0, DType::kF32, state);
    lm_head_cross_entropy_backward(dx4.view, dw4.view, gx.view, gt.view, gw.view, lse.view, dloss,
                                   gscratch.view, gpu);
    EXPECT_TRUE(bitwise_equal(download_raw(dx4.view, state), download_raw(dx.view, state)));
    EXPECT_TRUE(bitwise_equal(download_raw(dw4.view, state), download_raw(dw.view, state)));
    DeviceTensor loss5 = device_tensor(DType::kF32, {1}, state);
    DeviceTensor losses5 = device_tensor(DType::kF32, {c.N}, state);
    DeviceTensor dx5 = device_tensor(DType::kBF16, {c.N, c.C}, state);
    DeviceTensor dw5 = upload(dw0, DType::kF32, state);
    lm_head_cross_entropy_forward_backward(loss5.view, losses5.view, dx5.view, dw5.view, gx.view,
                                           gt.view, gw.view, dloss, gscratch.view, gpu);
    EXPECT_TRUE(
        bitwise_equal(download_raw(losses5.view, state), download_raw(losses3.view, state)));
    EXPECT_TRUE(bitwise_equal(download_raw(dx5.view, state), download_raw(dx3.view, state)));
    EXPECT_TRUE(bitwise_equal(download_raw(dw5.view, state), download_raw(dw3.view, state)));

    // dweight_mode kOverwrite (ops/linear.h): the first chunk's GEMM writes dweight (beta 0; it
    // holds NaN before), the others add; both paths against the reference from a zero dweight.
    LinearSpec over;
    over.dweight_mode = GradMode::kOverwrite;
    HostTensor zeros(DType::kF32, {c.V, c.C});
    std::fill_n(zeros.as<float>(), c.V * c.C, 0.0f);
    const Bf16LogitsReference ref0 =
        bf16_logits_reference(x, w, targets, zeros, dloss, c.N, c.C, c.V);
    DeviceTensor dw6 = device_tensor(DType::kF32, {c.V, c.C}, state);
    lm_head_cross_entropy_backward(dx4.view, dw6.view, gx.view, gt.view, gw.view, lse.view, dloss,
                                   gscratch.view, gpu, over);
    EXPECT_TRUE(matches(download_f32(dw6.view, state), ref0.dw, kBf16Derived)) << "backward, =";
    DeviceTensor dw7 = device_tensor(DType::kF32, {c.V, c.C}, state);
    lm_head_cross_entropy_forward_backward(loss5.view, losses5.view, dx5.view, dw7.view, gx.view,
                                           gt.view, gw.view, dloss, gscratch.view, gpu, over);
    EXPECT_TRUE(matches(download_f32(dw7.view, state), ref0.dw, kBf16Derived))
        << "forward_backward, =";
}

// The f32 scratch (Nc, V) holds 2 Nc bf16 rows (V % 8 == 0) or floor(2 Nc V / round_up(V, 8)).
TEST(CudaLmHeadCrossEntropy, MatchesCpuInUnevenChunks) {
    check_lm_head({70, 64, 1000, 16, 0.2}, 61);  // chunks of 32, 32, 6 bf16 rows
}

TEST(CudaLmHeadCrossEntropy, MatchesCpuOneChunk) {
    check_lm_head({48, 128, 4096, 32, 0.0}, 62);
}

TEST(CudaLmHeadCrossEntropy, MatchesCpuOddVocabulary) {
    // Rows padded to 1000 elements; the last vector of each row has one padding element.
    check_lm_head({40, 64, 999, 8, 0.1}, 63);
}

TEST(CudaLmHeadCrossEntropy, MatchesCpuRowSpillsToSharedMemory) {
    // 5000 vectors a row: 4096 in registers of the 512-thread kernel, the rest in shared memory.
    check_lm_head({12, 32, 40000, 3, 0.1}, 65);
}

TEST(CudaLmHeadCrossEntropy, MatchesCpuRowTooLongToHold) {
    // The Llama-3 vocabulary: 16032 vectors a row, more than 48 KiB would spill at 512 threads,
    // so the streaming kernel reads the row twice; and a longer row still.
    check_lm_head({5, 16, 128256, 2, 0.2}, 66);
    check_lm_head({4, 16, 200000, 1, 0.0}, 67);
}

TEST(CudaLmHeadCrossEntropy, MatchesCpuTinyVocabularyScalarPath) {
    // V = 3, Nc = 1: 12 bytes cannot hold a padded row of 8, so ld = V and scalar accesses.
    check_lm_head({9, 16, 3, 1, 0.2}, 68);
}

// Vocabulary-parallel cross-entropy (ops/vocab_parallel.h) over S shards on one GPU: each
// shard's forward with its LmHeadVocabShard, the combination's kernels with the group's max and
// sum done on the host between them (what the collectives compute), then each shard's backward
// from the combined lse. Against the fp64 reference from the bf16 logits of the whole head, with
// the whole head's bounds: the loss and every row's lse and loss (close_to_bf16_reference),
// each shard's dweight rows and the sum of the shards' dx (the model's all-reduce) within
// kBf16Derived, as the whole head's are. The shards' GEMMs may round a logit the other way
// than the whole head's, which those bounds allow. The combination adds f32 roundings of lse's
// size (2^-24 relative), under the 2e-5 of close_to_bf16_reference.
void check_vocab_parallel(const LmHeadCase& c, int64_t S, uint64_t seed) {
    SCOPED_TRACE(::testing::Message()
                 << "N=" << c.N << " C=" << c.C << " V=" << c.V << " shards=" << S);
    ASSERT_EQ(c.V % S, 0);
    CudaState state(0);
    const Context gpu = state.context(), cpu = cpu_context();
    LmHeadInputs in = lm_head_inputs(c, seed);
    const HostTensor &targets = in.targets, &x = in.x, &w = in.w, &dw0 = in.dw0;
    const float dloss = in.dloss;
    optest::Rng& rng = in.rng;
    const Bf16LogitsReference ref = bf16_logits_reference(x, w, targets, dw0, dloss, c.N, c.C, c.V);
    const int64_t Vs = c.V / S, N = c.N;

    DeviceTensor gx = upload(x, DType::kBF16, state), gt = upload(targets, DType::kI32, state);
    DeviceTensor gscratch = device_tensor(DType::kF32, {c.Nc, Vs}, state);
    std::vector<DeviceTensor> gw, gdw, loss, losses, lse, work, dx;
    for (int64_t s = 0; s < S; ++s) {
        HostTensor ws(DType::kF32, {Vs, c.C}), dws(DType::kF32, {Vs, c.C});
        std::copy(w.as<float>() + s * Vs * c.C, w.as<float>() + (s + 1) * Vs * c.C, ws.as<float>());
        std::copy(dw0.as<float>() + s * Vs * c.C, dw0.as<float>() + (s + 1) * Vs * c.C,
                  dws.as<float>());
        gw.push_back(upload(ws, DType::kBF16, state));
        gdw.push_back(upload(dws, DType::kF32, state));
        loss.push_back(device_tensor(DType::kF32, {1}, state));
        losses.push_back(device_tensor(DType::kF32, {N}, state));
        lse.push_back(device_tensor(DType::kF32, {N}, state));
        work.push_back(device_tensor(DType::kF32, {3, N}, state));
        dx.push_back(device_tensor(DType::kBF16, {N, c.C}, state));
        lm_head_cross_entropy_forward(loss[size_t(s)].view, losses[size_t(s)].view,
                                      lse[size_t(s)].view, gx.view, gt.view, gw[size_t(s)].view,
                                      gscratch.view, gpu, {}, LmHeadVocabShard{s * Vs, c.V});
        cuda::cross_entropy_vocab_parallel_prepare(
            work[size_t(s)].view.as<float>(), lse[size_t(s)].view.as<float>(),
            losses[size_t(s)].view.as<float>(), N, state.stream());
    }
    // The group's reduction of rows [r0, r1) of every shard's work: max or sum in shard order.
    auto reduce = [&](int64_t r0, int64_t r1, bool max) {
        std::vector<HostTensor> parts;
        for (int64_t s = 0; s < S; ++s)
            parts.push_back(download_f32(
                work[size_t(s)].view.reshape(Shape{3 * N}).slice(r0 * N, r1 * N), state));
        HostTensor out = optest::copy_tensor(parts[0].view());
        for (int64_t s = 1; s < S; ++s)
            for (int64_t i = 0; i < out.numel(); ++i)
                out.as<float>()[i] =
                    max ? std::max(out.as<float>()[i], parts[size_t(s)].as<float>()[i])
                        : out.as<float>()[i] + parts[size_t(s)].as<float>()[i];
        for (int64_t s = 0; s < S; ++s)
            cuda_copy_sync(work[size_t(s)].view.reshape(Shape{3 * N}).slice(r0 * N, r1 * N),
                           out.view(), state.stream());
    };
    reduce(0, 1, true);
    for (int64_t s = 0; s < S; ++s)
        cuda::cross_entropy_vocab_parallel_exp(work[size_t(s)].view.as<float>(),
                                               lse[size_t(s)].view.as<float>(), N, state.stream());
    reduce(1, 3, false);
    HostTensor dx_sum(DType::kF32, {N, c.C});
    for (int64_t s = 0; s < S; ++s) {
        cuda::cross_entropy_vocab_parallel_finish(
            loss[size_t(s)].view.as<float>(), losses[size_t(s)].view.as<float>(),
            lse[size_t(s)].view.as<float>(), gt.view.as<int32_t>(),
            work[size_t(s)].view.as<float>(), N, state.stream());
        const HostTensor lse_s = download_f32(lse[size_t(s)].view, state);
        const HostTensor losses_s = download_f32(losses[size_t(s)].view, state);
        EXPECT_TRUE(close_to_bf16_reference(lse_s, ref.lse, ref)) << "shard " << s;
        EXPECT_TRUE(close_to_bf16_reference(losses_s, ref.losses, ref)) << "shard " << s;
        // Every shard holds the same combined values.
        if (s > 0) {
            EXPECT_TRUE(bitwise_equal(download_raw(lse[size_t(s)].view, state),
                                      download_raw(lse[0].view, state)));
            EXPECT_TRUE(bitwise_equal(download_raw(loss[size_t(s)].view, state),
                                      download_raw(loss[0].view, state)));
        }
        lm_head_cross_entropy_backward(dx[size_t(s)].view, gdw[size_t(s)].view, gx.view, gt.view,
                                       gw[size_t(s)].view, lse[size_t(s)].view, dloss,
                                       gscratch.view, gpu, {}, LmHeadVocabShard{s * Vs, c.V});
        const HostTensor dx_s = download_f32(dx[size_t(s)].view, state);
        for (int64_t i = 0; i < dx_sum.numel(); ++i)
            dx_sum.as<float>()[i] = (s == 0 ? 0.0f : dx_sum.as<float>()[i]) + dx_s.as<float>()[i];
        HostTensor dw_want(DType::kF32, {Vs, c.C});
        std::copy(ref.dw.as<float>() + s * Vs * c.C, ref.dw.as<float>() + (s + 1) * Vs * c.C,
                  dw_want.as<float>());
        EXPECT_TRUE(matches(download_f32(gdw[size_t(s)].view, state), dw_want, kBf16Derived))
            << "shard " << s;
    }
    EXPECT_TRUE(matches(dx_sum, ref.dx, kBf16Derived));
    {
        // The mean, with check_lm_head's bound against the bf16-logit reference.
        double ulp_max = 0;
        int64_t count = 0;
        for (int64_t n = 0; n < N; ++n) {
            if (targets.as<int32_t>()[n] == kIgnoreIndex) continue;
            ++count;
            ulp_max = std::max(
                ulp_max, 2 * kBf16Unit * (ref.max_abs[size_t(n)] + ref.target_abs[size_t(n)]));
        }
        const double got = download_f32(loss[0].view, state).as<float>()[0];
        EXPECT_LE(
            std::fabs(got - ref.loss),
            2e-5 * (1 + std::fabs(ref.loss)) +
                (count > 0 ? double(std::max<int64_t>(1, N / 50)) * ulp_max / double(count) : 0.0));
    }

    // The embedding's helpers against their CPU twins: exact (integer and zero writes).
    HostTensor ids(DType::kI32, {N});
    for (int64_t n = 0; n < N; ++n) ids.as<int32_t>()[n] = int32_t(rng.integer(0, c.V - 1));
    const HostTensor rows = random_bf16_values(rng, {N, c.C});
    DeviceTensor gids = upload(ids, DType::kI32, state);
    for (int64_t s = 0; s < S; ++s) {
        HostTensor local_cpu(DType::kI32, {N}), rows_cpu = optest::copy_tensor(rows.view());
        vocab_shard_ids(local_cpu.view(), ids.view(), s * Vs, Vs, c.V, cpu);
        vocab_shard_zero_rows(rows_cpu.view(), ids.view(), s * Vs, Vs, cpu);
        DeviceTensor local = device_tensor(DType::kI32, {N}, state);
        DeviceTensor grows = upload(rows, DType::kBF16, state);
        vocab_shard_ids(local.view, gids.view, s * Vs, Vs, c.V, gpu);
        vocab_shard_zero_rows(grows.view, gids.view, s * Vs, Vs, gpu);
        EXPECT_TRUE(bitwise_equal(download_raw(local.view, state), local_cpu)) << "shard " << s;
        EXPECT_TRUE(matches(download_f32(grows.view, state), rows_cpu, kF32Sum)) << "shard " << s;
        int64_t zero_rows = 0;
        for (int64_t n = 0; n < N; ++n)
            zero_rows += local_cpu.as<int32_t>()[n] == 0 && ids.as<int32_t>()[n] != s * Vs;
        EXPECT_GT(zero_rows, 0) << "shard " << s << ": every id in the shard; nothing cleared";
    }
}

TEST(CudaLmHeadCrossEntropy, VocabularyParallelTwoShards) {
    check_vocab_parallel({70, 64, 1000, 16, 0.2}, 2, 71);  // uneven chunks, ignored rows
}

TEST(CudaLmHeadCrossEntropy, VocabularyParallelFourShardsWideRows) {
    // Llama-3's vocabulary over 4: 32064-column shards through the streaming row kernel.
    check_vocab_parallel({6, 16, 128256, 2, 0.2}, 4, 72);
}

TEST(CudaLmHeadCrossEntropy, AllTargetsIgnored) {
    CudaState state(0);
    const Context gpu = state.context();
    optest::Rng rng(64);
    const int64_t N = 8, C = 16, V = 64;
    HostTensor targets(DType::kI32, {N});
    for (int64_t n = 0; n < N; ++n) targets.as<int32_t>()[n] = kIgnoreIndex;
    DeviceTensor gx = upload(random_bf16_values(rng, {N, C}), DType::kBF16, state);
    DeviceTensor gw = upload(random_bf16_values(rng, {V, C}), DType::kBF16, state);
    DeviceTensor gt = upload(targets, DType::kI32, state);
    DeviceTensor scratch = device_tensor(DType::kF32, {4, V}, state);
    DeviceTensor loss = device_tensor(DType::kF32, {1}, state);
    DeviceTensor dx = device_tensor(DType::kBF16, {N, C}, state);
    const HostTensor dw0 = optest::random_tensor(rng, {V, C});
    DeviceTensor dw = upload(dw0, DType::kF32, state);
    lm_head_cross_entropy_forward_backward(loss.view, TensorView(), dx.view, dw.view, gx.view,
                                           gt.view, gw.view, 1.0f, scratch.view, gpu);
    EXPECT_EQ(download_f32(loss.view, state).as<float>()[0], 0.0f);
    const HostTensor dx_host = download_f32(dx.view, state);
    for (int64_t i = 0; i < dx_host.numel(); ++i) ASSERT_EQ(dx_host.as<float>()[i], 0.0f) << i;
    EXPECT_TRUE(bitwise_equal(download_f32(dw.view, state), dw0));
}

// ---- FP8 LM head (ops/cuda/lm_head_cross_entropy.h, "FP8") ----
//
// The reference is the scaled FP8 GEMM math on the codes the GPU made, in fp64: the weight's and
// x's codes are first checked bit for bit against the CPU's casts (ops/cpu/fp8_cast.h), and so
// are the last chunk's dlogits codes, cast on the CPU from the bf16 dlogits the GPU left in the
// chunk (which also checks the amax the row kernel computed as it wrote them). Earlier chunks'
// rows have every target ignored, so their dlogits are exactly 0 and the whole weight gradient is
// the last chunk's: the reference covers every GEMM of the op, including the last chunk's
// offset into x's transposed codes. Bounds, per element (docs/FP8.md's GEMM bound): products of
// two fp8 values are exact in fp32; two fp32 summation orders of K terms differ by at most
// 2 K 2^-24 S (S = sum_k |a_k b_k| sa sb); Hopper's FP8 MMA accumulates with about 14
// significant bits before cuBLASLt promotes to fp32 (the per-step model below); the output's
// rounding: 2^-8 of the value for bf16, 2^-24 for f32 (twice where a C is added).
double fp8_value(uint8_t code, DType t) {
    return t == DType::kE4M3 ? e4m3_to_float(fp8_e4m3{code}) : e5m2_to_float(fp8_e5m2{code});
}

// sa sb sum_k a[i, k] b[j, k] over codes (rows of K with strides lda, ldb), its S and bound.
struct ScaledDot {
    double value, bound;
};
//
// The MMA's part is the per-step model of docs/FP8.md ("Why the blockwise bound differs", and
// fp8_blockwise_mma_error_bound): per 128-wide K block, 32 products a step join the running sum in
// the tensor core's e8m13 accumulator, all 33 terms aligned to the largest of them on a grid of
// 2^-13 of its power of two (each term off the grid loses less than one unit) and the step's
// result kept to 14 bits (2^-13 of |running sum| + the step's |products|); the block's sum is
// then promoted to fp32. A single 2^-13 S is not a bound for the head's gradients: a row of
// dlogits holds one term near -dloss/count (the target's p - 1) among V - 1 of about 1/V of it, so
// within a step the small products fall off the grid of the large one (measured on an H100: dx
// and dW errors up to 1.03x of 2^-13 S plus the fp32 and rounding terms).
ScaledDot scaled_dot(const uint8_t* a, DType at, int64_t sa_stride, const uint8_t* b, DType bt,
                     int64_t sb_stride, int64_t K, double sa, double sb, double out_unit) {
    constexpr int64_t kBlock = 128, kStep = 32;
    double v = 0, S = 0, mma = 0;
    for (int64_t k0 = 0; k0 < K; k0 += kBlock) {
        const int64_t k1 = std::min(K, k0 + kBlock);
        double run = 0, err = 0;  // the block's exact running sum and its error bound so far
        for (int64_t s0 = k0; s0 < k1; s0 += kStep) {
            double largest = std::fabs(run) + err, step_abs = 0, step_sum = 0;
            int terms = 1;  // the running sum
            for (int64_t k = s0; k < std::min(k1, s0 + kStep); ++k) {
                const double p = fp8_value(a[k * sa_stride], at) * fp8_value(b[k * sb_stride], bt);
                largest = std::max(largest, std::fabs(p));
                step_abs += std::fabs(p);
                step_sum += p;
                ++terms;
            }
            const double grid = largest > 0 ? std::ldexp(1.0, std::ilogb(largest) - 13) : 0.0;
            err += double(terms) * grid + 0x1p-13 * (std::fabs(run) + err + step_abs);
            run += step_sum;
        }
        v += run;
        mma += err;
        for (int64_t k = k0; k < k1; ++k)
            S += std::fabs(fp8_value(a[k * sa_stride], at) * fp8_value(b[k * sb_stride], bt));
    }
    v *= sa * sb;
    S *= sa * sb;
    mma *= std::fabs(sa * sb);
    return {v, 2.0 * double(K) * 0x1p-24 * S + mma + out_unit * std::fabs(v)};
}

void check_fp8_head(int64_t N, int64_t C, int64_t V, int64_t Nc, bool delayed, DType grad_dtype,
                    uint64_t seed) {
    SCOPED_TRACE(::testing::Message() << "N=" << N << " C=" << C << " V=" << V << " Nc=" << Nc
                                      << " delayed=" << delayed);
    CudaState state(0);
    const Context gpu = state.context();
    optest::Rng rng(seed);
    const int64_t rows = Nc / 16 * 16, last = (N - 1) / rows * rows;  // the last chunk's first row
    HostTensor targets(DType::kI32, {N});
    for (int64_t n = 0; n < N; ++n)
        targets.as<int32_t>()[n] = n < last ? kIgnoreIndex : int32_t(rng.integer(0, V - 1));
    const HostTensor x = random_bf16_values(rng, {N, C}, -2.0f, 2.0f);
    const HostTensor w = random_bf16_values(rng, {V, C}, -0.5f, 0.5f);
    const HostTensor dw0 = optest::random_tensor(rng, {V, C}, -0.01f, 0.01f);
    const float dloss = 0.7f;

    DeviceTensor gx = upload(x, DType::kBF16, state), gw = upload(w, DType::kBF16, state);
    DeviceTensor gt = upload(targets, DType::kI32, state);
    DeviceTensor scratch = device_tensor(DType::kF32, {Nc, V}, state);
    DeviceTensor wq = device_tensor(DType::kU8, {V, C}, state);
    DeviceTensor wqt = device_tensor(DType::kU8, {C, V}, state);
    DeviceTensor xq = device_tensor(DType::kU8, {N, C}, state);
    DeviceTensor xqt = device_tensor(DType::kU8, {C, N}, state);
    DeviceTensor scalars = device_tensor(DType::kF32, {24}, state);
    DeviceTensor scales = device_tensor(DType::kF32, {3}, state);
    DeviceTensor step_amax = device_tensor(DType::kF32, {3}, state);
    // Delayed: scales from amaxes a little above the tensors' own (as a history would give).
    const float delayed_scale[3] = {fp8_scale_from_amax(2.5f, DType::kE4M3),
                                    fp8_scale_from_amax(0.6f, DType::kE4M3),
                                    fp8_scale_from_amax(0.05f, grad_dtype)};
    HostTensor hs(DType::kF32, {3}), zero(DType::kF32, {3});
    for (int i = 0; i < 3; ++i) hs.as<float>()[i] = delayed_scale[i], zero.as<float>()[i] = 0;
    cuda_copy_sync(scales.view, hs.view(), state.stream());
    cuda_copy_sync(step_amax.view, zero.view(), state.stream());

    Fp8LinearBuffers b;
    b.wq = wq.view.data(), b.wqt = wqt.view.data(), b.xq = xq.view.data();
    b.xqt = xqt.view.data(), b.scalars = scalars.view.as<float>(), b.grad_dtype = grad_dtype;
    int64_t gemms = 0;
    b.gemm_count = &gemms;
    if (delayed)
        b.delayed_scale = scales.view.as<float>(), b.step_amax = step_amax.view.as<float>();
    const LinearSpec spec{LinearPrecision::kFp8PerTensor, "lm_head", &b};
    linear_fp8_cast_weight(gw.view, gpu, spec);

    DeviceTensor loss = device_tensor(DType::kF32, {1}, state);
    DeviceTensor losses = device_tensor(DType::kF32, {N}, state);
    DeviceTensor dx = device_tensor(DType::kBF16, {N, C}, state);
    DeviceTensor dw = upload(dw0, DType::kF32, state);
    lm_head_cross_entropy_forward_backward(loss.view, losses.view, dx.view, dw.view, gx.view,
                                           gt.view, gw.view, dloss, scratch.view, gpu, spec);
    EXPECT_EQ(gemms, 3);

    // The casts of x and w against the CPU's, bit for bit (codes, amax, scale_inv).
    const HostTensor sc = download_raw(scalars.view, state);
    auto cpu_cast = [&](const HostTensor& src, int64_t r, int64_t c, DType t, const float* scale,
                        HostTensor& q, HostTensor& qt, float* slot) {
        HostTensor b16(DType::kBF16, {r, c});
        tensor_convert(b16.view(), src.view());
        Fp8CastArgs a;
        a.rows = r, a.cols = c, a.x = b16.as<bf16>(), a.dtype = t, a.q = q.view().data();
        a.qt = qt.view().data(), a.scale = scale, a.amax = slot, a.scale_inv = slot + 1;
        cpu::fp8_cast(a);
    };
    HostTensor xq_ref(DType::kU8, {N, C}), xqt_ref(DType::kU8, {C, N});
    HostTensor wq_ref(DType::kU8, {V, C}), wqt_ref(DType::kU8, {C, V});
    float xs[2], ws[2];
    cpu_cast(x, N, C, DType::kE4M3, delayed ? &delayed_scale[0] : nullptr, xq_ref, xqt_ref, xs);
    cpu_cast(w, V, C, DType::kE4M3, delayed ? &delayed_scale[1] : nullptr, wq_ref, wqt_ref, ws);
    EXPECT_TRUE(bitwise_equal(download_raw(xq.view, state), xq_ref));
    EXPECT_TRUE(bitwise_equal(download_raw(xqt.view, state), xqt_ref));
    EXPECT_TRUE(bitwise_equal(download_raw(wq.view, state), wq_ref));
    EXPECT_TRUE(bitwise_equal(download_raw(wqt.view, state), wqt_ref));
    EXPECT_EQ(sc.as<float>()[0], xs[0]);
    EXPECT_EQ(sc.as<float>()[4], xs[1]);
    EXPECT_EQ(sc.as<float>()[8], ws[0]);
    EXPECT_EQ(sc.as<float>()[12], ws[1]);
    if (delayed) {
        const HostTensor sa = download_raw(step_amax.view, state);
        EXPECT_EQ(sa.as<float>()[0], xs[0]);
        EXPECT_EQ(sa.as<float>()[1], ws[0]);
    }

    // Logits from the codes (with their bounds) and each row's lse, in fp64.
    const auto* xqc = reinterpret_cast<const uint8_t*>(xq_ref.view().data());
    const auto* wqc = reinterpret_cast<const uint8_t*>(wq_ref.view().data());
    std::vector<ScaledDot> l(static_cast<size_t>(N * V));
    std::vector<double> lse_ref(static_cast<size_t>(N)), emax(static_cast<size_t>(N));
    for (int64_t n = 0; n < N; ++n) {
        double m = -INFINITY, e = 0;
        for (int64_t v = 0; v < V; ++v) {
            ScaledDot& d = l[size_t(n * V + v)];
            d = scaled_dot(xqc + n * C, DType::kE4M3, 1, wqc + v * C, DType::kE4M3, 1, C, xs[1],
                           ws[1], kBf16Unit);
            m = std::max(m, d.value);
            e = std::max(e, d.bound);
        }
        double sum = 0;
        for (int64_t v = 0; v < V; ++v) sum += std::exp(l[size_t(n * V + v)].value - m);
        lse_ref[size_t(n)] = m + std::log(sum);
        emax[size_t(n)] = e;
    }
    int64_t count = 0;
    for (int64_t n = 0; n < N; ++n) count += targets.as<int32_t>()[n] != kIgnoreIndex;

    // Per-row loss within the logits' bound: lse and a loss are 1-Lipschitz in the max norm of
    // the logits (max_v bound_v, plus the target's for the loss); 1e-5 relative on top for the
    // row kernel's fp32 arithmetic.
    const HostTensor losses_gpu = download_f32(losses.view, state);
    for (int64_t n = 0; n < N; ++n) {
        const int32_t t = targets.as<int32_t>()[n];
        if (t == kIgnoreIndex) {
            EXPECT_EQ(losses_gpu.as<float>()[n], 0.0f) << "ignored row " << n;
            continue;
        }
        const double want = lse_ref[size_t(n)] - l[size_t(n * V + t)].value;
        const double bound = emax[size_t(n)] + l[size_t(n * V + t)].bound +
                             1e-5 * (1 + std::fabs(lse_ref[size_t(n)]));
        EXPECT_LE(std::fabs(losses_gpu.as<float>()[n] - want), bound) << "loss of row " << n;
    }

    // A backward's gradients against the last chunk's codes it left in the scratch (earlier
    // chunks' dlogits are exactly 0): the bf16 dlogits against the reference softmax, their codes
    // against the CPU's cast of them (codes, amax, scale_inv), dx and dweight against the scaled
    // GEMMs of those codes.
    auto check_backward = [&](const DeviceTensor& gdx, const DeviceTensor& gdw, const char* what) {
        SCOPED_TRACE(what);
        const int64_t r = N - last;
        const HostTensor chunk = download_raw(scratch.view, state);
        const auto* bytes = reinterpret_cast<const uint8_t*>(chunk.view().data());
        HostTensor dl(DType::kF32, {r, V});
        for (int64_t i = 0; i < r * V; ++i)
            dl.as<float>()[i] = bf16_to_float(reinterpret_cast<const bf16*>(bytes)[i]);
        HostTensor dlq_ref(DType::kU8, {r, V}), dlqt_ref(DType::kU8, {V, r});
        float ds[2];
        cpu_cast(dl, r, V, grad_dtype, delayed ? &delayed_scale[2] : nullptr, dlq_ref, dlqt_ref,
                 ds);
        const uint8_t* dlq = bytes + rows * V * 2;
        const uint8_t* dlqt = dlq + rows * V;
        EXPECT_EQ(std::memcmp(dlq, dlq_ref.view().data(), size_t(r * V)), 0) << "dlogits codes";
        EXPECT_EQ(std::memcmp(dlqt, dlqt_ref.view().data(), size_t(r * V)), 0) << "dlogits^T codes";
        const HostTensor sc2 = download_raw(scalars.view, state);
        EXPECT_EQ(sc2.as<float>()[16], ds[0]) << "dlogits amax (the row kernel's when current)";
        EXPECT_EQ(sc2.as<float>()[20], ds[1]);
        if (delayed) {
            // The step's dlogits amax: the largest over the chunks (earlier ones are all zero).
            EXPECT_EQ(download_raw(step_amax.view, state).as<float>()[2], ds[0]);
        }
        // dlogits = dloss / count (softmax - onehot) from logits within bound_v and an lse
        // within emax (+ fp32: 1e-5 relative): the softmax within a factor exp(bound_v + emax),
        // 1e-5 more for fp32 exp and sums, 2^-24 of the scale for the fp32 subtraction, then one
        // bf16 rounding of the result.
        const double scale = double(dloss) / double(count);
        for (int64_t n = last; n < N; ++n) {
            const int32_t t = targets.as<int32_t>()[n];
            const double lse = lse_ref[size_t(n)];
            const double dlse = emax[size_t(n)] + 1e-5 * (1 + std::fabs(lse));
            for (int64_t v = 0; v < V; ++v) {
                const ScaledDot& z = l[size_t(n * V + v)];
                const double p = std::exp(z.value - lse);
                const double want = scale * (p - (v == t ? 1.0 : 0.0));
                const double got = dl.as<float>()[(n - last) * V + v];
                const double bound = scale * p * (std::expm1(z.bound + dlse) + 1e-5) +
                                     kBf16Unit * std::fabs(got) + 0x1p-23 * scale;
                ASSERT_LE(std::fabs(got - want), bound) << "dlogit " << n << ", " << v;
            }
        }
        const HostTensor dx_gpu = download_f32(gdx.view, state);
        const HostTensor dw_gpu = download_f32(gdw.view, state);
        for (int64_t n = 0; n < N; ++n)
            for (int64_t c = 0; c < C; ++c) {
                const double got = dx_gpu.as<float>()[n * C + c];
                if (n < last) {
                    ASSERT_EQ(got, 0.0) << "dx of an ignored row " << n;
                    continue;
                }
                const ScaledDot d = scaled_dot(dlq + (n - last) * V, grad_dtype, 1, wqc + c,
                                               DType::kE4M3, C, V, ds[1], ws[1], kBf16Unit);
                ASSERT_LE(std::fabs(got - d.value), d.bound) << "dx " << n << ", " << c;
            }
        for (int64_t v = 0; v < V; ++v)
            for (int64_t c = 0; c < C; ++c) {
                const ScaledDot d = scaled_dot(dlqt + v * r, grad_dtype, 1, xqc + last * C + c,
                                               DType::kE4M3, C, r, ds[1], xs[1], 0x1p-24);
                const double want = double(dw0.as<float>()[v * C + c]) + d.value;
                const double bound = d.bound + 0x1p-24 * (std::fabs(want) + std::fabs(d.value));
                ASSERT_LE(std::fabs(dw_gpu.as<float>()[v * C + c] - want), bound)
                    << "dweight " << v << ", " << c;
            }
    };
    check_backward(dx, dw, "forward_backward");

    // Deterministic: the same bits again.
    DeviceTensor dx2 = device_tensor(DType::kBF16, {N, C}, state);
    DeviceTensor dw2 = upload(dw0, DType::kF32, state);
    DeviceTensor loss2 = device_tensor(DType::kF32, {1}, state);
    lm_head_cross_entropy_forward_backward(loss2.view, TensorView(), dx2.view, dw2.view, gx.view,
                                           gt.view, gw.view, dloss, scratch.view, gpu, spec);
    EXPECT_TRUE(bitwise_equal(download_raw(loss2.view, state), download_raw(loss.view, state)));
    EXPECT_TRUE(bitwise_equal(download_raw(dx2.view, state), download_raw(dx.view, state)));
    EXPECT_TRUE(bitwise_equal(download_raw(dw2.view, state), download_raw(dw.view, state)));

    // The forward alone (its loss equals forward_backward's up to the two row kernels' fp32
    // summation orders), then the backward alone from its lse: the same checks on its codes.
    DeviceTensor loss3 = device_tensor(DType::kF32, {1}, state);
    DeviceTensor lse3 = device_tensor(DType::kF32, {N}, state);
    lm_head_cross_entropy_forward(loss3.view, TensorView(), lse3.view, gx.view, gt.view, gw.view,
                                  scratch.view, gpu, spec);
    EXPECT_TRUE(matches(download_f32(loss3.view, state), download_f32(loss.view, state), kF32Sum));
    DeviceTensor dx3 = device_tensor(DType::kBF16, {N, C}, state);
    DeviceTensor dw3 = upload(dw0, DType::kF32, state);
    if (delayed) cuda_copy_sync(step_amax.view, zero.view(), state.stream());
    lm_head_cross_entropy_backward(dx3.view, dw3.view, gx.view, gt.view, gw.view, lse3.view, dloss,
                                   scratch.view, gpu, spec);
    EXPECT_EQ(gemms, 3 + 3 + 1 + 2);
    check_backward(dx3, dw3, "backward alone");
}

TEST(CudaLmHeadCrossEntropyFp8, TensorwiseOneChunk) {
    check_fp8_head(48, 64, 1024, 48, false, DType::kE5M2, 71);
}

TEST(CudaLmHeadCrossEntropyFp8, TensorwiseThreeChunks) {
    // Nc = 40 f32 rows: chunks of 32 rows (a multiple of 16), the last at row 64.
    check_fp8_head(96, 64, 2048, 40, false, DType::kE5M2, 72);
}

TEST(CudaLmHeadCrossEntropyFp8, TensorwiseE4M3GradientsWideVocabulary) {
    // The Llama-3 vocabulary: the streaming row kernel's amax.
    check_fp8_head(32, 32, 128256, 16, false, DType::kE4M3, 73);
}

TEST(CudaLmHeadCrossEntropyFp8, DelayedTwoChunks) {
    check_fp8_head(64, 64, 1024, 32, true, DType::kE5M2, 74);
}

}  // namespace
}  // namespace lathe
