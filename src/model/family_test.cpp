// A family is one ModelFamily entry: a test-only family, defined here and registered nowhere,
// parses, checks, writes and builds its parameter table through the same interface as the
// registered ones; and each registered family's entry is complete and self-consistent.

#include <gtest/gtest.h>

#include <array>
#include <nlohmann/json.hpp>
#include <set>

#include "model/hf_config.h"
#include "model/llama_like.h"
#include "model/registry.h"

namespace lathe {
namespace {

// A Llama variant with its own key names (d_model, n_layers, layer_norm_eps), its own defaults
// (2 key/value heads when the key is absent) and q/k/v biases only, from attention_bias.
HfModelConfig toy_defaults() {
    HfModelConfig c;
    c.vocab_size = 1000;
    c.hidden_size = 256;
    c.intermediate_size = 512;
    c.num_hidden_layers = 4;
    c.num_attention_heads = 8;
    c.num_key_value_heads = 2;
    c.max_position_embeddings = 512;
    c.norm_eps = 1e-5;
    c.hidden_act = "silu";
    c.rope_theta = 20000.0;
    c.bos_token_id = 1;
    c.eos_token_ids = {2};
    return c;
}

Status toy_parse(HfConfigReader& r, HfModelConfig& c) {
    LATHE_RETURN_IF_ERROR(llama_like_read(r, c, 2, "ToyConfig"));
    return r.bool_key("attention_bias", &c.attention_bias);
}

void toy_write(const HfModelConfig& c, nlohmann::json& out) {
    llama_like_write(c, out, /*head_dim_always=*/true);
    out["attention_bias"] = c.attention_bias;
}

bool toy_qkv_bias(const HfModelConfig& c) {
    return c.attention_bias;
}

bool toy_out_bias(const HfModelConfig&) {
    return false;
}

constexpr std::string_view kToyIgnored[] = {"rotary_emb.inv_freq"};

const ModelFamily kToy{
    .model_type = "toy_llama",
    .architecture = "ToyLlamaForCausalLM",
    .base_model_prefix = "model.",
    .hf_keys = {.hidden_size = "d_model",
                .num_hidden_layers = "n_layers",
                .norm_eps = "layer_norm_eps"},
    .hf_defaults = &toy_defaults,
    .hf_parse = &toy_parse,
    .hf_validate = nullptr,
    .hf_write = &toy_write,
    .hf_qkv_bias = &toy_qkv_bias,
    .hf_out_bias = &toy_out_bias,
    .config_from_hf = &llama_like_config,
    .build_params = &llama_like_params,
    .ignored_suffixes = kToyIgnored,
};
const std::array<const ModelFamily*, 1> kToyOnly = {&kToy};

constexpr const char* kToyJson = R"({
  "architectures": ["ToyLlamaForCausalLM"],
  "attention_bias": true,
  "custom_key": [1, 2],
  "d_model": 64,
  "n_layers": 2,
  "num_attention_heads": 4,
  "vocab_size": 128
})";

HfModelConfig toy_ok(std::string_view text) {
    auto c = hf_config_parse(text, "/toy/config.json", kToyOnly);
    EXPECT_TRUE(c.ok()) << c.status().to_string();
    return c.ok() ? *c : HfModelConfig{};
}

void expect_toy_error(std::string_view text, StatusCode code, const std::string& needle) {
    auto c = hf_config_parse(text, "/toy/config.json", kToyOnly);
    ASSERT_FALSE(c.ok()) << "accepted: " << text;
    EXPECT_EQ(c.status().code(), code) << c.status().to_string();
    EXPECT_NE(c.status().message().find(needle), std::string::npos)
        << "no '" << needle << "' in: " << c.status().message();
}

TEST(ModelFamilyInterface, AnUnregisteredFamilyParsesWithItsOwnKeysAndDefaults) {
    const HfModelConfig c = toy_ok(kToyJson);
    EXPECT_EQ(c.family, &kToy);
    EXPECT_EQ(c.model_type(), "toy_llama");
    EXPECT_EQ(c.hidden_size, 64);         // d_model
    EXPECT_EQ(c.num_hidden_layers, 2);    // n_layers
    EXPECT_EQ(c.num_key_value_heads, 2);  // the toy's default when absent
    EXPECT_EQ(c.head_dim, 16);
    EXPECT_EQ(c.intermediate_size, 512);  // the toy's default
    EXPECT_EQ(c.rope_theta, 20000.0);
    EXPECT_TRUE(c.has_qkv_bias());
    EXPECT_FALSE(c.has_out_bias());
    EXPECT_EQ(c.extra.at("custom_key"), "[1,2]");
    EXPECT_EQ(c.extra.count("d_model"), 0u);
    // An empty config is the toy's defaults.
    EXPECT_EQ(toy_ok(R"({"model_type": "toy_llama"})"), hf_config_default(kToy));
    // The registry does not know it: registering is a line in registry.cpp, not a side effect.
    auto registered = hf_config_parse(kToyJson, "/toy/config.json");
    ASSERT_FALSE(registered.ok());
    EXPECT_EQ(registered.status().code(), StatusCode::kUnimplemented);
    // Its own key names in its messages, the shared rules applied.
    expect_toy_error(R"({"model_type": "toy_llama", "d_model": "64"})",
                     StatusCode::kInvalidArgument, "key 'd_model' must be an integer >= 1");
    expect_toy_error(R"({"model_type": "toy_llama", "layer_norm_eps": 0})",
                     StatusCode::kInvalidArgument,
                     "key 'layer_norm_eps' must be a positive number");
    expect_toy_error(R"({"model_type": "toy_llama", "num_attention_heads": 3})",
                     StatusCode::kInvalidArgument,
                     "(2, the ToyConfig default, as the key is absent) must divide");
    expect_toy_error(R"({"model_type": "llama"})", StatusCode::kUnimplemented,
                     "key 'model_type' is \"llama\"; lathe supports toy_llama");
}

