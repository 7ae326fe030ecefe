#include "model/hf_config.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "io/file.h"
#include "model/registry.h"

namespace lathe {
namespace {

namespace fs = std::filesystem;

// config.json of real checkpoints on the Hugging Face Hub, verbatim (keys as the Hub has them).
// meta-llama/Llama-3.2-1B
constexpr const char* kLlama32_1B = R"({
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 128000,
  "eos_token_id": 128001,
  "head_dim": 64,
  "hidden_act": "silu",
  "hidden_size": 2048,
  "initializer_range": 0.02,
  "intermediate_size": 8192,
  "max_position_embeddings": 131072,
  "mlp_bias": false,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 16,
  "num_key_value_heads": 8,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": {
    "factor": 32.0,
    "high_freq_factor": 4.0,
    "low_freq_factor": 1.0,
    "original_max_position_embeddings": 8192,
    "rope_type": "llama3"
  },
  "rope_theta": 500000.0,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.45.0.dev0",
  "use_cache": true,
  "vocab_size": 128256
})";

// Qwen/Qwen2-0.5B
constexpr const char* kQwen2_05B = R"({
  "architectures": ["Qwen2ForCausalLM"],
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "eos_token_id": 151643,
  "hidden_act": "silu",
  "hidden_size": 896,
  "initializer_range": 0.02,
  "intermediate_size": 4864,
  "max_position_embeddings": 131072,
  "max_window_layers": 24,
  "model_type": "qwen2",
  "num_attention_heads": 14,
  "num_hidden_layers": 24,
  "num_key_value_heads": 2,
  "rms_norm_eps": 1e-06,
  "rope_theta": 1000000.0,
  "sliding_window": 131072,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.40.1",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 151936
})";

// mistralai/Mistral-7B-v0.1
constexpr const char* kMistral7B = R"({
  "architectures": ["MistralForCausalLM"],
  "bos_token_id": 1,
  "eos_token_id": 2,
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 14336,
  "max_position_embeddings": 32768,
  "model_type": "mistral",
  "num_attention_heads": 32,
  "num_hidden_layers": 32,
  "num_key_value_heads": 8,
  "rms_norm_eps": 1e-05,
  "rope_theta": 10000.0,
  "sliding_window": 4096,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.34.0.dev0",
  "use_cache": true,
  "vocab_size": 32000
})";

// EleutherAI/pythia-160m
constexpr const char* kPythia160M = R"({
  "architectures": ["GPTNeoXForCausalLM"],
  "bos_token_id": 0,
  "eos_token_id": 0,
  "hidden_act": "gelu",
  "hidden_size": 768,
  "initializer_range": 0.02,
  "intermediate_size": 3072,
  "layer_norm_eps": 1e-05,
  "max_position_embeddings": 2048,
  "model_type": "gpt_neox",
  "num_attention_heads": 12,
  "num_hidden_layers": 12,
  "rotary_emb_base": 10000,
  "rotary_pct": 0.25,
  "tie_word_embeddings": false,
  "torch_dtype": "float16",
  "transformers_version": "4.24.0",
  "use_cache": true,
  "use_parallel_residual": true,
  "vocab_size": 50304
})";

// openai-community/gpt2
constexpr const char* kGpt2 = R"({
  "activation_function": "gelu_new",
  "architectures": ["GPT2LMHeadModel"],
  "attn_pdrop": 0.1,
  "bos_token_id": 50256,
  "embd_pdrop": 0.1,
  "eos_token_id": 50256,
  "initializer_range": 0.02,
  "layer_norm_epsilon": 1e-05,
  "model_type": "gpt2",
  "n_ctx": 1024,
  "n_embd": 768,
  "n_head": 12,
  "n_layer": 12,
  "n_positions": 1024,
  "resid_pdrop": 0.1,
  "summary_activation": null,
  "summary_first_dropout": 0.1,
  "summary_proj_to_labels": true,
  "summary_type": "cls_index",
  "summary_use_proj": true,
  "task_specific_params": {
    "text-generation": {
      "do_sample": true,
      "max_length": 50
    }
  },
  "vocab_size": 50257
})";

struct Fixture {
    const char* name;
    const char* text;
};
constexpr Fixture kFixtures[] = {{"llama-3.2-1b", kLlama32_1B},
                                 {"qwen2-0.5b", kQwen2_05B},
                                 {"mistral-7b-v0.1", kMistral7B},
                                 {"pythia-160m", kPythia160M},
                                 {"gpt2", kGpt2}};

