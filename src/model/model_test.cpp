// Model layer unit tests: config mapping and its errors, the parameter table and its HF layouts,
// initialization, the memory plan, batches smaller than planned, gradient accumulation, and
// checkpoints written and read back. Whole-model numerics against transformers are in
// model_parity_test.cpp.

#include "model/model.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "model/fp8_state.h"
#include "model/init.h"
#include "model/model_io.h"
#include "model/registry.h"
#include "model/tiny_model_test_util.h"
#include "ops/cuda/attention.h"
#include "ops/fp8_blockwise.h"

namespace lathe {
namespace {

// A small Llama: two layers, GQA 4/2, untied, llama3 rope scaling.
constexpr std::string_view kLlamaJson = R"({
  "architectures": ["LlamaForCausalLM"], "model_type": "llama",
  "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
  "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 32,
  "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": false,
  "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                   "high_freq_factor": 4.0, "original_max_position_embeddings": 16}
})";

using tiny_model::kGpt2Json;
using tiny_model::kNeoxJson;
using tiny_model::parse;

Model make(const ModelConfig& config, int64_t B, int64_t T, uint64_t seed = 7) {
    Result<Model> m = Model::create(config, ModelShape{B, T, 0}, cpu_context());
    LATHE_CHECK(m.ok(), "{}", m.status().to_string());
    m->init(seed);
    return std::move(*m);
}

using tiny_model::ids;

std::vector<float> grads_of(const Model& m) {
    const ConstTensorView g = m.grads_flat();
    return std::vector<float>(g.as<float>(), g.as<float>() + g.numel());
}

TEST(ModelConfig, LlamaKeysBecomeTheSwitchesOfTheBlock) {
    const ModelConfig c = parse(kLlamaJson);
    EXPECT_EQ(c.model_type, "llama");
    EXPECT_EQ(c.head_dim, 8);
    EXPECT_EQ(c.num_kv_heads, 2);
    EXPECT_EQ(c.norm, NormKind::kRmsNorm);
    EXPECT_EQ(c.mlp, MlpKind::kSwiGlu);
    EXPECT_EQ(c.rope.scaling, RopeScaling::kLlama3);
    EXPECT_EQ(c.rope.original_max_position_embeddings, 16);
    EXPECT_FALSE(c.tie_word_embeddings);
    EXPECT_EQ(c.sliding_windows, std::vector<int64_t>(2, 0));
    EXPECT_EQ(model_config_summary(c),
              "llama: L=2 C=32 H=4 Hkv=2 D=8 F=48 V=64, RMSNorm, SwiGLU, rope theta 500000 "
              "(llama3), untied");
}

TEST(ModelConfig, GptNeoxAndGpt2Switches) {
    const ModelConfig neox = parse(kNeoxJson);
    EXPECT_EQ(neox.norm, NormKind::kLayerNorm);
    EXPECT_EQ(neox.gelu, GeluKind::kErf);
    EXPECT_TRUE(neox.parallel_residual);
    EXPECT_EQ(rope_rotary_dim(neox.rope), 4);
    EXPECT_TRUE(neox.qkv_bias && neox.out_bias && neox.mlp_bias);
    const ModelConfig gpt2 = parse(kGpt2Json);
    EXPECT_EQ(gpt2.position, PositionKind::kLearned);
    EXPECT_EQ(gpt2.gelu, GeluKind::kTanh);
    EXPECT_EQ(gpt2.intermediate_size, 64);  // n_inner absent: 4 * n_embd
    EXPECT_TRUE(gpt2.tie_word_embeddings);
}

TEST(ModelConfig, ActivationsTheModelCannotRunAreRefusedNamingTheKey) {
    std::string json(kLlamaJson);
    json.replace(json.find("\"rms_norm_eps\""), 0, "\"hidden_act\": \"gelu\", ");
    Result<ModelConfig> c = model_config_from_hf_json(json, "x/config.json");
    ASSERT_FALSE(c.ok());
    EXPECT_EQ(c.status().code(), StatusCode::kUnimplemented);
    EXPECT_NE(c.status().message().find("hidden_act"), std::string::npos) << c.status().message();
    EXPECT_NE(c.status().message().find("x/config.json"), std::string::npos);

    std::string gpt2(kGpt2Json);
    gpt2.replace(gpt2.find("\"n_positions\""), 0, "\"activation_function\": \"relu\", ");
    Result<ModelConfig> g = model_config_from_hf_json(gpt2, "y/config.json");
    ASSERT_FALSE(g.ok());
    EXPECT_NE(g.status().message().find("activation_function"), std::string::npos)
        << g.status().message();
}

TEST(ParamTable, LlamaStacksQkvAndGateUpWithHfNamesAndNoDecayOnNorms) {
    const ModelConfig c = parse(kLlamaJson);
    const ParamTable t = model_param_table(c);
    EXPECT_EQ(t.num_elements(), model_config_num_parameters(c));
    const HfParam* k = t.find_hf("model.layers.1.self_attn.k_proj.weight");
    ASSERT_NE(k, nullptr);
    EXPECT_EQ(k->shape, (Shape{16, 32}));
    EXPECT_EQ(k->row_begin, 32);  // after q's H*D = 32 rows
    const ParamEntry& qkv = t.entries()[k->entry];
    EXPECT_EQ(qkv.name, "model.layers.1.self_attn.qkv_proj.weight");
    EXPECT_EQ(qkv.shape, (Shape{64, 32}));
    EXPECT_EQ(t.entries()[t.find_hf("model.layers.0.mlp.up_proj.weight")->entry].shape,
              (Shape{96, 32}));
    EXPECT_FALSE(t.entries()[t.find_entry(ParamRole::kNorm1Weight, 0)].weight_decay);
    EXPECT_TRUE(t.entries()[t.find_entry(ParamRole::kTokenEmbedding)].weight_decay);
    EXPECT_NE(t.find_hf("lm_head.weight"), nullptr);
    EXPECT_EQ(t.find_hf("model.layers.0.self_attn.q_proj.bias"), nullptr);
}

// GPT-NeoX stores query_key_value per head as [q_h; k_h; v_h]; the arena wants [q; k; v].
TEST(ParamTable, GptNeoxQkvIsDeinterleavedAtTheBoundaryAndBack) {
    const ModelConfig c = parse(kNeoxJson);  // H = 3, D = 8, C = 24
    const ParamTable t = model_param_table(c);
    const HfParam& p = *t.find_hf("gpt_neox.layers.0.attention.query_key_value.weight");
    EXPECT_EQ(p.layout, HfLayout::kQkvInterleavedPerHead);
    HostTensor hf(DType::kF32, p.shape), entry(DType::kF32, p.shape), back(DType::kF32, p.shape);
    for (int64_t i = 0; i < hf.numel(); ++i) hf.as<float>()[i] = float(i);
    hf_param_import(p, entry.view(), hf.view());
    const int64_t C = 24, D = 8, H = 3;
    // Head 2's key row d=5 sits at HF row 2*3D + D + 5 and at arena row H*D + 2*D + 5.
    EXPECT_EQ(entry.as<float>()[(H * D + 2 * D + 5) * C + 1],
              hf.as<float>()[(2 * 3 * D + D + 5) * C + 1]);
    hf_param_export(p, entry.view(), back.view());
    for (int64_t i = 0; i < hf.numel(); ++i) ASSERT_EQ(back.as<float>()[i], hf.as<float>()[i]);

    const HfParam& bias = *t.find_hf("gpt_neox.layers.0.attention.query_key_value.bias");
    HostTensor hb(DType::kF32, bias.shape), eb(DType::kF32, bias.shape);
    for (int64_t i = 0; i < hb.numel(); ++i) hb.as<float>()[i] = float(i);
    hf_param_import(bias, eb.view(), hb.view());
    EXPECT_EQ(eb.as<float>()[2 * H * D + 1 * D + 3],
              hb.as<float>()[1 * 3 * D + 2 * D + 3]);  // v, head 1
}

