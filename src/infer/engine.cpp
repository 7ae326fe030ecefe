#include "infer/engine.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "core/check.h"
#include "core/dtype.h"
#include "core/log.h"
#include "dist/host_collectives.h"
#include "ops/argmax.h"
#include "ops/attention.h"
#include "ops/cpu/parallel.h"
#include "ops/cuda/cuda_state.h"
#include "ops/cuda/device_info.h"
#include "ops/cuda/gemv.h"
#include "ops/cuda/memory.h"
#include "ops/embedding.h"
#include "ops/layernorm.h"
#include "ops/linear.h"
#include "ops/residual.h"
#include "ops/rmsnorm.h"
#include "ops/rope.h"
#include "ops/swiglu.h"

namespace lathe {

namespace {

// (B, T, H, D) seen as (B, T, H*D).
TensorView flat_heads(const TensorView& v) {
    return v.reshape(Shape{v.dim(0), v.dim(1), v.dim(2) * v.dim(3)});
}

}  // namespace

std::string_view decode_gemv_name(DecodeGemv mode) {
    switch (mode) {
        case DecodeGemv::kOff:
            return "off";
        case DecodeGemv::kOn:
            return "on";
        case DecodeGemv::kAuto:
            return "auto";
    }
    return "?";
}

Result<DecodeGemv> decode_gemv_parse(std::string_view text, std::string_view flag) {
    for (DecodeGemv m : {DecodeGemv::kOff, DecodeGemv::kOn, DecodeGemv::kAuto})
        if (text == decode_gemv_name(m)) return m;
    return invalid_argument_error("{} must be auto, on or off, got '{}'", flag, text);
}

static_assert(uint8_t(PeerReduce::kOff) == uint8_t(DecodeGemv::kOff) &&
              uint8_t(PeerReduce::kOn) == uint8_t(DecodeGemv::kOn) &&
              uint8_t(PeerReduce::kAuto) == uint8_t(DecodeGemv::kAuto));

std::string_view peer_reduce_name(PeerReduce mode) {
    return decode_gemv_name(DecodeGemv(mode));  // the same three words in the same order
}

Result<PeerReduce> peer_reduce_parse(std::string_view text, std::string_view flag) {
    LATHE_ASSIGN_OR_RETURN(const DecodeGemv m, decode_gemv_parse(text, flag));
    return PeerReduce(m);
}

Result<InferenceEngine> InferenceEngine::create(const Model& model, const EngineLimits& limits,
                                                Communicator* tensor_parallel) {
    const ModelConfig& c = model.config();
    EngineLimits lim = limits;
    if (lim.max_len == 0) lim.max_len = c.max_position_embeddings;
    if (lim.max_sequences < 1 || lim.max_len < 1 || lim.prefill_chunk < 1) {
        return invalid_argument_error(
            "inference limits: max_sequences {}, max_len {}, prefill_chunk {} must be >= 1",
            lim.max_sequences, lim.max_len, lim.prefill_chunk);
    }
    if (lim.max_len > c.max_position_embeddings) {
        return invalid_argument_error(
            "inference: {} tokens per sequence exceed the model's max_position_embeddings {}",
            lim.max_len, c.max_position_embeddings);
    }
    InferenceEngine e;
    e.model_ = &model;
    e.limits_ = lim;
    e.ctx_ = model.context();
    e.act_ = e.ctx_.backend == Backend::kCuda ? DType::kBF16 : DType::kF32;
    if (tensor_parallel != nullptr && tensor_parallel->size() > 1) {
        const Device where = e.ctx_.backend == Backend::kCuda ? Device::kCuda : Device::kCpu;
        if (!tensor_parallel->accepts(where)) {
            return invalid_argument_error(
                "inference: the tensor-parallel communicator ({}) cannot reduce {} buffers",
                tensor_parallel->backend(), where == Device::kCuda ? "GPU" : "host");
        }
        e.tp_ = tensor_parallel;
    }
    if (lim.kv_block_size < 0 || lim.kv_blocks < 0) {
        return invalid_argument_error("inference: kv_block_size {} and kv_blocks {} must be >= 0",
                                      lim.kv_block_size, lim.kv_blocks);
    }
    e.paged_ = lim.kv_block_size > 0;
    const bool cuda = e.ctx_.backend == Backend::kCuda;
    if (e.paged_) {
        // Checked here, before the first decode step would stop in the kernel's launch check.
        const Status supported = paged_cache_supported(c, e.ctx_);
        if (!supported.ok()) return supported.with_context("inference");
        PagedKvShape ps;
        ps.layers = c.num_layers;
        ps.block_size = lim.kv_block_size;
        ps.blocks =
            lim.kv_blocks > 0
                ? lim.kv_blocks
                : lim.max_sequences * ((lim.max_len + lim.kv_block_size - 1) / lim.kv_block_size);
        ps.kv_heads = c.num_kv_heads;
        ps.head_dim = c.head_dim;
        LATHE_ASSIGN_OR_RETURN(e.paged_cache_, PagedKvCache::create(ps, e.ctx_));
    } else {
        KvCacheShape ks;
        ks.layers = c.num_layers;
        ks.rows = lim.max_sequences;
        ks.max_len = lim.max_len;
        ks.kv_heads = c.num_kv_heads;
        ks.head_dim = c.head_dim;
        ks.dtype = e.act_;
        LATHE_ASSIGN_OR_RETURN(e.cache_, KvCache::create(ks, e.ctx_));
    }

    const int64_t N = std::max(lim.prefill_chunk, lim.max_sequences), S = lim.max_sequences;
    const int64_t C = c.hidden_size, H = c.num_heads, Hkv = c.num_kv_heads, D = c.head_dim;
    const int64_t F = c.intermediate_size, up = c.mlp == MlpKind::kSwiGlu ? 2 * F : F;
    const DType a = e.act_, f32 = DType::kF32, i32 = DType::kI32;
    ArenaLayout layout;
    auto add = [&](const char* name, DType t, Shape s) { return layout.add(name, t, s); };
    LATHE_ASSIGN_OR_RETURN(e.ix_.x0, add("x0", a, Shape{N, C}));
    LATHE_ASSIGN_OR_RETURN(e.ix_.x1, add("x1", a, Shape{N, C}));
    LATHE_ASSIGN_OR_RETURN(e.ix_.ln, add("ln", a, Shape{N, C}));
    LATHE_ASSIGN_OR_RETURN(e.ix_.mean, add("mean", f32, Shape{N}));
    LATHE_ASSIGN_OR_RETURN(e.ix_.rstd, add("rstd", f32, Shape{N}));
    LATHE_ASSIGN_OR_RETURN(e.ix_.q, add("q", a, Shape{N, H, D}));
    // A one-row decode step's q, k and v end to end (decode_qkv).
    LATHE_ASSIGN_OR_RETURN(e.ix_.qkv, add("qkv", a, Shape{1, (H + 2 * Hkv) * D}));
    // Paged, a prefill chunk's keys and values go through these too.
    const int64_t kv_rows = e.paged_ ? N : S;
    LATHE_ASSIGN_OR_RETURN(e.ix_.knew, add("k_new", a, Shape{kv_rows, Hkv, D}));
    LATHE_ASSIGN_OR_RETURN(e.ix_.vnew, add("v_new", a, Shape{kv_rows, Hkv, D}));
    if (e.paged_) {
        // One sequence's filled prefix, gathered from its blocks for the prefill's attention.
        LATHE_ASSIGN_OR_RETURN(e.ix_.kgather, add("k_gather", a, Shape{lim.max_len, Hkv, D}));
        LATHE_ASSIGN_OR_RETURN(e.ix_.vgather, add("v_gather", a, Shape{lim.max_len, Hkv, D}));
    }
    // CUDA paged: a decode step's block tables (one row of table_width() entries per sequence)
    // and the pool slots its keys/values go to (or, in a prefill, the slots of the sequence's
    // positions 0..len-1: the chunk's are written, all are gathered). Paged on either backend:
    // prefill_many's slots of its N rows at most.
    const int64_t M = e.paged_ ? e.paged_cache_.blocks_for(lim.max_len) : 0;
    if (e.paged_ && cuda) {
        LATHE_ASSIGN_OR_RETURN(e.ix_.tables, add("block_tables", i32, Shape{S, M}));
    }
    if (e.paged_) {
        LATHE_ASSIGN_OR_RETURN(e.ix_.slots, add("slots", i32, Shape{std::max(lim.max_len, N)}));
    }
    LATHE_ASSIGN_OR_RETURN(e.ix_.att, add("att", a, Shape{N, H, D}));
    LATHE_ASSIGN_OR_RETURN(e.ix_.lse, add("lse", f32, Shape{N * H}));
    LATHE_ASSIGN_OR_RETURN(e.ix_.tmp, add("tmp", a, Shape{N, C}));
    LATHE_ASSIGN_OR_RETURN(e.ix_.mlp_in, add("mlp_in", a, Shape{N, up}));
    LATHE_ASSIGN_OR_RETURN(e.ix_.mlp_act, add("mlp_act", a, Shape{N, F}));
    LATHE_ASSIGN_OR_RETURN(e.ix_.logits, add("logits", a, Shape{S, c.vocab_size}));
    LATHE_ASSIGN_OR_RETURN(e.ix_.tokens, add("tokens", i32, Shape{N}));
    LATHE_ASSIGN_OR_RETURN(e.ix_.positions, add("positions", i32, Shape{N}));
    LATHE_ASSIGN_OR_RETURN(e.ix_.lengths, add("lengths", i32, Shape{S}));
    const int64_t half = c.position == PositionKind::kRope ? rope_rotary_dim(c.rope) / 2 : 1;
    LATHE_ASSIGN_OR_RETURN(e.ix_.rope_cos, add("rope_cos", f32, Shape{lim.max_len, half}));
    LATHE_ASSIGN_OR_RETURN(e.ix_.rope_sin, add("rope_sin", f32, Shape{lim.max_len, half}));
    if (e.tp_ != nullptr && e.ctx_.backend == Backend::kCuda) {
        // follow(): a call's payload (a prompt's tokens, a step's sequence and token pairs, or
        // prefill_many's message), and the 3-element header before it.
        LATHE_ASSIGN_OR_RETURN(
            e.ix_.message,
            add("message", DType::kI64, Shape{std::max<int64_t>(3, e.message_capacity())}));
    }
    LATHE_ASSIGN_OR_RETURN(e.scratch_, ModelArena::allocate(std::move(layout), e.ctx_));
    if (e.ctx_.backend == Backend::kCuda) {
        // Tokens, positions, lengths, slots (S each) and, paged, the tables (S x M).
        e.pinned_inputs_ = PinnedHostBuffer(size_t(4 * S + S * M) * sizeof(int32_t));
        e.pinned_logits_ = PinnedHostBuffer(size_t(S * c.vocab_size) * sizeof(uint16_t));
    }
    if (e.paged_ && cuda && lim.cuda_graphs) {
        e.graphs_.resize(size_t(S + 1));
        e.graph_warm_.assign(size_t(S + 1), 0);
        e.graph_failed_.assign(size_t(S + 1), 0);
    }
    if (c.position == PositionKind::kRope) {
        HostTensor cos(f32, Shape{lim.max_len, half}), sin(f32, Shape{lim.max_len, half});
        rope_build_table(cos.view(), sin.view(), c.rope);
        e.copy(e.scratch_.view(e.ix_.rope_cos), cos.view());
        e.copy(e.scratch_.view(e.ix_.rope_sin), sin.view());
        model.synchronize();
    }
    if (e.tp_ != nullptr && cuda &&
        (lim.peer_reduce == PeerReduce::kOn ||
         (lim.peer_reduce == PeerReduce::kAuto && e.tp_->size() >= kPeerReduceAutoRanks))) {
        // The largest reduce it takes: a decode step's S rows, capped where reading every peer's
        // whole buffer stops beating NCCL's ring (PeerReduce).
        const int64_t bytes =
            std::min<int64_t>(S * C * int64_t(dtype_size(e.act_)), kPeerReduceMaxBytes) / 16 * 16;
        std::string why_not = "rows too narrow";
        if (bytes >= 16) {
            LATHE_ASSIGN_OR_RETURN(e.peer_,
                                   PeerAllReduce::open(*e.tp_, bytes, e.ctx_.stream, &why_not));
        }
        if (e.peer_ == nullptr) {
            log_info("inference: tensor-parallel reduces through {} only (peer all-reduce: {})",
                     e.tp_->backend(), why_not);
        }
    }
    return e;
}

Status InferenceEngine::paged_cache_supported(const ModelConfig& config, const Context& ctx) {
    if (ctx.backend != Backend::kCuda) return ok_status();
    const int64_t limit =
        cuda::shared_memory_per_block_optin(cuda_state_of(ctx, "inference").device());
    return attention_decode_paged_supports(config.num_heads, config.num_kv_heads, config.head_dim,
                                           limit);
}

Result<SeqId> InferenceEngine::open() {
    Result<SeqId> seq = open_here();
    // The followers open theirs (a refusal here is theirs too: nothing to send).
    if (leading_ && seq.ok()) LATHE_RETURN_IF_ERROR(send(Op::kOpen, *seq, {}));
    return seq;
}

Result<SeqId> InferenceEngine::open_here() {
    if (!paged_) return cache_.open();
    if (paged_cache_.open_sequences() >= limits_.max_sequences) {
        return failed_precondition_error("all {} sequences are open (close one first)",
                                         limits_.max_sequences);
    }
    return paged_cache_.open();
}

void InferenceEngine::close(SeqId seq) {
    if (leading_ && lead_error_.ok()) lead_error_ = send(Op::kClose, seq, {});
    if (paged_)
        paged_cache_.close(seq);
    else
        cache_.close(seq);
}

int64_t InferenceEngine::length(SeqId seq) const {
    return paged_ ? paged_cache_.length(seq) : cache_.length(seq);
}

int64_t InferenceEngine::open_sequences() const {
    return paged_ ? paged_cache_.open_sequences() : cache_.rows_in_use();
}

bool InferenceEngine::is_open(SeqId seq) const {
    return paged_ ? paged_cache_.is_open(seq) : cache_.is_open(seq);
}

void InferenceEngine::set_length(SeqId seq, int64_t length) {
    if (paged_)
        paged_cache_.set_length(seq, length);
    else
        cache_.set_length(seq, length);
}

void InferenceEngine::copy(TensorView dst, ConstTensorView src) const {
    LATHE_CHECK(dst.bytes() == src.bytes(), "inference copy of {} into {}", src.to_string(),
                dst.to_string());
    if (ctx_.backend == Backend::kCuda)
        cuda_copy_async(dst, src.reshape(dst.shape()), ctx_.stream);
    else if (dst.data() != src.data())
        std::memcpy(dst.data(), src.data(), src.bytes());
}

void InferenceEngine::upload(TensorView dst, std::span<const int32_t> host) const {
    copy(dst, ConstTensorView(host.data(), DType::kI32, dst.shape(), Device::kCpu));
}

Status InferenceEngine::check_prefill(std::string_view op, SeqId seq,
                                      std::span<const int32_t> tokens) const {
    if (!is_open(seq)) return invalid_argument_error("{}: sequence {} is not open", op, seq);
    if (tokens.empty()) return invalid_argument_error("{}: no tokens for sequence {}", op, seq);
    const int64_t V = config().vocab_size;
    for (size_t i = 0; i < tokens.size(); ++i) {
        if (tokens[i] < 0 || tokens[i] >= V) {
            return invalid_argument_error("token {} at index {} is outside the vocabulary [0, {})",
                                          tokens[i], i, V);
        }
    }
    const int64_t len0 = length(seq);
    if (len0 + int64_t(tokens.size()) > limits_.max_len) {
        return invalid_argument_error(
            "{} tokens after the {} already in sequence {} exceed its {}-token context",
            tokens.size(), len0, seq, limits_.max_len);
    }
    return ok_status();
}

Status InferenceEngine::check_decode_step(const DecodeStep& s, int64_t len) const {
    if (len == 0)
        return invalid_argument_error("decode: sequence {} has no prompt (prefill it)", s.seq);
    if (len >= limits_.max_len) {
        return invalid_argument_error("decode: sequence {} fills its {}-token context", s.seq,
                                      limits_.max_len);
    }
    if (s.token < 0 || s.token >= config().vocab_size) {
        return invalid_argument_error("decode: token {} of sequence {} is outside [0, {})", s.token,
                                      s.seq, config().vocab_size);
    }
    return ok_status();
}

void InferenceEngine::upload_decode_inputs(std::span<const TensorView> to,
                                           std::span<const std::span<const int32_t>> host) {
    LATHE_CHECK(host.empty() || host.size() == to.size(), "decode inputs: {} views, {} sources",
                to.size(), host.size());
    if (ctx_.backend != Backend::kCuda) {
        LATHE_CHECK(!host.empty(), "decode inputs on the CPU come from host vectors");
        for (size_t i = 0; i < to.size(); ++i) upload(to[i], host[i]);
        return;
    }
    const int64_t S = limits_.max_sequences;
    for (size_t i = 0; i < to.size(); ++i) {
        int32_t* column = staged_inputs() + int64_t(i) * S;
        if (!host.empty()) std::copy(host[i].begin(), host[i].end(), column);
        cuda_copy_async(to[i], ConstTensorView(column, DType::kI32, to[i].shape(), Device::kCpu),
                        ctx_.stream);
    }
}

TensorView InferenceEngine::weight(ParamRole role, int layer, int64_t begin, int64_t end) const {
    const ParamTable& table = model_->params();
    const size_t e = table.find_entry(role, layer);
    if (e == ParamTable::kNone) return TensorView();
    const ParamEntry& entry = table.entries()[e];
    if (ctx_.backend != Backend::kCuda)
        return model_->param_entry(entry.arena_index).slice(begin, end);
    // The bf16 compute copy lines up element for element with the f32 parameter arena.
    const ArenaEntry& a = table.layout().entries()[entry.arena_index];
    const int64_t first = int64_t(a.offset / dtype_size(DType::kF32));
    const TensorView flat = model_->params_compute_flat();
    return flat.slice(first, first + entry.shape.numel()).reshape(entry.shape).slice(begin, end);
}

BlockWeights InferenceEngine::block_weights(int l) const {
    const ModelConfig& c = config();
    const int64_t C = c.hidden_size, q = c.num_heads * c.head_dim;
    const int64_t kv = c.num_kv_heads * c.head_dim;
    const int64_t up = c.mlp == MlpKind::kSwiGlu ? 2 * c.intermediate_size : c.intermediate_size;
    BlockWeights v;
    v.norm1_w = weight(ParamRole::kNorm1Weight, l, 0, C);
    v.norm1_b = weight(ParamRole::kNorm1Bias, l, 0, C);
    v.wq = weight(ParamRole::kQkvWeight, l, 0, q);
    v.wk = weight(ParamRole::kQkvWeight, l, q, q + kv);
    v.wv = weight(ParamRole::kQkvWeight, l, q + kv, q + 2 * kv);
    v.bq = weight(ParamRole::kQkvBias, l, 0, q);
    v.bk = weight(ParamRole::kQkvBias, l, q, q + kv);
    v.bv = weight(ParamRole::kQkvBias, l, q + kv, q + 2 * kv);
    v.wo = weight(ParamRole::kOutWeight, l, 0, C);
    v.bo = weight(ParamRole::kOutBias, l, 0, C);
    v.norm2_w = weight(ParamRole::kNorm2Weight, l, 0, C);
    v.norm2_b = weight(ParamRole::kNorm2Bias, l, 0, C);
    v.w_up = weight(ParamRole::kUpWeight, l, 0, up);
    v.b_up = weight(ParamRole::kUpBias, l, 0, up);
    v.w_down = weight(ParamRole::kDownWeight, l, 0, C);
    v.b_down = weight(ParamRole::kDownBias, l, 0, C);
    return v;
}

Status InferenceEngine::reduce(TensorView partial) {
    // Inside an invalidated CUDA-graph capture nothing runs, and NCCL would fail on the stream:
    // skipped, as the checked CUDA calls are (the capture is then refused, and the step rerun).
    if (ctx_.backend == Backend::kCuda && CudaGraph::capture_invalidated()) return ok_status();
    if (peer_ != nullptr && peer_->fits(partial)) {
        peer_->sum(partial, ctx_.stream);
        return ok_status();
    }
    return tp_->all_reduce(partial, partial, ReduceOp::kSum, ctx_.stream);
}

Status InferenceEngine::agree_tokens(std::span<int32_t> tokens) {
    if (tp_ == nullptr || tokens.empty()) return ok_status();
    if (ctx_.backend != Backend::kCuda) {
        return tp_->broadcast(
            TensorView(tokens.data(), DType::kI32, Shape{int64_t(tokens.size())}, Device::kCpu), 0,
            nullptr);
    }
    // Through the tokens scratch, in pieces of its size.
    const int64_t cap = std::max(limits_.prefill_chunk, limits_.max_sequences);
    for (size_t a = 0; a < tokens.size(); a += size_t(cap)) {
        const int64_t n = std::min<int64_t>(cap, int64_t(tokens.size() - a));
        const TensorView dev = scratch(ix_.tokens, Shape{n});
        const TensorView host(tokens.data() + a, DType::kI32, Shape{n}, Device::kCpu);
        cuda_copy_sync(dev, host, ctx_.stream);
        LATHE_RETURN_IF_ERROR(tp_->broadcast(dev, 0, ctx_.stream));
        cuda_copy_sync(host, dev, ctx_.stream);
    }
    return ok_status();
}

void InferenceEngine::lead() {
    leading_ = tp_ != nullptr && tp_->rank() == 0;
}

Status InferenceEngine::broadcast_i64(int64_t* data, int64_t n) {
    const TensorView host(data, DType::kI64, Shape{n}, Device::kCpu);
    if (ctx_.backend != Backend::kCuda) return tp_->broadcast(host, 0, nullptr);
    const TensorView dev = scratch(ix_.message, Shape{n});
    cuda_copy_sync(dev, host, ctx_.stream);
    LATHE_RETURN_IF_ERROR(tp_->broadcast(dev, 0, ctx_.stream));
    cuda_copy_sync(host, dev, ctx_.stream);
    return ok_status();
}

int64_t InferenceEngine::message_capacity() const {
    // A prompt (max_len), a decode step's (seq, token) pairs, or prefill_many's count, (seq,
    // length) pairs and up to N prompt tokens (N = max(prefill_chunk, max_sequences)).
    const int64_t S = limits_.max_sequences, N = std::max(limits_.prefill_chunk, S);
    return std::max({limits_.max_len, 2 * S, N + 2 * S + 1});
}

Status InferenceEngine::send(Op op, int64_t seq, std::span<const int64_t> payload) {
    LATHE_RETURN_IF_ERROR(lead_error_);
    const int64_t cap = message_capacity();
    // A payload beyond the buffer is a call the engine refuses anyway (more tokens than the
    // context, more steps than sequences): the followers get none of it and refuse alike.
    const int64_t n = std::min<int64_t>(int64_t(payload.size()), cap);
    int64_t head[3] = {int64_t(op), seq, int64_t(payload.size()) > cap ? -1 : n};
    LATHE_RETURN_IF_ERROR(broadcast_i64(head, 3));
    if (head[2] <= 0) return ok_status();
    std::vector<int64_t> body(payload.begin(), payload.begin() + n);
    return broadcast_i64(body.data(), n);
}

Status InferenceEngine::send_tokens(Op op, SeqId seq, std::span<const int32_t> tokens) {
    message_.assign(tokens.begin(), tokens.end());
    return send(op, seq, message_);
}

Status InferenceEngine::receive(int64_t head[3], std::vector<int64_t>& payload) {
    LATHE_RETURN_IF_ERROR(broadcast_i64(head, 3));
    payload.assign(size_t(std::max<int64_t>(head[2], 0)), 0);
    if (head[2] > 0) LATHE_RETURN_IF_ERROR(broadcast_i64(payload.data(), head[2]));
    return ok_status();
}

Status InferenceEngine::stop_followers() {
    if (!leading_) return ok_status();
    leading_ = false;
    int64_t head[3] = {int64_t(Op::kStop), 0, 0};
    return broadcast_i64(head, 3);
}

Status InferenceEngine::follow() {
    if (tp_ == nullptr || tp_->rank() == 0) return ok_status();
    const int64_t V = vocab_size();
    std::vector<int64_t> payload;
    std::vector<int32_t> tokens;
    std::vector<DecodeStep> steps;
    std::vector<float> logits;
    for (;;) {
        int64_t head[3] = {0, 0, 0};
        LATHE_RETURN_IF_ERROR(receive(head, payload));
        const Op op = Op(head[0]);
        const SeqId seq = head[1];
        if (op == Op::kStop) return ok_status();
        // A failure here is rank 0's too (the same state and call), which reports it.
        if (op == Op::kOpen) {
            const Result<SeqId> opened = open();
            if (!opened.ok() || *opened != seq) {
                return internal_error(
                    "rank {}: rank 0 opened sequence {}, this rank {}: the ranks' engines "
                    "diverged",
                    tp_->rank(), seq,
                    opened.ok() ? std::to_string(*opened) : opened.status().to_string());
            }
        } else if (op == Op::kClose) {
            if (is_open(seq)) close(seq);
        } else if (op == Op::kPrefill || op == Op::kPrefillAll) {
            tokens.assign(payload.begin(), payload.end());
            if (head[2] < 0) tokens.clear();  // too long for the buffer: refused below
            const bool all = op == Op::kPrefillAll;
            logits.resize(size_t((all ? std::max<size_t>(tokens.size(), 1) : 1) * size_t(V)));
            const Status s = all ? prefill_all(seq, tokens, logits) : prefill(seq, tokens, logits);
            (void)s;
        } else if (op == Op::kPrefillMany) {
            // n, (seq, length) n times, the prompts end to end (prefill_many_message).
            std::vector<SeqId> seqs;
            std::vector<std::span<const int32_t>> prompts;
            const int64_t n = payload.empty() ? 0 : payload[0];
            tokens.clear();
            bool well_formed = n >= 1 && int64_t(payload.size()) >= 1 + 2 * n;
            for (int64_t i = 0; well_formed && i < n; ++i) {
                seqs.push_back(payload[size_t(1 + 2 * i)]);
                if (payload[size_t(2 + 2 * i)] < 0) well_formed = false;
            }
            if (well_formed) tokens.assign(payload.begin() + 1 + 2 * n, payload.end());
            size_t at = 0;
            for (int64_t i = 0; well_formed && i < n; ++i) {
                const size_t len = size_t(payload[size_t(2 + 2 * i)]);
                if (at + len > tokens.size()) {
                    well_formed = false;
                    break;
                }
                prompts.emplace_back(tokens.data() + at, len);
                at += len;
            }
            // Every token in a prompt, as rank 0's call has it (a call rank 0 refuses for its
            // prompts' count is refused here too: no forward runs on one rank alone).
            well_formed = well_formed && at == tokens.size() && head[2] >= 0;
            if (well_formed) {
                logits.resize(size_t(n) * size_t(V));
                const Status s = prefill_many_impl(seqs, prompts, logits);
                (void)s;
            }
        } else if (op == Op::kDecode || op == Op::kDecodeGreedy) {
            steps.clear();
            for (size_t i = 0; i + 1 < payload.size(); i += 2)
                steps.push_back(DecodeStep{payload[i], int32_t(payload[i + 1])});
            Status s = ok_status();
            if (op == Op::kDecode) {
                logits.resize(steps.size() * size_t(V));
                s = decode(steps, logits);
            } else {
                tokens.resize(steps.size());
                s = decode_greedy(steps, tokens);
            }
            (void)s;
        } else {
            return internal_error("rank {}: an unknown call {} from rank 0", tp_->rank(), head[0]);
        }
    }
}

template <typename Attend>
Result<TensorView> InferenceEngine::run_blocks(int64_t B, int64_t T, ConstTensorView tokens,
                                               ConstTensorView positions, Attend&& attend) {
    const ModelConfig& c = config();
    const PrecisionPolicy& p = model_->plan().shape.precision;
    const int64_t N = B * T, C = c.hidden_size, H = c.num_heads, Hkv = c.num_kv_heads;
    const int64_t D = c.head_dim, F = c.intermediate_size;
    const int64_t up = c.mlp == MlpKind::kSwiGlu ? 2 * F : F;
    const Shape btc{B, T, C};
    TensorView cur = scratch(ix_.x0, btc), other = scratch(ix_.x1, btc);
    const TensorView ln = scratch(ix_.ln, btc), tmp = scratch(ix_.tmp, btc);
    const TensorView mean =
        c.norm == NormKind::kLayerNorm ? scratch(ix_.mean, Shape{N}) : TensorView();
    const TensorView rstd = scratch(ix_.rstd, Shape{N});
    const TensorView q = scratch(ix_.q, Shape{B, T, H, D});
    const TensorView att = scratch(ix_.att, Shape{B, T, H, D});
    const TensorView lse = scratch(ix_.lse, Shape{B, H, T});
    const TensorView mlp_in = scratch(ix_.mlp_in, Shape{B, T, up});
    const TensorView mlp_act = scratch(ix_.mlp_act, Shape{B, T, F});
    (void)Hkv;

    TensorView wpe;
    ConstTensorView learned_positions;
    if (c.position == PositionKind::kLearned) {
        wpe = weight(ParamRole::kPositionEmbedding, -1, 0, c.max_position_embeddings);
        learned_positions = positions;
    }
    embedding_forward(cur, tokens, learned_positions,
                      weight(ParamRole::kTokenEmbedding, -1, 0, c.vocab_size), wpe, ctx_);
    LinearSpec qkv = p.spec(LinearRole::kQkv), out = p.spec(LinearRole::kAttnOut);
    LinearSpec up_spec = p.spec(LinearRole::kMlpUp), down = p.spec(LinearRole::kMlpDown);
    const bool skinny = skinny_gemv(N);
    for (LinearSpec* s : {&qkv, &out, &up_spec, &down}) s->skinny_gemv = skinny;
    for (int l = 0; l < int(c.num_layers); ++l) {
        const BlockWeights w = block_weights(l);
        block_norm_forward(c, ln, mean, rstd, cur, w.norm1_w, w.norm1_b, ctx_);
        // attend(layer, ln, q, att, lse, qkv spec): projections, RoPE, cache writes, attention.
        attend(l, w, ln, q, att, lse, qkv, positions);
        if (c.parallel_residual && tp_ != nullptr) {
            // The attention output is this rank's partial sum: reduced before the residual.
            linear_forward(tmp, flat_heads(att), w.wo, w.bo, ctx_, out);
            LATHE_RETURN_IF_ERROR(reduce(tmp));
            residual_forward(other, cur, tmp, ctx_);
            block_norm_forward(c, ln, mean, rstd, cur, w.norm2_w, w.norm2_b, ctx_);
        } else if (c.parallel_residual) {
            linear_residual_forward(other, flat_heads(att), w.wo, w.bo, cur, ctx_, out);
            block_norm_forward(c, ln, mean, rstd, cur, w.norm2_w, w.norm2_b, ctx_);
        } else {
            linear_forward(tmp, flat_heads(att), w.wo, w.bo, ctx_, out);
            if (tp_ != nullptr) LATHE_RETURN_IF_ERROR(reduce(tmp));
            if (c.norm == NormKind::kRmsNorm)
                rmsnorm_residual_forward(other, ln, rstd, cur, tmp, w.norm2_w, float(c.norm_eps),
                                         ctx_);
            else
                layernorm_residual_forward(other, ln, mean, rstd, cur, tmp, w.norm2_w, w.norm2_b,
                                           float(c.norm_eps), ctx_);
        }
        if (c.mlp == MlpKind::kSwiGlu) {
            linear_forward(mlp_in, ln, w.w_up, w.b_up, ctx_, up_spec);
            swiglu_forward(mlp_act, mlp_in, ctx_);
        } else {
            linear_gelu_forward(mlp_act, mlp_in, ln, w.w_up, w.b_up, c.gelu, ctx_, up_spec);
        }
        if (c.parallel_residual) {
            // other holds x + o; the MLP output joins it; other is the next layer's input.
            linear_forward(tmp, mlp_act, w.w_down, w.b_down, ctx_, down);
            if (tp_ != nullptr) LATHE_RETURN_IF_ERROR(reduce(tmp));
            residual_forward(other, other, tmp, ctx_);
            std::swap(cur, other);
        } else if (tp_ != nullptr) {
            linear_forward(tmp, mlp_act, w.w_down, w.b_down, ctx_, down);
            LATHE_RETURN_IF_ERROR(reduce(tmp));
            residual_forward(cur, other, tmp, ctx_);
        } else {
            // other holds x_mid = x + o; cur (x, no longer read) takes x_mid + mlp.
            linear_residual_forward(cur, mlp_act, w.w_down, w.b_down, other, ctx_, down);
        }
    }
    return cur;
}

void InferenceEngine::last_logits(ConstTensorView x, int64_t n, std::span<float> out,
                                  std::span<const int64_t> out_row) {
    read_logits(logits_forward(x, n), n, out, out_row);
}

TensorView InferenceEngine::logits_forward(ConstTensorView x, int64_t n) {
    const ModelConfig& c = config();
    const int64_t C = c.hidden_size, V = c.vocab_size;
    const TensorView y = scratch(ix_.ln, Shape{n, C});
    block_norm_forward(
        c, y, c.norm == NormKind::kLayerNorm ? scratch(ix_.mean, Shape{n}) : TensorView(),
        scratch(ix_.rstd, Shape{n}), x, weight(ParamRole::kFinalNormWeight, -1, 0, C),
        weight(ParamRole::kFinalNormBias, -1, 0, C), ctx_);
    const ParamRole head = c.tie_word_embeddings ? ParamRole::kTokenEmbedding : ParamRole::kLmHead;
    const TensorView logits = scratch(ix_.logits, Shape{n, V});
    LinearSpec spec = model_->plan().shape.precision.spec(LinearRole::kLmHead);
    spec.skinny_gemv = skinny_gemv(n);
    linear_forward(logits, y, weight(head, -1, 0, V), ConstTensorView(), ctx_, spec);
    return logits;
}

void InferenceEngine::read_logits(ConstTensorView all, int64_t n, std::span<float> out,
                                  std::span<const int64_t> out_row) {
    const int64_t V = config().vocab_size;
    const ConstTensorView logits = all.slice(0, n);
    LATHE_CHECK(int64_t(out.size()) == n * V, "logits: {} floats for ({}, {})", out.size(), n, V);
    LATHE_CHECK(out_row.empty() || int64_t(out_row.size()) == n,
                "logits: {} row places for {} rows", out_row.size(), n);
    auto dst = [&](int64_t r) {
        return out.data() + (out_row.empty() ? r : out_row[size_t(r)]) * V;
    };
    if (ctx_.backend != Backend::kCuda) {
        staged_at_ = std::chrono::steady_clock::now();
        for (int64_t r = 0; r < n; ++r)
            std::memcpy(dst(r), logits.as<float>() + r * V, size_t(V) * sizeof(float));
        return;
    }
    auto* staged = static_cast<uint16_t*>(pinned_logits_.data());
    cuda_copy_sync(TensorView(staged, DType::kBF16, Shape{n, V}, Device::kCpu), logits,
                   ctx_.stream);
    staged_at_ = std::chrono::steady_clock::now();
    // Widened in pieces of 64K logits, on several threads from 1M logits up (a batch of rows:
    // 64 x 128K logits is 8M, milliseconds on one core).
    const int64_t total = n * V, piece = int64_t(1) << 16;
    LATHE_OMP_PARALLEL_FOR(total >= (int64_t(1) << 20) ? total : 0)
    for (int64_t a = 0; a < total; a += piece) {
        const int64_t e = std::min(total, a + piece);
        for (int64_t i = a; i < e;) {
            const int64_t r = i / V, row_end = std::min(e, (r + 1) * V);
            float* o = dst(r);
            for (; i < row_end; ++i) o[i - r * V] = bf16_to_float(bf16{staged[i]});
        }
    }
}

Status InferenceEngine::prefill(SeqId seq, std::span<const int32_t> tokens,
                                std::span<float> logits) {
    if (leading_) LATHE_RETURN_IF_ERROR(send_tokens(Op::kPrefill, seq, tokens));
    return prefill_impl(seq, tokens, logits, /*all=*/false);
}

Status InferenceEngine::prefill_all(SeqId seq, std::span<const int32_t> tokens,
                                    std::span<float> all_logits) {
    if (leading_) LATHE_RETURN_IF_ERROR(send_tokens(Op::kPrefillAll, seq, tokens));
    return prefill_impl(seq, tokens, all_logits, /*all=*/true);
}

std::vector<int64_t> InferenceEngine::prefill_many_message(
    std::span<const SeqId> seqs, std::span<const std::span<const int32_t>> prompts) {
    std::vector<int64_t> m;
    m.push_back(int64_t(seqs.size()));
    for (size_t i = 0; i < seqs.size(); ++i) {
        m.push_back(seqs[i]);
        m.push_back(i < prompts.size() ? int64_t(prompts[i].size()) : -1);
    }
    for (const std::span<const int32_t>& p : prompts) m.insert(m.end(), p.begin(), p.end());
    return m;
}

bool InferenceEngine::prefill_many_fits(std::span<const int64_t> lengths) const {
    if (!paged_ || lengths.empty() || int64_t(lengths.size()) > limits_.max_sequences) return false;
    int64_t longest = 0, total = 0;
    for (const int64_t n : lengths) {
        if (n < 1 || n > limits_.max_len) return false;
        longest = std::max(longest, n);
        total += n;
    }
    // One-token prompts prefill alone: a (B, 1) batch would need the decode kernel's attention
    // (cuDNN builds no graph of one query and one key), which prefill's one-token chunk takes.
    const int64_t B = int64_t(lengths.size());
    return longest >= 2 && B * longest <= limits_.prefill_chunk &&
           1 + 2 * B + total <= message_capacity();
}

Status InferenceEngine::prefill_many(std::span<const SeqId> seqs,
                                     std::span<const std::span<const int32_t>> prompts,
                                     std::span<float> logits) {
    if (leading_) {
        message_ = prefill_many_message(seqs, prompts);
        LATHE_RETURN_IF_ERROR(send(Op::kPrefillMany, 0, message_));
    }
    return prefill_many_impl(seqs, prompts, logits);
}

Status InferenceEngine::prefill_many_impl(std::span<const SeqId> seqs,
                                          std::span<const std::span<const int32_t>> prompts,
                                          std::span<float> logits) {
    const ModelConfig& cfg = config();
    const int64_t B = int64_t(seqs.size()), V = cfg.vocab_size;
    if (!paged_) {
        return invalid_argument_error(
            "prefill_many: the row cache (kv_block_size 0) prefills one sequence at a time");
    }
    if (B < 1 || int64_t(prompts.size()) != B) {
        return invalid_argument_error("prefill_many: {} sequences with {} prompts", B,
                                      prompts.size());
    }
    if (int64_t(logits.size()) != B * V) {
        return invalid_argument_error("prefill_many: logits hold {} floats, need {} x {}",
                                      logits.size(), B, V);
    }
    std::vector<int64_t> lengths;
    for (int64_t b = 0; b < B; ++b) {
        const SeqId seq = seqs[size_t(b)];
        const std::span<const int32_t> p = prompts[size_t(b)];
        LATHE_RETURN_IF_ERROR(check_prefill("prefill_many", seq, p));
        if (length(seq) != 0) {
            return invalid_argument_error(
                "prefill_many: sequence {} holds {} tokens; it prefills new sequences only", seq,
                length(seq));
        }
        for (int64_t a = 0; a < b; ++a) {
            if (seqs[size_t(a)] == seq)
                return invalid_argument_error("prefill_many: sequence {} is listed twice", seq);
        }
        lengths.push_back(int64_t(p.size()));
    }
    if (!prefill_many_fits(lengths)) {
        return invalid_argument_error(
            "prefill_many: {} prompts padded to the longest exceed the {}-token prefill chunk "
            "(or the tensor-parallel message); prefill them in smaller groups",
            B, limits_.prefill_chunk);
    }
    const int64_t Tm = *std::max_element(lengths.begin(), lengths.end());
    int64_t blocks = 0;
    for (const int64_t n : lengths) blocks += paged_cache_.blocks_for(n);
    if (blocks > paged_cache_.free_blocks()) {  // checked first: nothing is taken then
        return failed_precondition_error(
            "prefill_many: the {} prompts need {} KV blocks, {} are free", B, blocks,
            paged_cache_.free_blocks());
    }
    for (int64_t b = 0; b < B; ++b)
        LATHE_RETURN_IF_ERROR(paged_cache_.reserve(seqs[size_t(b)], lengths[size_t(b)]));
    // Row b holds prompt b then padding (token 0) up to Tm; positions count on through the
    // padding. Causal attention keeps every real query of a row to that row's earlier keys, all
    // real; the padding rows (whose outputs nobody reads) write no cache slot.
    std::vector<int32_t> host_tok(size_t(B * Tm), 0), host_slots(size_t(B * Tm), -1);
    host_pos_.resize(size_t(B * Tm));
    for (int64_t b = 0; b < B; ++b) {
        const std::span<const int32_t> p = prompts[size_t(b)];
        for (int64_t t = 0; t < Tm; ++t) {
            const size_t i = size_t(b * Tm + t);
            host_pos_[i] = int32_t(t);
            if (t < int64_t(p.size())) {
                host_tok[i] = p[size_t(t)];
                host_slots[i] = int32_t(paged_cache_.slot(seqs[size_t(b)], t));
            }
        }
    }
    const TensorView tok = scratch(ix_.tokens, Shape{B, Tm});
    const TensorView pos = scratch(ix_.positions, Shape{B, Tm});
    const TensorView slots = scratch(ix_.slots, Shape{B * Tm});
    upload(tok, host_tok);
    upload(pos, host_pos_);
    upload(slots, host_slots);
    const float scale = block_attention_scale(cfg);
    auto attend = [&](int l, const BlockWeights& w, const TensorView& ln, const TensorView& q,
                      const TensorView& att, const TensorView& lse, const LinearSpec& spec,
                      ConstTensorView positions) {
        const int64_t Hkv = cfg.num_kv_heads, D = cfg.head_dim;
        const TensorView k = scratch(ix_.knew, Shape{B, Tm, Hkv, D});
        const TensorView v = scratch(ix_.vnew, Shape{B, Tm, Hkv, D});
        prefill_qkv_to_cache(l, w, ln, q, k, v, positions, slots, spec);
        attention_forward(att, lse, q, k, v, ConstTensorView(), cfg.window(l), scale, 0, ctx_);
    };
    LATHE_ASSIGN_OR_RETURN(const TensorView x, run_blocks(B, Tm, tok, pos, attend));
    // Each prompt's last row (b Tm + length_b - 1) gathered into the tmp scratch, then one final
    // norm and LM head over the B rows (a row gather is kv_rows_gather over (rows, 1, 1, C)).
    const int64_t C = cfg.hidden_size;
    std::vector<int32_t> last(static_cast<size_t>(B));
    for (int64_t b = 0; b < B; ++b) {
        set_length(seqs[size_t(b)], lengths[size_t(b)]);
        last[size_t(b)] = int32_t(b * Tm + lengths[size_t(b)] - 1);
    }
    const TensorView at = scratch(ix_.lengths, Shape{B});
    upload(at, last);
    const TensorView ends = scratch(ix_.tmp, Shape{B, C});
    kv_rows_gather(ends, x.reshape(Shape{B * Tm, 1, 1, C}), at, ctx_);
    last_logits(ends, B, logits);
    return ok_status();
}

Status InferenceEngine::prefill_impl(SeqId seq, std::span<const int32_t> tokens,
                                     std::span<float> logits, bool all) {
    const ModelConfig& c = config();
    LATHE_RETURN_IF_ERROR(check_prefill("prefill", seq, tokens));
    const int64_t rows_out = all ? int64_t(tokens.size()) : 1;
    if (int64_t(logits.size()) != rows_out * c.vocab_size) {
        return invalid_argument_error("prefill: logits hold {} floats, need {} x {}", logits.size(),
                                      rows_out, c.vocab_size);
    }
    const int64_t len0 = length(seq);
    if (paged_) LATHE_RETURN_IF_ERROR(paged_cache_.reserve(seq, len0 + int64_t(tokens.size())));
    const int64_t row = paged_ ? -1 : cache_.row(seq);
    const ModelConfig& cfg = c;
    const float scale = block_attention_scale(cfg);
    for (size_t begin = 0; begin < tokens.size(); begin += size_t(limits_.prefill_chunk)) {
        const int64_t T = std::min<int64_t>(limits_.prefill_chunk, int64_t(tokens.size() - begin));
        const int64_t pos0 = length(seq);
        host_pos_.resize(size_t(T));
        for (int64_t t = 0; t < T; ++t) host_pos_[size_t(t)] = int32_t(pos0 + t);
        const TensorView tok = scratch(ix_.tokens, Shape{1, T});
        const TensorView pos = scratch(ix_.positions, Shape{1, T});
        upload(tok, tokens.subspan(begin, size_t(T)));
        upload(pos, host_pos_);
        // A one-token chunk attends through attention_decode, which reads the row's length.
        const TensorView one_length = scratch(ix_.lengths, Shape{1});
        if (T == 1) {
            host_len_.assign(1, int32_t(pos0 + 1));
            upload(one_length, host_len_);
        }
        // CUDA paged: the slots of positions 0..pos0+T-1 (the chunk's are the last T).
        const bool cuda_paged = paged_ && ctx_.backend == Backend::kCuda;
        const TensorView slots = cuda_paged ? scratch(ix_.slots, Shape{pos0 + T}) : TensorView();
        if (cuda_paged) {
            host_i32_.resize(size_t(pos0 + T));
            for (int64_t j = 0; j < pos0 + T; ++j) host_i32_[size_t(j)] = paged_cache_.slot(seq, j);
            upload(slots, host_i32_);
        }
        auto attend = [&](int l, const BlockWeights& w, const TensorView& ln, const TensorView& q,
                          const TensorView& att, const TensorView& lse, const LinearSpec& spec,
                          ConstTensorView positions) {
            if (cuda_paged) {
                // The chunk's keys and values go to its blocks (kv_rows_scatter). Its attention
                // reads the sequence's filled prefix contiguous: the first chunk's own keys, else
                // the prefix gathered from the blocks into a scratch (kv_rows_gather), because
                // the prefill attention (cuDNN, or lathe's rows kernel) takes (B, Tk, Hkv, D)
                // keys; the gather reads and writes the prefix once per layer and chunk, small
                // next to the chunk's projections and attention over that prefix.
                const int64_t Hkv = cfg.num_kv_heads, D = cfg.head_dim, Tk = pos0 + T;
                const TensorView k = scratch(ix_.knew, Shape{1, T, Hkv, D});
                const TensorView v = scratch(ix_.vnew, Shape{1, T, Hkv, D});
                prefill_qkv_to_cache(l, w, ln, q, k, v, positions, slots.slice(pos0, Tk), spec);
                TensorView kk = k, vv = v;
                if (pos0 > 0) {
                    kk = scratch(ix_.kgather, Shape{1, Tk, Hkv, D});
                    vv = scratch(ix_.vgather, Shape{1, Tk, Hkv, D});
                    kv_rows_gather(kk, paged_cache_.keys(l), slots, ctx_);
                    kv_rows_gather(vv, paged_cache_.values(l), slots, ctx_);
                }
                if (T == 1) {
                    attention_decode(att, lse, q, kk, vv, one_length, cfg.window(l), scale, ctx_);
                    return;
                }
                attention_forward(att, lse, q, kk, vv, ConstTensorView(), cfg.window(l), scale,
                                  pos0, ctx_);
                return;
            }
            if (paged_) {
                // The chunk's keys and values go to its blocks; the filled prefix comes back
                // contiguous for the attention.
                const int64_t Hkv = cfg.num_kv_heads, D = cfg.head_dim, hd = Hkv * D;
                const TensorView k = scratch(ix_.knew, Shape{1, T, Hkv, D});
                const TensorView v = scratch(ix_.vnew, Shape{1, T, Hkv, D});
                project_qkv(w, ln, q, k, v, positions, spec);
                for (int64_t t = 0; t < T; ++t) {
                    std::memcpy(paged_cache_.key(l, seq, pos0 + t), k.as<float>() + t * hd,
                                size_t(hd) * sizeof(float));
                    std::memcpy(paged_cache_.value(l, seq, pos0 + t), v.as<float>() + t * hd,
                                size_t(hd) * sizeof(float));
                }
                const TensorView kg = scratch(ix_.kgather, Shape{1, pos0 + T, Hkv, D});
                const TensorView vg = scratch(ix_.vgather, Shape{1, pos0 + T, Hkv, D});
                paged_cache_.gather(l, seq, pos0 + T, kg.as<float>(), vg.as<float>());
                attention_forward(att, lse, q, kg, vg, ConstTensorView(), cfg.window(l), scale,
                                  pos0, ctx_);
                return;
            }
            // The chunk's keys and values go straight into the cache row.
            const TensorView k = cache_.keys(l, row, pos0, pos0 + T);
            const TensorView v = cache_.values(l, row, pos0, pos0 + T);
            project_qkv(w, ln, q, k, v, positions, spec);
            if (T == 1) {
                // One query: the decode kernel over the row (cuDNN takes no one-by-one graph).
                attention_decode(att, lse, q, cache_.keys(l, row, 0, limits_.max_len),
                                 cache_.values(l, row, 0, limits_.max_len), one_length,
                                 cfg.window(l), scale, ctx_);
                return;
            }
            attention_forward(att, lse, q, cache_.keys(l, row, 0, pos0 + T),
                              cache_.values(l, row, 0, pos0 + T), ConstTensorView(), cfg.window(l),
                              scale, pos0, ctx_);
        };
        LATHE_ASSIGN_OR_RETURN(const TensorView x, run_blocks(1, T, tok, pos, attend));
        set_length(seq, pos0 + T);
        const TensorView rows = x.reshape(Shape{T, cfg.hidden_size});
        if (all) {
            // The logits scratch holds max_sequences rows: the chunk's rows go in pieces.
            const int64_t V = cfg.vocab_size, piece = limits_.max_sequences;
            for (int64_t a = 0; a < T; a += piece) {
                const int64_t b = std::min(T, a + piece);
                last_logits(rows.slice(a, b), b - a,
                            logits.subspan(size_t((int64_t(begin) + a) * V), size_t((b - a) * V)));
            }
        } else if (begin + size_t(T) == tokens.size()) {
            last_logits(rows.slice(T - 1, T), 1, logits);
        }
    }
    return ok_status();
}

Status InferenceEngine::decode(std::span<const DecodeStep> steps, std::span<float> logits) {
    return decode_impl(steps, DecodeOut{logits, {}});
}

Status InferenceEngine::decode_greedy(std::span<const DecodeStep> steps,
                                      std::span<int32_t> tokens) {
    if (tokens.size() != steps.size()) {
        return invalid_argument_error("decode: {} token places for {} steps", tokens.size(),
                                      steps.size());
    }
    return decode_impl(steps, DecodeOut{{}, tokens});
}

Status InferenceEngine::decode_impl(std::span<const DecodeStep> steps, DecodeOut out) {
    decode_start_ = std::chrono::steady_clock::now();
    if (leading_) {
        message_.clear();
        for (const DecodeStep& s : steps) {
            message_.push_back(s.seq);
            message_.push_back(s.token);
        }
        LATHE_RETURN_IF_ERROR(
            send(out.tokens.empty() ? Op::kDecode : Op::kDecodeGreedy, 0, message_));
    }
    const ModelConfig& c = config();
    const int64_t n = open_sequences(), V = c.vocab_size;
    if (int64_t(steps.size()) != n) {
        return invalid_argument_error(
            "decode: {} steps for {} open sequences (every open sequence steps at once)",
            steps.size(), n);
    }
    if (n == 0) return ok_status();
    if (out.tokens.empty() && int64_t(out.logits.size()) != n * V) {
        return invalid_argument_error("decode: logits hold {} floats, need {} x {}",
                                      out.logits.size(), n, V);
    }
    if (paged_) {
        const Status st = decode_paged(steps, out);
        if (st.ok()) note_decode_times();
        return st;
    }
    // Row r of the batch is cache row r; step_of_row_ maps it back to the caller's order.
    step_of_row_.assign(size_t(n), -1);
    host_i32_.assign(size_t(n), 0);
    host_pos_.assign(size_t(n), 0);
    host_len_.assign(size_t(n), 0);
    for (size_t i = 0; i < steps.size(); ++i) {
        const DecodeStep& s = steps[i];
        if (!cache_.is_open(s.seq))
            return invalid_argument_error("decode: sequence {} is not open", s.seq);
        const int64_t r = cache_.row(s.seq), len = cache_.length(s.seq);
        if (step_of_row_[size_t(r)] >= 0)
            return invalid_argument_error("decode: sequence {} appears twice", s.seq);
        LATHE_RETURN_IF_ERROR(check_decode_step(s, len));
        step_of_row_[size_t(r)] = int64_t(i);
        host_i32_[size_t(r)] = s.token;
        host_pos_[size_t(r)] = int32_t(len);
        host_len_[size_t(r)] = int32_t(len + 1);
    }
    const TensorView tok = scratch(ix_.tokens, Shape{n, 1});
    const TensorView pos = scratch(ix_.positions, Shape{n, 1});
    const TensorView lengths = scratch(ix_.lengths, Shape{n});
    const bool cuda = ctx_.backend == Backend::kCuda;
    {
        const TensorView to[3] = {tok, pos, lengths};
        const std::span<const int32_t> from[3] = {host_i32_, host_pos_, host_len_};
        upload_decode_inputs(to, from);
    }
    const float scale = block_attention_scale(c);
    const int64_t Hkv = c.num_kv_heads, D = c.head_dim, Tmax = limits_.max_len;
    forward_start_ = std::chrono::steady_clock::now();
    auto attend = [&](int l, const BlockWeights& w, const TensorView& ln, const TensorView& q_rows,
                      const TensorView& att, const TensorView& lse, const LinearSpec& spec,
                      ConstTensorView positions) {
        const auto [q, k, v] = decode_qkv(l, w, ln, q_rows, n, spec, positions);
        // Each row's new key and value go to its own position of the cache. On CUDA a run of
        // rows at one position (a batch that started together) is one strided copy each for K and
        // V, instead of one per row.
        for (int64_t r0 = 0; r0 < n;) {
            const int64_t p = host_pos_[size_t(r0)];
            int64_t r1 = r0 + 1;
            while (cuda && r1 < n && host_pos_[size_t(r1)] == p) ++r1;
            if (r1 - r0 == 1) {
                copy(cache_.keys(l, r0, p, p + 1), k.slice(r0, r0 + 1));
                copy(cache_.values(l, r0, p, p + 1), v.slice(r0, r0 + 1));
            } else {
                const size_t row = size_t(Hkv * D) * dtype_size(act_);
                const size_t cache_pitch = size_t(Tmax) * row;
                cuda_copy_rows_async(cache_.keys(l, r0, p, p + 1).data(), cache_pitch,
                                     k.slice(r0, r1).data(), row, row, size_t(r1 - r0),
                                     ctx_.stream);
                cuda_copy_rows_async(cache_.values(l, r0, p, p + 1).data(), cache_pitch,
                                     v.slice(r0, r1).data(), row, row, size_t(r1 - r0),
                                     ctx_.stream);
            }
            r0 = r1;
        }
        attention_decode(att, lse, q, cache_.keys(l).slice(0, n), cache_.values(l).slice(0, n),
                         lengths, c.window(l), scale, ctx_);
    };
    const Result<TensorView> x = run_blocks(n, 1, tok, pos, attend);
    if (!x.ok()) {
        // The uploads may still read the page-locked inputs: the next step rewrites them.
        if (cuda) model_->synchronize();
        return x.status();
    }
    for (int64_t r = 0; r < n; ++r) cache_.set_length(cache_.seq_at(r), host_len_[size_t(r)]);
    // Logits come out in row order; row r goes to the caller's row step_of_row_[r].
    emit_decode(logits_forward(x->reshape(Shape{n, c.hidden_size}), n), n, out, step_of_row_);
    note_decode_times();
    return ok_status();
}

void InferenceEngine::note_decode_times() {
    const auto end = std::chrono::steady_clock::now();
    const auto seconds = [](auto d) { return std::chrono::duration<double>(d).count(); };
    decode_times_ = {seconds(forward_start_ - decode_start_), seconds(staged_at_ - forward_start_),
                     seconds(end - staged_at_)};
}

Status InferenceEngine::decode_paged(std::span<const DecodeStep> steps, DecodeOut result) {
    const ModelConfig& c = config();
    const int64_t n = int64_t(steps.size());
    // Batch row i is step i; its sequence's blocks are wherever the pool put them.
    std::vector<SeqId> seqs(static_cast<size_t>(n));
    host_i32_.assign(size_t(n), 0);
    host_pos_.assign(size_t(n), 0);
    host_len_.assign(size_t(n), 0);
    int64_t need = 0;
    for (int64_t i = 0; i < n; ++i) {
        const DecodeStep& s = steps[size_t(i)];
        if (!paged_cache_.is_open(s.seq))
            return invalid_argument_error("decode: sequence {} is not open", s.seq);
        if (std::find(seqs.begin(), seqs.begin() + i, s.seq) != seqs.begin() + i)
            return invalid_argument_error("decode: sequence {} appears twice", s.seq);
        const int64_t len = paged_cache_.length(s.seq);
        LATHE_RETURN_IF_ERROR(check_decode_step(s, len));
        seqs[size_t(i)] = s.seq;
        host_i32_[size_t(i)] = s.token;
        host_pos_[size_t(i)] = int32_t(len);
        host_len_[size_t(i)] = int32_t(len + 1);
        need += std::max<int64_t>(
            0, paged_cache_.blocks_for(len + 1) - int64_t(paged_cache_.table(s.seq).size()));
    }
    if (need > paged_cache_.free_blocks()) {
        return failed_precondition_error(
            "decode: the step needs {} new KV blocks, {} are free (admit fewer sequences)", need,
            paged_cache_.free_blocks());
    }
    for (int64_t i = 0; i < n; ++i)
        LATHE_RETURN_IF_ERROR(paged_cache_.reserve(seqs[size_t(i)], host_len_[size_t(i)]));
    const bool cuda = ctx_.backend == Backend::kCuda;
    const bool graphed = cuda && limits_.cuda_graphs;
    // The batch the step runs: n, or n's CUDA-graph bucket (rows n..nb-1 are padding).
    const int64_t nb = graphed ? graph_bucket(n) : n;
    const TensorView tok = scratch(ix_.tokens, Shape{nb, 1});
    const TensorView pos = scratch(ix_.positions, Shape{nb, 1});
    TensorView lengths, slots, tables;
    if (cuda) {
        // Staged in place (upload_decode_inputs): tokens, positions, lengths, the new keys'
        // slots and the block tables, each row M entries wide (entries past a sequence's blocks
        // are 0 and never read). Padding rows: token 0 at position 0, length 1, slot -1 (not
        // written), table of 0s.
        const int64_t S = limits_.max_sequences, M = paged_cache_.blocks_for(limits_.max_len);
        lengths = scratch(ix_.lengths, Shape{nb});
        slots = scratch(ix_.slots, Shape{nb});
        tables = scratch(ix_.tables, Shape{nb, M});
        int32_t* staged = staged_inputs();
        int32_t* staged_tables = staged + 4 * S;
        std::fill(staged_tables, staged_tables + nb * M, 0);
        for (int64_t i = n; i < nb; ++i) {
            staged[i] = 0;
            staged[S + i] = 0;
            staged[2 * S + i] = 1;
            staged[3 * S + i] = -1;
        }
        for (int64_t i = 0; i < n; ++i) {
            staged[i] = host_i32_[size_t(i)];
            staged[S + i] = host_pos_[size_t(i)];
            staged[2 * S + i] = host_len_[size_t(i)];
            staged[3 * S + i] = paged_cache_.slot(seqs[size_t(i)], host_pos_[size_t(i)]);
            const std::vector<int32_t>& t = paged_cache_.table(seqs[size_t(i)]);
            std::copy(t.begin(), t.end(), staged_tables + i * M);
        }
        const TensorView to[5] = {tok, pos, lengths, slots, tables};
        upload_decode_inputs(to, {});
    } else {
        const TensorView to[2] = {tok, pos};
        const std::span<const int32_t> from[2] = {host_i32_, host_pos_};
        upload_decode_inputs(to, from);
    }
    const float scale = block_attention_scale(c);
    const int64_t Hkv = c.num_kv_heads, D = c.head_dim, hd = Hkv * D;
    auto attend = [&](int l, const BlockWeights& w, const TensorView& ln, const TensorView& q_rows,
                      const TensorView& att, const TensorView& lse, const LinearSpec& spec,
                      ConstTensorView positions) {
        const auto [q, k, v] = decode_qkv(l, w, ln, q_rows, nb, spec, positions);
        if (cuda) {
            // Each row's new key and value to its slot, then the attention through the tables.
            kv_rows_scatter(paged_cache_.keys(l), k, slots, ctx_);
            kv_rows_scatter(paged_cache_.values(l), v, slots, ctx_);
            attention_decode_paged(att, lse, q, paged_cache_.keys(l), paged_cache_.values(l),
                                   tables, lengths, c.window(l), scale, ctx_);
            return;
        }
        for (int64_t i = 0; i < n; ++i) {
            const int64_t p = host_pos_[size_t(i)];
            std::memcpy(paged_cache_.key(l, seqs[size_t(i)], p), k.as<float>() + i * hd,
                        size_t(hd) * sizeof(float));
            std::memcpy(paged_cache_.value(l, seqs[size_t(i)], p), v.as<float>() + i * hd,
                        size_t(hd) * sizeof(float));
        }
        paged_attention_decode(att, lse, q, paged_cache_, l, seqs, host_len_, c.window(l), scale);
    };
    // The step up to the logits scratch: eager, or captured into the bucket's graph.
    auto forward = [&]() -> Result<TensorView> {
        LATHE_ASSIGN_OR_RETURN(const TensorView x, run_blocks(nb, 1, tok, pos, attend));
        return logits_forward(x.reshape(Shape{nb, c.hidden_size}), nb);
    };
    Result<TensorView> out = scratch(ix_.logits, Shape{nb, c.vocab_size});
    const size_t b = size_t(nb);
    forward_start_ = std::chrono::steady_clock::now();
    if (graphed && !graphs_[b].empty()) {
        graphs_[b].launch(ctx_.stream);
    } else if (graphed && graph_warm_[b] && !graph_failed_[b]) {
        Status captured = CudaGraph::begin_capture(ctx_.stream);
        CudaGraph graph;
        if (captured.ok()) {
            if (fail_next_capture_) {
                fail_next_capture_ = false;
                model_->synchronize();  // invalidates the capture (a test's broken op)
            }
            out = forward();
            Result<CudaGraph> g = CudaGraph::end_capture(ctx_.stream);
            if (g.ok())
                graph = std::move(*g);
            else
                captured = g.status();
        }
        // 0: the graph holds the step; 1: CUDA refused the capture (nothing of it ran: the
        // bucket runs eagerly); 2: an error (the forward's, met while capturing, comes first).
        int verdict = 2;
        if (captured.ok() && out.ok())
            verdict = 0;
        else if (!captured.ok() && CudaGraph::capture_refused(captured) && out.ok())
            verdict = 1;
        const int mine = verdict;
        Status agreed = ok_status();
        if (tp_ != nullptr) {
            // Every rank replays the bucket's graph, or none does: the captured all-reduces
            // pair with the other ranks' as the eager ones would only if all ranks do alike.
            const Result<int> worst = all_reduce_max(*tp_, verdict, ctx_.stream);
            if (!worst.ok()) {
                agreed = worst.status();
                verdict = 2;
            } else if (*worst > verdict) {
                agreed = internal_error(
                    "decode batch {}: another tensor-parallel rank's CUDA-graph capture failed "
                    "(its log names why)",
                    nb);
                verdict = *worst;
            }
        }
        if (verdict == 0) {
            graphs_[b] = std::move(graph);
            graphs_[b].launch(ctx_.stream);
        } else if (verdict == 1) {
            log_warning("inference: decode batch {} runs without a CUDA graph: {}", nb,
                        captured.ok()
                            ? std::string("another tensor-parallel rank's capture was refused")
                            : captured.to_string());
            graph_failed_[b] = 1;
            out = forward();
        } else if (out.ok()) {
            // CUDA failed for a reason other than the capture (here, or on another rank):
            // running eagerly would meet it too.
            out = mine == 2 && !captured.ok() ? captured : agreed;
        }
    } else {
        out = forward();
        if (graphed) graph_warm_[b] = 1;
    }
    if (!out.ok()) {
        // The uploads may still read the page-locked inputs: the next step rewrites them.
        if (cuda) model_->synchronize();
        return out.status();
    }
    for (int64_t i = 0; i < n; ++i) paged_cache_.set_length(seqs[size_t(i)], host_len_[size_t(i)]);
    emit_decode(*out, n, result, {});
    return ok_status();
}

void InferenceEngine::emit_decode(ConstTensorView logits, int64_t n, DecodeOut out,
                                  std::span<const int64_t> out_row) {
    if (out.tokens.empty()) {
        read_logits(logits, n, out.logits, out_row);
        return;
    }
    const auto place = [&](int64_t r) { return size_t(out_row.empty() ? r : out_row[size_t(r)]); };
    const ConstTensorView rows = logits.slice(0, n);
    if (ctx_.backend != Backend::kCuda) {
        staged_at_ = std::chrono::steady_clock::now();  // the logits are in host memory
        host_i32_.assign(size_t(n), 0);
        argmax_rows(TensorView(host_i32_.data(), DType::kI32, Shape{n}, Device::kCpu), rows, ctx_);
        for (int64_t r = 0; r < n; ++r) out.tokens[place(r)] = host_i32_[size_t(r)];
        return;
    }
    // The picks into the token scratch (the step's inputs are read by now: the stream runs in
    // order), then n ids through the page-locked logits buffer.
    const TensorView ids = scratch(ix_.tokens, Shape{n});
    argmax_rows(ids, rows, ctx_);
    LATHE_CHECK(pinned_logits_.bytes() >= size_t(n) * sizeof(int32_t),
                "decode_greedy: {} ids do not fit the {} bytes of the logits' read-back buffer", n,
                pinned_logits_.bytes());
    auto* staged = static_cast<int32_t*>(pinned_logits_.data());
    cuda_copy_sync(TensorView(staged, DType::kI32, Shape{n}, Device::kCpu), ids, ctx_.stream);
    staged_at_ = std::chrono::steady_clock::now();
    for (int64_t r = 0; r < n; ++r) out.tokens[place(r)] = staged[r];
}

void InferenceEngine::project_qkv(const BlockWeights& w, ConstTensorView ln, const TensorView& q,
                                  const TensorView& k, const TensorView& v,
                                  ConstTensorView positions, const LinearSpec& spec) {
    linear_forward(flat_heads(q), ln, w.wq, w.bq, ctx_, spec);
    linear_forward(flat_heads(k), ln, w.wk, w.bk, ctx_, spec);
    linear_forward(flat_heads(v), ln, w.wv, w.bv, ctx_, spec);
    if (config().position == PositionKind::kRope) {
        rope_qk_forward(q, k, q, k, positions, scratch_.view(ix_.rope_cos),
                        scratch_.view(ix_.rope_sin), ctx_);
    }
}

void InferenceEngine::prefill_qkv_to_cache(int layer, const BlockWeights& w, ConstTensorView ln,
                                           const TensorView& q, const TensorView& k,
                                           const TensorView& v, ConstTensorView positions,
                                           ConstTensorView slots, const LinearSpec& spec) {
    const ModelConfig& c = config();
    project_qkv(w, ln, q, k, v, positions, spec);
    const Shape rows{k.numel() / (c.num_kv_heads * c.head_dim), c.num_kv_heads, c.head_dim};
    kv_rows_scatter(paged_cache_.keys(layer), k.reshape(rows), slots, ctx_);
    kv_rows_scatter(paged_cache_.values(layer), v.reshape(rows), slots, ctx_);
}

InferenceEngine::DecodeQkv InferenceEngine::decode_qkv(int layer, const BlockWeights& w,
                                                       ConstTensorView ln, const TensorView& q_rows,
                                                       int64_t n, const LinearSpec& spec,
                                                       ConstTensorView positions) {
    const ModelConfig& c = config();
    const int64_t H = c.num_heads, Hkv = c.num_kv_heads, D = c.head_dim;
    DecodeQkv o;
    if (n == 1) {
        const int64_t qn = H * D, kvn = Hkv * D;
        const TensorView row = scratch(ix_.qkv, Shape{1, 1, qn + 2 * kvn});
        linear_forward(row, ln, weight(ParamRole::kQkvWeight, layer, 0, qn + 2 * kvn),
                       weight(ParamRole::kQkvBias, layer, 0, qn + 2 * kvn), ctx_, spec);
        const TensorView flat = row.reshape(Shape{qn + 2 * kvn});
        o.q = flat.slice(0, qn).reshape(Shape{1, 1, H, D});
        o.k = flat.slice(qn, qn + kvn).reshape(Shape{1, 1, Hkv, D});
        o.v = flat.slice(qn + kvn, qn + 2 * kvn).reshape(Shape{1, 1, Hkv, D});
    } else {
        o.q = q_rows;
        o.k = scratch(ix_.knew, Shape{n, 1, Hkv, D});
        o.v = scratch(ix_.vnew, Shape{n, 1, Hkv, D});
        linear_forward(flat_heads(o.q), ln, w.wq, w.bq, ctx_, spec);
        linear_forward(flat_heads(o.k), ln, w.wk, w.bk, ctx_, spec);
        linear_forward(flat_heads(o.v), ln, w.wv, w.bv, ctx_, spec);
    }
    if (c.position == PositionKind::kRope) {
        rope_qk_forward(o.q, o.k, o.q, o.k, positions, scratch_.view(ix_.rope_cos),
                        scratch_.view(ix_.rope_sin), ctx_);
    }
    return o;
}

bool InferenceEngine::skinny_gemv(int64_t rows) const {
    switch (limits_.decode_gemv) {
        case DecodeGemv::kOff:
            return false;
        case DecodeGemv::kOn:
            return rows <= cuda::kGemvMaxRows;
        case DecodeGemv::kAuto:
            return rows <= kDecodeGemvAutoRows;
    }
    return false;
}

int64_t InferenceEngine::graph_bucket(int64_t n) const {
    int64_t b = 1;
    while (b < n) b *= 2;
    return std::min(b, limits_.max_sequences);
}

}  // namespace lathe
