// Model I/O on the CPU: save and load of every family round trip bit for bit (and a saved model
// saves again to the same bytes), load errors name the checkpoint file and the tensor, the
// HF-name accessors touch only their rows of a shared arena entry, and the host staging objects
// (ParamStaging, BatchStaging) as the CPU uses them.

#include "model/model_io.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/check.h"
#include "io/safetensors.h"
#include "model/batch_staging.h"
#include "model/model.h"
#include "model/param_staging.h"
#include "model/registry.h"
#include "model/tiny_model_test_util.h"

namespace lathe {
namespace {

namespace fs = std::filesystem;

// One small config per family: GQA and rope scaling (Llama), a sliding window (Mistral), q/k/v
// biases and tied embeddings (Qwen2), interleaved qkv with partial rotary (GPT-NeoX), Conv1D
// weights stored transposed (GPT-2).
constexpr std::string_view kFamilies[] = {
    R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 32,
        "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": false,
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 16}})",
    R"({"architectures": ["MistralForCausalLM"], "model_type": "mistral",
        "vocab_size": 48, "hidden_size": 32, "intermediate_size": 40, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 32,
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "sliding_window": 4,
        "tie_word_embeddings": false})",
    R"({"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
        "vocab_size": 56, "hidden_size": 32, "intermediate_size": 40, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 32,
        "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "tie_word_embeddings": true,
        "use_sliding_window": false})",
    R"({"architectures": ["GPTNeoXForCausalLM"], "model_type": "gpt_neox",
        "vocab_size": 40, "hidden_size": 24, "intermediate_size": 40, "num_hidden_layers": 1,
        "num_attention_heads": 3, "max_position_embeddings": 16, "rotary_pct": 0.5,
        "use_parallel_residual": true})",
    R"({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
        "vocab_size": 50, "n_embd": 16, "n_layer": 1, "n_head": 2, "n_positions": 12})",
};

using tiny_model::parse;

Model make(const ModelConfig& config, uint64_t seed) {
    ModelShape shape;
    shape.batch = 1;
    shape.seq_len = 4;
    Result<Model> m = Model::create(config, shape, cpu_context());
    LATHE_CHECK(m.ok(), "{}", m.status().to_string());
    m->init(seed);
    return std::move(*m);
}

std::string slurp(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::ostringstream s;
    s << in.rdbuf();
    return s.str();
}

std::string fresh_dir(const std::string& name) {
    const std::string dir = testing::TempDir() + "lathe_model_io_" + name;
    fs::remove_all(dir);
    fs::create_directories(dir);
    return dir;
}

TEST(ModelIo, EveryFamilySavesLoadsAndSavesAgainToTheSameBytes) {
    for (std::string_view json : kFamilies) {
        const ModelConfig c = parse(json);
        const Model src = make(c, 42);
        const std::string a = fresh_dir(c.model_type + "_a"), b = fresh_dir(c.model_type + "_b");
        ASSERT_TRUE(model_save_hf(src, a).ok()) << c.model_type;
        Result<SafetensorsCheckpoint> ckpt = SafetensorsCheckpoint::open(a);
        ASSERT_TRUE(ckpt.ok()) << ckpt.status().to_string();
        // The file holds each parameter as the HF accessor reads it, in f32.
        for (const HfParam& p : src.params().hf_params()) {
            Result<const SafetensorsTensor*> t = ckpt->tensor(p.name);
            ASSERT_TRUE(t.ok()) << p.name;
            ASSERT_EQ((*t)->dtype, SafetensorsDtype::kF32) << p.name;
            HostTensor want(DType::kF32, p.shape);
            model_read_param_hf(src, p.name, want.view());
            ASSERT_EQ((*t)->nbytes(), want.view().bytes()) << p.name;
            EXPECT_EQ(0, std::memcmp((*t)->data, want.as<float>(), (*t)->nbytes())) << p.name;
        }
        Model dst = make(c, 5);  // other values first: the load must replace every one
        const Status loaded = model_load_hf(dst, *ckpt);
        ASSERT_TRUE(loaded.ok()) << loaded.to_string();
        const ConstTensorView x = src.params_flat(), y = dst.params_flat();
        ASSERT_EQ(x.bytes(), y.bytes());
        EXPECT_EQ(0, std::memcmp(x.data(), y.data(), x.bytes())) << c.model_type;
        ASSERT_TRUE(model_save_hf(dst, b).ok());
        for (const char* file : {"model.safetensors", "config.json"})
            EXPECT_EQ(slurp(a + "/" + file), slurp(b + "/" + file)) << c.model_type << " " << file;
        fs::remove_all(a);
        fs::remove_all(b);
    }
}

