#pragma once
// Which precision each linear of the model computes in (ops/linear.h, LinearPrecision), per role:
// the block schedule (model/block.cpp) hands every linear op the spec of its role, and the model
// checks the LM head's before its fused op. The default is kNative everywhere (bf16 on CUDA, f32
// on the CPU); an fp8 training recipe is a policy that marks roles fp8, run by the GEMM kernels
// the linear ops choose for it (ops/gemm_args.h). No linear op has an fp8 kernel: every backend
// stops on an fp8 role, naming it.
//
// Roles: the stacked q/k/v projection, the attention output projection, the MLP's up projection
// (gate and up stacked, for the gated MLPs), its down projection, and the LM head (the logits
// GEMMs inside lm_head_cross_entropy and Model::logits).

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "ops/linear.h"

namespace lathe {

enum class LinearRole : uint8_t { kQkv, kAttnOut, kMlpUp, kMlpDown, kLmHead };
inline constexpr size_t kLinearRoleCount = 5;

// "qkv", "attn_out", "mlp_up", "mlp_down", "lm_head".
constexpr std::string_view linear_role_name(LinearRole r) {
    switch (r) {
        case LinearRole::kQkv:
            return "qkv";
        case LinearRole::kAttnOut:
            return "attn_out";
        case LinearRole::kMlpUp:
            return "mlp_up";
        case LinearRole::kMlpDown:
            return "mlp_down";
        case LinearRole::kLmHead:
            return "lm_head";
    }
    return "?";
}

struct PrecisionPolicy {
    std::array<LinearPrecision, kLinearRoleCount> linear{};  // per LinearRole; kNative

    LinearPrecision of(LinearRole r) const { return linear[size_t(r)]; }
    void set(LinearRole r, LinearPrecision p) { linear[size_t(r)] = p; }
    // The spec the linear ops of role `r` get.
    LinearSpec spec(LinearRole r) const { return {of(r), linear_role_name(r)}; }

    bool operator==(const PrecisionPolicy&) const = default;
};

}  // namespace lathe
