#pragma once
// The transformer block schedule shared by every family: a fixed sequence of op calls
// (src/ops/*.h), switched by the ModelConfig (norm kind, MLP kind, RoPE or not, biases present or
// null, sequential or parallel residual). No family has a block of its own.
//
// Forward, with x the block input (B, T, C):
//   h1 = norm1(x)
//   [q | k | v] = h1 Wqkv^T + bqkv        (one GEMM over the stacked qkv entry: Wq, Wk, Wv rows)
//   q, k = rope(q), rope(k)                                  (RoPE families; in place)
//   a = attention(q, k, v; causal, the layer's window, docs)
// q, k and v stay packed as that GEMM writes them, (B, T, H + 2 Hkv, D): each row's H query heads,
// then Hkv key heads, then Hkv value heads; RoPE and attention read them there (ops/rope.h:
// rope_qkv_forward; ops/attention.h: attention_forward_qkv), and the backward's dq, dk, dv land
// in one buffer of that layout, so the input gradient and the weight gradient are one GEMM each
// too (in FP8 one linear with one scale per tensor for the three, model/fp8_state.h).
//   o = a Wo^T + bo
//   sequential: m = x + o;  out = m + mlp(norm2(m))          (Llama, Mistral, Qwen2, GPT-2)
//   parallel:   out = x + o + mlp(norm2(x))                  (GPT-NeoX use_parallel_residual)
//   mlp(h) = down(swiglu(h Wup^T + bup))   or   down(gelu(h Wup^T + bup))
// Backward: the exact reverse, with `dres` carrying the residual stream's gradient: it holds
// d out on entry and d x on return. Parameter gradients accumulate (+=); nothing else is kept.
//
// Tensor parallel (BlockInputs::tp_sum set; infer/tensor_parallel.h gives the sharding): the
// weights are one rank's shard (H/T heads, F/T MLP width), so o and the MLP output are partial
// sums, summed over the tensor-parallel group before their residual adds; in the backward the
// gradients at the norm outputs (dnorm1, dnorm2) are partial sums of the column-parallel
// projections' input gradients, summed before the norms' backward. Every other tensor of the
// residual stream is the same on every rank. Sequential residual only (the split families).
//
// Sequence parallel (BlockInputs::tp_rows set as well, Megatron-LM style): the residual stream
// between the tensor-parallel regions is cut by rows instead of repeated. With the (B, T, C)
// activations flattened to (N, C), N = B T, the rows form K chunks of N/K (TensorParallelRows::
// chunks: parallel.tensor_overlap_chunks with overlap, else 1), and rank r of S holds rows
// [k N/K + r N/(K S), k N/K + (r+1) N/(K S)) of each chunk k, stored as its rows
// [k N/(K S), (k+1) N/(K S)), of x_in, x_mid, x_out, ln1_out, ln2_out and the norms'
// statistics; the norms and residual adds run on those rows alone (they are row-wise, so the
// order of a rank's rows is its own business; only the gathers and scatters map them to
// positions). Per layer, forward:
//   ln1 = norm1(x_in) (shard)  -> all-gather -> full rows -> q, k, v, attention (full rows,
//   this rank's heads) -> o partial (full rows) -> reduce-scatter -> o summed (shard);
//   x_mid = x_in + o; ln2 = norm2(x_mid) (shard) -> all-gather -> up, activation, down ->
//   partial (full rows) -> reduce-scatter -> x_out = x_mid + mlp (shard).
// Backward, the same collectives transposed: d x_out (shard) all-gathered before the down
// projection's backward, d ln2 (partial, full rows) reduce-scattered before norm2's backward,
// d x_mid all-gathered before the attention output's backward, d ln1 reduce-scattered before
// norm1's. Each reduce-scatter sums the same terms the all-reduce of the plain tensor-parallel
// path sums, for the rows the rank keeps. The norm outputs are saved as shards: the backward
// all-gathers them again (into BlockScratch::gathered) for the column-parallel weight
// gradients, so a layer keeps 1/S of x_in, x_mid, ln1_out, ln2_out (and a set of statistics).
// The norms' weight (and bias) gradients are then per-shard partial sums: the caller sums them
// over the group once per step (Model::sum_sequence_parallel_grads) before they are read. The
// row-parallel biases (bo, b_down: whole on tensor rank 0) get the gradient of the gathered
// full rows, as without sequence parallel. Collectives run in the same order on every rank
// (a recomputing forward included).
//
// Overlap (TensorParallelRows whose moves run beside the compute, on a stream of their own):
// with K > 1 the forward pipelines each region by chunks: the all-gather of chunk k+1 runs while q,
// k, v (or up, activation, down) of chunk k compute, and the reduce-scatter of chunk k while the
// output (or down) projection of chunk k+1 computes. The backward begins the gather of the saved
// norm output (needed by the weight gradients) before the input-gradient GEMMs and the
// attention backward that do not need it, and computes the input gradient first, so that its
// reduce-scatter runs under the weight-gradient GEMMs (Megatron-LM's order). Every move is
// waited for inside the block that began it. Without overlap (moves in stream order) the same
// calls run one after another. Chunks change which rows a rank holds and split the forward's
// GEMMs by rows: each output element is still one dot product over the same terms, but a GEMM
// of fewer rows may be another kernel (another summation order), so the bits may differ.

