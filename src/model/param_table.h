#pragma once
// The parameter table: every trainable tensor of a model under its Hugging Face name and stored
// shape, and where it lives in the parameter arena.
//
// Two levels, because the ops want a few tensors in another layout than Hugging Face stores them:
//  - an *entry* is one tensor of the arena, in the layout the ops take: linear weights [out, in]
//    (linear.h), q/k/v stacked by rows [q; k; v] so that three linears read row slices of one
//    tensor, SwiGLU's gate and up stacked [gate; up] so that one linear writes the [gate | up]
//    rows swiglu.h reads;
//  - an *HF tensor* is one tensor of a checkpoint: its name, its stored shape, the rows of an
//    entry it occupies, and the layout change between the two (HfLayout), applied only at the
//    boundary (loading, saving, parity tests): a transposition for GPT-2's Conv1D weights
//    ([in, out] on disk), a row permutation for GPT-NeoX's query_key_value (per-head interleaved
//    q, k, v on disk). Most tensors are stored as they are (kSame) and the entry has the HF name.
// The gradient arena and the optimizer moments use the same layout, element for element.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/arena.h"
#include "core/tensor.h"

namespace lathe {

// What an entry is for in the block schedule. Per-layer roles have layer >= 0.
enum class ParamRole : uint8_t {
    kTokenEmbedding,     // (V, C)
    kPositionEmbedding,  // (P, C), GPT-2's wpe
    kFinalNormWeight,    // (C)
    kFinalNormBias,      // (C)
    kLmHead,             // (V, C); absent when tied
    kNorm1Weight,        // (C) before attention
    kNorm1Bias,
    kQkvWeight,    // ((H + 2 Hkv) D, C): rows [q; k; v]
    kQkvBias,      // ((H + 2 Hkv) D)
    kOutWeight,    // (C, H D)
    kOutBias,      // (C)
    kNorm2Weight,  // (C) before the MLP
    kNorm2Bias,
    kUpWeight,    // (2F, C) rows [gate; up] for SwiGLU, (F, C) for GELU
    kUpBias,      // (2F) or (F)
    kDownWeight,  // (C, F)
    kDownBias,    // (C)
};
inline constexpr int kParamRoleCount = 17;

// "kQkvWeight" -> "qkv_weight" (for messages and the memory plan).
std::string_view param_role_name(ParamRole role);

// Norm weights and biases, and every bias, take no weight decay (DESIGN.md, AdamW groups).
bool param_role_decays(ParamRole role);

// How a tensor is initialized from a seed (model/init.h): normal(0, std) with std =
// initializer_range, the same divided by sqrt(2 L) for the projections that write into the
// residual stream (GPT-NeoX's scaled_normal output init, GPT-2's c_proj rule), ones, zeros.
enum class InitKind : uint8_t { kNormal, kNormalScaledByDepth, kOnes, kZeros };

// How a checkpoint stores an entry's rows.
enum class HfLayout : uint8_t {
    kSame,                   // as in the arena
    kTransposed,             // 2-D, stored [in, out] (GPT-2 Conv1D); the arena has [out, in]
    kQkvInterleavedPerHead,  // GPT-NeoX query_key_value weight (3 H D, C) or bias (3 H D):
                             // stored row h*3D + p*D + d for part p (q, k, v), head h, dim d;
                             // the arena has row p*H*D + h*D + d
};

struct ParamEntry {
    std::string name;  // the HF name when it holds one HF tensor as is; else a lathe name
    ParamRole role;
    int layer = -1;          // -1 for tensors outside the blocks
    Shape shape;             // arena layout
    size_t arena_index = 0;  // in ParamTable::layout()
    bool weight_decay = true;
};

struct HfParam {
    std::string name;       // e.g. "model.layers.0.self_attn.k_proj.weight"
    Shape shape;            // as stored in a checkpoint
    size_t entry = 0;       // index into ParamTable::entries()
    int64_t row_begin = 0;  // first row of the entry it occupies (arena layout)
    int64_t rows = 0;       // rows it occupies
    HfLayout layout = HfLayout::kSame;
    int64_t heads = 0;  // H, for kQkvInterleavedPerHead
    InitKind init = InitKind::kNormal;
};

// One part of a stacked entry (add_stacked): an HF tensor stored as is.
struct StackedPart {
    std::string name;
    Shape shape;  // rows = shape[0]; the other dims must agree across the parts
    InitKind init;
};

class ParamTable {
public:
    const std::vector<ParamEntry>& entries() const { return entries_; }
    const std::vector<HfParam>& hf_params() const { return hf_params_; }
    // The arena layout of the entries (f32, in table order); gradients use the same.
    const ArenaLayout& layout() const { return layout_; }

    // The HF tensor called `name`, or nullptr.
    const HfParam* find_hf(std::string_view name) const;
    // Index of the entry with `role` in `layer` (-1 for global roles), or kNone.
    static constexpr size_t kNone = size_t(-1);
    size_t find_entry(ParamRole role, int layer = -1) const;

    // Total elements of all entries (the trainable parameter count).
    int64_t num_elements() const;

private:
    friend class ParamTableBuilder;
    std::vector<ParamEntry> entries_;
    std::vector<HfParam> hf_params_;
    ArenaLayout layout_;
    std::unordered_map<std::string, size_t> hf_index_;
    std::unordered_map<uint32_t, size_t> role_index_;  // (role, layer) -> entry
};

// Builds a ParamTable; a family's registry entry calls it once per tensor, in the order the
// checkpoint should list them. Duplicate names or roles are bugs in the family file (checked).
class ParamTableBuilder {
public:
    // One HF tensor stored as is (or transposed / permuted per `layout`) in an entry of its own,
    // which takes the HF name.
    void add(ParamRole role, int layer, std::string name, Shape hf_shape, InitKind init,
             HfLayout layout = HfLayout::kSame, int64_t heads = 0);
    // Several HF tensors stacked by rows into one entry called `entry_name` (q, k, v; gate, up).
    void add_stacked(ParamRole role, int layer, std::string entry_name,
                     std::vector<StackedPart> parts);

    ParamTable finish() &&;

private:
    void add_entry(ParamRole role, int layer, std::string name, Shape shape);
    ParamTable table_;
};

// Copies HF tensor `p` from `hf` (its stored layout, shape p.shape, f32, host) into the rows it
// occupies of `entry` (the arena layout, host).
void hf_param_import(const HfParam& p, TensorView entry, ConstTensorView hf);
// The reverse: the rows of `entry` that `p` occupies, written to `hf` in the stored layout.
void hf_param_export(const HfParam& p, ConstTensorView entry, TensorView hf);

}  // namespace lathe
