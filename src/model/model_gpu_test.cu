// The whole model on the GPU against the CPU reference (CTest label gpu): for each family, the
// same initial weights and batch on both backends; loss, every parameter gradient, the gradient
// norm, logits, and the loss after a few AdamW steps must agree within bf16 tolerance. The CPU
// twin computes in fp32 from the fp32 masters; the GPU computes from their bf16 copy with bf16
// activations, so the tolerances are bf16's (u = 2^-8) grown by the depth of the computation,
// not fp32's. Also: packed documents, batches smaller than planned, checkpoints read back from the
// device, and a step allocating nothing (optim/adamw_optimizer_gpu_test.cu: the optimizer's state).
// clang-format off
#include "ops/cuda/nvcc_compat.h"  // first: before any header that includes fmt
// clang-format on

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "model/adamw_moments_test_util.h"
#include "model/block.h"
#include "model/model.h"
#include "model/model_io.h"
#include "model/registry.h"
#include "ops/cuda/attention.h"
#include "ops/cuda/cuda_state.h"
#include "ops/cuda/fp8_linear.h"
#include "ops/cuda/memory.h"

namespace lathe {
namespace {

struct Family {
    const char* name;
    const char* json;
};

// Small but not degenerate: head_dim 32 (cuDNN needs a multiple of 8), hidden a multiple of 8
// (the vectorized kernel paths), two or three layers.
const Family kFamilies[] = {
    {"llama", R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
      "vocab_size": 384, "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
      "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 128,
      "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": false,
      "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                       "high_freq_factor": 4.0, "original_max_position_embeddings": 32}})"},
    {"mistral", R"({"architectures": ["MistralForCausalLM"], "model_type": "mistral",
      "vocab_size": 320, "hidden_size": 128, "intermediate_size": 224, "num_hidden_layers": 2,
      "num_attention_heads": 4, "num_key_value_heads": 1, "max_position_embeddings": 128,
      "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "sliding_window": 24,
      "tie_word_embeddings": false})"},
    {"qwen2", R"({"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
      "vocab_size": 352, "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
      "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 128,
      "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "tie_word_embeddings": true})"},
    {"gpt_neox", R"({"architectures": ["GPTNeoXForCausalLM"], "model_type": "gpt_neox",
      "vocab_size": 384, "hidden_size": 128, "intermediate_size": 512, "num_hidden_layers": 2,
      "num_attention_heads": 4, "max_position_embeddings": 128, "rotary_pct": 0.25,
      "use_parallel_residual": true, "tie_word_embeddings": false})"},
    {"gpt2", R"({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
      "vocab_size": 331, "n_embd": 128, "n_layer": 3, "n_head": 4, "n_positions": 128})"},
};

constexpr int64_t kB = 2, kT = 96;

ModelConfig parse(const char* json) {
    Result<ModelConfig> c = model_config_from_hf_json(json, "test/config.json");
    LATHE_CHECK(c.ok(), "{}", c.status().to_string());
    return std::move(*c);
}

HostTensor random_ids(int64_t B, int64_t T, int64_t n, uint64_t salt, bool some_ignored) {
    HostTensor t(DType::kI32, Shape{B, T});
    uint64_t x = 0x9E3779B97F4A7C15ull ^ salt;
    for (int64_t i = 0; i < B * T; ++i) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        t.as<int32_t>()[i] = some_ignored && x % 11 == 0 ? -100 : int32_t(x % uint64_t(n));
    }
    return t;
}

// ||a - b|| / ||b|| over equal-length vectors.
double rel_l2(const float* a, const float* b, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; ++i) {
        num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
        den += double(b[i]) * b[i];
    }
    return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

struct Pair {
    Model cpu, gpu;
};

Pair make_pair(CudaState& state, const ModelConfig& c, int64_t B, int64_t T, uint64_t seed) {
    Result<Model> cpu = Model::create(c, ModelShape{B, T, 0}, cpu_context());
    Result<Model> gpu = Model::create(c, ModelShape{B, T, 0}, state.context());
    LATHE_CHECK(cpu.ok() && gpu.ok(), "{} {}", cpu.status().to_string(), gpu.status().to_string());
    cpu->init(seed);
    gpu->init(seed);
    return Pair{std::move(*cpu), std::move(*gpu)};
}

// Every HF parameter's gradient (or value) on both, compared by relative L2 error.
double worst_tensor_error(const Model& cpu, const Model& gpu, bool grads, std::string* worst) {
    double err = 0;
    for (const HfParam& p : cpu.params().hf_params()) {
        HostTensor a(DType::kF32, p.shape), b(DType::kF32, p.shape);
        if (grads) {
            model_read_grad_hf(gpu, p.name, a.view());
            model_read_grad_hf(cpu, p.name, b.view());
        } else {
            model_read_param_hf(gpu, p.name, a.view());
            model_read_param_hf(cpu, p.name, b.view());
        }
        const double e = rel_l2(a.as<float>(), b.as<float>(), p.shape.numel());
        EXPECT_TRUE(std::isfinite(e)) << p.name;
        if (e > err) {
            err = e;
            *worst = p.name;
        }
    }
    return err;
}

class ModelGpu : public ::testing::TestWithParam<Family> {
protected:
    static void SetUpTestSuite() { state_ = new CudaState(0); }
    static void TearDownTestSuite() {
        delete state_;
        state_ = nullptr;
    }
    static CudaState* state_;
};
CudaState* ModelGpu::state_ = nullptr;

TEST_P(ModelGpu, OneTrainingStepMatchesTheCpuReference) {
    const ModelConfig c = parse(GetParam().json);
    Pair m = make_pair(*state_, c, kB, kT, 11);
    const HostTensor tok = random_ids(kB, kT, c.vocab_size, 1, false);
    const HostTensor tgt = random_ids(kB, kT, c.vocab_size, 2, true);
    const ModelBatch batch{tok.view(), tgt.view(), {}, {}};

    m.cpu.zero_grads();
    m.gpu.zero_grads();
    const float loss_cpu = m.cpu.forward_backward(batch);
    const float loss_gpu = m.gpu.forward_backward(batch);
    std::string worst;
    const double grad_err = worst_tensor_error(m.cpu, m.gpu, true, &worst);
    const float norm_cpu = m.cpu.grad_norm(), norm_gpu = m.gpu.grad_norm();
    std::printf(
        "[gpu-vs-cpu] %-9s loss %.6f vs %.6f (rel %.2e)  grad norm %.5f vs %.5f  worst "
        "grad rel-L2 %.2e (%s)\n",
        GetParam().name, loss_gpu, loss_cpu, std::abs(loss_gpu - loss_cpu) / loss_cpu, norm_gpu,
        norm_cpu, grad_err, worst.c_str());
    // The loss, an fp32/fp64 reduction of bf16-computed logits z: per token
    // |dCE| = |sum_j p_j dz_j - dz_t| <= 2 (1 - p_t) max|dz|, so at initialisation (p_t ~ 1/V,
    // CE ~ ln V ~ 5.8) the relative loss error is at most 2 max|dz| / ln V ~ 0.34 max|dz|. The
    // initial logits are O(1) and carry a few u (u = 2^-8 = 3.9e-3) of absolute error, so
    // 4e-3 = 1u relative allows max|dz| up to 3u.
    EXPECT_NEAR(loss_gpu, loss_cpu, 4e-3 * loss_cpu);
    // Each gradient passes through about 10 bf16 roundings per layer, mostly independent: a
    // random walk of sqrt(10 L) u = 1.7-2.1e-2 relative for these L = 2-3 layers. The whole
    // vector's norm differs by at most the whole vector's error, |||a|| - ||b||| <= ||a - b||: the
    // random-walk size, 2e-2; one tensor (small ones cancel more) 5e-2, 2.5 times it.
    EXPECT_NEAR(norm_gpu, norm_cpu, 2e-2 * norm_cpu);
    EXPECT_LT(grad_err, 5e-2) << worst;

    // Logits (forward only), compared as a whole.
    HostTensor lc(DType::kF32, Shape{kB, kT, c.vocab_size}), lg(DType::kF32, lc.view().shape());
    m.cpu.logits(lc.view(), ModelBatch{tok.view(), {}, {}, {}});
    m.gpu.logits(lg.view(), ModelBatch{tok.view(), {}, {}, {}});
    const double logit_err = rel_l2(lg.as<float>(), lc.as<float>(), lc.view().numel());
    std::printf("[gpu-vs-cpu] %-9s logits rel-L2 %.2e\n", GetParam().name, logit_err);
    // The forward's share of the roundings above (about half), and one more for the logits:
    // sqrt(5 L + 1) u = 1.3-1.6e-2; 2e-2.
    EXPECT_LT(logit_err, 2e-2);
}