HfModelConfig parse_ok(std::string_view text, const std::string& name = "config.json") {
    auto c = hf_config_parse(text, name);
    EXPECT_TRUE(c.ok()) << c.status().to_string();
    return c.ok() ? *c : HfModelConfig{};
}

// Parses, expects failure with `code` and a message holding `needle` and the file name.
void expect_error(std::string_view text, StatusCode code, const std::string& needle) {
    auto c = hf_config_parse(text, "/ckpt/config.json");
    ASSERT_FALSE(c.ok()) << "accepted: " << text;
    EXPECT_EQ(c.status().code(), code) << c.status().to_string();
    EXPECT_NE(c.status().message().find(needle), std::string::npos)
        << "no '" << needle << "' in: " << c.status().message();
    EXPECT_NE(c.status().message().find("/ckpt/config.json"), std::string::npos)
        << c.status().message();
}

TEST(HfConfig, Llama32_1B) {
    const HfModelConfig c = parse_ok(kLlama32_1B);
    EXPECT_EQ(c.family, &llama_family());
    EXPECT_EQ(c.vocab_size, 128256);
    EXPECT_EQ(c.hidden_size, 2048);
    EXPECT_EQ(c.intermediate_size, 8192);
    EXPECT_EQ(c.num_hidden_layers, 16);
    EXPECT_EQ(c.num_attention_heads, 32);
    EXPECT_EQ(c.num_key_value_heads, 8);
    EXPECT_EQ(c.head_dim, 64);
    EXPECT_EQ(c.max_position_embeddings, 131072);
    EXPECT_EQ(c.norm_eps, 1e-5);
    EXPECT_EQ(c.rope_theta, 500000.0);
    ASSERT_TRUE(c.rope_scaling.has_value());
    EXPECT_EQ(*c.rope_scaling, (HfRopeScaling{32.0, 1.0, 4.0, 8192}));
    EXPECT_EQ(c.partial_rotary_factor, 1.0);
    EXPECT_EQ(c.rotary_dim(), 64);
    EXPECT_TRUE(c.tie_word_embeddings);
    EXPECT_FALSE(c.has_qkv_bias());
    EXPECT_FALSE(c.has_out_bias());
    EXPECT_FALSE(c.mlp_bias);
    EXPECT_EQ(c.activation(), HfActivation::kSilu);
    EXPECT_TRUE(c.uses_rms_norm());
    EXPECT_EQ(c.bos_token_id, std::optional<int64_t>(128000));
    EXPECT_EQ(c.eos_token_ids, std::vector<int64_t>{128001});
    EXPECT_FALSE(c.pad_token_id.has_value());
    EXPECT_EQ(c.torch_dtype, "bfloat16");
    EXPECT_EQ(c.sliding_window_for_layer(0), std::nullopt);
    // Keys lathe does not model are kept, as JSON text.
    EXPECT_EQ(c.extra.at("pretraining_tp"), "1");
    EXPECT_EQ(c.extra.at("transformers_version"), "\"4.45.0.dev0\"");
    EXPECT_EQ(c.extra.at("use_cache"), "true");
    EXPECT_EQ(c.extra.count("rope_theta"), 0u);
}

TEST(HfConfig, Qwen2_05B) {
    const HfModelConfig c = parse_ok(kQwen2_05B);
    EXPECT_EQ(c.family, &qwen2_family());
    EXPECT_EQ(c.vocab_size, 151936);
    EXPECT_EQ(c.hidden_size, 896);
    EXPECT_EQ(c.intermediate_size, 4864);
    EXPECT_EQ(c.num_hidden_layers, 24);
    EXPECT_EQ(c.num_attention_heads, 14);
    EXPECT_EQ(c.num_key_value_heads, 2);
    EXPECT_EQ(c.head_dim, 64);
    EXPECT_EQ(c.max_position_embeddings, 131072);
    EXPECT_EQ(c.norm_eps, 1e-6);
    EXPECT_EQ(c.rope_theta, 1e6);
    EXPECT_FALSE(c.rope_scaling.has_value());
    EXPECT_TRUE(c.tie_word_embeddings);
    EXPECT_TRUE(c.has_qkv_bias());   // Qwen2: q, k, v biases always
    EXPECT_FALSE(c.has_out_bias());  // but none on o_proj
    EXPECT_FALSE(c.mlp_bias);
    // sliding_window is stored as written but is off (use_sliding_window false).
    EXPECT_EQ(c.sliding_window, std::optional<int64_t>(131072));
    EXPECT_FALSE(c.use_sliding_window);
    EXPECT_EQ(c.max_window_layers, 24);
    for (int64_t l = 0; l < c.num_hidden_layers; ++l)
        EXPECT_EQ(c.sliding_window_for_layer(l), std::nullopt);
    EXPECT_EQ(c.bos_token_id, std::optional<int64_t>(151643));
    EXPECT_EQ(c.eos_token_ids, std::vector<int64_t>{151643});
}

