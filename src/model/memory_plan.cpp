#include "model/memory_plan.h"

#include <algorithm>

#include "core/check.h"
#include "model/block.h"
#include "ops/cuda/cuda_state.h"
#include "ops/rope.h"

namespace lathe {

namespace {

size_t add_entry(ArenaLayout& layout, std::string name, DType dtype, Shape shape) {
    Result<size_t> index = layout.add(std::move(name), dtype, shape);
    LATHE_CHECK(index.ok(), "memory plan: {}", index.status().to_string());
    return *index;
}

}  // namespace

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

Result<MemoryPlan> memory_plan_make(const ModelConfig& c, const ParamTable& table,
                                    const ModelShape& shape) {
    const int64_t B = shape.batch, T = shape.seq_len, C = c.hidden_size, V = c.vocab_size;
    if (B <= 0) return invalid_argument_error("batch size {} must be positive", B);
    if (T <= 0) return invalid_argument_error("sequence length {} must be positive", T);
    if (T > c.max_position_embeddings)
        return invalid_argument_error(
            "sequence length {} is longer than the model allows (config.json "
            "max_position_embeddings{} = {})",
            T, c.model_type == "gpt2" ? " / n_positions" : "", c.max_position_embeddings);
    if (shape.lm_head_chunk_rows < 0)
        return invalid_argument_error("lm_head_chunk_rows {} must not be negative",
                                      shape.lm_head_chunk_rows);

    MemoryPlan plan;
    plan.shape = shape;
    const int64_t N = B * T;
    int64_t Nc = shape.lm_head_chunk_rows;
    if (Nc == 0)
        Nc = std::max<int64_t>(1, int64_t((shape.backend == Backend::kCuda ? kLmHeadChunkBytesCuda
                                                                           : kLmHeadChunkBytes) /
                                          (size_t(V) * sizeof(float))));
    plan.shape.lm_head_chunk_rows = Nc = std::min(Nc, N);
    plan.params = table.layout();
    const DType a = activation_dtype(shape.backend);
    if (shape.backend == Backend::kCuda) {
        // Half the alignment makes every bf16 entry start at half its f32 twin's byte offset, so
        // the compute copy lines up element for element with params_flat(): AdamW writes it in
        // the same pass, by flat index.
        plan.params_compute = ArenaLayout(plan.params.alignment() / 2);
        for (const ArenaEntry& e : plan.params.entries()) {
            const size_t i = add_entry(plan.params_compute, e.name, DType::kBF16, e.shape);
            LATHE_CHECK(2 * plan.params_compute.entries()[i].offset == e.offset,
                        "memory plan: bf16 copy of {} is not aligned with its f32 master", e.name);
        }
        LATHE_CHECK(2 * plan.params_compute.total_bytes() == plan.params.total_bytes(),
                    "memory plan: bf16 copy of the parameters does not line up with the masters");
        plan.runtime = CudaState::kWorkspaceBytes + CudaState::kScratchBytes;
    }

    ArenaLayout& act = plan.activations;
    plan.tokens = add_entry(act, "input.tokens", DType::kI32, Shape{B, T});
    plan.targets = add_entry(act, "input.targets", DType::kI32, Shape{B, T});
    plan.docs = add_entry(act, "input.docs", DType::kI32, Shape{B, T});
    plan.positions = add_entry(act, "input.positions", DType::kI32, Shape{B, T});
    plan.block_acts.resize(size_t(c.num_layers));
    std::vector<size_t> shared;  // recompute: one set of every entry but the layer input
    for (int64_t l = 0; l < c.num_layers; ++l) {
        size_t i = 0;
        block_acts_for_each(c, B, T, a, [&](const char* name, auto, DType dtype, Shape s) {
            size_t entry;
            if (!shape.recompute || i == 0)
                entry = add_entry(act, fmt::format("layers.{}.{}", l, name), dtype, s);
            else if (l == 0)
                shared.push_back(entry = add_entry(act, fmt::format("recompute.{}", name), dtype, s));
            else
                entry = shared[i - 1];
            plan.block_acts[size_t(l)].push_back(entry);
            ++i;
        });
    }
    plan.final_x = add_entry(act, "final.x", a, Shape{B, T, C});
    plan.final_norm_out = add_entry(act, "final.norm_out", a, Shape{B, T, C});
    if (c.norm == NormKind::kLayerNorm)
        plan.final_norm_mean = add_entry(act, "final.norm_mean", DType::kF32, Shape{N});
    plan.final_norm_rstd = add_entry(act, "final.norm_rstd", DType::kF32, Shape{N});
    plan.lm_lse = add_entry(act, "lm_head.lse", DType::kF32, Shape{N});
    plan.loss = add_entry(act, "lm_head.loss", DType::kF32, Shape{1});

    ArenaLayout& scr = plan.scratch;
    block_scratch_for_each(c, B, T, a, [&](const char* name, auto, DType dtype, Shape s) {
        plan.block_scratch.push_back(add_entry(scr, name, dtype, s));
    });
    plan.dres = add_entry(scr, "dresidual", a, Shape{B, T, C});
    plan.lm_chunk = add_entry(scr, "lm_head.logits_chunk", DType::kF32, Shape{Nc, V});
    if (c.position == PositionKind::kRope) {
        const int64_t half = rope_rotary_dim(c.rope) / 2;
        plan.rope_cos = add_entry(scr, "rope.cos", DType::kF32, Shape{T, half});
        plan.rope_sin = add_entry(scr, "rope.sin", DType::kF32, Shape{T, half});
    }
    plan.grad_norm = add_entry(scr, "optimizer.grad_norm", DType::kF32, Shape{1});
    return plan;
}

std::string MemoryPlan::table(std::string_view title) const {
    std::string out = fmt::format("memory plan: {}\n", title);
    out += fmt::format("  batch {} x {} tokens, LM-head chunk {} rows, on the {} ({} activations{})\n",
                       shape.batch, shape.seq_len, shape.lm_head_chunk_rows,
                       backend_name(shape.backend), dtype_name(activation_dtype(shape.backend)),
                       shape.recompute ? ", full recompute" : "");
    const std::pair<const char*, size_t> rows[] = {
        {"parameters", parameter_bytes()},
        {"gradients", gradient_bytes()},
        {"optimizer state (AdamW m, v)", optimizer_bytes()},
        {"activations", activation_bytes()},
        {"scratch", scratch_bytes()},
        {"runtime (CUDA workspaces)", runtime},
    };
    for (const auto& [name, bytes] : rows)
        out += fmt::format("  {:<30} {:>16} B  {:>12}\n", name, bytes, format_bytes(bytes));
    out += fmt::format("  {:<30} {:>16} B  {:>12}\n", "total", total_bytes(),
                       format_bytes(total_bytes()));
    return out;
}

}  // namespace lathe
