#include "infer/tensor_parallel.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <span>
#include <thread>

#include "core/arena.h"
#include "core/check.h"
#include "core/finite.h"
#include "io/safetensors.h"
#include "model/hf_config.h"
#include "model/init.h"
#include "model/model_io.h"
#include "model/param_staging.h"
#include "model/registry.h"
#include "ops/cuda/cuda_state.h"

namespace lathe {

namespace {

// The parameter table of `config`, as Model::create builds it.
ParamTable table_of(const ModelConfig& config) {
    ParamTableBuilder b;
    model_family_of(config).build_params(config, b);
    return std::move(b).finish();
}

// splitmix64: the counter-based generator of the random weights.
uint64_t mix(uint64_t x) {
    x += 0x9E3779B97F4A7C15ULL;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
    return x ^ (x >> 31);
}

uint64_t name_key(std::string_view name) {
    uint64_t h = 0xCBF29CE484222325ULL;  // FNV-1a
    for (char ch : name) h = (h ^ uint8_t(ch)) * 0x100000001B3ULL;
    return h;
}

// Fills x[0, n) with uniform numbers in [-a, a] keyed by (seed, key, index), on all cores.
void fill_uniform(float* x, int64_t n, double a, uint64_t seed, uint64_t key) {
    const int threads = int(
        std::clamp<int64_t>(n / (1 << 20), 1, std::max(1u, std::thread::hardware_concurrency())));
    auto run = [&](int64_t begin, int64_t end) {
        const uint64_t base = mix(seed ^ mix(key));
        for (int64_t i = begin; i < end; ++i) {
            const uint64_t u = mix(base + uint64_t(i));
            // 53 random bits -> [0, 1) -> [-a, a).
            x[i] = float((double(u >> 11) * 0x1.0p-53 * 2.0 - 1.0) * a);
        }
    };
    if (threads == 1) {
        run(0, n);
        return;
    }
    std::vector<std::thread> pool;
    const int64_t per = (n + threads - 1) / threads;
    for (int t = 0; t < threads; ++t)
        pool.emplace_back(run, std::min(n, t * per), std::min(n, (t + 1) * per));
    for (std::thread& t : pool) t.join();
}

}  // namespace

TpSplit tp_split_of(ParamRole role, TpVocab vocab) {
    switch (role) {
        case ParamRole::kTokenEmbedding:
        case ParamRole::kLmHead:
            return vocab == TpVocab::kParallel ? TpSplit::kOutputs : TpSplit::kReplicated;
        case ParamRole::kQkvWeight:
        case ParamRole::kQkvBias:
        case ParamRole::kUpWeight:
        case ParamRole::kUpBias:
            return TpSplit::kOutputs;
        case ParamRole::kOutWeight:
        case ParamRole::kDownWeight:
            return TpSplit::kInputs;
        case ParamRole::kOutBias:
        case ParamRole::kDownBias:
            return TpSplit::kRankZero;
        default:
            return TpSplit::kReplicated;
    }
}

TpVocab tp_vocab_of(const ModelConfig& local) {
    return local.vocab_parallel() ? TpVocab::kParallel : TpVocab::kReplicated;
}

Result<ModelConfig> tp_local_config(const ModelConfig& full, int tp, std::string_view flag,
                                    TpVocab vocab, int rank) {
    if (tp < 1) return invalid_argument_error("{} must be >= 1, got {}", flag, tp);
    LATHE_CHECK(rank >= 0 && rank < tp, "tp_local_config: rank {} of {}", rank, tp);
    if (full.num_heads % tp != 0 || full.num_kv_heads % tp != 0 ||
        full.intermediate_size % tp != 0) {
        return invalid_argument_error(
            "{} {} must divide the attention heads ({}), the key/value heads ({}) and the MLP "
            "width intermediate_size ({}) of this {} model; choose a divisor of all three",
            flag, tp, full.num_heads, full.num_kv_heads, full.intermediate_size, full.model_type);
    }
    ModelConfig local = full;
    local.num_heads = full.num_heads / tp;
    local.num_kv_heads = full.num_kv_heads / tp;
    local.intermediate_size = full.intermediate_size / tp;
    if (vocab == TpVocab::kParallel) {
        // No padding: a vocabulary that T does not divide is refused (a padded one would need
        // rows no checkpoint has and logits no target may name).
        if (full.vocab_size % tp != 0) {
            return invalid_argument_error(
                "{} {} must divide the vocabulary ({} tokens) of this {} model: the embedding "
                "and the LM head are split by vocabulary rows; choose a divisor of {}",
                flag, tp, full.vocab_size, full.model_type, full.vocab_size);
        }
        local.vocab_size = full.vocab_size / tp;
        local.vocab_total = full.vocab_size;
        local.vocab_begin = int64_t(rank) * local.vocab_size;
    }
    // head_dim is a field of its own (not hidden / heads), so it stays the full model's.
    if (tp > 1) {
        // Each split tensor of the local table must be the full one's with the split dimension
        // divided by tp: a family that sizes a projection from hidden_size rather than the heads
        // (GPT-NeoX's query_key_value and dense) has no shard of this form.
        const ParamTable table = table_of(local), whole = table_of(full);
        for (const HfParam& p : table.hf_params()) {
            const TpSplit s = tp_split_of(table.entries()[p.entry].role, vocab);
            if (s == TpSplit::kReplicated || s == TpSplit::kRankZero) continue;
            const HfParam* f = whole.find_hf(p.name);
            const int axis = s == TpSplit::kOutputs ? 0 : p.shape.rank() - 1;
            if (f == nullptr || f->shape != p.shape.with_dim(axis, p.shape[axis] * tp)) {
                return unimplemented_error(
                    "{} {}: {} sizes {} from the hidden size, not from the heads, so it has no "
                    "tensor-parallel shard; tensor parallel runs the llama, mistral and qwen2 "
                    "families (use {} 1)",
                    flag, tp, full.model_type, p.name, flag);
            }
            if (p.layout == HfLayout::kTransposed) {
                return unimplemented_error(
                    "{} {}: {} stores {} transposed (Conv1D), and its tensor-parallel slice is "
                    "not a row range; tensor parallel runs the llama, mistral and qwen2 families "
                    "(use {} 1)",
                    flag, tp, full.model_type, p.name, flag);
            }
        }
    }
    return local;
}

Status tp_read_slice(const SafetensorsTensor& full, const HfParam& local, ParamRole role, int rank,
                     int tp, std::string_view where, TensorView out, TpVocab vocab) {
    LATHE_CHECK(
        out.dtype() == DType::kF32 && out.device() == Device::kCpu && out.shape() == local.shape,
        "tp_read_slice of {} into {}", local.name, out.to_string());
    LATHE_CHECK(rank >= 0 && rank < tp, "rank {} of {}", rank, tp);
    const TpSplit split = tp_split_of(role, vocab);
    const Shape& ls = local.shape;
    // The shape the checkpoint must have: the local shape with the split dimension times tp.
    std::vector<int64_t> want;
    for (int i = 0; i < ls.rank(); ++i) want.push_back(ls[i]);
    int axis = -1;
    if (split == TpSplit::kOutputs) axis = 0;
    if (split == TpSplit::kInputs) axis = ls.rank() - 1;
    if (axis >= 0 && local.layout == HfLayout::kTransposed)
        return unimplemented_error("{}: tensor {} is stored transposed; it cannot be split", where,
                                   local.name);
    if (axis >= 0) want[size_t(axis)] *= tp;
    if (full.shape != want) {
        return invalid_argument_error(
            "{}: tensor {} has shape {}, but config.json gives [{}] for it; the checkpoint and its "
            "config.json disagree",
            where, local.name, full.shape_string(), fmt::join(want, ", "));
    }
    float* dst = out.as<float>();
    // The values read that are NaN or infinite; `first` in the stored tensor's elements.
    NonFiniteCount bad;
    auto read = [&](uint64_t begin, uint64_t n, float* to) -> Status {
        if (!safetensors_convert_elements(full, begin, n, SafetensorsDtype::kF32, to))
            return unimplemented_error("{}: tensor {} is {}; lathe loads F32, BF16 and F16 weights",
                                       where, local.name, safetensors_dtype_name(full.dtype));
        add_non_finite(bad, to, int64_t(n), int64_t(begin));
        return ok_status();
    };
    const int64_t n = ls.numel();
    switch (split) {
        case TpSplit::kReplicated:
            LATHE_RETURN_IF_ERROR(read(0, uint64_t(n), dst));
            break;
        case TpSplit::kRankZero:
            if (rank == 0) {
                LATHE_RETURN_IF_ERROR(read(0, uint64_t(n), dst));
            } else {
                std::fill(dst, dst + n, 0.0f);
            }
            break;
        case TpSplit::kOutputs:
            // Rows rank*n0 .. (rank+1)*n0 of the HF tensor: one contiguous range.
            LATHE_RETURN_IF_ERROR(read(uint64_t(rank) * uint64_t(n), uint64_t(n), dst));
            break;
        case TpSplit::kInputs: {
            // Columns rank*w .. (rank+1)*w of every row.
            const int64_t w = ls[ls.rank() - 1], rows = n / w, full_w = w * tp;
            for (int64_t r = 0; r < rows; ++r)
                LATHE_RETURN_IF_ERROR(
                    read(uint64_t(r * full_w + rank * w), uint64_t(w), dst + r * w));
            break;
        }
    }
    return check_finite_weights(bad, n, std::string(where), local.name);
}

Result<Model> tp_model_create_loaded(const ModelConfig& full, int rank, int tp,
                                     const ModelShape& shape, const Context& ctx,
                                     const std::string& dir) {
    LATHE_ASSIGN_OR_RETURN(ModelConfig local, tp_local_config(full, tp, "--tensor-parallel"));
    LATHE_ASSIGN_OR_RETURN(Model model, Model::create(local, shape, ctx));
    LATHE_RETURN_IF_ERROR(tp_model_load(model, rank, tp, dir));
    return model;
}

Status tp_model_load(Model& model, int rank, int tp, const std::string& dir) {
    const ModelConfig& local = model.config();
    auto opened = SafetensorsCheckpoint::open(dir);
    if (!opened.ok()) return opened.status().with_context("--checkpoint");
    const SafetensorsCheckpoint& ckpt = *opened;
    const ParamTable& table = model.params();
    const ModelFamily& family = model_family_of(local);
    const std::string where = !ckpt.index_path().empty()
                                  ? ckpt.index_path()
                                  : (ckpt.shard_paths().empty() ? dir : ckpt.shard_paths()[0]);
    // Entry by entry: the HF tensors of an entry (q, k, v stacked) fill one host copy of it.
    std::vector<std::vector<const HfParam*>> of_entry(table.entries().size());
    for (const HfParam& p : table.hf_params()) of_entry[p.entry].push_back(&p);
    HostTensor hf;
    for (size_t e = 0; e < table.entries().size(); ++e) {
        const ParamEntry& entry = table.entries()[e];
        HostTensor host(DType::kF32, entry.shape);
        for (const HfParam* p : of_entry[e]) {
            std::string name = p->name;
            if (!ckpt.contains(name) && name.starts_with(family.base_model_prefix) &&
                ckpt.contains(name.substr(family.base_model_prefix.size())))
                name = name.substr(family.base_model_prefix.size());
            Result<const SafetensorsTensor*> found = ckpt.tensor(name);
            if (!found.ok())
                return found.status().with_context(
                    fmt::format("--checkpoint: loading the rank {} shard of {} of {} weights", rank,
                                tp, local.model_type));
            hf = HostTensor(DType::kF32, p->shape);
            LATHE_RETURN_IF_ERROR(tp_read_slice(**found, *p, entry.role, rank, tp, where, hf.view(),
                                                tp_vocab_of(local)));
            hf_param_import(*p, host.view(), hf.view());
        }
        model.write_param_entry(entry.arena_index, host.view());
    }
    model.synchronize();
    return ok_status();
}

Result<Model> tp_model_create_random(const ModelConfig& full, int rank, int tp,
                                     const ModelShape& shape, const Context& ctx, uint64_t seed) {
    (void)rank;  // every rank draws the same numbers (header comment)
    LATHE_ASSIGN_OR_RETURN(ModelConfig local, tp_local_config(full, tp, "--tensor-parallel"));
    LATHE_ASSIGN_OR_RETURN(Model model, Model::create(local, shape, ctx));
    const ParamTable& table = model.params();
    std::vector<std::vector<const HfParam*>> of_entry(table.entries().size());
    for (const HfParam& p : table.hf_params()) of_entry[p.entry].push_back(&p);
    for (size_t e = 0; e < table.entries().size(); ++e) {
        const ParamEntry& entry = table.entries()[e];
        HostTensor host(DType::kF32, entry.shape);
        const int64_t row = entry.shape.rank() > 1 ? entry.shape.numel() / entry.shape[0] : 1;
        for (const HfParam* p : of_entry[e]) {
            float* x = host.as<float>() + p->row_begin * row;
            const int64_t n = p->rows * row;
            switch (p->init) {
                case InitKind::kOnes:
                    std::fill(x, x + n, 1.0f);
                    break;
                case InitKind::kZeros:
                    std::fill(x, x + n, 0.0f);
                    break;
                case InitKind::kNormal:
                case InitKind::kNormalScaledByDepth: {
                    double std = local.initializer_range;
                    if (p->init == InitKind::kNormalScaledByDepth)
                        std /= std::sqrt(2.0 * double(local.num_layers));
                    // uniform(-a, a) has standard deviation a / sqrt(3).
                    fill_uniform(x, n, std * std::sqrt(3.0), seed, name_key(p->name));
                    break;
                }
            }
        }
        model.write_param_entry(entry.arena_index, host.view());
    }
    model.synchronize();
    return model;
}

void tp_slice_hf(ConstTensorView whole, TpSplit split, int rank, int tp, TensorView part) {
    const float* src = whole.as<float>();
    float* dst = part.as<float>();
    const int64_t n = part.numel();
    switch (split) {
        case TpSplit::kReplicated:
            std::copy(src, src + n, dst);
            return;
        case TpSplit::kRankZero:
            if (rank == 0)
                std::copy(src, src + n, dst);
            else
                std::fill(dst, dst + n, 0.0f);
            return;
        case TpSplit::kOutputs:
            std::copy(src + int64_t(rank) * n, src + int64_t(rank + 1) * n, dst);
            return;
        case TpSplit::kInputs: {
            const int64_t w = part.shape()[part.rank() - 1], rows = n / w, full_w = w * tp;
            for (int64_t r = 0; r < rows; ++r)
                std::copy(src + r * full_w + rank * w, src + r * full_w + (rank + 1) * w,
                          dst + r * w);
            return;
        }
    }
}

namespace {

// `ranks` (tp chunks of the local HF tensor's numel, in rank order) assembled into the full HF
// tensor `whole`: slice_of's inverse.
void assemble(const float* ranks, const Shape& local, TpSplit split, int tp, TensorView whole) {
    float* dst = whole.as<float>();
    const int64_t n = local.numel();
    switch (split) {
        case TpSplit::kReplicated:
        case TpSplit::kRankZero:
            std::copy(ranks, ranks + n, dst);
            return;
        case TpSplit::kOutputs:
            std::copy(ranks, ranks + n * tp, dst);
            return;
        case TpSplit::kInputs: {
            const int64_t w = local[local.rank() - 1], rows = n / w, full_w = w * tp;
            for (int k = 0; k < tp; ++k)
                for (int64_t r = 0; r < rows; ++r)
                    std::copy(ranks + k * n + r * w, ranks + k * n + (r + 1) * w,
                              dst + r * full_w + k * w);
            return;
        }
    }
}

// Every rank's `mine` (host f32) in rank order into `all` (comm.size() times as long), through a
// device buffer of `ctx` on CUDA.
Status gather_host(Communicator& comm, const Context& ctx, std::span<const float> mine,
                   std::span<float> all) {
    const int64_t n = int64_t(mine.size()), W = comm.size();
    LATHE_CHECK(int64_t(all.size()) == n * W, "gather of {} x {} into {}", W, n, all.size());
    if (ctx.backend != Backend::kCuda) {
        return comm.all_gather(TensorView(all.data(), DType::kF32, Shape{n * W}, Device::kCpu),
                               ConstTensorView(mine.data(), DType::kF32, Shape{n}, Device::kCpu),
                               nullptr);
    }
    ArenaLayout layout;
    LATHE_ASSIGN_OR_RETURN(const size_t at, layout.add("gather", DType::kF32, Shape{n * W}));
    LATHE_ASSIGN_OR_RETURN(ModelArena buf, ModelArena::allocate(std::move(layout), ctx));
    const TensorView dall = buf.view(at);
    const TensorView dmine = dall.slice(comm.rank() * n, (comm.rank() + 1) * n);
    cuda_copy_sync(dmine, ConstTensorView(mine.data(), DType::kF32, Shape{n}, Device::kCpu),
                   ctx.stream);
    LATHE_RETURN_IF_ERROR(comm.all_gather(dall, dmine, ctx.stream));
    cuda_copy_sync(TensorView(all.data(), DType::kF32, Shape{n * W}, Device::kCpu), dall,
                   ctx.stream);
    return ok_status();
}

}  // namespace

void tp_model_init(Model& local, const ModelConfig& full, int rank, int tp, uint64_t seed) {
    const ParamTable& table = local.params();
    const ParamTable whole = table_of(full);
    std::vector<std::vector<const HfParam*>> of_entry(table.entries().size());
    for (const HfParam& p : table.hf_params()) of_entry[p.entry].push_back(&p);
    for (size_t e = 0; e < table.entries().size(); ++e) {
        const ParamEntry& entry = table.entries()[e];
        HostTensor host(DType::kF32, entry.shape);
        const TpSplit split = tp_split_of(entry.role, tp_vocab_of(local.config()));
        for (const HfParam* p : of_entry[e]) {
            const HfParam* f = whole.find_hf(p->name);
            LATHE_CHECK(f != nullptr, "tp_model_init: {} has no tensor {}", full.model_type,
                        p->name);
            // The families tensor parallel takes store every tensor as HF lays it out, so the HF
            // tensor is f's rows as they are: the shard's elements are drawn at their indices in
            // the whole tensor (init.h), the ones tp_slice_hf would cut from it, and no more.
            LATHE_CHECK(f->layout == HfLayout::kSame && p->layout == HfLayout::kSame,
                        "tp_model_init: {} of {} is not stored as HF lays it out", p->name,
                        full.model_type);
            HostTensor part(DType::kF32, p->shape);
            float* x = part.as<float>();
            const int64_t n = part.numel();
            const int64_t w = p->shape[p->shape.rank() - 1], full_w = w * tp;
            const HfParamInit init = hf_param_init(full, *f);
#pragma omp parallel for schedule(static) if (n > (int64_t(1) << 16))
            for (int64_t i = 0; i < n; ++i) {
                int64_t at = i;  // kReplicated, kRankZero (rank 0)
                if (split == TpSplit::kOutputs) at = int64_t(rank) * n + i;
                if (split == TpSplit::kInputs) at = (i / w) * full_w + int64_t(rank) * w + i % w;
                x[i] = split == TpSplit::kRankZero && rank != 0 ? 0.0f : init.at(seed, at);
            }
            hf_param_import(*p, host.view(), part.view());
        }
        local.write_param_entry(entry.arena_index, host.view());
    }
    local.synchronize();
}

std::vector<FlatRange> tp_replicated_ranges(const Model& local) {
    std::vector<FlatRange> out;
    for (const ParamEntry& e : local.params().entries()) {
        if (tp_split_of(e.role, tp_vocab_of(local.config())) != TpSplit::kReplicated) continue;
        const ArenaEntry& a = local.plan().params.entries()[e.arena_index];
        const int64_t begin = int64_t(a.offset / sizeof(float));
        out.push_back(FlatRange{begin, begin + e.shape.numel()});
    }
    return out;
}

namespace {

ModelConfig checked_local(const ModelConfig& full, int tp, TpVocab vocab) {
    Result<ModelConfig> local = tp_local_config(full, tp, "parallel.tensor", vocab);
    LATHE_CHECK(local.ok(), "{}", local.status().to_string());
    return std::move(*local);
}

}  // namespace

int64_t tp_canonical_length(const ModelConfig& full, int tp, TpVocab vocab) {
    return int64_t(table_of(checked_local(full, tp, vocab)).layout().total_bytes() / sizeof(float));
}

std::vector<float> tp_reshard_moments(const ModelConfig& full, int from,
                                      std::span<const std::vector<float>> old, int tp, int rank,
                                      TpVocab vocab) {
    LATHE_CHECK(int(old.size()) == from, "{} moment vectors of a split over {}", old.size(), from);
    const ParamTable before = table_of(checked_local(full, from, vocab));
    const ParamTable after = table_of(checked_local(full, tp, vocab));
    const ParamTable whole = table_of(full);
    const int64_t used_before = int64_t(before.layout().total_bytes() / sizeof(float));
    for (const std::vector<float>& v : old)
        LATHE_CHECK(int64_t(v.size()) == used_before, "moments of {} elements, the split has {}",
                    v.size(), used_before);
    std::vector<float> out(after.layout().total_bytes() / sizeof(float), 0.0f);
    std::vector<float> ranks;
    for (const HfParam& p : after.hf_params()) {
        const HfParam* q = before.find_hf(p.name);
        const HfParam* f = whole.find_hf(p.name);
        LATHE_CHECK(q != nullptr && f != nullptr, "tp_reshard_moments: no tensor {}", p.name);
        const TpSplit split = tp_split_of(after.entries()[p.entry].role, vocab);
        const ParamEntry& qe = before.entries()[q->entry];
        const size_t q_at = before.layout().entries()[qe.arena_index].offset / sizeof(float);
        const int64_t n = q->shape.numel();
        ranks.resize(size_t(n * from));
        for (int r = 0; r < from; ++r) {
            const ConstTensorView entry(old[size_t(r)].data() + q_at, DType::kF32, qe.shape,
                                        Device::kCpu);
            hf_param_export(*q, entry,
                            TensorView(ranks.data() + r * n, DType::kF32, q->shape, Device::kCpu));
        }
        HostTensor full_hf(DType::kF32, f->shape), part(DType::kF32, p.shape);
        assemble(ranks.data(), q->shape, split, from, full_hf.view());
        tp_slice_hf(full_hf.view(), split, rank, tp, part.view());
        const ParamEntry& pe = after.entries()[p.entry];
        const size_t p_at = after.layout().entries()[pe.arena_index].offset / sizeof(float);
        hf_param_import(p, TensorView(out.data() + p_at, DType::kF32, pe.shape, Device::kCpu),
                        part.view());
    }
    return out;
}

Status tp_save_hf(const Model& local, ParamStaging& staging, const ModelConfig& full,
                  Communicator& comm, const Context& ctx, const std::string& dir) {
    const int tp = comm.size();
    const ParamTable& table = local.params();
    const ParamTable whole = table_of(full);
    const bool writer = comm.rank() == 0;
    std::vector<HostTensor> staged;
    staged.reserve(whole.hf_params().size());
    std::vector<SafetensorsWriteTensor> tensors;
    std::vector<float> all;
    // In the full table's order: the file lists the tensors as model_save_hf does.
    for (const HfParam& f : whole.hf_params()) {
        const HfParam* p = table.find_hf(f.name);
        LATHE_CHECK(p != nullptr, "tp_save_hf: the local model has no tensor {}", f.name);
        const TpSplit split =
            tp_split_of(table.entries()[p->entry].role, tp_vocab_of(local.config()));
        HostTensor mine(DType::kF32, p->shape);
        hf_param_export(*p, staging.host(table.entries()[p->entry].arena_index), mine.view());
        const int64_t n = p->shape.numel();
        const bool whole_here = split == TpSplit::kReplicated || split == TpSplit::kRankZero;
        if (!whole_here) {
            all.resize(size_t(n * tp));
            LATHE_RETURN_IF_ERROR(
                gather_host(comm, ctx, std::span<const float>(mine.as<float>(), size_t(n)), all)
                    .with_context(fmt::format("gathering {} for the checkpoint", f.name)));
        }
        if (!writer) continue;
        staged.emplace_back(DType::kF32, f.shape);
        assemble(whole_here ? mine.as<float>() : all.data(), p->shape, split, tp,
                 staged.back().view());
        tensors.push_back(safetensors_write_tensor(f.name, staged.back().view()));
    }
    if (!writer) return ok_status();
    LATHE_RETURN_IF_ERROR(safetensors_write_checkpoint(dir, tensors).status());
    HfModelConfig hf = full.hf;
    hf.torch_dtype = "float32";
    return hf_config_save(dir + "/config.json", hf);
}

Status tp_broadcast_bytes(Communicator& comm, const Context& ctx, std::vector<uint8_t>& bytes) {
    if (comm.size() == 1) return ok_status();
    const bool device = ctx.backend == Backend::kCuda;
    int64_t size = comm.rank() == 0 ? int64_t(bytes.size()) : 0;
    if (!device) {
        LATHE_RETURN_IF_ERROR(
            comm.broadcast(TensorView(&size, DType::kI64, Shape{1}, Device::kCpu), 0, nullptr));
        bytes.resize(size_t(size));
        if (size == 0) return ok_status();
        return comm.broadcast(TensorView(bytes.data(), DType::kU8, Shape{size}, Device::kCpu), 0,
                              nullptr);
    }
    // NCCL: through a device buffer (the size in its first 8 bytes, then the bytes).
    ArenaLayout layout;
    LATHE_ASSIGN_OR_RETURN(const size_t head, layout.add("size", DType::kI64, Shape{1}));
    LATHE_ASSIGN_OR_RETURN(ModelArena small, ModelArena::allocate(std::move(layout), ctx));
    const TensorView dsize = small.view(head);
    const TensorView hsize(&size, DType::kI64, Shape{1}, Device::kCpu);
    cuda_copy_sync(dsize, hsize, ctx.stream);
    LATHE_RETURN_IF_ERROR(comm.broadcast(dsize, 0, ctx.stream));
    cuda_copy_sync(hsize, dsize, ctx.stream);
    bytes.resize(size_t(size));
    if (size == 0) return ok_status();
    ArenaLayout body;
    LATHE_ASSIGN_OR_RETURN(const size_t b, body.add("bytes", DType::kU8, Shape{size}));
    LATHE_ASSIGN_OR_RETURN(ModelArena big, ModelArena::allocate(std::move(body), ctx));
    const TensorView dbytes = big.view(b);
    const TensorView hbytes(bytes.data(), DType::kU8, Shape{size}, Device::kCpu);
    cuda_copy_sync(dbytes, hbytes, ctx.stream);
    LATHE_RETURN_IF_ERROR(comm.broadcast(dbytes, 0, ctx.stream));
    cuda_copy_sync(hbytes, dbytes, ctx.stream);
    return ok_status();
}

Status tp_broadcast_token_lists(Communicator& comm, const Context& ctx,
                                std::vector<std::vector<int32_t>>& lists, bool rank0_failed) {
    if (comm.size() == 1) return ok_status();
    // [count, len_0, ids_0..., len_1, ids_1...] as i32; count -1: rank 0 failed.
    std::vector<int32_t> flat;
    if (comm.rank() == 0 && rank0_failed) {
        flat.push_back(-1);
    } else if (comm.rank() == 0) {
        flat.push_back(int32_t(lists.size()));
        for (const auto& l : lists) {
            flat.push_back(int32_t(l.size()));
            flat.insert(flat.end(), l.begin(), l.end());
        }
    }
    std::vector<uint8_t> bytes(flat.size() * sizeof(int32_t));
    if (!bytes.empty()) std::memcpy(bytes.data(), flat.data(), bytes.size());
    LATHE_RETURN_IF_ERROR(tp_broadcast_bytes(comm, ctx, bytes));
    flat.resize(bytes.size() / sizeof(int32_t));
    if (!bytes.empty()) std::memcpy(flat.data(), bytes.data(), bytes.size());
    if (comm.rank() == 0) return ok_status();
    lists.clear();
    size_t at = 0;
    const int32_t count = flat.at(at++);
    if (count < 0) {
        return failed_precondition_error(
            "rank {}: rank 0 could not read the input (rank 0 prints why)", comm.rank());
    }
    for (int32_t i = 0; i < count; ++i) {
        const size_t len = size_t(flat.at(at++));
        lists.emplace_back(flat.begin() + int64_t(at), flat.begin() + int64_t(at + len));
        at += len;
    }
    return ok_status();
}

TensorParallelRowMover::TensorParallelRowMover(Communicator& comm, const Context& ctx, int chunks,
                                               bool overlap, Status* error, int reserve_sms)
    : comm_(comm), ctx_(ctx), chunks_(chunks), error_(error) {
    LATHE_CHECK(chunks >= 1 && chunks <= kEvents / 2 && error != nullptr,
                "TensorParallelRowMover: chunks {} (1 to {}) and an error slot", chunks,
                kEvents / 2);
    if (overlap && ctx.backend == Backend::kCuda) {
        LATHE_CHECK(ctx.cuda != nullptr, "TensorParallelRowMover: a CUDA context without a state");
        done_.resize(kEvents);
        const int sms = ctx.cuda->sm_count();
        LATHE_CHECK(reserve_sms >= 0 && reserve_sms < sms,
                    "TensorParallelRowMover: {} SMs reserved of the device's {}", reserve_sms, sms);
        if (reserve_sms > 0) gemm_sms_ = sms - reserve_sms;
    }
}

int TensorParallelRowMover::begin(bool gather, TensorView out, ConstTensorView in) {
    // After a failure: no more collectives, and the ticket of the last one begun, so that a wait
    // still orders compute after every move in flight (the step is then thrown away).
    if (!error_->ok()) return last_;
    if (done_.empty()) {
        *error_ = gather ? comm_.all_gather(out, in, ctx_.stream)
                         : comm_.reduce_scatter(out, in, ReduceOp::kSum, ctx_.stream);
        return 0;
    }
    CudaState& state = *ctx_.cuda;
    CUstream_st* side = state.tensor_stream();
    state.wait_for(side, ctx_.stream);
    *error_ = gather ? comm_.all_gather(out, in, side)
                     : comm_.reduce_scatter(out, in, ReduceOp::kSum, side);
    const int ticket = last_ = next_;
    next_ = (next_ + 1) % (1 << 30);  // a multiple of kEvents: the ring's slots stay in turn
    done_[size_t(ticket % kEvents)].record(side);
    return ticket;
}

TensorParallelRows TensorParallelRowMover::rows() {
    TensorParallelRows r;
    r.chunks = chunks_;
    r.gemm_sms = gemm_sms_;
    r.gather = [this](TensorView out, ConstTensorView in) { return begin(true, out, in); };
    r.scatter = [this](TensorView out, ConstTensorView in) { return begin(false, out, in); };
    r.wait = [this](int ticket) {
        if (!done_.empty()) done_[size_t(ticket % kEvents)].wait(ctx_.stream);
    };
    return r;
}

}  // namespace lathe