TEST(HfConfig, Mistral7B) {
    const HfModelConfig c = parse_ok(kMistral7B);
    EXPECT_EQ(c.family, &mistral_family());
    EXPECT_EQ(c.hidden_size, 4096);
    EXPECT_EQ(c.intermediate_size, 14336);
    EXPECT_EQ(c.num_hidden_layers, 32);
    EXPECT_EQ(c.num_attention_heads, 32);
    EXPECT_EQ(c.num_key_value_heads, 8);
    EXPECT_EQ(c.head_dim, 128);
    EXPECT_EQ(c.vocab_size, 32000);
    EXPECT_EQ(c.max_position_embeddings, 32768);
    EXPECT_EQ(c.norm_eps, 1e-5);
    EXPECT_EQ(c.rope_theta, 10000.0);
    EXPECT_FALSE(c.tie_word_embeddings);
    EXPECT_FALSE(c.has_qkv_bias());
    EXPECT_EQ(c.sliding_window_for_layer(0), std::optional<int64_t>(4096));
    EXPECT_EQ(c.sliding_window_for_layer(31), std::optional<int64_t>(4096));
    EXPECT_EQ(c.bos_token_id, std::optional<int64_t>(1));
    EXPECT_EQ(c.eos_token_ids, std::vector<int64_t>{2});
}

TEST(HfConfig, Pythia160M) {
    const HfModelConfig c = parse_ok(kPythia160M);
    EXPECT_EQ(c.family, &gpt_neox_family());
    EXPECT_EQ(c.vocab_size, 50304);
    EXPECT_EQ(c.hidden_size, 768);
    EXPECT_EQ(c.intermediate_size, 3072);
    EXPECT_EQ(c.num_hidden_layers, 12);
    EXPECT_EQ(c.num_attention_heads, 12);
    EXPECT_EQ(c.num_key_value_heads, 12);
    EXPECT_EQ(c.head_dim, 64);
    EXPECT_EQ(c.max_position_embeddings, 2048);
    EXPECT_EQ(c.norm_eps, 1e-5);
    EXPECT_FALSE(c.uses_rms_norm());
    EXPECT_EQ(c.rope_theta, 10000.0);          // rotary_emb_base
    EXPECT_EQ(c.partial_rotary_factor, 0.25);  // rotary_pct
    EXPECT_EQ(c.rotary_dim(), 16);
    EXPECT_TRUE(c.use_parallel_residual);
    EXPECT_TRUE(c.attention_bias);  // GPTNeoXConfig default, the key is absent
    EXPECT_TRUE(c.has_qkv_bias());
    EXPECT_TRUE(c.has_out_bias());
    EXPECT_TRUE(c.mlp_bias);
    EXPECT_EQ(c.activation(), HfActivation::kGelu);
    EXPECT_FALSE(c.tie_word_embeddings);
    EXPECT_EQ(c.bos_token_id, std::optional<int64_t>(0));
    EXPECT_EQ(c.eos_token_ids, std::vector<int64_t>{0});
    EXPECT_EQ(c.torch_dtype, "float16");
}

