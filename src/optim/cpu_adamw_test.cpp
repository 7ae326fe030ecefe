#include "optim/cpu_adamw.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/tensor.h"
#include "ops/adamw.h"
#include "ops/context.h"

namespace lathe {
namespace {

// Every path this binary and CPU can run (the scalar one first: it defines the result).
std::vector<CpuAdamWPath> available_paths() {
    std::vector<CpuAdamWPath> out;
    for (CpuAdamWPath p :
         {CpuAdamWPath::kScalar, CpuAdamWPath::kAvx2, CpuAdamWPath::kAvx512, CpuAdamWPath::kNeon})
        if (cpu_adamw_path_available(p)) out.push_back(p);
    return out;
}

// Host state of one run: masters, moments in the state dtype, bf16 copy.
struct State {
    std::vector<float> params;
    std::vector<uint16_t> m16, v16;  // bf16 moments
    std::vector<float> m32, v32;     // f32 moments
    std::vector<bf16> params_bf16;
    AdamWStateDType dtype;

    State(const std::vector<float>& init, AdamWStateDType d)
        : params(init),
          m16(init.size()),
          v16(init.size()),
          m32(init.size()),
          v32(init.size()),
          params_bf16(init.size()),
          dtype(d) {}

    CpuAdamWBuffers buffers(const std::vector<float>& grads) {
        CpuAdamWBuffers b;
        b.numel = int64_t(params.size());
        b.params = params.data();
        b.m = dtype == AdamWStateDType::kBF16 ? static_cast<void*>(m16.data()) : m32.data();
        b.v = dtype == AdamWStateDType::kBF16 ? static_cast<void*>(v16.data()) : v32.data();
        b.grads = grads.data();
        b.params_bf16 = params_bf16.data();
        b.state_dtype = dtype;
        return b;
    }
};

// The reference: ops' CPU adamw_update_with_copy over the same moment storage (bf16 moments:
// ops/adamw.h's widen, f32 update, round; ops' AdamW.Bf16MomentsAreTheF32UpdateRounded checks
// that against the f32 update itself).
void reference_step(State& s, const std::vector<float>& grads,
                    std::span<const AdamWSegment> segments, const AdamWHyper& hyper, int64_t step,
                    const float* clip_norm, float max_norm) {
    const int64_t n = int64_t(s.params.size());
    const Shape shape{n};
    const bool b16 = s.dtype == AdamWStateDType::kBF16;
    const TensorView m = b16 ? TensorView(s.m16.data(), DType::kBF16, shape)
                             : TensorView(s.m32.data(), DType::kF32, shape);
    const TensorView v = b16 ? TensorView(s.v16.data(), DType::kBF16, shape)
                             : TensorView(s.v32.data(), DType::kF32, shape);
    float norm = clip_norm != nullptr ? *clip_norm : 0.0f;
    ConstTensorView norm_view =
        clip_norm != nullptr ? ConstTensorView(&norm, DType::kF32, Shape{1}) : ConstTensorView();
    adamw_update_with_copy(TensorView(s.params.data(), DType::kF32, shape),
                           TensorView(s.params_bf16.data(), DType::kBF16, shape), m, v,
                           ConstTensorView(grads.data(), DType::kF32, shape), segments, hyper, step,
                           norm_view, max_norm, cpu_context());
}

// Same bytes in every buffer (bit patterns, so NaNs and signed zeros count).
::testing::AssertionResult same_bits(const State& a, const State& b) {
    const auto eq = [](const auto& x, const auto& y) {
        return x.size() == y.size() &&
               std::memcmp(x.data(), y.data(), x.size() * sizeof(x[0])) == 0;
    };
    const auto first_diff = [](const auto& x, const auto& y) {
        for (size_t i = 0; i < x.size(); ++i)
            if (std::memcmp(&x[i], &y[i], sizeof(x[0])) != 0) return int64_t(i);
        return int64_t(-1);
    };
    if (!eq(a.params, b.params))
        return ::testing::AssertionFailure()
               << "params differ at " << first_diff(a.params, b.params);
    if (!eq(a.params_bf16, b.params_bf16))
        return ::testing::AssertionFailure()
               << "params_bf16 differ at " << first_diff(a.params_bf16, b.params_bf16);
    if (!eq(a.m32, b.m32) || !eq(a.m16, b.m16)) return ::testing::AssertionFailure() << "m differs";
    if (!eq(a.v32, b.v32) || !eq(a.v16, b.v16)) return ::testing::AssertionFailure() << "v differs";
    return ::testing::AssertionSuccess();
}

// Segments over n elements with different groups and gaps (elements in no segment must stay).
std::vector<AdamWSegment> segments_for(int64_t n) {
    if (n < 8) return {{0, n, 1e-2, 0.1}};
    const int64_t a = n / 3, b = n / 2;
    return {{0, a, 1e-2, 0.1},              // decayed group
            {a + 1, b - a - 1, 3e-3, 0.0},  // no decay (norms, biases); element a in none
            {b, n - b - 2, 5e-4, 0.05}};    // the last two elements in none
}

std::vector<float> random_vector(std::mt19937& rng, int64_t n, float scale) {
    std::normal_distribution<float> dist(0.0f, scale);
    std::vector<float> out(size_t(n), 0.0f);
    for (float& x : out) x = dist(rng);
    return out;
}

TEST(CpuAdamW, EveryPathMatchesOpsReferenceBits) {
    const std::vector<int64_t> lengths = {1,  3,  7,  8,   9,    15,   16,
                                          17, 31, 33, 100, 1000, 4099, 30011};
    AdamWHyper hyper;
    hyper.beta1 = 0.9;
    hyper.beta2 = 0.95;
    hyper.eps = 1e-8;
    int runs = 0;
    for (CpuAdamWPath path : available_paths()) {
        for (int threads : {1, 2, 7}) {
            auto opt = CpuAdamW::create(threads, path);
            ASSERT_TRUE(opt.ok()) << opt.status().to_string();
            ASSERT_EQ(opt->threads(), threads);
            ASSERT_EQ(opt->path(), path);
            for (AdamWStateDType dtype : {AdamWStateDType::kF32, AdamWStateDType::kBF16}) {
                for (int64_t n : lengths) {
                    for (bool clip : {false, true}) {
                        SCOPED_TRACE(::testing::Message()
                                     << cpu_adamw_path_name(path) << " threads " << threads << " "
                                     << adamw_state_dtype_name(dtype) << " n " << n << " clip "
                                     << clip);
                        std::mt19937 rng(uint32_t(n * 31 + clip));
                        const std::vector<float> init = random_vector(rng, n, 0.5f);
                        State ours(init, dtype), ref(init, dtype);
                        const std::vector<AdamWSegment> segs = segments_for(n);
                        for (int64_t t = 1; t <= 3; ++t) {
                            const std::vector<float> g = random_vector(rng, n, 0.03f);
                            // Clipping: a norm well above max_norm (coef < 1) on steps 1 and 3,
                            // a non-finite norm (no clipping) on step 2.
                            const float norm =
                                t == 2 ? std::numeric_limits<float>::infinity() : 3.7f;
                            const float* clip_norm = clip ? &norm : nullptr;
                            opt->step(ours.buffers(g), segs, hyper, t, clip_norm, 0.5f);
                            reference_step(ref, g, segs, hyper, t, clip_norm, 0.5f);
                            ASSERT_TRUE(same_bits(ours, ref)) << "step " << t;
                        }
                        // The update did something, and elements outside the segments did not
                        // move.
                        EXPECT_NE(ours.params[0], init[0]);
                        if (n >= 8) {
                            EXPECT_EQ(ours.params[size_t(n / 3)], init[size_t(n / 3)]);
                            EXPECT_EQ(ours.params[size_t(n - 1)], init[size_t(n - 1)]);
                        }
                        ++runs;
                    }
                }
            }
        }
    }
    EXPECT_GE(runs, 3 * 2 * 14 * 2);
}

TEST(CpuAdamW, LerpAboveOneHalfAndNoDecayMatchOps) {
    // 1 - beta1 >= 0.5 takes the other side of torch's lerp.
    AdamWHyper hyper;
    hyper.beta1 = 0.3;
    hyper.beta2 = 0.99;
    hyper.eps = 1e-6;
    const int64_t n = 1037;
    for (CpuAdamWPath path : available_paths()) {
        auto opt = CpuAdamW::create(2, path);
        ASSERT_TRUE(opt.ok());
        for (AdamWStateDType dtype : {AdamWStateDType::kF32, AdamWStateDType::kBF16}) {
            std::mt19937 rng(7);
            const std::vector<float> init = random_vector(rng, n, 1.0f);
            State ours(init, dtype), ref(init, dtype);
            const AdamWSegment segs[] = {{0, n, 2e-2, 0.0}};
            for (int64_t t = 1; t <= 4; ++t) {
                const std::vector<float> g = random_vector(rng, n, 1.0f);
                opt->step(ours.buffers(g), segs, hyper, t, nullptr, 0.0f);
                reference_step(ref, g, segs, hyper, t, nullptr, 0.0f);
                ASSERT_TRUE(same_bits(ours, ref)) << cpu_adamw_path_name(path) << " step " << t;
            }
        }
    }
}

TEST(CpuAdamW, Bf16CopyRoundsSpecialValuesLikeFloatToBf16) {
    // lr = 0 and zero gradients leave every master as it is (p + (-0 * 0) / eps; a NaN comes out
    // quiet), so the bf16
    // copy is float_to_bf16 of the chosen values: ties both ways, the largest float (rounds to
    // infinity), infinities, NaNs with payloads, subnormals, signed zeros.
    const std::vector<uint32_t> bits = {
        0x3F808000u, 0x3F818000u, 0x3F808001u, 0x3F80FFFFu, 0xBF808000u, 0xBF818000u,
        0x7F7FFFFFu, 0xFF7FFFFFu, 0x7F800000u, 0xFF800000u, 0x7FC00001u, 0xFFA12345u,
        0x7F800001u, 0x00000001u, 0x80008000u, 0x00018000u, 0x00000000u, 0x80000000u,
        0x3F7FFFFFu, 0x477FE000u, 0x477FF000u, 0x3DCCCCCDu, 0xC2F6E979u};
    std::vector<float> init;
    for (int rep = 0; rep < 3; ++rep)
        for (uint32_t b : bits) init.push_back(std::bit_cast<float>(b));
    const int64_t n = int64_t(init.size());
    const std::vector<float> zeros(init.size(), 0.0f);
    const AdamWSegment segs[] = {{0, n, 0.0, 0.0}};
    for (CpuAdamWPath path : available_paths()) {
        auto opt = CpuAdamW::create(1, path);
        ASSERT_TRUE(opt.ok());
        State s(init, AdamWStateDType::kBF16);
        opt->step(s.buffers(zeros), segs, AdamWHyper{}, 1, nullptr, 0.0f);
        for (int64_t i = 0; i < n; ++i) {
            // Arithmetic quiets a signalling NaN and keeps its sign and payload.
            const uint32_t in = std::bit_cast<uint32_t>(init[i]);
            EXPECT_EQ(std::bit_cast<uint32_t>(s.params[i]),
                      std::isnan(init[i]) ? (in | 0x00400000u) : in)
                << cpu_adamw_path_name(path) << " " << i;
            EXPECT_EQ(s.params_bf16[i].bits, float_to_bf16(init[i]).bits)
                << cpu_adamw_path_name(path) << " " << i;
        }
    }
}

TEST(CpuAdamW, ZeroStateClearsTheSegmentsOnly) {
    const int64_t n = 3 * kCpuAdamWPageElems + 77;
    const std::vector<AdamWSegment> segs = segments_for(n);
    for (AdamWStateDType dtype : {AdamWStateDType::kF32, AdamWStateDType::kBF16}) {
        auto opt = CpuAdamW::create(7);
        ASSERT_TRUE(opt.ok());
        State s(std::vector<float>(size_t(n), 1.0f), dtype);
        std::fill(s.m32.begin(), s.m32.end(), 5.0f);
        std::fill(s.v32.begin(), s.v32.end(), 6.0f);
        std::fill(s.m16.begin(), s.m16.end(), uint16_t(0x4040));
        std::fill(s.v16.begin(), s.v16.end(), uint16_t(0x4050));
        const std::vector<float> g(size_t(n), 0.0f);
        opt->zero_state(s.buffers(g), segs);
        std::vector<bool> inside(size_t(n), false);
        for (const AdamWSegment& seg : segs)
            for (int64_t i = seg.offset; i < seg.offset + seg.count; ++i) inside[size_t(i)] = true;
        for (int64_t i = 0; i < n; ++i) {
            const float m = dtype == AdamWStateDType::kF32 ? s.m32[i] : bf16_to_float({s.m16[i]});
            const float v = dtype == AdamWStateDType::kF32 ? s.v32[i] : bf16_to_float({s.v16[i]});
            EXPECT_EQ(m, inside[size_t(i)] ? 0.0f : (dtype == AdamWStateDType::kF32 ? 5.0f : 3.0f))
                << i;
            EXPECT_EQ(v, inside[size_t(i)] ? 0.0f : (dtype == AdamWStateDType::kF32 ? 6.0f : 3.25f))
                << i;
        }
    }
}

TEST(CpuAdamW, CreateRefusesBadArguments) {
    EXPECT_FALSE(CpuAdamW::create(-1).ok());
    for (CpuAdamWPath p : {CpuAdamWPath::kAvx2, CpuAdamWPath::kAvx512, CpuAdamWPath::kNeon}) {
        if (cpu_adamw_path_available(p)) continue;
        auto r = CpuAdamW::create(1, p);
        ASSERT_FALSE(r.ok());
        EXPECT_NE(r.status().message().find(cpu_adamw_path_name(p)), std::string::npos);
    }
    auto all = CpuAdamW::create(0);
    ASSERT_TRUE(all.ok());
    EXPECT_GE(all->threads(), 1);
    EXPECT_NE(all->path(), CpuAdamWPath::kAuto);
    EXPECT_EQ(all->path(), cpu_adamw_best_path());
}

}  // namespace
}  // namespace lathe