TEST(ParamTable, Gpt2Conv1DWeightsAreTransposedAtTheBoundary) {
    const ModelConfig c = parse(kGpt2Json);
    const ParamTable t = model_param_table(c);
    const HfParam& p = *t.find_hf("transformer.h.0.mlp.c_fc.weight");
    EXPECT_EQ(p.shape, (Shape{16, 64}));                     // HF Conv1D: [in, out]
    EXPECT_EQ(t.entries()[p.entry].shape, (Shape{64, 16}));  // arena: [out, in]
    HostTensor hf(DType::kF32, p.shape), entry(DType::kF32, Shape{64, 16});
    for (int64_t i = 0; i < hf.numel(); ++i) hf.as<float>()[i] = float(i);
    hf_param_import(p, entry.view(), hf.view());
    EXPECT_EQ(entry.as<float>()[5 * 16 + 3], hf.as<float>()[3 * 64 + 5]);
    EXPECT_EQ(t.find_hf("lm_head.weight"), nullptr);  // tied
    EXPECT_NE(t.find_entry(ParamRole::kPositionEmbedding), ParamTable::kNone);
}

TEST(ModelInit, SeededNormalWithScaledOutputProjectionsOnesAndZeros) {
    const ModelConfig c = parse(kNeoxJson);
    Model a = make(c, 1, 4, 1234), b = make(c, 1, 4, 1234), other = make(c, 1, 4, 99);
    const std::vector<float> pa = [&] {
        const ConstTensorView v = a.params_flat();
        return std::vector<float>(v.as<float>(), v.as<float>() + v.numel());
    }();
    const ConstTensorView vb = b.params_flat(), vo = other.params_flat();
    EXPECT_TRUE(std::equal(pa.begin(), pa.end(), vb.as<float>()));
    EXPECT_FALSE(std::equal(pa.begin(), pa.end(), vo.as<float>()));

    auto stats = [&](std::string_view name) {
        const HfParam& p = *a.params().find_hf(name);
        HostTensor t(DType::kF32, p.shape);
        model_read_param_hf(a, name, t.view());
        double sum = 0, sq = 0;
        for (int64_t i = 0; i < t.numel(); ++i) {
            sum += t.as<float>()[i];
            sq += double(t.as<float>()[i]) * t.as<float>()[i];
        }
        const double mean = sum / double(t.numel());
        return std::pair{mean, std::sqrt(sq / double(t.numel()) - mean * mean)};
    };
    const auto [m_embed, s_embed] = stats("gpt_neox.embed_in.weight");  // 960 draws
    EXPECT_NEAR(m_embed, 0.0, 0.003);
    EXPECT_NEAR(s_embed, 0.02, 0.002);
    const auto [m_out, s_out] = stats("gpt_neox.layers.0.mlp.dense_4h_to_h.weight");  // 960 draws
    EXPECT_NEAR(s_out, 0.02 / std::sqrt(2.0), 0.002);                                 // L = 1
    EXPECT_EQ(stats("gpt_neox.layers.0.input_layernorm.weight"), (std::pair{1.0, 0.0}));
    EXPECT_EQ(stats("gpt_neox.layers.0.attention.dense.bias"), (std::pair{0.0, 0.0}));
    // A tensor's draws depend on its name, not on its place: the first normal of the stream.
    HostTensor embed(DType::kF32, Shape{40, 24});
    model_read_param_hf(a, "gpt_neox.embed_in.weight", embed.view());
    EXPECT_EQ(embed.as<float>()[0],
              float(0.02 * init_normal(1234, init_key("gpt_neox.embed_in.weight"), 0)));
}

// The stream is a contract (a seed names the same weights in every build): the bits below are
// the Box-Muller formula of init.h evaluated independently (Python's math module over the same
// libm, rounded to float32 by struct.pack).
TEST(Init, StreamBitsAreFixedAndPairsGiveBothHalves) {
    const uint64_t key = init_key("model.layers.0.mlp.down_proj.weight");
    const std::pair<uint64_t, uint32_t> golden[] = {
        {0, 0x3c1e44b6u}, {1, 0x3e6be0e6u},    {2, 0x3f332a4au},
        {3, 0xbf8b715bu}, {1001, 0xbf9f3e46u}, {(uint64_t(1) << 33) + 1, 0xbf924397u}};
    for (const auto& [index, bits] : golden) {
        EXPECT_EQ(std::bit_cast<uint32_t>(init_normal(1234, key, index)), bits) << index;
        float pair[2];
        init_normal_pair(1234, key, index - index % 2, pair);
        EXPECT_EQ(std::bit_cast<uint32_t>(pair[index % 2]), bits) << index;
    }
}

// init_hf_param fills a tensor pair by pair, in parallel: every element, the odd last one
// included, is what HfParamInit::at gives it alone.
TEST(Init, WholeTensorEqualsTheElementwiseDraws) {
    const ModelConfig c = parse(kLlamaJson);
    const ParamTable t = model_param_table(c);
    for (const HfParam& p : t.hf_params()) {
        const ParamEntry& e = t.entries()[p.entry];
        HostTensor entry(DType::kF32, e.shape);
        init_hf_param(c, p, entry.view(), 77);
        const TensorView rows = entry.view().slice(p.row_begin, p.row_begin + p.rows);
        const HfParamInit init = hf_param_init(c, p);
        for (int64_t i = 0; i < rows.numel(); ++i)
            ASSERT_EQ(std::bit_cast<uint32_t>(rows.as<float>()[i]),
                      std::bit_cast<uint32_t>(init.at(77, i)))
                << p.name << " element " << i;
    }
    // An odd count large enough for the threads: 2^17 + 1 rows of one element.
    HfParam odd = t.hf_params().front();
    odd.row_begin = 0;
    odd.rows = (int64_t(1) << 17) + 1;
    odd.init = InitKind::kNormal;
    HostTensor column(DType::kF32, Shape{odd.rows, 1});
    init_hf_param(c, odd, column.view(), 5);
    const HfParamInit init = hf_param_init(c, odd);
    for (int64_t i = 0; i < odd.rows; ++i)
        ASSERT_EQ(std::bit_cast<uint32_t>(column.as<float>()[i]),
                  std::bit_cast<uint32_t>(init.at(5, i)))
            << i;
}

