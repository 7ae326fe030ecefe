#include "model/model.h"

#include <bit>
#include <cmath>
#include <cstring>
#include <unordered_set>

#include "core/check.h"
#include "core/log.h"
#include "io/safetensors.h"
#include "model/init.h"
#include "model/registry.h"
#include "ops/embedding.h"
#include "ops/linear.h"
#include "ops/lm_head_cross_entropy.h"
#include "ops/rope.h"

namespace lathe {

namespace {

// Host <-> model memory copies: the one place a device backend adds its transfers.
void copy_host_to_model(TensorView dst, ConstTensorView src, const Context& ctx) {
    LATHE_CHECK(src.device() == Device::kCpu && dst.bytes() == src.bytes(), "copy of {} into {}",
                src.to_string(), dst.to_string());
    LATHE_CHECK(ctx.backend == Backend::kCpu,
                "host-to-device copies are not implemented for the {} backend yet",
                backend_name(ctx.backend));
    if (dst.data() != src.data()) std::memcpy(dst.data(), src.data(), src.bytes());
}

float read_scalar(ConstTensorView v, const Context& ctx) {
    LATHE_CHECK(ctx.backend == Backend::kCpu && v.numel() == 1 && v.dtype() == DType::kF32,
                "read_scalar of {} on the {} backend", v.to_string(), backend_name(ctx.backend));
    return *v.as<float>();
}

// IEEE binary16 to float (exact), for fp16 checkpoints such as Pythia's.
float half_to_float(uint16_t h) {
    const uint32_t sign = uint32_t(h & 0x8000u) << 16;
    const uint32_t exp = (h >> 10) & 0x1Fu, man = h & 0x3FFu;
    if (exp == 0x1F) return std::bit_cast<float>(sign | 0x7F800000u | (man << 13));  // inf / nan
    if (exp != 0) return std::bit_cast<float>(sign | ((exp + 112) << 23) | (man << 13));
    const float sub = std::ldexp(float(man), -24);  // subnormal or zero
    return sign ? -sub : sub;
}

// Every id in [lo, hi), or -100 where allowed; a bug upstream otherwise (the data layer checks
// token files against the vocabulary).
void check_ids(ConstTensorView ids, std::string_view what, int64_t lo, int64_t hi,
               bool allow_ignore) {
    const int32_t* p = ids.as<int32_t>();
    for (int64_t i = 0; i < ids.numel(); ++i) {
        const int32_t v = p[i];
        LATHE_CHECK((v >= lo && v < hi) || (allow_ignore && v == kIgnoreIndex),
                    "{}[{}] = {} is outside [{}, {}){}", what, i, v, lo, hi,
                    allow_ignore ? " and not -100" : "");
    }
}

}  // namespace

// ---- ModelArena ----

Result<ModelArena> ModelArena::allocate(ArenaLayout layout, const Context& ctx) {
    if (ctx.backend != Backend::kCpu)
        return unimplemented_error("the {} backend has no model arenas yet (issue 4)",
                                   backend_name(ctx.backend));
    ModelArena arena;
    LATHE_ASSIGN_OR_RETURN(arena.host_, HostArena::allocate(std::move(layout)));
    arena.layout_ = arena.host_.layout();
    arena.base_ = arena.host_.bytes().data();
    arena.device_ = Device::kCpu;
    return arena;
}

TensorView ModelArena::view(size_t index, const Shape& shape) const {
    const TensorView full = view(index);
    LATHE_CHECK(shape.numel() <= full.numel(), "view {} of arena entry {} ({})", shape.to_string(),
                layout_.entries()[index].name, full.to_string());
    return TensorView(full.data(), full.dtype(), shape, device_);
}

TensorView ModelArena::flat_f32() const {
    return TensorView(base_, DType::kF32, Shape{int64_t(layout_.total_bytes() / sizeof(float))},
                      device_);
}

void ModelArena::zero() {
    LATHE_CHECK(device_ == Device::kCpu, "zeroing device arenas is not implemented yet");
    host_.zero();
}

// ---- Model: creation and parameters ----

Result<Model> Model::create(ModelConfig config, const ModelShape& shape, const Context& ctx) {
    Model m;
    m.table_ = model_param_table(config);
    LATHE_ASSIGN_OR_RETURN(m.plan_, memory_plan_make(config, m.table_, shape));
    m.config_ = std::move(config);
    m.ctx_ = ctx;
    LATHE_ASSIGN_OR_RETURN(m.params_, ModelArena::allocate(m.plan_.params, ctx));
    LATHE_ASSIGN_OR_RETURN(m.grads_, ModelArena::allocate(m.plan_.params, ctx));
    LATHE_ASSIGN_OR_RETURN(m.acts_, ModelArena::allocate(m.plan_.activations, ctx));
    LATHE_ASSIGN_OR_RETURN(m.scratch_, ModelArena::allocate(m.plan_.scratch, ctx));
    if (m.config_.position == PositionKind::kRope) {
        const TensorView cos = m.scratch_.view(m.plan_.rope_cos);
        HostTensor host_cos(DType::kF32, cos.shape()), host_sin(DType::kF32, cos.shape());
        rope_build_table(host_cos.view(), host_sin.view(), m.config_.rope);
        copy_host_to_model(cos, host_cos.view(), ctx);
        copy_host_to_model(m.scratch_.view(m.plan_.rope_sin), host_sin.view(), ctx);
    }
    return m;
}

void Model::init(uint64_t seed) {
    for (const HfParam& p : table_.hf_params())
        init_hf_param(config_, p, params_.view(table_.entries()[p.entry].arena_index), seed);
}

void Model::read_param_hf(std::string_view name, TensorView out) const {
    const HfParam* p = table_.find_hf(name);
    LATHE_CHECK(p != nullptr, "no parameter called {}", name);
    hf_param_export(*p, params_.view(table_.entries()[p->entry].arena_index), out);
}

void Model::read_grad_hf(std::string_view name, TensorView out) const {
    const HfParam* p = table_.find_hf(name);
    LATHE_CHECK(p != nullptr, "no parameter called {}", name);
    hf_param_export(*p, grads_.view(table_.entries()[p->entry].arena_index), out);
}

void Model::write_param_hf(std::string_view name, ConstTensorView hf) {
    const HfParam* p = table_.find_hf(name);
    LATHE_CHECK(p != nullptr, "no parameter called {}", name);
    hf_param_import(*p, params_.view(table_.entries()[p->entry].arena_index), hf);
}

Status Model::load_hf(const SafetensorsCheckpoint& ckpt) {
    const ModelFamily& family = model_family_of(config_);
    const std::vector<std::string> shards = ckpt.shard_paths();
    const std::string where = !ckpt.index_path().empty() ? ckpt.index_path()
                              : shards.empty()           ? std::string("checkpoint")
                                                         : shards[0];
    std::unordered_set<std::string> used;
    for (const HfParam& p : table_.hf_params()) {
        std::string name = p.name;
        if (!ckpt.contains(name) && name.starts_with(family.base_model_prefix) &&
            ckpt.contains(name.substr(family.base_model_prefix.size())))
            name = name.substr(family.base_model_prefix.size());
        Result<const SafetensorsTensor*> found = ckpt.tensor(name);
        if (!found.ok())
            return found.status().with_context(fmt::format("loading {} weights ({} parameters)",
                                                           config_.model_type,
                                                           table_.hf_params().size()));
        const SafetensorsTensor& t = **found;
        used.insert(name);
        bool shape_ok = int(t.shape.size()) == p.shape.rank();
        for (int i = 0; shape_ok && i < p.shape.rank(); ++i)
            shape_ok = t.shape[size_t(i)] == p.shape[i];
        if (!shape_ok)
            return invalid_argument_error(
                "{}: tensor {} has shape {}, but config.json gives {} for it; the checkpoint and "
                "its config.json disagree",
                where, name, t.shape_string(), p.shape.to_string());
        HostTensor hf(DType::kF32, p.shape);
        float* dst = hf.as<float>();
        const int64_t n = p.shape.numel();
        switch (t.dtype) {
            case SafetensorsDtype::kF32:
                std::memcpy(dst, t.data, size_t(n) * sizeof(float));
                break;
            case SafetensorsDtype::kBF16:
                for (int64_t i = 0; i < n; ++i) {
                    uint16_t bits;
                    std::memcpy(&bits, t.data + 2 * i, 2);
                    dst[i] = bf16_to_float(bf16{bits});
                }
                break;
            case SafetensorsDtype::kF16:
                for (int64_t i = 0; i < n; ++i) {
                    uint16_t bits;
                    std::memcpy(&bits, t.data + 2 * i, 2);
                    dst[i] = half_to_float(bits);
                }
                break;
            default:
                return unimplemented_error(
                    "{}: tensor {} is {}; lathe loads F32, BF16 and F16 "
                    "weights",
                    where, name, safetensors_dtype_name(t.dtype));
        }
        hf_param_import(p, params_.view(table_.entries()[p.entry].arena_index), hf.view());
    }
    std::string unused;
    int unused_count = 0;
    for (const std::string& name : ckpt.names()) {
        if (used.count(name)) continue;
        bool ignored = false;
        for (std::string_view suffix : family.ignored_suffixes) ignored |= name.ends_with(suffix);
        // A tied model's checkpoint may still carry the head (some exporters write it).
        if (config_.tie_word_embeddings && (name == "lm_head.weight" || name == "embed_out.weight"))
            ignored = true;
        if (ignored) continue;
        if (unused_count++ < 8) unused += fmt::format("{}{}", unused.empty() ? "" : ", ", name);
    }
    if (unused_count > 0)
        log_warning("{}: {} tensors are not parameters of this {} model and were not loaded: {}{}",
                    where, unused_count, config_.model_type, unused,
                    unused_count > 8 ? ", ..." : "");
    return ok_status();
}

Status Model::save_hf(const std::string& dir) const {
    std::vector<HostTensor> staged;  // HF-layout copies (also for kSame: the rows of an entry)
    staged.reserve(table_.hf_params().size());
    std::vector<SafetensorsWriteTensor> tensors;
    for (const HfParam& p : table_.hf_params()) {
        staged.emplace_back(DType::kF32, p.shape);
        read_param_hf(p.name, staged.back().view());
        tensors.push_back(safetensors_write_tensor(p.name, staged.back().view()));
    }
    LATHE_ASSIGN_OR_RETURN(auto written, safetensors_write_checkpoint(dir, tensors));
    (void)written;
    HfModelConfig hf = config_.hf;
    hf.torch_dtype = "float32";
    return hf_config_save(dir + "/config.json", hf);
}

std::vector<AdamWSegment> Model::adamw_segments(double lr, double weight_decay) const {
    std::vector<AdamWSegment> segments;
    for (const ParamEntry& e : table_.entries()) {
        const ArenaEntry& a = plan_.params.entries()[e.arena_index];
        segments.push_back(AdamWSegment{int64_t(a.offset / sizeof(float)), e.shape.numel(), lr,
                                        e.weight_decay ? weight_decay : 0.0});
    }
    return segments;
}

void Model::zero_grads() {
    grads_.zero();
}

// ---- Model: views ----

TensorView Model::entry_rows(const ModelArena& arena, ParamRole role, int layer, int64_t begin,
                             int64_t end) const {
    const size_t e = table_.find_entry(role, layer);
    if (e == ParamTable::kNone) return TensorView();
    return arena.view(table_.entries()[e].arena_index).slice(begin, end);
}

size_t Model::head_entry() const {
    const size_t e = table_.find_entry(config_.tie_word_embeddings ? ParamRole::kTokenEmbedding
                                                                   : ParamRole::kLmHead);
    LATHE_CHECK(e != ParamTable::kNone, "{} has no LM head weight", config_.model_type);
    return table_.entries()[e].arena_index;
}

// Fills the members of a BlockWeights or BlockGrads from `arena` (parameters or gradients): the
// same slices of the same entries in both.
template <typename Views>
void Model::fill_block_views(Views& v, const ModelArena& arena, int l) const {
    const int64_t C = config_.hidden_size;
    const int64_t q = config_.num_heads * config_.head_dim;
    const int64_t kv = config_.num_kv_heads * config_.head_dim;
    const int64_t up =
        config_.mlp == MlpKind::kSwiGlu ? 2 * config_.intermediate_size : config_.intermediate_size;
    v.norm1_w = entry_rows(arena, ParamRole::kNorm1Weight, l, 0, C);
    v.norm1_b = entry_rows(arena, ParamRole::kNorm1Bias, l, 0, C);
    v.wq = entry_rows(arena, ParamRole::kQkvWeight, l, 0, q);
    v.wk = entry_rows(arena, ParamRole::kQkvWeight, l, q, q + kv);
    v.wv = entry_rows(arena, ParamRole::kQkvWeight, l, q + kv, q + 2 * kv);
    v.bq = entry_rows(arena, ParamRole::kQkvBias, l, 0, q);
    v.bk = entry_rows(arena, ParamRole::kQkvBias, l, q, q + kv);
    v.bv = entry_rows(arena, ParamRole::kQkvBias, l, q + kv, q + 2 * kv);
    v.wo = entry_rows(arena, ParamRole::kOutWeight, l, 0, C);
    v.bo = entry_rows(arena, ParamRole::kOutBias, l, 0, C);
    v.norm2_w = entry_rows(arena, ParamRole::kNorm2Weight, l, 0, C);
    v.norm2_b = entry_rows(arena, ParamRole::kNorm2Bias, l, 0, C);
    v.w_up = entry_rows(arena, ParamRole::kUpWeight, l, 0, up);
    v.b_up = entry_rows(arena, ParamRole::kUpBias, l, 0, up);
    v.w_down = entry_rows(arena, ParamRole::kDownWeight, l, 0, C);
    v.b_down = entry_rows(arena, ParamRole::kDownBias, l, 0, C);
}

BlockWeights Model::block_weights(int l) const {
    BlockWeights w;
    fill_block_views(w, params_, l);
    return w;
}

BlockGrads Model::block_grads(int l) const {
    BlockGrads g;
    fill_block_views(g, grads_, l);
    return g;
}

BlockActs Model::block_acts(int l) const {
    BlockActs a;
    size_t i = 0;
    const std::vector<size_t>& entries = plan_.block_acts[size_t(l)];
    block_acts_for_each(config_, dims_.B, dims_.T,
                        [&](const char*, TensorView BlockActs::*member, DType, const Shape& s) {
                            a.*member = act(entries[i++], s);
                        });
    const Shape x{dims_.B, dims_.T, config_.hidden_size};
    a.x_out = l + 1 < config_.num_layers ? act(plan_.block_acts[size_t(l) + 1][0], x)
                                         : act(plan_.final_x, x);
    return a;
}

BlockScratch Model::block_scratch() const {
    BlockScratch s;
    size_t i = 0;
    block_scratch_for_each(
        config_, dims_.B, dims_.T,
        [&](const char*, TensorView BlockScratch::*member, DType, const Shape& shape) {
            s.*member = scratch_.view(plan_.block_scratch[i++], shape);
        });
    return s;
}

BlockInputs Model::block_inputs() const {
    BlockInputs in;
    const Shape bt{dims_.B, dims_.T};
    if (has_docs_) in.docs = act(plan_.docs, bt);
    if (has_positions_) in.positions = act(plan_.positions, bt);
    if (config_.position == PositionKind::kRope) {
        in.rope_cos = scratch_.view(plan_.rope_cos);
        in.rope_sin = scratch_.view(plan_.rope_sin);
    }
    return in;
}

// ---- Model: steps ----

Model::Dims Model::load_batch(const ModelBatch& batch, bool need_targets) {
    const ConstTensorView tok = batch.tokens;
    LATHE_CHECK(tok.rank() == 2 && tok.dtype() == DType::kI32 && tok.device() == Device::kCpu,
                "tokens must be (B, T) i32 on the host, got {}",
                tok.is_null() ? std::string("null") : tok.to_string());
    const Dims d{tok.dim(0), tok.dim(1)};
    LATHE_CHECK(d.B >= 1 && d.T >= 1 && d.B <= plan_.shape.batch && d.T <= plan_.shape.seq_len,
                "batch ({}, {}) does not fit the plan ({}, {})", d.B, d.T, plan_.shape.batch,
                plan_.shape.seq_len);
    const Shape bt{d.B, d.T};
    auto expect = [&](ConstTensorView v, const char* what) {
        LATHE_CHECK(v.shape() == bt && v.dtype() == DType::kI32 && v.device() == Device::kCpu,
                    "{} must be ({}, {}) i32 on the host like tokens, got {}", what, d.B, d.T,
                    v.to_string());
    };
    check_ids(tok, "tokens", 0, config_.vocab_size, false);
    copy_host_to_model(act(plan_.tokens, bt), tok, ctx_);
    LATHE_CHECK(!need_targets || !batch.targets.is_null(), "forward needs targets");
    if (!batch.targets.is_null()) {
        expect(batch.targets, "targets");
        check_ids(batch.targets, "targets", 0, config_.vocab_size, true);
        copy_host_to_model(act(plan_.targets, bt), batch.targets, ctx_);
    }
    has_docs_ = !batch.docs.is_null();
    if (has_docs_) {
        expect(batch.docs, "docs");
        copy_host_to_model(act(plan_.docs, bt), batch.docs, ctx_);
    }
    has_positions_ = !batch.positions.is_null();
    if (has_positions_) {
        expect(batch.positions, "positions");
        check_ids(batch.positions, "positions", 0, plan_.shape.seq_len, false);
        copy_host_to_model(act(plan_.positions, bt), batch.positions, ctx_);
    }
    dims_ = d;
    return d;
}

void Model::run_forward_blocks() {
    const Shape bt{dims_.B, dims_.T};
    const Shape btc{dims_.B, dims_.T, config_.hidden_size};
    const int64_t N = dims_.B * dims_.T;
    // Embedding (+ learned positions) into the first block's input.
    TensorView x0 = act(plan_.block_acts[0][0], btc);
    TensorView wpe;
    ConstTensorView positions;
    if (config_.position == PositionKind::kLearned) {
        wpe = entry_rows(params_, ParamRole::kPositionEmbedding, -1, 0,
                         config_.max_position_embeddings);
        if (has_positions_) positions = act(plan_.positions, bt);
    }
    embedding_forward(x0, act(plan_.tokens, bt), positions,
                      entry_rows(params_, ParamRole::kTokenEmbedding, -1, 0, config_.vocab_size),
                      wpe, ctx_);
    const BlockScratch scratch = block_scratch();
    const BlockInputs inputs = block_inputs();
    for (int l = 0; l < int(config_.num_layers); ++l)
        block_forward(config_, l, block_weights(l), block_acts(l), scratch, inputs, ctx_);
    block_norm_forward(
        config_, act(plan_.final_norm_out, btc),
        plan_.final_norm_mean == MemoryPlan::kNoEntry ? TensorView()
                                                      : act(plan_.final_norm_mean, Shape{N}),
        act(plan_.final_norm_rstd, Shape{N}), act(plan_.final_x, btc),
        entry_rows(params_, ParamRole::kFinalNormWeight, -1, 0, config_.hidden_size),
        entry_rows(params_, ParamRole::kFinalNormBias, -1, 0, config_.hidden_size), ctx_);
}

void Model::run_backward_from_final(TensorView dfinal) {
    const Shape bt{dims_.B, dims_.T};
    const Shape btc{dims_.B, dims_.T, config_.hidden_size};
    const int64_t N = dims_.B * dims_.T, C = config_.hidden_size;
    TensorView dres = scratch_.view(plan_.dres, btc);
    block_norm_backward(
        config_, dres, entry_rows(grads_, ParamRole::kFinalNormWeight, -1, 0, C),
        entry_rows(grads_, ParamRole::kFinalNormBias, -1, 0, C), dfinal, act(plan_.final_x, btc),
        entry_rows(params_, ParamRole::kFinalNormWeight, -1, 0, C),
        plan_.final_norm_mean == MemoryPlan::kNoEntry ? TensorView()
                                                      : act(plan_.final_norm_mean, Shape{N}),
        act(plan_.final_norm_rstd, Shape{N}), GradMode::kOverwrite, ctx_);
    const BlockScratch scratch = block_scratch();
    const BlockInputs inputs = block_inputs();
    for (int l = int(config_.num_layers) - 1; l >= 0; --l)
        block_backward(config_, l, block_weights(l), block_grads(l), block_acts(l), scratch, inputs,
                       dres, ctx_);
    TensorView dwpe;
    ConstTensorView positions;
    if (config_.position == PositionKind::kLearned) {
        dwpe = entry_rows(grads_, ParamRole::kPositionEmbedding, -1, 0,
                          config_.max_position_embeddings);
        if (has_positions_) positions = act(plan_.positions, bt);
    }
    embedding_backward(entry_rows(grads_, ParamRole::kTokenEmbedding, -1, 0, config_.vocab_size),
                       dwpe, dres, act(plan_.tokens, bt), positions, ctx_);
}

float Model::forward(const ModelBatch& batch) {
    backward_ready_ = false;
    load_batch(batch, /*need_targets=*/true);
    run_forward_blocks();
    const int64_t N = dims_.B * dims_.T;
    TensorView loss = act(plan_.loss, Shape{1});
    lm_head_cross_entropy_forward(loss, TensorView(), act(plan_.lm_lse, Shape{N}),
                                  act(plan_.final_norm_out, Shape{N, config_.hidden_size}),
                                  act(plan_.targets, Shape{N}), params_.view(head_entry()),
                                  scratch_.view(plan_.lm_chunk), ctx_);
    backward_ready_ = true;
    return read_scalar(loss, ctx_);
}

void Model::backward(float dloss) {
    LATHE_CHECK(backward_ready_, "backward() must follow a forward() of the same batch");
    backward_ready_ = false;
    const int64_t N = dims_.B * dims_.T, C = config_.hidden_size;
    // The gradient at the final norm's output goes to the first block scratch (B, T, C) buffer
    // that the final norm's backward reads before any block writes it.
    TensorView dfinal = block_scratch().dnorm1;
    lm_head_cross_entropy_backward(dfinal.reshape(Shape{N, C}), grads_.view(head_entry()),
                                   act(plan_.final_norm_out, Shape{N, C}),
                                   act(plan_.targets, Shape{N}), params_.view(head_entry()),
                                   act(plan_.lm_lse, Shape{N}), dloss,
                                   scratch_.view(plan_.lm_chunk), ctx_);
    run_backward_from_final(dfinal);
}

float Model::forward_backward(const ModelBatch& batch, float dloss) {
    backward_ready_ = false;
    load_batch(batch, /*need_targets=*/true);
    run_forward_blocks();
    const int64_t N = dims_.B * dims_.T, C = config_.hidden_size;
    TensorView loss = act(plan_.loss, Shape{1});
    TensorView dfinal = block_scratch().dnorm1;
    lm_head_cross_entropy_forward_backward(
        loss, TensorView(), dfinal.reshape(Shape{N, C}), grads_.view(head_entry()),
        act(plan_.final_norm_out, Shape{N, C}), act(plan_.targets, Shape{N}),
        params_.view(head_entry()), dloss, scratch_.view(plan_.lm_chunk), ctx_);
    run_backward_from_final(dfinal);
    return read_scalar(loss, ctx_);
}

void Model::logits(TensorView out, const ModelBatch& batch) {
    backward_ready_ = false;
    const Dims d = load_batch(batch, /*need_targets=*/false);
    run_forward_blocks();
    linear_forward(out, act(plan_.final_norm_out, Shape{d.B, d.T, config_.hidden_size}),
                   params_.view(head_entry()), ConstTensorView(), ctx_);
}

}  // namespace lathe
