// clang-format off
#include "ops/cuda/nvcc_compat.h"  // first: before any header that includes fmt
// clang-format on

// Times each CUDA op at the two training shapes (GPT-2 124M at B=32, T=1024; the
// Llama-3.2-1B shape at B=8, T=2048) against its floor: the fewest bytes it must move over the
// measured copy bandwidth, or its matmul FLOPs over the measured bf16 GEMM rate, whichever is
// larger (METHOD.md, "two numbers first"). A CMake target (LATHE_CUDA_OPS_BENCH);
// scripts/gpu-check.sh OUT opsbench runs it from the bundle.
//
//   cuda_ops_bench [--copy-gbps 3000] [--gemm-tflops 780] [--only SUBSTRING]
//
// --only times just the ops whose name contains one of the comma-separated substrings (e.g.
// "norm_backward,column_sum"). The decode rows ("decode_linear": the skinny GEMM of
// ops/cuda/gemv.h against cuBLASLt at the Llama-3-8B decode projections, M = 1..16 rows) follow
// the decode attention.
//
// Inputs are pseudo-random (never zeros), each op is warmed up 3 times, then timed 20 times with
// CUDA events; the median is printed. The ceilings default to the H100 numbers in DESIGN.md.
// Prints one Markdown table row per op.

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "ops/adamw.h"
#include "ops/attention.h"
#include "ops/cuda/column_reduce.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/cuda_state.h"
#include "ops/cuda/fp8_blockwise.h"
#include "ops/cuda/fp8_cast.h"
#include "ops/cuda/fp8_linear.h"
#include "ops/cuda/gemv.h"
#include "ops/cuda/lm_head_cross_entropy.h"
#include "ops/embedding.h"
#include "ops/gelu.h"
#include "ops/grad_norm.h"
#include "ops/layernorm.h"
#include "ops/linear.h"
#include "ops/lm_head_cross_entropy.h"
#include "ops/residual.h"
#include "ops/rmsnorm.h"
#include "ops/rope.h"
#include "ops/swiglu.h"

namespace lathe {
namespace {

__device__ uint32_t mix(uint64_t i, uint32_t seed) {
    uint64_t z = i * 0x9E3779B97F4A7C15ull + seed;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return uint32_t(z >> 32);
}

__global__ void fill_kernel(void* p, int64_t n, int dtype, float scale, uint32_t seed,
                            int32_t modulo) {
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += int64_t(gridDim.x) * blockDim.x) {
        const uint32_t r = mix(uint64_t(i), seed);
        const float u = (float(r) / 4294967296.0f * 2.0f - 1.0f) * scale;
        if (dtype == int(DType::kF32))
            static_cast<float*>(p)[i] = u;
        else if (dtype == int(DType::kBF16))
            static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(u);
        else
            static_cast<int32_t*>(p)[i] = int32_t(r % uint32_t(modulo));
    }
}

struct Bench {
    CudaState state{0};
    Context ctx = state.context();
    std::vector<DeviceBuffer> buffers;
    uint32_t seed = 1;
    double copy_bytes_per_s = 3.0e12;
    double gemm_flops_per_s = 780e12;
    std::vector<std::string> only;  // time only ops whose name contains one of these

    // A device tensor filled with uniform values in [-scale, scale) (ids: in [0, modulo)).
    TensorView tensor(DType dtype, Shape shape, float scale = 1.0f, int32_t modulo = 1) {
        buffers.emplace_back(std::max<size_t>(1, size_t(shape.numel()) * dtype_size(dtype)));
        TensorView v = buffers.back().view(dtype, shape);
        fill_kernel<<<1024, 256, 0, state.stream()>>>(v.data(), v.numel(), int(dtype), scale,
                                                      seed++, modulo);
        LATHE_CUDA_CHECK_LAUNCH();
        return v;
    }

    void release() {
        state.synchronize();
        buffers.clear();
    }

    // Median milliseconds of `fn` over 20 runs after 3 warm-ups; prints a table row and returns
    // the median (0 when --only leaves the op out).
    double time(const std::string& name, const std::string& shape, double bytes, double flops,
                const std::function<void()>& fn) {
        if (!only.empty() && std::none_of(only.begin(), only.end(), [&](const std::string& o) {
                return name.find(o) != std::string::npos;
            }))
            return 0;
        for (int i = 0; i < 3; ++i) fn();
        cudaEvent_t start, stop;
        LATHE_CUDA_CHECK(cudaEventCreate(&start));
        LATHE_CUDA_CHECK(cudaEventCreate(&stop));
        std::vector<float> ms;
        for (int i = 0; i < 20; ++i) {
            LATHE_CUDA_CHECK(cudaEventRecord(start, state.stream()));
            fn();
            LATHE_CUDA_CHECK(cudaEventRecord(stop, state.stream()));
            LATHE_CUDA_CHECK(cudaEventSynchronize(stop));
            float t = 0;
            LATHE_CUDA_CHECK(cudaEventElapsedTime(&t, start, stop));
            ms.push_back(t);
        }
        LATHE_CUDA_CHECK(cudaEventDestroy(start));
        LATHE_CUDA_CHECK(cudaEventDestroy(stop));
        std::sort(ms.begin(), ms.end());
        const double median = ms[ms.size() / 2];
        const double floor_ms = std::max(bytes / copy_bytes_per_s, flops / gemm_flops_per_s) * 1e3;
        std::printf("| %-34s | %-26s | %9.3f | %9.3f | %5.2f | %8.0f | %7.1f |\n", name.c_str(),
                    shape.c_str(), median, floor_ms, median / floor_ms,
                    bytes / (median * 1e-3) / 1e9, flops / (median * 1e-3) / 1e12);
        std::fflush(stdout);
        return median;
    }
};

// Token ids for the embedding rows: uniform over [0, V), or text-like (log-uniform: id =
// floor(V^u) - 1, so id 0 takes about 1/ln(V) of the rows and most ids are rare), made on the host
// with a fixed seed; *touched gets the number of distinct ids (the table rows the backward writes).
TensorView embedding_ids(Bench& b, Shape shape, int64_t V, bool text_like, int64_t* touched) {
    std::vector<int32_t> ids(size_t(shape.numel()));
    std::vector<char> seen(size_t(V), 0);
    uint64_t x = 0x243F6A8885A308D3ull;
    *touched = 0;
    for (int32_t& id : ids) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        const double u = double(x >> 11) / 9007199254740992.0;  // [0, 1)
        const int64_t v =
            text_like ? int64_t(std::floor(std::pow(double(V), u))) - 1 : int64_t(u * double(V));
        id = int32_t(std::clamp<int64_t>(v, 0, V - 1));
        if (!seen[size_t(id)]) seen[size_t(id)] = 1, ++*touched;
    }
    TensorView t = b.tensor(DType::kI32, shape);
    LATHE_CUDA_CHECK(cudaMemcpyAsync(t.data(), ids.data(), ids.size() * sizeof(int32_t),
                                     cudaMemcpyHostToDevice, b.state.stream()));
    b.state.synchronize();  // `ids` goes out of scope
    return t;
}

