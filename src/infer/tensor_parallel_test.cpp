// Tensor-parallel inference on the CPU (infer/tensor_parallel.h), ranks as threads of one process:
//   - the shards every rank loads from a parity fixture (tests/fixtures/models), put back
//     together (rows of column-parallel tensors, columns of row-parallel ones, rank 0's
//     row-parallel bias plus the others' zeros, replicated tensors), equal the full model's
//     tensors exactly, for Llama (GQA), Qwen2 (q/k/v biases) and a Llama with every bias (the
//     output projection's and the MLP's);
//   - the engine over T shards, its partial sums reduced by the ranks' communicator, gives the
//     full engine's logits for a prefill and decode steps, and agree_tokens hands every rank
//     rank 0's tokens;
//   - with rank 0 leading and the others following (lathe serve), the followers replay its
//     opens, closes, prefills, refused calls and decode steps, and rank 0's logits are the full
//     engine's;
//   - a T that does not divide the heads, GPT-2's transposed fused qkv and GPT-NeoX's
//     hidden-sized query_key_value are refused.
//
// Tolerance of the logits: both sides run f32 ops; the shards change only the summation order of
// the Wo and down projections (T partial sums added by the reduce) and the GEMM shapes. As in
// engine_test.cpp, each of the L blocks and the LM head adds at most about K eps relative to the
// logits' scale, K the longest reduction (F, C or the sequence), plus one rounding per rank in
// each reduce (T <= K): (L + 1) K eps bounds it.
#include "infer/tensor_parallel.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <barrier>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <thread>

#include "infer/engine.h"
#include "infer/engine_test_util.h"
#include "io/safetensors.h"
#include "model/model_fixture_test_util.h"
#include "model/model_io.h"
#include "model/registry.h"
#include "model/tiny_model_test_util.h"

