// The CPU experiment behind the AdamW tolerances of src/model/model_gpu_test.cu
// (LossesTrackTheCpuOverAdamWSteps) and src/model/model_parity_gpu_test.cu
// (TenAdamWStepsTrackTorchLosses): how far two AdamW runs drift apart when one run's gradients
// carry an error of relative size s. Model A steps on exact CPU gradients; model B on the same
// gradients plus Gaussian noise of rel-L2 s per parameter tensor (sigma = s * rms(tensor)) on
// every nonzero element (a gradient that is exactly zero, an embedding row no token of the batch
// uses, is zero on the GPU too). Printed over R noise seeds: the parameter rel-L2 after the 8
// steps of model_gpu_test's protocol and its worst step loss, and the worst step loss of the
// parity fixtures' 10 steps.
//
// Build against a configured build folder (no CMake target: it is run by hand): in build/,
//   c++ -std=c++20 -O2 -fopenmp -DLATHE_HAVE_CUDA=1 -DFMT_SHARED -DLATHE_SOURCE_DIR='"'$PWD/..'"'
//   -I../src -isystem /usr/local/cuda/include ../bench/adamw_drift.cpp -o adamw_drift
//   followed by the LINK_LIBRARIES of optim_tests in build.ninja.
//   ./adamw_drift S R      (S: the gradient noise rel-L2, R: seeds)
//
// Results (10 seeds, s = 3e-4, 1e-3, 4e-3, 1e-2, 2.6e-2): parameters after 8 steps at most
// 0.48 sqrt(s) (mistral 0.20-0.40 sqrt(s)), model_gpu_test's step losses 0.075 sqrt(s), the
// parity fixtures' step losses 0.22 sqrt(s) (mistral 0.07-0.14 sqrt(s)).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "model/model.h"
#include "model/model_fixture_test_util.h"
#include "model/model_io.h"
#include "model/registry.h"
#include "optim/adamw_optimizer.h"

using namespace lathe;

static AdamWOptimizer optimizer_for(const Model& m) {
    Result<AdamWOptimizer> o = AdamWOptimizer::create_for(m);
    LATHE_CHECK(o.ok(), "{}", o.status().to_string());
    return std::move(*o);
}

static const char* kFamilies[][2] = {
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

HostTensor random_ids(int64_t B, int64_t T, int64_t n, uint64_t salt, bool some_ignored) {
    HostTensor t(DType::kI32, Shape{B, T});
    uint64_t x = 0x9E3779B97F4A7C15ull ^ salt;
    for (int64_t i = 0; i < B * T; ++i) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        t.as<int32_t>()[i] = some_ignored && x % 11 == 0 ? -100 : int32_t(x % uint64_t(n));
    }
    return t;
}

double rel_l2(const float* a, const float* b, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; ++i) {
        num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
        den += double(b[i]) * b[i];
    }
    return std::sqrt(num / den);
}

void add_noise(Model& m, double s, std::mt19937_64& rng) {
    std::normal_distribution<double> n(0.0, 1.0);
    for (size_t i = 0; i < m.params().entries().size(); ++i) {
        TensorView g = m.grad_entry(i);
        float* p = g.as<float>();
        double ss = 0;
        for (int64_t k = 0; k < g.numel(); ++k) ss += double(p[k]) * p[k];
        const double sigma = s * std::sqrt(ss / double(g.numel()));
        for (int64_t k = 0; k < g.numel(); ++k) {
            const double z = n(rng);
            if (p[k] != 0.0f) p[k] = float(p[k] + sigma * z);
        }
    }
}

Model make(const ModelConfig& c, int64_t B, int64_t T) {
    Result<Model> m = Model::create(c, ModelShape{B, T, 0}, cpu_context());
    LATHE_CHECK(m.ok(), "{}", m.status().to_string());
    return std::move(*m);
}

