#pragma once
// The transformers parity fixtures (tests/fixtures/models/<family>, made by
// tests/reference/make_model_fixtures.py) as the CPU and GPU parity tests load them: config,
// weights, transformers' reference tensors (logits, loss, gradients, AdamW losses) and the batch.
// Test code only. The fixtures are found under $LATHE_SOURCE_DIR (set it when a test binary runs
// on another machine from a copy of the repository), else the source folder the test was built
// from (the LATHE_SOURCE_DIR definition).

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>

#include "core/check.h"
#include "io/file.h"
#include "io/safetensors.h"
#include "model/model.h"
#include "model/registry.h"

namespace lathe::model_fixture {

inline std::string dir(const std::string& name) {
    const char* env = std::getenv("LATHE_SOURCE_DIR");
    return std::string(env != nullptr ? env : LATHE_SOURCE_DIR) + "/tests/fixtures/models/" + name;
}

// max |a - b| / max |b| over two f32 tensors of the same size (elements near zero are judged
// against the tensor's scale, as a reduction's rounding is).
inline double rel_error(ConstTensorView a, ConstTensorView b) {
    LATHE_CHECK(a.numel() == b.numel(), "rel_error of {} and {}", a.to_string(), b.to_string());
    const float* x = a.as<float>();
    const float* y = b.as<float>();
    double diff = 0.0, scale = 0.0;
    for (int64_t i = 0; i < a.numel(); ++i) {
        diff = std::max(diff, std::abs(double(x[i]) - double(y[i])));
        scale = std::max(scale, std::abs(double(y[i])));
    }
    return scale == 0.0 ? diff : diff / scale;
}

struct Fixture {
    ModelConfig config;
    nlohmann::json meta;
    SafetensorsCheckpoint weights;
    SafetensorsFile reference;
    int64_t B = 0, T = 0;

    ConstTensorView ref(const std::string& name) const {
        Result<const SafetensorsTensor*> t = reference.get(name);
        LATHE_CHECK(t.ok(), "{}", t.status().to_string());
        Result<ConstTensorView> v = (*t)->view();
        LATHE_CHECK(v.ok(), "{}", v.status().to_string());
        return *v;
    }
    ModelBatch batch() const {
        ModelBatch b{ref("tokens"), ref("targets"), {}, {}};
        if (meta.at("packed").get<bool>()) {
            b.docs = ref("docs");
            b.positions = ref("positions");
        }
        return b;
    }
};

inline Fixture load(const std::string& name) {
    const std::string d = dir(name);
    Result<ModelConfig> config = model_config_from_hf_file(d + "/config.json");
    LATHE_CHECK(config.ok(), "{}", config.status().to_string());
    Result<std::string> meta_text = file_read_all(d + "/reference.json");
    LATHE_CHECK(meta_text.ok(), "{}", meta_text.status().to_string());
    Result<SafetensorsCheckpoint> weights = SafetensorsCheckpoint::open(d + "/model.safetensors");
    LATHE_CHECK(weights.ok(), "{}", weights.status().to_string());
    Result<SafetensorsFile> reference = SafetensorsFile::open(d + "/reference.safetensors");
    LATHE_CHECK(reference.ok(), "{}", reference.status().to_string());
    Fixture f{std::move(*config), nlohmann::json::parse(*meta_text), std::move(*weights),
              std::move(*reference)};
    f.B = f.meta.at("batch").get<int64_t>();
    f.T = f.meta.at("seq_len").get<int64_t>();
    return f;
}

}  // namespace lathe::model_fixture