// The deterministic column sum behind every linear bias gradient (column_reduce.h, both passes):
// db (C) f32 += sum over N rows of dy (N, C) bf16. Floor: reading dy once.
void column_sum(Bench& b, int64_t N, int64_t C) {
    auto dy = b.tensor(DType::kBF16, {N, C}), db = b.tensor(DType::kF32, {C});
    b.time("column_sum (linear dbias)", "N=" + std::to_string(N) + " C=" + std::to_string(C),
           2.0 * N * C, 0, [&] {
               cuda::column_sum_bf16_accumulate(static_cast<float*>(db.data()),
                                                static_cast<const bf16*>(dy.data()), N, C,
                                                "column_sum", b.state, b.state.stream());
           });
    b.release();
}

// The LM head + cross-entropy at a training shape, with the memory plan's chunk (512 MiB of f32
// rows, kLmHeadChunkBytesCuda; the op runs twice as many bf16 rows in it), and its row kernel
// alone on one full chunk of bf16 logits: each logit read once and its dlogit written once
// (4 bytes per element), the number to hold against the copy bandwidth.
void lm_head(Bench& b, int64_t N, int64_t C, int64_t V) {
    const int64_t Nc = std::min<int64_t>(N, (int64_t(512) << 20) / (4 * V));
    const std::string s =
        "N=" + std::to_string(N) + " C=" + std::to_string(C) + " V=" + std::to_string(V);
    auto x = b.tensor(DType::kBF16, {N, C}), w = b.tensor(DType::kBF16, {V, C}, 0.05f);
    auto targets = b.tensor(DType::kI32, {N}, 1.0f, int32_t(V));
    auto scratch = b.tensor(DType::kF32, {Nc, V});
    auto loss = b.tensor(DType::kF32, {1}), dx = b.tensor(DType::kBF16, {N, C});
    auto dw = b.tensor(DType::kF32, {V, C});
    b.time("lm_head_ce forward_backward", s, 2.0 * (2 * N * C + V * C) + 4.0 * V * C * 2,
           3 * 2.0 * N * C * V, [&] {
               lm_head_cross_entropy_forward_backward(loss, TensorView(), dx, dw, x, targets, w,
                                                      1.0f, scratch, b.ctx);
           });
    // The row kernel on one chunk: R = 2 Nc bf16 rows of V (V % 8 == 0 here, so no padding).
    const int64_t R = std::min<int64_t>(N, 2 * Nc);
    auto logits = b.tensor(DType::kBF16, {R, V}, 8.0f);
    auto lse = b.tensor(DType::kF32, {R}), losses = b.tensor(DType::kF32, {R});
    auto count = b.tensor(DType::kI32, {1});
    const int32_t rows = int32_t(R);
    LATHE_CUDA_CHECK(cudaMemcpyAsync(count.data(), &rows, sizeof(rows), cudaMemcpyHostToDevice,
                                     b.state.stream()));
    // After the first run the chunk holds dlogits, which serve as the next run's logits: the
    // held-row kernel's time does not depend on the values.
    const std::string rs = "R=" + std::to_string(R) + " V=" + std::to_string(V);
    b.time("lm_head ce row kernel (fwd+bwd)", rs, 4.0 * R * V, 0, [&] {
        cuda::cross_entropy_rows_forward_backward(
            logits.as<bf16>(), losses.as<float>(), lse.as<float>(), targets.as<int32_t>(),
            count.as<int32_t>(), 1.0f, R, V, V, b.state.stream());
    });
    b.release();
}

