#include "ops/vocab_parallel.h"

#include "ops/cpu/vocab_parallel.h"
#include "ops/cuda/dispatch.h"
#include "ops/cuda/embedding.h"
#include "ops/cuda/vocab_parallel.h"
#include "ops/op_checks.h"

namespace lathe {

using namespace detail;

void vocab_shard_ids(TensorView local, ConstTensorView ids, int64_t begin, int64_t V, int64_t total,
                     const Context& ctx) {
    constexpr const char* kOp = "vocab_shard_ids";
    op_expect_dtype(kOp, "ids", ids, DType::kI32);
    op_expect_dtype(kOp, "local", local, DType::kI32);
    op_expect_shape(kOp, "local", local, ids.shape());
    LATHE_CHECK(begin >= 0 && V >= 1 && begin + V <= total, "{}: rows {} .. {} of {}", kOp, begin,
                begin + V, total);
    op_expect_memory(kOp, ctx, {local, ids});
    const int64_t N = ids.numel();
    switch (ctx.backend) {
        case Backend::kCpu:
            cpu::vocab_shard_ids(local.as<int32_t>(), ids.as<int32_t>(), N, begin, V, total);
            return;
        case Backend::kCuda:
            cuda::vocab_shard_ids(local.as<int32_t>(), ids.as<int32_t>(), N, begin, V, total,
                                  ctx.stream);
            return;
    }
    op_no_backend(kOp, ctx);
}

void vocab_shard_zero_rows(TensorView x, ConstTensorView ids, int64_t begin, int64_t V,
                           const Context& ctx) {
    constexpr const char* kOp = "vocab_shard_zero_rows";
    op_expect_dtype(kOp, "ids", ids, DType::kI32);
    const auto [N, C] = op_rows_cols(kOp, "x", x);
    LATHE_CHECK(ids.numel() == N, "{}: ids {} for x {}", kOp, ids.to_string(), x.to_string());
    op_expect_memory(kOp, ctx, {x, ids});
    switch (ctx.backend) {
        case Backend::kCpu:
            op_expect_cpu_f32(kOp, {x});
            cpu::vocab_shard_zero_rows(x.as<float>(), ids.as<int32_t>(), N, C, begin, V);
            return;
        case Backend::kCuda:
            op_expect_dtype(kOp, "x", x, DType::kBF16);
            cuda::vocab_shard_zero_rows(x.as<bf16>(), ids.as<int32_t>(), N, C, begin, V,
                                        ctx.stream);
            return;
    }
    op_no_backend(kOp, ctx);
}

void vocab_shard_embedding_backward(TensorView dwte, ConstTensorView dx, ConstTensorView ids,
                                    int64_t begin, int64_t total, const Context& ctx) {
    constexpr const char* kOp = "vocab_shard_embedding_backward";
    op_expect_dtype(kOp, "ids", ids, DType::kI32);
    const auto [N, C] = op_rows_cols(kOp, "dx", dx);
    LATHE_CHECK(ids.numel() == N, "{}: ids {} for dx {}", kOp, ids.to_string(), dx.to_string());
    LATHE_CHECK(dwte.rank() == 2 && dwte.dim(1) == C, "{}: dwte {} for C={}", kOp, dwte.to_string(),
                C);
    const int64_t V = dwte.dim(0);
    LATHE_CHECK(begin >= 0 && V >= 1 && begin + V <= total, "{}: rows {} .. {} of {}", kOp, begin,
                begin + V, total);
    op_expect_memory(kOp, ctx, {dwte, dx, ids});
    switch (ctx.backend) {
        case Backend::kCpu:
            op_expect_cpu_f32(kOp, {dwte, dx});
            cpu::vocab_shard_embedding_backward(dwte.as<float>(), dx.as<float>(), ids.as<int32_t>(),
                                                N, C, begin, V, total);
            return;
        case Backend::kCuda:
            op_expect_dtype(kOp, "dwte", dwte, DType::kF32);
            op_expect_dtype(kOp, "dx", dx, DType::kBF16);
            cuda::embedding_backward_shard(dwte.as<float>(), dx.as<bf16>(), ids.as<int32_t>(), N, C,
                                           begin, V, total, cuda_state_of(ctx, kOp), ctx.stream);
            return;
    }
    op_no_backend(kOp, ctx);
}

void cross_entropy_vocab_parallel_combine(TensorView loss, TensorView losses, TensorView lse,
                                          ConstTensorView targets, TensorView work,
                                          const VocabParallelReduce& reduce, const Context& ctx) {
    constexpr const char* kOp = "cross_entropy_vocab_parallel_combine";
    op_expect_dtype(kOp, "targets", targets, DType::kI32);
    const int64_t N = targets.numel();
    op_expect_shape(kOp, "loss", loss, Shape{1});
    op_expect_shape(kOp, "losses", losses, Shape{N});
    op_expect_shape(kOp, "lse", lse, Shape{N});
    op_expect_shape(kOp, "work", work, Shape{3, N});
    for (const ConstTensorView& v : {ConstTensorView(loss), ConstTensorView(losses),
                                     ConstTensorView(lse), ConstTensorView(work)})
        op_expect_dtype(kOp, "loss, losses, lse and work", v, DType::kF32);
    LATHE_CHECK(reduce.max && reduce.sum, "{}: the group's reductions are missing", kOp);
    op_expect_memory(kOp, ctx, {loss, losses, lse, targets, work});
    const TensorView flat = work.reshape(Shape{3 * N});
    const TensorView m = flat.slice(0, N), e_and_t = flat.slice(N, 3 * N);
    switch (ctx.backend) {
        case Backend::kCpu:
            cpu::cross_entropy_vocab_parallel_prepare(work.as<float>(), lse.as<float>(),
                                                      losses.as<float>(), N);
            reduce.max(m);
            cpu::cross_entropy_vocab_parallel_exp(work.as<float>(), lse.as<float>(), N);
            reduce.sum(e_and_t);
            cpu::cross_entropy_vocab_parallel_finish(loss.as<float>(), losses.as<float>(),
                                                     lse.as<float>(), targets.as<int32_t>(),
                                                     work.as<float>(), N);
            return;
        case Backend::kCuda:
            cuda::cross_entropy_vocab_parallel_prepare(work.as<float>(), lse.as<float>(),
                                                       losses.as<float>(), N, ctx.stream);
            reduce.max(m);
            cuda::cross_entropy_vocab_parallel_exp(work.as<float>(), lse.as<float>(), N,
                                                   ctx.stream);
            reduce.sum(e_and_t);
            cuda::cross_entropy_vocab_parallel_finish(loss.as<float>(), losses.as<float>(),
                                                      lse.as<float>(), targets.as<int32_t>(),
                                                      work.as<float>(), N, ctx.stream);
            return;
    }
    op_no_backend(kOp, ctx);
}

}  // namespace lathe