TEST(MemoryPlan, CategoriesAddUpAndTheTablePrintsThem) {
    const ModelConfig c = parse(kLlamaJson);
    const ParamTable t = model_param_table(c);
    Result<MemoryPlan> plan = memory_plan_make(c, t, ModelShape{2, 16, 0});
    ASSERT_TRUE(plan.ok()) << plan.status().to_string();
    EXPECT_EQ(plan->parameter_bytes(), t.layout().total_bytes());
    EXPECT_GE(plan->parameter_bytes(), size_t(model_config_num_parameters(c)) * 4);
    EXPECT_EQ(plan->optimizer_bytes(), 2 * plan->parameter_bytes());
    EXPECT_EQ(plan->total_bytes(),
              plan->parameter_bytes() * 4 + plan->activation_bytes() + plan->scratch_bytes());
    EXPECT_EQ(plan->shape.lm_head_chunk_rows, 32);  // B*T rows fit the default budget
    // Per layer: x, ln1_out, q (32 wide), k, v (16), att, x_mid, ln2_out, mlp_in (96), mlp_act
    // (48) per token, rstd x2 per token, lse per head per token.
    const size_t per_token = (32 + 32 + 32 + 16 + 16 + 32 + 32 + 32 + 96 + 48 + 2 + 4) * 4;
    EXPECT_GE(plan->activation_bytes(), 2 * 32 * per_token);
    const std::string table = plan->table(model_config_summary(c));
    for (const char* row :
         {"parameters", "gradients", "optimizer state", "activations", "scratch", "total"})
        EXPECT_NE(table.find(row), std::string::npos) << table;
    EXPECT_NE(table.find(std::to_string(plan->total_bytes())), std::string::npos) << table;
    // bf16 moments (optimizer.state_dtype: bf16): half the optimizer state, named in the table.
    ModelShape bf16_state{2, 16, 0};
    bf16_state.optimizer_state = AdamWStateDType::kBF16;
    Result<MemoryPlan> half = memory_plan_make(c, t, bf16_state);
    ASSERT_TRUE(half.ok()) << half.status().to_string();
    EXPECT_EQ(half->optimizer_bytes(), plan->parameter_bytes());
    EXPECT_EQ(half->total_bytes(), plan->total_bytes() - plan->parameter_bytes());
    EXPECT_NE(half->table("x").find("optimizer state (m, v in bf16)"), std::string::npos);
}

// On CUDA cuDNN's attention workspace lives in scratch over the buffers dead during attention:
// those are contiguous at the end (the LM head's chunk included), the live ones (datt, dq, dk, dv,
// dres; dnorm2 with the parallel residual) before them, and only what the workspace needs beyond
// them is added. The CPU plan has no workspace.
TEST(MemoryPlan, TheAttentionWorkspaceSharesTheScratchDeadDuringAttention) {
    for (std::string_view json : {kLlamaJson, kNeoxJson}) {
        const ModelConfig c = parse(json);
        SCOPED_TRACE(c.model_type);
        const ParamTable t = model_param_table(c);
        ModelShape shape{2, 16, 0};
        shape.backend = Backend::kCuda;
        for (size_t workspace : {size_t(0), size_t(1000), size_t(1) << 20}) {
            shape.attention_workspace_bytes = workspace;
            Result<MemoryPlan> plan = memory_plan_make(c, t, shape);
            ASSERT_TRUE(plan.ok()) << plan.status().to_string();
            const ArenaLayout& scr = plan->scratch;
            EXPECT_EQ(plan->attention_workspace, workspace);
            EXPECT_EQ(plan->attention_offset + plan->attention_bytes, scr.total_bytes());
            EXPECT_GE(plan->attention_bytes, workspace);
            size_t dead_end = scr.total_bytes();
            bool has_extra = false;
            for (const ArenaEntry& e : scr.entries()) {
                const bool in_region = e.offset >= plan->attention_offset;
                const bool dead_name = e.name == "block.tmp" || e.name == "block.dnorm1" ||
                                       e.name == "block.dmlp_act" || e.name == "block.dmlp_in" ||
                                       e.name == "lm_head.logits_chunk" ||
                                       (e.name == "block.dnorm2" && !c.parallel_residual);
                if (e.name == "attention.workspace") {
                    has_extra = true;
                    dead_end = e.offset;
                    continue;
                }
                EXPECT_EQ(in_region, dead_name) << e.name;
            }
            const size_t dead = dead_end - plan->attention_offset;
            EXPECT_EQ(plan->attention_backward_cap, dead);
            EXPECT_EQ(plan->attention_shared, std::min(dead, workspace));
            EXPECT_EQ(has_extra, workspace > dead) << dead;
            // One block's scratch entries are all there, in block_scratch_for_each order.
            size_t i = 0;
            block_scratch_for_each(
                c, 2, 16, DType::kBF16, [&](const char* name, auto, DType, Shape) {
                    EXPECT_EQ(scr.entries()[plan->block_scratch[i++]].name, name);
                });
            if (workspace > 0) {
                EXPECT_NE(plan->table("t").find("cuDNN's attention workspace"), std::string::npos);
            }
        }
        // Unset: the estimate of cuDNN's deterministic backward.
        shape.attention_workspace_bytes.reset();
        Result<MemoryPlan> estimated = memory_plan_make(c, t, shape);
        ASSERT_TRUE(estimated.ok());
        EXPECT_EQ(estimated->attention_workspace,
                  memory_plan_attention_workspace_estimate(c, 2, 16));
        shape.backend = Backend::kCpu;
        Result<MemoryPlan> cpu = memory_plan_make(c, t, shape);
        ASSERT_TRUE(cpu.ok());
        EXPECT_EQ(cpu->attention_workspace, 0u);
        EXPECT_EQ(cpu->attention_bytes, 0u);
    }
    // What cuDNN 9.14 asked for on the H200 (docs/CUDA.md): Llama-3.2-1B at B = 8, T = 2048
    // (H 32, Hkv 8, D 64) 2178 MiB; GPT-2 124M at B = 32, T = 1024 (H = Hkv = 12) 769.5 MiB.
    ModelConfig shape = parse(kLlamaJson);
    shape.num_heads = 32;
    shape.num_kv_heads = 8;
    shape.head_dim = 64;
    EXPECT_EQ(memory_plan_attention_workspace_estimate(shape, 8, 2048), size_t(2178) << 20);
    shape.num_heads = shape.num_kv_heads = 12;
    EXPECT_EQ(memory_plan_attention_workspace_estimate(shape, 32, 1024), size_t(1539) << 19);
}

