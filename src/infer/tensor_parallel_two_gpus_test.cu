// infer_two_gpu_tests: tensor-parallel inference on two GPUs of one machine, each rank a thread
// with its own CUDA state, shard (infer/tensor_parallel.h) and NCCL communicator, against the one-
// process engine on the CPU (f32) on the transformers parity fixtures (tests/fixtures/models;
// $LATHE_SOURCE_DIR on the GPU machine). Needs two GPUs; not in CTest (a one-GPU machine runs
// the gpu label): `infer_two_gpu_tests` on a machine with two.
//
// The bar, from engine_gpu_test.cu's: the one-GPU engine's logits z' differ from the CPU's z by
// bf16 rounding through the network, each of the L blocks and the LM head rounding to bf16
// (u = 2^-8 relative), within kSlack (L + 1) u max|z| (kSlack 4, measured there). Tensor parallel
// adds two bf16 roundings per projection that writes into the residual stream: each rank's
// partial Wo / down output is rounded to bf16 before the reduce, and NCCL's bf16 sum of the two
// partials rounds once more (communicator.h: one rounding per addition; log2(2) = 1; the graph
// tests' PeerAllReduce rounds its f32 sum of the two once, dist/peer_all_reduce.h). So per
// block at most kSlack + 2 roundings of the block's output scale:
//   |z2_v - z_v| <= eps = (kSlack + 2) (L + 1) u max|z|.
// Greedy outputs must equal the CPU's up to the first step whose CPU top-2 gap is below 2 eps (a
// near-tie, where the two may part); the teacher-forced logits of both ranks are held to eps.
// clang-format off
#include "ops/cuda/nvcc_compat.h"  // first: before any header that includes fmt
// clang-format on
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "dist/nccl_communicator.h"
#include "infer/engine.h"
#include "infer/tensor_parallel.h"
#include "model/model.h"
#include "model/model_fixture_test_util.h"
#include "model/model_io.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/cuda_state.h"

