#pragma once
// CUDA LM head fused with softmax cross-entropy (ops/lm_head_cross_entropy.h has the math).
// x (N, C) bf16, weight (V, C) bf16, targets (N) i32 (-100 = ignored); loss (1), losses (N) (may be
// null), lse (N) f32; dx (N, C) bf16 (=); dweight (V, C) f32 (+=, may be null).
//
// The chunk. The dispatcher passes the memory plan's (Nc, V) f32 scratch; this backend uses its
// bytes as bf16 logits: rows of ld = round_up(V, 8) elements (16-byte aligned rows, so cuBLASLt
// and the row kernels use 16-byte accesses; the padding columns are never read as logits), as
// many rows as the bytes hold: R = floor(4 Nc V / 2 ld) = 2 Nc when V % 8 == 0. (A scratch that is
// not 16-byte aligned, or one too small for a padded row, falls back to ld = V, R = 2 Nc and
// scalar accesses.) So the memory plan's Nc counts f32 rows and the CUDA op runs 2x as many bf16
// rows per chunk in the same bytes. Per chunk of r <= R rows:
//   1. cuBLASLt: logits (r, V) bf16 in the chunk = x_chunk . weight^T (fp32 accumulation, one
//      rounding to bf16 per logit).
//   2. one block per row, fp32 math from the bf16 logits:
//      - forward_backward: the row is read from HBM once and held on chip (16-byte vectors, the
//        first 8 per thread in registers, the rest in shared memory: 512 threads and <= 48 KiB
//        for V <= 65536, so two or more rows per SM; 1024 threads up to about V = 180K on an
//        H100), then max, sum of exp(l - max), lse and the row's loss, then dlogits = dloss /
//        count * (softmax - onehot(target)) rounded to bf16 and written over the same bytes
//        (each thread writes back exactly the vectors it read, so in place needs no barrier).
//        Longer rows: the streaming kernel below, reading the row twice (the second mostly L2).
//      - forward: one streaming read (per-thread online max/sum), lse and loss.
//      - backward (lse given): one streaming read and the dlogits written in place.
//      Every reduction is per-thread partials then a fixed-order block reduction: deterministic.
//   3. cuBLASLt: dx_chunk (r, C) bf16 = dlogits . weight;  dweight (V, C) f32 += dlogits^T .
//   x_chunk
// Traffic per row in forward_backward: 2V bytes written by the GEMM, 2V read and 2V written by
// the row kernel, 2V read by each of the two backward GEMMs (the f32 chunk of before: 4V + 8V +
// 2V + 2V + 2V).
// Accuracy: the loss and lse come from bf16-rounded logits, as under torch autocast (its bf16
// lm_head output feeds cross_entropy). Rounding moves each logit by at most u|l| (u = 2^-8), so
// |lse - lse_f32| <= u max_v |l_v| (lse is 1-Lipschitz in the max norm) and the row loss moves by
// at most u (max_v |l_v| + |l_target|): for GPT-2-scale logits (|l| <~ 20) <= 0.16 in the worst
// case, typically ~u times the softmax-weighted |l| (1e-2 or less), far below the step-to-step
// noise of a training loss. The softmax in dlogits inherits a relative error <= 2u max|l|.
// FP8 (a non-null LmHeadFp8, per-tensor scales: ops/fp8_cast.h, ops/cuda/fp8_linear.h): the three
// GEMMs run in cuBLASLt's FP8 matmul with fp32 accumulation. The weight's codes wq (V, C) and
// wqt (C, V) E4M3 are the caller's (cast once per optimizer step, linear_fp8_cast_weight); x is
// cast once per call to xq (N, C) and, with a weight gradient, xqt (C, N) E4M3; each chunk's
// bf16 dlogits are cast to grad_dtype (q and qt) with the chunk's own scale (current scaling:
// the row kernel computes their amax as it writes them, so the cast reads them once) or the
// head's delayed scale. The chunk's bytes hold R = floor(Nc / 16) 16 rows: bf16 dlogits
// (2V bytes a row), q and qt (V each), so the f32 scratch needs no more bytes. Per chunk:
//   logits (r, V) bf16 = sx sw (xq_chunk . wq^T)
//   dx_chunk (r, C) bf16 = sdl sw (dlq . wqt^T)
//   dweight (V, C) f32 += sdl sx (dlqt . xqt_chunk^T)   (xqt_chunk: columns r0..r0+r, stride N)
// Needs N, C, V multiples of 16, Nc >= 16 and a 16-byte aligned scratch (checked). Scalars as a
// linear's (ops/linear.h, Fp8LinearBuffers::scalars): x at 0 / 4, w at 8 / 12, dlogits at 16 /
// 20 (amax / scale_inv); after a call, slot 16 / 20 hold the last chunk's.
// count (rows with a target) is reduced on the device, so nothing waits for the host; a target
// neither -100 nor in [0, V) traps the kernel. The mean loss is an fp64 sum over rows in a fixed
// order. Deterministic. The state's scratch holds count, and lse/losses where the caller gives
// none.