// The decode step's attention (attention_decode: the split-K path of ops/cuda/attention_rows.cu)
// at the Llama-3-8B heads (H 32, Hkv 8, D 128), every row of length L in a cache of L positions.
// Floor: reading each row's K and V once (q and out are B x H x D, counted too).
void decode_attention(Bench& b, int64_t B, int64_t L) {
    const int64_t H = 32, Hkv = 8, D = 128;
    auto q = b.tensor(DType::kBF16, {B, 1, H, D}), out = b.tensor(DType::kBF16, {B, 1, H, D});
    auto k = b.tensor(DType::kBF16, {B, L, Hkv, D}), v = b.tensor(DType::kBF16, {B, L, Hkv, D});
    auto lse = b.tensor(DType::kF32, {B, H, 1}), lengths = b.tensor(DType::kI32, {B});
    const std::vector<int32_t> len(static_cast<size_t>(B), static_cast<int32_t>(L));
    LATHE_CUDA_CHECK(cudaMemcpyAsync(lengths.data(), len.data(), len.size() * sizeof(int32_t),
                                     cudaMemcpyHostToDevice, b.state.stream()));
    b.state.synchronize();  // `len` goes out of scope
    const double bytes = 2.0 * (2 * B * L * Hkv * D + 2 * B * H * D);
    const std::string s = "B=" + std::to_string(B) + " L=" + std::to_string(L) + " H=32/8 D=128";
    b.time("attention_decode", s, bytes, 4.0 * B * L * H * D, [&] {
        attention_decode(out, lse, q, k, v, lengths, 0, 1.0f / std::sqrt(float(D)), b.ctx);
    });
    b.release();
}

// The decode step's projections at the Llama-3-8B shapes (hidden 4096, q + k + v 6144, FFN
// 14336, vocabulary 128256) for M = 1..16 rows (the batch): the skinny GEMM of ops/cuda/gemv.h
// against cuBLASLt (linear_forward), both bf16 without bias. Each timed run goes through enough
// copies of the weight (distinct buffers, at least 256 MiB in all) that every call reads its
// weight from memory, not from the 50 MiB L2, as a decode step does; the shape column names the
// copies. Floor: the weights', x's and y's bytes. `cuda_ops_bench --only decode_linear`.
void decode_linears(Bench& b) {
    struct Lin {
        const char* name;
        int64_t K, N;
    };
    const Lin lins[] = {{"qkv", 4096, 6144},
                        {"attn_out", 4096, 4096},
                        {"gate_up", 4096, 2 * 14336},
                        {"down", 14336, 4096},
                        {"lm_head", 4096, 128256}};
    const std::string gemv = "decode_linear gemv", lt = "decode_linear cublaslt";
    if (!b.only.empty() && std::none_of(b.only.begin(), b.only.end(), [&](const std::string& o) {
            return gemv.find(o) != std::string::npos || lt.find(o) != std::string::npos;
        }))
        return;
    for (const Lin& l : lins) {
        const int64_t K = l.K, N = l.N, wbytes = 2 * K * N;
        const int64_t copies = std::max<int64_t>(1, ((int64_t(256) << 20) + wbytes - 1) / wbytes);
        std::vector<TensorView> w;
        for (int64_t i = 0; i < copies; ++i) w.push_back(b.tensor(DType::kBF16, {N, K}, 0.05f));
        auto x = b.tensor(DType::kBF16, {cuda::kGemvMaxRows, K});
        auto y = b.tensor(DType::kBF16, {cuda::kGemvMaxRows, N});
        for (int64_t M : {1, 2, 4, 8, 16}) {
            const TensorView xm = x.slice(0, M), ym = y.slice(0, M);
            const std::string shape = "M=" + std::to_string(M) + " " + std::to_string(K) + "->" +
                                      std::to_string(N) + " x" + std::to_string(copies);
            const double bytes = double(copies) * (wbytes + 2.0 * M * (K + N));
            const double flops = double(copies) * 2.0 * M * K * N;
            const double t_gemv = b.time(gemv + " " + l.name, shape, bytes, flops, [&] {
                for (const TensorView& wi : w)
                    cuda::gemv_forward(ym.as<bf16>(), xm.as<bf16>(), wi.as<bf16>(), nullptr,
                                       nullptr, M, K, N, b.state.stream());
            });
            const double t_lt = b.time(lt + " " + l.name, shape, bytes, flops, [&] {
                for (const TensorView& wi : w) linear_forward(ym, xm, wi, ConstTensorView(), b.ctx);
            });
            if (t_gemv > 0 && t_lt > 0)
                std::printf("| %-34s | %-26s | %9s | %9s | %5.2f | %8s | %7s |\n",
                            ("decode_linear " + std::string(l.name) + " cublaslt/gemv").c_str(),
                            shape.c_str(), "", "", t_lt / t_gemv, "", "");
        }
        b.release();
    }
}

