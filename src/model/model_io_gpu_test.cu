// Model I/O of a model on the GPU (CTest label gpu): what model_io saves from the device is, byte
// for byte, what it saves from the CPU twin with the same masters; a load into the device model
// refreshes its bf16 compute copy (the loss equals that of a model initialized to the same
// values); an HF accessor write changes only its rows of a shared entry; BatchStaging alternates
// its pinned halves and delivers the bytes.
// clang-format off
#include "ops/cuda/nvcc_compat.h"  // first: before any header that includes fmt
// clang-format on

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "model/batch_staging.h"
#include "model/model.h"
#include "model/model_io.h"
#include "model/registry.h"
#include "ops/cuda/cuda_state.h"
#include "ops/cuda/memory.h"

namespace lathe {
namespace {

namespace fs = std::filesystem;

constexpr const char* kLlama = R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
  "vocab_size": 256, "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
  "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64,
  "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": false})";

constexpr int64_t kB = 2, kT = 32;

Model make(const Context& ctx, uint64_t seed) {
    Result<ModelConfig> c = model_config_from_hf_json(kLlama, "test/config.json");
    LATHE_CHECK(c.ok(), "{}", c.status().to_string());
    ModelShape shape;
    shape.batch = kB;
    shape.seq_len = kT;
    Result<Model> m = Model::create(*c, shape, ctx);
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
    const std::string dir = testing::TempDir() + "lathe_model_io_gpu_" + name;
    fs::remove_all(dir);
    fs::create_directories(dir);
    return dir;
}

class ModelIoGpu : public ::testing::Test {
protected:
    static void SetUpTestSuite() { state_ = new CudaState(0); }
    static void TearDownTestSuite() {
        delete state_;
        state_ = nullptr;
    }
    static CudaState* state_;
};
CudaState* ModelIoGpu::state_ = nullptr;

TEST_F(ModelIoGpu, SavesTheBytesTheCpuSavesAndLoadsIntoTheComputeCopy) {
    const Model cpu = make(cpu_context(), 17);
    const Model gpu = make(state_->context(), 17);
    const std::string a = fresh_dir("cpu"), b = fresh_dir("gpu");
    ASSERT_TRUE(model_save_hf(cpu, a).ok());
    ASSERT_TRUE(model_save_hf(gpu, b).ok());
    EXPECT_EQ(slurp(a + "/model.safetensors"), slurp(b + "/model.safetensors"));
    EXPECT_EQ(slurp(a + "/config.json"), slurp(b + "/config.json"));

    // Loaded over other values, the device model computes what the one initialized to the
    // checkpoint's values computes, bit for bit: masters and bf16 copy were both rewritten.
    Model loaded = make(state_->context(), 3);
    Result<SafetensorsCheckpoint> ckpt = SafetensorsCheckpoint::open(b);
    ASSERT_TRUE(ckpt.ok()) << ckpt.status().to_string();
    const Status s = model_load_hf(loaded, *ckpt);
    ASSERT_TRUE(s.ok()) << s.to_string();
    Model same = make(state_->context(), 17);
    HostTensor tokens(DType::kI32, Shape{kB, kT}), targets(DType::kI32, Shape{kB, kT});
    for (int64_t i = 0; i < kB * kT; ++i) {
        tokens.as<int32_t>()[i] = int32_t((i * 37 + 5) % 256);
        targets.as<int32_t>()[i] = int32_t((i * 53 + 11) % 256);
    }
    const ModelBatch batch{tokens.view(), targets.view(), {}, {}};
    const float l1 = loaded.forward(batch), l2 = same.forward(batch);
    EXPECT_EQ(std::memcmp(&l1, &l2, sizeof(float)), 0) << l1 << " vs " << l2;
    fs::remove_all(a);
    fs::remove_all(b);
}

TEST_F(ModelIoGpu, AnHfWriteChangesOnlyItsRowsOfTheSharedEntry) {
    Model m = make(state_->context(), 5);
    const std::string q = "model.layers.1.self_attn.q_proj.weight";
    const std::string k = "model.layers.1.self_attn.k_proj.weight";
    const HfParam* pq = m.params().find_hf(q);
    const HfParam* pk = m.params().find_hf(k);
    ASSERT_TRUE(pq != nullptr && pk != nullptr);
    HostTensor k_before(DType::kF32, pk->shape), value(DType::kF32, pq->shape);
    model_read_param_hf(m, k, k_before.view());
    for (int64_t i = 0; i < value.numel(); ++i) value.as<float>()[i] = float(i % 13) * 0.25f;
    model_write_param_hf(m, q, value.view());
    HostTensor q_after(DType::kF32, pq->shape), k_after(DType::kF32, pk->shape);
    model_read_param_hf(m, q, q_after.view());
    model_read_param_hf(m, k, k_after.view());
    EXPECT_EQ(0, std::memcmp(q_after.as<float>(), value.as<float>(), value.view().bytes()));
    EXPECT_EQ(0, std::memcmp(k_after.as<float>(), k_before.as<float>(), k_before.view().bytes()));
}

TEST_F(ModelIoGpu, BatchStagingAlternatesItsHalvesAndDeliversTheBytes) {
    constexpr int64_t n = 64;
    const size_t half = n * sizeof(int32_t);
    Result<BatchStaging> s = BatchStaging::create(half, state_->context());
    ASSERT_TRUE(s.ok()) << s.status().to_string();
    DeviceBuffer device(2 * half);
    std::vector<int32_t> src(n), back(n);
    for (int round = 0; round < 4; ++round) {
        for (int64_t i = 0; i < n; ++i) src[size_t(i)] = int32_t(round * 1000 + i);
        const size_t offset = s->begin();
        EXPECT_EQ(offset, round % 2 == 0 ? half : 0u) << round;
        const TensorView dst(static_cast<std::byte*>(device.data()) + (round % 2) * half,
                             DType::kI32, Shape{n}, Device::kCuda);
        s->copy(dst, ConstTensorView(src.data(), DType::kI32, Shape{n}), offset);
        s->end();
        src.assign(size_t(n), -1);  // the caller's memory is free once copy() returns
        cuda_copy_sync(TensorView(back.data(), DType::kI32, Shape{n}), dst,
                       state_->context().stream);
        for (int64_t i = 0; i < n; ++i)
            ASSERT_EQ(back[size_t(i)], int32_t(round * 1000 + i)) << round << " " << i;
    }
}

}  // namespace
}  // namespace lathe
