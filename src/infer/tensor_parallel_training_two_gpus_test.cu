// infer_two_gpu_tests: tensor-parallel training (parallel.tensor 2) on two GPUs of one machine,
// each rank a thread with its own CUDA state, shard (infer/tensor_parallel.h, tp_model_init) and
// NCCL communicator summing model/block.h's partial tensors and combining the vocabulary-parallel
// embedding and LM head (ops/vocab_parallel.h), against one process on the CPU (f32). Untied
// (llama, qwen2) and tied (llama_tied) heads, each with sequence parallel (model/block.h: the
// residual stream's B T = 16 rows cut over the two ranks, NCCL all-gathers and reduce-scatters
// on the tensor-parallel stream beside the GEMMs, in one or two row chunks, the norms' gradients
// summed after the backward) and without it.
// Needs two GPUs; not in CTest (a one-GPU machine runs the gpu label): `infer_two_gpu_tests` on a
// machine with two.
//
// The bar, from model_gpu_test.cu's (one GPU against the CPU): the loss within 4e-3 relative, each
// gradient tensor within a relative L2 error of 2.5 times the random walk of its bf16 roundings,
// sqrt(10 L) u there (u = 2^-8, about 10 roundings per layer). Tensor parallel adds, per layer,
// two roundings on each of the four summed tensors (the attention-output and down projections'
// outputs, the two norm-output gradients): the rank's partial rounded to bf16, NCCL's bf16 sum of
// the two partials once more (dist/communicator.h). The vocabulary-parallel head adds two more on
// its dx (each shard's part rounded to bf16, then the bf16 sum); its logits are the same bf16
// GEMM outputs as one GPU's, and the embedding's sum adds zeros to each row (exact). So
// sqrt(14 L + 2) u = 2.1e-2 for these L = 2 layers, and 2.5 times it, 5.3e-2, for one tensor.
// The replicated parameters' gradients are the same bits on both ranks (the same NCCL sum and
// the same kernels on the same inputs).
// Sequence parallel keeps the bar: each reduce-scatter rounds as the all-reduce it replaces (the
// rank's partial rounded to bf16, NCCL's bf16 sum of the two, kept for the rank's rows), the
// all-gathers copy bf16 values unchanged, the norms run on the same rows' values (a row's norm
// reads that row alone), and the norms' weight gradients, each rank's f32 sum over its 8 rows,
// meet in an f32 sum (2^-24, nothing next to u).

// clang-format off
#include "ops/cuda/nvcc_compat.h"  // first: before any header that includes fmt
// clang-format on
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "dist/nccl_communicator.h"
#include "infer/tensor_parallel.h"
#include "model/model.h"
#include "model/model_io.h"
#include "model/tiny_model_test_util.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/cuda_state.h"