// An fp8 policy on CUDA adds the fp8 buffers' arena (memory_plan.h): per layer and FP8 linear
// the weight's codes (O, I), their transpose (I, O) and the saved input codes (I, N), one byte an
// element; the shared cast scratch (xq / dyq: the largest N I or N O; dyqt: the largest N O);
// 24 scalars per linear; with delayed scaling a scale and an amax per scaled tensor. The table
// prints the row; a plan without fp8 roles has none (and its table no fp8 line).
// The deterministic attention backward runs in batch chunks whose workspace fits the scratch
// dead during attention (MemoryPlan::attention_backward_cap): the estimate a plan without a GPU
// counts takes the chunk cuda::attention_backward_chunk_rows picks. The three training shapes of
// docs/PERF.md: GPT-2 fits whole, Llama-1B runs 2 chunks of 4 rows within the dead scratch, the
// Llama-3-8B slice one row a call (its estimated row does not fit: only the rest is added).
TEST(MemoryPlan, TheAttentionBackwardRunsInBatchChunksThatFitTheDeadScratch) {
    struct Case {
        const char* json;
        int64_t B, T, chunk_rows;
    };
    const Case cases[] = {
        {R"({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": 50304,
             "n_embd": 768, "n_layer": 12, "n_head": 12, "n_positions": 1024})",
         32, 1024, 32},
        {R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128256,
             "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
             "num_attention_heads": 32, "num_key_value_heads": 8,
             "max_position_embeddings": 2048, "tie_word_embeddings": true})",
         8, 2048, 4},
        {R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128256,
             "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 8,
             "num_attention_heads": 32, "num_key_value_heads": 8,
             "max_position_embeddings": 4096, "tie_word_embeddings": false})",
         2, 4096, 1},
    };
    for (const Case& k : cases) {
        const ModelConfig c = parse(k.json);
        SCOPED_TRACE(fmt::format("{} B={} T={}", c.model_type, k.B, k.T));
        const ParamTable t = model_param_table(c);
        ModelShape shape{k.B, k.T, 0};
        shape.backend = Backend::kCuda;
        Result<MemoryPlan> plan = memory_plan_make(c, t, shape);
        ASSERT_TRUE(plan.ok()) << plan.status().to_string();
        const size_t whole = memory_plan_attention_workspace_estimate(c, k.B, k.T);
        const size_t chunked = memory_plan_attention_workspace_estimate(c, k.chunk_rows, k.T);
        EXPECT_EQ(cuda::attention_backward_chunk_rows(k.B, whole, plan->attention_backward_cap),
                  k.chunk_rows);
        EXPECT_EQ(plan->attention_workspace, chunked);
        const size_t dead = plan->attention_backward_cap;
        EXPECT_EQ(plan->attention_bytes, std::max(dead, chunked));
        EXPECT_EQ(plan->attention_shared, std::min(dead, chunked));
        // The same plan with the whole batch's workspace (what one call would ask for) holds
        // exactly what the chunks save beyond the dead scratch.
        ModelShape one_call = shape;
        one_call.attention_workspace_bytes = whole;
        Result<MemoryPlan> whole_plan = memory_plan_make(c, t, one_call);
        ASSERT_TRUE(whole_plan.ok());
        EXPECT_EQ(whole_plan->attention_backward_cap, dead);
        EXPECT_EQ(whole_plan->total_bytes() - plan->total_bytes(),
                  std::max(dead, whole) - std::max(dead, chunked));
        if (k.chunk_rows < k.B) {
            EXPECT_GT(whole, dead);
            EXPECT_LT(plan->total_bytes(), whole_plan->total_bytes());
        }
    }
}

TEST(MemoryPlan, Fp8PolicyAddsEachLinearsBuffers) {
    const ModelConfig c = parse(kLlamaJson);  // C 32, H 4 x D 8, Hkv 2, F 48, 2 layers
    const ParamTable t = model_param_table(c);
    const int64_t N = 2 * 16;
    for (Fp8Recipe recipe : {Fp8Recipe::kTensorwise, Fp8Recipe::kDelayed, Fp8Recipe::kBlockwise}) {
        SCOPED_TRACE(std::string(fp8_recipe_name(recipe)));
        const bool blockwise = recipe == Fp8Recipe::kBlockwise;
        ModelShape shape{2, 16, 0};
        shape.backend = Backend::kCuda;
        shape.attention_workspace_bytes = 0;
        const Result<MemoryPlan> bf16 = memory_plan_make(c, t, shape);
        ASSERT_TRUE(bf16.ok());
        EXPECT_EQ(bf16->fp8_bytes(), 0u);
        EXPECT_EQ(bf16->table("t").find("fp8"), std::string::npos) << bf16->table("t");
        shape.fp8.recipe = recipe;
        shape.precision = fp8_precision_policy(shape.fp8);
        const Result<MemoryPlan> plan = memory_plan_make(c, t, shape);
        ASSERT_TRUE(plan.ok()) << plan.status().to_string();
        const ArenaLayout& f8 = plan->fp8;
        // (I, O) of q, k, v (stacked), attention output, MLP up (gate and up), MLP down.
        const int64_t dims[4][2] = {{32, 64}, {32, 32}, {32, 96}, {48, 32}};
        size_t sum = 0;
        ASSERT_EQ(plan->fp8_linears.size(), 2u);
        for (size_t l = 0; l < 2; ++l) {
            for (size_t i = 0; i < 4; ++i) {
                const Fp8LinearEntries& e = plan->fp8_linears[l][i];
                const int64_t I = dims[i][0], O = dims[i][1];
                ASSERT_NE(e.wq, MemoryPlan::kNoEntry);
                EXPECT_EQ(f8.entries()[e.wq].bytes, size_t(O * I));
                EXPECT_EQ(f8.entries()[e.wq].shape, Shape({O, I}));
                EXPECT_EQ(f8.entries()[e.wqt].shape, Shape({I, O}));
                EXPECT_EQ(f8.entries()[e.xqt].shape, Shape({I, N}));
                EXPECT_EQ(f8.entries()[e.wq].dtype, DType::kE4M3);
                sum += size_t(2 * O * I + I * N);
                if (blockwise) {
                    // The weight's two scale grids and the saved input's, as ops/fp8_blockwise.h
                    // sizes them; no per-tensor scalars.
                    const Fp8BlockwiseBufferBytes bb = fp8_blockwise_buffer_bytes(N, I, O);
                    EXPECT_EQ(e.scalars_offset, -1);
                    EXPECT_EQ(f8.entries()[e.w_scale].bytes, bb.w_scale);
                    EXPECT_EQ(f8.entries()[e.wt_scale].bytes, bb.wt_scale);
                    EXPECT_EQ(f8.entries()[e.xt_scale].bytes, bb.xt_scale);
                    sum += bb.w_scale + bb.wt_scale + bb.xt_scale;
                } else {
                    EXPECT_EQ(e.scalars_offset, int64_t((l * 4 + i) * 24));
                    EXPECT_EQ(e.w_scale, MemoryPlan::kNoEntry);
                }
            }
        }
        EXPECT_EQ(f8.entries()[plan->fp8_linears[1][2].wq].name, "layers.1.fp8.mlp_up.wq");
        EXPECT_EQ(f8.entries()[plan->fp8_linears[0][0].xqt].name, "layers.0.fp8.qkv.xqt");
        EXPECT_EQ(f8.entries()[plan->fp8_q_scratch].bytes, size_t(N * 96));  // N x (2F)
        EXPECT_EQ(f8.entries()[plan->fp8_dyqt].bytes, size_t(N * 96));
        sum += size_t(2 * N * 96);
        if (blockwise) {
            // Shared: x_scale / dy_scale, dyt_scale, the casts' scales: the largest of any linear.
            size_t xdy = 0, dyt = 0, cast = 0;
            for (const auto& d : dims) {
                const Fp8BlockwiseBufferBytes bb = fp8_blockwise_buffer_bytes(N, d[0], d[1]);
                xdy = std::max({xdy, bb.x_scale, bb.dy_scale});
                dyt = std::max(dyt, bb.dyt_scale);
                cast = std::max(cast, bb.cast_scales);
            }
            EXPECT_EQ(f8.entries()[plan->fp8_scale_scratch].bytes, xdy);
            EXPECT_EQ(f8.entries()[plan->fp8_dyt_scale].bytes, dyt);
            EXPECT_EQ(f8.entries()[plan->fp8_cast_scales].bytes, cast);
            EXPECT_EQ(plan->fp8_scalars, MemoryPlan::kNoEntry);
            sum += xdy + dyt + cast;
        } else {
            EXPECT_EQ(f8.entries()[plan->fp8_scalars].shape, Shape({2 * 4 * 24}));
            sum += size_t(2 * 4 * 24 * 4);
        }
        if (recipe == Fp8Recipe::kDelayed) {
            EXPECT_EQ(f8.entries()[plan->fp8_scales].shape, Shape({2 * 4 * 3}));
            EXPECT_EQ(f8.entries()[plan->fp8_step_amax].shape, Shape({2 * 4 * 3}));
            EXPECT_EQ(f8.entries()[plan->fp8_eval_amax].shape, Shape({2 * 4 * 3}));
            sum += 3 * 2 * 4 * 3 * 4;
        } else {
            EXPECT_EQ(plan->fp8_scales, MemoryPlan::kNoEntry);
            EXPECT_EQ(plan->fp8_step_amax, MemoryPlan::kNoEntry);
            EXPECT_EQ(plan->fp8_eval_amax, MemoryPlan::kNoEntry);
        }
        EXPECT_GE(plan->fp8_bytes(), sum);
        EXPECT_LT(plan->fp8_bytes(), sum + f8.size() * f8.alignment());  // alignment only
        EXPECT_EQ(plan->total_bytes(), bf16->total_bytes() + plan->fp8_bytes());
        const std::string table = plan->table("t");
        EXPECT_NE(table.find("fp8 buffers (codes, scales)"), std::string::npos) << table;
        EXPECT_NE(table.find(std::to_string(plan->fp8_bytes())), std::string::npos) << table;
        EXPECT_NE(table.find("8 linears (" + std::string(fp8_recipe_name(recipe)) + ")"),
                  std::string::npos)
            << table;
        // The CPU plans no fp8 buffers (Model::create refuses fp8 roles there).
        shape.backend = Backend::kCpu;
        EXPECT_EQ(memory_plan_make(c, t, shape)->fp8_bytes(), 0u);
    }
}