// A checkpoint whose tensors are the model's, with `replace` swapped in under its name.
std::string write_with(const Model& m, const std::string& dir, const std::string& replace,
                       const SafetensorsWriteTensor& with) {
    std::vector<HostTensor> keep;
    keep.reserve(m.params().hf_params().size());
    std::vector<SafetensorsWriteTensor> tensors;
    for (const HfParam& p : m.params().hf_params()) {
        if (p.name == replace) {
            tensors.push_back(with);
            continue;
        }
        keep.emplace_back(DType::kF32, p.shape);
        model_read_param_hf(m, p.name, keep.back().view());
        tensors.push_back(safetensors_write_tensor(p.name, keep.back().view()));
    }
    const std::string path = dir + "/model.safetensors";
    LATHE_CHECK(safetensors_write_file(path, tensors, {}).ok(), "writing {}", path);
    return path;
}

TEST(ModelIo, LoadErrorsNameTheCheckpointAndTheTensor) {
    const ModelConfig c = parse(kFamilies[0]);
    Model m = make(c, 3);
    const std::string name = "model.layers.1.mlp.down_proj.weight";
    const HfParam* p = m.params().find_hf(name);
    ASSERT_NE(p, nullptr);
    const std::string dir = fresh_dir("errors");

    // An unsupported dtype: I32 values of the right shape.
    std::vector<int32_t> ints(size_t(p->shape.numel()), 1);
    SafetensorsWriteTensor bad{
        name, SafetensorsDtype::kI32, {p->shape[0], p->shape[1]}, ints.data(), ints.size() * 4};
    std::string path = write_with(m, dir, name, bad);
    Result<SafetensorsCheckpoint> ckpt = SafetensorsCheckpoint::open(path);
    ASSERT_TRUE(ckpt.ok()) << ckpt.status().to_string();
    Status s = model_load_hf(m, *ckpt);
    ASSERT_FALSE(s.ok());
    for (const std::string& part : {path, name, std::string("I32")})
        EXPECT_NE(s.message().find(part), std::string::npos) << part << " in " << s.message();

    // A wrong shape: the transpose.
    std::vector<float> floats(size_t(p->shape.numel()), 0.5f);
    SafetensorsWriteTensor turned{
        name, SafetensorsDtype::kF32, {p->shape[1], p->shape[0]}, floats.data(), floats.size() * 4};
    path = write_with(m, dir, name, turned);
    ckpt = SafetensorsCheckpoint::open(path);
    ASSERT_TRUE(ckpt.ok()) << ckpt.status().to_string();
    s = model_load_hf(m, *ckpt);
    ASSERT_FALSE(s.ok());
    for (const std::string& part : {path, name, p->shape.to_string()})
        EXPECT_NE(s.message().find(part), std::string::npos) << part << " in " << s.message();

    // A missing tensor: written under another name.
    SafetensorsWriteTensor renamed{"model.layers.1.mlp.down_proj.weight_renamed",
                                   SafetensorsDtype::kF32,
                                   {p->shape[0], p->shape[1]},
                                   floats.data(),
                                   floats.size() * 4};
    path = write_with(m, dir, name, renamed);
    ckpt = SafetensorsCheckpoint::open(path);
    ASSERT_TRUE(ckpt.ok()) << ckpt.status().to_string();
    s = model_load_hf(m, *ckpt);
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.code(), StatusCode::kNotFound) << s.to_string();
    for (const std::string& part : {path, "'" + name + "'"})
        EXPECT_NE(s.message().find(part), std::string::npos) << part << " in " << s.message();
    fs::remove_all(dir);
}

