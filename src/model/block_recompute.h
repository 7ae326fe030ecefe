#pragma once
// Selective activation recompute (train.recompute: selective, model/memory_plan.h): a layer keeps
// the outputs of its GEMMs and of attention, and the backward gets the cheap elementwise outputs
// (the two norms' outputs and the MLP activation's) back by running those ops again.
//
// The block's forward (model/block.h) stays as it is; with selective recompute the model points
// ln1_out, ln2_out and mlp_act of every layer at one shared set of buffers, which the forward of
// each layer overwrites, and calls block_recompute_selective(layer l) just before
// block_backward(layer l).

#include "model/block.h"
#include "model/model_config.h"
#include "ops/context.h"

namespace lathe {

// True for the BlockActs members selective recompute does not keep per layer, for a model of
// `config` computing on `backend`: ln1_out and ln2_out always (the norms' mean and rstd are
// kept: B*T floats each), and mlp_act when the forward computes it from mlp_in by the activation
// op alone, so that running that op again gives its bits: SwiGLU, and GELU except the tanh GELU
// on CUDA, which the forward computes in the up projection's cuBLASLt epilogue from the fp32
// accumulator, before mlp_in is rounded to bf16 (ops/linear.h, linear_gelu_forward); that
// mlp_act is kept per layer.
bool block_selective_recomputes(const ModelConfig& config, Backend backend,
                                TensorView BlockActs::*member);

// Refills what block_selective_recomputes names of one layer from what the layer kept: ln1_out
// (norm1 of x_in), ln2_out (norm2 of x_mid, or of x_in with the parallel residual), mlp_act (the
// activation of mlp_in), with the ops, weights and inputs block_forward used, so the bits equal
// the forward's (the ops are deterministic; the fused residual + norm of the forward normalizes
// the rounded x_mid as the norm alone does). The norms' statistics are written again, with the
// same bits.
void block_recompute_selective(const ModelConfig& config, const BlockWeights& w,
                               const BlockActs& acts, const Context& ctx);

}  // namespace lathe