// How far two AdamW runs drift apart when their gradients differ. AdamW's step per element,
// lr m / (sqrt(v) + eps), does not scale with the gradient: an element whose gradient is smaller
// than the gradient error may step the other way, a difference of up to 2 lr however small the
// error. So a gradient error of relative size s (rel-L2 per tensor) flips a share of elements
// proportional to s, and after a few steps the parameters differ by ~ sqrt(s), not ~ s.
// Measured on the CPU (bench/adamw_drift.cpp: the CPU model stepped twice from the same start,
// once with Gaussian noise of rel-L2 s on every nonzero gradient element of every tensor; this
// test's protocol, 5 families x 10 noise seeds, s = 3e-4 .. 2.6e-2): the parameter rel-L2 after
// 8 steps stays below 0.48 sqrt(s) and the step losses' relative difference below
// 0.075 sqrt(s); mistral drifts no more than the others (0.20-0.40 sqrt(s)). The tolerances take
// those envelopes with 25-35% room, s being the GPU's own gradient error at step 1 (identical
// parameters, so arithmetic alone), its worst tensor taken for every tensor.
constexpr double kParamDrift = 0.6, kStepLossDrift = 0.1;

TEST_P(ModelGpu, LossesTrackTheCpuOverAdamWSteps) {
    const ModelConfig c = parse(GetParam().json);
    Pair m = make_pair(*state_, c, kB, kT, 12);
    TestAdamWMoments cpu_moments = TestAdamWMoments::of(m.cpu);
    TestAdamWMoments gpu_moments = TestAdamWMoments::of(m.gpu);
    const AdamWHyper hyper;
    std::vector<float> lc, lg;
    double grad_err = 0;  // the worst tensor's gradient rel-L2 at step 1
    for (int step = 1; step <= 8; ++step) {
        const HostTensor tok = random_ids(kB, kT, c.vocab_size, 100 + step % 2, false);
        HostTensor tgt(DType::kI32, Shape{kB, kT});  // next token of the (repeating) batch
        for (int64_t b = 0; b < kB; ++b)
            for (int64_t t = 0; t < kT; ++t)
                tgt.as<int32_t>()[b * kT + t] =
                    t + 1 < kT ? tok.as<int32_t>()[b * kT + t + 1] : -100;
        const ModelBatch batch{tok.view(), tgt.view(), {}, {}};
        for (Model* model : {&m.cpu, &m.gpu}) {
            model->zero_grads();
            const float loss = model->forward_backward(batch);
            (model == &m.cpu ? lc : lg).push_back(loss);
        }
        if (step == 1) {
            std::string worst;
            grad_err = worst_tensor_error(m.cpu, m.gpu, true, &worst);
        }
        for (Model* model : {&m.cpu, &m.gpu}) {
            model->grad_norm();
            (model == &m.cpu ? cpu_moments : gpu_moments)
                .step(*model, model->adamw_segments(3e-3, 0.1), hyper, step, 1.0f);
        }
    }
    // Each step's loss: the one-step bound (4e-3, OneTrainingStepMatchesTheCpuReference) plus the
    // drift of the parameters (kStepLossDrift sqrt(s)).
    const double loss_tol = 4e-3 + kStepLossDrift * std::sqrt(grad_err);
    for (size_t i = 0; i < lc.size(); ++i) {
        std::printf("[gpu-vs-cpu] %-9s step %zu loss %.5f vs %.5f\n", GetParam().name, i + 1, lg[i],
                    lc[i]);
        EXPECT_NEAR(lg[i], lc[i], loss_tol * lc[i]) << "step " << i + 1;
    }
    EXPECT_LT(lg.back(), lg.front() - 0.3f) << "the GPU model did not learn the repeated batches";
    // The masters moved as the CPU's did; the bf16 copy (what the next forward reads) follows.
    // Per tensor, a zero-initialised bias is all update: AdamW's early steps are nearly
    // sign(g) x lr, so where a gradient element is near zero the two backends may step it either
    // way and its relative error says little. The whole parameter vector is the measure.
    std::string worst;
    const double worst_err = worst_tensor_error(m.cpu, m.gpu, false, &worst);
    const ConstTensorView pg = m.gpu.params_flat(), pc = m.cpu.params_flat();
    std::vector<float> host(size_t(pg.numel()));
    cuda_copy_sync(TensorView(host.data(), DType::kF32, pg.shape()), pg, state_->stream());
    const double param_err = rel_l2(host.data(), pc.as<float>(), pc.numel());
    const double param_tol = kParamDrift * std::sqrt(grad_err);
    std::printf(
        "[gpu-vs-cpu] %-9s parameters after 8 steps: rel-L2 %.2e (worst tensor %.2e, %s); "
        "step-1 gradient error %.2e: allowed %.2e, step losses %.2e relative\n",
        GetParam().name, param_err, worst_err, worst.c_str(), grad_err, param_tol, loss_tol);
    EXPECT_LT(grad_err, 5e-2);  // OneTrainingStepMatchesTheCpuReference's bound
    EXPECT_LT(param_err, param_tol);
}