// What an fp8 policy needs of the model and the batch, each refusal naming its key or dimension;
// and the CPU backend refused at creation, naming it.
TEST(Model, Fp8PolicyChecksNameWhatIsMissing) {
    const ModelConfig c = parse(kLlamaJson);
    ModelShape shape{2, 16, 0};
    Fp8Settings f8;
    shape.precision = fp8_precision_policy(f8);
    EXPECT_TRUE(model_check_fp8(c, shape).ok());
    auto message = [&](const ModelConfig& config, const ModelShape& s) {
        const Status st = model_check_fp8(config, s);
        return st.ok() ? std::string("ok") : std::string(st.message());
    };
    f8.lm_head = true;
    ModelShape head = shape;
    head.precision = fp8_precision_policy(f8);
    EXPECT_TRUE(model_check_fp8(c, head).ok()) << message(c, head);  // per-tensor: runs
    ModelConfig odd_vocab = c;
    odd_vocab.vocab_size = 72;
    EXPECT_NE(message(odd_vocab, head).find("LM head of llama is 32 x 72"), std::string::npos)
        << message(odd_vocab, head);
    f8.recipe = Fp8Recipe::kBlockwise;
    f8.grad_dtype = DType::kE4M3;
    head.precision = fp8_precision_policy(f8);
    EXPECT_NE(message(c, head).find("fp8.lm_head: true with fp8.recipe: blockwise"),
              std::string::npos)
        << message(c, head);
    f8 = Fp8Settings{};
    f8.recipe = Fp8Recipe::kBlockwise;
    ModelShape block = shape;
    block.precision = fp8_precision_policy(f8);
    EXPECT_TRUE(model_check_fp8(c, block).ok()) << message(c, block);  // ops/linear runs it
    EXPECT_NE(message(parse(kGpt2Json), shape).find("GELU MLP"), std::string::npos);
    ModelShape odd = shape;
    odd.seq_len = 15;  // 30 tokens
    EXPECT_NE(message(c, odd).find("= 30) must be a multiple of 16"), std::string::npos)
        << message(c, odd);
    ModelConfig narrow = c;
    narrow.intermediate_size = 40;  // mlp_down's input 40
    EXPECT_NE(message(narrow, shape).find("mlp_down linear of llama is 40 x 32"), std::string::npos)
        << message(narrow, shape);
    const Result<Model> cpu = Model::create(c, shape, cpu_context());
    ASSERT_FALSE(cpu.ok());
    EXPECT_NE(cpu.status().message().find("on the cpu backend"), std::string::npos);
}

// fp8.lm_head: the head's weight codes (V, C) and their transpose (C, V), 24 more scalars after
// the layers', x's codes in the shared buffers (at least N C each), the chunk's rows a multiple
// of 16; the table counts the head as a linear; CPU plans none of it.
TEST(MemoryPlan, Fp8LmHeadAddsItsWeightCodes) {
    const ModelConfig c = parse(kLlamaJson);  // V 64, C 32, 2 layers
    const ParamTable t = model_param_table(c);
    for (Fp8Recipe recipe : {Fp8Recipe::kTensorwise, Fp8Recipe::kDelayed}) {
        SCOPED_TRACE(std::string(fp8_recipe_name(recipe)));
        ModelShape shape{2, 16, 5};  // 5 chunk rows asked for: 16 for the FP8 head
        shape.backend = Backend::kCuda;
        shape.attention_workspace_bytes = 0;
        shape.fp8.recipe = recipe;
        shape.precision = fp8_precision_policy(shape.fp8);
        const Result<MemoryPlan> layers = memory_plan_make(c, t, shape);
        ASSERT_TRUE(layers.ok());
        EXPECT_EQ(layers->fp8_head.wq, MemoryPlan::kNoEntry);
        EXPECT_EQ(layers->shape.lm_head_chunk_rows, 5);
        shape.fp8.lm_head = true;
        shape.precision = fp8_precision_policy(shape.fp8);
        const Result<MemoryPlan> plan = memory_plan_make(c, t, shape);
        ASSERT_TRUE(plan.ok()) << plan.status().to_string();
        const ArenaLayout& f8 = plan->fp8;
        ASSERT_NE(plan->fp8_head.wq, MemoryPlan::kNoEntry);
        EXPECT_EQ(f8.entries()[plan->fp8_head.wq].name, "lm_head.fp8.wq");
        EXPECT_EQ(f8.entries()[plan->fp8_head.wq].shape, Shape({64, 32}));
        EXPECT_EQ(f8.entries()[plan->fp8_head.wq].dtype, DType::kE4M3);
        EXPECT_EQ(f8.entries()[plan->fp8_head.wqt].shape, Shape({32, 64}));
        EXPECT_EQ(plan->fp8_head.scalars_offset, 2 * 4 * 24);
        EXPECT_EQ(f8.entries()[plan->fp8_scalars].shape, Shape({(2 * 4 + 1) * 24}));
        EXPECT_GE(f8.entries()[plan->fp8_q_scratch].bytes, size_t(32 * 32));
        EXPECT_GE(f8.entries()[plan->fp8_dyqt].bytes, size_t(32 * 32));
        EXPECT_EQ(plan->shape.lm_head_chunk_rows, 16);
        if (recipe == Fp8Recipe::kDelayed) {
            EXPECT_EQ(f8.entries()[plan->fp8_scales].shape, Shape({2 * 4 * 3 + 3}));
        }
        // The weight codes (2 V C bytes) more than the layers' plan (the 24 scalars may fit in
        // the scalars entry's alignment padding: its shape is checked above).
        EXPECT_GE(plan->fp8_bytes(), layers->fp8_bytes() + 2 * 64 * 32);
        EXPECT_NE(plan->table("t").find("9 linears"), std::string::npos) << plan->table("t");
        shape.backend = Backend::kCpu;
        EXPECT_EQ(memory_plan_make(c, t, shape)->fp8_bytes(), 0u);
    }
}