void gpt2(Bench& b) {
    const int64_t B = 32, T = 1024, N = B * T, C = 768, V = 50257, F = 4 * C, P = 1024;
    const std::string s = "N=32768 C=768";
    column_sum(b, N, C);
    column_sum(b, N, 3 * C);
    column_sum(b, N, F);
    {
        auto x = b.tensor(DType::kBF16, {N, C}), w = b.tensor(DType::kBF16, {3 * C, C}, 0.05f);
        auto bias = b.tensor(DType::kBF16, {3 * C}), y = b.tensor(DType::kBF16, {N, 3 * C});
        auto dy = b.tensor(DType::kBF16, {N, 3 * C}), dx = b.tensor(DType::kBF16, {N, C});
        auto dw = b.tensor(DType::kF32, {3 * C, C}), db = b.tensor(DType::kF32, {3 * C});
        const double f = 2.0 * N * C * 3 * C;
        b.time("linear_forward (qkv, bias)", "N=32768 768->2304", 2.0 * (N * C + N * 3 * C), f,
               [&] { linear_forward(y, x, w, bias, b.ctx); });
        b.time("linear_backward (dx, dW, db)", "N=32768 768->2304", 2.0 * (2 * N * C + N * 3 * C),
               2 * f, [&] { linear_backward(dx, dw, db, dy, x, w, GradMode::kOverwrite, b.ctx); });
        b.release();
    }
    {
        auto x = b.tensor(DType::kBF16, {N, C}), y = b.tensor(DType::kBF16, {N, C});
        auto w = b.tensor(DType::kBF16, {C}), bias = b.tensor(DType::kBF16, {C});
        auto mean = b.tensor(DType::kF32, {N}), rstd = b.tensor(DType::kF32, {N});
        auto dy = b.tensor(DType::kBF16, {N, C}), dx = b.tensor(DType::kBF16, {N, C});
        auto dw = b.tensor(DType::kF32, {C}), db = b.tensor(DType::kF32, {C});
        b.time("layernorm_forward", s, 2.0 * 2 * N * C, 0,
               [&] { layernorm_forward(y, mean, rstd, x, w, bias, 1e-5f, b.ctx); });
        // dx accumulates (the residual stream's gradient): x, dy, dx read, dx written.
        b.time("layernorm_backward (dx +=, dw, db)", s, 2.0 * 4 * N * C, 0, [&] {
            layernorm_backward(dx, dw, db, dy, x, w, mean, rstd, GradMode::kAccumulate, b.ctx);
        });
        auto out = b.tensor(DType::kBF16, {N, C});
        b.time("residual_forward", s, 2.0 * 3 * N * C, 0,
               [&] { residual_forward(out, x, y, b.ctx); });
        b.release();
    }
    {
        auto x = b.tensor(DType::kBF16, {N, F}, 3.0f), y = b.tensor(DType::kBF16, {N, F});
        auto dy = b.tensor(DType::kBF16, {N, F}), dx = b.tensor(DType::kBF16, {N, F});
        b.time("gelu_forward (tanh)", "N=32768 F=3072", 2.0 * 2 * N * F, 0,
               [&] { gelu_forward(y, x, GeluKind::kTanh, b.ctx); });
        b.time("gelu_backward (tanh)", "N=32768 F=3072", 2.0 * 3 * N * F, 0,
               [&] { gelu_backward(dx, dy, x, GeluKind::kTanh, b.ctx); });
        b.release();
    }
    {
        // The embedding at the padded vocabulary (50304, as GPT-2 trains); ids uniform (24k of the
        // 50304 rows touched) and text-like (log-uniform, a few ids repeated thousands of times).
        const int64_t Ve = 50304;
        int64_t touched = 0;
        auto tokens = embedding_ids(b, {B, T}, Ve, false, &touched);
        auto wte = b.tensor(DType::kBF16, {Ve, C}), wpe = b.tensor(DType::kBF16, {P, C});
        auto out = b.tensor(DType::kBF16, {B, T, C}), dout = b.tensor(DType::kBF16, {B, T, C});
        auto dwte = b.tensor(DType::kF32, {Ve, C}), dwpe = b.tensor(DType::kF32, {P, C});
        // Floor: one wte row per token, wpe once (it stays in L2), out written.
        b.time("embedding_forward (wte + wpe)", s, 2.0 * (2 * N * C + P * C), 0,
               [&] { embedding_forward(out, tokens, ConstTensorView(), wte, wpe, b.ctx); });
        // Floor: dout read once, each touched dwte/dwpe row read and written once (f32).
        b.time("embedding_backward (dwte, dwpe)", s + " V=50304",
               2.0 * N * C + 8.0 * double(touched + P) * C, 0,
               [&] { embedding_backward(dwte, dwpe, dout, tokens, ConstTensorView(), b.ctx); });
        auto zipf = embedding_ids(b, {B, T}, Ve, true, &touched);
        b.time("embedding_backward (text-like ids)", s + " V=50304",
               2.0 * N * C + 8.0 * double(touched + P) * C, 0,
               [&] { embedding_backward(dwte, dwpe, dout, zipf, ConstTensorView(), b.ctx); });
        b.release();
    }
    lm_head(b, N, C, (V + 127) / 128 * 128);  // the vocabulary padded as trained: 50304
    {
        const int64_t params = 124439808;
        auto p = b.tensor(DType::kF32, {params}), m = b.tensor(DType::kF32, {params});
        auto v = b.tensor(DType::kF32, {params}, 0.01f), g = b.tensor(DType::kF32, {params});
        auto norm = b.tensor(DType::kF32, {1});
        const ConstTensorView gs[] = {g};
        const TensorView gm[] = {g};
        b.time("grad_norm_l2", "124.4M f32", 4.0 * params, 0,
               [&] { grad_norm_l2(norm, gs, b.ctx); });
        // Clip alone, against a fixed norm far above max_norm: a clip after a real norm would
        // leave norm + 1e-6 == max_norm and turn every later repetition into a no-op.
        auto big_norm = b.tensor(DType::kF32, {1});
        const float big = 1e6f;
        LATHE_CUDA_CHECK(cudaMemcpyAsync(big_norm.data(), &big, sizeof(big), cudaMemcpyHostToDevice,
                                         b.state.stream()));
        b.time("grad_clip_by_norm (coef 0.5)", "124.4M f32", 4.0 * params * 2, 0,
               [&] { grad_clip_by_norm(gm, big_norm, 0.5e6f, b.ctx); });
        const AdamWSegment seg[] = {{0, params, 6e-4, 0.1}};
        int64_t step = 0;
        b.time("adamw_update", "124.4M f32", 4.0 * params * 7, 0,
               [&] { adamw_update(p, m, v, g, seg, AdamWHyper{}, ++step, b.ctx); });
        b.release();
    }
}