TEST_P(ModelGpu, PackedDocumentsAndSmallerBatchesMatchTheCpu) {
    const ModelConfig c = parse(GetParam().json);
    Pair m = make_pair(*state_, c, kB, kT, 13);
    const int64_t B = 1, T = 80;  // smaller than planned
    const HostTensor tok = random_ids(B, T, c.vocab_size, 5, false);
    const HostTensor tgt = random_ids(B, T, c.vocab_size, 6, true);
    HostTensor docs(DType::kI32, Shape{B, T}), pos(DType::kI32, Shape{B, T});
    for (int i = 0; i < T; ++i) {
        const int d = i < 30 ? 0 : (i < 55 ? 1 : 2);
        docs.as<int32_t>()[i] = d;
        pos.as<int32_t>()[i] = i - (d == 0 ? 0 : d == 1 ? 30 : 55);
    }
    const ModelBatch batch{tok.view(), tgt.view(), docs.view(), pos.view()};
    m.cpu.zero_grads();
    m.gpu.zero_grads();
    const float lc = m.cpu.forward_backward(batch), lg = m.gpu.forward_backward(batch);
    std::string worst;
    const double grad_err = worst_tensor_error(m.cpu, m.gpu, true, &worst);
    std::printf("[gpu-vs-cpu] %-9s packed: loss %.6f vs %.6f, worst grad rel-L2 %.2e (%s)\n",
                GetParam().name, lg, lc, grad_err, worst.c_str());
    EXPECT_NEAR(lg, lc, 4e-3 * lc);
    EXPECT_LT(grad_err, 5e-2) << worst;
}

// Activation recompute on the GPU, selective and full: the recomputed tensors repeat the saved
// ones with the same (deterministic) kernels, so loss and gradients are bitwise those of a model
// that kept every activation.
void expect_recompute_gives_the_same_bits(CudaState& state, const ModelConfig& c, Recompute mode) {
    ModelShape shape{kB, kT, 0};
    shape.recompute = mode;
    Result<Model> keep = Model::create(c, ModelShape{kB, kT, 0}, state.context());
    Result<Model> rec = Model::create(c, shape, state.context());
    ASSERT_TRUE(keep.ok() && rec.ok());
    keep->init(15);
    rec->init(15);
    const HostTensor tok = random_ids(kB, kT, c.vocab_size, 9, false);
    const HostTensor tgt = random_ids(kB, kT, c.vocab_size, 10, true);
    const ModelBatch batch{tok.view(), tgt.view(), {}, {}};
    keep->zero_grads();
    rec->zero_grads();
    EXPECT_EQ(keep->forward_backward(batch), rec->forward_backward(batch));
    const ConstTensorView a = keep->grads_flat(), b = rec->grads_flat();
    std::vector<float> ha(size_t(a.numel())), hb(size_t(b.numel()));
    cuda_copy_sync(TensorView(ha.data(), DType::kF32, a.shape()), a, state.stream());
    cuda_copy_sync(TensorView(hb.data(), DType::kF32, b.shape()), b, state.stream());
    EXPECT_EQ(ha, hb);
    EXPECT_LT(rec->plan().activation_bytes(), keep->plan().activation_bytes());
}

TEST_P(ModelGpu, FullRecomputeGivesTheSameBits) {
    expect_recompute_gives_the_same_bits(*state_, parse(GetParam().json), Recompute::kFull);
}

TEST_P(ModelGpu, SelectiveRecomputeGivesTheSameBits) {
    expect_recompute_gives_the_same_bits(*state_, parse(GetParam().json), Recompute::kSelective);
}

// Micro-batches enqueued without waiting (forward_backward_async, as lathe train does): the
// batches alternate between the halves of the pinned buffer while earlier copies may still be in
// flight, and the caller rewrites its host memory right after each call. The losses read at the
// end and the accumulated gradients are bitwise those of forward_backward one by one.
std::vector<float> device_floats(ConstTensorView v, CUstream_st* stream) {
    std::vector<float> host(size_t(v.numel()));
    cuda_copy_sync(TensorView(host.data(), DType::kF32, v.shape()), v, stream);
    return host;
}

// zero_grads_beside_forward leaves the projections' and the LM head's gradients for the next
// backward to write (=; model.h): with every gradient byte first set to 0xFF (f32 NaN, as if the
// last step had left garbage there), three micro-batches after it give every gradient as three
// after zero_grads() do, finite; and a gradient norm asked before any backward is 0 (those
// entries cleared on demand). The only difference allowed is the order of a weight gradient's
// fp32 sum: the first micro-batch's GEMMs run with beta 0, which cuBLASLt may serve with another
// algorithm. Reordering a sum of K products moves it by at most (K - 1) u sum|t|, u = 2^-24, and
// sum|t| is about sqrt(K) |sum t| for random signs: rel-L2 within (K - 1) u sqrt(K) per tensor,
// K = B T = 192 tokens (1.6e-4). FP8 GEMMs accumulate inside the tensor core with about 14 bits
// (DeepSeek-V3's measurement on Hopper), u = 2^-14 there (0.16); what the check catches is far
// larger: a micro-batch's contribution dropped or a stale one added (rel-L2 0.5 or more), NaN.
void expect_deferred_clearing_matches(Model& m, const ModelConfig& c, CUstream_st* stream,
                                      double unit) {
    constexpr int kMicro = 3;
    std::vector<HostTensor> tok, tgt;
    for (int k = 0; k < kMicro; ++k) {
        tok.push_back(random_ids(kB, kT, c.vocab_size, 70 + k, false));
        tgt.push_back(random_ids(kB, kT, c.vocab_size, 80 + k, true));
    }
    auto run = [&] {
        for (int k = 0; k < kMicro; ++k)
            m.forward_backward_async(ModelBatch{tok[k].view(), tgt[k].view(), {}, {}},
                                     1.0f / kMicro, k);
        (void)m.fp8_take_gemms();  // (no fp8_end_step: delayed scales stay those of both runs)
        std::vector<float> losses(kMicro);
        m.read_losses(losses);
    };
    m.zero_grads();
    run();
    std::vector<std::vector<float>> want;
    for (const ParamEntry& e : m.params().entries())
        want.push_back(device_floats(m.grad_entry(e.arena_index), stream));

    const TensorView all = m.grads_flat();
    cuda_fill_bytes(TensorView(all.data(), DType::kU8, Shape{int64_t(all.bytes())}, Device::kCuda),
                    0xFF, stream);
    m.zero_grads_beside_forward();
    EXPECT_EQ(m.grad_norm(), 0.0f) << "the deferred entries cleared for a norm before a backward";
    cuda_fill_bytes(TensorView(all.data(), DType::kU8, Shape{int64_t(all.bytes())}, Device::kCuda),
                    0xFF, stream);
    m.zero_grads_beside_forward();
    run();
    const double K = double(kB * kT);
    const double tol = (K - 1) * unit * std::sqrt(K);
    double worst = 0;
    size_t i = 0;
    for (const ParamEntry& e : m.params().entries()) {
        const std::vector<float> got = device_floats(m.grad_entry(e.arena_index), stream);
        const std::vector<float>& w = want[i++];
        bool finite = true;
        for (const float x : got) finite = finite && std::isfinite(x);
        EXPECT_TRUE(finite) << e.name;
        const double err = rel_l2(got.data(), w.data(), int64_t(w.size()));
        EXPECT_LE(err, tol) << e.name;
        worst = std::max(worst, err);
    }
    std::printf("[deferred-clearing] %s worst rel-L2 %.3g (allowed %.3g)\n", c.model_type.c_str(),
                worst, tol);
    EXPECT_TRUE(std::isfinite(m.grad_norm()));
}

TEST_P(ModelGpu, DeferredClearingGivesTheClearedGradients) {
    const ModelConfig c = parse(GetParam().json);
    Result<Model> m = Model::create(c, ModelShape{kB, kT, 0}, state_->context());
    ASSERT_TRUE(m.ok());
    m->init(17);
    expect_deferred_clearing_matches(*m, c, state_->stream(), 0x1p-24);
}