// The default chunk on CUDA: the bf16 budget's rows, four times as many bytes for the FP8 head
// (memory_plan.h, kLmHeadChunkBytesCudaFp8), at most B*T; rows asked for are kept.
TEST(MemoryPlan, Fp8LmHeadChunkHasFourTimesTheBf16Budget) {
    std::string json(kLlamaJson);
    json.replace(json.find("\"vocab_size\": 64"), 16, "\"vocab_size\": 128256");
    const ModelConfig c = parse(json);
    const ParamTable t = model_param_table(c);
    ModelShape shape{256, 32, 0};  // N = 8192 rows
    shape.backend = Backend::kCuda;
    shape.attention_workspace_bytes = 0;
    const Result<MemoryPlan> bf16 = memory_plan_make(c, t, shape);
    ASSERT_TRUE(bf16.ok()) << bf16.status().to_string();
    EXPECT_EQ(bf16->shape.lm_head_chunk_rows, int64_t((size_t(512) << 20) / (128256 * 4)));
    shape.fp8.lm_head = true;
    shape.precision = fp8_precision_policy(shape.fp8);
    const Result<MemoryPlan> fp8 = memory_plan_make(c, t, shape);
    ASSERT_TRUE(fp8.ok()) << fp8.status().to_string();
    EXPECT_EQ(fp8->shape.lm_head_chunk_rows, 4192);  // 4,186 rounded up to 16
    EXPECT_EQ(fp8->scratch.entries()[fp8->lm_chunk].bytes, size_t(4192) * 128256 * 4);
    shape.lm_head_chunk_rows = 1000;
    EXPECT_EQ(memory_plan_make(c, t, shape)->shape.lm_head_chunk_rows, 1008);
}

TEST(MemoryPlan, SequenceLongerThanTheModelAllowsNamesTheKey) {
    const ModelConfig c = parse(kGpt2Json);
    Result<MemoryPlan> plan = memory_plan_make(c, model_param_table(c), ModelShape{1, 13, 0});
    ASSERT_FALSE(plan.ok());
    EXPECT_NE(plan.status().message().find("n_positions"), std::string::npos)
        << plan.status().message();
    EXPECT_FALSE(memory_plan_make(c, model_param_table(c), ModelShape{0, 4, 0}).ok());
}

// Two micro-batches weighted 0.5 each accumulate the gradient of their mean.
TEST(Model, GradientsAccumulateAcrossMicroBatches) {
    const ModelConfig c = parse(kLlamaJson);
    Model m = make(c, 2, 8);
    const HostTensor t1 = ids(2, 8, 64, 1), y1 = ids(2, 8, 64, 2);
    const HostTensor t2 = ids(2, 8, 64, 3), y2 = ids(2, 8, 64, 4);
    const ModelBatch b1{t1.view(), y1.view(), {}, {}}, b2{t2.view(), y2.view(), {}, {}};
    m.zero_grads();
    m.forward_backward(b1, 1.0f);
    const std::vector<float> g1 = grads_of(m);
    m.zero_grads();
    m.forward_backward(b2, 1.0f);
    const std::vector<float> g2 = grads_of(m);
    m.zero_grads();
    m.forward_backward(b1, 0.5f);
    m.forward_backward(b2, 0.5f);
    const std::vector<float> g = grads_of(m);
    double worst = 0, scale = 0;
    for (size_t i = 0; i < g.size(); ++i) {
        worst = std::max(worst, std::abs(double(g[i]) - 0.5 * (double(g1[i]) + double(g2[i]))));
        scale = std::max(scale, std::abs(double(g[i])));
    }
    EXPECT_GT(scale, 0.0);
    EXPECT_LT(worst / scale, 1e-5);
}

// eval_forward (a validation loss) gives forward()'s loss bits, and a training step after it the
// same loss and gradient bits as one without it.
TEST(Model, EvalForwardGivesForwardsLossAndLeavesTheNextStepAsItIs) {
    const ModelConfig c = parse(kLlamaJson);
    Model a = make(c, 2, 8), b = make(c, 2, 8);
    const HostTensor t1 = ids(2, 8, 64, 5), y1 = ids(2, 8, 64, 6);
    const HostTensor t2 = ids(2, 8, 64, 7), y2 = ids(2, 8, 64, 8);
    const ModelBatch train{t1.view(), y1.view(), {}, {}}, valid{t2.view(), y2.view(), {}, {}};
    const float eval_loss = a.eval_forward(valid);
    EXPECT_TRUE(std::isfinite(eval_loss));
    EXPECT_EQ(eval_loss, b.forward(valid));
    a.zero_grads();
    b.zero_grads();
    EXPECT_EQ(a.forward_backward(train), b.forward_backward(train));
    EXPECT_EQ(grads_of(a), grads_of(b));
}

// forward_backward_async keeps each micro-batch's loss in its slot until read_losses: the same
// losses and bitwise the same accumulated gradients as forward_backward one by one, with the
// caller's batch memory overwritten right after each call (the model copied it).
TEST(Model, AsyncMicroBatchesKeepTheirLossesInSlots) {
    const ModelConfig c = parse(kLlamaJson);
    Model m = make(c, 2, 8);
    std::vector<HostTensor> tok, tgt;
    for (uint64_t k = 0; k < 3; ++k) {
        tok.push_back(ids(2, 8, c.vocab_size, 20 + k));
        tgt.push_back(ids(2, 8, c.vocab_size, 30 + k));
    }
    m.zero_grads();
    std::vector<float> want;
    for (size_t k = 0; k < 3; ++k)
        want.push_back(m.forward_backward(ModelBatch{tok[k].view(), tgt[k].view(), {}, {}}, 0.25f));
    const std::vector<float> want_grads = grads_of(m);
    m.zero_grads();
    HostTensor t(DType::kI32, Shape{2, 8}), y(DType::kI32, Shape{2, 8});
    for (size_t k = 0; k < 3; ++k) {
        std::memcpy(t.view().data(), tok[k].view().data(), t.view().bytes());
        std::memcpy(y.view().data(), tgt[k].view().data(), y.view().bytes());
        m.forward_backward_async(ModelBatch{t.view(), y.view(), {}, {}}, 0.25f, int64_t(k));
        std::memset(t.view().data(), 0xFF, t.view().bytes());  // reused at once: must not matter
        std::memset(y.view().data(), 0xFF, y.view().bytes());
    }
    std::vector<float> got(3);
    m.read_losses(got);
    EXPECT_EQ(got, want);
    EXPECT_EQ(grads_of(m), want_grads);
    EXPECT_EQ(m.plan().activations.entries()[m.plan().loss].shape.numel(), kLossSlots);
}