namespace lathe {
namespace {

constexpr int kWorld = 2;
constexpr double kSlack = 4.0, kU = 1.0 / 256.0;
constexpr int64_t kPrompt = 4, kNew = 16;

ModelShape one_token() {
    ModelShape shape;
    shape.batch = 1;
    shape.seq_len = 1;
    shape.training = false;
    return shape;
}

EngineLimits limits() {
    EngineLimits lim;
    lim.max_sequences = 2;
    lim.max_len = kPrompt + kNew + 8;
    lim.prefill_chunk = 8;
    return lim;
}

// Greedy tokens and each step's logits of one sequence; then, teacher-forced, the logits of two
// sequences decoded together (prefills of 1 and 7 tokens, then 6 steps of fixed tokens).
struct Trace {
    std::vector<int32_t> tokens;
    std::vector<std::vector<float>> greedy, forced;
};

Trace trace(InferenceEngine& e, const model_fixture::Fixture& f) {
    Trace r;
    const int64_t V = e.vocab_size();
    const int32_t* t = f.ref("tokens").as<int32_t>();
    std::vector<float> z(static_cast<size_t>(V));
    SeqId s = *e.open();
    LATHE_CHECK(e.prefill(s, std::vector<int32_t>(t, t + kPrompt), z).ok(), "prefill");
    for (int64_t i = 0; i < kNew; ++i) {
        r.greedy.push_back(z);
        r.tokens.push_back(int32_t(std::max_element(z.begin(), z.end()) - z.begin()));
        if (i + 1 == kNew) break;
        const DecodeStep step{s, r.tokens.back()};
        LATHE_CHECK(e.decode(std::span(&step, 1), z).ok(), "decode");
    }
    e.close(s);
    const int64_t lens[2] = {1, 7};
    SeqId seqs[2];
    for (int i = 0; i < 2; ++i) {
        seqs[i] = *e.open();
        LATHE_CHECK(e.prefill(seqs[i], std::vector<int32_t>(t, t + lens[i]), z).ok(), "prefill");
    }
    for (int64_t step = 0; step < 6; ++step) {
        const DecodeStep steps[2] = {{seqs[0], int32_t((step * 37 + 5) % V)},
                                     {seqs[1], int32_t((step * 11 + 2) % V)}};
        std::vector<float> zz(2 * static_cast<size_t>(V));
        LATHE_CHECK(e.decode(steps, zz).ok(), "decode");
        r.forced.emplace_back(zz.begin(), zz.begin() + V);
        r.forced.emplace_back(zz.begin() + V, zz.end());
    }
    return r;
}

double max_abs(const std::vector<float>& z) {
    double m = 0;
    for (float x : z) m = std::max(m, double(std::abs(x)));
    return m;
}

double top2_gap(std::vector<float> z) {
    std::partial_sort(z.begin(), z.begin() + 2, z.end(), std::greater<float>());
    return double(z[0]) - double(z[1]);
}

class TpTwoGpus : public testing::TestWithParam<std::string> {};

TEST_P(TpTwoGpus, LogitsWithinBf16BoundOfTheCpuAndGreedyEqualUntilANearTie) {
    int devices = 0;
    LATHE_CUDA_CHECK(cudaGetDeviceCount(&devices));
    ASSERT_GE(devices, kWorld) << "infer_two_gpu_tests needs two GPUs";
    const model_fixture::Fixture f = model_fixture::load(GetParam());
    const std::string dir = model_fixture::dir(GetParam());

    Result<Model> cpu_model = tp_model_create_loaded(f.config, 0, 1, one_token(), Context{}, dir);
    ASSERT_TRUE(cpu_model.ok()) << cpu_model.status().to_string();
    Result<InferenceEngine> cpu = InferenceEngine::create(*cpu_model, limits());
    ASSERT_TRUE(cpu.ok()) << cpu.status().to_string();
    const Trace want = trace(*cpu, f);

    Result<NcclId> id = nccl_unique_id();
    ASSERT_TRUE(id.ok()) << id.status().to_string();
    std::vector<Trace> got(kWorld);
    std::vector<std::thread> ranks;
    for (int r = 0; r < kWorld; ++r) {
        ranks.emplace_back([&, r] {
            CudaState state(r);
            auto comm = nccl_communicator_create(*id, r, kWorld, r);
            LATHE_CHECK(comm.ok(), "rank {}: {}", r, comm.status().to_string());
            Result<Model> m =
                tp_model_create_loaded(f.config, r, kWorld, one_token(), state.context(), dir);
            LATHE_CHECK(m.ok(), "rank {}: {}", r, m.status().to_string());
            Result<InferenceEngine> e = InferenceEngine::create(*m, limits(), comm->get());
            LATHE_CHECK(e.ok(), "rank {}: {}", r, e.status().to_string());
            LATHE_CHECK(e->tensor_parallel() == kWorld, "rank {}: not tensor parallel", r);
            got[size_t(r)] = trace(*e, f);
            state.synchronize();
        });
    }
    for (std::thread& t : ranks) t.join();

    const double eps_rel = (kSlack + 2.0) * double(f.config.num_layers + 1) * kU;
    for (int r = 0; r < kWorld; ++r) {
        const Trace& g = got[size_t(r)];
        int64_t compared = 0;
        for (int64_t i = 0; i < kNew; ++i) {
            const std::vector<float>& z = want.greedy[size_t(i)];
            const double tie = 2 * eps_rel * max_abs(z);
            if (top2_gap(z) < tie) break;  // a near-tie: the outputs may part from here
            ASSERT_EQ(g.tokens[size_t(i)], want.tokens[size_t(i)])
                << GetParam() << " rank " << r << " step " << i;
            ++compared;
        }
        std::printf("%s rank %d: %lld of %lld greedy tokens compared before a near-tie\n",
                    GetParam().c_str(), r, (long long)compared, (long long)kNew);
        ASSERT_EQ(g.forced.size(), want.forced.size());
        const int64_t V = f.config.vocab_size;
        for (size_t i = 0; i < want.forced.size(); ++i) {
            const ConstTensorView a(want.forced[i].data(), DType::kF32, Shape{V}, Device::kCpu);
            const ConstTensorView b(g.forced[i].data(), DType::kF32, Shape{V}, Device::kCpu);
            EXPECT_LE(model_fixture::rel_error(b, a), eps_rel)
                << GetParam() << " rank " << r << " forced row " << i;
        }
    }
}

// The device paths of the messages between ranks: the prompts (tp_broadcast_token_lists through a
// device buffer), agree_tokens through the tokens scratch, and rank 0 driving the engine alone
// (lead) while rank 1 replays its calls (follow): rank 0's logits are held to the same eps.
TEST_P(TpTwoGpus, PromptsTokensAndLeadFollowOverNccl) {
    int devices = 0;
    LATHE_CUDA_CHECK(cudaGetDeviceCount(&devices));
    ASSERT_GE(devices, kWorld) << "infer_two_gpu_tests needs two GPUs";
    const model_fixture::Fixture f = model_fixture::load(GetParam());
    const std::string dir = model_fixture::dir(GetParam());
    Result<Model> cpu_model = tp_model_create_loaded(f.config, 0, 1, one_token(), Context{}, dir);
    ASSERT_TRUE(cpu_model.ok()) << cpu_model.status().to_string();
    Result<InferenceEngine> cpu = InferenceEngine::create(*cpu_model, limits());
    ASSERT_TRUE(cpu.ok()) << cpu.status().to_string();
    const Trace want = trace(*cpu, f);

    Result<NcclId> id = nccl_unique_id();
    ASSERT_TRUE(id.ok()) << id.status().to_string();
    const std::vector<std::vector<int32_t>> lists = {{1, 2, 3}, {}, {40000, 5}};
    std::vector<std::vector<std::vector<int32_t>>> got_lists(kWorld);
    std::vector<std::vector<int32_t>> got_tokens(kWorld);
    Trace led;
    std::vector<int> ok(kWorld, 0);
    std::vector<std::thread> ranks;
    for (int r = 0; r < kWorld; ++r) {
        ranks.emplace_back([&, r] {
            CudaState state(r);
            auto comm = nccl_communicator_create(*id, r, kWorld, r);
            LATHE_CHECK(comm.ok(), "rank {}: {}", r, comm.status().to_string());
            std::vector<std::vector<int32_t>> mine =
                r == 0 ? lists : std::vector<std::vector<int32_t>>{{9}};
            LATHE_CHECK(tp_broadcast_token_lists(**comm, state.context(), mine).ok(), "lists");
            got_lists[size_t(r)] = mine;
            Result<Model> m =
                tp_model_create_loaded(f.config, r, kWorld, one_token(), state.context(), dir);
            LATHE_CHECK(m.ok(), "rank {}: {}", r, m.status().to_string());
            Result<InferenceEngine> e = InferenceEngine::create(*m, limits(), comm->get());
            LATHE_CHECK(e.ok(), "rank {}: {}", r, e.status().to_string());
            std::vector<int32_t> tokens(40, 0);
            for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t(i) * (r == 0 ? 3 : 7);
            LATHE_CHECK(e->agree_tokens(tokens).ok(), "agree_tokens");
            got_tokens[size_t(r)] = tokens;
            if (r == 0) {
                e->lead();
                led = trace(*e, f);
                LATHE_CHECK(e->stop_followers().ok(), "stop_followers");
            } else {
                const Status s = e->follow();
                LATHE_CHECK(s.ok(), "follow: {}", s.to_string());
            }
            state.synchronize();
            ok[size_t(r)] = 1;
        });
    }
    for (std::thread& t : ranks) t.join();
    for (int r = 0; r < kWorld; ++r) {
        EXPECT_EQ(ok[size_t(r)], 1);
        EXPECT_EQ(got_lists[size_t(r)], lists) << "rank " << r;
        ASSERT_EQ(got_tokens[size_t(r)].size(), 40u);
        for (size_t i = 0; i < 40; ++i) EXPECT_EQ(got_tokens[size_t(r)][i], int32_t(i) * 3);
    }
    const double eps_rel = (kSlack + 2.0) * double(f.config.num_layers + 1) * kU;
    const int64_t V = f.config.vocab_size;
    ASSERT_EQ(led.forced.size(), want.forced.size());
    for (size_t i = 0; i < want.forced.size(); ++i) {
        const ConstTensorView a(want.forced[i].data(), DType::kF32, Shape{V}, Device::kCpu);
        const ConstTensorView b(led.forced[i].data(), DType::kF32, Shape{V}, Device::kCpu);
        EXPECT_LE(model_fixture::rel_error(b, a), eps_rel) << GetParam() << " forced row " << i;
    }
}

// The paged cache with the CUDA-graph decode step under tensor parallel: every decode step's
// all-reduces are captured into each rank's graphs (buckets 1 and 2 of
// the trace: each bucket runs eagerly once, is captured the next step and replayed after), held to
// the same eps against the CPU as the eager engine. With `refuse` rank 1 alone has its first
// capture refused (testing_fail_next_graph_capture): the ranks agree, both run bucket 1 eagerly
// from then on (rank 0's capture succeeded but is dropped, or their all-reduces would not pair up
// and the step would hang), and bucket 2 is still captured on both.
void graphs_against_cpu(const std::string& family, bool refuse) {
    int devices = 0;
    LATHE_CUDA_CHECK(cudaGetDeviceCount(&devices));
    ASSERT_GE(devices, kWorld) << "infer_two_gpu_tests needs two GPUs";
    const model_fixture::Fixture f = model_fixture::load(family);
    const std::string dir = model_fixture::dir(family);
    Result<Model> cpu_model = tp_model_create_loaded(f.config, 0, 1, one_token(), Context{}, dir);
    ASSERT_TRUE(cpu_model.ok()) << cpu_model.status().to_string();
    Result<InferenceEngine> cpu = InferenceEngine::create(*cpu_model, limits());
    ASSERT_TRUE(cpu.ok()) << cpu.status().to_string();
    const Trace want = trace(*cpu, f);

    Result<NcclId> id = nccl_unique_id();
    ASSERT_TRUE(id.ok()) << id.status().to_string();
    std::vector<Trace> got(kWorld);
    std::vector<int64_t> graphs(kWorld, -1);
    // The decode steps' reduces through PeerAllReduce where the two GPUs reach each other.
    std::vector<int> peer(kWorld, -1);
    int can01 = 0, can10 = 0;
    LATHE_CUDA_CHECK(cudaDeviceCanAccessPeer(&can01, 0, 1));
    LATHE_CUDA_CHECK(cudaDeviceCanAccessPeer(&can10, 1, 0));
    std::vector<std::thread> ranks;
    for (int r = 0; r < kWorld; ++r) {
        ranks.emplace_back([&, r] {
            CudaState state(r);
            auto comm = nccl_communicator_create(*id, r, kWorld, r);
            LATHE_CHECK(comm.ok(), "rank {}: {}", r, comm.status().to_string());
            Result<Model> m =
                tp_model_create_loaded(f.config, r, kWorld, one_token(), state.context(), dir);
            LATHE_CHECK(m.ok(), "rank {}: {}", r, m.status().to_string());
            EngineLimits lim = limits();
            lim.kv_block_size = 4;
            lim.cuda_graphs = true;
            lim.peer_reduce = PeerReduce::kOn;
            Result<InferenceEngine> e = InferenceEngine::create(*m, lim, comm->get());
            LATHE_CHECK(e.ok(), "rank {}: {}", r, e.status().to_string());
            peer[size_t(r)] = e->peer_all_reduce() ? 1 : 0;
            if (refuse && r == 1) e->testing_fail_next_graph_capture();
            got[size_t(r)] = trace(*e, f);
            graphs[size_t(r)] = e->decode_graphs();
            state.synchronize();
        });
    }
    for (std::thread& t : ranks) t.join();
    const double eps_rel = (kSlack + 2.0) * double(f.config.num_layers + 1) * kU;
    const int64_t V = f.config.vocab_size;
    for (int r = 0; r < kWorld; ++r) {
        EXPECT_EQ(graphs[size_t(r)], refuse ? 1 : 2) << family << " rank " << r;
        EXPECT_EQ(peer[size_t(r)], can01 != 0 && can10 != 0 ? 1 : 0) << family << " rank " << r;
        const Trace& g = got[size_t(r)];
        for (int64_t i = 0; i < kNew; ++i) {
            const std::vector<float>& z = want.greedy[size_t(i)];
            if (top2_gap(z) < 2 * eps_rel * max_abs(z)) break;  // a near-tie
            ASSERT_EQ(g.tokens[size_t(i)], want.tokens[size_t(i)])
                << family << " rank " << r << " step " << i;
        }
        ASSERT_EQ(g.forced.size(), want.forced.size());
        for (size_t i = 0; i < want.forced.size(); ++i) {
            const ConstTensorView a(want.forced[i].data(), DType::kF32, Shape{V}, Device::kCpu);
            const ConstTensorView b(g.forced[i].data(), DType::kF32, Shape{V}, Device::kCpu);
            EXPECT_LE(model_fixture::rel_error(b, a), eps_rel)
                << family << " rank " << r << " forced row " << i;
        }
    }
}

TEST_P(TpTwoGpus, PagedCudaGraphDecodeWithinBf16BoundOfTheCpu) {
    graphs_against_cpu(GetParam(), /*refuse=*/false);
}

TEST(TpTwoGpusGraphs, OneRanksRefusedCaptureMakesBothRunThatBucketEagerly) {
    graphs_against_cpu("llama", /*refuse=*/true);
}

// Llama: GQA (4 heads, 2 key/value heads: one per rank); Qwen2: q/k/v biases; a Llama with the
// output projection's and the MLP's biases (rank 0's, added once by the reduce).
INSTANTIATE_TEST_SUITE_P(Families, TpTwoGpus,
                         testing::Values("llama", "qwen2", "llama_bias_packed"));

}  // namespace
}  // namespace lathe