TEST_P(ModelGpu, AsyncMicroBatchesGiveTheSameBitsAsSyncOnes) {
    const ModelConfig c = parse(GetParam().json);
    Result<Model> m = Model::create(c, ModelShape{kB, kT, 0}, state_->context());
    ASSERT_TRUE(m.ok());
    m->init(16);
    constexpr int kMicro = 5;
    std::vector<HostTensor> tok, tgt;
    for (int k = 0; k < kMicro; ++k) {
        tok.push_back(random_ids(kB, kT, c.vocab_size, 40 + k, false));
        tgt.push_back(random_ids(kB, kT, c.vocab_size, 50 + k, true));
    }
    auto grads = [&] {
        const ConstTensorView g = m->grads_flat();
        std::vector<float> h(size_t(g.numel()));
        cuda_copy_sync(TensorView(h.data(), DType::kF32, g.shape()), g, state_->stream());
        return h;
    };
    m->zero_grads();
    std::vector<float> want;
    for (int k = 0; k < kMicro; ++k)
        want.push_back(
            m->forward_backward(ModelBatch{tok[k].view(), tgt[k].view(), {}, {}}, 1.0f / kMicro));
    const std::vector<float> want_grads = grads();
    m->zero_grads();
    HostTensor t(DType::kI32, Shape{kB, kT}), y(DType::kI32, Shape{kB, kT});
    for (int k = 0; k < kMicro; ++k) {
        std::memcpy(t.view().data(), tok[k].view().data(), t.view().bytes());
        std::memcpy(y.view().data(), tgt[k].view().data(), y.view().bytes());
        m->forward_backward_async(ModelBatch{t.view(), y.view(), {}, {}}, 1.0f / kMicro, k);
        std::memset(t.view().data(), 0, t.view().bytes());
        std::memset(y.view().data(), 0, y.view().bytes());
    }
    std::vector<float> got(kMicro);
    m->read_losses(got);
    EXPECT_EQ(got, want);
    EXPECT_EQ(grads(), want_grads);
}

// Weight windows on CUDA (model.h): model b's bf16 compute copy copied unit by unit into device
// windows, the copy itself then filled with 0xFF (bf16 NaN): b reading every weight through the
// windows gives model a's loss and gradients bit for bit (exact: the same kernels read the same
// bf16 values; a weight read from b's own copy would be NaN). Then two sharded models (the
// parameters over 2 ranks, ZeRO-3's layout): each rank's f32 and bf16 shards hold its chunks of
// the unsharded model's arenas, bit for bit (write_param_entry casts them as the unsharded
// write does).
TEST_P(ModelGpu, WeightWindowsGiveTheArenasBits) {
    const ModelConfig c = parse(GetParam().json);
    CUstream_st* stream = state_->stream();
    ModelShape shape{kB, kT, 0};
    shape.unit_shards = 2;
    shape.optimizer_shards = 2;
    Result<Model> a = Model::create(c, shape, state_->context());
    Result<Model> b = Model::create(c, shape, state_->context());
    ASSERT_TRUE(a.ok() && b.ok());
    a->init(21);
    b->init(21);
    const ShardLayout& sl = b->plan().shards;
    const TensorView compute = b->params_compute_flat();
    std::vector<DeviceBuffer> windows;
    std::vector<TensorView> views;
    for (size_t u = 0; u < sl.units(); ++u) {
        const int64_t n = sl.arena[u].size();
        windows.emplace_back(size_t(std::max<int64_t>(n, 1)) * 2);
        views.push_back(windows.back().view(DType::kBF16, Shape{n}));
        if (n > 0)
            cuda_copy_sync(views.back(), compute.slice(sl.arena[u].begin, sl.arena[u].end), stream);
    }
    cuda_fill_bytes(compute, 0xFF, stream);
    int asked = 0;
    b->set_weight_window_hook([&](int piece) {
        ++asked;
        return views[piece == Model::kInputWeights    ? ShardLayout::kFront
                     : piece == Model::kOutputWeights ? sl.back()
                                                      : sl.layer_unit(piece)];
    });
    const HostTensor tok = random_ids(kB, kT, c.vocab_size, 61, false);
    const HostTensor tgt = random_ids(kB, kT, c.vocab_size, 62, true);
    const ModelBatch batch{tok.view(), tgt.view(), {}, {}};
    a->zero_grads();
    b->zero_grads();
    const float la = a->forward_backward(batch, 1.0f), lb = b->forward_backward(batch, 1.0f);
    EXPECT_TRUE(std::isfinite(lb));
    EXPECT_EQ(std::bit_cast<uint32_t>(la), std::bit_cast<uint32_t>(lb)) << la << " vs " << lb;
    EXPECT_GE(asked, 2 * int(c.num_layers) + 2);
    auto host = [&](ConstTensorView v) {
        std::vector<uint8_t> h(size_t(v.bytes()));
        cuda_copy_sync(TensorView(h.data(), DType::kU8, Shape{int64_t(h.size())}),
                       ConstTensorView(v.data(), DType::kU8, Shape{int64_t(v.bytes())}, v.device()),
                       stream);
        return h;
    };
    EXPECT_EQ(host(a->grads_flat()), host(b->grads_flat()));

    std::vector<uint8_t> whole32 = host(a->params_flat()), whole16 = host(a->params_compute_flat());
    for (int r = 0; r < 2; ++r) {
        ModelShape sharded = shape;
        sharded.gradient_shards = 2;
        sharded.param_shards = 2;
        sharded.shard_rank = r;
        Result<Model> m = Model::create(c, sharded, state_->context());
        ASSERT_TRUE(m.ok()) << m.status().to_string();
        m->init(21);
        ASSERT_EQ(m->params_flat().numel(), sl.total / 2);
        const std::vector<uint8_t> s32 = host(m->params_flat()),
                                   s16 = host(m->params_compute_flat());
        int64_t at = 0;
        for (size_t u = 0; u < sl.units(); ++u) {
            const FlatRange ch = sl.chunk(u, r);
            EXPECT_EQ(std::memcmp(s32.data() + at * 4, whole32.data() + ch.begin * 4,
                                  size_t(ch.size()) * 4),
                      0)
                << "rank " << r << " unit " << u;
            EXPECT_EQ(std::memcmp(s16.data() + at * 2, whole16.data() + ch.begin * 2,
                                  size_t(ch.size()) * 2),
                      0)
                << "rank " << r << " unit " << u;
            at += ch.size();
        }
    }
}

TEST_P(ModelGpu, AStepAllocatesNoDeviceMemory) {
    const ModelConfig c = parse(GetParam().json);
    Pair m = make_pair(*state_, c, kB, kT, 14);
    TestAdamWMoments moments = TestAdamWMoments::of(m.gpu);
    const HostTensor tok = random_ids(kB, kT, c.vocab_size, 7, false);
    const HostTensor tgt = random_ids(kB, kT, c.vocab_size, 8, true);
    auto step = [&] {
        m.gpu.zero_grads();
        m.gpu.forward_backward(ModelBatch{tok.view(), tgt.view(), {}, {}});
        m.gpu.grad_norm();
        moments.step(m.gpu, m.gpu.adamw_segments(1e-3, 0.0), AdamWHyper{}, 1);
        m.gpu.synchronize();
    };
    step();  // first use builds the cached attention graphs and GEMM choices
    const size_t before = cuda_memory_info(0).free_bytes;
    for (int i = 0; i < 3; ++i) step();
    EXPECT_EQ(cuda_memory_info(0).free_bytes, before);
}