// A batch smaller than planned (B and T) computes what a model planned for it computes.
TEST(Model, SmallerBatchThanPlannedGivesTheSameLossAndGradients) {
    for (std::string_view json : {kLlamaJson, kNeoxJson, kGpt2Json}) {
        const ModelConfig c = parse(json);
        Model big = make(c, 3, 12), exact = make(c, 2, 5);
        const HostTensor tok = ids(2, 5, c.vocab_size, 5), tgt = ids(2, 5, c.vocab_size, 6);
        const ModelBatch batch{tok.view(), tgt.view(), {}, {}};
        big.zero_grads();
        exact.zero_grads();
        const float lb = big.forward_backward(batch), le = exact.forward_backward(batch);
        EXPECT_EQ(lb, le) << c.model_type;
        EXPECT_EQ(grads_of(big), grads_of(exact)) << c.model_type;
    }
}

// Activation recompute, selective and full: the same loss and bitwise the same gradients (the
// ops are deterministic, the recomputed tensors repeat the saved ones), with fewer activations
// (full fewer than selective). Packed documents with restarted positions take the same path.
TEST(Model, RecomputeGivesTheSameBitsWithFewerActivations) {
    for (std::string_view json : {kLlamaJson, kNeoxJson, kGpt2Json}) {
        const ModelConfig c = parse(json);
        Model keep = make(c, 2, 8);
        size_t previous_bytes = keep.plan().activation_bytes();
        for (Recompute mode : {Recompute::kSelective, Recompute::kFull}) {
            SCOPED_TRACE(fmt::format("{} {}", c.model_type, recompute_name(mode)));
            ModelShape shape{2, 8, 0};
            shape.recompute = mode;
            Result<Model> r = Model::create(c, shape, cpu_context());
            ASSERT_TRUE(r.ok()) << r.status().to_string();
            r->init(7);
            const HostTensor tok = ids(2, 8, c.vocab_size, 11), tgt = ids(2, 8, c.vocab_size, 12);
            HostTensor docs(DType::kI32, Shape{2, 8}), pos(DType::kI32, Shape{2, 8});
            for (int i = 0; i < 16; ++i) {
                docs.as<int32_t>()[i] = (i % 8) < 3 ? 0 : 1;
                pos.as<int32_t>()[i] = (i % 8) < 3 ? i % 8 : i % 8 - 3;
            }
            for (const ModelBatch& batch :
                 {ModelBatch{tok.view(), tgt.view(), {}, {}},
                  ModelBatch{tok.view(), tgt.view(), docs.view(), pos.view()}}) {
                keep.zero_grads();
                r->zero_grads();
                EXPECT_EQ(keep.forward_backward(batch), r->forward_backward(batch));
                EXPECT_EQ(grads_of(keep), grads_of(*r));
                // forward() then backward() takes the recompute path too (compared with the same
                // split calls without recompute: the split LM head is not bitwise the fused one).
                keep.zero_grads();
                keep.forward(batch);
                keep.backward();
                r->zero_grads();
                r->forward(batch);
                r->backward();
                EXPECT_EQ(grads_of(keep), grads_of(*r));
            }
            // Selective shares three tensors of every layer, full all but the input: each
            // keeps less than the mode before it.
            if (c.num_layers > 1) {
                EXPECT_LT(r->plan().activation_bytes(), previous_bytes);
            }
            previous_bytes = r->plan().activation_bytes();
            EXPECT_NE(r->plan().table("t").find(fmt::format("{} recompute", recompute_name(mode))),
                      std::string::npos);
        }
    }
}

// Selective recompute shares exactly the norm and activation outputs: the plan of every layer
// has its own GEMM and attention outputs and statistics, and one set of the three.
TEST(Model, SelectiveRecomputeSharesOnlyNormAndActivationOutputs) {
    const ModelConfig c = parse(kNeoxJson);  // LayerNorm: means are kept too
    ModelShape shape{2, 8, 0};
    shape.recompute = Recompute::kSelective;
    Result<Model> r = Model::create(c, shape, cpu_context());
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    std::vector<std::string> names;
    for (const ArenaEntry& e : r->plan().activations.entries()) names.push_back(e.name);
    auto has = [&](const std::string& n) {
        return std::find(names.begin(), names.end(), n) != names.end();
    };
    for (const char* shared : {"ln1_out", "ln2_out", "mlp_act"}) {
        EXPECT_TRUE(has(fmt::format("recompute.{}", shared))) << shared;
        for (int l = 0; l < int(c.num_layers); ++l)
            EXPECT_FALSE(has(fmt::format("layers.{}.{}", l, shared))) << shared;
    }
    for (int l = 0; l < int(c.num_layers); ++l)
        for (const char* kept : {"x", "ln1_mean", "ln1_rstd", "qkv", "att", "att_lse", "ln2_mean",
                                 "ln2_rstd", "mlp_in"})
            EXPECT_TRUE(has(fmt::format("layers.{}.{}", l, kept))) << l << " " << kept;
    EXPECT_EQ(recompute_from_name("selective"), Recompute::kSelective);
    EXPECT_EQ(recompute_from_name("partial"), std::nullopt);
}

// Per-document attention with restarted positions: a document packed after another computes what
// it computes alone.
TEST(Model, PackedDocumentsDoNotSeeEachOther) {
    for (std::string_view json : {kLlamaJson, kGpt2Json}) {
        const ModelConfig c = parse(json);
        Model m = make(c, 1, 10);
        const HostTensor tok = ids(1, 10, c.vocab_size, 8);
        HostTensor docs(DType::kI32, Shape{1, 10}), pos(DType::kI32, Shape{1, 10});
        for (int i = 0; i < 10; ++i) {
            docs.as<int32_t>()[i] = i < 4 ? 0 : 1;
            pos.as<int32_t>()[i] = i < 4 ? i : i - 4;
        }
        HostTensor packed(DType::kF32, Shape{1, 10, c.vocab_size});
        m.logits(packed.view(), ModelBatch{tok.view(), {}, docs.view(), pos.view()});
        HostTensor alone_tok(DType::kI32, Shape{1, 6});
        for (int i = 0; i < 6; ++i) alone_tok.as<int32_t>()[i] = tok.as<int32_t>()[4 + i];
        HostTensor alone(DType::kF32, Shape{1, 6, c.vocab_size});
        m.logits(alone.view(), ModelBatch{alone_tok.view(), {}, {}, {}});
        for (int64_t i = 0; i < 6 * c.vocab_size; ++i)
            ASSERT_NEAR(alone.as<float>()[i], packed.as<float>()[4 * c.vocab_size + i], 1e-5)
                << c.model_type << " element " << i;
    }
}