void llama1b(Bench& b) {
    const int64_t B = 8, T = 2048, N = B * T, C = 2048, F = 8192, H = 32, Hkv = 8, D = 64;
    const std::string s = "N=16384 C=2048";
    column_sum(b, N, C);
    {
        // Llama 3's vocabulary, no learned positions: dwte only.
        const int64_t V = 128256;
        int64_t touched = 0, touched_text = 0;
        auto tokens = embedding_ids(b, {B, T}, V, false, &touched);
        auto text = embedding_ids(b, {B, T}, V, true, &touched_text);
        auto dout = b.tensor(DType::kBF16, {B, T, C}), dwte = b.tensor(DType::kF32, {V, C});
        b.time("embedding_backward (dwte)", s + " V=128256", 2.0 * N * C + 8.0 * touched * C, 0,
               [&] {
                   embedding_backward(dwte, TensorView(), dout, tokens, ConstTensorView(), b.ctx);
               });
        b.time("embedding_backward (text-like ids)", s + " V=128256",
               2.0 * N * C + 8.0 * touched_text * C, 0, [&] {
                   embedding_backward(dwte, TensorView(), dout, text, ConstTensorView(), b.ctx);
               });
        b.release();
    }
    {
        auto x = b.tensor(DType::kBF16, {N, C}), y = b.tensor(DType::kBF16, {N, C});
        auto w = b.tensor(DType::kBF16, {C}), rstd = b.tensor(DType::kF32, {N});
        auto dy = b.tensor(DType::kBF16, {N, C}), dx = b.tensor(DType::kBF16, {N, C});
        auto dw = b.tensor(DType::kF32, {C});
        b.time("rmsnorm_forward", s, 2.0 * 2 * N * C, 0,
               [&] { rmsnorm_forward(y, rstd, x, w, 1e-5f, b.ctx); });
        b.time("rmsnorm_backward (dx +=, dw)", s, 2.0 * 4 * N * C, 0,
               [&] { rmsnorm_backward(dx, dw, dy, x, w, rstd, GradMode::kAccumulate, b.ctx); });
        b.release();
    }
    {
        auto x = b.tensor(DType::kBF16, {N, C}), w = b.tensor(DType::kBF16, {2 * F, C}, 0.05f);
        auto y = b.tensor(DType::kBF16, {N, 2 * F});
        b.time("linear_forward (gate_up)", "N=16384 2048->16384", 2.0 * (N * C + N * 2 * F),
               2.0 * N * C * 2 * F, [&] { linear_forward(y, x, w, ConstTensorView(), b.ctx); });
        auto out = b.tensor(DType::kBF16, {N, F}), dgu = b.tensor(DType::kBF16, {N, 2 * F});
        b.time("swiglu_forward", "N=16384 F=8192", 2.0 * 3 * N * F, 0,
               [&] { swiglu_forward(out, y, b.ctx); });
        b.time("swiglu_backward", "N=16384 F=8192", 2.0 * 5 * N * F, 0,
               [&] { swiglu_backward(dgu, out, y, b.ctx); });
        b.release();
    }
    {
        const int64_t P = 4096;
        auto q = b.tensor(DType::kBF16, {B, T, H, D});
        auto cos = b.tensor(DType::kF32, {P, D / 2}), sin = b.tensor(DType::kF32, {P, D / 2});
        b.time("rope_forward (q, in place)", "B=8 T=2048 H=32 D=64", 2.0 * 2 * N * H * D, 0,
               [&] { rope_forward(q, q, ConstTensorView(), cos, sin, b.ctx); });
        auto k = b.tensor(DType::kBF16, {B, T, Hkv, D});
        b.time("rope_backward (k, in place)", "B=8 T=2048 Hkv=8 D=64", 2.0 * 2 * N * Hkv * D, 0,
               [&] { rope_backward(k, k, ConstTensorView(), cos, sin, b.ctx); });
        b.release();
    }
    lm_head(b, N, C, 128256);
}