namespace lathe {
namespace {

// Ranks that are threads: all_reduce sums (f32) and broadcast copies rank `root`'s bytes, through
// pointers every rank posts before a barrier.
class ThreadGroup final : public Communicator {
public:
    struct Shared {
        explicit Shared(int n) : posted(size_t(n)), sync(n) {}
        std::vector<const void*> posted;
        std::barrier<> sync;
    };
    ThreadGroup(std::shared_ptr<Shared> s, int rank, int size)
        : s_(std::move(s)), rank_(rank), size_(size) {}
    int rank() const override { return rank_; }
    int size() const override { return size_; }
    std::string_view backend() const override { return "threads"; }
    bool accepts(Device device) const override { return device == Device::kCpu; }

private:
    Status do_all_reduce(TensorView out, ConstTensorView in, ReduceOp op, CUstream_st*) override {
        LATHE_CHECK(op == ReduceOp::kSum && in.dtype() == DType::kF32, "ThreadGroup: f32 sums");
        std::vector<float> mine(in.as<float>(), in.as<float>() + in.numel());
        s_->posted[size_t(rank_)] = mine.data();
        s_->sync.arrive_and_wait();
        float* o = out.as<float>();
        for (int64_t i = 0; i < in.numel(); ++i) {
            float sum = 0.0f;
            for (int r = 0; r < size_; ++r)
                sum += static_cast<const float*>(s_->posted[size_t(r)])[i];
            o[i] = sum;
        }
        s_->sync.arrive_and_wait();
        return ok_status();
    }
    Status do_broadcast(TensorView buf, int root, CUstream_st*) override {
        s_->posted[size_t(rank_)] = buf.data();
        s_->sync.arrive_and_wait();
        if (rank_ != root) std::memcpy(buf.data(), s_->posted[size_t(root)], buf.bytes());
        s_->sync.arrive_and_wait();
        return ok_status();
    }
    Status do_reduce_scatter(TensorView, ConstTensorView, ReduceOp, CUstream_st*) override {
        LATHE_CHECK(false, "ThreadGroup: all_reduce and broadcast only");
        return ok_status();
    }
    Status do_all_gather(TensorView, ConstTensorView, CUstream_st*) override {
        LATHE_CHECK(false, "ThreadGroup: all_reduce and broadcast only");
        return ok_status();
    }
    Result<std::unique_ptr<Communicator>> do_split(int, int) override {
        LATHE_CHECK(false, "ThreadGroup: all_reduce and broadcast only");
        return std::unique_ptr<Communicator>();
    }
    std::shared_ptr<Shared> s_;
    int rank_, size_;
};

void run_ranks(int size, const std::function<void(Communicator&)>& body) {
    auto shared = std::make_shared<ThreadGroup::Shared>(size);
    std::vector<std::thread> threads;
    for (int r = 0; r < size; ++r)
        threads.emplace_back([&, r] {
            ThreadGroup comm(shared, r, size);
            body(comm);
        });
    for (std::thread& t : threads) t.join();
}

ModelShape one_token_shape() {
    ModelShape shape;
    shape.batch = 1;
    shape.seq_len = 1;
    shape.training = false;
    return shape;
}

struct Case {
    std::string fixture;
    int tp;
};

class TpShards : public ::testing::TestWithParam<Case> {};

TEST_P(TpShards, ShardsPutBackTogetherAreTheFullTensors) {
    const Case& k = GetParam();
    engine_test::Loaded L = engine_test::load(k.fixture);
    const std::string dir = model_fixture::dir(k.fixture);
    std::vector<Model> shards;
    for (int r = 0; r < k.tp; ++r) {
        Result<Model> m =
            tp_model_create_loaded(L.f.config, r, k.tp, one_token_shape(), Context{}, dir);
        ASSERT_TRUE(m.ok()) << m.status().to_string();
        EXPECT_EQ(m->config().num_heads, L.f.config.num_heads / k.tp);
        EXPECT_EQ(m->config().num_kv_heads, L.f.config.num_kv_heads / k.tp);
        EXPECT_EQ(m->config().intermediate_size, L.f.config.intermediate_size / k.tp);
        EXPECT_EQ(m->config().head_dim, L.f.config.head_dim);
        shards.push_back(std::move(*m));
    }
    const ParamTable& full = L.model.params();
    int split_tensors = 0;
    for (const HfParam& p : full.hf_params()) {
        HostTensor want(DType::kF32, p.shape);
        model_read_param_hf(L.model, p.name, want.view());
        const TpSplit split = tp_split_of(full.entries()[p.entry].role);
        const int64_t rows = p.shape[0], cols = p.shape.numel() / rows;
        HostTensor got(DType::kF32, p.shape);
        float* g = got.as<float>();
        for (int r = 0; r < k.tp; ++r) {
            const HfParam* lp = shards[size_t(r)].params().find_hf(p.name);
            ASSERT_NE(lp, nullptr) << p.name;
            HostTensor part(DType::kF32, lp->shape);
            model_read_param_hf(shards[size_t(r)], p.name, part.view());
            const float* x = part.as<float>();
            const int64_t n = lp->shape.numel();
            switch (split) {
                case TpSplit::kReplicated:
                    ASSERT_EQ(lp->shape, p.shape) << p.name;
                    ASSERT_EQ(0, std::memcmp(x, want.as<float>(), size_t(n) * 4)) << p.name;
                    if (r == 0) std::memcpy(g, x, size_t(n) * 4);
                    break;
                case TpSplit::kRankZero:
                    ASSERT_EQ(lp->shape, p.shape) << p.name;
                    if (r == 0) std::memcpy(g, x, size_t(n) * 4);
                    for (int64_t i = 0; r > 0 && i < n; ++i) ASSERT_EQ(x[i], 0.0f) << p.name;
                    break;
                case TpSplit::kOutputs:
                    ASSERT_EQ(lp->shape[0] * k.tp, rows) << p.name;
                    std::memcpy(g + r * n, x, size_t(n) * 4);
                    break;
                case TpSplit::kInputs: {
                    const int64_t w = cols / k.tp;
                    ASSERT_EQ(lp->shape[lp->shape.rank() - 1], w) << p.name;
                    for (int64_t i = 0; i < rows; ++i)
                        std::memcpy(g + i * cols + r * w, x + i * w, size_t(w) * 4);
                    break;
                }
            }
        }
        split_tensors += split == TpSplit::kOutputs || split == TpSplit::kInputs;
        ASSERT_EQ(0, std::memcmp(g, want.as<float>(), size_t(p.shape.numel()) * 4)) << p.name;
    }
    // q, k, v (or qkv), Wo, gate/up (or fc), down in every layer.
    EXPECT_GE(split_tensors, 4 * L.f.config.num_layers);
}

TEST_P(TpShards, EngineOverShardsGivesTheFullEnginesLogits) {
    const Case& k = GetParam();
    engine_test::Loaded L = engine_test::load(k.fixture);
    const std::string dir = model_fixture::dir(k.fixture);
    const int64_t V = L.f.config.vocab_size, P = L.f.T / 2;
    EngineLimits lim;
    lim.max_sequences = 2;
    lim.max_len = L.f.T;
    lim.prefill_chunk = 3;
    const std::vector<int32_t> prompt(L.tokens.begin(), L.tokens.begin() + P);
    // The full engine: a prefill of P tokens, then the rest of the row one decode step at a time.
    auto run = [&](InferenceEngine& e) {
        std::vector<std::vector<float>> rows;
        Result<SeqId> seq = e.open();
        LATHE_CHECK(seq.ok(), "{}", seq.status().to_string());
        std::vector<float> logits(static_cast<size_t>(V));
        Status s = e.prefill(*seq, prompt, logits);
        LATHE_CHECK(s.ok(), "{}", s.to_string());
        rows.push_back(logits);
        for (int64_t t = P; t < L.f.T; ++t) {
            const DecodeStep step{*seq, L.tokens[size_t(t)]};
            s = e.decode(std::span<const DecodeStep>(&step, 1), logits);
            LATHE_CHECK(s.ok(), "{}", s.to_string());
            rows.push_back(logits);
        }
        return rows;
    };
    Result<InferenceEngine> whole = InferenceEngine::create(L.model, lim);
    ASSERT_TRUE(whole.ok()) << whole.status().to_string();
    const std::vector<std::vector<float>> want = run(*whole);

    std::mutex mu;
    std::vector<std::vector<std::vector<float>>> got(size_t(k.tp));
    std::vector<std::vector<int32_t>> agreed(size_t(k.tp));
    run_ranks(k.tp, [&](Communicator& comm) {
        Result<Model> m = tp_model_create_loaded(L.f.config, comm.rank(), k.tp, one_token_shape(),
                                                 Context{}, dir);
        LATHE_CHECK(m.ok(), "{}", m.status().to_string());
        Result<InferenceEngine> e = InferenceEngine::create(*m, lim, &comm);
        LATHE_CHECK(e.ok(), "{}", e.status().to_string());
        LATHE_CHECK(e->tensor_parallel() == k.tp, "tensor_parallel {}", e->tensor_parallel());
        auto rows = run(*e);
        std::vector<int32_t> tokens{100 + comm.rank(), 7 * comm.rank()};
        Status s = e->agree_tokens(tokens);
        LATHE_CHECK(s.ok(), "{}", s.to_string());
        std::lock_guard<std::mutex> lock(mu);
        got[size_t(comm.rank())] = std::move(rows);
        agreed[size_t(comm.rank())] = tokens;
    });
    const ModelConfig& c = L.f.config;
    const int64_t K = std::max({c.intermediate_size, c.hidden_size, L.f.T});
    const double tol = double(c.num_layers + 1) * double(K) * std::numeric_limits<float>::epsilon();
    for (int r = 0; r < k.tp; ++r) {
        ASSERT_EQ(got[size_t(r)].size(), want.size());
        for (size_t i = 0; i < want.size(); ++i) {
            const double err = model_fixture::rel_error(
                ConstTensorView(got[size_t(r)][i].data(), DType::kF32, Shape{V}, Device::kCpu),
                ConstTensorView(want[i].data(), DType::kF32, Shape{V}, Device::kCpu));
            EXPECT_LE(err, tol) << "rank " << r << " row " << i;
        }
        EXPECT_EQ(agreed[size_t(r)], (std::vector<int32_t>{100, 0})) << "rank " << r;
    }
}

TEST_P(TpShards, FollowersReplayTheLeadersCalls) {
    const Case& k = GetParam();
    engine_test::Loaded L = engine_test::load(k.fixture);
    const std::string dir = model_fixture::dir(k.fixture);
    const int64_t V = L.f.config.vocab_size;
    EngineLimits lim;
    lim.max_sequences = 2;
    lim.max_len = L.f.T;
    lim.prefill_chunk = 4;
    const std::vector<int32_t> a(L.tokens.begin(), L.tokens.begin() + 3);
    const std::vector<int32_t> b(L.tokens.begin() + 1, L.tokens.begin() + 6);
    // Two sequences, a refused call (a token outside the vocabulary), decode steps together, one
    // leaving, then prefill_all of a third: the logits of every call, concatenated.
    auto drive = [&](InferenceEngine& e) {
        std::vector<float> out, z(static_cast<size_t>(V)), zz(2 * static_cast<size_t>(V));
        const SeqId s0 = *e.open(), s1 = *e.open();
        LATHE_CHECK(e.prefill(s0, a, z).ok(), "prefill");
        out.insert(out.end(), z.begin(), z.end());
        LATHE_CHECK(!e.prefill(s1, std::vector<int32_t>{int32_t(V)}, z).ok(), "a bad token");
        LATHE_CHECK(e.prefill(s1, b, z).ok(), "prefill");
        out.insert(out.end(), z.begin(), z.end());
        for (int step = 0; step < 3; ++step) {
            const DecodeStep steps[2] = {{s1, int32_t((step * 5 + 1) % V)},
                                         {s0, int32_t((step * 3 + 2) % V)}};
            LATHE_CHECK(e.decode(steps, zz).ok(), "decode");
            out.insert(out.end(), zz.begin(), zz.end());
        }
        e.close(s0);
        const SeqId s2 = *e.open();
        std::vector<float> all(a.size() * static_cast<size_t>(V));
        LATHE_CHECK(e.prefill_all(s2, a, all).ok(), "prefill_all");
        out.insert(out.end(), all.begin(), all.end());
        const DecodeStep steps[2] = {{s1, 1}, {s2, 2}};
        LATHE_CHECK(e.decode(steps, zz).ok(), "decode");
        out.insert(out.end(), zz.begin(), zz.end());
        return out;
    };
    Result<InferenceEngine> whole = InferenceEngine::create(L.model, lim);
    ASSERT_TRUE(whole.ok()) << whole.status().to_string();
    const std::vector<float> want = drive(*whole);

    std::vector<float> got;
    Status followed = internal_error("rank 1 did not run");
    run_ranks(k.tp, [&](Communicator& comm) {
        Result<Model> m = tp_model_create_loaded(L.f.config, comm.rank(), k.tp, one_token_shape(),
                                                 Context{}, dir);
        LATHE_CHECK(m.ok(), "{}", m.status().to_string());
        Result<InferenceEngine> e = InferenceEngine::create(*m, lim, &comm);
        LATHE_CHECK(e.ok(), "{}", e.status().to_string());
        if (comm.rank() == 0) {
            e->lead();
            got = drive(*e);
            LATHE_CHECK(e->stop_followers().ok(), "stop_followers");
        } else {
            const Status s = e->follow();
            if (comm.rank() == 1) followed = s;
            // The followers' engines took the same steps: the third sequence is open.
            LATHE_CHECK(e->open_sequences() == 2, "rank {}: {} open", comm.rank(),
                        e->open_sequences());
        }
    });
    EXPECT_TRUE(followed.ok()) << followed.to_string();
    const ModelConfig& c = L.f.config;
    const int64_t K = std::max({c.intermediate_size, c.hidden_size, L.f.T});
    const double tol = double(c.num_layers + 1) * double(K) * std::numeric_limits<float>::epsilon();
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); i += size_t(V)) {
        const double err = model_fixture::rel_error(
            ConstTensorView(got.data() + i, DType::kF32, Shape{V}, Device::kCpu),
            ConstTensorView(want.data() + i, DType::kF32, Shape{V}, Device::kCpu));
        EXPECT_LE(err, tol) << "logits row " << i / size_t(V);
    }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, TpShards,
                         ::testing::Values(Case{"llama", 2}, Case{"qwen2", 2},
                                           Case{"llama_bias_packed", 2},
                                           Case{"llama_bias_packed", 4}),
                         [](const auto& info) {
                             return info.param.fixture + "_tp" + std::to_string(info.param.tp);
                         });