// q, k and v share one arena entry (stacked rows): writing q leaves k and v as they were.
TEST(ModelIo, WritingOneHfTensorOfASharedEntryKeepsTheOthers) {
    for (std::string_view json : {kFamilies[0], kFamilies[3]}) {  // stacked, interleaved
        const ModelConfig c = parse(json);
        Model m = make(c, 9);
        const HfParam* q = nullptr;
        for (const HfParam& p : m.params().hf_params())
            if (p.name.find("layers.0.") != std::string::npos && p.name.ends_with(".weight") &&
                (p.name.find("q_proj") != std::string::npos ||
                 p.name.find("query_key_value") != std::string::npos))
                q = &p;
        ASSERT_NE(q, nullptr) << c.model_type;
        std::vector<HostTensor> before;
        for (const HfParam& p : m.params().hf_params()) {
            before.emplace_back(DType::kF32, p.shape);
            model_read_param_hf(m, p.name, before.back().view());
        }
        HostTensor value(DType::kF32, q->shape);
        for (int64_t i = 0; i < value.numel(); ++i) value.as<float>()[i] = float(i % 17) - 8.0f;
        model_write_param_hf(m, q->name, value.view());
        size_t k = 0;
        for (const HfParam& p : m.params().hf_params()) {
            HostTensor now(DType::kF32, p.shape);
            model_read_param_hf(m, p.name, now.view());
            const HostTensor& want = &p == q ? value : before[k];
            EXPECT_EQ(0, std::memcmp(now.as<float>(), want.as<float>(), now.view().bytes()))
                << c.model_type << " " << p.name;
            ++k;
        }
    }
}

// Gradients read by HF name are the gradient entries rearranged (GPT-2's Conv1D weights
// transposed): the same values, as sorted lists.
TEST(ModelIo, GradientsByHfNameAreTheArenaRearranged) {
    const ModelConfig c = parse(kFamilies[4]);
    Model m = make(c, 11);
    HostTensor tokens(DType::kI32, Shape{1, 4}), targets(DType::kI32, Shape{1, 4});
    for (int i = 0; i < 4; ++i) {
        tokens.as<int32_t>()[i] = 3 * i + 1;
        targets.as<int32_t>()[i] = 5 * i + 2;
    }
    m.zero_grads();
    m.forward_backward(ModelBatch{tokens.view(), targets.view(), {}, {}});
    std::vector<float> arena, by_name;
    for (const ParamEntry& e : m.params().entries()) {
        const ConstTensorView g = m.grad_entry(e.arena_index);
        arena.insert(arena.end(), g.as<float>(), g.as<float>() + g.numel());
    }
    for (const HfParam& p : m.params().hf_params()) {
        HostTensor t(DType::kF32, p.shape);
        model_read_grad_hf(m, p.name, t.view());
        by_name.insert(by_name.end(), t.as<float>(), t.as<float>() + t.numel());
    }
    EXPECT_GT(std::count_if(arena.begin(), arena.end(), [](float v) { return v != 0.0f; }), 0);
    std::sort(arena.begin(), arena.end());
    std::sort(by_name.begin(), by_name.end());
    EXPECT_EQ(arena, by_name);
}

TEST(ParamStaging, OnTheCpuTheHostViewsAreTheArenaItself) {
    const ModelConfig c = parse(kFamilies[3]);
    Model m = make(c, 1);
    ParamStaging staging(m);
    for (size_t i = 0; i < m.plan().params.size(); ++i)
        EXPECT_EQ(staging.host(i).data(), m.param_entry(i).data()) << i;
    staging.host(0).as<float>()[0] = 1234.5f;
    staging.upload_all(m);
    HostTensor back(m.param_entry(0).dtype(), m.param_entry(0).shape());
    m.read_param_entry(0, back.view());
    EXPECT_EQ(back.as<float>()[0], 1234.5f);
}

TEST(BatchStaging, OnTheCpuCopiesAtOnceFromOffsetZero) {
    Result<BatchStaging> s = BatchStaging::create(64, cpu_context());
    ASSERT_TRUE(s.ok());
    int32_t src[4] = {1, 2, 3, 4}, dst[4] = {};
    EXPECT_EQ(s->begin(), 0u);
    s->copy(TensorView(dst, DType::kI32, Shape{4}), ConstTensorView(src, DType::kI32, Shape{4}), 0);
    s->end();
    EXPECT_EQ(0, std::memcmp(src, dst, sizeof(src)));
    EXPECT_EQ(s->begin(), 0u);
}

}  // namespace
}  // namespace lathe
