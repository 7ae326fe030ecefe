// clang-format off
#include "ops/cuda/nvcc_compat.h"  // first: before any header that includes fmt
// clang-format on

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "ops/attention.h"
#include "ops/cuda/attention.h"
#include "ops/cuda/cuda_test_util.h"
#include "ops/op_test.h"

// Attention through cuDNN, against the CPU twin (ops/cpu/attention.cpp) on the same bf16 values.
//
// Tolerances: cuDNN's flash attention rounds P to bf16 before P V in the forward, and P and dS to
// bf16 before the dV, dQ and dK products in the backward: every output is "computed from a
// bf16-rounded intermediate" (kBf16Derived: 4u per element against the output's scale and
// relative, 3u in norm). lse is fp32 from exact bf16 products summed in fp32 (kF32Sum). The CPU
// backward is fed the GPU's own out and lse (bf16 / f32 as the GPU backward reads them), so it
// checks the backward alone.

namespace lathe {
namespace {

using namespace cudatest;

struct Case {
    int64_t B, T, H, Hkv, D, window;
    int docs;            // 0: none; otherwise the mean document length of the packed rows
    float scale = 0.0f;  // 0: 1 / sqrt(D), as the models pass
    bool nondeterministic_backward = false;
    size_t backward_workspace_cap = 0;
};

std::string case_text(const Case& c) {
    return fmt::format(
        "B={} T={} H={} Hkv={} D={} window={} docs={}{}{}", c.B, c.T, c.H, c.Hkv, c.D, c.window,
        c.docs, c.nondeterministic_backward ? " (nondeterministic backward)" : "",
        c.backward_workspace_cap > 0 ? fmt::format(" (backward workspace cap {:.0f} MiB)",
                                                   double(c.backward_workspace_cap) / (1 << 20))
                                     : std::string());
}

cuda::AttentionShape cuda_shape(const Case& c, float scale) {
    cuda::AttentionShape s;
    s.B = c.B, s.T = c.T, s.H = c.H, s.Hkv = c.Hkv, s.D = c.D, s.window = c.window;
    s.docs = c.docs > 0;
    s.scale = scale;
    s.nondeterministic_backward = c.nondeterministic_backward;
    s.backward_workspace_cap = c.backward_workspace_cap;
    return s;
}

// Packed documents: ids rise along each row, a new document starting after each token with
// probability 1 / mean_len (so lengths vary from 1 token to most of the row).
HostTensor make_docs(optest::Rng& rng, int64_t B, int64_t T, int mean_len) {
    HostTensor docs(DType::kI32, Shape{B, T});
    for (int64_t b = 0; b < B; ++b) {
        int32_t id = 0;
        for (int64_t t = 0; t < T; ++t) {
            if (t > 0 && rng.integer(1, mean_len) == 1) ++id;
            docs.as<int32_t>()[b * T + t] = id;
        }
    }
    return docs;
}

bool skip_if_unavailable() {
    if (const char* missing = cuda::attention_unavailable_reason()) {
        std::printf("CUDA attention not built: %s\n", missing);
        return true;
    }
    return false;
}

void check_attention(const Case& c, uint64_t seed) {
    SCOPED_TRACE(case_text(c));
    CudaState state(0);
    const Context gpu = state.context(), cpu = cpu_context();
    optest::Rng rng(seed);
    const float scale = c.scale > 0 ? c.scale : 1.0f / std::sqrt(float(c.D));
    // q, k in [-2, 2): scaled scores with a standard deviation near 1.3, so softmax rows are
    // neither flat nor one-hot.
    const HostTensor q = random_bf16_values(rng, {c.B, c.T, c.H, c.D}, -2.0f, 2.0f);
    const HostTensor k = random_bf16_values(rng, {c.B, c.T, c.Hkv, c.D}, -2.0f, 2.0f);
    const HostTensor v = random_bf16_values(rng, {c.B, c.T, c.Hkv, c.D});
    const HostTensor dout = random_bf16_values(rng, {c.B, c.T, c.H, c.D});
    const HostTensor docs = make_docs(rng, c.B, c.T, c.docs > 0 ? c.docs : 1);
    const ConstTensorView docs_cpu = c.docs > 0 ? ConstTensorView(docs.view()) : ConstTensorView();

    HostTensor out_ref(DType::kF32, {c.B, c.T, c.H, c.D}), lse_ref(DType::kF32, {c.B, c.H, c.T});
    attention_forward(out_ref.view(), lse_ref.view(), q.view(), k.view(), v.view(), docs_cpu,
                      c.window, scale, cpu);

    DeviceTensor gq = upload(q, DType::kBF16, state), gk = upload(k, DType::kBF16, state);
    DeviceTensor gv = upload(v, DType::kBF16, state), gdout = upload(dout, DType::kBF16, state);
    DeviceTensor gdocs = upload(docs, DType::kI32, state);
    const ConstTensorView docs_gpu = c.docs > 0 ? ConstTensorView(gdocs.view) : ConstTensorView();
    DeviceTensor out = device_tensor(DType::kBF16, {c.B, c.T, c.H, c.D}, state);
    DeviceTensor lse = device_tensor(DType::kF32, {c.B, c.H, c.T}, state);
    attention_forward(out.view, lse.view, gq.view, gk.view, gv.view, docs_gpu, c.window, scale,
                      gpu);
    const HostTensor out_gpu = download_f32(out.view, state);
    const HostTensor lse_gpu = download_f32(lse.view, state);
    EXPECT_TRUE(matches(out_gpu, out_ref, kBf16Derived)) << "out";
    EXPECT_TRUE(matches(lse_gpu, lse_ref, kF32Sum)) << "lse";

    // The backward of both backends from the GPU's out and lse.
    HostTensor dq_ref(DType::kF32, q.shape()), dk_ref(DType::kF32, k.shape()),
        dv_ref(DType::kF32, v.shape());
    attention_backward(dq_ref.view(), dk_ref.view(), dv_ref.view(), dout.view(), q.view(), k.view(),
                       v.view(), out_gpu.view(), lse_gpu.view(), docs_cpu, c.window, scale, cpu);
    DeviceTensor dq = device_tensor(DType::kBF16, q.shape(), state);
    DeviceTensor dk = device_tensor(DType::kBF16, k.shape(), state);
    DeviceTensor dv = device_tensor(DType::kBF16, v.shape(), state);
    if (c.nondeterministic_backward || c.backward_workspace_cap > 0) {
        // Variants the dispatcher does not offer: the launcher itself.
        const cuda::AttentionShape shape = cuda_shape(c, scale);
        cuda::attention_backward(dq.view.as<bf16>(), dk.view.as<bf16>(), dv.view.as<bf16>(),
                                 gdout.view.as<bf16>(), gq.view.as<bf16>(), gk.view.as<bf16>(),
                                 gv.view.as<bf16>(), out.view.as<bf16>(), lse.view.as<float>(),
                                 docs_gpu.as<int32_t>(), shape, state, state.stream());
    } else {
        attention_backward(dq.view, dk.view, dv.view, gdout.view, gq.view, gk.view, gv.view,
                           out.view, lse.view, docs_gpu, c.window, scale, gpu);
    }
    EXPECT_TRUE(matches(download_f32(dq.view, state), dq_ref, kBf16Derived)) << "dq";
    EXPECT_TRUE(matches(download_f32(dk.view, state), dk_ref, kBf16Derived)) << "dk";
    EXPECT_TRUE(matches(download_f32(dv.view, state), dv_ref, kBf16Derived)) << "dv";
}

TEST(CudaAttention, MatchesCpuMultiHeadGpt2Heads) {
    if (skip_if_unavailable()) GTEST_SKIP();
    check_attention({2, 256, 12, 12, 64, 0, 0}, 71);
}

TEST(CudaAttention, MatchesCpuGroupedQueryD64) {
    if (skip_if_unavailable()) GTEST_SKIP();
    check_attention({2, 192, 8, 2, 64, 0, 0}, 72);
}

TEST(CudaAttention, MatchesCpuGroupedQueryD128) {
    if (skip_if_unavailable()) GTEST_SKIP();
    check_attention({1, 256, 8, 2, 128, 0, 0}, 73);
}

TEST(CudaAttention, MatchesCpuTNotAMultipleOf64) {
    if (skip_if_unavailable()) GTEST_SKIP();
    check_attention({3, 100, 4, 4, 64, 0, 0}, 74);
}

TEST(CudaAttention, MatchesCpuSlidingWindow) {
    if (skip_if_unavailable()) GTEST_SKIP();
    check_attention({2, 200, 4, 2, 64, 48, 0}, 75);
}

TEST(CudaAttention, MatchesCpuWindowOfTOrMoreIsNoWindow) {
    if (skip_if_unavailable()) GTEST_SKIP();
    check_attention({1, 96, 4, 1, 64, 96, 0}, 76);
}

TEST(CudaAttention, MatchesCpuOtherScale) {
    if (skip_if_unavailable()) GTEST_SKIP();
    check_attention({2, 128, 4, 2, 32, 0, 0, 0.3f}, 77);
}

TEST(CudaAttention, MatchesCpuPackedDocuments) {
    if (skip_if_unavailable()) GTEST_SKIP();
    check_attention({2, 256, 4, 2, 64, 0, 40}, 78);
}

TEST(CudaAttention, MatchesCpuNondeterministicBackward) {
    if (skip_if_unavailable()) GTEST_SKIP();
    check_attention({2, 200, 8, 2, 64, 64, 50, 0.0f, true}, 84);
}

// A workspace cap below the whole batch's need: the backward runs in batch chunks (here one row
// per call, docs bias per chunk), which must change nothing but the workspace.
TEST(CudaAttention, MatchesCpuBackwardInBatchChunks) {
    if (skip_if_unavailable()) GTEST_SKIP();
    const Case c{4, 128, 4, 2, 64, 32, 20, 0.0f, false, 1};
    check_attention(c, 85);
    CudaState whole_state(0), chunked_state(0);
    Case whole = c;
    whole.backward_workspace_cap = 0;
    const size_t whole_bytes = cuda::attention_prepare(whole_state, cuda_shape(whole, 0.125f));
    const size_t chunked_bytes = cuda::attention_prepare(chunked_state, cuda_shape(c, 0.125f));
    EXPECT_LT(chunked_bytes, whole_bytes);
}

TEST(CudaAttention, MatchesCpuPackedShortDocumentsOddT) {
    if (skip_if_unavailable()) GTEST_SKIP();
    check_attention({2, 150, 4, 4, 64, 0, 4}, 79);
}

TEST(CudaAttention, MatchesCpuPackedDocumentsWithWindow) {
    if (skip_if_unavailable()) GTEST_SKIP();
    check_attention({2, 160, 4, 1, 64, 40, 30}, 80);
}

// Two backward passes over the same inputs give the same bits (cuDNN's deterministic backward:
// without it, dQ is accumulated with atomics in whatever order the key blocks finish). Long rows
// and several heads per key/value head make many blocks contribute to each gradient.
void check_backward_is_deterministic(const Case& c, uint64_t seed) {
    SCOPED_TRACE(case_text(c));
    CudaState state(0);
    const Context gpu = state.context();
    optest::Rng rng(seed);
    const float scale = 1.0f / std::sqrt(float(c.D));
    DeviceTensor q =
        upload(random_bf16_values(rng, {c.B, c.T, c.H, c.D}, -2, 2), DType::kBF16, state);
    DeviceTensor k =
        upload(random_bf16_values(rng, {c.B, c.T, c.Hkv, c.D}, -2, 2), DType::kBF16, state);
    DeviceTensor v = upload(random_bf16_values(rng, {c.B, c.T, c.Hkv, c.D}), DType::kBF16, state);
    DeviceTensor dout = upload(random_bf16_values(rng, {c.B, c.T, c.H, c.D}), DType::kBF16, state);
    DeviceTensor out = device_tensor(DType::kBF16, {c.B, c.T, c.H, c.D}, state);
    DeviceTensor lse = device_tensor(DType::kF32, {c.B, c.H, c.T}, state);
    attention_forward(out.view, lse.view, q.view, k.view, v.view, ConstTensorView(), c.window,
                      scale, gpu);
    HostTensor first[3];
    for (int run = 0; run < 2; ++run) {
        DeviceTensor dq = device_tensor(DType::kBF16, q.view.shape(), state);
        DeviceTensor dk = device_tensor(DType::kBF16, k.view.shape(), state);
        DeviceTensor dv = device_tensor(DType::kBF16, v.view.shape(), state);
        attention_backward(dq.view, dk.view, dv.view, dout.view, q.view, k.view, v.view, out.view,
                           lse.view, ConstTensorView(), c.window, scale, gpu);
        HostTensor got[3] = {download_raw(dq.view, state), download_raw(dk.view, state),
                             download_raw(dv.view, state)};
        if (run == 0) {
            for (int i = 0; i < 3; ++i) first[i] = std::move(got[i]);
        } else {
            EXPECT_TRUE(bitwise_equal(got[0], first[0])) << "dq";
            EXPECT_TRUE(bitwise_equal(got[1], first[1])) << "dk";
            EXPECT_TRUE(bitwise_equal(got[2], first[2])) << "dv";
        }
    }
}

TEST(CudaAttention, BackwardIsDeterministicMultiHead) {
    if (skip_if_unavailable()) GTEST_SKIP();
    check_backward_is_deterministic({4, 1024, 12, 12, 64, 0, 0}, 81);
}

TEST(CudaAttention, BackwardIsDeterministicGroupedQuery) {
    if (skip_if_unavailable()) GTEST_SKIP();
    check_backward_is_deterministic({2, 1024, 8, 2, 64, 0, 0}, 82);
}

// One attention problem's inputs on the host: q, k in [-2, 2], v and dout in [-1, 1].
struct HostInputs {
    HostTensor q, k, v, dout;
};

HostInputs random_inputs(optest::Rng& rng, const Case& c) {
    HostInputs in;
    in.q = random_bf16_values(rng, {c.B, c.T, c.H, c.D}, -2, 2);
    in.k = random_bf16_values(rng, {c.B, c.T, c.Hkv, c.D}, -2, 2);
    in.v = random_bf16_values(rng, {c.B, c.T, c.Hkv, c.D});
    in.dout = random_bf16_values(rng, {c.B, c.T, c.H, c.D});
    return in;
}

// The device tensors of one forward and backward through the dispatcher (no docs).
struct DeviceRun {
    DeviceTensor q, k, v, dout, out, lse, dq, dk, dv;