TEST(HfConfig, Gpt2) {
    const HfModelConfig c = parse_ok(kGpt2);
    EXPECT_EQ(c.family, &gpt2_family());
    EXPECT_EQ(c.vocab_size, 50257);
    EXPECT_EQ(c.hidden_size, 768);
    EXPECT_EQ(c.intermediate_size, 3072);  // n_inner absent: 4 * n_embd
    EXPECT_EQ(c.num_hidden_layers, 12);
    EXPECT_EQ(c.num_attention_heads, 12);
    EXPECT_EQ(c.num_key_value_heads, 12);
    EXPECT_EQ(c.head_dim, 64);
    EXPECT_EQ(c.max_position_embeddings, 1024);
    EXPECT_EQ(c.norm_eps, 1e-5);
    EXPECT_EQ(c.hidden_act, "gelu_new");
    EXPECT_EQ(c.activation(), HfActivation::kGeluTanh);
    EXPECT_FALSE(c.uses_rotary());
    EXPECT_EQ(c.rotary_dim(), 0);
    EXPECT_TRUE(c.tie_word_embeddings);  // PretrainedConfig default, the key is absent
    EXPECT_TRUE(c.has_qkv_bias());
    EXPECT_TRUE(c.mlp_bias);
    EXPECT_EQ(c.bos_token_id, std::optional<int64_t>(50256));
    EXPECT_EQ(c.eos_token_ids, std::vector<int64_t>{50256});
    EXPECT_TRUE(c.torch_dtype.empty());
    EXPECT_EQ(c.extra.at("n_ctx"), "1024");
    EXPECT_EQ(c.extra.at("task_specific_params"),
              R"({"text-generation":{"do_sample":true,"max_length":50}})");
    EXPECT_EQ(c.extra.at("summary_activation"), "null");
}

TEST(HfConfig, DefaultsOfEachFamilyClass) {
    // An empty config takes every value from the family's transformers config class.
    for (const ModelFamily* f : model_families()) {
        const std::string text = fmt::format(R"({{"architectures": ["{}"]}})", f->architecture);
        HfModelConfig c = parse_ok(text);
        EXPECT_EQ(c, hf_config_default(*f)) << f->architecture;
    }
    const HfModelConfig llama = hf_config_default(llama_family());
    EXPECT_EQ(llama.num_key_value_heads, 32);
    EXPECT_EQ(llama.intermediate_size, 11008);
    EXPECT_EQ(llama.max_position_embeddings, 2048);
    EXPECT_EQ(llama.norm_eps, 1e-6);
    EXPECT_EQ(llama.eos_token_ids, std::vector<int64_t>{2});
    const HfModelConfig mistral = hf_config_default(mistral_family());
    EXPECT_EQ(mistral.num_key_value_heads, 8);
    EXPECT_EQ(mistral.max_position_embeddings, 131072);
    EXPECT_EQ(mistral.sliding_window, std::optional<int64_t>(4096));
    const HfModelConfig qwen = hf_config_default(qwen2_family());
    EXPECT_EQ(qwen.vocab_size, 151936);
    EXPECT_EQ(qwen.intermediate_size, 22016);
    EXPECT_EQ(qwen.max_window_layers, 28);
    EXPECT_FALSE(qwen.bos_token_id.has_value());
    EXPECT_TRUE(qwen.eos_token_ids.empty());
    const HfModelConfig neox = hf_config_default(gpt_neox_family());
    EXPECT_EQ(neox.vocab_size, 50432);
    EXPECT_EQ(neox.hidden_size, 6144);
    EXPECT_EQ(neox.num_hidden_layers, 44);
    EXPECT_EQ(neox.rotary_dim(), 24);  // head_dim 96 * 0.25
    EXPECT_EQ(neox.eos_token_ids, std::vector<int64_t>{2});
}

