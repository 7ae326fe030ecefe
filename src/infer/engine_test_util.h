#pragma once
// Test helper of src/infer's CPU tests: a transformers parity fixture (tests/fixtures/models)
// loaded into an f32 CPU Model, its first token row, the logits of one full forward over it, and
// the tolerance an engine's logits are held to. Tolerance: the engine and Model::logits run the
// same f32 ops and differ only in summation order (attention over a cache, the decode kernel,
// GEMM shapes); each of the L blocks and the LM head adds an error of at most about K eps
// relative to the logits' scale, K the longest reduction (F, C or the sequence): (L + 1) K eps.
#include <algorithm>
#include <limits>
#include <string>
#include <vector>

#include "core/check.h"
#include "model/model.h"
#include "model/model_fixture_test_util.h"
#include "model/model_io.h"

namespace lathe::engine_test {

struct Loaded {
    model_fixture::Fixture f;
    Model model;
    std::vector<int32_t> tokens;  // row 0 of the fixture's batch
    HostTensor logits;            // (1, T, V) of Model::logits
    double tol = 0;
};

inline Loaded load(const std::string& name) {
    model_fixture::Fixture f = model_fixture::load(name);
    ModelShape shape;
    shape.batch = 1;
    shape.seq_len = f.T;
    shape.training = false;
    Result<Model> m = Model::create(f.config, shape, Context{});
    LATHE_CHECK(m.ok(), "{}", m.status().to_string());
    Status s = model_load_hf(*m, f.weights);
    LATHE_CHECK(s.ok(), "{}", s.to_string());
    const int32_t* t = f.ref("tokens").as<int32_t>();
    std::vector<int32_t> tokens(t, t + f.T);
    HostTensor logits(DType::kF32, Shape{1, f.T, f.config.vocab_size});
    m->logits(
        logits.view(),
        ModelBatch{
            ConstTensorView(tokens.data(), DType::kI32, Shape{1, f.T}, Device::kCpu), {}, {}, {}});
    const ModelConfig& c = f.config;
    const int64_t K = std::max({c.intermediate_size, c.hidden_size, f.T});
    const double tol = double(c.num_layers + 1) * double(K) * std::numeric_limits<float>::epsilon();
    return Loaded{std::move(f), std::move(*m), std::move(tokens), std::move(logits), tol};
}

}  // namespace lathe::engine_test