    // Uploads `in` to `state` and runs the forward, then the backward, under `gpu`.
    DeviceRun(const HostInputs& in, const Case& c, float scale, CudaState& state,
              const Context& gpu)
        : q(upload(in.q, DType::kBF16, state)),
          k(upload(in.k, DType::kBF16, state)),
          v(upload(in.v, DType::kBF16, state)),
          dout(upload(in.dout, DType::kBF16, state)),
          out(device_tensor(DType::kBF16, {c.B, c.T, c.H, c.D}, state)),
          lse(device_tensor(DType::kF32, {c.B, c.H, c.T}, state)),
          dq(device_tensor(DType::kBF16, q.view.shape(), state)),
          dk(device_tensor(DType::kBF16, k.view.shape(), state)),
          dv(device_tensor(DType::kBF16, v.view.shape(), state)) {
        attention_forward(out.view, lse.view, q.view, k.view, v.view, ConstTensorView(), c.window,
                          scale, gpu);
        backward(c, scale, gpu);
    }
    void backward(const Case& c, float scale, const Context& gpu) {
        attention_backward(dq.view, dk.view, dv.view, dout.view, q.view, k.view, v.view, out.view,
                           lse.view, ConstTensorView(), c.window, scale, gpu);
    }
};

// The backward under a workspace cap (Context::attention_backward_workspace_cap, which a training
// model sets to the scratch it lends: model/memory_plan.h) runs one batch row per call, and gives
// bitwise the dq, dk, dv of the one call on the whole batch: the rows are independent, so the
// memory plan may chunk without changing a bit. The GQA head shapes of Llama-3-8B (D = 128) and
// Llama-3.2-1B (D = 64), through the op's dispatcher as block_backward calls it.
void check_chunked_backward_gives_the_whole_batchs_bits(const Case& c, uint64_t seed) {
    SCOPED_TRACE(case_text(c));
    const float scale = 1.0f / std::sqrt(float(c.D));
    optest::Rng rng(seed);
    const HostInputs in = random_inputs(rng, c);
    HostTensor results[2][3];
    size_t workspace[2] = {0, 0};
    for (int capped = 0; capped < 2; ++capped) {
        CudaState state(0);
        Context gpu = state.context();
        gpu.attention_backward_workspace_cap = capped ? 1 : 0;  // 1 byte: one row a call
        cuda::AttentionShape shape = cuda_shape(c, scale);
        shape.backward_workspace_cap = gpu.attention_backward_workspace_cap;
        workspace[capped] = cuda::attention_workspace_bytes(state, shape);
        const DeviceRun run(in, c, scale, state, gpu);
        results[capped][0] = download_raw(run.dq.view, state);
        results[capped][1] = download_raw(run.dk.view, state);
        results[capped][2] = download_raw(run.dv.view, state);
    }
    EXPECT_LT(workspace[1], workspace[0]) << "one row a call asks for less workspace";
    EXPECT_TRUE(bitwise_equal(results[1][0], results[0][0])) << "dq";
    EXPECT_TRUE(bitwise_equal(results[1][1], results[0][1])) << "dk";
    EXPECT_TRUE(bitwise_equal(results[1][2], results[0][2])) << "dv";
}

TEST(CudaAttention, ChunkedBackwardGivesTheWholeBatchsBitsHeadDim128) {
    if (skip_if_unavailable()) GTEST_SKIP();
    check_chunked_backward_gives_the_whole_batchs_bits({2, 1024, 32, 8, 128, 0, 0}, 86);
}

TEST(CudaAttention, ChunkedBackwardGivesTheWholeBatchsBitsHeadDim64) {
    if (skip_if_unavailable()) GTEST_SKIP();
    check_chunked_backward_gives_the_whole_batchs_bits({4, 1024, 32, 8, 64, 0, 0}, 87);
}

// q, k, v packed by rows in one buffer (what the model's single q, k, v GEMM writes), and dq, dk,
// dv written into one: cuDNN reads and writes the head slices through strides, and gives the bits
// of the separate tensors (the same kernel on the same tiles). With docs, a window and the backward
// in batch chunks (a 1-byte workspace cap: one row a call, pointer offsets per chunk in the packed
// layout). Every element of dqkv is written (it starts as NaN).
void check_packed_qkv_gives_the_separate_bits(const Case& c, uint64_t seed) {
    SCOPED_TRACE(case_text(c));
    const float scale = 1.0f / std::sqrt(float(c.D));
    optest::Rng rng(seed);
    const HostInputs in = random_inputs(rng, c);
    const HostTensor docs = make_docs(rng, c.B, c.T, c.docs > 0 ? c.docs : 1);
    CudaState state(0);
    Context gpu = state.context();
    gpu.attention_backward_workspace_cap = c.backward_workspace_cap;
    DeviceTensor gdocs = upload(docs, DType::kI32, state);
    const ConstTensorView docs_gpu = c.docs > 0 ? ConstTensorView(gdocs.view) : ConstTensorView();
    DeviceTensor q = upload(in.q, DType::kBF16, state), k = upload(in.k, DType::kBF16, state);
    DeviceTensor v = upload(in.v, DType::kBF16, state), dout = upload(in.dout, DType::kBF16, state);
    const Shape o_shape{c.B, c.T, c.H, c.D}, lse_shape{c.B, c.H, c.T};
    DeviceTensor out = device_tensor(DType::kBF16, o_shape, state);
    DeviceTensor lse = device_tensor(DType::kF32, lse_shape, state);
    DeviceTensor dq = device_tensor(DType::kBF16, q.view.shape(), state);
    DeviceTensor dk = device_tensor(DType::kBF16, k.view.shape(), state);
    DeviceTensor dv = device_tensor(DType::kBF16, v.view.shape(), state);
    attention_forward(out.view, lse.view, q.view, k.view, v.view, docs_gpu, c.window, scale, gpu);
    attention_backward(dq.view, dk.view, dv.view, dout.view, q.view, k.view, v.view, out.view,
                       lse.view, docs_gpu, c.window, scale, gpu);

    const HostTensor packed = optest::pack_heads({in.q.view(), in.k.view(), in.v.view()});
    DeviceTensor qkv = upload(packed, DType::kBF16, state);
    DeviceTensor out2 = device_tensor(DType::kBF16, o_shape, state);
    DeviceTensor lse2 = device_tensor(DType::kF32, lse_shape, state);
    HostTensor nan(DType::kF32, packed.shape());
    std::fill_n(nan.as<float>(), nan.numel(), std::nanf(""));
    DeviceTensor dqkv = upload(nan, DType::kBF16, state);
    attention_forward_qkv(out2.view, lse2.view, qkv.view, docs_gpu, c.window, scale, gpu);
    attention_backward_qkv(dqkv.view, dout.view, qkv.view, out2.view, lse2.view, docs_gpu, c.window,
                           scale, gpu);
    EXPECT_TRUE(bitwise_equal(download_raw(out2.view, state), download_raw(out.view, state)))
        << "out";
    EXPECT_TRUE(bitwise_equal(download_raw(lse2.view, state), download_raw(lse.view, state)))
        << "lse";
    const HostTensor d = download_raw(dqkv.view, state);
    EXPECT_TRUE(bitwise_equal(optest::take_heads(d.view(), 0, c.H), download_raw(dq.view, state)))
        << "dq";
    EXPECT_TRUE(
        bitwise_equal(optest::take_heads(d.view(), c.H, c.Hkv), download_raw(dk.view, state)))
        << "dk";
    EXPECT_TRUE(bitwise_equal(optest::take_heads(d.view(), c.H + c.Hkv, c.Hkv),
                              download_raw(dv.view, state)))
        << "dv";
}

TEST(CudaAttention, PackedQkvGivesTheSeparateBitsGpt2Heads) {
    if (skip_if_unavailable()) GTEST_SKIP();
    check_packed_qkv_gives_the_separate_bits({2, 256, 12, 12, 64, 0, 0}, 88);
}

TEST(CudaAttention, PackedQkvGivesTheSeparateBitsGroupedQueryD128) {
    if (skip_if_unavailable()) GTEST_SKIP();
    check_packed_qkv_gives_the_separate_bits({1, 256, 8, 2, 128, 0, 0}, 89);
}

TEST(CudaAttention, PackedQkvGivesTheSeparateBitsDocumentsWindowBatchChunks) {
    if (skip_if_unavailable()) GTEST_SKIP();
    check_packed_qkv_gives_the_separate_bits({4, 160, 4, 1, 64, 40, 30, 0.0f, false, 1}, 90);
}

// A workspace lent by the caller (the model lends scratch that is dead during attention): the
// graphs run on it, the state grows no buffer of its own, and the results are bitwise those on
// the state's own workspace; once the loan ends the state grows its own again. The lent memory is
// filled with garbage first: cuDNN must not read what it did not write.
TEST(CudaAttention, LentWorkspaceGivesTheSameBitsAndGrowsNothing) {
    if (skip_if_unavailable()) GTEST_SKIP();
    const Case c{2, 1024, 8, 2, 64, 0, 0};
    SCOPED_TRACE(case_text(c));
    const float scale = 1.0f / std::sqrt(float(c.D));
    optest::Rng rng(83);
    const HostInputs in = random_inputs(rng, c);
    HostTensor results[2][5];
    for (int lend = 0; lend < 2; ++lend) {
        CudaState state(0);
        const Context gpu = state.context();
        const cuda::AttentionShape shape = cuda_shape(c, scale);
        const size_t need = cuda::attention_workspace_bytes(state, shape);
        EXPECT_EQ(cuda::attention_buffer_bytes(state), 0u) << "asking allocates nothing";
        DeviceTensor lent = device_tensor(DType::kU8, {int64_t(need) + 256}, state);
        if (lend) {
            cuda_fill_bytes(lent.view, 0xA5, state.stream());
            cuda::attention_lend_workspace(state, lent.view.data(), need + 256);
        }
        DeviceRun run(in, c, scale, state, gpu);
        results[lend][0] = download_raw(run.out.view, state);
        results[lend][1] = download_raw(run.lse.view, state);
        results[lend][2] = download_raw(run.dq.view, state);
        results[lend][3] = download_raw(run.dk.view, state);
        results[lend][4] = download_raw(run.dv.view, state);
        if (lend) {
            EXPECT_EQ(cuda::attention_buffer_bytes(state), 0u) << "the lent memory fit";
            cuda::attention_end_loan(state, lent.view.data());
            run.backward(c, scale, gpu);
            EXPECT_GE(cuda::attention_buffer_bytes(state), need) << "own workspace after the loan";
            EXPECT_TRUE(bitwise_equal(download_raw(run.dq.view, state), results[1][2]));
        } else {
            EXPECT_GE(cuda::attention_buffer_bytes(state), need);
        }
    }
    const char* names[] = {"out", "lse", "dq", "dk", "dv"};
    for (int i = 0; i < 5; ++i)
        EXPECT_TRUE(bitwise_equal(results[0][i], results[1][i])) << names[i];
}

// The training shapes (GPT-2 124M B32 T1024, Llama-1B B8 T2048): attention_prepare builds both
// graphs and sizes the buffers; the forward and backward that follow must not grow them (nothing
// allocated per step) and must write finite values everywhere. Prints the buffer bytes (for the
// memory plan) and the times.
void check_training_shape(const Case& c) {
    SCOPED_TRACE(case_text(c));
    CudaState state(0);
    const Context gpu = state.context();
    const cuda::AttentionShape shape = cuda_shape(c, 1.0f / std::sqrt(float(c.D)));
    const size_t need = cuda::attention_prepare(state, shape);
    const size_t held = cuda::attention_buffer_bytes(state);
    EXPECT_GE(held, need);
    optest::Rng rng(83);
    DeviceTensor q = upload(random_bf16_values(rng, {c.B, c.T, c.H, c.D}), DType::kBF16, state);
    DeviceTensor k = upload(random_bf16_values(rng, {c.B, c.T, c.Hkv, c.D}), DType::kBF16, state);
    DeviceTensor v = upload(random_bf16_values(rng, {c.B, c.T, c.Hkv, c.D}), DType::kBF16, state);
    DeviceTensor docs =
        upload(make_docs(rng, c.B, c.T, c.docs > 0 ? c.docs : 1), DType::kI32, state);
    const ConstTensorView docs_view = c.docs > 0 ? ConstTensorView(docs.view) : ConstTensorView();
    DeviceTensor out = device_tensor(DType::kBF16, q.view.shape(), state);
    DeviceTensor lse = device_tensor(DType::kF32, {c.B, c.H, c.T}, state);
    DeviceTensor dq = device_tensor(DType::kBF16, q.view.shape(), state);
    DeviceTensor dk = device_tensor(DType::kBF16, k.view.shape(), state);
    DeviceTensor dv = device_tensor(DType::kBF16, v.view.shape(), state);
    cudaEvent_t ev[3];
    for (cudaEvent_t& e : ev) ASSERT_EQ(cudaEventCreate(&e), cudaSuccess);
    constexpr int kReps = 10;
    float fwd_ms = 0, bwd_ms = 0;
    for (int rep = 0; rep <= kReps; ++rep) {  // rep 0 warms up
        cudaEventRecord(ev[0], state.stream());
        attention_forward(out.view, lse.view, q.view, k.view, v.view, docs_view, c.window,
                          shape.scale, gpu);
        cudaEventRecord(ev[1], state.stream());
        // out doubles as dout: any bf16 values do for timing and finiteness. The launcher, not the
        // dispatcher, so that the nondeterministic variant is timed too.
        cuda::attention_backward(dq.view.as<bf16>(), dk.view.as<bf16>(), dv.view.as<bf16>(),
                                 out.view.as<bf16>(), q.view.as<bf16>(), k.view.as<bf16>(),
                                 v.view.as<bf16>(), out.view.as<bf16>(), lse.view.as<float>(),
                                 docs_view.as<int32_t>(), shape, state, state.stream());
        cudaEventRecord(ev[2], state.stream());
        ASSERT_EQ(cudaEventSynchronize(ev[2]), cudaSuccess);
        float f = 0, b = 0;
        cudaEventElapsedTime(&f, ev[0], ev[1]);
        cudaEventElapsedTime(&b, ev[1], ev[2]);
        if (rep > 0) fwd_ms += f / kReps, bwd_ms += b / kReps;
    }
    for (cudaEvent_t e : ev) cudaEventDestroy(e);
    EXPECT_EQ(cuda::attention_buffer_bytes(state), held) << "a call grew the attention buffers";
    for (const DeviceTensor* t : {&out, &lse, &dq, &dk, &dv}) {
        const HostTensor h = download_f32(t->view, state);
        int64_t bad = 0;
        for (int64_t i = 0; i < h.numel(); ++i) bad += !std::isfinite(h.as<float>()[i]);
        EXPECT_EQ(bad, 0) << t->view.to_string();
    }
    // Causal attention FLOPs: 4 B H T^2 D / 2 forward, 2.5x that backward.
    const double fwd_flop = 2.0 * double(c.B * c.H) * double(c.T) * double(c.T) * double(c.D);
    std::printf(
        "attention %s: cuDNN %lld, buffers %.1f MiB (this shape needs %.1f MiB), forward %.3f ms "
        "(%.0f TFLOP/s), backward %.3f ms (%.0f TFLOP/s)\n",
        case_text(c).c_str(), (long long)cuda::attention_cudnn_version(), double(held) / (1 << 20),
        double(need) / (1 << 20), fwd_ms, fwd_flop / fwd_ms * 1e-9, bwd_ms,
        2.5 * fwd_flop / bwd_ms * 1e-9);
}

TEST(CudaAttention, Gpt2TrainingShape) {
    if (skip_if_unavailable()) GTEST_SKIP();
    check_training_shape({32, 1024, 12, 12, 64, 0, 0});
}

TEST(CudaAttention, Llama1BTrainingShape) {
    if (skip_if_unavailable()) GTEST_SKIP();
    check_training_shape({8, 2048, 32, 8, 64, 0, 0});
}

// The training shapes as the models run them: the backward capped at the scratch the model's
// plan lends it (MemoryPlan::attention_backward_cap, from `lathe bench --plan-only --device cuda`:
// 1,543,256,064 B for llama-1b B8 T2048, 1,442,592,768 B for llama3-8b-8l B2 T4096), so in batch
// chunks where the whole batch asks for more; the printed times against the uncapped rows give
// what the chunks cost. The Llama-3-8B layer shape uncapped too.
TEST(CudaAttention, Llama1BTrainingShapeInTheModelsChunks) {
    if (skip_if_unavailable()) GTEST_SKIP();
    check_training_shape({8, 2048, 32, 8, 64, 0, 0, 0.0f, false, size_t(1543256064)});
}

TEST(CudaAttention, Llama3_8BTrainingShape) {
    if (skip_if_unavailable()) GTEST_SKIP();
    check_training_shape({2, 4096, 32, 8, 128, 0, 0});
}

TEST(CudaAttention, Llama3_8BTrainingShapeInTheModelsChunks) {
    if (skip_if_unavailable()) GTEST_SKIP();
    check_training_shape({2, 4096, 32, 8, 128, 0, 0, 0.0f, false, size_t(1442592768)});
}

TEST(CudaAttention, Gpt2TrainingShapeNondeterministicBackward) {
    if (skip_if_unavailable()) GTEST_SKIP();
    check_training_shape({32, 1024, 12, 12, 64, 0, 0, 0.0f, true});
}

TEST(CudaAttention, Llama1BTrainingShapeNondeterministicBackward) {
    if (skip_if_unavailable()) GTEST_SKIP();
    check_training_shape({8, 2048, 32, 8, 64, 0, 0, 0.0f, true});
}

TEST(CudaAttention, Gpt2TrainingShapeBackwardWorkspaceCap) {
    if (skip_if_unavailable()) GTEST_SKIP();
    check_training_shape({32, 1024, 12, 12, 64, 0, 0, 0.0f, false, size_t(256) << 20});
}

TEST(CudaAttention, Llama1BTrainingShapeBackwardWorkspaceCap) {
    if (skip_if_unavailable()) GTEST_SKIP();
    check_training_shape({8, 2048, 32, 8, 64, 0, 0, 0.0f, false, size_t(512) << 20});
}

TEST(CudaAttention, Llama1BTrainingShapePackedDocuments) {
    if (skip_if_unavailable()) GTEST_SKIP();
    check_training_shape({8, 2048, 32, 8, 64, 0, 500});
}

// Inference attention (queries that continue a cache, the decode step) against the CPU reference
// on the same bf16 values. lathe's kernel (ops/cuda/attention_rows.cu) computes every output in
// fp32 (scores from exact bf16 products, an fp32 online softmax, fp32 sums of p v) and rounds it to
// bf16 once: off by one bf16 rounding of a sum, relative to the output's scale (kBf16Sum). cuDNN's
// cache form rounds P to bf16 before P V, as its training forward does (kBf16Derived). lse is fp32
// from the same inputs summed in another order (kF32Sum, derived for up to 4096 terms: every case
// here has Tk <= 4096).
struct RowsCase {
    int64_t B, Tq, Tk, q_offset, H, Hkv, D, window;
    int docs;  // 0: none; otherwise the mean document length
};

std::string rows_case_text(const RowsCase& c) {
    return fmt::format("B={} Tq={} Tk={} q_offset={} H={} Hkv={} D={} window={} docs={}", c.B, c.Tq,
                       c.Tk, c.q_offset, c.H, c.Hkv, c.D, c.window, c.docs);
}

// Cache rows from `from` on (every batch row) set to NaN: the op must never read them.
void poison_rows_from(HostTensor& x, int64_t from) {
    const Shape s = x.shape();
    const int64_t row = s[2] * s[3];
    for (int64_t b = 0; b < s[0]; ++b)
        for (int64_t i = (b * s[1] + from) * row; i < (b + 1) * s[1] * row; ++i)
            x.as<float>()[i] = NAN;
}

// Both CUDA routes of a cache-form shape against the CPU: lathe's kernel called directly (no
// workspace, no graph), then the dispatcher, which takes cuDNN's bottom-right aligned graph when
// the shape allows it (no docs, D <= 128 and a multiple of 8, cuDNN built); the test expects
// cuDNN to take such shapes (cuDNN >= 9.6), so that a cuDNN that declines them is seen.
void check_rows(const RowsCase& c, uint64_t seed) {
    SCOPED_TRACE(rows_case_text(c));
    CudaState state(0);
    const Context gpu = state.context(), cpu = cpu_context();
    optest::Rng rng(seed);
    const float scale = 1.0f / std::sqrt(float(c.D));
    const HostTensor q = random_bf16_values(rng, {c.B, c.Tq, c.H, c.D}, -2.0f, 2.0f);
    HostTensor k = random_bf16_values(rng, {c.B, c.Tk, c.Hkv, c.D}, -2.0f, 2.0f);
    HostTensor v = random_bf16_values(rng, {c.B, c.Tk, c.Hkv, c.D});
    poison_rows_from(k, c.q_offset + c.Tq);  // past the last query: never visible
    poison_rows_from(v, c.q_offset + c.Tq);
    const HostTensor docs = make_docs(rng, c.B, c.Tk, c.docs > 0 ? c.docs : 1);
    const ConstTensorView docs_cpu = c.docs > 0 ? ConstTensorView(docs.view()) : ConstTensorView();

    HostTensor out_ref(DType::kF32, q.shape()), lse_ref(DType::kF32, {c.B, c.H, c.Tq});
    attention_forward(out_ref.view(), lse_ref.view(), q.view(), k.view(), v.view(), docs_cpu,
                      c.window, scale, c.q_offset, cpu);

    DeviceTensor gq = upload(q, DType::kBF16, state), gk = upload(k, DType::kBF16, state);
    DeviceTensor gv = upload(v, DType::kBF16, state), gdocs = upload(docs, DType::kI32, state);
    const ConstTensorView docs_gpu = c.docs > 0 ? ConstTensorView(gdocs.view) : ConstTensorView();
    {
        SCOPED_TRACE("lathe's kernel");
        DeviceTensor out = device_tensor(DType::kBF16, q.shape(), state);
        DeviceTensor lse = device_tensor(DType::kF32, {c.B, c.H, c.Tq}, state);
        const cuda::AttentionRowsShape shape{c.B, c.Tq,       c.Tk,     c.H,  c.Hkv,
                                             c.D, c.q_offset, c.window, scale};
        cuda::attention_forward_rows(out.view.as<bf16>(), lse.view.as<float>(), gq.view.as<bf16>(),
                                     gk.view.as<bf16>(), gv.view.as<bf16>(), docs_gpu.as<int32_t>(),
                                     nullptr, shape, state, state.stream());
        EXPECT_TRUE(matches(download_f32(out.view, state), out_ref, kBf16Sum)) << "out";
        EXPECT_TRUE(matches(download_f32(lse.view, state), lse_ref, kF32Sum)) << "lse";
        EXPECT_EQ(cuda::attention_buffer_bytes(state), 0u) << "the kernel needs no workspace";
        EXPECT_EQ(cuda::attention_graph_count(state), 0u) << "and no cuDNN graph";
    }
    const bool cudnn_shape = c.docs == 0 && c.D <= 128 && c.D % 8 == 0 &&
                             cuda::attention_unavailable_reason() == nullptr;
    bool cudnn = false;
    if (cudnn_shape) {
        cuda::AttentionShape shape;
        shape.B = c.B, shape.T = c.Tq, shape.H = c.H, shape.Hkv = c.Hkv, shape.D = c.D;
        shape.window = c.window, shape.scale = scale;
        shape.Tkv = c.q_offset + c.Tq, shape.kv_rows = c.Tk;
        cudnn = cuda::attention_cudnn_takes(state, shape);
        EXPECT_TRUE(cudnn) << "cuDNN " << cuda::attention_cudnn_version()
                           << " declined the cache form (bottom-right causal mask); the dispatcher "
                              "runs lathe's kernel instead";
    }
    SCOPED_TRACE(cudnn ? "dispatcher: cuDNN" : "dispatcher: lathe's kernel");
    DeviceTensor out = device_tensor(DType::kBF16, q.shape(), state);
    DeviceTensor lse = device_tensor(DType::kF32, {c.B, c.H, c.Tq}, state);
    attention_forward(out.view, lse.view, gq.view, gk.view, gv.view, docs_gpu, c.window, scale,
                      c.q_offset, gpu);
    EXPECT_TRUE(matches(download_f32(out.view, state), out_ref, cudnn ? kBf16Derived : kBf16Sum))
        << "out";
    EXPECT_TRUE(matches(download_f32(lse.view, state), lse_ref, kF32Sum)) << "lse";
    EXPECT_EQ(cuda::attention_graph_count(state), cudnn_shape ? 1u : 0u);
}

TEST(CudaAttentionRows, PromptChunkAtTheEndOfTheCacheGroupedQuery) {
    check_rows({2, 37, 300, 263, 8, 2, 64, 0, 0}, 91);
}

// q_offset 0 with a longer cache: cuDNN's top-left aligned graph on the cache's strides.
TEST(CudaAttentionRows, PromptAtTheStartOfALongerCache) {
    check_rows({2, 24, 100, 0, 4, 2, 64, 0, 0}, 90);
}

TEST(CudaAttentionRows, ChunkInTheMiddleWithWindowD128) {
    check_rows({1, 5, 200, 100, 4, 4, 128, 48, 0}, 92);
}

TEST(CudaAttentionRows, PackedDocumentsAtAnOffsetMultiQuery) {
    check_rows({2, 16, 160, 144, 4, 1, 64, 0, 30}, 93);
}

TEST(CudaAttentionRows, OneQueryGpt2Heads) {
    check_rows({3, 1, 129, 128, 12, 12, 64, 0, 0}, 94);
}

TEST(CudaAttentionRows, HeadDim256WithWindow) {
    check_rows({1, 7, 64, 57, 2, 1, 256, 16, 0}, 95);
}

// D = 80: lanes 0..15 hold a third dim, the others two (documents: the kernel on both routes).
TEST(CudaAttentionRows, HeadDimNotAMultipleOf32WithDocuments) {
    check_rows({1, 9, 90, 81, 4, 2, 80, 0, 20}, 96);
}

TEST(CudaAttentionRows, LongCacheLlama1BHeads) {
    check_rows({1, 4, 4096, 4092, 32, 8, 64, 0, 0}, 97);
}

// The decode step against the CPU's: rows of different lengths (1 and Tmax included) in one
// cache, slots at or past each length NaN.
void check_decode(int64_t window, uint64_t seed) {
    const int64_t B = 4, Tmax = 300, H = 32, Hkv = 8, D = 64;
    const std::vector<int32_t> len = {1, 300, 77, 128};
    SCOPED_TRACE(
        fmt::format("decode B={} Tmax={} H={} Hkv={} D={} window={}", B, Tmax, H, Hkv, D, window));
    CudaState state(0);
    const Context gpu = state.context(), cpu = cpu_context();
    optest::Rng rng(seed);
    const float scale = 1.0f / std::sqrt(float(D));
    const HostTensor q = random_bf16_values(rng, {B, 1, H, D}, -2.0f, 2.0f);
    HostTensor k = random_bf16_values(rng, {B, Tmax, Hkv, D}, -2.0f, 2.0f);
    HostTensor v = random_bf16_values(rng, {B, Tmax, Hkv, D});
    for (int64_t b = 0; b < B; ++b)
        for (int64_t i = (b * Tmax + len[b]) * Hkv * D; i < (b + 1) * Tmax * Hkv * D; ++i)
            k.as<float>()[i] = v.as<float>()[i] = NAN;
    HostTensor lengths(DType::kI32, {B});
    std::copy(len.begin(), len.end(), lengths.as<int32_t>());

    HostTensor out_ref(DType::kF32, q.shape()), lse_ref(DType::kF32, {B, H, 1});
    attention_decode(out_ref.view(), lse_ref.view(), q.view(), k.view(), v.view(), lengths.view(),
                     window, scale, cpu);
    DeviceTensor gq = upload(q, DType::kBF16, state), gk = upload(k, DType::kBF16, state);
    DeviceTensor gv = upload(v, DType::kBF16, state), glen = upload(lengths, DType::kI32, state);
    DeviceTensor out = device_tensor(DType::kBF16, q.shape(), state);
    DeviceTensor lse = device_tensor(DType::kF32, {B, H, 1}, state);
    attention_decode(out.view, lse.view, gq.view, gk.view, gv.view, glen.view, window, scale, gpu);
    EXPECT_TRUE(matches(download_f32(out.view, state), out_ref, kBf16Sum)) << "out";
    EXPECT_TRUE(matches(download_f32(lse.view, state), lse_ref, kF32Sum)) << "lse";
}

TEST(CudaAttentionDecode, MatchesCpuRowsOfDifferentLengths) {
    check_decode(0, 98);
}

TEST(CudaAttentionDecode, MatchesCpuWithWindow) {
    check_decode(64, 99);
}

// The split-K decode path (ops/cuda/attention_rows.cu) against the CPU, row by row: rows of
// lengths 1 .. 31000 in one cache (Tmax the longest; slots at or past each length NaN, so a key
// read past its row shows), out and lse of each row checked against that row's own scale (a long
// row's outputs average thousands of values and sit far below a one-key row's), then the same call
// again for the same bits (the splits and their merge order depend on the shape and the lengths
// only, no atomics).
// Bound: q, k, v are bf16 values fed exactly to both sides; the GPU computes in f32 and rounds out
// once to bf16. Its f32 error against the CPU's f32 comes from other summation orders: a score is
// a D-term dot product (D = 128: about sqrt(D) 2^-24 of |q||k| scale, under 1e-6; the tensor-core
// kernel's mma accumulates the exact bf16 products in f32, not IEEE-rounded at each addition), p =
// exp of a score (2 ulp; the tensor-core kernel feeds p to P V as two bf16 parts, hi + lo, within
// 2^-16 of p), and l and acc sum a split's keys in tiles (a 6-level tree per 64-key tile, then one
// addition per tile) and the splits in split order: at most (6 + Tk / 64 / splits + splits)
// additions, each 2^-24 relative, 1e-5 at the worst for 31000 keys, against a bf16 unit of 2^-8
// (and 2^-16 of p: 2^-8 of a unit). So out is one bf16 rounding (half a unit) from a value 1e-5
// from the reference: kBf16Sum (2 units relative plus 2 units of the row's scale, the existing
// decode bound) holds with room, and lse = m + log l is f32 with an error of about 1e-5 absolute
// against |lse| ~ 10: kF32Sum.
struct DecodeCase {
    int64_t H, Hkv, D, window;
    std::vector<int32_t> lengths;
};

void check_decode_rows(const DecodeCase& c, uint64_t seed) {
    const int64_t B = int64_t(c.lengths.size()), H = c.H, Hkv = c.Hkv, D = c.D;
    const int64_t Tmax = *std::max_element(c.lengths.begin(), c.lengths.end());
    SCOPED_TRACE(fmt::format("decode B={} Tmax={} H={} Hkv={} D={} window={}", B, Tmax, H, Hkv, D,
                             c.window));
    CudaState state(0);
    const Context gpu = state.context(), cpu = cpu_context();
    optest::Rng rng(seed);
    const float scale = 1.0f / std::sqrt(float(D));
    const HostTensor q = random_bf16_values(rng, {B, 1, H, D}, -2.0f, 2.0f);
    // Only the filled slots are drawn (31000 x 6 rows of random keys would dominate the test).
    HostTensor k(DType::kF32, {B, Tmax, Hkv, D}), v(DType::kF32, {B, Tmax, Hkv, D});
    std::fill_n(k.as<float>(), k.numel(), NAN);
    std::fill_n(v.as<float>(), v.numel(), NAN);
    for (int64_t b = 0; b < B; ++b)
        for (int64_t i = b * Tmax * Hkv * D; i < (b * Tmax + c.lengths[b]) * Hkv * D; ++i) {
            k.as<float>()[i] = rng.uniform(-2.0f, 2.0f);
            v.as<float>()[i] = rng.uniform(-1.0f, 1.0f);
        }
    k = round_to_bf16(k);
    v = round_to_bf16(v);
    HostTensor lengths(DType::kI32, {B});
    std::copy(c.lengths.begin(), c.lengths.end(), lengths.as<int32_t>());

    HostTensor out_ref(DType::kF32, q.shape()), lse_ref(DType::kF32, {B, H, 1});
    attention_decode(out_ref.view(), lse_ref.view(), q.view(), k.view(), v.view(), lengths.view(),
                     c.window, scale, cpu);
    DeviceTensor gq = upload(q, DType::kBF16, state), gk = upload(k, DType::kBF16, state);
    DeviceTensor gv = upload(v, DType::kBF16, state), glen = upload(lengths, DType::kI32, state);
    DeviceTensor out = device_tensor(DType::kBF16, q.shape(), state);
    DeviceTensor lse = device_tensor(DType::kF32, {B, H, 1}, state);
    attention_decode(out.view, lse.view, gq.view, gk.view, gv.view, glen.view, c.window, scale,
                     gpu);
    const HostTensor out_got = download_f32(out.view, state);
    const HostTensor lse_got = download_f32(lse.view, state);
    for (int64_t b = 0; b < B; ++b) {
        SCOPED_TRACE(fmt::format("row {} of length {}", b, c.lengths[b]));
        auto row = [](const HostTensor& t, int64_t b, int64_t n) {
            HostTensor r(DType::kF32, {n});
            std::copy_n(t.as<float>() + b * n, n, r.as<float>());
            return r;
        };
        EXPECT_TRUE(matches(row(out_got, b, H * D), row(out_ref, b, H * D), kBf16Sum)) << "out";
        EXPECT_TRUE(matches(row(lse_got, b, H), row(lse_ref, b, H), kF32Sum)) << "lse";
    }
    DeviceTensor out2 = device_tensor(DType::kBF16, q.shape(), state);
    DeviceTensor lse2 = device_tensor(DType::kF32, {B, H, 1}, state);
    attention_decode(out2.view, lse2.view, gq.view, gk.view, gv.view, glen.view, c.window, scale,
                     gpu);
    EXPECT_TRUE(bitwise_equal(download_raw(out.view, state), download_raw(out2.view, state)))
        << "out run to run";
    EXPECT_TRUE(bitwise_equal(download_raw(lse.view, state), download_raw(lse2.view, state)))
        << "lse run to run";
}

// The paged decode step (attention_decode_paged) against the CPU's: the rows' blocks scattered
// through the pool in a shuffled order, pool blocks no row holds NaN (a key read through a wrong
// table entry, or past a row's length, shows), block sizes that do and do not divide the lengths
// and the split-K tile (64 keys). The GPU runs the split-K kernel of the contiguous decode with
// only the key addresses taken through the table, so the bound is check_decode_rows': kBf16Sum
// for out (one bf16 rounding of an f32 value within 1e-5 of the reference), kF32Sum for lse.
struct PagedCase {
    int64_t H, Hkv, D, Bk, window;
    std::vector<int32_t> lengths;
};

void check_decode_paged(const PagedCase& c, uint64_t seed) {
    const int64_t B = int64_t(c.lengths.size()), H = c.H, Hkv = c.Hkv, D = c.D, Bk = c.Bk;
    const int64_t longest = *std::max_element(c.lengths.begin(), c.lengths.end());
    const int64_t M = (longest + Bk - 1) / Bk, row = Hkv * D;
    int64_t held = 0;
    for (int32_t n : c.lengths) held += (n + Bk - 1) / Bk;
    const int64_t N = held + 3;  // three blocks nobody holds
    SCOPED_TRACE(fmt::format("paged decode B={} H={} Hkv={} D={} Bk={} window={} M={} N={}", B, H,
                             Hkv, D, Bk, c.window, M, N));
    CudaState state(0);
    const Context gpu = state.context(), cpu = cpu_context();
    optest::Rng rng(seed);
    const float scale = 1.0f / std::sqrt(float(D));
    const HostTensor q = random_bf16_values(rng, {B, 1, H, D}, -2.0f, 2.0f);
    // Block ids handed out in a shuffled order (Fisher-Yates on the rng).
    std::vector<int32_t> ids(static_cast<size_t>(N));
    for (int64_t i = 0; i < N; ++i) ids[size_t(i)] = int32_t(i);
    for (int64_t i = N - 1; i > 0; --i) std::swap(ids[size_t(i)], ids[size_t(rng.integer(0, i))]);
    HostTensor tables(DType::kI32, {B, M});
    std::fill_n(tables.as<int32_t>(), B * M, 0);
    HostTensor kp(DType::kF32, {N, Bk, Hkv, D}), vp(DType::kF32, {N, Bk, Hkv, D});
    std::fill_n(kp.as<float>(), kp.numel(), NAN);
    std::fill_n(vp.as<float>(), vp.numel(), NAN);
    size_t next = 0;
    for (int64_t b = 0; b < B; ++b) {
        for (int64_t i = 0; i < (c.lengths[size_t(b)] + Bk - 1) / Bk; ++i)
            tables.as<int32_t>()[b * M + i] = ids[next++];
        for (int64_t j = 0; j < c.lengths[size_t(b)]; ++j) {
            const int64_t at = (tables.as<int32_t>()[b * M + j / Bk] * Bk + j % Bk) * row;
            for (int64_t e = 0; e < row; ++e) {
                kp.as<float>()[at + e] = rng.uniform(-2.0f, 2.0f);
                vp.as<float>()[at + e] = rng.uniform(-1.0f, 1.0f);
            }
        }
    }
    kp = round_to_bf16(kp);
    vp = round_to_bf16(vp);
    HostTensor lengths(DType::kI32, {B});
    std::copy(c.lengths.begin(), c.lengths.end(), lengths.as<int32_t>());

    HostTensor out_ref(DType::kF32, q.shape()), lse_ref(DType::kF32, {B, H, 1});
    attention_decode_paged(out_ref.view(), lse_ref.view(), q.view(), kp.view(), vp.view(),
                           tables.view(), lengths.view(), c.window, scale, cpu);
    DeviceTensor gq = upload(q, DType::kBF16, state), gk = upload(kp, DType::kBF16, state);
    DeviceTensor gv = upload(vp, DType::kBF16, state), glen = upload(lengths, DType::kI32, state);
    DeviceTensor gt = upload(tables, DType::kI32, state);
    DeviceTensor out = device_tensor(DType::kBF16, q.shape(), state);
    DeviceTensor lse = device_tensor(DType::kF32, {B, H, 1}, state);
    attention_decode_paged(out.view, lse.view, gq.view, gk.view, gv.view, gt.view, glen.view,
                           c.window, scale, gpu);
    const HostTensor out_got = download_f32(out.view, state);
    const HostTensor lse_got = download_f32(lse.view, state);
    for (int64_t b = 0; b < B; ++b) {
        SCOPED_TRACE(fmt::format("row {} of length {}", b, c.lengths[size_t(b)]));
        auto part = [](const HostTensor& t, int64_t b, int64_t n) {
            HostTensor r(DType::kF32, {n});
            std::copy_n(t.as<float>() + b * n, n, r.as<float>());
            return r;
        };
        EXPECT_TRUE(matches(part(out_got, b, H * D), part(out_ref, b, H * D), kBf16Sum)) << "out";
        EXPECT_TRUE(matches(part(lse_got, b, H), part(lse_ref, b, H), kF32Sum)) << "lse";
    }
}

TEST(CudaAttentionDecodePaged, Llama8BHeadsBlocksOf16MatchCpu) {
    check_decode_paged({32, 8, 128, 16, 0, {1, 15, 16, 17, 300, 1000, 4097}}, 120);
}

TEST(CudaAttentionDecodePaged, BlocksOf5AndOf64D64MatchCpu) {
    check_decode_paged({32, 8, 64, 5, 0, {1, 4, 5, 6, 77, 128, 2049}}, 121);
    check_decode_paged({4, 4, 64, 64, 0, {1, 63, 64, 65, 300}}, 122);
}

TEST(CudaAttentionDecodePaged, WindowMatchesCpu) {
    check_decode_paged({32, 8, 128, 32, 100, {1, 99, 100, 101, 1000}}, 123);
}

// The tensor-core kernel at the 70B shape's group of 8, and decode_split_kernel (D = 80) on the
// paged pools.
TEST(CudaAttentionDecodePaged, GroupOf8AndD80MatchCpu) {
    check_decode_paged({64, 8, 128, 16, 0, {1, 15, 16, 17, 3349}}, 125);
    check_decode_paged({8, 2, 80, 16, 0, {1, 15, 16, 17, 300, 1000}}, 126);
}

TEST(CudaAttentionDecodePaged, GroupOf16MatchCpu) {
    check_decode_paged({32, 2, 128, 16, 0, {1, 15, 16, 17, 3349}}, 127);
}

// kv_rows_scatter on the GPU writes the same bits as on the CPU (a copy), and kv_rows_gather
// reads them back; rows of 16-byte multiples (the vector path) and of 12 bytes (the byte path).
TEST(CudaKvRows, ScatterAndGatherEqualTheCpu) {
    CudaState state(0);
    const Context gpu = state.context(), cpu = cpu_context();
    optest::Rng rng(124);
    for (int64_t D : {int64_t(64), int64_t(3)}) {
        SCOPED_TRACE(fmt::format("D={}", D));
        const int64_t N = 4, Bk = 8, Hkv = 2;
        HostTensor pool = random_bf16_values(rng, {N, Bk, Hkv, D});
        const HostTensor rows = random_bf16_values(rng, {5, 1, Hkv, D});
        HostTensor slots(DType::kI32, {5});
        const int32_t s[5] = {31, 0, 9, 17, 8};
        std::copy_n(s, 5, slots.as<int32_t>());
        DeviceTensor gpool = upload(pool, DType::kBF16, state);
        DeviceTensor grows = upload(rows, DType::kBF16, state);
        DeviceTensor gslots = upload(slots, DType::kI32, state);
        kv_rows_scatter(pool.view(), rows.view(), slots.view(), cpu);
        kv_rows_scatter(gpool.view, grows.view, gslots.view, gpu);
        EXPECT_TRUE(bitwise_equal(download_f32(gpool.view, state), pool)) << "scatter";
        DeviceTensor back = device_tensor(DType::kBF16, rows.shape(), state);
        kv_rows_gather(back.view, gpool.view, gslots.view, gpu);
        EXPECT_TRUE(bitwise_equal(download_f32(back.view, state), rows)) << "gather";
    }
}

const std::vector<int32_t> kDecodeLengths = {1, 7, 128, 1000, 4097, 31000};

TEST(CudaAttentionDecode, SplitKLlama8BHeadsLengthsTo31000) {
    check_decode_rows({32, 8, 128, 0, kDecodeLengths}, 110);
}

TEST(CudaAttentionDecode, SplitKMultiHeadD64LengthsTo31000) {
    check_decode_rows({4, 4, 64, 0, kDecodeLengths}, 111);
}

// lo = p - 4095: the row of 4097 keys drops key 0, the row of 31000 reads 4096 of them.
TEST(CudaAttentionDecode, SplitKWindowLengthsTo31000) {
    check_decode_rows({32, 8, 128, 4096, kDecodeLengths}, 112);
}

// One long row: the most splits (the bench's batch-1 shape).
TEST(CudaAttentionDecode, SplitKOneRowOf31000Keys) {
    check_decode_rows({32, 8, 128, 0, {31000}}, 113);
}

// Two kernels take the split path: decode_mma_kernel (tensor cores) for D of 64 or 128 and at
// most 16 query heads a KV head, the cases above; decode_split_kernel otherwise: D = 80, and 32
// query heads a KV head.
TEST(CudaAttentionDecode, SplitKWithoutTensorCoresLengthsTo4097) {
    check_decode_rows({8, 2, 80, 0, {1, 7, 128, 1000, 4097}}, 115);
    check_decode_rows({32, 1, 64, 0, {1, 7, 17, 1000}}, 116);
}

// The 70B shape's group of 8 query heads a KV head (the mma's rows 8-15 zero), rows whose split
// leaves warps without keys (1, 7, 17 keys) and rows of one more key than a tile or a split.
TEST(CudaAttentionDecode, SplitKGroupOf8LengthsTo31000) {
    check_decode_rows({64, 8, 128, 0, {1, 7, 17, 64, 65, 129, 3349, 31000}}, 117);
}

// Groups of 12 and 16 query heads a KV head: the mma's rows 8-15 carry real queries (the A
// fragment's a1/a3, the C fragment's c2/c3 and the warps' merge of rows 8-15).
TEST(CudaAttentionDecode, SplitKGroupsOf12And16) {
    check_decode_rows({24, 2, 128, 0, {1, 7, 17, 129, 3349}}, 118);
    check_decode_rows({32, 2, 64, 0, {1, 7, 17, 129, 3349}}, 119);
}

// D % 8 != 0: no 16-byte rows, the one-block-per-(row, head) kernel runs the step.
TEST(CudaAttentionDecode, HeadDimNotAMultipleOf8) {
    check_decode_rows({4, 2, 36, 0, {1, 50, 300}}, 114);
}

// A length outside [1, Tmax] is a caller bug the kernel cannot report without a synchronization:
// that row's out and lse are NaN, the other rows are what the CPU computes for them.
void check_bad_lengths(const int64_t Tmax, uint64_t seed) {
    const int64_t B = 3, H = 4, Hkv = 2, D = 64;
    SCOPED_TRACE(fmt::format("Tmax={}", Tmax));
    CudaState state(0);
    const Context gpu = state.context(), cpu = cpu_context();
    optest::Rng rng(seed);
    const HostTensor q = random_bf16_values(rng, {B, 1, H, D});
    const HostTensor k = random_bf16_values(rng, {B, Tmax, Hkv, D});
    const HostTensor v = random_bf16_values(rng, {B, Tmax, Hkv, D});
    HostTensor lengths(DType::kI32, {B}), good(DType::kI32, {B});
    const int32_t bad[B] = {0, int32_t(Tmax - 1), int32_t(Tmax + 1)};
    for (int64_t b = 0; b < B; ++b) {
        lengths.as<int32_t>()[b] = bad[b];
        good.as<int32_t>()[b] = bad[1];
    }
    HostTensor out_ref(DType::kF32, q.shape()), lse_ref(DType::kF32, {B, H, 1});
    attention_decode(out_ref.view(), lse_ref.view(), q.view(), k.view(), v.view(), good.view(), 0,
                     0.125f, cpu);  // row 1's reference (rows 0 and 2 are replaced by NaN below)
    for (int64_t b : {0, 2}) {
        for (int64_t i = 0; i < H * D; ++i) out_ref.as<float>()[b * H * D + i] = NAN;
        for (int64_t i = 0; i < H; ++i) lse_ref.as<float>()[b * H + i] = NAN;
    }
    DeviceTensor gq = upload(q, DType::kBF16, state), gk = upload(k, DType::kBF16, state);
    DeviceTensor gv = upload(v, DType::kBF16, state), glen = upload(lengths, DType::kI32, state);
    DeviceTensor out = device_tensor(DType::kBF16, q.shape(), state);
    DeviceTensor lse = device_tensor(DType::kF32, {B, H, 1}, state);
    // Poisoned outputs are NaN already: fill them with zeros so that NaN means "written NaN".
    cuda_fill_bytes(out.view, 0, state.stream());
    cuda_fill_bytes(lse.view, 0, state.stream());
    attention_decode(out.view, lse.view, gq.view, gk.view, gv.view, glen.view, 0, 0.125f, gpu);
    EXPECT_TRUE(matches(download_f32(out.view, state), out_ref, kBf16Sum)) << "out";
    EXPECT_TRUE(matches(download_f32(lse.view, state), lse_ref, kF32Sum)) << "lse";
}

TEST(CudaAttentionDecode, LengthOutsideTheCacheGivesNaNRows) {
    check_bad_lengths(40, 100);
}

// Long enough that the good row has several splits: the merge skips the NaN rows.
TEST(CudaAttentionDecode, LengthOutsideTheCacheGivesNaNRowsSplitK) {
    check_bad_lengths(3000, 101);
}

// The training call through the offset form (q_offset 0, Tq == Tk) is the cuDNN graph: the same
// bits as the training form, and a graph in the cache.
TEST(CudaAttention, OffsetZeroFullLengthIsTheTrainingGraph) {
    if (skip_if_unavailable()) GTEST_SKIP();
    const Case c{2, 128, 4, 2, 64, 0, 0};
    CudaState state(0);
    const Context gpu = state.context();
    optest::Rng rng(101);
    DeviceTensor q =
        upload(random_bf16_values(rng, {c.B, c.T, c.H, c.D}, -2, 2), DType::kBF16, state);
    DeviceTensor k =
        upload(random_bf16_values(rng, {c.B, c.T, c.Hkv, c.D}, -2, 2), DType::kBF16, state);
    DeviceTensor v = upload(random_bf16_values(rng, {c.B, c.T, c.Hkv, c.D}), DType::kBF16, state);
    DeviceTensor out1 = device_tensor(DType::kBF16, q.view.shape(), state);
    DeviceTensor out2 = device_tensor(DType::kBF16, q.view.shape(), state);
    DeviceTensor lse1 = device_tensor(DType::kF32, {c.B, c.H, c.T}, state);
    DeviceTensor lse2 = device_tensor(DType::kF32, {c.B, c.H, c.T}, state);
    attention_forward(out1.view, lse1.view, q.view, k.view, v.view, ConstTensorView(), 0, 0.125f,
                      gpu);
    attention_forward(out2.view, lse2.view, q.view, k.view, v.view, ConstTensorView(), 0, 0.125f, 0,
                      gpu);
    EXPECT_TRUE(bitwise_equal(download_raw(out1.view, state), download_raw(out2.view, state)));
    EXPECT_TRUE(bitwise_equal(download_raw(lse1.view, state), download_raw(lse2.view, state)));
    EXPECT_EQ(cuda::attention_graph_count(state), 1u);
}

// The graph cache keeps its bound: prompt lengths that all differ (the inference pattern) build a
// graph each, the count never exceeds the limit, the least recently used go, and a shape whose
// graph was evicted is built again and still matches the CPU.
void run_forward_of_length(CudaState& state, int64_t T, HostTensor* got, HostTensor* ref) {
    const int64_t B = 1, H = 2, Hkv = 1, D = 64;
    optest::Rng rng(uint64_t(200 + T));
    const HostTensor q = random_bf16_values(rng, {B, T, H, D}, -2, 2);
    const HostTensor k = random_bf16_values(rng, {B, T, Hkv, D}, -2, 2);
    const HostTensor v = random_bf16_values(rng, {B, T, Hkv, D});
    DeviceTensor gq = upload(q, DType::kBF16, state), gk = upload(k, DType::kBF16, state);
    DeviceTensor gv = upload(v, DType::kBF16, state);
    DeviceTensor out = device_tensor(DType::kBF16, q.shape(), state);
    DeviceTensor lse = device_tensor(DType::kF32, {B, H, T}, state);
    attention_forward(out.view, lse.view, gq.view, gk.view, gv.view, ConstTensorView(), 0, 0.125f,
                      state.context());
    if (got != nullptr) {
        *got = download_f32(out.view, state);
        *ref = HostTensor(DType::kF32, q.shape());
        HostTensor ref_lse(DType::kF32, {B, H, T});
        attention_forward(ref->view(), ref_lse.view(), q.view(), k.view(), v.view(),
                          ConstTensorView(), 0, 0.125f, cpu_context());
    } else {
        state.synchronize();
    }
}

TEST(CudaAttention, GraphCacheKeepsItsBoundEvictingTheLeastRecentlyUsed) {
    if (skip_if_unavailable()) GTEST_SKIP();
    CudaState state(0);
    cuda::attention_limit_graphs(state, 4);
    for (int64_t i = 0; i < 10; ++i) {
        run_forward_of_length(state, 16 + 8 * i, nullptr, nullptr);
        EXPECT_EQ(cuda::attention_graph_count(state), size_t(std::min<int64_t>(i + 1, 4)));
    }
    EXPECT_EQ(cuda::attention_graph_evictions(state), 6u);
    // T = 16's graph went first; building it again evicts the next oldest, and it is still right.
    HostTensor got, ref;
    run_forward_of_length(state, 16, &got, &ref);
    EXPECT_EQ(cuda::attention_graph_count(state), 4u);
    EXPECT_EQ(cuda::attention_graph_evictions(state), 7u);
    EXPECT_TRUE(matches(got, ref, kBf16Derived));
    // A shape still cached (the newest of the loop) builds nothing.
    run_forward_of_length(state, 16 + 8 * 9, nullptr, nullptr);
    EXPECT_EQ(cuda::attention_graph_evictions(state), 7u);
}

TEST(CudaAttention, GraphCacheDefaultBound) {
    if (skip_if_unavailable()) GTEST_SKIP();
    CudaState state(0);
    const int64_t shapes = int64_t(cuda::kAttentionGraphLimit) + 3;
    for (int64_t i = 0; i < shapes; ++i) {
        run_forward_of_length(state, 8 + 8 * i, nullptr, nullptr);
        ASSERT_LE(cuda::attention_graph_count(state), cuda::kAttentionGraphLimit) << "shape " << i;
    }
    EXPECT_EQ(cuda::attention_graph_count(state), cuda::kAttentionGraphLimit);
    EXPECT_EQ(cuda::attention_graph_evictions(state), 3u);
}

class CudaAttentionDeathTest : public ::testing::Test {
protected:
    void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

TEST_F(CudaAttentionDeathTest, HeadDimBeyondCudnnStopsWithTheLimit) {
    if (skip_if_unavailable()) GTEST_SKIP();
    CudaState state(0);
    const Context gpu = state.context();
    DeviceTensor q = device_tensor(DType::kBF16, {1, 16, 2, 136}, state);
    DeviceTensor out = device_tensor(DType::kBF16, {1, 16, 2, 136}, state);
    DeviceTensor lse = device_tensor(DType::kF32, {1, 2, 16}, state);
    EXPECT_DEATH(attention_forward(out.view, lse.view, q.view, q.view, q.view, ConstTensorView(), 0,
                                   0.1f, gpu),
                 "attention_forward: head dim D = 136; cuDNN's flash attention takes D <= 128");
}

TEST_F(CudaAttentionDeathTest, CacheFormHeadDimBeyondTheKernelStopsWithTheLimit) {
    CudaState state(0);
    const Context gpu = state.context();
    DeviceTensor q = device_tensor(DType::kBF16, {1, 2, 2, 264}, state);
    DeviceTensor k = device_tensor(DType::kBF16, {1, 4, 1, 264}, state);
    DeviceTensor lse = device_tensor(DType::kF32, {1, 2, 2}, state);
    EXPECT_DEATH(attention_forward(q.view, lse.view, q.view, k.view, k.view, ConstTensorView(), 0,
                                   0.1f, 2, gpu),
                 "attention_forward_rows: head dim D = 264; this kernel takes D <= 256");
}

TEST_F(CudaAttentionDeathTest, WrongDtypeNamesTheTensor) {
    if (skip_if_unavailable()) GTEST_SKIP();
    CudaState state(0);
    const Context gpu = state.context();
    DeviceTensor q = device_tensor(DType::kF32, {1, 16, 2, 64}, state);
    DeviceTensor out = device_tensor(DType::kBF16, {1, 16, 2, 64}, state);
    DeviceTensor lse = device_tensor(DType::kF32, {1, 2, 16}, state);
    EXPECT_DEATH(attention_forward(out.view, lse.view, q.view, q.view, q.view, ConstTensorView(), 0,
                                   0.1f, gpu),
                 "attention_forward: the CUDA backend takes bf16 here");
}

// A build with cuDNN attention reports the cuDNN 9 it runs on; a build without it stops the op
// with what is missing. Either way the test runs (no skip to hide a build that lost cuDNN).
TEST_F(CudaAttentionDeathTest, BuildReportsCudnnOrStopsWithWhatIsMissing) {
    if (cuda::attention_unavailable_reason() == nullptr) {
        EXPECT_GE(cuda::attention_cudnn_version(), 90000) << "cuDNN attention needs cuDNN 9";
        return;
    }
    CudaState state(0);
    const Context gpu = state.context();
    DeviceTensor q = device_tensor(DType::kBF16, {1, 16, 2, 64}, state);
    DeviceTensor lse = device_tensor(DType::kF32, {1, 2, 16}, state);
    EXPECT_DEATH(attention_forward(q.view, lse.view, q.view, q.view, q.view, ConstTensorView(), 0,
                                   0.1f, gpu),
                 "attention_forward: this build has no CUDA attention");
}

}  // namespace
}  // namespace lathe