TEST(Model, AdamWSegmentsCoverEveryParameterWithDecayOnMatricesOnly) {
    const ModelConfig c = parse(kNeoxJson);
    Model m = make(c, 1, 4);
    const std::vector<AdamWSegment> segs = m.adamw_segments(1e-3, 0.1);
    ASSERT_EQ(segs.size(), m.params().entries().size());
    int64_t covered = 0;
    for (size_t i = 0; i < segs.size(); ++i) {
        const ParamEntry& e = m.params().entries()[i];
        EXPECT_EQ(segs[i].count, e.shape.numel());
        EXPECT_EQ(segs[i].offset * 4, int64_t(m.plan().params.entries()[e.arena_index].offset));
        EXPECT_EQ(segs[i].weight_decay, e.shape.rank() == 2 ? 0.1 : 0.0) << e.name;
        covered += segs[i].count;
    }
    EXPECT_EQ(covered, model_config_num_parameters(c));
}

TEST(Model, SavedCheckpointLoadsBackIdenticallyWithItsConfig) {
    for (std::string_view json : {kLlamaJson, kNeoxJson, kGpt2Json}) {
        const ModelConfig c = parse(json);
        const Model m = make(c, 1, 4, 42);
        const std::string dir = testing::TempDir() + "lathe_model_ckpt_" + c.model_type;
        std::filesystem::create_directories(dir);
        ASSERT_TRUE(model_save_hf(m, dir).ok());
        Result<ModelConfig> back_config = model_config_from_hf_file(dir + "/config.json");
        ASSERT_TRUE(back_config.ok()) << back_config.status().to_string();
        EXPECT_EQ(model_config_summary(*back_config), model_config_summary(c));
        Result<Model> back = Model::create(*back_config, ModelShape{1, 4, 0}, cpu_context());
        ASSERT_TRUE(back.ok());
        Result<SafetensorsCheckpoint> ckpt = SafetensorsCheckpoint::open(dir);
        ASSERT_TRUE(ckpt.ok()) << ckpt.status().to_string();
        // Stored shapes are the HF ones (GPT-2's Conv1D [in, out]).
        for (const HfParam& p : m.params().hf_params()) {
            Result<const SafetensorsTensor*> t = ckpt->tensor(p.name);
            ASSERT_TRUE(t.ok()) << p.name;
            EXPECT_EQ(int((*t)->shape.size()), p.shape.rank());
            EXPECT_EQ((*t)->shape[0], p.shape[0]) << p.name;
        }
        ASSERT_TRUE(model_load_hf(*back, *ckpt).ok());
        const ConstTensorView a = m.params_flat(), b = back->params_flat();
        EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.bytes())) << c.model_type;
        std::filesystem::remove_all(dir);
    }
}

// Checkpoints of the bare base model (no "transformer." prefix, as openai-community/gpt2 has
// them) in f16 and bf16 (Pythia ships f16) load into the f32 parameters exactly.
TEST(Model, LoadsHalfPrecisionAndPrefixlessCheckpoints) {
    const ModelConfig c = parse(kGpt2Json);
    Model src = make(c, 1, 4);
    // Values every format holds exactly: multiples of 1/8 in [-2, 2).
    const TensorView flat = src.params_flat();
    for (int64_t i = 0; i < flat.numel(); ++i)
        flat.as<float>()[i] = float((i * 37) % 32 - 16) / 8.0f;
    for (const SafetensorsDtype dtype : {SafetensorsDtype::kF16, SafetensorsDtype::kBF16}) {
        std::vector<std::vector<uint16_t>> data;
        std::vector<SafetensorsWriteTensor> tensors;
        for (const HfParam& p : src.params().hf_params()) {
            HostTensor t(DType::kF32, p.shape);
            model_read_param_hf(src, p.name, t.view());
            std::vector<uint16_t>& bits = data.emplace_back();
            for (int64_t i = 0; i < t.numel(); ++i) {
                const float v = t.as<float>()[i];
                if (dtype == SafetensorsDtype::kBF16) {
                    bits.push_back(float_to_bf16(v).bits);
                } else {  // exact for these values: sign, exponent rebiased 127 -> 15, mantissa
                    const uint32_t u = std::bit_cast<uint32_t>(v);
                    bits.push_back(v == 0.0f ? uint16_t(u >> 16)
                                             : uint16_t(((u >> 16) & 0x8000u) |
                                                        ((((u >> 23) & 0xFFu) - 112u) << 10) |
                                                        ((u >> 13) & 0x3FFu)));
                }
            }
            std::vector<int64_t> shape;
            for (int i = 0; i < p.shape.rank(); ++i) shape.push_back(p.shape[i]);
            tensors.push_back(
                SafetensorsWriteTensor{p.name.substr(std::string("transformer.").size()), dtype,
                                       shape, bits.data(), bits.size() * 2});
        }
        const std::string path = testing::TempDir() + "lathe_model_half.safetensors";
        ASSERT_TRUE(safetensors_write_file(path, tensors, {}).ok());
        Result<SafetensorsCheckpoint> ckpt = SafetensorsCheckpoint::open(path);
        ASSERT_TRUE(ckpt.ok()) << ckpt.status().to_string();
        Model dst = make(c, 1, 4, 5);
        const Status loaded = model_load_hf(dst, *ckpt);
        ASSERT_TRUE(loaded.ok()) << loaded.to_string();
        for (const HfParam& p : src.params().hf_params()) {
            HostTensor a(DType::kF32, p.shape), b(DType::kF32, p.shape);
            model_read_param_hf(src, p.name, a.view());
            model_read_param_hf(dst, p.name, b.view());
            EXPECT_EQ(0, std::memcmp(a.as<float>(), b.as<float>(), size_t(a.numel()) * 4))
                << p.name << " from " << safetensors_dtype_name(dtype);
        }
        std::filesystem::remove(path);
    }
}

TEST(Model, LoadingNamesTheMissingTensorAndAWrongShape) {
    const ModelConfig llama = parse(kLlamaJson);
    const ModelConfig neox = parse(kNeoxJson);
    const std::string dir = testing::TempDir() + "lathe_model_bad_ckpt";
    std::filesystem::create_directories(dir);
    ASSERT_TRUE(model_save_hf(make(neox, 1, 4), dir).ok());
    Result<SafetensorsCheckpoint> ckpt = SafetensorsCheckpoint::open(dir);
    ASSERT_TRUE(ckpt.ok());
    Model m = make(llama, 1, 4);
    const Status s = model_load_hf(m, *ckpt);
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.message().find("model.embed_tokens.weight"), std::string::npos) << s.message();

    // Same names, other sizes: a GPT-NeoX with a larger vocabulary.
    std::string wide(kNeoxJson);
    wide.replace(wide.find("\"vocab_size\": 40"), 16, "\"vocab_size\": 48");
    Model w = make(parse(wide), 1, 4);
    const Status shape = model_load_hf(w, *ckpt);
    ASSERT_FALSE(shape.ok());
    EXPECT_NE(shape.message().find("gpt_neox.embed_in.weight"), std::string::npos)
        << shape.message();
    EXPECT_NE(shape.message().find("[40, 24]"), std::string::npos) << shape.message();
    std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace lathe
