#include "model/block_recompute.h"

#include "ops/gelu.h"
#include "ops/swiglu.h"

namespace lathe {

namespace {

// Whether block_forward's mlp_act is the activation op applied to the saved mlp_in.
bool activation_is_separate(const ModelConfig& c, Backend backend) {
    return c.mlp == MlpKind::kSwiGlu || backend != Backend::kCuda || c.gelu != GeluKind::kTanh;
}

}  // namespace

bool block_selective_recomputes(const ModelConfig& c, Backend backend,
                                TensorView BlockActs::*member) {
    return member == &BlockActs::ln1_out || member == &BlockActs::ln2_out ||
           (member == &BlockActs::mlp_act && activation_is_separate(c, backend));
}

void block_recompute_selective(const ModelConfig& c, const BlockWeights& w, const BlockActs& a,
                               const Context& ctx) {
    // The same calls block_forward makes for these tensors (model/block.cpp). Should the forward
    // ever compute one of them differently, this must follow, or the bitwise tests of recompute
    // (model_test.cpp, model_gpu_test.cu) fail. Under sequence parallel (block.h) the norms
    // refill the rank's rows from its rows of x_in and x_mid, with no collective: the backward
    // gathers the full rows itself, the same calls on every rank.
    block_norm_forward(c, a.ln1_out, a.ln1_mean, a.ln1_rstd, a.x_in, w.norm1_w, w.norm1_b, ctx);
    block_norm_forward(c, a.ln2_out, a.ln2_mean, a.ln2_rstd, c.parallel_residual ? a.x_in : a.x_mid,
                       w.norm2_w, w.norm2_b, ctx);
    if (!activation_is_separate(c, ctx.backend)) return;
    if (c.mlp == MlpKind::kSwiGlu)
        swiglu_forward(a.mlp_act, a.mlp_in, ctx);
    else
        gelu_forward(a.mlp_act, a.mlp_in, c.gelu, ctx);
}

}  // namespace lathe
