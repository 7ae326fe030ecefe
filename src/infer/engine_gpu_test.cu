// The inference engine on CUDA (bf16 weights and activations, cuDNN or lathe attention for the
// prefill, attention_decode for decode) against the same engine on the CPU (f32), on the
// transformers parity fixtures (tests/fixtures/models; $LATHE_SOURCE_DIR on the GPU machine).
// CTest label gpu.
//
// The bar. CUDA's logits z' differ from the CPU's z by bf16 rounding through the network: each
// of the L blocks and the LM head rounds to bf16 (u = 2^-8 relative), so we allow
//   |z'_v - z_v| <= eps = 4 (L + 1) u max|z|            (kSlack 4: model_parity_gpu_test measured
//                                                          3e-2 at L = 2, below 4 * 3 * 2^-8)
// The greedy choice can differ only where the CPU's two largest logits are closer than 2 eps: a
// near-tie. So greedy outputs must be identical up to the first step whose CPU top-2 gap is below
// 2 eps; from there on they may part (and are not compared). The logits rows themselves are
// checked against eps with the same tokens fed to both (teacher forcing).
// clang-format off
#include "ops/cuda/nvcc_compat.h"  // first: before any header that includes fmt
// clang-format on
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "infer/engine.h"
#include "model/model.h"
#include "model/model_fixture_test_util.h"
#include "model/model_io.h"
#include "ops/cuda/cuda_state.h"