TEST(HfConfig, KeyValueHeadsDefaultQuirks) {
    // Absent: the class default (Mistral 8, Qwen2 32; Llama None = all heads).
    EXPECT_EQ(
        parse_ok(R"({"model_type": "mistral", "num_attention_heads": 16})").num_key_value_heads, 8);
    EXPECT_EQ(parse_ok(R"({"model_type": "qwen2", "num_attention_heads": 64})").num_key_value_heads,
              32);
    EXPECT_EQ(parse_ok(R"({"model_type": "llama", "num_attention_heads": 16})").num_key_value_heads,
              16);
    // null: num_attention_heads, for every family.
    EXPECT_EQ(
        parse_ok(
            R"({"model_type": "mistral", "num_attention_heads": 16, "num_key_value_heads": null})")
            .num_key_value_heads,
        16);
    EXPECT_EQ(
        parse_ok(
            R"({"model_type": "qwen2", "num_attention_heads": 16, "num_key_value_heads": null})")
            .num_key_value_heads,
        16);
    // head_dim: given, or hidden_size / heads.
    const HfModelConfig c = parse_ok(
        R"({"model_type": "llama", "hidden_size": 96, "num_attention_heads": 4, "head_dim": 32})");
    EXPECT_EQ(c.head_dim, 32);
    EXPECT_EQ(parse_ok(R"({"model_type": "llama", "hidden_size": 96, "num_attention_heads": 4})")
                  .head_dim,
              24);
    // GPT-2's n_inner and its generic aliases.
    EXPECT_EQ(parse_ok(R"({"model_type": "gpt2", "n_embd": 64, "n_head": 4, "n_inner": 100})")
                  .intermediate_size,
              100);
    EXPECT_EQ(parse_ok(R"({"model_type": "gpt2", "n_embd": 64, "n_head": 4, "n_inner": null})")
                  .intermediate_size,
              256);
    EXPECT_EQ(parse_ok(R"({"model_type": "gpt2", "hidden_size": 64, "n_head": 4})").hidden_size,
              64);
    // Qwen2 sliding window on the upper layers only.
    const HfModelConfig q = parse_ok(
        R"({"model_type": "qwen2", "num_hidden_layers": 4, "use_sliding_window": true,
            "sliding_window": 128, "max_window_layers": 2})");
    EXPECT_EQ(q.sliding_window_for_layer(1), std::nullopt);
    EXPECT_EQ(q.sliding_window_for_layer(2), std::optional<int64_t>(128));
    // Mistral without a window.
    EXPECT_EQ(parse_ok(R"({"model_type": "mistral", "sliding_window": null})")
                  .sliding_window_for_layer(3),
              std::nullopt);
}