TEST(TpConfig, RefusesATpThatDoesNotDivideTheHeadsOrTheMlp) {
    const ModelConfig c = tiny_model::parse(tiny_model::kLlamaJson);  // H 4, Hkv 2, F 48
    Result<ModelConfig> bad = tp_local_config(c, 4, "--tensor-parallel");
    ASSERT_FALSE(bad.ok());
    EXPECT_NE(bad.status().message().find("--tensor-parallel 4"), std::string::npos)
        << bad.status().to_string();
    EXPECT_NE(bad.status().message().find("key/value heads (2)"), std::string::npos);
    EXPECT_FALSE(tp_local_config(c, 0, "--tensor-parallel").ok());
    Result<ModelConfig> two = tp_local_config(c, 2, "--tensor-parallel");
    ASSERT_TRUE(two.ok()) << two.status().to_string();
    EXPECT_EQ(two->num_heads, 2);
    EXPECT_EQ(two->num_kv_heads, 1);
    EXPECT_EQ(two->intermediate_size, 24);
    EXPECT_EQ(two->head_dim, c.head_dim);
    EXPECT_EQ(two->hidden_size, c.hidden_size);
}

TEST(TpConfig, VocabularyParallelSplitsTheVocabularyOrRefusesIt) {
    const ModelConfig c = tiny_model::parse(tiny_model::kLlamaJson);  // V 64
    for (int rank = 0; rank < 2; ++rank) {
        Result<ModelConfig> two =
            tp_local_config(c, 2, "parallel.tensor", TpVocab::kParallel, rank);
        ASSERT_TRUE(two.ok()) << two.status().to_string();
        EXPECT_EQ(two->vocab_size, 32);
        EXPECT_EQ(two->vocab_total, 64);
        EXPECT_EQ(two->vocab_begin, 32 * rank);
        EXPECT_EQ(two->vocab_ids(), 64);
        EXPECT_EQ(tp_vocab_of(*two), TpVocab::kParallel);
    }
    // Inference keeps the vocabulary whole.
    Result<ModelConfig> whole = tp_local_config(c, 2, "--tensor-parallel");
    ASSERT_TRUE(whole.ok());
    EXPECT_EQ(whole->vocab_size, 64);
    EXPECT_FALSE(whole->vocab_parallel());
    EXPECT_EQ(tp_split_of(ParamRole::kLmHead), TpSplit::kReplicated);
    EXPECT_EQ(tp_split_of(ParamRole::kTokenEmbedding, TpVocab::kParallel), TpSplit::kOutputs);
    EXPECT_EQ(tp_split_of(ParamRole::kLmHead, TpVocab::kParallel), TpSplit::kOutputs);
    EXPECT_EQ(tp_split_of(ParamRole::kFinalNormWeight, TpVocab::kParallel), TpSplit::kReplicated);
    // A vocabulary the size does not divide (no padding).
    std::string json(tiny_model::kLlamaJson);
    json.replace(json.find("\"vocab_size\": 64"), std::string("\"vocab_size\": 64").size(),
                 "\"vocab_size\": 65");
    Result<ModelConfig> odd =
        tp_local_config(tiny_model::parse(json), 2, "parallel.tensor", TpVocab::kParallel);
    ASSERT_FALSE(odd.ok());
    EXPECT_NE(odd.status().message().find("parallel.tensor 2 must divide the vocabulary (65 "
                                          "tokens)"),
              std::string::npos)
        << odd.status().to_string();
}