// The linears of one block in BF16 and in FP8 (per-tensor current scaling, E4M3 activations and
// weights, E5M2 gradients), per GEMM: BF16 is linear_forward / linear_backward; FP8 is what a
// micro-batch pays: the activation's amax pass and cast (+ transpose for the weight gradient),
// the forward GEMM; the gradient's amax pass and cast (+ transpose), the input- and weight-
// gradient GEMMs. The weight's casts (q and the transposed copy) happen once per optimizer step
// and are timed on their own row ("per step"). Rows "layer linears" sum the four linears.
// "fp8b" rows are the blockwise recipe (ops/fp8_blockwise.h: E4M3 everywhere, 1 x 128 blocks of x
// and dy and of their transposes, 128 x 128 of W), the same steps: its casts write q, qt and the
// block scales in one read, re-laid out for cuBLASLt's block-scaled GEMMs.
void fp8_linears(Bench& b, const char* model, int64_t N, int64_t C, int64_t Q, int64_t F) {
    struct Lin {
        const char* name;
        int64_t I, O;
    };
    const Lin lins[] = {{"qkv", C, Q}, {"attn_out", C, C}, {"gate_up", C, 2 * F}, {"down", F, C}};
    double bf16_total = 0, fp8_total = 0, fp8b_total = 0;
    auto timed = [&](const std::string& name, const std::string& shape, double bytes, double flops,
                     const std::function<void()>& fn) {
        // Median of 20 after 3 warm-ups, like Bench::time, and returned for the totals.
        for (int i = 0; i < 3; ++i) fn();
        cudaEvent_t start, stop;
        LATHE_CUDA_CHECK(cudaEventCreate(&start));
        LATHE_CUDA_CHECK(cudaEventCreate(&stop));
        std::vector<float> ms;
        for (int i = 0; i < 20; ++i) {
            LATHE_CUDA_CHECK(cudaEventRecord(start, b.state.stream()));
            fn();
            LATHE_CUDA_CHECK(cudaEventRecord(stop, b.state.stream()));
            LATHE_CUDA_CHECK(cudaEventSynchronize(stop));
            float t = 0;
            LATHE_CUDA_CHECK(cudaEventElapsedTime(&t, start, stop));
            ms.push_back(t);
        }
        LATHE_CUDA_CHECK(cudaEventDestroy(start));
        LATHE_CUDA_CHECK(cudaEventDestroy(stop));
        std::sort(ms.begin(), ms.end());
        const double median = ms[ms.size() / 2];
        std::printf("| %-34s | %-26s | %9.3f | %9s | %5s | %8.0f | %7.1f |\n", name.c_str(),
                    shape.c_str(), median, "", "", bytes / (median * 1e-3) / 1e9,
                    flops / (median * 1e-3) / 1e12);
        std::fflush(stdout);
        return median;
    };
    if (!b.only.empty() && std::none_of(b.only.begin(), b.only.end(), [](const std::string& o) {
            return std::string("fp8").find(o) != std::string::npos;
        }))
        return;
    for (const Lin& l : lins) {
        const int64_t I = l.I, O = l.O;
        const std::string shape = std::string(model) + " N=" + std::to_string(N) + " " +
                                  std::to_string(I) + "->" + std::to_string(O);
        auto x = b.tensor(DType::kBF16, {N, I}), w = b.tensor(DType::kBF16, {O, I}, 0.05f);
        auto y = b.tensor(DType::kBF16, {N, O}), dy = b.tensor(DType::kBF16, {N, O}, 1e-3f);
        auto dx = b.tensor(DType::kBF16, {N, I}), dw = b.tensor(DType::kF32, {O, I});
        const double flops = 2.0 * N * I * O;
        bf16_total += timed(std::string("bf16 ") + l.name + " forward", shape, 0, flops,
                            [&] { linear_forward(y, x, w, ConstTensorView(), b.ctx); });
        bf16_total += timed(std::string("bf16 ") + l.name + " backward", shape, 0, 2 * flops, [&] {
            linear_backward(dx, dw, TensorView(), dy, x, w, GradMode::kOverwrite, b.ctx);
        });
        // FP8 operands: codes and transposed codes (written by the casts before any read), and
        // scalars at 16-byte aligned slots.
        auto bytes = [&](int64_t r, int64_t c) {
            b.buffers.emplace_back(size_t(r * c));
            return b.buffers.back().view(DType::kU8, {r, c});
        };
        auto xq = bytes(N, I), xqt = bytes(I, N), wq = bytes(O, I), wqt = bytes(I, O);
        auto dyq = bytes(N, O), dyqt = bytes(O, N);
        auto sc = b.tensor(DType::kF32, {64});
        float* f = static_cast<float*>(sc.data());
        auto cast = [&](TensorView src, int64_t r, int64_t c, DType t, void* q, void* qt,
                        int slot) {
            Fp8CastArgs a;
            a.rows = r;
            a.cols = c;
            a.x = static_cast<const bf16*>(src.data());
            a.dtype = t;
            a.q = q;
            a.qt = qt;
            a.amax = f + slot * 8;
            a.scale_inv = f + slot * 8 + 4;
            cuda::fp8_cast(a, b.state.stream());
        };
        timed(std::string("fp8 ") + l.name + " weight casts (per step)", shape, 2.0 * O * I * 2, 0,
              [&] { cast(w, O, I, DType::kE4M3, wq.data(), wqt.data(), 1); });
        const cuda::Fp8Operand ox{xq.data(), DType::kE4M3, f + 4},
            oxt{xqt.data(), DType::kE4M3, f + 4}, ow{wq.data(), DType::kE4M3, f + 12},
            owt{wqt.data(), DType::kE4M3, f + 12}, ody{dyq.data(), DType::kE5M2, f + 20},
            odyt{dyqt.data(), DType::kE5M2, f + 20};
        fp8_total +=
            timed(std::string("fp8 ") + l.name + " forward (+ x casts)", shape, 2.0 * N * I * 2,
                  flops, [&] {
                      cast(x, N, I, DType::kE4M3, xq.data(), xqt.data(), 0);
                      cuda::fp8_linear_forward(static_cast<bf16*>(y.data()), ox, ow, nullptr,
                                               nullptr, N, I, O, b.state, b.state.stream());
                  });
        fp8_total +=
            timed(std::string("fp8 ") + l.name + " backward (+ dy casts)", shape, 2.0 * N * O * 2,
                  2 * flops, [&] {
                      cast(dy, N, O, DType::kE5M2, dyq.data(), dyqt.data(), 2);
                      cuda::fp8_linear_backward_input(static_cast<bf16*>(dx.data()), ody, owt, N, I,
                                                      O, false, b.state, b.state.stream());
                      cuda::fp8_linear_backward_weight(static_cast<float*>(dw.data()), odyt, oxt, N,
                                                       I, O, true, b.state, b.state.stream());
                  });
        timed(std::string("fp8 ") + l.name + " forward GEMM alone", shape, 0, flops, [&] {
            cuda::fp8_linear_forward(static_cast<bf16*>(y.data()), ox, ow, nullptr, nullptr, N, I,
                                     O, b.state, b.state.stream());
        });
        timed(std::string("fp8 ") + l.name + " x amax + cast + transpose", shape, 2.0 * N * I * 2,
              0, [&] { cast(x, N, I, DType::kE4M3, xq.data(), xqt.data(), 0); });
        // The same cast with the amax from x's producer (the norm or SwiGLU that wrote x,
        // LinearSpec::x_amax): one read of x (2 bytes an element) and q, qt written (1 each); the
        // slot holds the amax of the run above.
        timed(std::string("fp8 ") + l.name + " x cast + transpose (producer amax)", shape,
              4.0 * N * I, 0, [&] {
                  Fp8CastArgs a;
                  a.rows = N;
                  a.cols = I;
                  a.x = static_cast<const bf16*>(x.data());
                  a.q = xq.data();
                  a.qt = xqt.data();
                  a.amax = f;
                  a.amax_ready = true;
                  a.scale_inv = f + 4;
                  cuda::fp8_cast(a, b.state.stream());
              });
        // Blockwise: the linear's buffers carved from one allocation, 256-byte aligned.
        const Fp8BlockwiseBufferBytes bb = fp8_blockwise_buffer_bytes(N, I, O);
        b.buffers.emplace_back(bb.total());
        auto* at = static_cast<unsigned char*>(b.buffers.back().data());
        auto take = [&](size_t n) {
            void* p = at;
            at += (n + 255) / 256 * 256;
            return p;
        };
        Fp8BlockwiseBuffers fb;
        fb.wq = take(bb.wq);
        fb.wqt = take(bb.wqt);
        fb.w_scale = static_cast<float*>(take(bb.w_scale));
        fb.wt_scale = static_cast<float*>(take(bb.wt_scale));
        fb.xq = take(bb.xq);
        fb.xqt = take(bb.xqt);
        fb.x_scale = static_cast<float*>(take(bb.x_scale));
        fb.xt_scale = static_cast<float*>(take(bb.xt_scale));
        fb.dyq = take(bb.dyq);
        fb.dyqt = take(bb.dyqt);
        fb.dy_scale = static_cast<float*>(take(bb.dy_scale));
        fb.dyt_scale = static_cast<float*>(take(bb.dyt_scale));
        fb.cast_scales = static_cast<float*>(take(bb.cast_scales));
        const auto* xb = static_cast<const bf16*>(x.data());
        const auto* dyb = static_cast<const bf16*>(dy.data());
        timed(std::string("fp8b ") + l.name + " weight casts (per step)", shape, 2.0 * O * I * 2, 0,
              [&] {
                  fp8_blockwise_cast_weight(static_cast<const bf16*>(w.data()), O, I, fb,
                                            b.state.stream());
              });
        fp8b_total +=
            timed(std::string("fp8b ") + l.name + " forward (+ x casts)", shape, 2.0 * N * I * 2,
                  flops, [&] {
                      fp8_blockwise_forward(static_cast<bf16*>(y.data()), xb, nullptr, nullptr, N,
                                            I, O, fb, b.state, b.state.stream());
                  });
        fp8b_total +=
            timed(std::string("fp8b ") + l.name + " backward (+ dy casts)", shape, 2.0 * N * O * 2,
                  2 * flops, [&] {
                      fp8_blockwise_backward(static_cast<bf16*>(dx.data()),
                                             static_cast<float*>(dw.data()), nullptr, dyb, N, I, O,
                                             false, true, fb, b.state, b.state.stream());
                  });
        timed(std::string("fp8b ") + l.name + " forward GEMM alone", shape, 0, flops, [&] {
            cuda::fp8_blockwise_forward_gemm(static_cast<bf16*>(y.data()),
                                             {fb.xq, DType::kE4M3, Fp8Block::k1x128, fb.x_scale},
                                             {fb.wq, DType::kE4M3, Fp8Block::k128x128, fb.w_scale},
                                             nullptr, nullptr, N, I, O, b.state, b.state.stream());
        });
        b.release();
    }
    std::printf("| %-34s | %-26s | %9.3f | %9s | %5s | %8s | %7s |\n", "bf16 layer linears", model,
                bf16_total, "", "", "", "");
    std::printf("| %-34s | %-26s | %9.3f | %9s | %5.2f | %8s | %7s |\n",
                "fp8 layer linears (speedup in x)", model, fp8_total, "", bf16_total / fp8_total,
                "", "");
    std::printf("| %-34s | %-26s | %9.3f | %9s | %5.2f | %8s | %7s |\n",
                "fp8b layer linears (speedup in x)", model, fp8b_total, "", bf16_total / fp8b_total,
                "", "");
}