// An inference model on CUDA (ModelShape::training false) holds the bf16 compute copy alone
// (memory_plan.h, keeps_masters): its parameter row is the bf16 copy's bytes, an entry read back
// is the written f32 rounded to bf16 (nearest even, as the training model's cast), and its
// logits are the training model's bits (both forwards read the same bf16 weights).
TEST_P(ModelGpu, AnInferenceModelHoldsTheBf16CopyAloneAndGivesTheSameLogits) {
    const ModelConfig c = parse(GetParam().json);
    ModelShape shape{kB, kT, 0};
    shape.training = false;
    Result<Model> inf = Model::create(c, shape, state_->context());
    Result<Model> train = Model::create(c, ModelShape{kB, kT, 0}, state_->context());
    ASSERT_TRUE(inf.ok() && train.ok()) << inf.status().to_string();
    EXPECT_FALSE(inf->plan().keeps_masters());
    EXPECT_EQ(inf->plan().parameter_bytes(), inf->plan().params_compute.total_bytes());
    EXPECT_EQ(2 * inf->plan().parameter_bytes(), inf->plan().params.total_bytes());
    inf->init(21);
    train->init(21);
    for (const HfParam& p : train->params().hf_params()) {
        HostTensor a(DType::kF32, p.shape), b(DType::kF32, p.shape);
        model_read_param_hf(*inf, p.name, a.view());
        model_read_param_hf(*train, p.name, b.view());
        int64_t off = 0;
        for (int64_t i = 0; i < p.shape.numel(); ++i)
            off += a.as<float>()[i] != bf16_to_float(float_to_bf16(b.as<float>()[i]));
        EXPECT_EQ(off, 0) << p.name;
    }
    const HostTensor tok = random_ids(kB, kT, c.vocab_size, 31, false);
    HostTensor za(DType::kF32, Shape{kB, kT, c.vocab_size}), zb(DType::kF32, za.shape());
    inf->logits(za.view(), ModelBatch{tok.view(), {}, {}, {}});
    train->logits(zb.view(), ModelBatch{tok.view(), {}, {}, {}});
    EXPECT_EQ(std::memcmp(za.as<float>(), zb.as<float>(), za.view().bytes()), 0);
}

// ---- FP8 training (model.h, "FP8 linears"; model/fp8_state.h) ----
//
// A Llama of the shape of kFamilies' (every FP8 linear's width and the batch's B T = 192 tokens
// multiples of 16, as cuBLASLt's FP8 GEMMs want) with its four block roles in fp8 (tensorwise,
// delayed, blockwise), next to the same model in bf16.
//
// Tolerances. E4M3 keeps 3 mantissa bits: rounding to it moves a value by at most u4 = 2^-4
// of itself (half an ulp), E5M2 (the gradients) by u5 = 2^-3; over many elements the rounding
// is uniform in [-u, u]: rms u / sqrt(3). A GEMM output sums K products whose two operands
// were rounded independently: the relative rms error of each output element (errors of random
// sign adding in quadrature like the products themselves) is
//   forward (x, w E4M3):        e_f  = sqrt(2) u4 / sqrt(3)        = 0.051
//   dx, dW (dy E5M2, w/x E4M3): e_b  = sqrt(u5^2 + u4^2) / sqrt(3) = 0.081
//   (blockwise: dy E4M3 too,    e_b  = e_f; its finer scales only keep more values normal)
// (the fp32 accumulation and the bf16 output, 2^-8, are small beside them). The logits see
// every forward GEMM of the 2 layers, n_f = 6 L = 12 of them, each layer's error carried on
// through the residual stream with a gain of about 1: e_z = sqrt(n_f) e_f = 0.18 relative
// (rms); allowed: twice that. A parameter gradient carries the forward's errors and those of
// the backward GEMMs behind it (n_b = 6 L dx GEMMs, its own dW): e_g = sqrt(n_f e_f^2 +
// (n_b + 1) e_b^2) = 0.34; allowed: twice that. A wiring error (a wrong scale, operand or
// layout) gives errors of 1 or more; a linear silently in bf16 shows in the GEMM counter.
// The loss: per token CE(z + dz) - CE(z) = (p - e_t) . dz + r, |r| <= |dz|^2 / 4 (the Hessian of
// CE in z, diag(p) - p p^T, has norm <= 1/2), and |(p - e_t) . dz| <= sqrt(2) |dz|: so the mean
// loss moves by at most sqrt(2) mean|dz| + mean|dz|^2 / 4, with dz measured from the logits
// (Model::logits gives them rounded to bf16: that rounding only adds to the measured dz), plus
// 1e-3 of the loss for the two fp32 loss reductions' summation orders.
// Delayed scaling's first step casts with the initial scale 1 (Transformer Engine's too): the
// weights (std 0.02) land among E4M3's subnormals and most of the gradients (~1e-5) below
// E5M2's smallest; its comparison starts at step 2, with scales from the recorded amaxes.
constexpr const char* kFp8Llama = R"({"architectures": ["LlamaForCausalLM"],
  "model_type": "llama", "vocab_size": 384, "hidden_size": 128, "intermediate_size": 256,
  "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
  "max_position_embeddings": 128, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
  "tie_word_embeddings": false})";

class ModelFp8Gpu : public ::testing::TestWithParam<Fp8Recipe> {
protected:
    static void SetUpTestSuite() { state_ = new CudaState(0); }
    static void TearDownTestSuite() {
        delete state_;
        state_ = nullptr;
    }
    void SetUp() override {
        const std::string problem = cuda::fp8_support_problem(0);
        if (!problem.empty()) GTEST_SKIP() << problem;
    }
    static Model make(const ModelConfig& c, const Fp8Settings* fp8, uint64_t seed) {
        ModelShape shape{kB, kT, 0};
        if (fp8 != nullptr) {
            shape.precision = fp8_precision_policy(*fp8);
            shape.fp8 = *fp8;
        }
        Result<Model> m = Model::create(c, shape, state_->context());
        LATHE_CHECK(m.ok(), "{}", m.status().to_string());
        m->init(seed);
        return std::move(*m);
    }
    // TracksBf16OnTheSameWeightsAndCountsItsGemms for `f8` (with or without the LM head).
    static void tracks_bf16(const Fp8Settings& f8);
    static CudaState* state_;
};
CudaState* ModelFp8Gpu::state_ = nullptr;

// The settings of `recipe` as the config's defaults give them (blockwise: E4M3 gradients).
Fp8Settings recipe_settings(Fp8Recipe recipe) {
    Result<Fp8Settings> s =
        fp8_settings_parse(fp8_recipe_name(recipe), "auto", false, 16, "max", "test");
    LATHE_CHECK(s.ok(), "{}", s.status().to_string());
    return *s;
}