TEST(HfConfig, TransformersFiveSpelling) {
    // transformers 5 writes rope_parameters and dtype; the same model as the Hub's spelling.
    nlohmann::json v5 = nlohmann::json::parse(kLlama32_1B);
    v5.erase("rope_theta");
    v5.erase("rope_scaling");
    v5.erase("torch_dtype");
    v5["dtype"] = "bfloat16";
    v5["rope_parameters"] = {{"rope_type", "llama3"},   {"rope_theta", 500000.0},
                             {"factor", 32.0},          {"low_freq_factor", 1.0},
                             {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192}};
    HfModelConfig a = parse_ok(kLlama32_1B), b = parse_ok(v5.dump());
    a.extra.clear();
    b.extra.clear();
    EXPECT_EQ(a, b);

    nlohmann::json neox = nlohmann::json::parse(kPythia160M);
    neox.erase("rotary_pct");
    neox.erase("rotary_emb_base");
    neox["rope_parameters"] = {
        {"rope_type", "default"}, {"rope_theta", 10000.0}, {"partial_rotary_factor", 0.25}};
    const HfModelConfig n = parse_ok(neox.dump());
    EXPECT_EQ(n.partial_rotary_factor, 0.25);
    EXPECT_EQ(n.rope_theta, 10000.0);
    EXPECT_FALSE(n.rope_scaling.has_value());

    // Qwen2's layer_types must be the pattern lathe derives.
    nlohmann::json q = nlohmann::json::parse(kQwen2_05B);
    q["layer_types"] = std::vector<std::string>(24, "full_attention");
    EXPECT_TRUE(hf_config_parse(q.dump(), "q").ok());
    q["layer_types"][23] = "sliding_attention";
    auto bad = hf_config_parse(q.dump(), "q");
    ASSERT_FALSE(bad.ok());
    EXPECT_EQ(bad.status().code(), StatusCode::kUnimplemented);
    EXPECT_NE(bad.status().message().find("layer_types"), std::string::npos);

    // Both spellings at once must agree.
    nlohmann::json both = nlohmann::json::parse(kMistral7B);
    both["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 20000.0}};
    expect_error(both.dump(), StatusCode::kInvalidArgument,
                 "keys 'rope_theta' (10000) and 'rope_parameters.rope_theta' (20000) disagree");
}

TEST(HfConfig, ErrorsNameTheKey) {
    expect_error(R"({"model_type": "gpt2", "n_embd": 9223372036854775807})",
                 StatusCode::kInvalidArgument,
                 "key 'n_embd' (9223372036854775807) is too large: the default n_inner");
    expect_error("{\"model_type\": \"llama\",", StatusCode::kInvalidArgument, "not valid JSON");
    expect_error("[1]", StatusCode::kInvalidArgument, "must be a JSON object");
    expect_error(R"({"hidden_size": 8})", StatusCode::kInvalidArgument,
                 "neither 'architectures' nor 'model_type'");
    expect_error(R"({"architectures": ["BertForMaskedLM"]})", StatusCode::kUnimplemented,
                 "key 'architectures' is [BertForMaskedLM]; lathe supports LlamaForCausalLM");
    expect_error(R"({"model_type": "t5"})", StatusCode::kUnimplemented,
                 "key 'model_type' is \"t5\"");
    expect_error(R"({"architectures": ["LlamaForCausalLM"], "model_type": "mistral"})",
                 StatusCode::kInvalidArgument, "key 'model_type' is \"mistral\" but");
    expect_error(R"({"model_type": "llama", "hidden_size": "4096"})", StatusCode::kInvalidArgument,
                 "key 'hidden_size' must be an integer >= 1, got the string \"4096\"");
    expect_error(R"({"model_type": "llama", "num_hidden_layers": 2.5})",
                 StatusCode::kInvalidArgument,
                 "key 'num_hidden_layers' must be an integer >= 1, got the number 2.5");
    expect_error(R"({"model_type": "llama", "vocab_size": 0})", StatusCode::kInvalidArgument,
                 "key 'vocab_size' must be an integer >= 1, got the number 0");
    expect_error(R"({"model_type": "llama", "tie_word_embeddings": 1})",
                 StatusCode::kInvalidArgument, "key 'tie_word_embeddings' must be true or false");
    expect_error(R"({"model_type": "llama", "rms_norm_eps": "1e-5"})", StatusCode::kInvalidArgument,
                 "key 'rms_norm_eps' must be a number");
    expect_error(R"({"model_type": "llama", "num_attention_heads": 32, "num_key_value_heads": 6})",
                 StatusCode::kInvalidArgument, "key 'num_key_value_heads' (6, given) must divide");
    expect_error(R"({"model_type": "mistral", "num_attention_heads": 4, "hidden_size": 64})",
                 StatusCode::kInvalidArgument,
                 "(8, the MistralConfig default, as the key is absent)");
    expect_error(R"({"model_type": "llama", "hidden_size": 100, "num_attention_heads": 8})",
                 StatusCode::kInvalidArgument, "set head_dim");
    expect_error(R"({"model_type": "gpt_neox", "hidden_size": 100, "num_attention_heads": 8})",
                 StatusCode::kInvalidArgument,
                 "key 'hidden_size' (100) is not a multiple of num_attention_heads");
    expect_error(R"({"model_type": "llama", "rope_scaling": {"rope_type": "yarn", "factor": 4.0}})",
                 StatusCode::kUnimplemented, "key 'rope_scaling.rope_type' is \"yarn\"");
    expect_error(R"({"model_type": "llama", "rope_scaling": {"type": "linear", "factor": 4.0}})",
                 StatusCode::kUnimplemented, "key 'rope_scaling.type' is \"linear\"");
    expect_error(
        R"({"model_type": "llama", "rope_scaling": {"rope_type": "llama3", "factor": 8.0}})",
        StatusCode::kInvalidArgument, "key 'rope_scaling.low_freq_factor' is missing");
    expect_error(R"({"model_type": "llama", "rope_scaling": {"rope_type": "llama3", "factor": 8.0,
                   "low_freq_factor": 4.0, "high_freq_factor": 1.0, "original_max_position_embeddings": 8192}})",
                 StatusCode::kInvalidArgument, "low_freq_factor < high_freq_factor");
    expect_error(R"({"model_type": "llama", "hidden_act": "gelu_accurate"})",
                 StatusCode::kUnimplemented, "key 'hidden_act' is \"gelu_accurate\"");
    expect_error(R"({"model_type": "gpt2", "activation_function": "quick_gelu"})",
                 StatusCode::kUnimplemented, "key 'activation_function' is \"quick_gelu\"");
    expect_error(R"({"model_type": "gpt2", "scale_attn_by_inverse_layer_idx": true})",
                 StatusCode::kUnimplemented, "key 'scale_attn_by_inverse_layer_idx' is true");
    expect_error(R"({"model_type": "gpt2", "n_embd": 64, "hidden_size": 128, "n_head": 4})",
                 StatusCode::kInvalidArgument,
                 "keys 'n_embd' (64) and 'hidden_size' (128) disagree");
    expect_error(R"({"model_type": "gpt_neox", "rotary_pct": 1.5})", StatusCode::kInvalidArgument,
                 "key 'rotary_pct' must be in (0, 1]");
    expect_error(
        R"({"model_type": "gpt_neox", "hidden_size": 64, "num_attention_heads": 2, "rotary_pct": 0.01})",
        StatusCode::kInvalidArgument, "key 'rotary_pct' gives 0 rotary dimensions");
    expect_error(R"({"model_type": "mistral", "sliding_window": 0})", StatusCode::kInvalidArgument,
                 "key 'sliding_window' must be an integer >= 1");
    expect_error(R"({"model_type": "llama", "eos_token_id": [1, "x"]})",
                 StatusCode::kInvalidArgument, "key 'eos_token_id' must be a token id");
    expect_error(R"({"model_type": "llama", "torch_dtype": "float32", "dtype": "bfloat16"})",
                 StatusCode::kInvalidArgument,
                 "keys 'torch_dtype' (\"float32\") and 'dtype' (\"bfloat16\") disagree");
}

