// lathe convert: dtype conversions against independent references, bit-identical round trips on
// every model fixture (f32 and bf16, one file and sharded), logits parity with transformers after
// HF -> lathe, the error for each way a checkpoint and its config.json can disagree, and the
// folder handling (run folders, carried files, staged output).

#include "run/convert.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <filesystem>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "core/dtype.h"
#include "io/file.h"
#include "io/hf_config.h"
#include "io/safetensors.h"
#include "model/model.h"
#include "model/model_io.h"
#include "model/registry.h"

namespace fs = std::filesystem;

namespace lathe {
namespace {

const std::vector<std::string> kFixtures = {"llama",    "llama_bias_packed",   "mistral", "qwen2",
                                            "gpt_neox", "gpt_neox_sequential", "gpt2"};

std::string fixture_dir(const std::string& name) {
    return std::string(LATHE_SOURCE_DIR) + "/tests/fixtures/models/" + name;
}

std::string fresh_dir(const std::string& name) {
    const fs::path p =
        fs::temp_directory_path() / fmt::format("lathe_convert_{}_{}", getpid(), name);
    fs::remove_all(p);
    return p.string();
}

std::string slurp(const std::string& path) {
    Result<std::string> s = file_read_all(path);
    LATHE_CHECK(s.ok(), "{}", s.status().to_string());
    return *s;
}

// A tensor held in memory: what a test checkpoint is made of.
struct RawTensor {
    std::string name;
    SafetensorsDtype dtype = SafetensorsDtype::kF32;
    std::vector<int64_t> shape;
    std::string bytes;
};

std::vector<RawTensor> read_tensors(const std::string& dir) {
    Result<SafetensorsCheckpoint> ck = SafetensorsCheckpoint::open(dir);
    LATHE_CHECK(ck.ok(), "{}", ck.status().to_string());
    std::vector<RawTensor> out;
    for (const std::string& name : ck->names()) {
        Result<const SafetensorsTensor*> t = ck->tensor(name);
        LATHE_CHECK(t.ok(), "{}", t.status().to_string());
        out.push_back({name, (*t)->dtype, (*t)->shape,
                       std::string(reinterpret_cast<const char*>((*t)->data), (*t)->nbytes())});
    }
    return out;
}

RawTensor* find(std::vector<RawTensor>& ts, const std::string& name) {
    for (RawTensor& t : ts)
        if (t.name == name) return &t;
    return nullptr;
}

// Writes `tensors` as a checkpoint (sharded above `limit` bytes) plus `config` into a new `dir`.
void write_checkpoint(const std::string& dir, const std::vector<RawTensor>& tensors,
                      const std::string& config_json, uint64_t limit = 0) {
    fs::create_directories(dir);
    std::vector<SafetensorsWriteTensor> w;
    for (const RawTensor& t : tensors)
        w.push_back({t.name, t.dtype, t.shape, t.bytes.data(), t.bytes.size()});
    SafetensorsCheckpointWriteOptions opt;
    opt.max_shard_bytes = limit;
    Result<SafetensorsCheckpointWriteResult> r = safetensors_write_checkpoint(dir, w, opt);
    LATHE_CHECK(r.ok(), "{}", r.status().to_string());
    LATHE_CHECK(file_write_atomic(dir + "/config.json", config_json).ok(), "config");
}

// A copy of fixture `name` with its tensors edited by `edit` (and its config.json by
// `edit_config`).
std::string edited_fixture(const std::string& name, const std::string& tag,
                           const std::function<void(std::vector<RawTensor>&)>& edit,
                           const std::function<void(nlohmann::json&)>& edit_config = nullptr) {
    std::vector<RawTensor> ts = read_tensors(fixture_dir(name));
    edit(ts);
    nlohmann::json config = nlohmann::json::parse(slurp(fixture_dir(name) + "/config.json"));
    if (edit_config) edit_config(config);
    const std::string dir = fresh_dir(tag);
    write_checkpoint(dir, ts, config.dump(2));
    return dir;
}

Result<ConvertResult> convert(const std::string& in, const std::string& out, CheckpointFormat to,
                              std::optional<ConvertDtype> dtype = std::nullopt,
                              std::optional<uint64_t> limit = std::nullopt) {
    ConvertRequest r;
    r.input = in;
    r.output = out;
    r.to = to;
    r.dtype = dtype;
    r.max_shard_bytes = limit;
    return convert_run(r);
}

// The files of a folder (names, sorted) and their bytes.
std::map<std::string, std::string> folder_files(const std::string& dir) {
    std::map<std::string, std::string> out;
    for (const fs::directory_entry& e : fs::directory_iterator(dir))
        if (e.is_regular_file()) out[e.path().filename().string()] = slurp(e.path().string());
    return out;
}

std::vector<std::string> weight_file_names(const std::string& dir) {
    std::vector<std::string> out;
    for (const auto& [name, bytes] : folder_files(dir))
        if (name.find("model") == 0) out.push_back(name);
    return out;
}

// ---- dtype conversions ----

TEST(ConvertDtype, Bf16RoundsToNearestEvenAsTorch) {
    // torch: (u + 0x7FFF + ((u >> 16) & 1)) >> 16.
    auto bf = [](uint32_t u) { return float_to_bf16(std::bit_cast<float>(u)).bits; };
    EXPECT_EQ(bf(0x3F808000u), 0x3F80);  // tie, even stays
    EXPECT_EQ(bf(0x3F818000u), 0x3F82);  // tie, odd goes up
    EXPECT_EQ(bf(0x3F808001u), 0x3F81);
    EXPECT_EQ(bf(0x7F7FFFFFu), 0x7F80);  // the largest f32 rounds to infinity
}

TEST(ConvertParse, DtypesAndSizes) {
    EXPECT_EQ(*convert_parse_dtype("bf16"), ConvertDtype::kBF16);
    EXPECT_EQ(*convert_parse_dtype("BFloat16"), ConvertDtype::kBF16);
    EXPECT_EQ(*convert_parse_dtype("fp32"), ConvertDtype::kF32);
    EXPECT_EQ(*convert_parse_dtype("float16"), ConvertDtype::kF16);
    EXPECT_EQ(convert_parse_dtype("int8").status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(*convert_parse_size("5GB"), 5'000'000'000ull);
    EXPECT_EQ(*convert_parse_size("500 MB"), 500'000'000ull);
    EXPECT_EQ(*convert_parse_size("2GiB"), 2ull << 30);
    EXPECT_EQ(*convert_parse_size("1.5kb"), 1500ull);
    EXPECT_EQ(*convert_parse_size("12345"), 12345ull);
    EXPECT_EQ(*convert_parse_size("0"), 0ull);
    for (const char* bad : {"", "GB", "5XB", "-1GB", "1.5", "5 G B"}) {
        const Result<uint64_t> r = convert_parse_size(bad);
        EXPECT_FALSE(r.ok()) << bad;
        if (!r.ok()) {
            EXPECT_NE(r.status().message().find("--max-shard-size"), std::string::npos);
        }
    }
}

// ---- round trips ----

class ConvertFixture : public testing::TestWithParam<std::string> {};

// f32 HF -> lathe -> HF f32: the weight file is the one transformers wrote, byte for byte, and
// config.json parses to the same configuration.
TEST_P(ConvertFixture, F32RoundTripIsByteIdentical) {
    const std::string name = GetParam();
    const std::string lathe_dir = fresh_dir(name + "_f32_lathe"),
                      hf_dir = fresh_dir(name + "_f32_hf");
    Result<ConvertResult> a = convert(fixture_dir(name), lathe_dir, CheckpointFormat::kLathe);
    ASSERT_TRUE(a.ok()) << a.status().to_string();
    EXPECT_EQ(a->source.format, CheckpointFormat::kHf);
    EXPECT_EQ(a->weight_files, std::vector<std::string>{"model.safetensors"});
    Result<ConvertResult> b = convert(lathe_dir, hf_dir, CheckpointFormat::kHf, ConvertDtype::kF32);
    ASSERT_TRUE(b.ok()) << b.status().to_string();
    EXPECT_EQ(b->source.format, CheckpointFormat::kLathe);
    EXPECT_EQ(slurp(hf_dir + "/model.safetensors"),
              slurp(fixture_dir(name) + "/model.safetensors"));
    Result<HfModelConfig> in = hf_config_load(fixture_dir(name));
    Result<HfModelConfig> out = hf_config_load(hf_dir);
    ASSERT_TRUE(in.ok() && out.ok());
    EXPECT_EQ(*in, *out);
    EXPECT_FALSE(fs::exists(hf_dir + "/optimizer.safetensors"));
    EXPECT_FALSE(fs::exists(hf_dir + "/trainer_state.json"));
    fs::remove_all(lathe_dir);
    fs::remove_all(hf_dir);
}

// bf16 HF (sharded, and one file) -> lathe f32 -> HF bf16 with the same shard limit: every file
// (shards, index) is byte-identical to the input; the lathe checkpoint holds the exact f32 values.
TEST_P(ConvertFixture, Bf16RoundTripIsByteIdenticalShardedOrNot) {
    const std::string name = GetParam();
    for (bool sharded : {false, true}) {
        const std::string tag = fmt::format("{}_bf16_{}", name, sharded ? "sharded" : "single");
        const std::string in = fresh_dir(tag + "_in"), lathe_dir = fresh_dir(tag + "_lathe"),
                          out = fresh_dir(tag + "_out");
        // The bf16 input, made independently of convert: RNE of the fixture's f32 values.
        std::vector<RawTensor> ts = read_tensors(fixture_dir(name));
        std::vector<RawTensor> narrowed;
        const ParamTable table = model_param_table(*model_config_from_hf_file(fixture_dir(name)));
        for (const HfParam& p : table.hf_params()) {  // the parameter table's order
            RawTensor t = *find(ts, p.name);
            std::string b(t.bytes.size() / 2, '\0');
            for (size_t i = 0; i < t.bytes.size() / 4; ++i) {
                float f;
                std::memcpy(&f, t.bytes.data() + 4 * i, 4);
                const uint16_t h = float_to_bf16(f).bits;
                std::memcpy(b.data() + 2 * i, &h, 2);
            }
            narrowed.push_back({t.name, SafetensorsDtype::kBF16, t.shape, b});
        }
        nlohmann::json config = nlohmann::json::parse(slurp(fixture_dir(name) + "/config.json"));
        config["torch_dtype"] = "bfloat16";
        uint64_t total = 0;
        for (const RawTensor& t : narrowed) total += t.bytes.size();
        const uint64_t limit = sharded ? total / 4 : 0;  // several shards, whatever the model
        write_checkpoint(in, narrowed, config.dump(2), limit);
        const std::vector<std::string> in_files = weight_file_names(in);
        if (sharded) {
            ASSERT_GT(in_files.size(), 3u) << "the sharded case must shard";
        }

        Result<ConvertResult> a = convert(in, lathe_dir, CheckpointFormat::kLathe);
        ASSERT_TRUE(a.ok()) << a.status().to_string();
        EXPECT_EQ(a->input_dtypes, std::vector<std::string>{"BF16"});
        for (RawTensor& t : read_tensors(lathe_dir)) {
            ASSERT_EQ(t.dtype, SafetensorsDtype::kF32) << t.name;
            const RawTensor* src = find(narrowed, t.name);
            ASSERT_NE(src, nullptr) << t.name;
            for (size_t i = 0; i < t.bytes.size() / 4; ++i) {
                uint16_t h;
                std::memcpy(&h, src->bytes.data() + 2 * i, 2);
                uint32_t f;
                std::memcpy(&f, t.bytes.data() + 4 * i, 4);
                ASSERT_EQ(f, uint32_t(h) << 16) << t.name << "[" << i << "]";
            }
        }
        Result<ConvertResult> b =
            convert(lathe_dir, out, CheckpointFormat::kHf, ConvertDtype::kBF16, limit);
        ASSERT_TRUE(b.ok()) << b.status().to_string();
        EXPECT_EQ(weight_file_names(out), in_files);
        for (const std::string& f : in_files)
            EXPECT_EQ(slurp(out + "/" + f), slurp(in + "/" + f)) << f;
        EXPECT_EQ(hf_config_load(out)->torch_dtype, "bfloat16");
        for (const std::string& d : {in, lathe_dir, out}) fs::remove_all(d);
    }
}

// max |a - b| / max |b|, the parity tests' measure.
double rel_error(const float* a, const float* b, int64_t n) {
    double diff = 0.0, scale = 0.0;
    for (int64_t i = 0; i < n; ++i) {
        diff = std::max(diff, std::abs(double(a[i]) - double(b[i])));
        scale = std::max(scale, std::abs(double(b[i])));
    }
    return scale == 0.0 ? diff : diff / scale;
}

// After HF -> lathe, the lathe checkpoint gives transformers' logits and loss on the fixture batch
// (CPU fp32; relative error below 1e-4).
TEST_P(ConvertFixture, LogitsAndLossMatchTransformersAfterConversion) {
    const std::string name = GetParam();
    const std::string lathe_dir = fresh_dir(name + "_parity");
    ASSERT_TRUE(convert(fixture_dir(name), lathe_dir, CheckpointFormat::kLathe).ok());
    const nlohmann::json meta = nlohmann::json::parse(slurp(fixture_dir(name) + "/reference.json"));
    Result<SafetensorsFile> ref =
        SafetensorsFile::open(fixture_dir(name) + "/reference.safetensors");
    ASSERT_TRUE(ref.ok());
    auto view = [&](const char* t) { return *(*ref->get(t))->view(); };
    const int64_t B = meta.at("batch"), T = meta.at("seq_len");
    Result<ModelConfig> config = model_config_from_hf_file(lathe_dir);
    ASSERT_TRUE(config.ok()) << config.status().to_string();
    Result<Model> model = Model::create(*config, ModelShape{B, T, 0}, cpu_context());
    ASSERT_TRUE(model.ok());
    Result<SafetensorsCheckpoint> ck = SafetensorsCheckpoint::open(lathe_dir);
    ASSERT_TRUE(ck.ok());
    ASSERT_TRUE(model_load_hf(*model, *ck).ok());
    ModelBatch batch{view("tokens"), view("targets"), {}, {}};
    if (meta.at("packed").get<bool>()) {
        batch.docs = view("docs");
        batch.positions = view("positions");
    }
    const ConstTensorView want = view("logits");
    HostTensor logits(DType::kF32, want.shape());
    model->logits(logits.view(), batch);
    const double logits_err = rel_error(logits.as<float>(), want.as<float>(), want.numel());
    const double loss = model->forward(batch);
    const double loss_err =
        std::abs(loss - meta.at("loss").get<double>()) / meta.at("loss").get<double>();
    std::printf(
        "[parity] %-20s logits rel err %.3g, loss %.7f vs transformers %.7f (rel err %.3g)\n",
        name.c_str(), logits_err, loss, meta.at("loss").get<double>(), loss_err);
    EXPECT_LT(logits_err, 1e-4);
    EXPECT_LT(loss_err, 1e-4);
    fs::remove_all(lathe_dir);
}

INSTANTIATE_TEST_SUITE_P(AllFamilies, ConvertFixture, testing::ValuesIn(kFixtures));

// convert's shard writer and safetensors_write_checkpoint split and lay out the same tensors
// identically (convert writes shard by shard to bound memory; the rule must not drift).
TEST(Convert, ShardsMatchSafetensorsWriteCheckpoint) {
    const std::string name = "gpt_neox";
    std::vector<RawTensor> ts = read_tensors(fixture_dir(name));
    const ParamTable table = model_param_table(*model_config_from_hf_file(fixture_dir(name)));
    for (uint64_t limit : {uint64_t(1), uint64_t(70'000), uint64_t(150'000)}) {
        std::vector<RawTensor> ordered;
        for (const HfParam& p : table.hf_params()) ordered.push_back(*find(ts, p.name));
        const std::string ref = fresh_dir(fmt::format("shardref_{}", limit));
        write_checkpoint(ref, ordered, slurp(fixture_dir(name) + "/config.json"), limit);
        const std::string out = fresh_dir(fmt::format("shardout_{}", limit));
        ASSERT_TRUE(
            convert(fixture_dir(name), out, CheckpointFormat::kHf, ConvertDtype::kF32, limit).ok());
        const std::vector<std::string> files = weight_file_names(ref);
        EXPECT_EQ(weight_file_names(out), files) << limit;
        for (const std::string& f : files)
            EXPECT_EQ(slurp(out + "/" + f), slurp(ref + "/" + f)) << f;
        fs::remove_all(ref);
        fs::remove_all(out);
    }
}

// ---- errors ----

Status convert_error(const std::string& in) {
    const std::string out = fresh_dir("err_out");
    Result<ConvertResult> r = convert(in, out, CheckpointFormat::kLathe);
    EXPECT_FALSE(fs::exists(out)) << "a failed conversion must leave no output";
    for (const fs::directory_entry& e : fs::directory_iterator(fs::path(out).parent_path()))
        EXPECT_EQ(e.path().filename().string().find(".lathe_convert_" + std::to_string(getpid()) +
                                                    "_err_out.partial"),
                  std::string::npos)
            << "leftover staging folder " << e.path();
    return r.ok() ? ok_status() : r.status();
}

void expect_error(const Status& s, StatusCode code, std::initializer_list<const char*> parts) {
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.code(), code) << s.to_string();
    for (const char* p : parts)
        EXPECT_NE(s.message().find(p), std::string::npos) << p << "\n" << s.message();
}

TEST(ConvertErrors, UnknownArchitecture) {
    const std::string in = edited_fixture(
        "llama", "arch", [](auto&) {},
        [](nlohmann::json& c) {
            c["architectures"] = {"FalconForCausalLM"};
            c["model_type"] = "falcon";
        });
    expect_error(convert_error(in), StatusCode::kUnimplemented,
                 {"FalconForCausalLM", "architectures"});
    fs::remove_all(in);
}

TEST(ConvertErrors, MissingTensorIsNamed) {
    const std::string in = edited_fixture("llama", "missing", [](std::vector<RawTensor>& ts) {
        std::erase_if(
            ts, [](const RawTensor& t) { return t.name == "model.layers.1.mlp.down_proj.weight"; });
    });
    expect_error(convert_error(in), StatusCode::kInvalidArgument,
                 {"model.layers.1.mlp.down_proj.weight", "missing", "[64, 128]"});
    fs::remove_all(in);
}

TEST(ConvertErrors, MissingLayerPointsAtTheDepth) {
    const std::string in = edited_fixture(
        "gpt_neox", "depth", [](auto&) {}, [](nlohmann::json& c) { c["num_hidden_layers"] = 3; });
    expect_error(convert_error(in), StatusCode::kInvalidArgument,
                 {"gpt_neox.layers.2.", "missing", "num_hidden_layers is 3", "end at 1"});
    fs::remove_all(in);
}

TEST(ConvertErrors, ExtraTensorIsNamed) {
    const std::string in = edited_fixture("qwen2", "extra", [](std::vector<RawTensor>& ts) {
        RawTensor t = *find(ts, "model.layers.1.mlp.up_proj.weight");
        t.name = "model.layers.2.mlp.up_proj.weight";
        ts.push_back(t);
    });
    expect_error(
        convert_error(in), StatusCode::kInvalidArgument,
        {"model.layers.2.mlp.up_proj.weight", "not a parameter", "num_hidden_layers is 2"});
    fs::remove_all(in);
}

TEST(ConvertErrors, ShapeMismatchIsNamed) {
    const std::string in = edited_fixture("mistral", "shape", [](std::vector<RawTensor>& ts) {
        RawTensor* t = find(ts, "model.layers.0.self_attn.k_proj.weight");  // [16, 64]: Hkv 1
        t->shape = {32, 32};
    });
    expect_error(convert_error(in), StatusCode::kInvalidArgument,
                 {"model.layers.0.self_attn.k_proj.weight", "[32, 32]", "[16, 64]",
                  "num_key_value_heads 1"});
    fs::remove_all(in);
}

TEST(ConvertErrors, UntiedModelWithoutItsHead) {
    const std::string in = edited_fixture("gpt_neox", "nohead", [](std::vector<RawTensor>& ts) {
        std::erase_if(ts, [](const RawTensor& t) { return t.name == "embed_out.weight"; });
    });
    expect_error(convert_error(in), StatusCode::kInvalidArgument,
                 {"embed_out.weight", "tie_word_embeddings", "gpt_neox.embed_in.weight"});
    fs::remove_all(in);
}

TEST(ConvertErrors, TiedModelWithADifferentHead) {
    const std::string in = edited_fixture("llama", "tiedhead", [](std::vector<RawTensor>& ts) {
        RawTensor head = *find(ts, "model.embed_tokens.weight");
        head.name = "lm_head.weight";
        float f;
        std::memcpy(&f, head.bytes.data() + 4 * 5, 4);
        f += 1.0f;
        std::memcpy(head.bytes.data() + 4 * 5, &f, 4);
        ts.push_back(head);
    });
    expect_error(
        convert_error(in), StatusCode::kInvalidArgument,
        {"tie_word_embeddings true", "lm_head.weight", "model.embed_tokens.weight", "element 5"});
    fs::remove_all(in);
}

TEST(ConvertErrors, TiedModelWithAnIdenticalHeadIsAccepted) {
    const std::string in = edited_fixture("qwen2", "tiedsame", [](std::vector<RawTensor>& ts) {
        RawTensor head = *find(ts, "model.embed_tokens.weight");
        head.name = "lm_head.weight";
        ts.push_back(head);
    });
    const std::string out = fresh_dir("tiedsame_out");
    Result<ConvertResult> r = convert(in, out, CheckpointFormat::kHf, ConvertDtype::kF32);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(r->dropped, std::vector<std::string>{"lm_head.weight"});
    EXPECT_EQ(slurp(out + "/model.safetensors"),
              slurp(fixture_dir("qwen2") + "/model.safetensors"));
    fs::remove_all(in);
    fs::remove_all(out);
}

TEST(ConvertErrors, IntegerTensorIsRefused) {
    const std::string in = edited_fixture("gpt2", "int8", [](std::vector<RawTensor>& ts) {
        RawTensor* t = find(ts, "transformer.ln_f.bias");
        t->dtype = SafetensorsDtype::kI32;
    });
    expect_error(convert_error(in), StatusCode::kInvalidArgument,
                 {"transformer.ln_f.bias", "I32", "F32, BF16 and F16"});
    fs::remove_all(in);
}

// GPT-2 checkpoints of the bare base model (no "transformer." prefix) with the causal-mask
// buffers older transformers saved: the buffers are dropped, the names gain the prefix, and the
// values are those of the prefixed fixture.
TEST(Convert, BareGpt2WithBuffers) {
    const std::string in = edited_fixture("gpt2", "bare", [](std::vector<RawTensor>& ts) {
        for (RawTensor& t : ts)
            if (t.name.rfind("transformer.", 0) == 0) t.name = t.name.substr(12);
        ts.push_back({"h.0.attn.bias", SafetensorsDtype::kF32, {1}, std::string(4, '\0')});
        ts.push_back({"h.1.attn.masked_bias", SafetensorsDtype::kF32, {1}, std::string(4, '\0')});
    });
    const std::string out = fresh_dir("bare_out");
    Result<ConvertResult> r = convert(in, out, CheckpointFormat::kHf, ConvertDtype::kF32);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(r->dropped, (std::vector<std::string>{"h.0.attn.bias", "h.1.attn.masked_bias"}));
    EXPECT_EQ(slurp(out + "/model.safetensors"), slurp(fixture_dir("gpt2") + "/model.safetensors"));
    fs::remove_all(in);
    fs::remove_all(out);
}

TEST(ConvertErrors, RequestsThatMakeNoSense) {
    const std::string lathe_dir = fresh_dir("req_lathe");
    ASSERT_TRUE(convert(fixture_dir("llama"), lathe_dir, CheckpointFormat::kLathe).ok());
    expect_error(convert(lathe_dir, fresh_dir("req_x"), CheckpointFormat::kLathe).status(),
                 StatusCode::kInvalidArgument, {"already a lathe checkpoint"});
    expect_error(convert(fixture_dir("llama"), fresh_dir("req_y"), CheckpointFormat::kLathe,
                         ConvertDtype::kBF16)
                     .status(),
                 StatusCode::kInvalidArgument, {"--dtype bf16 with --to lathe"});
    expect_error(convert(lathe_dir, lathe_dir, CheckpointFormat::kHf).status(),
                 StatusCode::kInvalidArgument, {"overlaps the input"});
    expect_error(
        convert(fresh_dir("nonexistent"), fresh_dir("req_z"), CheckpointFormat::kHf).status(),
        StatusCode::kNotFound, {"no such folder"});
    // A folder with config.json but PyTorch weights only.
    const std::string bin = fresh_dir("req_bin");
    fs::create_directories(bin);
    fs::copy_file(fixture_dir("llama") + "/config.json", bin + "/config.json");
    ASSERT_TRUE(file_write_atomic(bin + "/pytorch_model.bin", "x").ok());
    expect_error(convert(bin, fresh_dir("req_w"), CheckpointFormat::kLathe).status(),
                 StatusCode::kInvalidArgument, {"pytorch_model.bin", "safetensors"});
    fs::remove_all(lathe_dir);
    fs::remove_all(bin);
}

// ---- folders ----

TEST(Convert, RunFolderResolvesToTheNewestCheckpoint) {
    const std::string run = fresh_dir("run");
    for (const char* step : {"step-00000002", "step-00000010", ".partial-step-00000011"}) {
        const std::string d = run + "/checkpoints/" + step;
        ASSERT_TRUE(convert(fixture_dir("llama"), d, CheckpointFormat::kLathe).ok());
    }
    // Mark the newest complete one so it can be told apart.
    ASSERT_TRUE(file_write_atomic(run + "/checkpoints/step-00000010/README.md", "step 10\n").ok());
    for (const std::string& given : {run, run + "/checkpoints"}) {
        Result<ConvertSource> s = convert_find_source(given);
        ASSERT_TRUE(s.ok()) << s.status().to_string();
        EXPECT_EQ(fs::path(s->dir).filename(), "step-00000010");
        EXPECT_EQ(s->format, CheckpointFormat::kLathe);
    }
    const std::string out = fresh_dir("run_out");
    Result<ConvertResult> r = convert(run, out, CheckpointFormat::kHf);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(slurp(out + "/README.md"), "step 10\n");
    EXPECT_EQ(r->dtype, ConvertDtype::kBF16);  // the default for --to hf
    fs::remove_all(run);
    fs::remove_all(out);
    expect_error(convert_find_source(fixture_dir("")).status(), StatusCode::kNotFound,
                 {"no config.json"});
}

TEST(Convert, CarriesTokenizerFilesAndMakesAGenerationConfig) {
    const std::string in = fresh_dir("tok_in");
    fs::create_directories(in);
    for (const char* f : {"config.json", "model.safetensors"})
        fs::copy_file(fixture_dir("llama") + "/" + f, in + "/" + f);
    const std::map<std::string, std::string> carried = {
        {"tokenizer.json", "{\"version\": \"1.0\"}"},
        {"tokenizer_config.json", "{\"chat_template\": \"{{ messages }}\"}"},
        {"chat_template.jinja", "{% for m in messages %}{{ m.content }}{% endfor %}"},
        {"special_tokens_map.json", "{}"},
        {"LICENSE", "license text"},
    };
    for (const auto& [n, text] : carried) ASSERT_TRUE(file_write_atomic(in + "/" + n, text).ok());
    ASSERT_TRUE(file_write_atomic(in + "/pytorch_model.bin", "stale").ok());
    fs::create_directories(in + "/additional_chat_templates");
    ASSERT_TRUE(file_write_atomic(in + "/additional_chat_templates/tool_use.jinja", "T").ok());

    const std::string lathe_dir = fresh_dir("tok_lathe"), out = fresh_dir("tok_out");
    ASSERT_TRUE(convert(in, lathe_dir, CheckpointFormat::kLathe).ok());
    Result<ConvertResult> r = convert(lathe_dir, out, CheckpointFormat::kHf);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    for (const auto& [n, text] : carried) EXPECT_EQ(slurp(out + "/" + n), text) << n;
    EXPECT_EQ(slurp(out + "/additional_chat_templates/tool_use.jinja"), "T");
    EXPECT_FALSE(fs::exists(out + "/pytorch_model.bin"));
    EXPECT_FALSE(fs::exists(lathe_dir + "/pytorch_model.bin"));
    const nlohmann::json gen = nlohmann::json::parse(slurp(out + "/generation_config.json"));
    EXPECT_EQ(gen, nlohmann::json::parse(
                       R"({"_from_model_config": true, "bos_token_id": 1, "eos_token_id": 2})"));
    // A generation_config.json of the input wins over a made one.
    ASSERT_TRUE(file_write_atomic(in + "/generation_config.json", "{\"temperature\": 0.6}").ok());
    const std::string out2 = fresh_dir("tok_out2");
    ASSERT_TRUE(convert(in, out2, CheckpointFormat::kHf).ok());
    EXPECT_EQ(slurp(out2 + "/generation_config.json"), "{\"temperature\": 0.6}");
    for (const std::string& d : {in, lathe_dir, out, out2}) fs::remove_all(d);
}

// config.json's special ids follow the carried tokenizer: GPTNeoXConfig's eos 2 is "!" in the
// GPT-NeoX-20B vocabulary, whose <|endoftext|> (0) ends a document. A tokenizer_config.json is
// made for a tokenizer that has none.
TEST(Convert, SpecialIdsFollowTheCarriedTokenizer) {
    const std::string in = edited_fixture(
        "gpt_neox", "ids_in", [](std::vector<RawTensor>&) {},
        [](nlohmann::json& c) {
            c["bos_token_id"] = 0;
            c["eos_token_id"] = 2;
        });
    fs::copy_file(std::string(LATHE_SHARED_DIR) + "/tokenizers/gpt-neox-20b.json",
                  in + "/tokenizer.json");
    const std::string out = fresh_dir("ids_out");
    Result<ConvertResult> r = convert(in, out, CheckpointFormat::kHf);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    const nlohmann::json cfg = nlohmann::json::parse(slurp(out + "/config.json"));
    EXPECT_EQ(cfg["bos_token_id"], 0);
    EXPECT_EQ(cfg["eos_token_id"], 0);
    const nlohmann::json gen = nlohmann::json::parse(slurp(out + "/generation_config.json"));
    EXPECT_EQ(gen["eos_token_id"], 0);
    const nlohmann::json tc = nlohmann::json::parse(slurp(out + "/tokenizer_config.json"));
    EXPECT_EQ(tc["tokenizer_class"], "PreTrainedTokenizerFast");
    EXPECT_EQ(tc["eos_token"], "<|endoftext|>");
    EXPECT_EQ(tc["bos_token"], "<|endoftext|>");
    EXPECT_EQ(tc["model_max_length"], 2048);
    EXPECT_NE(std::find(r->other_files.begin(), r->other_files.end(), "tokenizer_config.json"),
              r->other_files.end());

    // A tokenizer lathe cannot read is carried as it is: ids unchecked, no config made.
    ASSERT_TRUE(
        file_write_atomic(in + "/tokenizer.json", "{\"model\": {\"type\": \"Unigram\"}}").ok());
    const std::string out2 = fresh_dir("ids_out2");
    r = convert(in, out2, CheckpointFormat::kHf);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(nlohmann::json::parse(slurp(out2 + "/config.json"))["eos_token_id"], 2);
    EXPECT_FALSE(fs::exists(out2 + "/tokenizer_config.json"));
    for (const std::string& d : {in, out, out2}) fs::remove_all(d);
}

// The lathe checkpoint's optimizer state has the size the trainer expects (the parameter arena,
// padding included) and is zero; trainer_state.json starts at step 0.
TEST(Convert, LatheCheckpointHasFreshTrainingState) {
    const std::string out = fresh_dir("state");
    ASSERT_TRUE(convert(fixture_dir("mistral"), out, CheckpointFormat::kLathe).ok());
    Result<ModelConfig> config = model_config_from_hf_file(out);
    ASSERT_TRUE(config.ok());
    Result<Model> model = Model::create(*config, ModelShape{1, 2, 0}, cpu_context());
    ASSERT_TRUE(model.ok());
    Result<SafetensorsFile> opt = SafetensorsFile::open(out + "/optimizer.safetensors");
    ASSERT_TRUE(opt.ok());
    for (const char* m : {"exp_avg", "exp_avg_sq"}) {
        const SafetensorsTensor* t = *opt->get(m);
        EXPECT_EQ(t->dtype, SafetensorsDtype::kF32);
        EXPECT_EQ(int64_t(t->numel()), model->params_flat().numel());
        EXPECT_TRUE(std::all_of(t->data, t->data + t->nbytes(), [](uint8_t b) { return b == 0; }));
    }
    const nlohmann::json state = nlohmann::json::parse(slurp(out + "/trainer_state.json"));
    for (const char* k : {"step", "adam_step", "skipped_steps", "skipped_in_a_row", "loss_count",
                          "interval_steps", "eval_passes"})
        EXPECT_EQ(state.at(k).get<int64_t>(), 0) << k;
    EXPECT_EQ(state.at("converted_from").at("format"), "hf");
    EXPECT_EQ(hf_config_load(out)->torch_dtype, "float32");
    fs::remove_all(out);
}

TEST(Convert, ExistingOutputNeedsOverwrite) {
    const std::string out = fresh_dir("exists");
    fs::create_directories(out);
    ASSERT_TRUE(file_write_atomic(out + "/keep.txt", "mine").ok());
    expect_error(convert(fixture_dir("gpt2"), out, CheckpointFormat::kHf).status(),
                 StatusCode::kInvalidArgument, {"not empty", "--overwrite"});
    EXPECT_EQ(slurp(out + "/keep.txt"), "mine");
    // A failed conversion leaves the old folder as it was, even with overwrite.
    const std::string bad =
        edited_fixture("gpt2", "exists_bad", [](std::vector<RawTensor>& ts) { ts.pop_back(); });
    ConvertRequest req{bad, out, CheckpointFormat::kHf, ConvertDtype::kF32, std::nullopt, true};
    EXPECT_FALSE(convert_run(req).ok());
    EXPECT_EQ(slurp(out + "/keep.txt"), "mine");
    req.input = fixture_dir("gpt2");
    ASSERT_TRUE(convert_run(req).ok());
    EXPECT_FALSE(fs::exists(out + "/keep.txt"));
    EXPECT_EQ(slurp(out + "/model.safetensors"), slurp(fixture_dir("gpt2") + "/model.safetensors"));
    // An existing empty folder is simply used.
    const std::string empty = fresh_dir("empty");
    fs::create_directories(empty);
    EXPECT_TRUE(convert(fixture_dir("gpt2"), empty, CheckpointFormat::kHf).ok());
    for (const std::string& d : {out, bad, empty}) fs::remove_all(d);
}

}  // namespace
}  // namespace lathe
