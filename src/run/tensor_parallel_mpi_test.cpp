// run_mpi_tests: run by CTest as `mpirun -np 2 --oversubscribe run_mpi_tests` (any number of ranks
// that divides the heads, the key/value heads and the MLP width of the tiny models: 1 or 2).
// Tensor-parallel training's forward and backward (model/block.h's sums, the shards of
// infer/tensor_parallel.h, the vocabulary-parallel embedding and LM head of ops/vocab_parallel.h)
// against one process's: every rank builds the whole model too, so it knows the answer. Untied
// (llama, qwen2) and tied (llama_tied: the embedding shard is the head shard) heads, each with
// sequence parallel (model/block.h: the residual stream's B T = 16 rows cut over the ranks, the
// all-gathers and reduce-scatters, the norms' gradients summed once after the backward) and
// without it.
//
// Tolerance: the ranks' sums of the attention-output and down projections, and of the norm-output
// gradients, add the same f32 terms as one process's GEMMs in another order (2 partial sums of
// 8 to 24 terms each): a few 2^-24 relative of the terms' magnitudes. The vocabulary-parallel
// head adds the same kind of error: each shard's lse rounded to f32 and combined in f32 (a few
// 2^-24 relative of lse, which moves the softmax by as much relative), the head's dx summed over
// the shards (2 partial sums of 32 terms). 1e-5 of each tensor's largest gradient is a hundred
// times that, and far under a missing or doubled term. Sequence parallel sums the same terms:
// a reduce-scatter adds the ranks' partials of a row as the all-reduce does (for 2 ranks the
// one f32 addition a + b), and the all-gathers move values unchanged; what it adds is the
// norms' weight gradients, each rank's sum over its 8 rows added over the ranks (one more
// partial-sum split of 16 terms, the same few 2^-24 relative), so the bound stays.

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "dist/communicator.h"
#include "dist/open.h"
#include "dist/process_group.h"
#include "infer/tensor_parallel.h"
#include "model/model_io.h"
#include "model/tiny_model_test_util.h"

namespace lathe {
namespace {

Communicator& world() {
    static std::unique_ptr<Communicator> comm = [] {
        auto group = process_group_from_env(process_environment());
        LATHE_CHECK(group.ok(), "{}", group.status().to_string());
        auto c = communicator_open(*group, Backend::kCpu, 0);
        LATHE_CHECK(c.ok(), "{}", c.status().to_string());
        return std::move(*c);
    }();
    return *comm;
}

ModelConfig config_of(const std::string& family) {
    std::string json(tiny_model::kLlamaJson);
    if (family == "qwen2") {
        // Qwen2: the llama shape with q, k and v biases.
        json.replace(json.find("LlamaForCausalLM"), std::string("LlamaForCausalLM").size(),
                     "Qwen2ForCausalLM");
        json.replace(json.find("\"llama\""), std::string("\"llama\"").size(), "\"qwen2\"");
    }
    if (family == "llama_tied")
        json.replace(json.find("\"tie_word_embeddings\": false"),
                     std::string("\"tie_word_embeddings\": false").size(),
                     "\"tie_word_embeddings\": true");
    return tiny_model::parse(json);
}

// `sequence_shards`: ModelShape::sequence_shards (1: the residual stream whole on every rank).
Model make_model(const ModelConfig& c, int sequence_shards = 1) {
    ModelShape shape;
    shape.batch = 2;
    shape.seq_len = 8;
    shape.training = true;
    shape.sequence_shards = sequence_shards;
    Result<Model> m = Model::create(c, shape, cpu_context());
    LATHE_CHECK(m.ok(), "{}", m.status().to_string());
    return std::move(*m);
}

// (family, sequence parallel: 0 off, else the row chunks, model/block.h)
class TensorParallelTraining : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(TensorParallelTraining, GradientsAreTheSlicesOfOneProcessAndReplicatedOnesAgree) {
    Communicator& comm = world();
    const int T = comm.size(), rank = comm.rank();
    const auto& [family, chunks] = GetParam();
    // One rank has nothing to cut: sequence parallel is a tensor group's.
    const bool sp = chunks > 0 && T > 1;
    const ModelConfig full = config_of(family);
    Result<ModelConfig> local_config =
        tp_local_config(full, T, "parallel.tensor", TpVocab::kParallel, rank);
    ASSERT_TRUE(local_config.ok()) << local_config.status().to_string();
    ASSERT_EQ(local_config->vocab_size * T, full.vocab_size);

    Model one = make_model(full);
    one.init(7);
    Model local = make_model(*local_config, sp ? T : 1);
    ASSERT_EQ(local.sequence_parallel(), sp);
    tp_model_init(local, full, rank, T, 7);
    Status sum_error = ok_status();
    local.set_tensor_parallel_sum([&](TensorView v) {
        if (sum_error.ok()) sum_error = comm.all_reduce(v, v, ReduceOp::kSum, nullptr);
    });
    local.set_tensor_parallel_max([&](TensorView v) {
        if (sum_error.ok()) sum_error = comm.all_reduce(v, v, ReduceOp::kMax, nullptr);
    });
    // The moves as the trainer makes them (overlap asked for: on the CPU they run at the call).
    TensorParallelRowMover mover(comm, cpu_context(), sp ? chunks : 1, true, &sum_error);
    if (sp) {
        local.set_tensor_parallel_rows(mover.rows());
        // A rank's shard of the residual stream: B T / S rows of x and of the residual gradient.
        const MemoryPlan& plan = local.plan();
        EXPECT_EQ(plan.activations.entries()[plan.block_acts[0][0]].shape,
                  Shape({16 / T, full.hidden_size}));
        EXPECT_EQ(plan.scratch.entries()[plan.dres].shape, Shape({16 / T, full.hidden_size}));
    }