// The repeated training batch: random tokens, each target the next token.
struct Fp8Batch {
    HostTensor tok, tgt;
    ModelBatch batch() const { return ModelBatch{tok.view(), tgt.view(), {}, {}}; }
};
Fp8Batch fp8_batch(const ModelConfig& c) {
    Fp8Batch b{random_ids(kB, kT, c.vocab_size, 41, false), HostTensor(DType::kI32, Shape{kB, kT})};
    for (int64_t r = 0; r < kB; ++r)
        for (int64_t t = 0; t < kT; ++t)
            b.tgt.as<int32_t>()[r * kT + t] =
                t + 1 < kT ? b.tok.as<int32_t>()[r * kT + t + 1] : -100;
    return b;
}

// dst's master weights (and so its bf16 copy) set to src's.
void copy_params(const Model& src, Model& dst) {
    for (const ParamEntry& e : src.params().entries()) {
        HostTensor h(DType::kF32, e.shape);
        src.read_param_entry(e.arena_index, h.view());
        dst.write_param_entry(e.arena_index, h.view());
    }
}

// Each step: the bf16 model trains (AdamW); the fp8 model gets its weights, casts them once
// (the weight-cast counter) and runs the same batch: logits, loss and every gradient within the
// bounds above, and the FP8 GEMMs the linear ops counted equal to fp8_gemms_per_step.
void ModelFp8Gpu::tracks_bf16(const Fp8Settings& f8) {
    const ModelConfig c = parse(kFp8Llama);
    Model bf = make(c, nullptr, 21), f = make(c, &f8, 21);
    ASSERT_TRUE(f.fp8());
    ASSERT_FALSE(bf.fp8());
    EXPECT_EQ(f.fp8_scaling() != nullptr, f8.recipe == Fp8Recipe::kDelayed);
    TestAdamWMoments moments = TestAdamWMoments::of(bf);
    const Fp8Batch data = fp8_batch(c);
    const int64_t L = c.num_layers, V = c.vocab_size, N = kB * kT;
    const int64_t head = f8.lm_head ? 1 : 0;  // the LM head: one more FP8 linear
    const double u4 = 1.0 / 16, ug = f8.grad_dtype == DType::kE5M2 ? 1.0 / 8 : 1.0 / 16;
    const double e_f = std::sqrt(2.0 / 3.0) * u4, e_b = std::sqrt((ug * ug + u4 * u4) / 3.0);
    // n_f = 6 L (+ 1 with the head: the logits' own GEMM) forward GEMMs before the logits; a
    // gradient's chain has n_b = 6 L (+ 1: the head's dx) dx GEMMs and its own dW.
    const double n_f = 6.0 * L + head, n_b = 6.0 * L + head;
    const double z_tol = 2 * std::sqrt(n_f) * e_f;
    const double g_tol = 2 * std::sqrt(n_f * e_f * e_f + (n_b + 1) * e_b * e_b);
    HostTensor zb(DType::kF32, Shape{kB, kT, V}), zf(DType::kF32, Shape{kB, kT, V});
    int64_t casts = f.fp8_weight_casts();
    EXPECT_EQ(casts, 0);
    for (int step = 1; step <= 6; ++step) {
        copy_params(bf, f);
        f.fp8_weights_updated();
        bf.logits(zb.view(), data.batch());
        f.logits(zf.view(), data.batch());
        EXPECT_EQ(f.fp8_weight_casts() - casts, kFp8LinearsPerLayer * L + head) << "step " << step;
        casts = f.fp8_weight_casts();
        // The head's logits run in one chunk here (B T = 192 rows): one GEMM.
        EXPECT_EQ(f.fp8_take_gemms(), kFp8LinearsPerLayer * L + head)
            << "the logits' forward, step " << step;
        bf.zero_grads();
        f.zero_grads();
        const float lb = bf.forward_backward(data.batch());
        const float lf = f.forward_backward(data.batch());
        f.fp8_end_step();
        // Delayed: the training forward casts the weights again (the logits' cast recorded no
        // amax, model.h); the other recipes keep the logits' codes.
        const int64_t recast =
            f8.recipe == Fp8Recipe::kDelayed ? kFp8LinearsPerLayer * L + head : 0;
        EXPECT_EQ(f.fp8_weight_casts(), casts + recast) << "step " << step;
        casts = f.fp8_weight_casts();
        EXPECT_EQ(f.fp8_take_gemms(), fp8_gemms_per_step(L, f8, 1)) << "step " << step;
        EXPECT_EQ(bf.fp8_take_gemms(), 0);
        // Logits: rel-L2 over all of them; per token |dz| for the loss bound.
        double num = 0, den = 0, dz_sum = 0, dz2_sum = 0;
        int64_t counted = 0;
        for (int64_t n = 0; n < N; ++n) {
            double d2 = 0;
            for (int64_t v = 0; v < V; ++v) {
                const double a = zf.as<float>()[n * V + v], b = zb.as<float>()[n * V + v];
                d2 += (a - b) * (a - b);
                den += b * b;
            }
            num += d2;
            if (data.tgt.as<int32_t>()[n] >= 0) {
                dz_sum += std::sqrt(d2);
                dz2_sum += d2;
                ++counted;
            }
        }
        const double z_err = std::sqrt(num / den);
        const double loss_tol =
            std::sqrt(2.0) * dz_sum / double(counted) + dz2_sum / double(counted) / 4 + 1e-3 * lb;
        const std::vector<float> gb = device_floats(bf.grads_flat(), state_->stream()),
                                 gf = device_floats(f.grads_flat(), state_->stream());
        const double g_err = rel_l2(gf.data(), gb.data(), int64_t(gb.size()));
        std::printf(
            "[fp8-vs-bf16] %-10s%s step %d loss %.5f vs %.5f (allowed %.2e)  logits rel-L2 %.3f "
            "(allowed %.3f)  gradients rel-L2 %.3f (allowed %.3f)\n",
            std::string(fp8_recipe_name(f8.recipe)).c_str(), head ? " +head" : "", step, lf, lb,
            loss_tol, z_err, z_tol, g_err, g_tol);
        if (f8.recipe != Fp8Recipe::kDelayed || step >= 2) {
            EXPECT_LT(z_err, z_tol) << "step " << step;
            EXPECT_NEAR(lf, lb, loss_tol) << "step " << step;
            EXPECT_LT(g_err, g_tol) << "step " << step;
        }
        bf.grad_norm();
        moments.step(bf, bf.adamw_segments(3e-3, 0.1), AdamWHyper{}, step, 1.0f);
    }
}

TEST_P(ModelFp8Gpu, TracksBf16OnTheSameWeightsAndCountsItsGemms) {
    tracks_bf16(recipe_settings(GetParam()));
}

// fp8.lm_head: the LM head's three GEMMs in FP8 too (ops/cuda/lm_head_cross_entropy.h): the
// same comparison with the head counted as one more FP8 linear in the bounds, the GEMM count and
// the weight casts; and the repeated batch learnt.
class ModelFp8HeadGpu : public ModelFp8Gpu {};
TEST_P(ModelFp8HeadGpu, TracksBf16WithTheLmHeadInFp8) {
    Fp8Settings f8 = recipe_settings(GetParam());
    f8.lm_head = true;
    tracks_bf16(f8);
}