// The LM head + cross-entropy in BF16 and with its GEMMs in FP8 per tensor (fp8.lm_head:
// ops/cuda/lm_head_cross_entropy.h, "FP8"), forward + backward as a training step runs it, at
// the memory plan's chunk (512 MiB of f32 rows: 2 Nc bf16 rows a chunk, or Nc rounded down to 16
// rows in FP8, whose chunk also holds the dlogits' codes). The FP8 row includes the x casts and
// every chunk's dlogits cast; the weight's casts (once per optimizer step) are their own row. The
// summary row gives BF16 / FP8. At the Llama-3-8B slice's shape (B 2 x T 4096 tokens, hidden
// 4096, vocabulary 128256): `cuda_ops_bench --only lm_head`.
void fp8_lm_head(Bench& b, const char* model, int64_t N, int64_t C, int64_t V) {
    const int64_t Nc = std::min<int64_t>(N, (int64_t(512) << 20) / (4 * V) / 16 * 16);
    const std::string s =
        std::string(model) + " N=" + std::to_string(N) + " V=" + std::to_string(V);
    auto x = b.tensor(DType::kBF16, {N, C}), w = b.tensor(DType::kBF16, {V, C}, 0.05f);
    auto targets = b.tensor(DType::kI32, {N}, 1.0f, int32_t(V));
    auto scratch = b.tensor(DType::kF32, {Nc, V});
    auto loss = b.tensor(DType::kF32, {1}), dx = b.tensor(DType::kBF16, {N, C});
    auto dw = b.tensor(DType::kF32, {V, C});
    const double flops = 3 * 2.0 * N * C * V;
    const double bf16_ms = b.time("bf16 lm_head_ce fwd+bwd", s, 0, flops, [&] {
        lm_head_cross_entropy_forward_backward(loss, TensorView(), dx, dw, x, targets, w, 1.0f,
                                               scratch, b.ctx);
    });
    auto bytes = [&](int64_t n) {
        b.buffers.emplace_back(size_t(n));
        return b.buffers.back().data();
    };
    Fp8LinearBuffers f;
    f.wq = bytes(V * C), f.wqt = bytes(V * C), f.xq = bytes(N * C), f.xqt = bytes(N * C);
    f.scalars = static_cast<float*>(bytes(24 * sizeof(float)));
    const LinearSpec spec{LinearPrecision::kFp8PerTensor, "lm_head", &f};
    b.time("fp8 lm_head weight casts (per step)", s, 2.0 * V * C * 2 + 2.0 * V * C, 0,
           [&] { linear_fp8_cast_weight(w, b.ctx, spec); });
    linear_fp8_cast_weight(w, b.ctx, spec);
    const double fp8_ms = b.time("fp8 lm_head_ce fwd+bwd (+ casts)", s, 0, flops, [&] {
        lm_head_cross_entropy_forward_backward(loss, TensorView(), dx, dw, x, targets, w, 1.0f,
                                               scratch, b.ctx, spec);
    });
    if (bf16_ms > 0 && fp8_ms > 0)
        std::printf("| %-34s | %-26s | %9.3f | %9s | %5.2f | %8s | %7s |\n",
                    "fp8 lm_head_ce (speedup in x)", model, fp8_ms, "", bf16_ms / fp8_ms, "", "");
    b.release();
}
}  // namespace
}  // namespace lathe