TEST(HfConfig, WriteThenParseIsIdentity) {
    for (const Fixture& f : kFixtures) {
        const HfModelConfig c = parse_ok(f.text, f.name);
        auto text = hf_config_to_json(c);
        ASSERT_TRUE(text.ok()) << f.name << ": " << text.status().to_string();
        const HfModelConfig back = parse_ok(*text, f.name);
        EXPECT_EQ(back, c) << f.name << "\n" << *text;
        auto again = hf_config_to_json(back);
        ASSERT_TRUE(again.ok());
        EXPECT_EQ(*again, *text) << f.name;  // stable
        // Every key of the original config.json is in the written one, with an equal value
        // (numbers compared as numbers: 10000 and 10000.0 are the same rotary_emb_base).
        const nlohmann::json orig = nlohmann::json::parse(f.text);
        const nlohmann::json written = nlohmann::json::parse(*text);
        for (auto it = orig.begin(); it != orig.end(); ++it) {
            ASSERT_TRUE(written.contains(it.key())) << f.name << ": lost key " << it.key();
            if (it.value().is_number())
                EXPECT_EQ(written[it.key()].get<double>(), it.value().get<double>())
                    << f.name << " " << it.key();
            else
                EXPECT_EQ(written[it.key()], it.value()) << f.name << " " << it.key();
        }
    }
}

TEST(HfConfig, WrittenTextIsSaveDefaultFormat) {
    const HfModelConfig c = parse_ok(kLlama32_1B);
    auto text = hf_config_to_json(c);
    ASSERT_TRUE(text.ok());
    // Sorted keys, indent 2, Python's float spelling, trailing newline.
    const std::string head = "{\n  \"architectures\": [\n    \"LlamaForCausalLM\"\n  ],\n";
    EXPECT_EQ(text->substr(0, head.size()), head);
    EXPECT_NE(text->find("\n  \"rms_norm_eps\": 1e-05,\n"), std::string::npos) << *text;
    EXPECT_NE(text->find("\n  \"rope_theta\": 500000.0,\n"), std::string::npos) << *text;
    EXPECT_NE(text->find("\n    \"rope_type\": \"llama3\"\n"), std::string::npos) << *text;
    EXPECT_EQ(text->back(), '\n');
    // Architectural keys are written even when they hold the default.
    const HfModelConfig d = hf_config_default(gpt_neox_family());
    auto neox = hf_config_to_json(d);
    ASSERT_TRUE(neox.ok());
    const nlohmann::json j = nlohmann::json::parse(*neox);
    for (const char* key :
         {"hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
          "max_position_embeddings", "layer_norm_eps", "hidden_act", "rotary_pct",
          "rotary_emb_base", "use_parallel_residual", "attention_bias", "tie_word_embeddings",
          "vocab_size", "bos_token_id", "eos_token_id"})
        EXPECT_TRUE(j.contains(key)) << key;
}