namespace lathe {
namespace {

constexpr int kWorld = 2;
constexpr int64_t kB = 2, kT = 8;

double rel_l2(const float* a, const float* b, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; ++i) {
        num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
        den += double(b[i]) * b[i];
    }
    return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

ModelConfig config_of(const std::string& family) {
    std::string json(tiny_model::kLlamaJson);
    if (family == "qwen2") {
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

ModelShape training(Backend backend, int sequence_shards = 1) {
    ModelShape shape;
    shape.batch = kB;
    shape.seq_len = kT;
    shape.training = true;
    shape.backend = backend;
    shape.sequence_shards = sequence_shards;
    return shape;
}

// (family, sequence parallel)
class TensorParallelTrainingTwoGpus
    : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(TensorParallelTrainingTwoGpus, GradientsMatchTheCpuAndReplicatedOnesAgree) {
    int devices = 0;
    LATHE_CUDA_CHECK(cudaGetDeviceCount(&devices));
    ASSERT_GE(devices, kWorld) << "infer_two_gpu_tests needs two GPUs";
    const std::string family = std::get<0>(GetParam());
    // Sequence parallel: 0 off, else the row chunks of its overlapped moves (model/block.h).
    const int chunks = std::get<1>(GetParam());
    const bool sp = chunks > 0;
    const ModelConfig full = config_of(family);
    // Rank r's config: its vocabulary rows start at r V / 2.
    auto local_of = [&](int r) {
        return tp_local_config(full, kWorld, "parallel.tensor", TpVocab::kParallel, r);
    };
    Result<ModelConfig> local_config = local_of(0);
    ASSERT_TRUE(local_config.ok()) << local_config.status().to_string();
    const int64_t V = full.vocab_size;
    const HostTensor tok = tiny_model::ids(kB, kT, V, 1), tgt = tiny_model::ids(kB, kT, V, 2);
    const ModelBatch batch{tok.view(), tgt.view(), {}, {}};

    Result<Model> cpu = Model::create(full, training(Backend::kCpu), cpu_context());
    ASSERT_TRUE(cpu.ok()) << cpu.status().to_string();
    cpu->init(7);
    cpu->zero_grads();
    const float loss_cpu = cpu->forward_backward(batch);

    Result<NcclId> id = nccl_unique_id();
    ASSERT_TRUE(id.ok()) << id.status().to_string();
    std::mutex mu;
    std::vector<std::string> failures;
    float losses[kWorld] = {};
    // [rank][hf param]: the rank's gradients, for the cross-rank comparison of replicated ones.
    std::vector<std::vector<HostTensor>> grads(kWorld);
    std::vector<std::thread> ranks;
    for (int r = 0; r < kWorld; ++r) {
        ranks.emplace_back([&, r] {
            auto fail = [&](const std::string& what) {
                std::lock_guard<std::mutex> lock(mu);
                failures.push_back(fmt::format("rank {}: {}", r, what));
            };
            CudaState state(r);
            auto comm = nccl_communicator_create(*id, r, kWorld, r);
            if (!comm.ok()) return fail(comm.status().to_string());
            Result<ModelConfig> mine = local_of(r);
            if (!mine.ok()) return fail(mine.status().to_string());
            Result<Model> m =
                Model::create(*mine, training(Backend::kCuda, sp ? kWorld : 1), state.context());
            if (!m.ok()) return fail(m.status().to_string());
            tp_model_init(*m, full, r, kWorld, 7);
            Status sum_error = ok_status();
            m->set_tensor_parallel_sum([&](TensorView v) {
                if (sum_error.ok())
                    sum_error = (*comm)->all_reduce(v, v, ReduceOp::kSum, state.context().stream);
            });
            m->set_tensor_parallel_max([&](TensorView v) {
                if (sum_error.ok())
                    sum_error = (*comm)->all_reduce(v, v, ReduceOp::kMax, state.context().stream);
            });
            // The trainer's moves: on the tensor-parallel stream, beside the GEMMs.
            TensorParallelRowMover mover(**comm, state.context(), sp ? chunks : 1, true,
                                         &sum_error);
            if (sp) m->set_tensor_parallel_rows(mover.rows());
            m->zero_grads();
            losses[r] = m->forward_backward(batch);
            if (sp) {
                // The norms' gradients: each rank's rows' part, summed once (model.h).
                std::vector<TensorView> pieces;
                for (const FlatRange& g : m->sequence_parallel_partial_ranges())
                    pieces.push_back(m->grads_flat().slice(g.begin, g.end));
                m->sum_sequence_parallel_grads(pieces);
            }
            if (!sum_error.ok()) return fail(sum_error.to_string());
            for (const HfParam& p : m->params().hf_params()) {
                grads[size_t(r)].emplace_back(DType::kF32, p.shape);
                model_read_grad_hf(*m, p.name, grads[size_t(r)].back().view());
            }
        });
    }
    for (std::thread& t : ranks) t.join();
    ASSERT_TRUE(failures.empty()) << failures.front();

    for (int r = 0; r < kWorld; ++r) {
        std::printf("[tp2-vs-cpu] %-6s sp %d rank %d loss %.6f vs %.6f (rel %.2e)\n",
                    family.c_str(), chunks, r, losses[r], loss_cpu,
                    std::abs(losses[r] - loss_cpu) / loss_cpu);
        EXPECT_NEAR(losses[r], loss_cpu, 4e-3 * loss_cpu);
    }
    // The local table of either rank (the same names and shapes on both).
    Result<Model> shape_only = Model::create(*local_config, training(Backend::kCpu), cpu_context());
    ASSERT_TRUE(shape_only.ok());
    const ParamTable& table = shape_only->params();
    double worst = 0;
    std::string worst_name;
    for (size_t i = 0; i < table.hf_params().size(); ++i) {
        const HfParam& p = table.hf_params()[i];
        const HfParam* f = cpu->params().find_hf(p.name);
        ASSERT_NE(f, nullptr) << p.name;
        const TpSplit split = tp_split_of(table.entries()[p.entry].role, TpVocab::kParallel);
        HostTensor whole(DType::kF32, f->shape), want(DType::kF32, p.shape);
        model_read_grad_hf(*cpu, p.name, whole.view());
        for (int r = 0; r < kWorld; ++r) {
            const HostTensor& got = grads[size_t(r)][i];
            if (split == TpSplit::kReplicated && r > 0) {
                for (int64_t k = 0; k < p.shape.numel(); ++k)
                    ASSERT_EQ(got.as<float>()[k], grads[0][i].as<float>()[k])
                        << p.name << " element " << k << ": rank " << r << " differs from rank 0";
            }
            // A key bias's gradient is zero up to rounding (the softmax cancels a bias that adds
            // the same amount to every score of a query): no relative error to speak of.
            if (p.name.ends_with("k_proj.bias")) continue;
            tp_slice_hf(whole.view(), split, r, kWorld, want.view());
            const double e = rel_l2(got.as<float>(), want.as<float>(), p.shape.numel());
            EXPECT_TRUE(std::isfinite(e)) << p.name;
            if (e > worst) {
                worst = e;
                worst_name = fmt::format("{} (rank {})", p.name, r);
            }
        }
    }
    std::printf("[tp2-vs-cpu] %-6s sp %d worst gradient rel-L2 %.2e (%s)\n", family.c_str(), chunks,
                worst, worst_name.c_str());
    EXPECT_LT(worst, 5.3e-2) << worst_name;
}

INSTANTIATE_TEST_SUITE_P(Families, TensorParallelTrainingTwoGpus,
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

}  // namespace
}  // namespace lathe