namespace lathe {
namespace {

constexpr double kSlack = 4.0, kU = 1.0 / 256.0;
constexpr int64_t kPrompt = 4, kNew = 16;

Model make_model(const model_fixture::Fixture& f, const Context& ctx) {
    ModelShape shape;
    shape.batch = 1;
    shape.seq_len = 1;
    shape.training = false;
    Result<Model> m = Model::create(f.config, shape, ctx);
    LATHE_CHECK(m.ok(), "{}", m.status().to_string());
    Status s = model_load_hf(*m, f.weights);
    LATHE_CHECK(s.ok(), "{}", s.to_string());
    return std::move(*m);
}

InferenceEngine make_engine(const Model& m, int64_t rows, int64_t block = 0, int64_t blocks = 0,
                            bool graphs = false, DecodeGemv gemv = DecodeGemv::kOff) {
    EngineLimits lim;
    lim.cuda_graphs = graphs;
    lim.decode_gemv = gemv;
    lim.max_sequences = rows;
    lim.max_len = kPrompt + kNew + 8;
    lim.prefill_chunk = 8;
    lim.kv_block_size = block;
    lim.kv_blocks = blocks;
    Result<InferenceEngine> e = InferenceEngine::create(m, lim);
    LATHE_CHECK(e.ok(), "{}", e.status().to_string());
    return std::move(*e);
}

int32_t argmax(const std::vector<float>& z) {
    return int32_t(std::max_element(z.begin(), z.end()) - z.begin());
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

// Greedy tokens and each step's logits.
struct GreedyRun {
    std::vector<int32_t> tokens;
    std::vector<std::vector<float>> logits;
};

GreedyRun greedy(InferenceEngine& e, const std::vector<int32_t>& prompt) {
    GreedyRun r;
    const SeqId s = *e.open();
    std::vector<float> z(static_cast<size_t>(e.vocab_size()));
    LATHE_CHECK(e.prefill(s, prompt, z).ok(), "prefill");
    for (int64_t i = 0; i < kNew; ++i) {
        r.logits.push_back(z);
        r.tokens.push_back(argmax(z));
        if (i + 1 == kNew) break;
        const DecodeStep step{s, r.tokens.back()};
        LATHE_CHECK(e.decode(std::span(&step, 1), z).ok(), "decode");
    }
    e.close(s);
    return r;
}

class EngineGpu : public testing::TestWithParam<std::string> {
protected:
    static void SetUpTestSuite() { state_ = new CudaState(0); }
    static void TearDownTestSuite() {
        delete state_;
        state_ = nullptr;
    }
    static CudaState* state_;
};
CudaState* EngineGpu::state_ = nullptr;

TEST_P(EngineGpu, GreedyEqualsTheCpuUntilTheFirstNearTie) {
    const model_fixture::Fixture f = model_fixture::load(GetParam());
    const double eps_rel = kSlack * double(f.config.num_layers + 1) * kU;
    Model cpu_model = make_model(f, Context{});
    Model gpu_model = make_model(f, state_->context());
    InferenceEngine cpu = make_engine(cpu_model, 1), gpu = make_engine(gpu_model, 1);
    const int32_t* t = f.ref("tokens").as<int32_t>();
    const std::vector<int32_t> prompt(t, t + kPrompt);
    const GreedyRun a = greedy(cpu, prompt), b = greedy(gpu, prompt);
    int64_t compared = 0;
    for (int64_t i = 0; i < kNew; ++i) {
        const double tie = 2 * eps_rel * max_abs(a.logits[size_t(i)]);
        const double gap = top2_gap(a.logits[size_t(i)]);
        if (gap < tie) break;  // a near-tie: the outputs may part from here
        ASSERT_EQ(a.tokens[size_t(i)], b.tokens[size_t(i)])
            << GetParam() << " step " << i << ": CPU top-2 gap " << gap << " >= tie bound " << tie;
        ++compared;
    }
    std::printf("%s: %lld of %lld greedy tokens compared before a near-tie\n", GetParam().c_str(),
                (long long)compared, (long long)kNew);
}

// Two sequences prefilled with lens[i] tokens, then six decode steps of both, the steps given in
// row order or reversed (the logits still come out in step order).
void check_two_sequences(const std::string& family, const int64_t lens[2], bool reversed,
                         CudaState& state) {
    const model_fixture::Fixture f = model_fixture::load(family);
    const double eps_rel = kSlack * double(f.config.num_layers + 1) * kU;
    const int64_t V = f.config.vocab_size;
    Model cpu_model = make_model(f, Context{});
    Model gpu_model = make_model(f, state.context());
    InferenceEngine cpu = make_engine(cpu_model, 2), gpu = make_engine(gpu_model, 2);
    const int32_t* t = f.ref("tokens").as<int32_t>();
    for (InferenceEngine* e : {&cpu, &gpu}) {
        for (int i = 0; i < 2; ++i) {
            const SeqId s = *e->open();
            std::vector<float> z(static_cast<size_t>(V));
            LATHE_CHECK(e->prefill(s, std::vector<int32_t>(t, t + lens[i]), z).ok(), "prefill");
        }
    }
    for (int64_t step = 0; step < 6; ++step) {
        // Both engines opened sequences 0 and 1 in the same order.
        DecodeStep steps[2] = {{0, int32_t((step * 37 + 5) % V)},
                               {1, int32_t((step * 11 + 2) % V)}};
        if (reversed) std::swap(steps[0], steps[1]);
        std::vector<float> za(2 * static_cast<size_t>(V)), zb(2 * static_cast<size_t>(V));
        ASSERT_TRUE(cpu.decode(steps, za).ok());
        ASSERT_TRUE(gpu.decode(steps, zb).ok());
        for (int i = 0; i < 2; ++i) {
            const ConstTensorView ra(za.data() + i * V, DType::kF32, Shape{V}, Device::kCpu);
            const ConstTensorView rb(zb.data() + i * V, DType::kF32, Shape{V}, Device::kCpu);
            EXPECT_LE(model_fixture::rel_error(rb, ra), eps_rel)
                << family << " step " << step << " step row " << i;
        }
    }
}

TEST_P(EngineGpu, TwoSequencesTeacherForcedLogitsWithinBf16Bound) {
    const int64_t lens[2] = {1, 7};  // 1: a one-token prefill (attention_decode)
    check_two_sequences(GetParam(), lens, false, *state_);
}

// Rows at one position: each layer's new keys and values go to the cache in one strided copy.
// The steps come in reverse row order, so the logits are placed by step, not by row.
TEST_P(EngineGpu, TwoSequencesOfOneLengthStepsInReverseOrder) {
    const int64_t lens[2] = {5, 5};
    check_two_sequences(GetParam(), lens, true, *state_);
}

// The paged cache on CUDA against the row cache on CUDA. Both compute in bf16 from the same
// weights; the prefill's attention reads the same keys (the paged engine's gathered from its
// blocks), and the decode step runs the same split-K kernel with only the key addresses taken
// through the block table. They can differ only where the split plan differs (it depends on Tk:
// max_len for the rows, the table width times Bk for the pool), a different f32 summation order
// whose effect is within one bf16 rounding of a block's attention output; so the CPU-vs-GPU bar
// eps = kSlack (L + 1) u max|z| bounds them, and greedy tokens must be identical up to the first
// near-tie (top-2 gap of the row cache's logits below 2 eps).
//
// Greedy: one sequence, kNew tokens, blocks of 1, 3 and 16 positions (the prompt of 4 and the
// context of 28 are not multiples of 3 or 16).
TEST_P(EngineGpu, PagedGreedyEqualsTheRowCache) {
    const model_fixture::Fixture f = model_fixture::load(GetParam());
    const double eps_rel = kSlack * double(f.config.num_layers + 1) * kU;
    Model model = make_model(f, state_->context());
    const int32_t* t = f.ref("tokens").as<int32_t>();
    const std::vector<int32_t> prompt(t, t + kPrompt);
    InferenceEngine rows = make_engine(model, 1);
    const GreedyRun a = greedy(rows, prompt);
    for (int64_t block : {1, 3, 16}) {
        InferenceEngine paged = make_engine(model, 1, block);
        ASSERT_TRUE(paged.paged());
        const GreedyRun b = greedy(paged, prompt);
        EXPECT_EQ(paged.paged_cache().free_blocks(), paged.kv_total_blocks());
        for (int64_t i = 0; i < kNew; ++i) {
            const double tie = 2 * eps_rel * max_abs(a.logits[size_t(i)]);
            if (top2_gap(a.logits[size_t(i)]) < tie) break;
            ASSERT_EQ(a.tokens[size_t(i)], b.tokens[size_t(i)])
                << GetParam() << " block " << block << " step " << i;
            const int64_t V = f.config.vocab_size;
            EXPECT_LE(
                model_fixture::rel_error(ConstTensorView(b.logits[size_t(i)].data(), DType::kF32,
                                                         Shape{V}, Device::kCpu),
                                         ConstTensorView(a.logits[size_t(i)].data(), DType::kF32,
                                                         Shape{V}, Device::kCpu)),
                eps_rel)
                << GetParam() << " block " << block << " step " << i;
        }
    }
}

// decode_greedy's picks (the device's argmax over the bf16 logits, n ids back) against the
// argmax of decode's logits on the host. Two engines of one kind run the same ops on the same
// inputs, so their logits are the same bits and the picks must be equal at every row, near-ties
// included (where the lowest-index rule decides). Kinds: the row cache (eager, rows in the
// cache's order, listed in reverse), and the paged cache with CUDA graphs, three sequences in
// the bucket of four (a padding row) over the capture and the replays. Each sequence is fed its
// own pick.
TEST_P(EngineGpu, DecodeGreedyPicksTheArgmaxOfDecodesLogits) {
    const model_fixture::Fixture f = model_fixture::load(GetParam());
    Model model = make_model(f, state_->context());
    const int32_t* t = f.ref("tokens").as<int32_t>();
    const int64_t V = f.config.vocab_size;
    for (const bool paged : {false, true}) {
        SCOPED_TRACE(paged ? "paged, CUDA graphs" : "row cache");
        InferenceEngine a = make_engine(model, 4, paged ? 16 : 0, 0, paged);
        InferenceEngine b = make_engine(model, 4, paged ? 16 : 0, 0, paged);
        constexpr int kSeqs = 3;
        SeqId sa[kSeqs], sb[kSeqs];
        int32_t next[kSeqs];
        std::vector<float> z(static_cast<size_t>(V));
        for (int i = 0; i < kSeqs; ++i) {
            const std::vector<int32_t> prompt(t + i, t + i + kPrompt - i);
            sa[i] = *a.open();
            sb[i] = *b.open();
            ASSERT_TRUE(a.prefill(sa[i], prompt, z).ok());
            ASSERT_TRUE(b.prefill(sb[i], prompt, z).ok());
            next[i] = argmax(z);
        }
        int compared = 0;
        for (int64_t step = 0; step + 1 < kNew; ++step) {
            std::vector<DecodeStep> steps_a, steps_b;
            for (int i = kSeqs - 1; i >= 0; --i) {
                steps_a.push_back(DecodeStep{sa[i], next[i]});
                steps_b.push_back(DecodeStep{sb[i], next[i]});
            }
            std::vector<float> logits(kSeqs * size_t(V));
            ASSERT_TRUE(a.decode(steps_a, logits).ok());
            std::vector<int32_t> picks(kSeqs, -1);
            ASSERT_TRUE(b.decode_greedy(steps_b, picks).ok());
            for (int k = 0; k < kSeqs; ++k) {
                const std::vector<float> row(logits.begin() + k * V, logits.begin() + (k + 1) * V);
                ASSERT_EQ(picks[size_t(k)], argmax(row))
                    << GetParam() << " step " << step << " row " << k;
                next[kSeqs - 1 - k] = picks[size_t(k)];
                ++compared;
            }
        }
        EXPECT_EQ(compared, kSeqs * (kNew - 1));
    }
}

// Sequences join and leave: A (prompt 5), B (prompt 11: chunks of 8 and 3, the second attending
// through the gathered prefix) and C (prompt 9: a one-token second chunk) decode 4 steps, A
// leaves, D (prompt 7) joins and takes A's freed blocks (the pool holds exactly what B, C and D
// reach), 4 more steps; the same tokens are fed to both engines (teacher forcing) and every
// logits row is held to eps. At the end every block is free again.
TEST_P(EngineGpu, PagedEqualsTheRowCacheAsSequencesJoinAndLeave) {
    const model_fixture::Fixture f = model_fixture::load(GetParam());
    const double eps_rel = kSlack * double(f.config.num_layers + 1) * kU;
    const int64_t V = f.config.vocab_size;
    Model model = make_model(f, state_->context());
    const int32_t* t = f.ref("tokens").as<int32_t>();
    const int64_t avail = f.ref("tokens").numel();
    auto prompt = [&](int64_t n, int64_t from) {
        std::vector<int32_t> p;
        for (int64_t i = 0; i < n; ++i) p.push_back(t[(from + i) % avail]);
        return p;
    };
    for (int64_t block : {1, 3, 16}) {
        SCOPED_TRACE(GetParam() + " block " + std::to_string(block));
        auto blocks = [&](int64_t n) { return (n + block - 1) / block; };
        // A ends at 5 + 4 (it leaves), B at 11 + 8, C at 9 + 8, D at 7 + 4: the pool is what
        // B, C and D reach, at least what A, B and C reach before A leaves.
        const int64_t pool = blocks(19) + blocks(17) + blocks(11);
        ASSERT_GE(pool, blocks(9) + blocks(15) + blocks(13));
        InferenceEngine rows = make_engine(model, 3);
        InferenceEngine paged = make_engine(model, 3, block, pool);
        ASSERT_EQ(paged.kv_total_blocks(), pool);
        std::vector<SeqId> ra, pa;  // the open sequences of each engine, in step order
        std::vector<float> za(static_cast<size_t>(V)), zb(static_cast<size_t>(V));
        auto join = [&](int64_t n, int64_t from) {
            ra.push_back(*rows.open());
            pa.push_back(*paged.open());
            ASSERT_TRUE(rows.prefill(ra.back(), prompt(n, from), za).ok());
            const Status s = paged.prefill(pa.back(), prompt(n, from), zb);
            ASSERT_TRUE(s.ok()) << s.to_string();
            EXPECT_LE(model_fixture::rel_error(
                          ConstTensorView(zb.data(), DType::kF32, Shape{V}, Device::kCpu),
                          ConstTensorView(za.data(), DType::kF32, Shape{V}, Device::kCpu)),
                      eps_rel)
                << "prefill of " << n;
        };
        auto steps = [&](int64_t count, int64_t step0) {
            for (int64_t step = step0; step < step0 + count; ++step) {
                std::vector<DecodeStep> sa, sb;
                for (size_t i = 0; i < ra.size(); ++i) {
                    const int32_t tok = int32_t((step * 37 + int64_t(i) * 11 + 5) % V);
                    sa.push_back({ra[i], tok});
                    sb.push_back({pa[i], tok});
                }
                std::vector<float> la(ra.size() * size_t(V)), lb(ra.size() * size_t(V));
                ASSERT_TRUE(rows.decode(sa, la).ok());
                const Status s = paged.decode(sb, lb);
                ASSERT_TRUE(s.ok()) << s.to_string();
                for (size_t i = 0; i < ra.size(); ++i) {
                    EXPECT_LE(model_fixture::rel_error(
                                  ConstTensorView(lb.data() + i * size_t(V), DType::kF32, Shape{V},
                                                  Device::kCpu),
                                  ConstTensorView(la.data() + i * size_t(V), DType::kF32, Shape{V},
                                                  Device::kCpu)),
                              eps_rel)
                        << "step " << step << " row " << i;
                }
            }
        };
        join(5, 0);
        join(11, 3);
        join(9, 6);
        steps(4, 0);
        const std::vector<int32_t> a_blocks = paged.paged_cache().table(pa[0]);
        rows.close(ra[0]);
        paged.close(pa[0]);
        ra.erase(ra.begin());
        pa.erase(pa.begin());
        join(7, 2);
        const std::vector<int32_t>& d_blocks = paged.paged_cache().table(pa.back());
        EXPECT_TRUE(std::any_of(d_blocks.begin(), d_blocks.end(), [&](int32_t b) {
            return std::find(a_blocks.begin(), a_blocks.end(), b) != a_blocks.end();
        })) << "D reuses A's blocks";
        steps(4, 4);
        EXPECT_EQ(paged.paged_cache().free_blocks(), 0) << "the pool is exactly what they reach";
        for (SeqId s : pa) paged.close(s);
        EXPECT_EQ(paged.paged_cache().free_blocks(), pool);
    }
}

// Out of blocks is an error the caller sees (the scheduler admits by free blocks), never a stop:
// a prefill beyond the pool and a decode step that needs a block none has.
TEST_P(EngineGpu, PagedOutOfBlocksIsAnError) {
    const model_fixture::Fixture f = model_fixture::load(GetParam());
    Model model = make_model(f, state_->context());
    const int64_t V = f.config.vocab_size;
    const int32_t* t = f.ref("tokens").as<int32_t>();
    InferenceEngine paged = make_engine(model, 2, 2, 2);  // 2 blocks of 2 positions
    std::vector<float> z(static_cast<size_t>(V));
    const SeqId a = *paged.open();
    const Status big = paged.prefill(a, std::vector<int32_t>(t, t + 5), z);
    EXPECT_EQ(big.code(), StatusCode::kFailedPrecondition) << big.to_string();
    ASSERT_TRUE(paged.prefill(a, std::vector<int32_t>(t, t + 4), z).ok());
    const DecodeStep step{a, t[0]};
    const Status full = paged.decode(std::span(&step, 1), z);
    EXPECT_EQ(full.code(), StatusCode::kFailedPrecondition) << full.to_string();
    paged.close(a);
    EXPECT_EQ(paged.paged_cache().free_blocks(), 2);
}

// Two engines fed the same tokens: `ref` and `test`. Each step feeds every open sequence the
// reference's argmax and checks each of test's logits rows within eps_rel of ref's (and the same
// bits when asked); greedy tokens must agree up to a sequence's first near-tie (top-2 gap below
// 2 eps), after which that sequence's argmaxes are left uncompared.
struct TwinEngines {
    InferenceEngine& ref;
    InferenceEngine& test;
    const model_fixture::Fixture& f;
    double eps_rel = kSlack * double(f.config.num_layers + 1) * kU;  // the header's bar
    std::vector<SeqId> sr, st;
    std::vector<int32_t> next;  // each open sequence's next token (the reference's argmax)
    std::vector<char> parted;   // the two engines' greedy choices parted after a near-tie

    void join(int64_t n) {
        const int64_t V = f.config.vocab_size;
        std::vector<float> za(static_cast<size_t>(V)), zb(static_cast<size_t>(V));
        sr.push_back(*ref.open());
        st.push_back(*test.open());
        const int32_t* t = f.ref("tokens").as<int32_t>();
        const std::vector<int32_t> prompt(t, t + n);
        ASSERT_TRUE(ref.prefill(sr.back(), prompt, za).ok());
        ASSERT_TRUE(test.prefill(st.back(), prompt, zb).ok());
        next.push_back(argmax(za));
        parted.push_back(0);
    }

    void steps(int64_t count, bool bitwise = false) {
        const int64_t V = f.config.vocab_size;
        const std::string name = f.config.model_type;
        for (int64_t step = 0; step < count; ++step) {
            std::vector<DecodeStep> a, b;
            for (size_t i = 0; i < sr.size(); ++i) {
                a.push_back({sr[i], next[i]});
                b.push_back({st[i], next[i]});
            }
            std::vector<float> la(sr.size() * size_t(V)), lb(sr.size() * size_t(V));
            ASSERT_TRUE(ref.decode(a, la).ok());
            const Status s = test.decode(b, lb);
            ASSERT_TRUE(s.ok()) << s.to_string();
            if (bitwise)
                EXPECT_TRUE(la == lb) << name << " batch " << sr.size() << " step " << step;
            for (size_t i = 0; i < sr.size(); ++i) {
                const std::vector<float> ra(la.begin() + i * V, la.begin() + (i + 1) * V);
                const std::vector<float> rb(lb.begin() + i * V, lb.begin() + (i + 1) * V);
                EXPECT_LE(model_fixture::rel_error(
                              ConstTensorView(rb.data(), DType::kF32, Shape{V}, Device::kCpu),
                              ConstTensorView(ra.data(), DType::kF32, Shape{V}, Device::kCpu)),
                          eps_rel)
                    << name << " batch " << sr.size() << " step " << step << " row " << i;
                if (top2_gap(ra) < 2 * eps_rel * max_abs(ra)) parted[i] = 1;
                if (!parted[i]) {
                    EXPECT_EQ(argmax(ra), argmax(rb))
                        << name << " batch " << sr.size() << " step " << step << " row " << i;
                }
                next[i] = argmax(ra);
            }
        }
    }

    void leave(size_t i) {
        ref.close(sr[i]);
        test.close(st[i]);
        sr.erase(sr.begin() + long(i));
        st.erase(st.begin() + long(i));
        next.erase(next.begin() + long(i));
        parted.erase(parted.begin() + long(i));
    }
};

// The decode step replayed from CUDA graphs against the same paged engine launching eagerly: 4
// sequences may be open, so a step of 3 runs the bucket of 4 (one padding row) and steps of 2 and
// 1 their own buckets; each bucket runs eagerly once, is captured the next step and replayed
// after. Greedy tokens (each sequence fed its own argmax) must be identical up to the first
// near-tie and every logits row within eps: the replayed kernels are the eager ones, but a
// padded bucket's matmuls have more rows than the eager step's, and cuBLASLt may pick another
// algorithm (another summation order) for them.
TEST_P(EngineGpu, CudaGraphDecodeEqualsEager) {
    const model_fixture::Fixture f = model_fixture::load(GetParam());
    Model model = make_model(f, state_->context());
    InferenceEngine eager = make_engine(model, 4, 16, 0, false);
    InferenceEngine graphs = make_engine(model, 4, 16, 0, true);
    TwinEngines twin{eager, graphs, f};
    twin.join(4);
    twin.steps(3);  // bucket 1: eager, captured, replayed
    twin.join(6);
    twin.join(3);
    twin.steps(4);  // bucket 4 (3 rows and a padding row)
    twin.leave(1);
    twin.steps(3);  // bucket 2
    EXPECT_EQ(graphs.decode_graphs(), 3);
    EXPECT_EQ(eager.decode_graphs(), 0);
}

// A bucket whose capture fails (testing_fail_next_graph_capture: a stream synchronization inside
// the capture, which CUDA refuses and which invalidates it) does not stop the process: one
// warning line, and the bucket launches eagerly from then on, with the eager engine's bits (the
// same kernels on the same inputs: bucket 1 of one sequence has no padding row). The next bucket
// still captures and replays: the failed capture left the stream and the checks sound.
TEST_P(EngineGpu, FailedGraphCaptureFallsBackToEager) {
    const model_fixture::Fixture f = model_fixture::load(GetParam());
    Model model = make_model(f, state_->context());
    InferenceEngine eager = make_engine(model, 2, 16, 0, false);
    InferenceEngine graphs = make_engine(model, 2, 16, 0, true);
    TwinEngines twin{eager, graphs, f};
    twin.join(4);
    graphs.testing_fail_next_graph_capture();
    testing::internal::CaptureStderr();
    twin.steps(4, /*bitwise=*/true);  // bucket 1: eager, the failed capture (eager), eager, eager
    const std::string log = testing::internal::GetCapturedStderr();
    size_t warnings = 0;
    for (size_t at = log.find("runs without a CUDA graph"); at != std::string::npos;
         at = log.find("runs without a CUDA graph", at + 1))
        ++warnings;
    EXPECT_EQ(warnings, 1u) << log;
    EXPECT_EQ(graphs.decode_graphs(), 0);
    twin.join(3);
    twin.steps(3);  // bucket 2: eager, captured, replayed
    EXPECT_EQ(graphs.decode_graphs(), 1);
}

// The decode step with its projections through the skinny GEMM (--decode-gemv on) against the
// same engine on cuBLASLt, eager and replayed from CUDA graphs (buckets 1, 2 and 4, one padding
// row): both sum the same bf16 products in fp32 in other orders and round once to bf16, so the
// logits stay within the bf16 bound of the header and greedy tokens agree up to a near-tie.
TEST_P(EngineGpu, SkinnyGemvDecodeEqualsCublaslt) {
    const model_fixture::Fixture f = model_fixture::load(GetParam());
    Model model = make_model(f, state_->context());
    for (const bool graphs : {false, true}) {
        SCOPED_TRACE(graphs ? "CUDA graphs" : "eager");
        InferenceEngine lt = make_engine(model, 4, 16, 0, graphs);
        InferenceEngine gemv = make_engine(model, 4, 16, 0, graphs, DecodeGemv::kOn);
        TwinEngines twin{lt, gemv, f};
        twin.join(4);
        twin.steps(3);
        twin.join(5);
        twin.steps(3);
        twin.join(3);
        twin.steps(3);
    }
}

// New sequences prefilled in one forward (prefill_many: prompts of 4, 7 and 2 tokens padded to 7,
// a (3, 7) batch through cuDNN's attention, the padding rows writing no cache slot) against the
// same paged engine prefilling them one at a time: the same bf16 ops over other GEMM shapes, so
// every logits row within the header's bound, and the decode steps after them alike.
TEST_P(EngineGpu, PrefillManyEqualsOneAtATime) {
    const model_fixture::Fixture f = model_fixture::load(GetParam());
    Model model = make_model(f, state_->context());
    InferenceEngine one = make_engine(model, 3, 16);
    EngineLimits lim;
    lim.max_sequences = 3;
    lim.max_len = kPrompt + kNew + 8;
    lim.prefill_chunk = 24;
    lim.kv_block_size = 16;
    Result<InferenceEngine> many = InferenceEngine::create(model, lim);
    ASSERT_TRUE(many.ok()) << many.status().to_string();
    TwinEngines twin{one, *many, f};
    const int64_t V = f.config.vocab_size;
    const int32_t* t = f.ref("tokens").as<int32_t>();
    const std::vector<int64_t> lens = {4, std::min<int64_t>(7, f.T), 2};
    std::vector<std::span<const int32_t>> prompts;
    std::vector<float> zb(lens.size() * size_t(V)), za(static_cast<size_t>(V));
    for (const int64_t n : lens) {
        prompts.emplace_back(t, size_t(n));
        twin.st.push_back(*many->open());
    }
    const Status s = many->prefill_many(twin.st, prompts, zb);
    ASSERT_TRUE(s.ok()) << s.to_string();
    for (size_t i = 0; i < lens.size(); ++i) {
        twin.sr.push_back(*one.open());
        ASSERT_TRUE(one.prefill(twin.sr.back(), prompts[i], za).ok());
        const std::vector<float> rb(zb.begin() + long(i) * V, zb.begin() + long(i + 1) * V);
        EXPECT_LE(model_fixture::rel_error(
                      ConstTensorView(rb.data(), DType::kF32, Shape{V}, Device::kCpu),
                      ConstTensorView(za.data(), DType::kF32, Shape{V}, Device::kCpu)),
                  twin.eps_rel)
            << "prompt " << i;
        twin.next.push_back(argmax(za));
        twin.parted.push_back(top2_gap(za) < 2 * twin.eps_rel * max_abs(za) ? 1 : 0);
    }
    twin.steps(3);
}

// The paged cache's decode kernel keeps a block's GQA group of queries, scores and sums in shared
// memory: a group too large for the device's limit per block is refused when the engine is
// created (an error naming head_dim and the group, never a stop at the first decode step), and
// an engine with the row cache is created for the same model. The llama fixture with 280 query
// heads over one key/value head of 8 dims: about 240 KB a block (ops/cuda/attention_decode_smem.h),
// past the H100's 227 KB.
TEST(EngineGpuPagedLimits, GroupBeyondSharedMemoryIsRefusedAtCreation) {
    CudaState state(0);
    model_fixture::Fixture f = model_fixture::load("llama");
    ModelConfig c = f.config;
    c.num_heads = 280;
    c.num_kv_heads = 1;
    c.head_dim = 8;
    c.rope.head_dim = 8;
    ModelShape shape;
    shape.batch = 1;
    shape.seq_len = 1;
    shape.training = false;
    Result<Model> m = Model::create(c, shape, state.context());
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    const Status supported = InferenceEngine::paged_cache_supported(c, state.context());
    ASSERT_FALSE(supported.ok());
    EngineLimits lim;
    lim.max_sequences = 2;
    lim.max_len = 32;
    lim.prefill_chunk = 8;
    lim.kv_block_size = 16;
    Result<InferenceEngine> paged = InferenceEngine::create(*m, lim);
    ASSERT_FALSE(paged.ok());
    EXPECT_EQ(paged.status().code(), StatusCode::kInvalidArgument);
    for (const char* part : {"head_dim 8", "GQA group of 280", "--kv-block-size 0"})
        EXPECT_NE(paged.status().message().find(part), std::string::npos)
            << paged.status().message();
    lim.kv_block_size = 0;
    Result<InferenceEngine> rows = InferenceEngine::create(*m, lim);
    EXPECT_TRUE(rows.ok()) << rows.status().to_string();
}

INSTANTIATE_TEST_SUITE_P(Families, EngineGpu,
                         testing::Values("gpt2", "llama", "mistral", "qwen2", "gpt_neox"));

}  // namespace
}  // namespace lathe