TEST(ModelFamilyInterface, AnUnregisteredFamilyWritesAndRoundTrips) {
    const HfModelConfig c = toy_ok(kToyJson);
    auto text = hf_config_to_json(c);
    ASSERT_TRUE(text.ok()) << text.status().to_string();
    const nlohmann::json j = nlohmann::json::parse(*text);
    EXPECT_EQ(j["architectures"], nlohmann::json({"ToyLlamaForCausalLM"}));
    EXPECT_EQ(j["model_type"], "toy_llama");
    EXPECT_EQ(j["d_model"], 64);
    EXPECT_EQ(j["n_layers"], 2);
    EXPECT_EQ(j["layer_norm_eps"], 1e-5);
    EXPECT_EQ(j["num_key_value_heads"], 2);
    EXPECT_EQ(j["custom_key"], nlohmann::json({1, 2}));
    EXPECT_FALSE(j.contains("hidden_size"));
    EXPECT_FALSE(j.contains("rms_norm_eps"));
    const HfModelConfig back = toy_ok(*text);
    EXPECT_EQ(back, c);
    EXPECT_EQ(*hf_config_to_json(back), *text);
    // Settings the toy does not have are refused, naming the family that has them.
    HfModelConfig windowed = c;
    windowed.sliding_window = 16;
    auto w = hf_config_to_json(windowed);
    ASSERT_FALSE(w.ok());
    EXPECT_NE(
        w.status().message().find("key 'sliding_window' is not a ToyLlamaForCausalLM setting"),
        std::string::npos)
        << w.status().message();
    HfModelConfig parallel = c;
    parallel.use_parallel_residual = true;
    auto p = hf_config_to_json(parallel);
    ASSERT_FALSE(p.ok());
    EXPECT_NE(p.status().message().find("is a GPTNeoXForCausalLM setting"), std::string::npos)
        << p.status().message();
}

TEST(ModelFamilyInterface, AnUnregisteredFamilyBuildsItsModelConfigAndParameters) {
    const HfModelConfig hf = toy_ok(kToyJson);
    auto config = model_config_from_hf(hf, "/toy/config.json");
    ASSERT_TRUE(config.ok()) << config.status().to_string();
    EXPECT_EQ(config->model_type, "toy_llama");
    EXPECT_EQ(&model_family_of(*config), &kToy);
    EXPECT_EQ(config->hidden_size, 64);
    EXPECT_TRUE(config->qkv_bias);
    EXPECT_FALSE(config->out_bias);
    EXPECT_EQ(config->rope.theta, 20000.0);
    const ParamTable table = model_param_table(*config);
    EXPECT_NE(table.find_hf("model.layers.1.self_attn.q_proj.bias"), nullptr);
    EXPECT_EQ(table.find_hf("model.layers.1.self_attn.o_proj.bias"), nullptr);
    EXPECT_EQ(table.num_elements(), model_config_num_parameters(*config));
}

TEST(ModelFamilyInterface, EveryRegisteredFamilyIsCompleteAndSaysItsOwnKeys) {
    std::set<std::string_view> types, classes;
    for (const ModelFamily* f : model_families()) {
        SCOPED_TRACE(std::string(f->model_type));
        EXPECT_TRUE(types.insert(f->model_type).second);
        EXPECT_TRUE(classes.insert(f->architecture).second);
        EXPECT_EQ(*model_family_find(f->model_type), f);
        ASSERT_NE(f->hf_defaults, nullptr);
        ASSERT_NE(f->hf_parse, nullptr);
        ASSERT_NE(f->hf_write, nullptr);
        ASSERT_NE(f->hf_qkv_bias, nullptr);
        ASSERT_NE(f->hf_out_bias, nullptr);
        ASSERT_NE(f->config_from_hf, nullptr);
        ASSERT_NE(f->build_params, nullptr);
        EXPECT_GE(f->vocab_multiple, 1);
        // Its defaults are a valid config that it writes with its own key names and reads back.
        const HfModelConfig d = hf_config_default(*f);
        EXPECT_EQ(d.family, f);
        auto text = hf_config_to_json(d);
        ASSERT_TRUE(text.ok()) << text.status().to_string();
        const nlohmann::json j = nlohmann::json::parse(*text);
        const HfKeyNames& k = f->hf_keys;
        for (std::string_view key : {k.hidden_size, k.num_hidden_layers, k.num_attention_heads,
                                     k.max_position_embeddings, k.norm_eps, k.hidden_act})
            EXPECT_TRUE(j.contains(std::string(key))) << key;
        EXPECT_EQ(j.contains(std::string(k.rope_theta)), f->hf_rotary);
        auto back = hf_config_parse(*text, "defaults");
        ASSERT_TRUE(back.ok()) << back.status().to_string();
        EXPECT_EQ(*back, d);
        // The family-only settings: a family that has none refuses each one.
        const std::pair<unsigned, HfModelConfig (*)(HfModelConfig)> settings[] = {
            {kHfSlidingWindow,
             [](HfModelConfig c) {
                 c.sliding_window = 8;
                 return c;
             }},
            {kHfParallelResidual, [](HfModelConfig c) {
                 c.use_parallel_residual = !c.use_parallel_residual;
                 return c;
             }}};
        for (const auto& [bit, set] : settings) {
            if (!(f->hf_settings & bit)) {
                EXPECT_FALSE(hf_config_to_json(set(d)).ok()) << bit;
            }
        }
    }
}

}  // namespace
}  // namespace lathe