TEST(TpConfig, RefusesGpt2AndGptNeoxWhoseTensorsHaveNoHeadShards) {
    const ModelConfig c = tiny_model::parse(tiny_model::kGpt2Json);  // 2 heads
    Result<ModelConfig> r = tp_local_config(c, 2, "--tensor-parallel");
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("c_attn"), std::string::npos) << r.status().to_string();
    EXPECT_TRUE(tp_local_config(c, 1, "--tensor-parallel").ok());
    const ModelConfig neox = tiny_model::parse(tiny_model::kNeoxJson);  // 3 heads, F 40
    Result<ModelConfig> n = tp_local_config(neox, 1, "--tensor-parallel");
    EXPECT_TRUE(n.ok());
    const ModelConfig neox_fixture = model_fixture::load("gpt_neox").config;  // 4 heads
    n = tp_local_config(neox_fixture, 2, "--tensor-parallel");
    ASSERT_FALSE(n.ok());
    EXPECT_NE(n.status().message().find("query_key_value"), std::string::npos)
        << n.status().to_string();
}

TEST(TpConfig, RandomWeightsAreReplicatedAlikeOnEveryRank) {
    const ModelConfig c = tiny_model::parse(tiny_model::kLlamaJson);
    Result<Model> a = tp_model_create_random(c, 0, 2, one_token_shape(), Context{}, 5);
    Result<Model> b = tp_model_create_random(c, 1, 2, one_token_shape(), Context{}, 5);
    Result<Model> other = tp_model_create_random(c, 0, 2, one_token_shape(), Context{}, 6);
    ASSERT_TRUE(a.ok() && b.ok() && other.ok());
    const Shape vc{c.vocab_size, c.hidden_size};
    HostTensor ea(DType::kF32, vc), eb(DType::kF32, vc), eo(DType::kF32, vc);
    model_read_param_hf(*a, "model.embed_tokens.weight", ea.view());
    model_read_param_hf(*b, "model.embed_tokens.weight", eb.view());
    model_read_param_hf(*other, "model.embed_tokens.weight", eo.view());
    const int64_t n = c.vocab_size * c.hidden_size;
    EXPECT_EQ(0, std::memcmp(ea.as<float>(), eb.as<float>(), size_t(n) * 4));
    EXPECT_NE(0, std::memcmp(ea.as<float>(), eo.as<float>(), size_t(n) * 4));
    // Uniform with the init's standard deviation: |x| <= sqrt(3) std, the sample std near std.
    double sq = 0, mx = 0;
    for (int64_t i = 0; i < n; ++i) {
        sq += double(ea.as<float>()[i]) * ea.as<float>()[i];
        mx = std::max(mx, std::abs(double(ea.as<float>()[i])));
    }
    const double std = c.initializer_range;
    EXPECT_LE(mx, std * std::sqrt(3.0) * (1 + 1e-6));
    // n = 2048 draws: the sample variance's relative error is about sqrt(0.8 / n) ~ 2%; 10% is
    // five of those.
    EXPECT_NEAR(std::sqrt(sq / double(n)), std, 0.1 * std);
}

