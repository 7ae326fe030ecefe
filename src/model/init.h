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

// The stream key of a tensor name (64-bit FNV-1a).
uint64_t init_key(std::string_view name);

// Fills the rows of `entry` (arena layout, host, f32) that `p` occupies per p.init.
void init_hf_param(const ModelConfig& config, const HfParam& p, TensorView entry, uint64_t seed);

}  // namespace lathe
