#include "model/memory_plan.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"
#include "model/block.h"
#include "model/block_recompute.h"
#include "model/registry.h"
#include "ops/cuda/attention.h"
#include "ops/cuda/cuda_state.h"
#include "ops/fp8_blockwise.h"
#include "ops/rope.h"

namespace lathe {

namespace {

constexpr size_t kNoEntryIndex = MemoryPlan::kNoEntry;

size_t add_entry(ArenaLayout& layout, std::string name, DType dtype, Shape shape) {
    Result<size_t> index = layout.add(std::move(name), dtype, shape);
    LATHE_CHECK(index.ok(), "memory plan: {}", index.status().to_string());
    return *index;
}

// plan.gradients (memory_plan.h) from plan.params, plan.shards and plan.shape.
void plan_gradients(MemoryPlan& plan) {
    const int W = plan.shape.gradient_shards;
    if (W == 1) {
        plan.gradients = plan.params;
        return;
    }
    const ShardLayout& sl = plan.shards;
    plan.gradients = ArenaLayout(plan.params.alignment());
    plan.grad_shard = add_entry(plan.gradients, "gradients.shard", DType::kF32,
                                Shape{std::max<int64_t>(1, sl.total / W)});
    auto window = [&](std::string name, int64_t n) {
        return n > 0 ? add_entry(plan.gradients, std::move(name), DType::kF32, Shape{n})
                     : MemoryPlan::kNoEntry;
    };
    plan.grad_front_window = window("gradients.window.front", sl.arena[ShardLayout::kFront].size());
    plan.grad_back_window = window("gradients.window.back", sl.arena[sl.back()].size());
    int64_t longest = 0;
    for (size_t u = ShardLayout::kFront + 1; u < sl.back(); ++u)
        longest = std::max(longest, sl.arena[u].size());
    for (int i = 0; i < gradient_layer_windows(plan.shape.backend) && longest > 0; ++i)
        plan.grad_layer_windows.push_back(
            window(fmt::format("gradients.window.layer.{}", i), longest));
}

// plan.param_storage and plan.compute_storage (memory_plan.h) from plan.params,
// plan.params_compute, plan.shards and plan.shape.
void plan_param_storage(MemoryPlan& plan) {
    const int W = plan.shape.param_shards;
    const bool cuda = plan.shape.backend == Backend::kCuda;
    if (W == 1) {
        plan.param_storage = plan.params;
        plan.compute_storage = plan.params_compute;
        return;
    }
    const ShardLayout& sl = plan.shards;
    const Shape shard{std::max<int64_t>(1, sl.total / W)};
    plan.param_storage = ArenaLayout(plan.params.alignment());
    plan.param_shard = add_entry(plan.param_storage, "params.shard", DType::kF32, shard);
    if (cuda) {
        plan.compute_storage = ArenaLayout(plan.params_compute.alignment());
        plan.compute_shard =
            add_entry(plan.compute_storage, "params_compute.shard", DType::kBF16, shard);
    }
    ArenaLayout& computes = cuda ? plan.compute_storage : plan.param_storage;
    const DType dtype = cuda ? DType::kBF16 : DType::kF32;
    auto window = [&](std::string name, int64_t n) {
        return n > 0 ? add_entry(computes, std::move(name), dtype, Shape{n}) : MemoryPlan::kNoEntry;
    };
    plan.weight_front_window = window("params.window.front", sl.arena[ShardLayout::kFront].size());
    plan.weight_back_window = window("params.window.back", sl.arena[sl.back()].size());
    int64_t longest = 0;
    for (size_t u = ShardLayout::kFront + 1; u < sl.back(); ++u)
        longest = std::max(longest, sl.arena[u].size());
    for (int i = 0; i < kWeightLayerWindows && longest > 0; ++i)
        plan.weight_layer_windows.push_back(
            window(fmt::format("params.window.layer.{}", i), longest));
}

}  // namespace

size_t MemoryPlan::param_shard_bytes() const {
    if (param_shard == kNoEntry) return 0;
    return param_storage.entries()[param_shard].bytes +
           (compute_shard == kNoEntry ? 0 : compute_storage.entries()[compute_shard].bytes);
}

size_t MemoryPlan::weight_window_bytes() const {
    if (param_shard == kNoEntry) return 0;
    return parameter_bytes() - param_shard_bytes();
}

size_t MemoryPlan::gradient_shard_bytes() const {
    if (!shape.training || grad_shard == kNoEntry) return 0;
    return gradients.entries()[grad_shard].bytes;
}

size_t MemoryPlan::gradient_window_bytes() const {
    if (!shape.training || grad_shard == kNoEntry) return 0;
    return gradients.total_bytes() - gradients.entries()[grad_shard].bytes;
}

const char* recompute_name(Recompute mode) {
    switch (mode) {
        case Recompute::kNone:
            return "none";
        case Recompute::kSelective:
            return "selective";
        case Recompute::kFull:
            return "full";
    }
    return "?";
}

std::optional<Recompute> recompute_from_name(std::string_view name) {
    for (Recompute m : {Recompute::kNone, Recompute::kSelective, Recompute::kFull})
        if (name == recompute_name(m)) return m;
    return std::nullopt;
}

bool sequence_parallel_partial_role(ParamRole role) {
    switch (role) {
        case ParamRole::kNorm1Weight:
        case ParamRole::kNorm1Bias:
        case ParamRole::kNorm2Weight:
        case ParamRole::kNorm2Bias:
        case ParamRole::kFinalNormWeight:
        case ParamRole::kFinalNormBias:
            return true;
        default:
            return false;
    }
}

bool precision_has_fp8(const PrecisionPolicy& p) {
    for (LinearPrecision x : p.linear)
        if (x != LinearPrecision::kNative) return true;
    return false;
}

Fp8LinearDims fp8_linear_dims(const ModelConfig& c, Fp8Linear l) {
    const int64_t C = c.hidden_size, q = c.num_heads * c.head_dim, kv = c.num_kv_heads * c.head_dim;
    const int64_t F = c.intermediate_size, up = c.mlp == MlpKind::kSwiGlu ? 2 * F : F;
    switch (l) {
        case Fp8Linear::kQkv:
            return {C, q + 2 * kv};
        case Fp8Linear::kAttnOut:
            return {q, C};
        case Fp8Linear::kMlpUp:
            return {C, up};
        case Fp8Linear::kMlpDown:
            return {F, C};
    }
    return {};
}

size_t memory_plan_attention_workspace_estimate(const ModelConfig& c, int64_t B, int64_t T) {
    const size_t key_blocks = size_t((T + 127) / 128);
    const size_t rows = size_t(B) * size_t(c.num_heads) * size_t(T);       // (b, h, t)
    size_t bytes = key_blocks * rows * size_t(c.head_dim) * sizeof(float)  // partial dQ
                   + rows * sizeof(float);                                 // dot(dO, O)
    // GQA: dK and dV per query head (bf16), summed over each group afterwards.
    if (c.num_kv_heads != c.num_heads) bytes += 2 * rows * size_t(c.head_dim) * 2;
    return bytes;
}

std::string format_bytes(size_t bytes) {
    const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = double(bytes);
    int u = 0;
    while (v >= 1024.0 && u < 4) {
        v /= 1024.0;
        ++u;
    }
    return u == 0 ? fmt::format("{} B", bytes) : fmt::format("{:.2f} {}", v, units[u]);
}

FlatRange ShardLayout::chunk(size_t u, int rank) const {
    LATHE_CHECK(u < arena.size() && rank >= 0 && rank < world, "chunk {} of unit {} of {}", rank, u,
                arena.size());
    const int64_t S = arena[u].size() / world;
    return FlatRange{arena[u].begin + rank * S, arena[u].begin + (rank + 1) * S};
}

std::vector<FlatRange> ShardLayout::chunks(int rank) const {
    std::vector<FlatRange> out;
    for (size_t u = 0; u < arena.size(); ++u) {
        const FlatRange c = chunk(u, rank);
        if (c.size() > 0) out.push_back(c);
    }
    return out;
}

std::vector<FlatRange> ShardLayout::to_canonical(std::span<const FlatRange> ranges) const {
    std::vector<FlatRange> out;
    for (const FlatRange& r : ranges) {
        if (r.size() == 0) continue;
        const auto it = std::upper_bound(arena.begin(), arena.end(), r.begin,
                                         [](int64_t v, const FlatRange& a) { return v < a.end; });
        LATHE_CHECK(it != arena.end() && r.begin >= it->begin && r.end <= it->end,
                    "range [{}, {}) is not inside one unit", r.begin, r.end);
        const size_t u = size_t(it - arena.begin());
        const int64_t own_end = arena[u].begin + canonical[u].size();
        const int64_t b = r.begin, e = std::min(r.end, own_end);
        if (e > b)
            out.push_back(FlatRange{b - arena[u].begin + canonical[u].begin,
                                    e - arena[u].begin + canonical[u].begin});
    }
    return out;
}

int64_t offload_split_begin(const ShardLayout& units, double fraction) {
    LATHE_CHECK(fraction > 0.0 && fraction <= 1.0, "offload fraction {} outside (0, 1]", fraction);
    const int64_t total = units.arena.empty() ? 0 : units.arena.back().end;
    // ceil(f * total), never above total. f * total in fp64 can land one rounding above an integer
    // (0.07 * 100 = 7.000000000000001), which ceil would turn into one more element and, on a
    // unit boundary, one more unit: the product is taken down by a relative 1e-12 first (far
    // above fp64's rounding, far below one element of any model under 10^12 parameters).
    const int64_t need =
        std::min(total, int64_t(std::ceil(fraction * double(total) * (1.0 - 1e-12))));
    int64_t held = 0;
    for (size_t u = units.arena.size(); u-- > 0;) {
        held += units.arena[u].size();
        if (held >= need) return units.arena[u].begin;
    }
    return 0;
}

ShardLayout shard_layout_make(const ParamTable& table, int world) {
    LATHE_CHECK(world >= 1, "a shard layout over {} ranks", world);
    const ArenaLayout& layout = table.layout();
    int num_layers = 0;
    for (const ParamEntry& e : table.entries()) num_layers = std::max(num_layers, e.layer + 1);
    // Each arena entry's unit, in arena (offset) order.
    std::vector<int> layer_of(layout.size(), -1);
    for (const ParamEntry& e : table.entries()) layer_of[e.arena_index] = e.layer;
    ShardLayout sl;
    sl.world = world;
    sl.used = int64_t(layout.total_bytes() / sizeof(float));
    const size_t U = size_t(num_layers) + 2;
    std::vector<int64_t> first(U, -1), last(U, -1);
    bool seen_layer = false;
    size_t prev = 0;
    const int64_t align = int64_t(layout.alignment() / sizeof(float));
    for (size_t i = 0; i < layout.size(); ++i) {
        seen_layer = seen_layer || layer_of[i] >= 0;
        const size_t u = layer_of[i] >= 0 ? size_t(layer_of[i]) + 1 : seen_layer ? U - 1 : 0;
        LATHE_CHECK(u >= prev, "parameter entry {} ({}) comes after a later unit's entries", i,
                    layout.entries()[i].name);
        prev = u;
        const ArenaEntry& a = layout.entries()[i];
        const int64_t b = int64_t(a.offset / sizeof(float));
        const int64_t e =
            (int64_t(a.offset + a.bytes) / int64_t(sizeof(float)) + align - 1) / align * align;
        if (first[u] < 0) first[u] = b;
        last[u] = std::max(last[u], e);
    }
    // Canonical: each unit from the end of the one before to its own last element (the last unit
    // to `used`), so that they tile [0, used).
    sl.canonical.resize(U);
    sl.arena.resize(U);
    int64_t c = 0, a = 0;
    const int64_t multiple = kShardAlignElements * world;
    for (size_t u = 0; u < U; ++u) {
        LATHE_CHECK(first[u] < 0 || first[u] >= c, "unit {} starts inside the one before it", u);
        const int64_t end = u + 1 == U ? sl.used : std::max(c, last[u]);
        sl.canonical[u] = FlatRange{c, end};
        const int64_t n = world == 1 ? end - c : (end - c + multiple - 1) / multiple * multiple;
        sl.arena[u] = FlatRange{a, a + n};
        c = end;
        a += n;
    }
    sl.total = a;
    return sl;
}

Result<MemoryPlan> memory_plan_make(const ModelConfig& c, const ParamTable& table,
                                    const ModelShape& shape) {
    const int64_t B = shape.batch, T = shape.seq_len, C = c.hidden_size, V = c.vocab_size;
    if (B <= 0) return invalid_argument_error("batch size {} must be positive", B);
    if (T <= 0) return invalid_argument_error("sequence length {} must be positive", T);
    if (shape.unit_shards < 1)
        return invalid_argument_error("unit_shards {} must be positive", shape.unit_shards);
    if (shape.optimizer_shards != 1 && shape.optimizer_shards != shape.unit_shards)
        return invalid_argument_error("optimizer_shards {} must be 1 or unit_shards ({})",
                                      shape.optimizer_shards, shape.unit_shards);
    if (shape.gradient_shards != 1 && shape.gradient_shards != shape.unit_shards)
        return invalid_argument_error("gradient_shards {} must be 1 or unit_shards ({})",
                                      shape.gradient_shards, shape.unit_shards);
    if (shape.param_shards != 1 &&
        (shape.param_shards != shape.unit_shards || shape.gradient_shards != shape.unit_shards))
        return invalid_argument_error(
            "param_shards {} must be 1, or unit_shards ({}) with gradient_shards ({}) equal to it",
            shape.param_shards, shape.unit_shards, shape.gradient_shards);
    if (shape.masters_on_host && (!shape.training || shape.unit_shards != 1))
        return invalid_argument_error(
            "masters_on_host needs a training model of one rank (training {}, unit_shards {})",
            shape.training, shape.unit_shards);
    if (shape.shard_rank < 0 || shape.shard_rank >= shape.unit_shards)
        return invalid_argument_error("shard_rank {} is outside [0, {})", shape.shard_rank,
                                      shape.unit_shards);
    if (T > c.max_position_embeddings) {
        // The family's own name for the key, where it has one.
        std::string own_key;
        Result<const ModelFamily*> family = model_family_find(c.model_type);
        if (c.hf.family) family = c.hf.family;
        if (family.ok() && (*family)->hf_keys.max_position_embeddings != "max_position_embeddings")
            own_key = fmt::format(" / {}", (*family)->hf_keys.max_position_embeddings);
        return invalid_argument_error(
            "sequence length {} is longer than the model allows (config.json "
            "max_position_embeddings{} = {})",
            T, own_key, c.max_position_embeddings);
    }
    if (shape.lm_head_chunk_rows < 0)
        return invalid_argument_error("lm_head_chunk_rows {} must not be negative",
                                      shape.lm_head_chunk_rows);

    const int64_t S = shape.sequence_shards;
    if (S < 1 || (B * T) % S != 0)
        return invalid_argument_error(
            "sequence parallel over {} ranks: the micro-batch's tokens ({} x {} = {}) must be a "
            "multiple of {} (each rank holds an equal share of the rows)",
            S, B, T, B * T, S);
    MemoryPlan plan;
    plan.shape = shape;
    const int64_t N = B * T;
    const Shape rows = block_rows_shape(B, T, C, S);
    int64_t Nc = shape.lm_head_chunk_rows;
    const bool fp8_head = shape.backend == Backend::kCuda &&
                          shape.precision.of(LinearRole::kLmHead) != LinearPrecision::kNative;
    if (Nc == 0) {
        const size_t budget = shape.backend != Backend::kCuda ? kLmHeadChunkBytes
                              : fp8_head                      ? kLmHeadChunkBytesCudaFp8
                                                              : kLmHeadChunkBytesCuda;
        Nc = std::max<int64_t>(1, int64_t(budget / (size_t(V) * sizeof(float))));
    }
    // The FP8 head's chunk (ops/cuda/lm_head_cross_entropy.h): a multiple of 16 rows (N is one).
    if (fp8_head) Nc = (Nc + 15) / 16 * 16;
    plan.shape.lm_head_chunk_rows = Nc = std::min(Nc, N);
    plan.shards = shard_layout_make(table, shape.unit_shards);
    if (shape.masters_on_host) {
        if (!(shape.offload_fraction > 0.0 && shape.offload_fraction <= 1.0))
            return invalid_argument_error("offload_fraction {} is outside (0, 1]",
                                          shape.offload_fraction);
        plan.offload_begin = offload_split_begin(plan.shards, shape.offload_fraction);
    }
    if (shape.unit_shards == 1) {
        plan.params = table.layout();
    } else {
        // The table's entries in order, each unit moved to its padded start.
        const ShardLayout& sl = plan.shards;
        plan.params = ArenaLayout(table.layout().alignment());
        size_t u = 0;
        for (const ArenaEntry& e : table.layout().entries()) {
            const int64_t o = int64_t(e.offset / sizeof(float));
            while (o >= sl.canonical[u].end) ++u;
            const int64_t at = o - sl.canonical[u].begin + sl.arena[u].begin;
            plan.params.reserve_to(size_t(at) * sizeof(float));
            const size_t i = add_entry(plan.params, e.name, e.dtype, e.shape);
            LATHE_CHECK(plan.params.entries()[i].offset == size_t(at) * sizeof(float),
                        "memory plan: entry {} is not at its unit's offset", e.name);
        }
        plan.params.reserve_to(size_t(sl.total) * sizeof(float));
        LATHE_CHECK(plan.params.total_bytes() == size_t(sl.total) * sizeof(float),
                    "memory plan: the parameter arena of {} bytes is not the {} units' {} elements",
                    plan.params.total_bytes(), sl.units(), sl.total);
    }
    plan_gradients(plan);
    const DType a = activation_dtype(shape.backend);
    if (shape.backend == Backend::kCuda) {
        // Half the alignment makes every bf16 entry start at half its f32 twin's byte offset, so
        // the compute copy lines up element for element with params_flat(): AdamW writes it in
        // the same pass, by flat index.
        plan.params_compute = ArenaLayout(plan.params.alignment() / 2);
        for (const ArenaEntry& e : plan.params.entries()) {
            plan.params_compute.reserve_to(e.offset / 2);
            const size_t i = add_entry(plan.params_compute, e.name, DType::kBF16, e.shape);
            LATHE_CHECK(2 * plan.params_compute.entries()[i].offset == e.offset,
                        "memory plan: bf16 copy of {} is not aligned with its f32 master", e.name);
        }
        plan.params_compute.reserve_to(plan.params.total_bytes() / 2);
        LATHE_CHECK(2 * plan.params_compute.total_bytes() == plan.params.total_bytes(),
                    "memory plan: bf16 copy of the parameters does not line up with the masters");
        plan.runtime = CudaState::kWorkspaceBytes + CudaState::kScratchBytes;
        plan.communication = shape.communication_bytes;
    }
    plan_param_storage(plan);

    ArenaLayout& act = plan.activations;
    plan.tokens = add_entry(act, "input.tokens", DType::kI32, Shape{B, T});
    plan.targets = add_entry(act, "input.targets", DType::kI32, Shape{B, T});
    plan.docs = add_entry(act, "input.docs", DType::kI32, Shape{B, T});
    plan.positions = add_entry(act, "input.positions", DType::kI32, Shape{B, T});
    if (c.vocab_parallel())
        plan.vocab_ids = add_entry(act, "input.vocab_shard_ids", DType::kI32, Shape{B, T});
    plan.block_acts.resize(size_t(c.num_layers));
    // Recompute: the entries every layer shares (one set, refilled before each layer's
    // backward), by block_acts_for_each position; the rest are per layer.
    std::vector<size_t> shared;  // [i] = the shared entry of position i, or kNoEntry
    for (int64_t l = 0; l < c.num_layers; ++l) {
        size_t i = 0;
        block_acts_for_each(
            c, B, T, S, a, [&](const char* name, auto member, DType dtype, Shape s) {
                if (l == 0) {
                    const bool is_shared =
                        shape.recompute == Recompute::kFull
                            ? member != &BlockActs::x_in
                            : shape.recompute == Recompute::kSelective &&
                                  block_selective_recomputes(c, shape.backend, member);
                    shared.push_back(
                        is_shared ? add_entry(act, fmt::format("recompute.{}", name), dtype, s)
                                  : kNoEntryIndex);
                }
                const size_t entry =
                    shared[i] != kNoEntryIndex
                        ? shared[i]
                        : add_entry(act, fmt::format("layers.{}.{}", l, name), dtype, s);
                plan.block_acts[size_t(l)].push_back(entry);
                ++i;
            });
    }
    plan.final_x = add_entry(act, "final.x", a, rows);
    plan.final_norm_out = add_entry(act, "final.norm_out", a, Shape{B, T, C});
    if (c.norm == NormKind::kLayerNorm)
        plan.final_norm_mean = add_entry(act, "final.norm_mean", DType::kF32, Shape{N / S});
    plan.final_norm_rstd = add_entry(act, "final.norm_rstd", DType::kF32, Shape{N / S});
    plan.lm_lse = add_entry(act, "lm_head.lse", DType::kF32, Shape{N});
    plan.loss = add_entry(act, "lm_head.loss", DType::kF32, Shape{kLossSlots});

    // Scratch: first what may be live while an attention call runs, then (contiguous, last) what
    // is not, which cuDNN's attention workspace shares on CUDA (memory_plan.h). The lifetimes
    // are block_backward's (model/block.cpp): the attention backward reads datt and writes dq,
    // dk, dv; dres carries the residual gradient across it; with the parallel residual dnorm2
    // waits across it for the end of the block. tmp (the forward's), dnorm1 (written after it),
    // dnorm2 (sequential: read before it), dmlp_act, dmlp_in (the MLP backward, before it) and
    // the LM head's chunk (used before any block's backward) are dead during every attention
    // call, forward (a recomputing forward included) or backward.
    ArenaLayout& scr = plan.scratch;
    // Sequence parallel (block.h, "Overlap") keeps two of them live across the attention
    // backward: tmp holds the gathered d x_mid, which the attention output's weight gradient
    // reads after it, and gathered receives norm1's output, all-gathered while it runs. Its
    // reduced is dead there: the backward reduce-scatters before the attention backward (the
    // MLP's) and after it (norm1's); the forward moves rows only before attention and after it.
    auto dead_in_attention = [&](TensorView BlockScratch::*m) {
        return (m == &BlockScratch::tmp && S == 1) || m == &BlockScratch::dnorm1 ||
               (m == &BlockScratch::dnorm2 && !c.parallel_residual) ||
               m == &BlockScratch::dmlp_act || m == &BlockScratch::dmlp_in ||
               m == &BlockScratch::reduced;
    };
    std::vector<size_t> block_scratch;
    auto add_block_scratch = [&](bool dead) {
        size_t i = 0;
        block_scratch_for_each(c, B, T, S, a,
                               [&](const char* name, auto member, DType dtype, Shape s) {
                                   if (block_scratch.size() <= i)
                                       block_scratch.resize(i + 1, kNoEntryIndex);
                                   if (dead_in_attention(member) == dead)
                                       block_scratch[i] = add_entry(scr, name, dtype, s);
                                   ++i;
                               });
    };
    add_block_scratch(false);
    plan.dres = add_entry(scr, "dresidual", a, rows);
    if (c.position == PositionKind::kRope) {
        const int64_t half = rope_rotary_dim(c.rope) / 2;
        plan.rope_cos = add_entry(scr, "rope.cos", DType::kF32, Shape{T, half});
        plan.rope_sin = add_entry(scr, "rope.sin", DType::kF32, Shape{T, half});
    }
    plan.grad_norm = add_entry(scr, "optimizer.grad_norm", DType::kF32, Shape{1});
    if (c.vocab_parallel())
        plan.lm_vocab_parallel = add_entry(scr, "lm_head.vocab_parallel", DType::kF32, Shape{4, N});
    if (S > 1) {
        int64_t partial = 0;
        for (const ParamEntry& e : table.entries())
            if (sequence_parallel_partial_role(e.role)) partial += e.shape.numel();
        plan.sequence_parallel_grads = add_entry(scr, "sequence_parallel.partial_grads",
                                                 DType::kF32, Shape{std::max<int64_t>(partial, 1)});
    }
    const size_t dead_begin = scr.total_bytes();
    add_block_scratch(true);
    plan.block_scratch = std::move(block_scratch);
    plan.lm_chunk = add_entry(scr, "lm_head.logits_chunk", DType::kF32, Shape{Nc, V});
    if (shape.backend == Backend::kCuda) {
        // The backward runs in batch chunks whose workspace fits the dead buffers, when a chunk
        // of fewer rows does (the estimate is linear in B, as cuDNN's workspace is).
        const size_t dead = scr.total_bytes() - dead_begin;
        plan.attention_backward_cap = dead;
        const size_t whole = memory_plan_attention_workspace_estimate(c, B, T);
        plan.attention_workspace =
            shape.attention_workspace_bytes
                ? *shape.attention_workspace_bytes
                : memory_plan_attention_workspace_estimate(
                      c, cuda::attention_backward_chunk_rows(B, whole, dead), T);
        if (plan.attention_workspace > dead)
            add_entry(scr, "attention.workspace", DType::kU8,
                      Shape{int64_t(plan.attention_workspace - dead)});
        plan.attention_shared = std::min(dead, plan.attention_workspace);
        plan.attention_offset = dead_begin;
        plan.attention_bytes = scr.total_bytes() - dead_begin;
    }
    if (shape.backend == Backend::kCuda && precision_has_fp8(shape.precision)) {
        // The fp8 buffers (memory_plan.h). Per layer and linear: wq (O, I), wqt (I, O) E4M3 and
        // xqt (I, N) E4M3; shared: xq / dyq, dyqt; then the scalars and the delayed state.
        ArenaLayout& f8 = plan.fp8;
        const bool blockwise = shape.fp8.recipe == Fp8Recipe::kBlockwise;
        int64_t q_scratch = 0, dyqt = 0;
        size_t scale_scratch = 0, dyt_scale = 0, cast_scales = 0;  // blockwise, bytes
        plan.fp8_linears.resize(size_t(c.num_layers));
        for (int64_t l = 0; l < c.num_layers; ++l) {
            for (int64_t i = 0; i < kFp8LinearsPerLayer; ++i) {
                const Fp8Linear lin = Fp8Linear(i);
                const LinearRole role = fp8_linear_role(lin);
                if (shape.precision.of(role) == LinearPrecision::kNative) continue;
                const auto [I, O] = fp8_linear_dims(c, lin);
                const std::string name = fmt::format("layers.{}.fp8.{}", l, fp8_linear_name(lin));
                Fp8LinearEntries& e = plan.fp8_linears[size_t(l)][size_t(i)];
                e.wq = add_entry(f8, name + ".wq", DType::kE4M3, Shape{O, I});
                e.wqt = add_entry(f8, name + ".wqt", DType::kE4M3, Shape{I, O});
                e.xqt = add_entry(f8, name + ".xqt", DType::kE4M3, Shape{I, N});
                q_scratch = std::max({q_scratch, N * I, N * O});
                dyqt = std::max(dyqt, N * O);
                if (!blockwise) {
                    e.scalars_offset = (l * kFp8LinearsPerLayer + i) * 24;
                    continue;
                }
                const Fp8BlockwiseBufferBytes bb = fp8_blockwise_buffer_bytes(N, I, O);
                auto f32s = [](size_t bytes) { return Shape{int64_t(bytes / sizeof(float))}; };
                e.w_scale = add_entry(f8, name + ".w_scale", DType::kF32, f32s(bb.w_scale));
                e.wt_scale = add_entry(f8, name + ".wt_scale", DType::kF32, f32s(bb.wt_scale));
                e.xt_scale = add_entry(f8, name + ".xt_scale", DType::kF32, f32s(bb.xt_scale));
                scale_scratch = std::max({scale_scratch, bb.x_scale, bb.dy_scale});
                dyt_scale = std::max(dyt_scale, bb.dyt_scale);
                cast_scales = std::max(cast_scales, bb.cast_scales);
            }
        }
        if (fp8_head) {
            // The head's weight codes; x's codes go to the shared xq and dyqt buffers.
            plan.fp8_head.wq = add_entry(f8, "lm_head.fp8.wq", DType::kE4M3, Shape{V, C});
            plan.fp8_head.wqt = add_entry(f8, "lm_head.fp8.wqt", DType::kE4M3, Shape{C, V});
            plan.fp8_head.scalars_offset = c.num_layers * kFp8LinearsPerLayer * 24;
            q_scratch = std::max(q_scratch, N * C);
            dyqt = std::max(dyqt, N * C);
        }
        plan.fp8_q_scratch = add_entry(f8, "fp8.xq_dyq", DType::kU8, Shape{q_scratch});
        plan.fp8_dyqt = add_entry(f8, "fp8.dyqt", DType::kU8, Shape{dyqt});
        if (blockwise) {
            auto f32s = [](size_t bytes) { return Shape{int64_t(bytes / sizeof(float))}; };
            plan.fp8_scale_scratch =
                add_entry(f8, "fp8.x_dy_scale", DType::kF32, f32s(scale_scratch));
            plan.fp8_dyt_scale = add_entry(f8, "fp8.dyt_scale", DType::kF32, f32s(dyt_scale));
            plan.fp8_cast_scales = add_entry(f8, "fp8.cast_scales", DType::kF32, f32s(cast_scales));
        } else {
            plan.fp8_scalars =
                add_entry(f8, "fp8.scalars", DType::kF32,
                          Shape{(c.num_layers * kFp8LinearsPerLayer + (fp8_head ? 1 : 0)) * 24});
        }
        if (shape.fp8.recipe == Fp8Recipe::kDelayed) {
            const int64_t n = fp8_tensor_count(c.num_layers, shape.fp8);
            plan.fp8_scales = add_entry(f8, "fp8.scales", DType::kF32, Shape{n});
            plan.fp8_step_amax = add_entry(f8, "fp8.step_amax", DType::kF32, Shape{n});
            plan.fp8_eval_amax = add_entry(f8, "fp8.eval_amax", DType::kF32, Shape{n});
        }
    }
    return plan;
}

std::string MemoryPlan::table(std::string_view title) const {
    std::string out = fmt::format("memory plan: {}\n", title);
    out +=
        fmt::format("  batch {} x {} tokens, LM-head chunk {} rows, on the {} ({} activations{})\n",
                    shape.batch, shape.seq_len, shape.lm_head_chunk_rows,
                    backend_name(shape.backend), dtype_name(activation_dtype(shape.backend)),
                    shape.recompute == Recompute::kNone
                        ? ""
                        : fmt::format(", {} recompute", recompute_name(shape.recompute)));
    const std::pair<const char*, size_t> rows[] = {
        {"parameters", parameter_bytes()},
        {"gradients", gradient_bytes()},
        {shape.optimizer_state == AdamWStateDType::kBF16 ? "optimizer state (m, v in bf16)"
                                                         : "optimizer state (AdamW m, v)",
         optimizer_bytes()},
        {"activations", activation_bytes()},
        {"scratch", scratch_bytes()},
        {"fp8 buffers (codes, scales)", fp8_bytes()},
        {"runtime (CUDA workspaces)", runtime},
        {"communication (NCCL)", communication},
    };
    for (const auto& [name, bytes] : rows) {
        if (bytes == 0 && (std::string_view(name) == "communication (NCCL)" ||
                           std::string_view(name) == "fp8 buffers (codes, scales)"))
            continue;
        out += fmt::format("  {:<30} {:>16} B  {:>12}\n", name, bytes, format_bytes(bytes));
    }
    out += fmt::format("  {:<30} {:>16} B  {:>12}\n", "total", total_bytes(),
                       format_bytes(total_bytes()));
    if (shape.masters_on_host && offload_begin == 0)
        out +=
            fmt::format("  f32 masters and AdamW state in host memory (optimizer.offload: cpu){}\n",
                        shape.backend == Backend::kCuda ? "; parameters: the bf16 copy" : "");
    else if (shape.masters_on_host)
        out += fmt::format(
            "  f32 masters and AdamW state of elements [{}, {}) in host memory (optimizer.offload: "
            "cpu, offload_fraction {}); of [0, {}) here{}\n",
            offload_begin, shards.total, shape.offload_fraction, offload_begin,
            shape.backend == Backend::kCuda
                ? fmt::format("; parameters: the bf16 copy and {} of f32 masters",
                              format_bytes(device_master_bytes()))
                : "");
    if (fp8_bytes() > 0) {
        size_t weights = 0, inputs = 0, linears = 0;
        for (const auto& layer : fp8_linears)
            for (const Fp8LinearEntries& e : layer) {
                if (e.wq == kNoEntry) continue;
                ++linears;
                weights += fp8.entries()[e.wq].bytes + fp8.entries()[e.wqt].bytes;
                inputs += fp8.entries()[e.xqt].bytes;
            }
        if (fp8_head.wq != kNoEntry) {
            ++linears;
            weights += fp8.entries()[fp8_head.wq].bytes + fp8.entries()[fp8_head.wqt].bytes;
        }
        out += fmt::format(
            "  fp8 buffers: {} linears ({}): weight codes and transposes {}, saved input codes "
            "{}, scales and shared cast scratch {}\n",
            linears, fp8_recipe_name(shape.fp8.recipe), format_bytes(weights), format_bytes(inputs),
            format_bytes(fp8_bytes() - weights - inputs));
    }
    if (shape.sequence_shards > 1)
        out += fmt::format(
            "  sequence parallel over {} ranks: {} of the {} rows of the residual stream, the "
            "norms and their saved outputs per rank\n",
            shape.sequence_shards, shape.batch * shape.seq_len / shape.sequence_shards,
            shape.batch * shape.seq_len);
    if (gradient_shard_bytes() > 0)
        out += fmt::format(
            "  gradients sharded over {} ranks: shard {} B ({}) + unit windows {} B ({}), of {} "
            "B ({}) unsharded\n",
            shape.gradient_shards, gradient_shard_bytes(), format_bytes(gradient_shard_bytes()),
            gradient_window_bytes(), format_bytes(gradient_window_bytes()), params.total_bytes(),
            format_bytes(params.total_bytes()));
    if (param_shard_bytes() > 0)
        out += fmt::format(
            "  parameters sharded over {} ranks: shard {} B ({}) + gathered unit windows {} B "
            "({}), of {} B ({}) unsharded\n",
            shape.param_shards, param_shard_bytes(), format_bytes(param_shard_bytes()),
            weight_window_bytes(), format_bytes(weight_window_bytes()),
            params.total_bytes() + params_compute.total_bytes(),
            format_bytes(params.total_bytes() + params_compute.total_bytes()));
    if (attention_workspace > 0)
        out += fmt::format(
            "  cuDNN's attention workspace ({}) shares {} of scratch with buffers dead during "
            "attention\n",
            format_bytes(attention_workspace), format_bytes(attention_shared));
    return out;
}

}  // namespace lathe
