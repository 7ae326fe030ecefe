#include "model/block.h"

#include <cmath>
#include <vector>

#include "core/check.h"

#include "ops/attention.h"
#include "ops/cuda/cuda_state.h"
#include "ops/layernorm.h"
#include "ops/linear.h"
#include "ops/residual.h"
#include "ops/rmsnorm.h"
#include "ops/rope.h"
#include "ops/swiglu.h"

namespace lathe {

namespace {

// (B, T, H, D) seen as (B, T, H*D).
template <bool K>
TensorViewT<K> flat_heads(const TensorViewT<K>& v) {
    return v.reshape(Shape{v.dim(0), v.dim(1), v.dim(2) * v.dim(3)});
}

// TensorParallelRows::gemm_sms on ctx's CUDA state for the life of the object (a block's).
class GemmSmTarget {
public:
    GemmSmTarget(const Context& ctx, const TensorParallelRows* rows)
        : state_(rows != nullptr && rows->gemm_sms > 0 && ctx.backend == Backend::kCuda ? ctx.cuda
                                                                                        : nullptr) {
        if (state_ != nullptr) state_->set_gemm_sm_target(rows->gemm_sms);
    }
    ~GemmSmTarget() {
        if (state_ != nullptr) state_->set_gemm_sm_target(0);
    }
    GemmSmTarget(const GemmSmTarget&) = delete;
    GemmSmTarget& operator=(const GemmSmTarget&) = delete;

private:
    CudaState* state_;
};

}  // namespace

float block_attention_scale(const ModelConfig& c) {
    return float(1.0 / std::sqrt(double(c.head_dim)));
}

void block_norm_forward(const ModelConfig& c, TensorView y, TensorView mean, TensorView rstd,
                        ConstTensorView x, ConstTensorView weight, ConstTensorView bias,
                        const Context& ctx, TensorView y_amax) {
    if (c.norm == NormKind::kRmsNorm) {
        rmsnorm_forward(y, rstd, x, weight, float(c.norm_eps), ctx, y_amax);
        return;
    }
    LATHE_CHECK(y_amax.is_null(), "block_norm_forward: LayerNorm computes no amax of its output");
    layernorm_forward(y, mean, rstd, x, weight, bias, float(c.norm_eps), ctx);
}

void block_norm_backward(const ModelConfig& c, TensorView dx, TensorView dweight, TensorView dbias,
                         ConstTensorView dy, ConstTensorView x, ConstTensorView weight,
                         ConstTensorView mean, ConstTensorView rstd, GradMode mode,
                         const Context& ctx) {
    if (c.norm == NormKind::kRmsNorm)
        rmsnorm_backward(dx, dweight, dy, x, weight, rstd, mode, ctx);
    else
        layernorm_backward(dx, dweight, dbias, dy, x, weight, mean, rstd, mode, ctx);
}

namespace {

// The spec of one of the block's linear calls: its role's, with the layer's FP8 buffers of that
// linear (null for a native role, which does not read them).
LinearSpec block_spec(const PrecisionPolicy& p, const BlockFp8& f8, Fp8Linear l) {
    LinearSpec spec = p.spec(fp8_linear_role(l));
    spec.fp8 = f8.linear[size_t(l)];
    spec.fp8_block = f8.block[size_t(l)];
    return spec;
}

// Where the producer of linear l's input writes that input's amax (LinearSpec::x_amax): the
// linear's own x slot (Fp8LinearBuffers::scalars + 0; the dy slot, 16, for LinearSpec::dy_amax),
// for a per-tensor linear with current scaling; null otherwise (delayed scaling reports the amax
// from its one cast pass; blockwise scales per block).
TensorView producer_amax(const BlockFp8& f8, Fp8Linear l, int slot = 0) {
    const Fp8LinearBuffers* b = f8.linear[size_t(l)];
    if (b == nullptr || b->delayed_scale != nullptr) return {};
    return TensorView(b->scalars + slot, DType::kF32, Shape{1}, Device::kCuda);
}

bool native(const LinearSpec& l) {
    return l.precision == LinearPrecision::kNative;
}

// The attention and RoPE backward: dqkv from d att.
void attention_rope_backward(const ModelConfig& c, int layer, const BlockActs& a,
                             const BlockScratch& s, const BlockInputs& in, const Context& ctx) {
    attention_backward_qkv(s.dqkv, s.datt, a.qkv, a.att, a.lse, in.docs, c.window(layer),
                           block_attention_scale(c), ctx);
    if (c.position == PositionKind::kRope)
        rope_qkv_backward(s.dqkv, c.num_heads + c.num_kv_heads, in.positions, in.rope_cos,
                          in.rope_sin, ctx);
}

}  // namespace

void block_forward(const ModelConfig& c, const PrecisionPolicy& p, int layer, const BlockWeights& w,
                   const BlockActs& a, const BlockScratch& s, const BlockInputs& in,
                   const Context& ctx) {
    block_forward(c, p, layer, w, a, s, in, ctx, BlockFp8{});
}

void block_backward(const ModelConfig& c, const PrecisionPolicy& p, int layer,
                    const BlockWeights& w, const BlockGrads& g, const BlockActs& a,
                    const BlockScratch& s, const BlockInputs& in, TensorView dres,
                    const Context& ctx) {
    block_backward(c, p, layer, w, g, a, s, in, dres, ctx, BlockFp8{});
}

void block_forward(const ModelConfig& c, const PrecisionPolicy& p, int layer, const BlockWeights& w,
                   const BlockActs& a, const BlockScratch& s, const BlockInputs& in,
                   const Context& ctx, const BlockFp8& f8) {
    LinearSpec qkv = block_spec(p, f8, Fp8Linear::kQkv);
    const LinearSpec out = block_spec(p, f8, Fp8Linear::kAttnOut);
    LinearSpec up = block_spec(p, f8, Fp8Linear::kMlpUp);
    LinearSpec down = block_spec(p, f8, Fp8Linear::kMlpDown);
    // FP8 with current scaling: the kernels that write the linears' inputs compute their amax
    // (RMSNorm for the q, k, v projection and for the MLP's up projection; SwiGLU for the down
    // projection), so each cast reads its input once: per cast 2 bytes an element instead of 4
    // (amax pass + cast), for 1 byte an element the kernel adds nothing to read. A producer
    // writing the fp8 codes itself (a scale known before the kernel: delayed scaling) would save
    // that read too, but a linear needs the codes and their transpose (the weight gradient's
    // operand, 32 x 32 tiles of the input), which a row kernel cannot write without a second
    // pass over the tile; delayed scaling keeps its single-pass cast.
    const bool rms = c.norm == NormKind::kRmsNorm;
    const TensorView ln1_amax = rms ? producer_amax(f8, Fp8Linear::kQkv) : TensorView();
    const TensorView ln2_amax = rms ? producer_amax(f8, Fp8Linear::kMlpUp) : TensorView();
    const TensorView act_amax =
        c.mlp == MlpKind::kSwiGlu ? producer_amax(f8, Fp8Linear::kMlpDown) : TensorView();
    if (!ln1_amax.is_null()) qkv.x_amax = ln1_amax.as<float>();
    if (!ln2_amax.is_null()) up.x_amax = ln2_amax.as<float>();
    if (!act_amax.is_null()) down.x_amax = act_amax.as<float>();
    // Sequence parallel (block.h header): norm1 runs on the rank's rows, the projections on
    // the gathered full rows, chunk by chunk as the chunks arrive. (The norms' amax would be of
    // the rank's rows alone: not given; the trainer runs no fp8 under tensor parallel.)
    const TensorParallelRows* rows = in.tp_rows;
    LATHE_CHECK(rows == nullptr || (in.tp_sum != nullptr && ln1_amax.is_null() &&
                                    ln2_amax.is_null() && rows->chunks >= 1),
                "sequence parallel: a tensor-parallel block with the row moves and no norm amax");
    const int K = rows != nullptr ? rows->chunks : 1;
    // The fp8 casts of a linear's input write its codes for the whole (N, I) input the backward
    // reads: a chunk's would land at the start of those buffers.
    LATHE_CHECK(K == 1 || (native(qkv) && native(out) && native(up) && native(down)),
                "sequence parallel: row chunks ({}) with fp8 linears", K);
    const GemmSmTarget sms(ctx, rows);
    // Begins the gather of every chunk of the norm output `ln` into s.gathered.
    auto gather_chunks = [&](ConstTensorView ln) {
        std::vector<int> got(static_cast<size_t>(K));
        for (int k = 0; k < K; ++k)
            got[size_t(k)] = rows->gather(row_chunk(s.gathered, k, K), row_chunk(ln, k, K));
        return got;
    };
    // Attention branch.
    block_norm_forward(c, a.ln1_out, a.ln1_mean, a.ln1_rstd, a.x_in, w.norm1_w, w.norm1_b, ctx,
                       ln1_amax);
    // q, k, v: one GEMM into the packed buffer (block.h header).
    if (rows != nullptr) {
        const std::vector<int> got = gather_chunks(a.ln1_out);
        for (int k = 0; k < K; ++k) {
            rows->wait(got[size_t(k)]);
            linear_forward(row_chunk(a.qkv, k, K), row_chunk(s.gathered, k, K), w.wqkv, w.bqkv, ctx,
                           qkv);
        }
    } else {
        linear_forward(flat_heads(a.qkv), a.ln1_out, w.wqkv, w.bqkv, ctx, qkv);
    }
    if (c.position == PositionKind::kRope)
        rope_qkv_forward(a.qkv, c.num_heads + c.num_kv_heads, in.positions, in.rope_cos,
                         in.rope_sin, ctx);
    attention_forward_qkv(a.att, a.lse, a.qkv, in.docs, c.window(layer), block_attention_scale(c),
                          ctx);

    // Residual and MLP branch.
    const std::function<void(TensorView)>* tp = in.tp_sum;
    LATHE_CHECK(tp == nullptr || !c.parallel_residual,
                "tensor parallel runs blocks with the sequential residual");
    // The MLP of a set of rows: h -> y (pre and act: the same rows of mlp_in and mlp_act).
    auto mlp = [&](TensorView y, TensorView pre, TensorView act, ConstTensorView h) {
        if (c.mlp == MlpKind::kSwiGlu) {
            linear_forward(pre, h, w.w_up, w.b_up, ctx, up);
            swiglu_forward(act, pre, ctx);
        } else {
            linear_gelu_forward(act, pre, h, w.w_up, w.b_up, c.gelu, ctx, up);
        }
        linear_forward(y, act, w.w_down, w.b_down, ctx, down);
    };
    if (tp != nullptr) {
        // o, then the MLP output: this rank's partial sums, summed before the residual adds
        // (sequence parallel: reduce-scattered to the rank's rows chunk by chunk as each is
        // computed, the adds and norm2 on the rank's rows, and the MLP reading norm2's output
        // gathered to full rows again).
        ConstTensorView o = s.tmp;
        if (rows != nullptr) {
            int last = 0;
            for (int k = 0; k < K; ++k) {
                const TensorView part = row_chunk(s.tmp, k, K);
                linear_forward(part, row_chunk(a.att, k, K), w.wo, w.bo, ctx, out);
                last = rows->scatter(row_chunk(s.reduced, k, K), part);
            }
            rows->wait(last);
            o = s.reduced;
        } else {
            linear_forward(s.tmp, flat_heads(a.att), w.wo, w.bo, ctx, out);
            (*tp)(s.tmp);
        }
        if (c.norm == NormKind::kRmsNorm)
            rmsnorm_residual_forward(a.x_mid, a.ln2_out, a.ln2_rstd, a.x_in, o, w.norm2_w,
                                     float(c.norm_eps), ctx);
        else
            layernorm_residual_forward(a.x_mid, a.ln2_out, a.ln2_mean, a.ln2_rstd, a.x_in, o,
                                       w.norm2_w, w.norm2_b, float(c.norm_eps), ctx);
        if (rows != nullptr) {
            const std::vector<int> got = gather_chunks(a.ln2_out);
            int last = 0;
            for (int k = 0; k < K; ++k) {
                rows->wait(got[size_t(k)]);
                const TensorView part = row_chunk(s.tmp, k, K);
                mlp(part, row_chunk(a.mlp_in, k, K), row_chunk(a.mlp_act, k, K),
                    row_chunk(s.gathered, k, K));
                last = rows->scatter(row_chunk(s.reduced, k, K), part);
            }
            rows->wait(last);
            residual_forward(a.x_out, a.x_mid, s.reduced, ctx);
        } else {
            mlp(s.tmp, a.mlp_in, a.mlp_act, a.ln2_out);
            (*tp)(s.tmp);
            residual_forward(a.x_out, a.x_mid, s.tmp, ctx);
        }
        return;
    }
    if (c.parallel_residual) {
        // x_out = x + o in the output projection's GEMM (the residual read as its C).
        linear_residual_forward(a.x_out, flat_heads(a.att), w.wo, w.bo, a.x_in, ctx, out);
        block_norm_forward(c, a.ln2_out, a.ln2_mean, a.ln2_rstd, a.x_in, w.norm2_w, w.norm2_b, ctx,
                           ln2_amax);
    } else {
        // x_mid = x + o and norm2(x_mid) in one op (one kernel on CUDA).
        linear_forward(s.tmp, flat_heads(a.att), w.wo, w.bo, ctx, out);
        if (c.norm == NormKind::kRmsNorm)
            rmsnorm_residual_forward(a.x_mid, a.ln2_out, a.ln2_rstd, a.x_in, s.tmp, w.norm2_w,
                                     float(c.norm_eps), ctx, ln2_amax);
        else
            layernorm_residual_forward(a.x_mid, a.ln2_out, a.ln2_mean, a.ln2_rstd, a.x_in, s.tmp,
                                       w.norm2_w, w.norm2_b, float(c.norm_eps), ctx);
    }
    if (c.mlp == MlpKind::kSwiGlu) {
        linear_forward(a.mlp_in, a.ln2_out, w.w_up, w.b_up, ctx, up);
        swiglu_forward(a.mlp_act, a.mlp_in, ctx, act_amax);
    } else {
        // The up projection with its GELU (one cuBLASLt call on CUDA for the tanh form; mlp_in
        // is kept as the pre-activation either way).
        linear_gelu_forward(a.mlp_act, a.mlp_in, a.ln2_out, w.w_up, w.b_up, c.gelu, ctx, up);
    }
    if (c.parallel_residual) {
        // x_out already holds x + o: the MLP output joins it through the temporary.
        linear_forward(s.tmp, a.mlp_act, w.w_down, w.b_down, ctx, down);
        residual_forward(a.x_out, a.x_out, s.tmp, ctx);
    } else {
        // x_out = x_mid + mlp in the down projection's GEMM (x_mid read as its C).
        linear_residual_forward(a.x_out, a.mlp_act, w.w_down, w.b_down, a.x_mid, ctx, down);
    }
}

namespace {

// block_backward under sequence parallel (block.h header, "Overlap"): the moves begun as early
// as their inputs allow, the input gradients first and their reduce-scatters under the weight
// gradients. Sequential residual (checked by the caller).
void block_backward_rows(const ModelConfig& c, const BlockWeights& w, const BlockGrads& g,
                         const BlockActs& a, const BlockScratch& s, const BlockInputs& in,
                         TensorView dres, const Context& ctx, const BlockFp8& f8, int layer,
                         const LinearSpec& qkv, const LinearSpec& out, LinearSpec up,
                         const LinearSpec& down) {
    const TensorParallelRows& t = *in.tp_rows;
    const GemmSmTarget sms(ctx, &t);
    constexpr GradMode kOverwrite = GradMode::kOverwrite;
    // MLP branch: d out to full rows (tmp), then norm2's output gathered (for the up
    // projection) beside the down projection's input gradient and the activation's backward.
    t.wait(tp_gather_rows_start(t, s.tmp, dres));
    const ConstTensorView dout = s.tmp;
    const int h2_ready = tp_gather_rows_start(t, s.gathered, a.ln2_out);
    const ConstTensorView h2 = s.gathered;
    int dnorm2_ready = 0;
    if (c.mlp == MlpKind::kSwiGlu) {
        linear_backward(s.dmlp_act, {}, {}, dout, a.mlp_act, w.w_down, kOverwrite, ctx, down);
        const TensorView dmlp_in_amax = producer_amax(f8, Fp8Linear::kMlpUp, 16);
        if (!dmlp_in_amax.is_null()) up.dy_amax = dmlp_in_amax.as<float>();
        swiglu_backward(s.dmlp_in, s.dmlp_act, a.mlp_in, ctx, dmlp_in_amax);
        t.wait(h2_ready);
        linear_backward(s.dnorm2, {}, {}, s.dmlp_in, h2, w.w_up, kOverwrite, ctx, up);
        dnorm2_ready = tp_scatter_rows_start(t, s.reduced, s.dnorm2);
        linear_backward({}, g.w_up, g.b_up, s.dmlp_in, h2, w.w_up, kOverwrite, ctx, up);
        linear_backward({}, g.w_down, g.b_down, dout, a.mlp_act, w.w_down, kOverwrite, ctx, down);
    } else {
        // The GELU backward is fused into the down projection's (block_backward).
        linear_gelu_backward(s.dmlp_in, g.b_up, g.w_down, g.b_down, dout, a.mlp_act, a.mlp_in,
                             w.w_down, c.gelu, ctx, down);
        t.wait(h2_ready);
        linear_backward(s.dnorm2, {}, {}, s.dmlp_in, h2, w.w_up, kOverwrite, ctx, up);
        dnorm2_ready = tp_scatter_rows_start(t, s.reduced, s.dnorm2);
        linear_backward({}, g.w_up, {}, s.dmlp_in, h2, w.w_up, kOverwrite, ctx, up);
    }
    t.wait(dnorm2_ready);
    block_norm_backward(c, dres, g.norm2_w, g.norm2_b, s.reduced, a.x_mid, w.norm2_w, a.ln2_mean,
                        a.ln2_rstd, GradMode::kAccumulate, ctx);

    // Attention branch: d x_mid to full rows, norm1's output gathered beside the attention
    // output's input gradient and the attention backward.
    t.wait(tp_gather_rows_start(t, s.tmp, dres));
    const ConstTensorView dmid = s.tmp;
    const int h1_ready = tp_gather_rows_start(t, s.gathered, a.ln1_out);
    linear_backward(flat_heads(s.datt), {}, {}, dmid, flat_heads(a.att), w.wo, kOverwrite, ctx,
                    out);
    attention_rope_backward(c, layer, a, s, in, ctx);
    t.wait(h1_ready);
    const ConstTensorView h1 = s.gathered;
    linear_backward(s.dnorm1, {}, {}, flat_heads(s.dqkv), h1, w.wqkv, kOverwrite, ctx, qkv);
    const int dnorm1_ready = tp_scatter_rows_start(t, s.reduced, s.dnorm1);
    linear_backward({}, g.wqkv, g.bqkv, flat_heads(s.dqkv), h1, w.wqkv, kOverwrite, ctx, qkv);
    linear_backward({}, g.wo, g.bo, dmid, flat_heads(a.att), w.wo, kOverwrite, ctx, out);
    t.wait(dnorm1_ready);
    block_norm_backward(c, dres, g.norm1_w, g.norm1_b, s.reduced, a.x_in, w.norm1_w, a.ln1_mean,
                        a.ln1_rstd, GradMode::kAccumulate, ctx);
}

}  // namespace

void block_backward(const ModelConfig& c, const PrecisionPolicy& p, int layer,
                    const BlockWeights& w, const BlockGrads& g, const BlockActs& a,
                    const BlockScratch& s, const BlockInputs& in, TensorView dres,
                    const Context& ctx, const BlockFp8& f8) {
    LinearSpec qkv = block_spec(p, f8, Fp8Linear::kQkv);
    LinearSpec out = block_spec(p, f8, Fp8Linear::kAttnOut);
    LinearSpec up = block_spec(p, f8, Fp8Linear::kMlpUp);
    LinearSpec down = block_spec(p, f8, Fp8Linear::kMlpDown);
    // Each projection's weight gradient comes from one GEMM a micro-batch: = or += (BlockGrads).
    for (LinearSpec* spec : {&qkv, &out, &up, &down}) spec->dweight_mode = g.weight_mode;
    if (in.tp_rows != nullptr) {
        LATHE_CHECK(in.tp_sum != nullptr && !c.parallel_residual,
                    "sequence parallel: a tensor-parallel block (sequential residual) with the "
                    "row moves");
        block_backward_rows(c, w, g, a, s, in, dres, ctx, f8, layer, qkv, out, up, down);
        return;
    }
    // Tensor parallel: each rank's norm-output gradient is its shard's part of the sum (block.h
    // header), summed in place before the norm's backward.
    auto summed = [&](TensorView partial) -> ConstTensorView {
        if (in.tp_sum != nullptr) (*in.tp_sum)(partial);
        return partial;
    };
    // MLP branch: dres is d out, which the MLP output received unchanged.
    if (c.mlp == MlpKind::kSwiGlu) {
        linear_backward(s.dmlp_act, g.w_down, g.b_down, dres, a.mlp_act, w.w_down,
                        GradMode::kOverwrite, ctx, down);
        // FP8 with current scaling: SwiGLU's backward computes the amax of d mlp_in (the up
        // projection's dy, the layer's widest gradient) into that linear's dy slot as it writes
        // it, so the dy cast reads it once.
        const TensorView dmlp_in_amax = producer_amax(f8, Fp8Linear::kMlpUp, 16);
        if (!dmlp_in_amax.is_null()) up.dy_amax = dmlp_in_amax.as<float>();
        swiglu_backward(s.dmlp_in, s.dmlp_act, a.mlp_in, ctx, dmlp_in_amax);
        linear_backward(s.dnorm2, g.w_up, g.b_up, s.dmlp_in, a.ln2_out, w.w_up,
                        GradMode::kOverwrite, ctx, up);
    } else {
        // The down projection's backward with the GELU backward fused, which also gives the up
        // projection's bias gradient (d mlp_in summed over rows); so the up projection's own
        // backward has no bias gradient left to do.
        linear_gelu_backward(s.dmlp_in, g.b_up, g.w_down, g.b_down, dres, a.mlp_act, a.mlp_in,
                             w.w_down, c.gelu, ctx, down);
        linear_backward(s.dnorm2, g.w_up, TensorView(), s.dmlp_in, a.ln2_out, w.w_up,
                        GradMode::kOverwrite, ctx, up);
    }
    const ConstTensorView dnorm2 = summed(s.dnorm2);
    // Sequential: norm2 read x_mid, so its input gradient joins dres now, which then is d x_mid,
    // what the attention output received. Parallel: dres stays d out (the attention output
    // received it too), and norm2's gradient joins at the end, once dres is no longer read.
    if (!c.parallel_residual)
        block_norm_backward(c, dres, g.norm2_w, g.norm2_b, dnorm2, a.x_mid, w.norm2_w, a.ln2_mean,
                            a.ln2_rstd, GradMode::kAccumulate, ctx);

    // Attention branch.
    linear_backward(flat_heads(s.datt), g.wo, g.bo, dres, flat_heads(a.att), w.wo,
                    GradMode::kOverwrite, ctx, out);
    attention_rope_backward(c, layer, a, s, in, ctx);
    linear_backward(s.dnorm1, g.wqkv, g.bqkv, flat_heads(s.dqkv), a.ln1_out, w.wqkv,
                    GradMode::kOverwrite, ctx, qkv);
    const ConstTensorView dnorm1 = summed(s.dnorm1);
    block_norm_backward(c, dres, g.norm1_w, g.norm1_b, dnorm1, a.x_in, w.norm1_w, a.ln1_mean,
                        a.ln1_rstd, GradMode::kAccumulate, ctx);
    if (c.parallel_residual)
        block_norm_backward(c, dres, g.norm2_w, g.norm2_b, dnorm2, a.x_in, w.norm2_w, a.ln2_mean,
                            a.ln2_rstd, GradMode::kAccumulate, ctx);
}

int tp_gather_rows_start(const TensorParallelRows& t, TensorView full, ConstTensorView rows) {
    int ticket = 0;
    for (int k = 0; k < t.chunks; ++k)
        ticket = t.gather(row_chunk(full, k, t.chunks), row_chunk(rows, k, t.chunks));
    return ticket;
}

int tp_scatter_rows_start(const TensorParallelRows& t, TensorView rows, ConstTensorView full) {
    int ticket = 0;
    for (int k = 0; k < t.chunks; ++k)
        ticket = t.scatter(row_chunk(rows, k, t.chunks), row_chunk(full, k, t.chunks));
    return ticket;
}

void tp_gather_rows(const TensorParallelRows& t, TensorView full, ConstTensorView rows) {
    t.wait(tp_gather_rows_start(t, full, rows));
}

void tp_scatter_rows(const TensorParallelRows& t, TensorView rows, ConstTensorView full) {
    t.wait(tp_scatter_rows_start(t, rows, full));
}

}  // namespace lathe