TEST_P(ModelFp8HeadGpu, LearnsTheRepeatedBatchWithTheLmHeadInFp8) {
    const ModelConfig c = parse(kFp8Llama);
    Fp8Settings f8 = recipe_settings(GetParam());
    f8.lm_head = true;
    Model f = make(c, &f8, 23);
    TestAdamWMoments moments = TestAdamWMoments::of(f);
    const Fp8Batch data = fp8_batch(c);
    std::vector<float> losses;
    for (int step = 1; step <= 8; ++step) {
        f.zero_grads();
        losses.push_back(f.forward_backward(data.batch()));
        f.fp8_end_step();
        EXPECT_EQ(f.fp8_take_gemms(), fp8_gemms_per_step(c.num_layers, f8, 1));
        EXPECT_EQ(f.fp8_weight_casts(), (kFp8LinearsPerLayer * c.num_layers + 1) * step)
            << "step " << step;
        f.grad_norm();
        moments.step(f, f.adamw_segments(3e-3, 0.1), AdamWHyper{}, step, 1.0f);
        f.fp8_weights_updated();
        std::printf("[fp8-train] %-10s +head step %d loss %.5f\n",
                    std::string(fp8_recipe_name(f8.recipe)).c_str(), step, losses.back());
    }
    EXPECT_LT(losses.back(), losses.front() - 0.3f);
    if (const Fp8ScalingState* s = f.fp8_scaling()) {
        ASSERT_EQ(s->tensors(), fp8_tensor_count(c.num_layers, f8));
        for (int64_t t = 0; t < s->tensors(); ++t) EXPECT_NE(s->scale(t), 1.0f) << "tensor " << t;
    }
}

// The same with every linear in FP8, the LM head included, for each recipe.
TEST_P(ModelFp8HeadGpu, DeferredClearingGivesTheClearedGradients) {
    const ModelConfig c = parse(kFp8Llama);
    Fp8Settings f8 = recipe_settings(GetParam());
    f8.lm_head = true;
    Model f = make(c, &f8, 24);
    expect_deferred_clearing_matches(f, c, state_->stream(), 0x1p-14);
}

// The fp8 model trains by itself (its own AdamW, told of each update as TrainStep tells it):
// the repeated batch is learnt as the bf16 model learns it (LossesTrackTheCpuOverAdamWSteps asks
// a drop of 0.3 in 8 steps), and the weights are cast once per step.
TEST_P(ModelFp8Gpu, LearnsTheRepeatedBatchCastingWeightsOncePerStep) {
    const ModelConfig c = parse(kFp8Llama);
    const Fp8Settings f8 = recipe_settings(GetParam());
    Model f = make(c, &f8, 22);
    TestAdamWMoments moments = TestAdamWMoments::of(f);
    const Fp8Batch data = fp8_batch(c);
    constexpr int64_t K = 2;  // two micro-batches a step: counts and amaxes over both
    std::vector<float> losses;
    for (int step = 1; step <= 8; ++step) {
        f.zero_grads();
        float loss = 0;
        for (int64_t k = 0; k < K; ++k) loss += f.forward_backward(data.batch(), 1.0f / K) / K;
        f.fp8_end_step();
        losses.push_back(loss);
        EXPECT_EQ(f.fp8_take_gemms(), fp8_gemms_per_step(c.num_layers, f8, K));
        EXPECT_EQ(f.fp8_weight_casts(), kFp8LinearsPerLayer * c.num_layers * step)
            << "step " << step;
        f.grad_norm();
        moments.step(f, f.adamw_segments(3e-3, 0.1), AdamWHyper{}, step, 1.0f);
        f.fp8_weights_updated();
        std::printf("[fp8-train] %-10s step %d loss %.5f\n",
                    std::string(fp8_recipe_name(f8.recipe)).c_str(), step, loss);
    }
    EXPECT_LT(losses.back(), losses.front() - 0.3f);
    if (const Fp8ScalingState* s = f.fp8_scaling()) {
        // Every scaled tensor was seen: every scale came from an amax (none kept the initial 1).
        for (int64_t t = 0; t < s->tensors(); ++t) EXPECT_NE(s->scale(t), 1.0f) << "tensor " << t;
    }
}

// Delayed scaling resumes bit for bit: a model given another's weights and its saved scaling
// state computes the next step with the same loss and gradient bits and reaches the same state.
// (The delayed recipe alone has a scaling state: a test of the fixture, not of each recipe.)
using ModelFp8DelayedGpu = ModelFp8Gpu;
TEST_F(ModelFp8DelayedGpu, StateSavedAndLoadedGivesTheSameNextStepBits) {
    const ModelConfig c = parse(kFp8Llama);
    Fp8Settings f8;
    f8.recipe = Fp8Recipe::kDelayed;
    f8.amax_history = 4;
    Model a = make(c, &f8, 23), b = make(c, &f8, 99);
    TestAdamWMoments moments = TestAdamWMoments::of(a);
    const Fp8Batch data = fp8_batch(c);
    for (int step = 1; step <= 3; ++step) {
        a.zero_grads();
        a.forward_backward(data.batch());
        a.fp8_end_step();
        a.grad_norm();
        moments.step(a, a.adamw_segments(3e-3, 0.1), AdamWHyper{}, step, 1.0f);
        a.fp8_weights_updated();
    }
    const std::string path = ::testing::TempDir() + "/fp8_scaling_resume.json";
    ASSERT_TRUE(a.fp8_scaling()->save(path).ok());
    // Both bf16 copies from the masters the same way (as a checkpoint load writes them).
    copy_params(a, a);
    copy_params(a, b);
    ASSERT_FALSE(*b.fp8_scaling() == *a.fp8_scaling());
    ASSERT_TRUE(b.fp8_scaling()->load(path).ok());
    b.fp8_upload_scales();
    EXPECT_TRUE(*b.fp8_scaling() == *a.fp8_scaling());
    for (Model* m : {&a, &b}) m->zero_grads();
    const float la = a.forward_backward(data.batch()), lb = b.forward_backward(data.batch());
    a.fp8_end_step();
    b.fp8_end_step();
    EXPECT_EQ(std::bit_cast<uint32_t>(la), std::bit_cast<uint32_t>(lb)) << la << " vs " << lb;
    const std::vector<float> ga = device_floats(a.grads_flat(), state_->stream()),
                             gb = device_floats(b.grads_flat(), state_->stream());
    EXPECT_EQ(std::memcmp(ga.data(), gb.data(), ga.size() * sizeof(float)), 0);
    EXPECT_TRUE(*b.fp8_scaling() == *a.fp8_scaling());
    std::remove(path.c_str());
}

