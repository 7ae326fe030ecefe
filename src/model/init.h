#pragma once
// Parameter initialization from a seed, GPT-NeoX style: matrices and embeddings normal(0, std)
// with std = initializer_range (0.02 unless config.json says otherwise), the projections that
// write into the residual stream (attention output, MLP down) normal(0, std / sqrt(2 L))
// (GPT-NeoX's scaled_normal output init, GPT-2's c_proj rule), norm weights 1, biases and norm
// biases 0.
//
// The draws are counter-based: element i of the HF tensor called `name` gets the i-th standard
// normal of a stream keyed by (seed, name), i counted in the tensor's arena layout. So a tensor's
// values depend on the seed and its name only: not on the thread count, the table order, or the
// other tensors (adding a layer changes nothing in the others).

#include <cstdint>
#include <string_view>

#include "core/tensor.h"
#include "model/model_config.h"
#include "model/param_table.h"

namespace lathe {

// The standard normal number `index` of the stream (seed, key): Box-Muller over two uniforms
// from splitmix64 of (seed, key, index / 2), in double, rounded to float. Deterministic everywhere.
float init_normal(uint64_t seed, uint64_t key, uint64_t index);

// Numbers 2k and 2k + 1 of the stream at once (one Box-Muller pair: its cosine and sine halves),
// the same bits init_normal gives each: `out[0]` = init_normal(seed, key, 2k), `out[1]` = number
// 2k + 1. `even_index` = 2k.
void init_normal_pair(uint64_t seed, uint64_t key, uint64_t even_index, float out[2]);

// The stream key of a tensor name (64-bit FNV-1a).
uint64_t init_key(std::string_view name);

// Fills the rows of `entry` (arena layout, host, f32) that `p` occupies per p.init: element i of
// those rows is HfParamInit::at(seed, i).
void init_hf_param(const ModelConfig& config, const HfParam& p, TensorView entry, uint64_t seed);

// The value init_hf_param gives element `index` of p's rows, one element at a time, so that a
// part of a tensor is drawn without the rest (a tensor-parallel rank's shard,
// infer/tensor_parallel.h): the same bits as drawing the whole and slicing it.
struct HfParamInit {
    InitKind kind = InitKind::kZeros;
    double std = 0.0;  // kNormal, kNormalScaledByDepth
    uint64_t key = 0;  // init_key of the tensor's name
    float at(uint64_t seed, int64_t index) const {
        switch (kind) {
            case InitKind::kOnes:
                return 1.0f;
            case InitKind::kZeros:
                return 0.0f;
            case InitKind::kNormal:
            case InitKind::kNormalScaledByDepth:
                break;
        }
        return float(std * init_normal(seed, key, uint64_t(index)));
    }
};
HfParamInit hf_param_init(const ModelConfig& config, const HfParam& p);

}  // namespace lathe
