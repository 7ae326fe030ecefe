#include "model/model_config.h"

#include <fmt/format.h>

#include <algorithm>

namespace lathe {

ModelConfig model_config_from_hf_common(const HfModelConfig& hf) {
    ModelConfig c;
    c.model_type = std::string(hf.model_type());
    c.vocab_size = hf.vocab_size;
    c.hidden_size = hf.hidden_size;
    c.num_layers = hf.num_hidden_layers;
    c.num_heads = hf.num_attention_heads;
    c.num_kv_heads = hf.num_key_value_heads;
    c.head_dim = hf.head_dim;
    c.intermediate_size = hf.intermediate_size;
    c.max_position_embeddings = hf.max_position_embeddings;
    c.norm = hf.uses_rms_norm() ? NormKind::kRmsNorm : NormKind::kLayerNorm;
    c.norm_eps = hf.norm_eps;
    if (hf.uses_rotary()) {
        c.position = PositionKind::kRope;
        c.rope.head_dim = hf.head_dim;
        c.rope.theta = hf.rope_theta;
        c.rope.partial_rotary_factor = hf.partial_rotary_factor;
        if (hf.rope_scaling) {
            c.rope.scaling = RopeScaling::kLlama3;
            c.rope.factor = hf.rope_scaling->factor;
            c.rope.low_freq_factor = hf.rope_scaling->low_freq_factor;
            c.rope.high_freq_factor = hf.rope_scaling->high_freq_factor;
            c.rope.original_max_position_embeddings =
                hf.rope_scaling->original_max_position_embeddings;
        }
    } else {
        c.position = PositionKind::kLearned;
    }
    for (int64_t l = 0; l < c.num_layers; ++l)
        c.sliding_windows.push_back(hf.sliding_window_for_layer(l).value_or(0));
    c.qkv_bias = hf.has_qkv_bias();
    c.out_bias = hf.has_out_bias();
    c.mlp_bias = hf.mlp_bias;
    c.tie_word_embeddings = hf.tie_word_embeddings;
    c.initializer_range = hf.initializer_range;
    c.hf = hf;
    return c;
}

Result<GeluKind> model_config_plain_gelu(const HfModelConfig& hf, std::string_view key,
                                         std::string_view source) {
    switch (hf.activation()) {
        case HfActivation::kGelu:
            return GeluKind::kErf;
        case HfActivation::kGeluTanh:
            return GeluKind::kTanh;
        default:
            return unimplemented_error(
                "{}: config.json key '{}' is '{}'; lathe implements 'gelu' "
                "(erf) and the tanh forms ('gelu_new', "
                "'gelu_pytorch_tanh', 'gelu_fast') for {}",
                source, key, hf.hidden_act, hf.model_type());
    }
}

Status model_config_validate(const ModelConfig& c, std::string_view source) {
    auto bad = [&](std::string_view key, std::string_view what) {
        return invalid_argument_error("{}: config.json key '{}' {}", source, key, what);
    };
    const std::pair<const char*, int64_t> sizes[] = {
        {"vocab_size", c.vocab_size},
        {"hidden_size", c.hidden_size},
        {"num_hidden_layers", c.num_layers},
        {"num_attention_heads", c.num_heads},
        {"num_key_value_heads", c.num_kv_heads},
        {"head_dim", c.head_dim},
        {"intermediate_size", c.intermediate_size},
        {"max_position_embeddings", c.max_position_embeddings},
    };
    for (const auto& [key, value] : sizes)
        if (value <= 0) return bad(key, fmt::format("is {}; it must be positive", value));
    if (c.vocab_size > INT32_MAX)
        return bad("vocab_size", "exceeds the int32 token ids lathe uses");
    if (c.num_heads % c.num_kv_heads != 0)
        return bad("num_key_value_heads",
                   fmt::format("is {}; it must divide num_attention_heads ({})", c.num_kv_heads,
                               c.num_heads));
    if (!(c.norm_eps > 0.0)) return bad("rms_norm_eps / layer_norm_eps", "must be positive");
    if (c.sliding_windows.size() != size_t(c.num_layers))
        return bad("num_hidden_layers", "disagrees with the per-layer windows (a lathe bug)");
    for (int64_t w : c.sliding_windows)
        if (w < 0) return bad("sliding_window", "must not be negative");
    if (!(c.initializer_range >= 0.0)) return bad("initializer_range", "must not be negative");
    if (c.position == PositionKind::kRope) {
        if (c.rope.head_dim != c.head_dim)
            return bad("head_dim", "disagrees with the rotary head size (a lathe bug)");
        const Status rope = rope_validate(c.rope);
        if (!rope.ok()) return rope.with_context(source);
    }
    return ok_status();
}

int64_t model_config_num_parameters(const ModelConfig& c) {
    const int64_t C = c.hidden_size, V = c.vocab_size, D = c.head_dim, F = c.intermediate_size;
    const int64_t qkv_rows = (c.num_heads + 2 * c.num_kv_heads) * D;
    const int64_t up_rows = c.mlp == MlpKind::kSwiGlu ? 2 * F : F;
    const int64_t norm = c.norm == NormKind::kLayerNorm ? 2 * C : C;
    int64_t layer = 2 * norm + qkv_rows * C + C * c.num_heads * D + up_rows * C + C * F;
    if (c.qkv_bias) layer += qkv_rows;
    if (c.out_bias) layer += C;
    if (c.mlp_bias) layer += up_rows + C;
    int64_t n = c.num_layers * layer + V * C + norm;
    if (!c.tie_word_embeddings) n += V * C;
    if (c.position == PositionKind::kLearned) n += c.max_position_embeddings * C;
    return n;
}

std::string model_config_summary(const ModelConfig& c) {
    std::string pos;
    if (c.position == PositionKind::kLearned) {
        pos = fmt::format("learned positions ({})", c.max_position_embeddings);
    } else {
        pos = fmt::format("rope theta {}", c.rope.theta);
        if (c.rope.partial_rotary_factor != 1.0)
            pos += fmt::format(" on {} of {} dims", rope_rotary_dim(c.rope), c.head_dim);
        if (c.rope.scaling == RopeScaling::kLlama3) pos += " (llama3)";
    }
    std::string extras;
    int windowed = 0;
    for (int64_t w : c.sliding_windows) windowed += w > 0;
    if (windowed > 0)
        extras += fmt::format(", sliding window {} on {} of {} layers",
                              *std::max_element(c.sliding_windows.begin(), c.sliding_windows.end()),
                              windowed, c.num_layers);
    if (c.parallel_residual) extras += ", parallel residual";
    if (c.qkv_bias) extras += ", qkv bias";
    if (c.mlp_bias) extras += ", mlp bias";
    extras += c.tie_word_embeddings ? ", tied" : ", untied";
    return fmt::format("{}: L={} C={} H={} Hkv={} D={} F={} V={}, {}, {}, {}{}", c.model_type,
                       c.num_layers, c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim,
                       c.intermediate_size, c.vocab_size,
                       c.norm == NormKind::kRmsNorm ? "RMSNorm" : "LayerNorm",
                       c.mlp == MlpKind::kSwiGlu   ? "SwiGLU"
                       : c.gelu == GeluKind::kTanh ? "tanh-GELU"
                                                   : "GELU",
                       pos, extras);
}

}  // namespace lathe