TEST(HfConfig, ScaledDownConfigWritesBack) {
    // What convert and the parity tests do: take a real config, shrink it, write it.
    HfModelConfig c = parse_ok(kLlama32_1B);
    c.hidden_size = 64;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.head_dim = 16;
    c.intermediate_size = 128;
    c.num_hidden_layers = 2;
    c.vocab_size = 256;
    c.eos_token_ids = {128001, 128008, 128009};  // Llama 3.1 Instruct lists several
    auto text = hf_config_to_json(c);
    ASSERT_TRUE(text.ok()) << text.status().to_string();
    const nlohmann::json j = nlohmann::json::parse(*text);
    EXPECT_EQ(j["hidden_size"], 64);
    EXPECT_EQ(j["head_dim"], 16);
    EXPECT_EQ(j["eos_token_id"], nlohmann::json({128001, 128008, 128009}));
    EXPECT_EQ(parse_ok(*text), c);

    c.num_key_value_heads = 3;
    auto bad = hf_config_to_json(c);
    ASSERT_FALSE(bad.ok());
    EXPECT_NE(bad.status().message().find("num_key_value_heads"), std::string::npos);
    c.num_key_value_heads = 2;
    c.extra["broken"] = "{not json";
    auto bad2 = hf_config_to_json(c);
    ASSERT_FALSE(bad2.ok());
    EXPECT_NE(bad2.status().message().find("extra key 'broken'"), std::string::npos);
    c.extra.erase("broken");
    HfModelConfig m = parse_ok(kMistral7B);
    m.attention_bias = true;
    auto bad3 = hf_config_to_json(m);
    ASSERT_FALSE(bad3.ok());
    EXPECT_NE(bad3.status().message().find("only LlamaForCausalLM has it"), std::string::npos);
}

TEST(HfConfig, SaveAndLoadFiles) {
    const fs::path dir =
        fs::temp_directory_path() / fmt::format("lathe_hf_config_test_{}", ::getpid());
    fs::remove_all(dir);
    fs::create_directories(dir);
    const HfModelConfig c = parse_ok(kPythia160M);
    ASSERT_TRUE(hf_config_save((dir / "config.json").string(), c).ok());
    auto from_dir = hf_config_load(dir.string());
    ASSERT_TRUE(from_dir.ok()) << from_dir.status().to_string();
    EXPECT_EQ(*from_dir, c);
    auto from_file = hf_config_load((dir / "config.json").string());
    ASSERT_TRUE(from_file.ok());
    EXPECT_EQ(*from_file, c);
    auto missing = hf_config_load((dir / "nope").string());
    ASSERT_FALSE(missing.ok());
    EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
    fs::create_directories(dir / "empty");
    auto empty = hf_config_load((dir / "empty").string());
    ASSERT_FALSE(empty.ok());
    EXPECT_EQ(empty.status().code(), StatusCode::kNotFound);
    EXPECT_NE(empty.status().message().find("no config.json in this directory"), std::string::npos);
    fs::remove_all(dir);
}

// Driven by tests/test_safetensors.py: LATHE_HF_CONFIG_DIR=DIR gets, for every fixture, NAME.orig/
// config.json (the Hub's text) and NAME.lathe/config.json (parsed and written back by lathe), plus
// NAME.small/config.json (scaled down and written by lathe), for transformers to load.
// DISABLED_: a driver CTest does not run; tests/test_safetensors.py does.
TEST(HfConfigInterop, DISABLED_WriteForPython) {
    const char* dir_env = std::getenv("LATHE_HF_CONFIG_DIR");
    ASSERT_NE(dir_env, nullptr) << "driven by tests/test_safetensors.py";
    const std::string dir = dir_env;
    for (const Fixture& f : kFixtures) {
        const HfModelConfig c = parse_ok(f.text, f.name);
        fs::create_directories(dir + "/" + f.name + ".orig");
        fs::create_directories(dir + "/" + f.name + ".lathe");
        fs::create_directories(dir + "/" + f.name + ".small");
        ASSERT_TRUE(file_write_atomic(dir + "/" + f.name + ".orig/config.json", f.text).ok());
        ASSERT_TRUE(hf_config_save(dir + "/" + f.name + ".lathe/config.json", c).ok());
        HfModelConfig s = c;
        s.num_hidden_layers = 2;
        s.num_attention_heads = 4;
        s.num_key_value_heads = c.num_key_value_heads == c.num_attention_heads ? 4 : 2;
        s.hidden_size = 64;
        s.head_dim = 16;
        s.intermediate_size = 96;
        s.vocab_size = 512;
        s.bos_token_id = 1;  // inside the smaller vocabulary
        s.eos_token_ids = {2};
        ASSERT_TRUE(hf_config_save(dir + "/" + f.name + ".small/config.json", s).ok());
    }
}

}  // namespace
}  // namespace lathe