int main(int argc, char** argv) {
    lathe::Bench b;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (std::strcmp(argv[i], "--copy-gbps") == 0)
            b.copy_bytes_per_s = std::atof(argv[i + 1]) * 1e9;
        if (std::strcmp(argv[i], "--gemm-tflops") == 0)
            b.gemm_flops_per_s = std::atof(argv[i + 1]) * 1e12;
        if (std::strcmp(argv[i], "--only") == 0) {
            std::string list = argv[i + 1];
            for (size_t at = 0; at <= list.size();) {
                const size_t comma = std::min(list.find(',', at), list.size());
                if (comma > at) b.only.push_back(list.substr(at, comma - at));
                at = comma + 1;
            }
        }
    }
    cudaDeviceProp prop{};
    LATHE_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    std::printf("%s, %d SMs; floors from %.0f GB/s copy and %.0f TFLOP/s bf16 GEMM\n\n", prop.name,
                prop.multiProcessorCount, b.copy_bytes_per_s / 1e9, b.gemm_flops_per_s / 1e12);
    std::printf("| %-34s | %-26s | %9s | %9s | %5s | %8s | %7s |\n", "op", "shape", "ms",
                "floor ms", "x", "GB/s", "TFLOP/s");
    std::printf("|%s|%s|%s|%s|%s|%s|%s|\n", std::string(36, '-').c_str(),
                std::string(28, '-').c_str(), std::string(11, '-').c_str(),
                std::string(11, '-').c_str(), std::string(7, '-').c_str(),
                std::string(10, '-').c_str(), std::string(9, '-').c_str());
    lathe::gpt2(b);
    lathe::llama1b(b);
    lathe::decode_attention(b, 1, 1024);
    lathe::decode_attention(b, 1, 31000);
    lathe::decode_attention(b, 64, 1024);
    lathe::decode_linears(b);
    // FP8 against BF16 per linear: the Llama-3-8B layer at T=4096 (hidden 4096, 32 heads, 8 KV
    // heads of 128, FFN 14336) and the Llama-3.2-1B layer at B=8, T=2048.
    lathe::fp8_linears(b, "llama3-8b", 4096, 4096, 4096 + 2 * 1024, 14336);
    lathe::fp8_linears(b, "llama3.2-1b", 16384, 2048, 2048 + 2 * 512, 8192);
    // The LM head, BF16 against FP8: the Llama-3-8B slice (B 2 x T 4096) and the Llama-3.2-1B
    // shape (B 8 x T 2048, hidden 2048), both with Llama 3's vocabulary.
    lathe::fp8_lm_head(b, "llama3-8b", 8192, 4096, 128256);
    lathe::fp8_lm_head(b, "llama3.2-1b", 16384, 2048, 128256);
    return 0;
}