int main(int argc, char** argv) {
    const double s = argc > 1 ? std::atof(argv[1]) : 1.4e-2;
    const int R = argc > 2 ? std::atoi(argv[2]) : 10;
    std::printf("gradient noise rel-L2 per tensor s = %.2e, %d seeds\n", s, R);
    // model_gpu_test: LossesTrackTheCpuOverAdamWSteps
    for (auto& fam : kFamilies) {
        Result<ModelConfig> c = model_config_from_hf_json(fam[1], "x/config.json");
        LATHE_CHECK(c.ok());
        std::vector<double> perr, lerr;
        for (int r = 0; r < R; ++r) {
            std::mt19937_64 rng(1000 + r);
            Model a = make(*c, kB, kT), b = make(*c, kB, kT);
            a.init(12);
            b.init(12);
            AdamWOptimizer oa = optimizer_for(a), ob = optimizer_for(b);
            double worst_loss = 0;
            for (int step = 1; step <= 8; ++step) {
                const HostTensor tok = random_ids(kB, kT, c->vocab_size, 100 + step % 2, false);
                HostTensor tgt(DType::kI32, Shape{kB, kT});
                for (int64_t bb = 0; bb < kB; ++bb)
                    for (int64_t t = 0; t < kT; ++t)
                        tgt.as<int32_t>()[bb * kT + t] =
                            t + 1 < kT ? tok.as<int32_t>()[bb * kT + t + 1] : -100;
                const ModelBatch batch{tok.view(), tgt.view(), {}, {}};
                float la = 0, lb = 0;
                for (Model* m : {&a, &b}) {
                    m->zero_grads();
                    const float l = m->forward_backward(batch);
                    (m == &a ? la : lb) = l;
                    if (m == &b) add_noise(b, s, rng);
                    m->grad_norm();
                    (m == &a ? oa : ob)
                        .step(optimizer_target(*m), m->adamw_segments(3e-3, 0.1), AdamWHyper{},
                              step, 1.0f);
                }
                worst_loss = std::max(worst_loss, std::abs(double(lb) - la) / la);
            }
            perr.push_back(rel_l2(b.params_flat().as<float>(), a.params_flat().as<float>(),
                                  a.params_flat().numel()));
            lerr.push_back(worst_loss);
        }
        std::sort(perr.begin(), perr.end());
        std::sort(lerr.begin(), lerr.end());
        std::printf(
            "[model_gpu_test] %-9s params after 8 steps rel-L2: median %.2e max %.2e | step loss "
            "rel: median %.2e max %.2e\n",
            fam[0], perr[perr.size() / 2], perr.back(), lerr[lerr.size() / 2], lerr.back());
    }
    // model_parity_gpu_test: TenAdamWStepsTrackTorchLosses (CPU exact vs CPU noisy)
    for (const char* name : {"llama", "llama_bias_packed", "mistral", "qwen2", "gpt_neox",
                             "gpt_neox_sequential", "gpt2"}) {
        const model_fixture::Fixture f = model_fixture::load(name);
        const nlohmann::json& h = f.meta.at("adamw");
        const AdamWHyper hyper{h.at("beta1").get<double>(), h.at("beta2").get<double>(),
                               h.at("eps").get<double>()};
        std::vector<double> rel_worst, floor_worst, final_rel;
        for (int r = 0; r < R; ++r) {
            std::mt19937_64 rng(2000 + r);
            Model a = make(f.config, f.B, f.T), b = make(f.config, f.B, f.T);
            LATHE_CHECK(model_load_hf(a, f.weights).ok() && model_load_hf(b, f.weights).ok());
            AdamWOptimizer oa = optimizer_for(a), ob = optimizer_for(b);
            const auto seg =
                a.adamw_segments(h.at("lr").get<double>(), h.at("weight_decay").get<double>());
            const ModelBatch batch = f.batch();
            double wr = 0, wf = 0;
            for (int step = 1; step <= 10; ++step) {
                float la = 0, lb = 0;
                for (Model* m : {&a, &b}) {
                    m->zero_grads();
                    const float l = m->forward_backward(batch);
                    (m == &a ? la : lb) = l;
                    if (m == &b) add_noise(b, s, rng);
                    (m == &a ? oa : ob).step(optimizer_target(*m), seg, hyper, step);
                }
                wr = std::max(wr, std::abs(double(lb) - la) / la);
                wf = std::max(wf, std::abs(double(lb) - la) / std::max(double(la), 0.5));
            }
            const float fa = a.forward(batch), fb = b.forward(batch);
            rel_worst.push_back(wr);
            floor_worst.push_back(wf);
            final_rel.push_back(std::abs(double(fb) - fa) / fa);
        }
        std::sort(rel_worst.begin(), rel_worst.end());
        std::sort(floor_worst.begin(), floor_worst.end());
        std::sort(final_rel.begin(), final_rel.end());
        std::printf(
            "[parity] %-20s worst step loss rel: median %.2e max %.2e | rel to max(L,0.5): median "
            "%.2e max %.2e | final rel: median %.2e max %.2e\n",
            name, rel_worst[R / 2], rel_worst.back(), floor_worst[R / 2], floor_worst.back(),
            final_rel[R / 2], final_rel.back());
    }
}
