#include "ops/attention.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "ops/cpu/attention.h"
#include "ops/cuda/attention.h"
#include "ops/cuda/attention_decode_smem.h"
#include "ops/cuda/dispatch.h"
#include "ops/op_checks.h"

namespace lathe {

using namespace detail;

namespace {
struct AttentionDims {
    int64_t B, Tq, Tk, H, Hkv, D;
};

// q (B, Tq, H, D), k and v (B, Tk, Hkv, D), lse (B, H, Tq) f32; the rules of ops/attention.h.
AttentionDims attention_check(const char* op, ConstTensorView q, ConstTensorView k,
                              ConstTensorView v, ConstTensorView lse, int64_t window) {
    LATHE_CHECK(q.rank() == 4 && k.rank() == 4,
                "{}: q {}, k {}; expected (B, Tq, H, D) and "
                "(B, Tk, Hkv, D)",
                op, q.to_string(), k.to_string());
    AttentionDims d{q.dim(0), q.dim(1), k.dim(1), q.dim(2), k.dim(2), q.dim(3)};
    LATHE_CHECK(d.Hkv > 0 && d.H % d.Hkv == 0, "{}: Hkv = {} does not divide H = {}", op, d.Hkv,
                d.H);
    op_expect_shape(op, "k", k, Shape{d.B, d.Tk, d.Hkv, d.D});
    op_expect_shape(op, "v", v, Shape{d.B, d.Tk, d.Hkv, d.D});
    op_expect_shape(op, "lse", lse, Shape{d.B, d.H, d.Tq});
    op_expect_dtype(op, "lse", lse, DType::kF32);
    LATHE_CHECK(window >= 0, "{}: window {} (0 means none)", op, window);
    return d;
}

void docs_check(const char* op, ConstTensorView docs, const AttentionDims& d) {
    if (docs.is_null()) return;
    op_expect_dtype(op, "docs", docs, DType::kI32);
    op_expect_shape(op, "docs", docs, Shape{d.B, d.Tk});
}

// The training form: one length T for queries and keys (the backward's only form).
AttentionDims training_check(const char* op, ConstTensorView q, ConstTensorView k,
                             ConstTensorView v, ConstTensorView lse, ConstTensorView docs,
                             int64_t window) {
    const AttentionDims d = attention_check(op, q, k, v, lse, window);
    LATHE_CHECK(d.Tq == d.Tk, "{}: q {} and k {} differ in length; the backward takes Tq == Tk", op,
                q.to_string(), k.to_string());
    docs_check(op, docs, d);
    return d;
}

// The packed form: qkv (B, T, P, D) with P = H + 2 Hkv, H from out (B, T, H, D); lse (B, H, T).
AttentionDims qkv_check(const char* op, ConstTensorView qkv, ConstTensorView out,
                        ConstTensorView lse, ConstTensorView docs, int64_t window) {
    LATHE_CHECK(qkv.rank() == 4 && out.rank() == 4,
                "{}: qkv {}, out {}; expected (B, T, H + 2 Hkv, D) and (B, T, H, D)", op,
                qkv.to_string(), out.to_string());
    const int64_t H = out.dim(2), P = qkv.dim(2);
    LATHE_CHECK(P > H && (P - H) % 2 == 0 && H % ((P - H) / 2) == 0,
                "{}: qkv has {} heads a row and out {}; a packed row holds H query heads and two "
                "times Hkv key/value heads, Hkv dividing H",
                op, P, H);
    const AttentionDims d{qkv.dim(0), qkv.dim(1), qkv.dim(1), H, (P - H) / 2, qkv.dim(3)};
    op_expect_shape(op, "out", out, Shape{d.B, d.Tq, d.H, d.D});
    op_expect_shape(op, "lse", lse, Shape{d.B, d.H, d.Tq});
    op_expect_dtype(op, "lse", lse, DType::kF32);
    LATHE_CHECK(window >= 0, "{}: window {} (0 means none)", op, window);
    docs_check(op, docs, d);
    return d;
}

cuda::AttentionShape cuda_attention_shape(const char* op, const AttentionDims& d,
                                          ConstTensorView docs, int64_t window, float scale,
                                          const Context& ctx) {
    const char* missing = cuda::attention_unavailable_reason();
    LATHE_CHECK(missing == nullptr, "{}: {}", op, missing);
    cuda::AttentionShape shape{d.B, d.Tq, d.H, d.Hkv, d.D, window, !docs.is_null(), scale};
    shape.nondeterministic_backward = !ctx.deterministic;
    shape.backward_workspace_cap = ctx.attention_backward_workspace_cap;
    return shape;
}

cuda::AttentionRowsShape cuda_rows_shape(const AttentionDims& d, int64_t q_offset, int64_t window,
                                         float scale) {
    return {d.B, d.Tq, d.Tk, d.H, d.Hkv, d.D, q_offset, window, scale};
}
}  // namespace

const char* attention_unavailable_reason(Backend backend) {
    if (backend == Backend::kCpu) return nullptr;
    return cuda::attention_unavailable_reason();
}

void attention_forward(TensorView out, TensorView lse, ConstTensorView q, ConstTensorView k,
                       ConstTensorView v, ConstTensorView docs, int64_t window, float scale,
                       const Context& ctx) {
    attention_forward(out, lse, q, k, v, docs, window, scale, 0, ctx);
}

void attention_forward(TensorView out, TensorView lse, ConstTensorView q, ConstTensorView k,
                       ConstTensorView v, ConstTensorView docs, int64_t window, float scale,
                       int64_t q_offset, const Context& ctx) {
    constexpr const char* kOp = "attention_forward";
    const AttentionDims d = attention_check(kOp, q, k, v, lse, window);
    LATHE_CHECK(d.Tq <= d.Tk, "{}: q {} is longer than k {}; queries continue the keys (Tq <= Tk)",
                kOp, q.to_string(), k.to_string());
    LATHE_CHECK(q_offset >= 0 && q_offset <= d.Tk - d.Tq,
                "{}: q_offset {} with Tq = {}, Tk = {}; the queries' positions q_offset .. "
                "q_offset + Tq - 1 are keys, so 0 <= q_offset <= Tk - Tq",
                kOp, q_offset, d.Tq, d.Tk);
    docs_check(kOp, docs, d);
    op_expect_shape(kOp, "out", out, q.shape());
    op_expect_memory(kOp, ctx, {out, lse, q, k, v, docs});
    switch (ctx.backend) {
        case Backend::kCpu:
            op_expect_cpu_f32(kOp, {out, q, k, v});
            cpu::attention_forward(out.as<float>(), lse.as<float>(), q.as<float>(), k.as<float>(),
                                   v.as<float>(), docs.as<int32_t>(), d.B, d.Tq, d.Tk, q_offset,
                                   d.H, d.Hkv, d.D, window, scale);
            return;
        case Backend::kCuda:
            op_expect_cuda_dtype(kOp, DType::kBF16, {out, q, k, v});
            if (d.Tq == d.Tk) {  // q_offset is 0: the training shape, cuDNN's flash attention
                cuda::attention_forward(out.as<bf16>(), lse.as<float>(), q.as<bf16>(), k.as<bf16>(),
                                        v.as<bf16>(), docs.as<int32_t>(),
                                        cuda_attention_shape(kOp, d, docs, window, scale, ctx),
                                        cuda_state_of(ctx, kOp), ctx.stream);
            } else if (docs.is_null() && cuda::attention_unavailable_reason() == nullptr &&
                       d.D <= 128 && d.D % 8 == 0) {
                // Queries that continue a cache: cuDNN's bottom-right aligned forward (its own
                // kernel when cuDNN declines the shape).
                cuda::AttentionShape shape{d.B, d.Tq, d.H, d.Hkv, d.D, window, false, scale};
                shape.Tkv = q_offset + d.Tq;
                shape.kv_rows = d.Tk;
                cuda::attention_forward(out.as<bf16>(), lse.as<float>(), q.as<bf16>(), k.as<bf16>(),
                                        v.as<bf16>(), nullptr, shape, cuda_state_of(ctx, kOp),
                                        ctx.stream);
            } else {
                cuda::attention_forward_rows(out.as<bf16>(), lse.as<float>(), q.as<bf16>(),
                                             k.as<bf16>(), v.as<bf16>(), docs.as<int32_t>(),
                                             nullptr, cuda_rows_shape(d, q_offset, window, scale),
                                             cuda_state_of(ctx, kOp), ctx.stream);
            }
            return;
    }
    op_no_backend(kOp, ctx);
}

void attention_decode(TensorView out, TensorView lse, ConstTensorView q, ConstTensorView k_cache,
                      ConstTensorView v_cache, ConstTensorView lengths, int64_t window, float scale,
                      const Context& ctx) {
    constexpr const char* kOp = "attention_decode";
    const AttentionDims d = attention_check(kOp, q, k_cache, v_cache, lse, window);
    LATHE_CHECK(d.Tq == 1, "{}: q {}; one new token per row, (B, 1, H, D)", kOp, q.to_string());
    op_expect_shape(kOp, "out", out, q.shape());
    op_expect_dtype(kOp, "lengths", lengths, DType::kI32);
    op_expect_shape(kOp, "lengths", lengths, Shape{d.B});
    op_expect_memory(kOp, ctx, {out, lse, q, k_cache, v_cache, lengths});
    switch (ctx.backend) {
        case Backend::kCpu:
            op_expect_cpu_f32(kOp, {out, q, k_cache, v_cache});
            cpu::attention_decode(out.as<float>(), lse.as<float>(), q.as<float>(),
                                  k_cache.as<float>(), v_cache.as<float>(), lengths.as<int32_t>(),
                                  d.B, d.Tk, d.H, d.Hkv, d.D, window, scale);
            return;
        case Backend::kCuda:
            op_expect_cuda_dtype(kOp, DType::kBF16, {out, q, k_cache, v_cache});
            cuda::attention_forward_rows(
                out.as<bf16>(), lse.as<float>(), q.as<bf16>(), k_cache.as<bf16>(),
                v_cache.as<bf16>(), nullptr, lengths.as<int32_t>(),
                cuda_rows_shape(d, 0, window, scale), cuda_state_of(ctx, kOp), ctx.stream);
            return;
    }
    op_no_backend(kOp, ctx);
}

void attention_decode_paged(TensorView out, TensorView lse, ConstTensorView q,
                            ConstTensorView k_pool, ConstTensorView v_pool,
                            ConstTensorView block_tables, ConstTensorView lengths, int64_t window,
                            float scale, const Context& ctx) {
    constexpr const char* kOp = "attention_decode_paged";
    LATHE_CHECK(q.rank() == 4 && q.dim(1) == 1 && k_pool.rank() == 4 && block_tables.rank() == 2,
                "{}: q {}, k_pool {}, block_tables {}; expected (B, 1, H, D), (N, Bk, Hkv, D), "
                "(B, M)",
                kOp, q.to_string(), k_pool.to_string(), block_tables.to_string());
    const int64_t B = q.dim(0), H = q.dim(2), D = q.dim(3);
    const int64_t N = k_pool.dim(0), Bk = k_pool.dim(1), Hkv = k_pool.dim(2);
    const int64_t M = block_tables.dim(1);
    LATHE_CHECK(Hkv > 0 && H % Hkv == 0, "{}: Hkv = {} does not divide H = {}", kOp, Hkv, H);
    LATHE_CHECK(window >= 0, "{}: window {} (0 means none)", kOp, window);
    op_expect_shape(kOp, "k_pool", k_pool, Shape{N, Bk, Hkv, D});
    op_expect_shape(kOp, "v_pool", v_pool, Shape{N, Bk, Hkv, D});
    op_expect_shape(kOp, "out", out, q.shape());
    op_expect_shape(kOp, "lse", lse, Shape{B, H, 1});
    op_expect_dtype(kOp, "lse", lse, DType::kF32);
    op_expect_shape(kOp, "block_tables", block_tables, Shape{B, M});
    op_expect_dtype(kOp, "block_tables", block_tables, DType::kI32);
    op_expect_shape(kOp, "lengths", lengths, Shape{B});
    op_expect_dtype(kOp, "lengths", lengths, DType::kI32);
    op_expect_memory(kOp, ctx, {out, lse, q, k_pool, v_pool, block_tables, lengths});
    switch (ctx.backend) {
        case Backend::kCpu: {
            op_expect_cpu_f32(kOp, {out, q, k_pool, v_pool});
            // The reference: each row's positions gathered in order, then attention_decode's
            // kernel on that one contiguous row.
            const int64_t row = Hkv * D;
            const int32_t* tables = block_tables.as<int32_t>();
            const int32_t* lens = lengths.as<int32_t>();
            std::vector<float> k, v;
            for (int64_t b = 0; b < B; ++b) {
                const int64_t len = lens[b];
                LATHE_CHECK(len >= 1 && len <= M * Bk,
                            "{}: lengths[{}] = {}; each length is in [1, M Bk = {}]", kOp, b, len,
                            M * Bk);
                k.resize(size_t(len * row));
                v.resize(size_t(len * row));
                for (int64_t j = 0; j < len; ++j) {
                    const int64_t block = tables[b * M + j / Bk];
                    LATHE_CHECK(block >= 0 && block < N,
                                "{}: block_tables[{}, {}] = {} outside the pool's {} blocks", kOp,
                                b, j / Bk, block, N);
                    const int64_t at = (block * Bk + j % Bk) * row;
                    std::copy_n(k_pool.as<float>() + at, row, k.data() + j * row);
                    std::copy_n(v_pool.as<float>() + at, row, v.data() + j * row);
                }
                const int32_t one = int32_t(len);
                cpu::attention_decode(out.as<float>() + b * H * D, lse.as<float>() + b * H,
                                      q.as<float>() + b * H * D, k.data(), v.data(), &one, 1, len,
                                      H, Hkv, D, window, scale);
            }
            return;
        }
        case Backend::kCuda:
            op_expect_cuda_dtype(kOp, DType::kBF16, {out, q, k_pool, v_pool});
            cuda::attention_decode_paged(
                out.as<bf16>(), lse.as<float>(), q.as<bf16>(), k_pool.as<bf16>(), v_pool.as<bf16>(),
                block_tables.as<int32_t>(), M, Bk, lengths.as<int32_t>(),
                {B, 1, M * Bk, H, Hkv, D, 0, window, scale}, cuda_state_of(ctx, kOp), ctx.stream);
            return;
    }
    op_no_backend(kOp, ctx);
}

namespace {

// kv_rows_scatter / kv_rows_gather: the checks, and the row's bytes.
size_t kv_rows_check(const char* op, ConstTensorView pool, ConstTensorView rows,
                     ConstTensorView slots, const Context& ctx) {
    LATHE_CHECK(pool.rank() == 4, "{}: pool {}; expected (N, Bk, Hkv, D)", op, pool.to_string());
    op_expect_dtype(op, "slots", slots, DType::kI32);
    LATHE_CHECK(slots.rank() == 1, "{}: slots {}; expected (n)", op, slots.to_string());
    const int64_t row = pool.dim(2) * pool.dim(3);
    LATHE_CHECK(rows.numel() == slots.dim(0) * row && rows.dtype() == pool.dtype(),
                "{}: rows {} for {} slots of {} with pool {}", op, rows.to_string(), slots.dim(0),
                row, pool.to_string());
    op_expect_memory(op, ctx, {pool, rows, slots});
    return size_t(row) * dtype_size(pool.dtype());
}

void kv_rows_cpu(const char* op, char* dst, const char* src, const int32_t* slots, int64_t n,
                 size_t row_bytes, int64_t pool_rows, bool scatter) {
    for (int64_t i = 0; i < n; ++i) {
        if (scatter && slots[i] == -1) continue;  // a padding row: nothing written
        LATHE_CHECK(slots[i] >= 0 && slots[i] < pool_rows, "{}: slots[{}] = {} outside [0, {})", op,
                    i, slots[i], pool_rows);
        const size_t at = size_t(slots[i]) * row_bytes, r = size_t(i) * row_bytes;
        if (scatter)
            std::memcpy(dst + at, src + r, row_bytes);
        else
            std::memcpy(dst + r, src + at, row_bytes);
    }
}

}  // namespace

void kv_rows_scatter(TensorView pool, ConstTensorView rows, ConstTensorView slots,
                     const Context& ctx) {
    constexpr const char* kOp = "kv_rows_scatter";
    const size_t row_bytes = kv_rows_check(kOp, pool, rows, slots, ctx);
    const int64_t n = slots.dim(0);
    switch (ctx.backend) {
        case Backend::kCpu:
            kv_rows_cpu(kOp, static_cast<char*>(pool.data()), static_cast<const char*>(rows.data()),
                        slots.as<int32_t>(), n, row_bytes, pool.dim(0) * pool.dim(1), true);
            return;
        case Backend::kCuda:
            cuda::kv_rows_scatter(pool.data(), rows.data(), slots.as<int32_t>(), n, row_bytes,
                                  ctx.stream);
            return;
    }
    op_no_backend(kOp, ctx);
}

void kv_rows_gather(TensorView rows, ConstTensorView pool, ConstTensorView slots,
                    const Context& ctx) {
    constexpr const char* kOp = "kv_rows_gather";
    const size_t row_bytes = kv_rows_check(kOp, pool, rows, slots, ctx);
    const int64_t n = slots.dim(0);
    switch (ctx.backend) {
        case Backend::kCpu:
            kv_rows_cpu(kOp, static_cast<char*>(rows.data()), static_cast<const char*>(pool.data()),
                        slots.as<int32_t>(), n, row_bytes, pool.dim(0) * pool.dim(1), false);
            return;
        case Backend::kCuda:
            cuda::kv_rows_gather(rows.data(), pool.data(), slots.as<int32_t>(), n, row_bytes,
                                 ctx.stream);
            return;
    }
    op_no_backend(kOp, ctx);
}

void attention_backward(TensorView dq, TensorView dk, TensorView dv, ConstTensorView dout,
                        ConstTensorView q, ConstTensorView k, ConstTensorView v,
                        ConstTensorView out, ConstTensorView lse, ConstTensorView docs,
                        int64_t window, float scale, const Context& ctx) {
    constexpr const char* kOp = "attention_backward";
    const AttentionDims d = training_check(kOp, q, k, v, lse, docs, window);
    op_expect_shape(kOp, "dq", dq, q.shape());
    op_expect_shape(kOp, "dk", dk, k.shape());
    op_expect_shape(kOp, "dv", dv, v.shape());
    op_expect_shape(kOp, "dout", dout, q.shape());
    op_expect_shape(kOp, "out", out, q.shape());
    op_expect_memory(kOp, ctx, {dq, dk, dv, dout, q, k, v, out, lse, docs});
    switch (ctx.backend) {
        case Backend::kCpu:
            op_expect_cpu_f32(kOp, {dq, dk, dv, dout, q, k, v, out});
            cpu::attention_backward(dq.as<float>(), dk.as<float>(), dv.as<float>(),
                                    dout.as<float>(), q.as<float>(), k.as<float>(), v.as<float>(),
                                    out.as<float>(), lse.as<float>(), docs.as<int32_t>(), d.B, d.Tq,
                                    d.H, d.Hkv, d.D, window, scale);
            return;
        case Backend::kCuda:
            op_expect_cuda_dtype(kOp, DType::kBF16, {dq, dk, dv, dout, q, k, v, out});
            cuda::attention_backward(dq.as<bf16>(), dk.as<bf16>(), dv.as<bf16>(), dout.as<bf16>(),
                                     q.as<bf16>(), k.as<bf16>(), v.as<bf16>(), out.as<bf16>(),
                                     lse.as<float>(), docs.as<int32_t>(),
                                     cuda_attention_shape(kOp, d, docs, window, scale, ctx),
                                     cuda_state_of(ctx, kOp), ctx.stream);
            return;
    }
    op_no_backend(kOp, ctx);
}

void attention_forward_qkv(TensorView out, TensorView lse, ConstTensorView qkv,
                           ConstTensorView docs, int64_t window, float scale, const Context& ctx) {
    constexpr const char* kOp = "attention_forward_qkv";
    const AttentionDims d = qkv_check(kOp, qkv, out, lse, docs, window);
    op_expect_memory(kOp, ctx, {out, lse, qkv, docs});
    const int64_t P = qkv.dim(2), kv = d.H * d.D, v = (d.H + d.Hkv) * d.D;
    switch (ctx.backend) {
        case Backend::kCpu: {
            op_expect_cpu_f32(kOp, {out, qkv});
            const float* x = qkv.as<float>();
            cpu::attention_forward(out.as<float>(), lse.as<float>(), x, x + kv, x + v,
                                   docs.as<int32_t>(), d.B, d.Tq, d.Tk, 0, d.H, d.Hkv, d.D, window,
                                   scale, P);
            return;
        }
        case Backend::kCuda: {
            op_expect_cuda_dtype(kOp, DType::kBF16, {out, qkv});
            cuda::AttentionShape shape = cuda_attention_shape(kOp, d, docs, window, scale, ctx);
            shape.qkv_heads = P;
            const bf16* x = qkv.as<bf16>();
            cuda::attention_forward(out.as<bf16>(), lse.as<float>(), x, x + kv, x + v,
                                    docs.as<int32_t>(), shape, cuda_state_of(ctx, kOp), ctx.stream);
            return;
        }
    }
    op_no_backend(kOp, ctx);
}

void attention_backward_qkv(TensorView dqkv, ConstTensorView dout, ConstTensorView qkv,
                            ConstTensorView out, ConstTensorView lse, ConstTensorView docs,
                            int64_t window, float scale, const Context& ctx) {
    constexpr const char* kOp = "attention_backward_qkv";
    const AttentionDims d = qkv_check(kOp, qkv, out, lse, docs, window);
    op_expect_shape(kOp, "dqkv", dqkv, qkv.shape());
    op_expect_shape(kOp, "dout", dout, out.shape());
    op_expect_memory(kOp, ctx, {dqkv, dout, qkv, out, lse, docs});
    const int64_t P = qkv.dim(2), kv = d.H * d.D, v = (d.H + d.Hkv) * d.D;
    switch (ctx.backend) {
        case Backend::kCpu: {
            op_expect_cpu_f32(kOp, {dqkv, dout, qkv, out});
            const float* x = qkv.as<float>();
            float* dx = dqkv.as<float>();
            cpu::attention_backward(dx, dx + kv, dx + v, dout.as<float>(), x, x + kv, x + v,
                                    out.as<float>(), lse.as<float>(), docs.as<int32_t>(), d.B, d.Tq,
                                    d.H, d.Hkv, d.D, window, scale, P);
            return;
        }
        case Backend::kCuda: {
            op_expect_cuda_dtype(kOp, DType::kBF16, {dqkv, dout, qkv, out});
            cuda::AttentionShape shape = cuda_attention_shape(kOp, d, docs, window, scale, ctx);
            shape.qkv_heads = P;
            const bf16* x = qkv.as<bf16>();
            bf16* dx = dqkv.as<bf16>();
            cuda::attention_backward(dx, dx + kv, dx + v, dout.as<bf16>(), x, x + kv, x + v,
                                     out.as<bf16>(), lse.as<float>(), docs.as<int32_t>(), shape,
                                     cuda_state_of(ctx, kOp), ctx.stream);
            return;
        }
    }
    op_no_backend(kOp, ctx);
}

Status attention_decode_paged_supports(int64_t heads, int64_t kv_heads, int64_t head_dim,
                                       int64_t smem_limit_bytes) {
    if (kv_heads < 1 || heads < kv_heads || heads % kv_heads != 0 || head_dim < 1) {
        return invalid_argument_error(
            "the paged decode attention: {} query heads over {} key/value heads of head_dim {}",
            heads, kv_heads, head_dim);
    }
    const int64_t G = heads / kv_heads;
    constexpr const char* kRemedy = "use the row cache (kv_block_size 0, --kv-block-size 0)";
    if (head_dim % 8 != 0) {
        return invalid_argument_error(
            "the CUDA paged KV cache reads 16-byte key rows and takes head_dim % 8 == 0 (this "
            "model's head_dim is {}): {}",
            head_dim, kRemedy);
    }
    if (head_dim > 2 * cuda::kDecodeThreads) {
        return invalid_argument_error(
            "the CUDA paged KV cache's decode attention takes head_dim <= {} (this model's "
            "head_dim is {}): {}",
            2 * cuda::kDecodeThreads, head_dim, kRemedy);
    }
    const size_t need = cuda::decode_smem(int(std::min<int64_t>(G, 1 << 20)), int(head_dim)).bytes;
    if (need > size_t(std::max<int64_t>(smem_limit_bytes, 0))) {
        return invalid_argument_error(
            "the CUDA paged KV cache's decode attention needs {} bytes of shared memory per block "
            "for head_dim {} and a GQA group of {} query heads per key/value head ({} / {}); this "
            "GPU allows {}: {}",
            need, head_dim, G, heads, kv_heads, smem_limit_bytes, kRemedy);
    }
    return ok_status();
}

}  // namespace lathe