// A forward outside the training steps changes no step's bits (model.h, "FP8 linears"): two
// delayed-scaling models of the same weights train 4 steps; one runs eval_forward and logits
// of another batch between each step's optimizer update and the next step (as the trainer's
// validation pass does), the other does not. Every step's loss and gradients, and the scaling
// state after it, are the same bits.
TEST_F(ModelFp8DelayedGpu, EvalForwardsBetweenStepsLeaveTheTrainingBits) {
    const ModelConfig c = parse(kFp8Llama);
    Fp8Settings f8;
    f8.recipe = Fp8Recipe::kDelayed;
    f8.amax_history = 4;
    Model a = make(c, &f8, 24), b = make(c, &f8, 24);
    TestAdamWMoments ma = TestAdamWMoments::of(a), mb = TestAdamWMoments::of(b);
    const Fp8Batch data = fp8_batch(c);
    // The validation batch: other tokens, so its activations' amaxes differ from the training
    // batch's (recorded, they would change the next step's scales and so its bits).
    Fp8Batch valid{random_ids(kB, kT, c.vocab_size, 77, false),
                   HostTensor(DType::kI32, Shape{kB, kT})};
    for (int64_t i = 0; i < kB * kT; ++i) valid.tgt.as<int32_t>()[i] = valid.tok.as<int32_t>()[i];
    HostTensor z(DType::kF32, Shape{kB, kT, c.vocab_size});
    for (int step = 1; step <= 4; ++step) {
        if (step > 1) {
            const float v = b.eval_forward(valid.batch());
            EXPECT_TRUE(std::isfinite(v)) << "step " << step;
            b.logits(z.view(), valid.batch());
            b.fp8_take_gemms();
        }
        for (Model* m : {&a, &b}) m->zero_grads();
        const float la = a.forward_backward(data.batch()), lb = b.forward_backward(data.batch());
        a.fp8_end_step();
        b.fp8_end_step();
        EXPECT_EQ(std::bit_cast<uint32_t>(la), std::bit_cast<uint32_t>(lb))
            << "step " << step << ": " << la << " vs " << lb;
        const std::vector<float> ga = device_floats(a.grads_flat(), state_->stream()),
                                 gb = device_floats(b.grads_flat(), state_->stream());
        EXPECT_EQ(std::memcmp(ga.data(), gb.data(), ga.size() * sizeof(float)), 0)
            << "step " << step;
        EXPECT_TRUE(*b.fp8_scaling() == *a.fp8_scaling()) << "step " << step;
        a.grad_norm();
        b.grad_norm();
        ma.step(a, a.adamw_segments(3e-3, 0.1), AdamWHyper{}, step, 1.0f);
        mb.step(b, b.adamw_segments(3e-3, 0.1), AdamWHyper{}, step, 1.0f);
        a.fp8_weights_updated();
        b.fp8_weights_updated();
    }
    // The eval forwards ran in fp8 (their amaxes went somewhere): b cast more weights than a.
    EXPECT_GT(b.fp8_weight_casts(), a.fp8_weight_casts());
}

INSTANTIATE_TEST_SUITE_P(Recipes, ModelFp8Gpu,
                         ::testing::Values(Fp8Recipe::kTensorwise, Fp8Recipe::kDelayed,
                                           Fp8Recipe::kBlockwise),
                         [](const ::testing::TestParamInfo<Fp8Recipe>& info) {
                             return std::string(fp8_recipe_name(info.param));
                         });

INSTANTIATE_TEST_SUITE_P(Recipes, ModelFp8HeadGpu,
                         ::testing::Values(Fp8Recipe::kTensorwise, Fp8Recipe::kDelayed),
                         [](const ::testing::TestParamInfo<Fp8Recipe>& info) {
                             return std::string(fp8_recipe_name(info.param));
                         });

// A shape whose attention backward asks for more workspace than the scratch dead during attention
// (head_dim 128, 4 key blocks, a small MLP and LM-head chunk: about 2.6x by the plan's estimate):
// the model caps the backward at that scratch (MemoryPlan::attention_backward_cap, its Context's
// attention_backward_workspace_cap), so it runs in batch chunks and the plan holds cuDNN's
// chunked workspace, less than the whole batch's; a step grows nothing, and the step still agrees
// with the CPU reference (the chunked call gives the whole call's bits: ops/cuda/attention_test.cu,
// ChunkedBackwardGivesTheWholeBatchsBits*).
TEST(ModelGpuAttentionMemory, TheBackwardRunsInBatchChunksWithinTheDeadScratch) {
    const ModelConfig c = parse(R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
      "vocab_size": 384, "hidden_size": 256, "intermediate_size": 64, "num_hidden_layers": 2,
      "num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": 512,
      "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": false})");
    const int64_t B = 4, T = 512;
    CudaState state(0);
    ModelShape shape{B, T, 16};  // 16 rows of logits a chunk
    Result<Model> cpu = Model::create(c, shape, cpu_context());
    Result<Model> gpu = Model::create(c, shape, state.context());
    ASSERT_TRUE(cpu.ok() && gpu.ok()) << cpu.status().to_string() << gpu.status().to_string();
    const MemoryPlan& plan = gpu->plan();
    EXPECT_EQ(gpu->context().attention_backward_workspace_cap, plan.attention_backward_cap);
    // What one call on the whole batch asks for (a state of its own: the model's holds the
    // chunked graphs).
    size_t whole = 0;
    {
        CudaState other(0);
        cuda::AttentionShape s;
        s.B = B, s.T = T, s.H = c.num_heads, s.Hkv = c.num_kv_heads, s.D = c.head_dim;
        s.scale = block_attention_scale(c);
        whole = cuda::attention_workspace_bytes(other, s);
    }
    std::printf("[attention-chunks] whole batch %zu B, chunked %zu B, dead scratch %zu B\n", whole,
                plan.attention_workspace, plan.attention_backward_cap);
    ASSERT_GT(whole, plan.attention_backward_cap) << "the shape must need chunks";
    EXPECT_LT(plan.attention_workspace, whole);
    EXPECT_EQ(plan.attention_bytes,
              std::max(plan.attention_backward_cap, plan.attention_workspace));
    EXPECT_EQ(cuda::attention_buffer_bytes(state), 0u) << "the lent scratch holds the workspace";

    cpu->init(21);
    gpu->init(21);
    const HostTensor tok = random_ids(B, T, c.vocab_size, 22, false);
    const HostTensor tgt = random_ids(B, T, c.vocab_size, 23, true);
    const ModelBatch batch{tok.view(), tgt.view(), {}, {}};
    cpu->zero_grads();
    gpu->zero_grads();
    const float loss_cpu = cpu->forward_backward(batch);
    const float loss_gpu = gpu->forward_backward(batch);
    gpu->synchronize();
    const size_t before = cuda_memory_info(0).free_bytes;
    gpu->zero_grads();
    EXPECT_EQ(gpu->forward_backward(batch), loss_gpu) << "deterministic";
    gpu->synchronize();
    EXPECT_EQ(cuda_memory_info(0).free_bytes, before) << "a step allocates nothing";
    EXPECT_EQ(cuda::attention_buffer_bytes(state), 0u);
    std::string worst;
    const double grad_err = worst_tensor_error(*cpu, *gpu, true, &worst);
    std::printf("[attention-chunks] loss %.6f vs %.6f, worst grad rel-L2 %.2e (%s)\n", loss_gpu,
                loss_cpu, grad_err, worst.c_str());
    // The tolerances of OneTrainingStepMatchesTheCpuReference (two layers; derived there).
    EXPECT_NEAR(loss_gpu, loss_cpu, 4e-3 * loss_cpu);
    EXPECT_LT(grad_err, 5e-2) << worst;
}

INSTANTIATE_TEST_SUITE_P(Families, ModelGpu, ::testing::ValuesIn(kFamilies),
                         [](const ::testing::TestParamInfo<Family>& info) {
                             return std::string(info.param.name);
                         });

}  // namespace
}  // namespace lathe