// Buffers: BlockActs are saved by the forward for the backward (one set per layer, in the
// activation arena); BlockScratch is overwritten by every block (one set, in the scratch arena).
// Their shapes for a batch (B, T) are listed once, by block_acts_for_each and
// block_scratch_for_each, which the memory plan and the model both use.

#include <array>
#include <cstdint>
#include <functional>
#include <utility>

#include "core/tensor.h"
#include "model/fp8_state.h"
#include "model/model_config.h"
#include "model/precision_policy.h"
#include "ops/context.h"

namespace lathe {

// One layer's parameters in the arena layout (param_table.h). Null where the family has none.
struct BlockWeights {
    ConstTensorView norm1_w, norm1_b;  // (C)
    ConstTensorView wqkv, bqkv;        // ((H + 2 Hkv) D, C), ((H + 2 Hkv) D): q, k, v stacked
    // Its row blocks, for the inference engine's projections into its cache (infer/engine.h);
    // the training block reads wqkv (the model leaves these null).
    ConstTensorView wq, wk, wv;        // (H D, C), (Hkv D, C), (Hkv D, C)
    ConstTensorView bq, bk, bv;        // (H D), (Hkv D), (Hkv D)
    ConstTensorView wo, bo;            // (C, H D), (C)
    ConstTensorView norm2_w, norm2_b;  // (C)
    ConstTensorView w_up, b_up;        // (2F, C) [gate; up] or (F, C); (2F) or (F)
    ConstTensorView w_down, b_down;    // (C, F), (C)
};

// Their gradients, same shapes; each accumulates (+=), but the four projection matrices (wqkv,
// wo, w_up, w_down) follow weight_mode: kOverwrite writes them (=), the step's first
// contribution where the model left them uncleared (model/model.h, zero_grads_beside_forward).
// Null where the weight is absent.
struct BlockGrads {
    TensorView norm1_w, norm1_b;
    TensorView wqkv, bqkv;
    TensorView wo, bo;
    TensorView norm2_w, norm2_b;
    TensorView w_up, b_up;
    TensorView w_down, b_down;
    GradMode weight_mode = GradMode::kAccumulate;
};

// Saved by block_forward for block_backward.
// Sequence parallel (header comment): the members marked [rows] hold this rank's N/S rows, shaped
// (N/S, C) or (N/S).
struct BlockActs {
    TensorView x_in;      // (B, T, C) the block input (the previous block's x_out) [rows]
    TensorView x_out;     // (B, T, C) the block output (the next block's x_in) [rows]
    TensorView ln1_out;   // (B, T, C) [rows]
    TensorView ln1_mean;  // (B T) LayerNorm only [rows]
    TensorView ln1_rstd;  // (B T) [rows]
    TensorView qkv;       // (B, T, H + 2 Hkv, D) q, k (after RoPE) and v packed by rows
    TensorView att;       // (B, T, H, D) attention output
    TensorView lse;       // (B, H, T) attention log-sum-exp
    TensorView x_mid;     // (B, T, C) x + o, sequential residual only [rows]
    TensorView ln2_out;   // (B, T, C) [rows]
    TensorView ln2_mean;  // (B T) LayerNorm only [rows]
    TensorView ln2_rstd;  // (B T) [rows]
    TensorView mlp_in;    // (B, T, 2F) [gate | up] or (B, T, F): before the activation
    TensorView mlp_act;   // (B, T, F) after it
};

// Overwritten by every block; one set per model.
struct BlockScratch {
    TensorView tmp;       // (B, T, C) o and the MLP output before their residual adds
    TensorView dnorm1;    // (B, T, C) gradient at norm1's output
    TensorView dnorm2;    // (B, T, C) gradient at norm2's output
    TensorView datt;      // (B, T, H, D)
    TensorView dqkv;      // (B, T, H + 2 Hkv, D) dq, dk, dv packed as BlockActs::qkv
    TensorView dmlp_act;  // (B, T, F) SwiGLU only (the GELU backward is fused into the down
                          // projection's, linear_gelu_backward, which writes dmlp_in directly)
    TensorView dmlp_in;   // (B, T, 2F) or (B, T, F)
    // Sequence parallel only (null otherwise; header comment):
    TensorView gathered;  // (B, T, C) a norm output all-gathered to full rows
    TensorView reduced;   // (N/S, C) a reduce-scattered sum: o, the MLP output, dnorm1, dnorm2
    // tmp also holds, in the backward, the all-gathered d x_out and d x_mid.
};

// Sequence parallel's moves of the residual stream's rows (header comment), given by the caller
// (the trainer: NCCL on the device's tensor-parallel stream, or in stream order).
struct TensorParallelRows {
    // K: the rows move in K chunks, and the layout cuts each chunk over the ranks (header
    // comment); K S divides N (the model checks). 1 without overlap (and by default with it).
    int chunks = 1;
    // One chunk, begun at the call: gather(out, in) all-gathers the ranks' (n, C) rows `in` into
    // `out` (S n, C) in rank order; scatter(out, in) sums the partial (S n, C) `in` over the group
    // and leaves rank r's rows [r n, (r+1) n) in (n, C) `out`. A move reads `in` as the compute
    // stream has it at the call and may still run when the call returns: `in` stays unwritten,
    // and `out` unread, until wait(ticket) for the ticket returned (or a later one).
    using Move = std::function<int(TensorView out, ConstTensorView in)>;
    Move gather, scatter;
    // CUDA: the SMs the block's GEMMs plan for while moves run beside them (CudaState::
    // gemm_sm_target: the device's less those the collectives hold); 0: all.
    int gemm_sms = 0;
    // Compute work enqueued after the call sees the result of move `ticket` and every move
    // begun before it.
    std::function<void(int ticket)> wait;
};

// Per-batch inputs every block reads.
struct BlockInputs {
    ConstTensorView docs;       // (B, T) i32 document ids, or null (no per-document mask)
    ConstTensorView positions;  // (B, T) i32 RoPE positions, or null (0..T-1)
    ConstTensorView rope_cos;   // (P, R/2) f32, RoPE families
    ConstTensorView rope_sin;
    // Tensor parallel: sums a (B, T, C) partial tensor over the group in place (block.h header);
    // null for one rank.
    const std::function<void(TensorView)>* tp_sum = nullptr;
    // Sequence parallel (header comment): the moves of the residual stream's rows. Null without
    // it; set only with tp_sum.
    const TensorParallelRows* tp_rows = nullptr;
};

// Row c of K equal row blocks of v seen as (rows, width): its first dimension cut into K parts
// (K divides it; checked), the rest kept.
template <bool K>
TensorViewT<K> row_chunk(const TensorViewT<K>& v, int64_t c, int64_t chunks) {
    const int64_t n = v.dim(0) * (v.rank() > 2 ? v.dim(1) : 1);
    const int64_t w = v.numel() / (n == 0 ? 1 : n);
    LATHE_CHECK(n % chunks == 0, "row_chunk: {} rows of {} in {} chunks", n, v.to_string(), chunks);
    return v.reshape(Shape{n, w}).slice(c * (n / chunks), (c + 1) * (n / chunks));
}

// Whole-tensor moves of sequence parallel (header comment), each chunk moved and waited for:
// tp_gather_rows all-gathers the rank's (N/S, C) rows into the full (N, C) (or (B, T, C)) `full`;
// tp_scatter_rows sums the partial full-row `full` over the group and leaves the rank's rows in
// `rows`. The _start forms begin every chunk and return the ticket to wait for.
int tp_gather_rows_start(const TensorParallelRows& t, TensorView full, ConstTensorView rows);
int tp_scatter_rows_start(const TensorParallelRows& t, TensorView rows, ConstTensorView full);
void tp_gather_rows(const TensorParallelRows& t, TensorView full, ConstTensorView rows);
void tp_scatter_rows(const TensorParallelRows& t, TensorView rows, ConstTensorView full);

// The shape of a tensor of the residual stream (C wide) for a (B, T) batch whose rows are cut
// over S sequence-parallel ranks: (B, T, C) for S = 1, else this rank's (B T / S, C) (S divides
// B T; checked by the model and refused by the trainer).
inline Shape block_rows_shape(int64_t B, int64_t T, int64_t C, int64_t S) {
    return S == 1 ? Shape{B, T, C} : Shape{B * T / S, C};
}

// Calls f(name, member, dtype, shape) for each saved tensor a block of `config` needs for a
// (B, T) batch with activations of dtype `a` (f32 on the CPU, bf16 on CUDA; statistics are f32),
// x_out excluded (it is the next block's x_in), with the residual stream's rows cut over S
// sequence-parallel ranks (1: none; header comment). Members a config does not use (LayerNorm
// means for RMSNorm, x_mid for the parallel residual) are not listed.
template <typename F>
void block_acts_for_each(const ModelConfig& c, int64_t B, int64_t T, int64_t S, DType a, F&& f) {
    const int64_t C = c.hidden_size, H = c.num_heads, Hkv = c.num_kv_heads, D = c.head_dim;
    const int64_t F_ = c.intermediate_size, up = c.mlp == MlpKind::kSwiGlu ? 2 * F_ : F_;
    const bool ln = c.norm == NormKind::kLayerNorm;
    const Shape rows = block_rows_shape(B, T, C, S), stats{B * T / S};
    f("x", &BlockActs::x_in, a, rows);
    f("ln1_out", &BlockActs::ln1_out, a, rows);
    if (ln) f("ln1_mean", &BlockActs::ln1_mean, DType::kF32, stats);
    f("ln1_rstd", &BlockActs::ln1_rstd, DType::kF32, stats);
    f("qkv", &BlockActs::qkv, a, Shape{B, T, H + 2 * Hkv, D});
    f("att", &BlockActs::att, a, Shape{B, T, H, D});
    f("att_lse", &BlockActs::lse, DType::kF32, Shape{B, H, T});
    if (!c.parallel_residual) f("x_mid", &BlockActs::x_mid, a, rows);
    f("ln2_out", &BlockActs::ln2_out, a, rows);
    if (ln) f("ln2_mean", &BlockActs::ln2_mean, DType::kF32, stats);
    f("ln2_rstd", &BlockActs::ln2_rstd, DType::kF32, stats);
    f("mlp_in", &BlockActs::mlp_in, a, Shape{B, T, up});
    f("mlp_act", &BlockActs::mlp_act, a, Shape{B, T, F_});
}
template <typename F>
void block_acts_for_each(const ModelConfig& c, int64_t B, int64_t T, DType a, F&& f) {
    block_acts_for_each(c, B, T, 1, a, std::forward<F>(f));
}

// The same for BlockScratch (every member the config uses: dmlp_act for SwiGLU only; gathered
// and reduced with S > 1 only).
template <typename F>
void block_scratch_for_each(const ModelConfig& c, int64_t B, int64_t T, int64_t S, DType a, F&& f) {
    const int64_t C = c.hidden_size, H = c.num_heads, Hkv = c.num_kv_heads, D = c.head_dim;
    const int64_t F_ = c.intermediate_size, up = c.mlp == MlpKind::kSwiGlu ? 2 * F_ : F_;
    f("block.tmp", &BlockScratch::tmp, a, Shape{B, T, C});
    f("block.dnorm1", &BlockScratch::dnorm1, a, Shape{B, T, C});
    f("block.dnorm2", &BlockScratch::dnorm2, a, Shape{B, T, C});
    f("block.datt", &BlockScratch::datt, a, Shape{B, T, H, D});
    f("block.dqkv", &BlockScratch::dqkv, a, Shape{B, T, H + 2 * Hkv, D});
    if (c.mlp == MlpKind::kSwiGlu) f("block.dmlp_act", &BlockScratch::dmlp_act, a, Shape{B, T, F_});
    f("block.dmlp_in", &BlockScratch::dmlp_in, a, Shape{B, T, up});
    if (S > 1) {
        f("block.gathered", &BlockScratch::gathered, a, Shape{B, T, C});
        f("block.reduced", &BlockScratch::reduced, a, block_rows_shape(B, T, C, S));
    }
}
template <typename F>
void block_scratch_for_each(const ModelConfig& c, int64_t B, int64_t T, DType a, F&& f) {
    block_scratch_for_each(c, B, T, 1, a, std::forward<F>(f));
}

// The FP8 buffers of one layer's linears (ops/linear.h), indexed by Fp8Linear (model/fp8_state.h:
// q, k, v, attention output, MLP up, MLP down); null for a linear whose role is native. The
// caller owns them and casts the weights into them once per optimizer step
// (linear_fp8_cast_weight). The overloads without it run every role's spec without buffers,
// which an fp8 role on CUDA refuses (ops/linear.h).
struct BlockFp8 {
    std::array<const Fp8LinearBuffers*, kFp8LinearsPerLayer> linear{};
    // kFp8Blockwise linears' buffers (ops/fp8_blockwise.h), the same way.
    std::array<const Fp8BlockwiseBuffers*, kFp8LinearsPerLayer> block{};
};

// Runs one block forward, filling `acts` (x_in is read, x_out written). Deterministic when the
// ops are (ops/*.h).
// `layer` picks the layer's attention window (ModelConfig::window); `precision` gives each
// linear the spec of its role (model/precision_policy.h).
void block_forward(const ModelConfig& config, const PrecisionPolicy& precision, int layer,
                   const BlockWeights& w, const BlockActs& acts, const BlockScratch& scratch,
                   const BlockInputs& in, const Context& ctx);
void block_forward(const ModelConfig& config, const PrecisionPolicy& precision, int layer,
                   const BlockWeights& w, const BlockActs& acts, const BlockScratch& scratch,
                   const BlockInputs& in, const Context& ctx, const BlockFp8& fp8);

// Runs one block backward from the activations its forward saved. `dres` (B, T, C) holds d x_out
// on entry and d x_in on return; parameter gradients accumulate (+=) into `g`.
void block_backward(const ModelConfig& config, const PrecisionPolicy& precision, int layer,
                    const BlockWeights& w, const BlockGrads& g, const BlockActs& acts,
                    const BlockScratch& scratch, const BlockInputs& in, TensorView dres,
                    const Context& ctx);
void block_backward(const ModelConfig& config, const PrecisionPolicy& precision, int layer,
                    const BlockWeights& w, const BlockGrads& g, const BlockActs& acts,
                    const BlockScratch& scratch, const BlockInputs& in, TensorView dres,
                    const Context& ctx, const BlockFp8& fp8);

// The attention softmax scale every block uses: 1 / sqrt(head_dim), in fp32. (The model builds
// the CUDA attention graphs of its shape with it, so both must agree.)
float block_attention_scale(const ModelConfig& config);

// Norm dispatch shared with the final norm: RMSNorm ignores `bias` and `mean`.
void block_norm_forward(const ModelConfig& config, TensorView y, TensorView mean, TensorView rstd,
                        ConstTensorView x, ConstTensorView weight, ConstTensorView bias,
                        const Context& ctx, TensorView y_amax = {});
// dx per `mode`; dweight, dbias accumulate.
void block_norm_backward(const ModelConfig& config, TensorView dx, TensorView dweight,
                         TensorView dbias, ConstTensorView dy, ConstTensorView x,
                         ConstTensorView weight, ConstTensorView mean, ConstTensorView rstd,
                         GradMode mode, const Context& ctx);

}  // namespace lathe