    const int64_t V = full.vocab_size;
    const HostTensor tokens = tiny_model::ids(2, 8, V, 1);
    HostTensor targets = tiny_model::ids(2, 8, V, 2);
    // Ignored targets: counted nowhere, in every shard.
    targets.as<int32_t>()[3] = targets.as<int32_t>()[12] = -100;
    const ModelBatch batch{tokens.view(), targets.view(), {}, {}};
    // A forward alone (a validation loss): the shards' statistics combined.
    {
        const float want = one.eval_forward(batch), got = local.eval_forward(batch);
        ASSERT_TRUE(sum_error.ok()) << sum_error.to_string();
        EXPECT_NEAR(got, want, 1e-5 * std::abs(want)) << "eval_forward";
    }
    // Two micro-batches: the gradients accumulate as in a step.
    one.zero_grads();
    local.zero_grads();
    // Two micro-batches: the fused step, then forward() and backward() apart.
    for (int k = 0; k < 2; ++k) {
        const float want = one.forward_backward(batch, 0.5f);
        float got = 0.0f;
        if (k == 0) {
            got = local.forward_backward(batch, 0.5f);
        } else {
            got = local.forward(batch);
            local.backward(0.5f);
        }
        ASSERT_TRUE(sum_error.ok()) << sum_error.to_string();
        EXPECT_NEAR(got, want, 1e-5 * std::abs(want)) << "micro-batch " << k;
    }
    if (sp) {
        // The norms' gradients hold each rank's rows' part until summed once for the step
        // (run/train_step.cpp does this after the data-parallel reduction).
        const std::vector<FlatRange> ranges = local.sequence_parallel_partial_ranges();
        ASSERT_EQ(ranges.size(), size_t(2 * full.num_layers + 1));  // RMSNorm: weights alone
        std::vector<TensorView> pieces;
        for (const FlatRange& r : ranges)
            pieces.push_back(local.grads_flat().slice(r.begin, r.end));
        local.sum_sequence_parallel_grads(pieces);
        ASSERT_TRUE(sum_error.ok()) << sum_error.to_string();
    }

    const ParamTable& table = local.params();
    for (const HfParam& p : table.hf_params()) {
        const HfParam* f = one.params().find_hf(p.name);
        ASSERT_NE(f, nullptr) << p.name;
        const TpSplit split = tp_split_of(table.entries()[p.entry].role, TpVocab::kParallel);
        HostTensor whole(DType::kF32, f->shape), want(DType::kF32, p.shape),
            got(DType::kF32, p.shape);
        model_read_grad_hf(one, p.name, whole.view());
        tp_slice_hf(whole.view(), split, rank, T, want.view());
        model_read_grad_hf(local, p.name, got.view());
        double scale = 0.0;
        for (int64_t i = 0; i < whole.numel(); ++i)
            scale = std::max(scale, double(std::abs(whole.as<float>()[i])));
        const int64_t n = p.shape.numel();
        for (int64_t i = 0; i < n; ++i) {
            ASSERT_NEAR(got.as<float>()[i], want.as<float>()[i], 1e-5 * scale + 1e-30)
                << p.name << " element " << i << " on rank " << rank;
        }
        if (split != TpSplit::kReplicated) continue;
        // A replicated parameter's gradient: the same bits on every rank (the optimizer then
        // makes the same update everywhere, with no reduction).
        std::vector<float> all(size_t(n * T));
        ASSERT_TRUE(comm.all_gather(TensorView(all.data(), DType::kF32, Shape{n * T}),
                                    ConstTensorView(got.as<float>(), DType::kF32, Shape{n}),
                                    nullptr)
                        .ok());
        for (int r = 1; r < T; ++r)
            for (int64_t i = 0; i < n; ++i)
                ASSERT_EQ(all[size_t(r * n + i)], all[size_t(i)])
                    << p.name << " element " << i << ": rank " << r << " differs from rank 0";
    }
}

INSTANTIATE_TEST_SUITE_P(Families, TensorParallelTraining,
                         ::testing::Combine(::testing::Values("llama", "qwen2", "llama_tied"),
                                            ::testing::Values(0, 1, 2)),
                         [](const auto& info) {
                             const int chunks = std::get<1>(info.param);
                             return std::get<0>(info.param) +
                                    (chunks == 0 ? std::string()
                                     : chunks == 1
                                         ? std::string("_sequence_parallel")
                                         : fmt::format("_sequence_parallel_chunks{}", chunks));
                         });

// A batch whose rows do not cut into equal shares is refused when the model is planned (the
// trainer names the keys before that: test_tensor_parallel.py).
TEST(SequenceParallel, RowsThatDoNotCutEvenlyAreRefused) {
    const ModelConfig full = config_of("llama");
    Result<ModelConfig> local = tp_local_config(full, 2, "parallel.tensor", TpVocab::kParallel, 0);
    ASSERT_TRUE(local.ok()) << local.status().to_string();
    ModelShape shape;
    shape.batch = 1;
    shape.seq_len = 7;
    shape.sequence_shards = 2;
    const Result<Model> m = Model::create(*local, shape, cpu_context());
    ASSERT_FALSE(m.ok());
    EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(m.status().message().find("(1 x 7 = 7) must be a multiple of 2"), std::string::npos)
        << m.status().to_string();
    shape.seq_len = 8;
    EXPECT_TRUE(Model::create(*local, shape, cpu_context()).ok());
}

}  // namespace
}  // namespace lathe