TEST(TpConfig, ReadSliceRefusesNonFiniteValuesNamingTheirElementInTheStoredTensor) {
    const ModelConfig c = tiny_model::parse(tiny_model::kLlamaJson);
    Result<ModelConfig> local = tp_local_config(c, 2, "--tensor-parallel");
    ASSERT_TRUE(local.ok()) << local.status().to_string();
    Result<Model> m = Model::create(*local, one_token_shape(), Context{});
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    // o_proj, split by its input columns: rank r reads columns [r w, (r + 1) w) of every row.
    const std::string name = "model.layers.0.self_attn.o_proj.weight";
    const HfParam* p = m->params().find_hf(name);
    ASSERT_NE(p, nullptr);
    const ParamRole role = m->params().entries()[p->entry].role;
    ASSERT_EQ(tp_split_of(role), TpSplit::kInputs);
    const int64_t rows = p->shape[0], w = p->shape[1], full_w = 2 * w;
    std::vector<float> stored(size_t(rows * full_w), 0.5f);
    stored[size_t(2 * full_w + 1)] = std::numeric_limits<float>::infinity();       // rank 0's
    stored[size_t(1 * full_w + w + 3)] = std::numeric_limits<float>::quiet_NaN();  // rank 1's
    stored[size_t(4 * full_w + w)] = -std::numeric_limits<float>::infinity();      // rank 1's
    SafetensorsTensor t;
    t.name = name;
    t.dtype = SafetensorsDtype::kF32;
    t.shape = {rows, full_w};
    t.data = reinterpret_cast<const uint8_t*>(stored.data());
    t.data_end = stored.size() * sizeof(float);
    HostTensor out(DType::kF32, p->shape);
    const std::string counts[2] = {"1 of the", "2 of the"};
    const std::string firsts[2] = {fmt::format("the first at element {} (inf)", 2 * full_w + 1),
                                   fmt::format("the first at element {} (nan)", full_w + w + 3)};
    for (int rank = 0; rank < 2; ++rank) {
        const Status s =
            tp_read_slice(t, *p, role, rank, 2, "ck.safetensors", out.view(), tp_vocab_of(*local));
        ASSERT_FALSE(s.ok()) << rank;
        EXPECT_EQ(s.code(), StatusCode::kDataLoss);
        for (const std::string& part : {"ck.safetensors: tensor " + name + ": " + counts[rank] +
                                            fmt::format(" {} values read are not finite", rows * w),
                                        firsts[rank]})
            EXPECT_NE(s.message().find(part), std::string::npos) << part << " in " << s.message();
    }
}

}  // namespace
}  // namespace lathe