#include <cstdint>

#include "core/dtype.h"

struct CUstream_st;

namespace lathe {
struct CudaState;
}

namespace lathe::cuda {

// The FP8 head's device buffers (above); every pointer 16-byte aligned.
struct LmHeadFp8 {
    const void* wq = nullptr;   // (V, C) E4M3
    const void* wqt = nullptr;  // (C, V) E4M3
    void* xq = nullptr;         // (N, C): scratch
    void* xqt = nullptr;        // (C, N): scratch
    float* scalars = nullptr;   // 24 f32
    DType grad_dtype = DType::kE5M2;
    // Delayed scaling: the scales of x, w, dlogits (3 f32) and the step's amaxes (3 f32, each
    // cast's amax max-accumulated); null: current scaling.
    const float* delayed_scale = nullptr;
    float* step_amax = nullptr;
    // Current scaling: amax(x) as the kernel that wrote x computed it (LinearSpec::x_amax), so
    // x's cast reads x once; null: the cast computes it.
    const float* x_amax = nullptr;
};

// vocab_begin, vocab_total: a vocabulary shard (ops/lm_head_cross_entropy.h, LmHeadVocabShard):
// weight holds ids vocab_begin .. vocab_begin + V of vocab_total (targets are checked against
// vocab_total); vocab_total 0: the whole vocabulary. Not with fp8 (checked).
void lm_head_cross_entropy_forward(float* loss, float* losses, float* lse, const bf16* x,
                                   const int32_t* targets, const bf16* weight, float* scratch,
                                   int64_t N, int64_t C, int64_t V, int64_t Nc, CudaState& state,
                                   CUstream_st* stream, const LmHeadFp8* fp8 = nullptr,
                                   int64_t vocab_begin = 0, int64_t vocab_total = 0);

// dweight += the chunks' products, or without dweight_accumulate the first chunk writes it (=).
void lm_head_cross_entropy_backward(bf16* dx, float* dweight, bool dweight_accumulate,
                                    const bf16* x, const int32_t* targets, const bf16* weight,
                                    const float* lse, float dloss, float* scratch, int64_t N,
                                    int64_t C, int64_t V, int64_t Nc, CudaState& state,
                                    CUstream_st* stream, const LmHeadFp8* fp8 = nullptr,
                                    int64_t vocab_begin = 0, int64_t vocab_total = 0);

void lm_head_cross_entropy_forward_backward(float* loss, float* losses, bf16* dx, float* dweight,
                                            bool dweight_accumulate, const bf16* x,
                                            const int32_t* targets, const bf16* weight, float dloss,
                                            float* scratch, int64_t N, int64_t C, int64_t V,
                                            int64_t Nc, CudaState& state, CUstream_st* stream,
                                            const LmHeadFp8* fp8 = nullptr);

// The forward+backward row kernel of step 2 alone, for timing it (bench/cuda_ops_bench.cu):
// `rows` rows of bf16 logits with row stride ld (>= V) at `logits` become dlogits in place;
// lse and losses (rows) are written; count is a device int (the divisor of the mean), dloss the
// loss gradient. Rows are indexed from 0 into targets, lse and losses.
void cross_entropy_rows_forward_backward(bf16* logits, float* losses, float* lse,
                                         const int32_t* targets, const int* count, float dloss,
                                         int64_t rows, int64_t V, int64_t ld, CUstream_st* stream);

}  // namespace lathe::cuda
