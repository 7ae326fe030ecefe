#include "model/model.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "core/check.h"
#include "core/dtype.h"
#include "model/block_recompute.h"
#include "model/init.h"
#include "model/param_staging.h"
#include "model/registry.h"
#include "ops/cpu/grad_norm.h"
#include "ops/cuda/attention.h"
#include "ops/cuda/cuda_state.h"
#include "ops/cuda/memory.h"
#include "ops/embedding.h"
#include "ops/grad_norm.h"
#include "ops/linear.h"
#include "ops/lm_head_cross_entropy.h"
#include "ops/rope.h"
#include "ops/vocab_parallel.h"

namespace lathe {

namespace {

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
    ModelArena arena;
    if (ctx.backend == Backend::kCpu) {
        LATHE_ASSIGN_OR_RETURN(arena.host_, HostArena::allocate(std::move(layout)));
        arena.layout_ = arena.host_.layout();
        arena.base_ = arena.host_.bytes().data();
        arena.device_ = Device::kCpu;
        return arena;
    }
    if (!cuda_backend_built())
        return unimplemented_error("this lathe was built without CUDA (no nvcc at configure time)");
    const size_t bytes = layout.total_bytes();
    arena.layout_ = std::move(layout);
    arena.stream_ = ctx.stream;
    arena.device_ = Device::kCuda;
    if (bytes > 0) {
        auto buffer = std::make_shared<DeviceBuffer>(bytes);
        arena.base_ = buffer->data();
        arena.device_mem_ = std::shared_ptr<void>(buffer, buffer.get());
        cuda_fill_bytes(TensorView(arena.base_, DType::kU8, Shape{int64_t(bytes)}, Device::kCuda),
                        0, ctx.stream);
    }
    return arena;
}

TensorView ModelArena::view(size_t index, const Shape& shape) const {
    const TensorView full = view(index);
    LATHE_CHECK(shape.numel() <= full.numel(), "view {} of arena entry {} ({})", shape.to_string(),
                layout_.entries()[index].name, full.to_string());
    return TensorView(full.data(), full.dtype(), shape, device_);
}

TensorView ModelArena::flat(DType dtype) const {
    return TensorView(base_, dtype, Shape{int64_t(layout_.total_bytes() / dtype_size(dtype))},
                      device_);
}

ModelArena ModelArena::borrowed(ArenaLayout layout, Device device) {
    ModelArena arena;
    arena.layout_ = std::move(layout);
    arena.device_ = device;
    arena.borrowed_ = true;
    return arena;
}

void ModelArena::place(void* base, size_t origin_bytes) {
    LATHE_CHECK(borrowed_, "place() of an arena that owns its memory");
    base_ = base;
    origin_ = origin_bytes;
}

TensorView ModelArena::placed_view(size_t index) const {
    const ArenaEntry& e = layout_.entries().at(index);
    LATHE_CHECK(e.offset >= origin_, "entry {} lies before the window placed at offset {}", e.name,
                origin_);
    return TensorView(static_cast<std::byte*>(base_) + (e.offset - origin_), e.dtype, e.shape,
                      device_);
}

void ModelArena::zero() {
    if (device_ == Device::kCpu) {
        host_.zero();
        return;
    }
    cuda_fill_bytes(flat(DType::kU8), 0, stream_);
}

void ModelArena::zero_entry(size_t index) {
    const TensorView v = view(index);
    if (device_ == Device::kCpu) {
        std::memset(v.data(), 0, v.bytes());
        return;
    }
    cuda_fill_bytes(v, 0, stream_);
}

// ---- Model: creation and parameters ----

Status model_check_fp8(const ModelConfig& config, const ModelShape& shape) {
    const PrecisionPolicy& p = shape.precision;
    if (!precision_has_fp8(p)) return ok_status();
    if (p.of(LinearRole::kLmHead) == LinearPrecision::kFp8Blockwise)
        return unimplemented_error(
            "fp8.lm_head: true with fp8.recipe: blockwise: the LM head's fused GEMMs "
            "(lm_head_cross_entropy) run fp8 with per-tensor scales only; set fp8.lm_head: false "
            "or fp8.recipe: tensorwise / delayed");
    if (config.mlp != MlpKind::kSwiGlu && (p.of(LinearRole::kMlpUp) != LinearPrecision::kNative ||
                                           p.of(LinearRole::kMlpDown) != LinearPrecision::kNative))
        return unimplemented_error(
            "fp8: {}'s GELU MLP runs its GEMMs fused with the GELU (linear_gelu_*), which have no "
            "fp8 kernel; fp8 training needs a gated (SwiGLU) MLP: Llama, Mistral, Qwen2",
            config.model_type);
    // cuBLASLt's FP8 GEMMs: every leading dimension a multiple of 16 (ops/cuda/fp8_linear.h).
    const int64_t N = shape.batch * shape.seq_len;
    if (N % 16 != 0)
        return invalid_argument_error(
            "fp8: the batch's tokens (micro-batch {} x sequence length {} = {}) must be a "
            "multiple of 16 for the FP8 GEMMs",
            shape.batch, shape.seq_len, N);
    for (int64_t i = 0; i < kFp8LinearsPerLayer; ++i) {
        const Fp8Linear l = Fp8Linear(i);
        if (p.of(fp8_linear_role(l)) == LinearPrecision::kNative) continue;
        const auto [I, O] = fp8_linear_dims(config, l);
        if (I % 16 != 0 || O % 16 != 0)
            return invalid_argument_error(
                "fp8: the {} linear of {} is {} x {} (in x out); the FP8 GEMMs need both a "
                "multiple of 16",
                fp8_linear_name(l), config.model_type, I, O);
    }
    if (p.of(LinearRole::kLmHead) != LinearPrecision::kNative &&
        (config.hidden_size % 16 != 0 || config.vocab_size % 16 != 0))
        return invalid_argument_error(
            "fp8.lm_head: true: the LM head of {} is {} x {} (hidden x vocabulary); the FP8 GEMMs "
            "need both a multiple of 16; set fp8.lm_head: false",
            config.model_type, config.hidden_size, config.vocab_size);
    return ok_status();
}

Result<Model> Model::create(ModelConfig config, const ModelShape& shape, const Context& ctx) {
    if (precision_has_fp8(shape.precision) && ctx.backend != Backend::kCuda)
        return failed_precondition_error(
            "fp8 linears run on the CUDA backend (a GPU with FP8 tensor cores); this model "
            "computes on the {} backend: train in bf16 there, or on such a GPU",
            backend_name(ctx.backend));
    LATHE_RETURN_IF_ERROR(model_check_fp8(config, shape));
    // A vocabulary shard sums its embedding over the tensor group after the lookup; a learned
    // position table's gradient would then hold this rank's tokens alone (the families that
    // have one are not split: run/trainer.cpp).
    if (config.vocab_parallel() && config.position == PositionKind::kLearned)
        return unimplemented_error(
            "a vocabulary-parallel embedding with learned positions (the {} family): its "
            "position gradient is not summed over the tensor group",
            config.model_type);
    // Sequence parallel cuts the rows of the embedding's vocabulary-parallel sum (a reduce-scatter
    // of the lookup) and of a sequential residual stream (model/block.h).
    if (shape.sequence_shards > 1 && (!config.vocab_parallel() || config.parallel_residual))
        return unimplemented_error(
            "sequence parallel over {} ranks needs a vocabulary-parallel model with the "
            "sequential residual (the tensor-parallel training of llama, mistral, qwen2); {} is "
            "not one",
            shape.sequence_shards, config.model_type);
    Model m;
    m.table_ = model_param_table(config);
    ModelShape planned = shape;
    planned.backend = ctx.backend;  // the plan's dtypes follow where the model computes
    LATHE_ASSIGN_OR_RETURN(m.plan_, memory_plan_make(config, m.table_, planned));
    // cuDNN's attention graphs for the planned shape, built now (packed-document graphs and
    // smaller batches build theirs at first use), and the plan made again with the workspace
    // they ask for instead of its estimate: the scratch arena holds it (memory_plan.h).
    // A model planned for one-token sequences (the inference engine's parameter holder, whose
    // attention runs over its own KV cache) has no graph to build: cuDNN takes no s_q = s_kv = 1.
    std::vector<cuda::AttentionShape> attention_shapes;
    if (ctx.backend == Backend::kCuda && cuda::attention_unavailable_reason() == nullptr &&
        m.plan_.shape.seq_len > 1) {
        CudaState& state = cuda_state_of(ctx, "model");
        std::vector<int64_t> windows;
        for (int l = 0; l < int(config.num_layers); ++l)
            if (std::find(windows.begin(), windows.end(), config.window(l)) == windows.end())
                windows.push_back(config.window(l));
        size_t workspace = 0;
        for (int64_t w : windows) {
            cuda::AttentionShape s{m.plan_.shape.batch,
                                   m.plan_.shape.seq_len,
                                   config.num_heads,
                                   config.num_kv_heads,
                                   config.head_dim,
                                   w,
                                   false,
                                   block_attention_scale(config)};
            s.nondeterministic_backward = !ctx.deterministic;
            s.backward_workspace_cap = m.plan_.attention_backward_cap;
            workspace = std::max(workspace, cuda::attention_workspace_bytes(state, s));
            attention_shapes.push_back(s);
        }
        planned.attention_workspace_bytes = workspace;
        LATHE_ASSIGN_OR_RETURN(m.plan_, memory_plan_make(config, m.table_, planned));
    }
    m.config_ = std::move(config);
    m.ctx_ = ctx;
    // The attention backward's workspace stays within the scratch the model lends it (the same
    // cap as the shapes above, so the calls run the graphs planned and prepared here).
    m.ctx_.attention_backward_workspace_cap = m.plan_.attention_backward_cap;
    if (m.plan_.keeps_masters()) {
        LATHE_ASSIGN_OR_RETURN(m.params_, ModelArena::allocate(m.plan_.param_storage, ctx));
    }
    if (m.plan_.shape.training) {
        LATHE_ASSIGN_OR_RETURN(m.grads_, ModelArena::allocate(m.plan_.gradients, ctx));
    }
    LATHE_ASSIGN_OR_RETURN(m.acts_, ModelArena::allocate(m.plan_.activations, ctx));
    LATHE_ASSIGN_OR_RETURN(m.scratch_, ModelArena::allocate(m.plan_.scratch, ctx));
    if (m.on_cuda()) {
        LATHE_ASSIGN_OR_RETURN(m.params_compute_,
                               ModelArena::allocate(m.plan_.compute_storage, ctx));
        CudaState& state = cuda_state_of(ctx, "model");
        if (!attention_shapes.empty()) {
            // The scratch buffers dead during attention are its workspace; the loan ends when
            // the last copy of this model (moves share it) goes away.
            std::byte* lent = static_cast<std::byte*>(m.scratch_.flat(DType::kU8).data()) +
                              m.plan_.attention_offset;
            cuda::attention_lend_workspace(state, lent, m.plan_.attention_bytes);
            CudaState* owner = &state;
            m.attention_loan_ = std::shared_ptr<void>(
                lent, [owner](void* p) { cuda::attention_end_loan(*owner, p); });
            // Nothing grows now unless cuDNN's figure changed (then the state's own buffer does,
            // and the runtime row shows it).
            for (const cuda::AttentionShape& s : attention_shapes)
                cuda::attention_prepare(state, s);
            m.plan_.runtime += cuda::attention_buffer_bytes(state);
        }
    }
    if (!m.plan_.fp8.entries().empty()) {
        // The fp8 buffers of every FP8 linear (memory_plan.h), pointing into one arena.
        LATHE_ASSIGN_OR_RETURN(m.fp8_arena_, ModelArena::allocate(m.plan_.fp8, ctx));
        m.fp8_gemms_ = std::make_unique<Fp8GemmCounter>();
        const Fp8Settings& f8 = m.plan_.shape.fp8;
        const int64_t L = m.config_.num_layers;
        const bool delayed = f8.recipe == Fp8Recipe::kDelayed;
        if (delayed) {
            std::vector<DType> dtypes;
            for (int64_t t = 0; t < fp8_tensor_count(L, f8); ++t)
                dtypes.push_back(t % 3 == int64_t(Fp8Tensor::kGradOutput) ? f8.grad_dtype
                                                                          : DType::kE4M3);
            m.fp8_state_.emplace(std::move(dtypes), f8.amax_history, f8.amax_reduction);
        }
        auto data = [&](size_t e) { return m.fp8_arena_.view(e).data(); };
        auto floats = [&](size_t e) { return m.fp8_arena_.view(e).as<float>(); };
        const bool blockwise = f8.recipe == Fp8Recipe::kBlockwise;
        if (blockwise) {
            m.fp8_block_buffers_.resize(size_t(L));
            for (int64_t l = 0; l < L; ++l) {
                for (int64_t i = 0; i < kFp8LinearsPerLayer; ++i) {
                    const Fp8LinearEntries& e = m.plan_.fp8_linears[size_t(l)][size_t(i)];
                    if (e.wq == MemoryPlan::kNoEntry) continue;
                    Fp8BlockwiseBuffers& b = m.fp8_block_buffers_[size_t(l)][size_t(i)];
                    b.wq = data(e.wq);
                    b.wqt = data(e.wqt);
                    b.w_scale = floats(e.w_scale);
                    b.wt_scale = floats(e.wt_scale);
                    b.xq = b.dyq = data(m.plan_.fp8_q_scratch);
                    b.xqt = data(e.xqt);
                    b.x_scale = b.dy_scale = floats(m.plan_.fp8_scale_scratch);
                    b.xt_scale = floats(e.xt_scale);
                    b.dyqt = data(m.plan_.fp8_dyqt);
                    b.dyt_scale = floats(m.plan_.fp8_dyt_scale);
                    b.cast_scales = floats(m.plan_.fp8_cast_scales);
                    b.gemm_count = &m.fp8_gemms_->step_gemms;
                }
            }
        }
        float* scalars = blockwise ? nullptr : floats(m.plan_.fp8_scalars);
        if (!blockwise) m.fp8_buffers_.resize(size_t(L));
        for (int64_t l = 0; l < L && !blockwise; ++l) {
            for (int64_t i = 0; i < kFp8LinearsPerLayer; ++i) {
                const Fp8LinearEntries& e = m.plan_.fp8_linears[size_t(l)][size_t(i)];
                if (e.wq == MemoryPlan::kNoEntry) continue;
                Fp8LinearBuffers& b = m.fp8_buffers_[size_t(l)][size_t(i)];
                b.wq = data(e.wq);
                b.wqt = data(e.wqt);
                b.xqt = data(e.xqt);
                b.xq = b.dyq = data(m.plan_.fp8_q_scratch);
                b.dyqt = data(m.plan_.fp8_dyqt);
                b.scalars = scalars + e.scalars_offset;
                b.grad_dtype = f8.grad_dtype;
                b.gemm_count = &m.fp8_gemms_->step_gemms;
                if (delayed) {
                    const int64_t t = fp8_tensor_index(L, l, Fp8Linear(i), Fp8Tensor::kInput);
                    b.delayed_scale = m.fp8_arena_.view(m.plan_.fp8_scales).as<float>() + t;
                    b.step_amax = m.fp8_arena_.view(m.plan_.fp8_step_amax).as<float>() + t;
                }
            }
        }
        if (m.plan_.fp8_head.wq != MemoryPlan::kNoEntry) {
            // The LM head (memory_plan.h): x's codes in the shared xq and dyqt buffers.
            Fp8LinearBuffers& b = m.fp8_head_;
            b.wq = data(m.plan_.fp8_head.wq);
            b.wqt = data(m.plan_.fp8_head.wqt);
            b.xq = data(m.plan_.fp8_q_scratch);
            b.xqt = data(m.plan_.fp8_dyqt);
            b.scalars = scalars + m.plan_.fp8_head.scalars_offset;
            b.grad_dtype = f8.grad_dtype;
            b.gemm_count = &m.fp8_gemms_->step_gemms;
            if (delayed) {
                const int64_t t = fp8_head_tensor_index(L, Fp8Tensor::kInput);
                b.delayed_scale = m.fp8_arena_.view(m.plan_.fp8_scales).as<float>() + t;
                b.step_amax = m.fp8_arena_.view(m.plan_.fp8_step_amax).as<float>() + t;
            }
            m.fp8_head_eval_ = b;
            if (delayed)
                m.fp8_head_eval_.step_amax = m.fp8_arena_.view(m.plan_.fp8_eval_amax).as<float>() +
                                             fp8_head_tensor_index(L, Fp8Tensor::kInput);
        }
        if (delayed) {
            // The twins for forwards outside the training steps: amaxes to the unread block.
            m.fp8_eval_buffers_ = m.fp8_buffers_;
            float* eval_amax = m.fp8_arena_.view(m.plan_.fp8_eval_amax).as<float>();
            for (int64_t l = 0; l < L; ++l) {
                for (int64_t i = 0; i < kFp8LinearsPerLayer; ++i) {
                    Fp8LinearBuffers& b = m.fp8_eval_buffers_[size_t(l)][size_t(i)];
                    if (b.scalars == nullptr) continue;
                    b.step_amax =
                        eval_amax + fp8_tensor_index(L, l, Fp8Linear(i), Fp8Tensor::kInput);
                }
            }
            m.fp8_upload_scales();
        }
    }
    // Each half of the batch staging holds tokens, targets, docs, positions: four (B, T) i32
    // tensors; a micro-batch is staged into one half while the other's copy may be in flight.
    const size_t half_bytes =
        4 * size_t(m.plan_.shape.batch * m.plan_.shape.seq_len) * sizeof(int32_t);
    LATHE_ASSIGN_OR_RETURN(m.batch_staging_, BatchStaging::create(half_bytes, ctx));
    if (m.config_.position == PositionKind::kRope) {
        const TensorView cos = m.scratch_.view(m.plan_.rope_cos);
        HostTensor host_cos(DType::kF32, cos.shape()), host_sin(DType::kF32, cos.shape());
        rope_build_table(host_cos.view(), host_sin.view(), m.config_.rope);
        m.copy_from_host(cos, host_cos.view());
        m.copy_from_host(m.scratch_.view(m.plan_.rope_sin), host_sin.view());
    }
    m.synchronize();
    return m;
}

void Model::copy_from_host(TensorView dst, ConstTensorView src) {
    LATHE_CHECK(src.device() == Device::kCpu && dst.bytes() == src.bytes(), "copy of {} into {}",
                src.to_string(), dst.to_string());
    if (!on_cuda()) {
        if (dst.data() != src.data()) std::memcpy(dst.data(), src.data(), src.bytes());
        return;
    }
    cuda_copy_sync(dst, src.reshape(dst.shape()), ctx_.stream);
}

void Model::copy_to_host(TensorView host, ConstTensorView src) const {
    LATHE_CHECK(host.device() == Device::kCpu && host.bytes() == src.bytes(), "copy of {} into {}",
                src.to_string(), host.to_string());
    if (!on_cuda()) {
        if (host.data() != src.data()) std::memcpy(host.data(), src.data(), src.bytes());
        return;
    }
    cuda_copy_sync(host.reshape(src.shape()), src, ctx_.stream);
}

float Model::read_scalar(ConstTensorView v) const {
    LATHE_CHECK(v.numel() == 1 && v.dtype() == DType::kF32, "read_scalar of {}", v.to_string());
    if (!on_cuda()) return *v.as<float>();
    float value = 0.0f;
    cuda_copy_sync(TensorView(&value, DType::kF32, Shape{1}), v.reshape(Shape{1}), ctx_.stream);
    return value;
}

void Model::synchronize() const {
    if (on_cuda()) cuda_state_of(ctx_, "model").synchronize();
}

TensorView Model::param_entry(size_t index) const {
    LATHE_CHECK(!params_sharded(),
                "param_entry({}): the parameters are sharded over {} ranks (ZeRO-3); this rank "
                "holds no entry whole",
                index, plan_.shape.param_shards);
    return params_.view(index);
}

void Model::read_param_entry(size_t arena_index, TensorView host) const {
    LATHE_CHECK(!params_sharded(),
                "read_param_entry({}): the parameters are sharded over {} ranks (ZeRO-3); the "
                "gathered parameters come from DataParallel::gather_params",
                arena_index, plan_.shape.param_shards);
    if (!host_masters_.empty()) {
        if (host_masters_hook_) host_masters_hook_();
        const ArenaEntry& a = plan_.params.entries().at(arena_index);
        LATHE_CHECK(host.device() == Device::kCpu && host.dtype() == DType::kF32 &&
                        host.numel() == a.shape.numel(),
                    "read_param_entry({}) of {}", a.name, host.to_string());
        const float* src = host_masters_.data() + a.offset / sizeof(float);
        if (src != host.data()) std::memcpy(host.data(), src, a.bytes);
        return;
    }
    if (plan_.keeps_masters()) {
        copy_to_host(host, params_.view(arena_index));
        return;
    }
    // The bf16 compute copy alone (memory_plan.h): widened exactly.
    LATHE_CHECK(host.dtype() == DType::kF32, "read_param_entry: f32 host memory, not {}",
                host.to_string());
    const TensorView src = params_compute_.view(arena_index);
    std::vector<bf16> codes(size_t(src.numel()));
    copy_to_host(TensorView(codes.data(), DType::kBF16, src.shape()), src);
    float* out = host.as<float>();
    for (size_t i = 0; i < codes.size(); ++i) out[i] = bf16_to_float(codes[i]);
}

void Model::read_grad_entry(size_t arena_index, TensorView host) const {
    LATHE_CHECK(plan_.shape.gradient_shards == 1,
                "read_grad_entry: the gradients are sharded (no arena entry per parameter)");
    LATHE_CHECK(arena_index < grads_.layout().size(),
                "read_grad_entry({}): the model has {} gradient entries (created for training?)",
                arena_index, grads_.layout().size());
    copy_to_host(host, grads_.view(arena_index));
}

void Model::attach_host_masters(std::span<float> masters) {
    LATHE_CHECK(masters.empty() ||
                    (plan_.shape.masters_on_host && int64_t(masters.size()) == params_total()),
                "attach_host_masters: {} elements for a model of {} (masters_on_host {})",
                masters.size(), params_total(), plan_.shape.masters_on_host);
    host_masters_ = masters;
}

void Model::write_param_entry(size_t arena_index, ConstTensorView host) {
    fp8_weights_stale_ = true;
    ++param_writes_;
    if (!host_masters_.empty()) {
        if (host_masters_hook_) host_masters_hook_();
        const ArenaEntry& a = plan_.params.entries().at(arena_index);
        LATHE_CHECK(host.device() == Device::kCpu && host.dtype() == DType::kF32 &&
                        host.numel() == a.shape.numel(),
                    "write_param_entry({}) of {}", a.name, host.to_string());
        float* dst = host_masters_.data() + a.offset / sizeof(float);
        if (dst != host.data()) std::memcpy(dst, host.data(), a.bytes);  // ParamStaging's views
    }
    if (!plan_.keeps_masters()) {
        // Rounded to nearest even on the host, as cuda_cast rounds, into the compute copy.
        LATHE_CHECK(host.dtype() == DType::kF32, "write_param_entry: f32 host memory, not {}",
                    host.to_string());
        const TensorView dst = params_compute_.view(arena_index);
        LATHE_CHECK(host.numel() == dst.numel(), "write_param_entry: {} into {}", host.to_string(),
                    dst.to_string());
        // Over the cores, into memory no one zeroes first: an 8B model's 8e9 elements take
        // seconds on one core.
        const int64_t n = dst.numel();
        const auto codes = std::make_unique_for_overwrite<uint16_t[]>(size_t(n));
        const float* in = host.as<float>();
        uint16_t* out = codes.get();
#pragma omp parallel for schedule(static) if (n > (int64_t(1) << 20))
        for (int64_t i = 0; i < n; ++i) out[i] = float_to_bf16(in[i]).bits;
        copy_from_host(dst, ConstTensorView(out, DType::kBF16, dst.shape()));
        return;
    }
    if (params_sharded()) {
        // This rank's chunk of each unit the entry lies in (one unit: entries do not straddle).
        const ArenaEntry& a = plan_.params.entries().at(arena_index);
        LATHE_CHECK(host.device() == Device::kCpu && host.dtype() == DType::kF32 &&
                        host.numel() == a.shape.numel(),
                    "write_param_entry({}) of {}", a.name, host.to_string());
        const ShardLayout& sl = plan_.shards;
        const int rank = plan_.shape.shard_rank;
        const ConstTensorView flat = host.reshape(Shape{host.numel()});
        const int64_t lo = int64_t(a.offset / sizeof(float)), hi = lo + a.shape.numel();
        int64_t at = 0;  // the unit's chunk in the shard
        for (size_t u = 0; u < sl.units(); ++u) {
            const FlatRange c = sl.chunk(u, rank);
            const int64_t b = std::max(lo, c.begin), e = std::min(hi, c.end);
            if (e > b) {
                const int64_t s = at + (b - c.begin);
                const TensorView dst = params_flat().slice(s, s + (e - b));
                copy_from_host(dst, flat.slice(b - lo, e - lo));
                if (on_cuda())
                    cuda_cast(params_compute_flat().slice(s, s + (e - b)), dst, ctx_.stream);
            }
            at += c.size();
        }
        return;
    }
    copy_from_host(params_.view(arena_index), host);
    if (on_cuda())
        cuda_cast(params_compute_.view(arena_index), params_.view(arena_index), ctx_.stream);
}

void Model::init(uint64_t seed) {
    // Entry by entry: its tensors drawn, uploaded, its host copy freed, so that the host holds
    // one entry's f32 copy at a time (an 8B model's whole f32 copy is 32 GB).
    std::vector<std::vector<const HfParam*>> of_entry(table_.entries().size());
    for (const HfParam& p : table_.hf_params()) of_entry[p.entry].push_back(&p);
    ParamStaging staging(*this);
    for (size_t e = 0; e < of_entry.size(); ++e) {
        if (of_entry[e].empty()) continue;
        const size_t arena_index = table_.entries()[e].arena_index;
        for (const HfParam* p : of_entry[e])
            init_hf_param(config_, *p, staging.host(arena_index), seed);
        staging.upload(*this, arena_index);
        staging.release(arena_index);
    }
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
    LATHE_CHECK(training(), "zero_grads: the model was created without gradients");
    wait_grads_zeroing();
    grads_.zero();
    grads_deferred_ = false;
}

void Model::make_grad_clear_ranges() {
    if (!grads_cleared_ranges_.empty() || !grads_deferred_ranges_.empty()) return;
    // The entries one GEMM a micro-batch writes whole: each layer's projections and the LM
    // head's weight (with tied embeddings the token embedding, which embedding_backward then
    // adds to: the head's backward runs first).
    const auto& arena = grads_.layout().entries();
    const size_t head = head_entry();
    for (const ParamEntry& e : table_.entries()) {
        const bool projection = e.role == ParamRole::kQkvWeight ||
                                e.role == ParamRole::kOutWeight || e.role == ParamRole::kUpWeight ||
                                e.role == ParamRole::kDownWeight;
        if (!projection && e.arena_index != head) continue;
        const ArenaEntry& a = arena[e.arena_index];
        grads_deferred_ranges_.push_back({a.offset, a.offset + a.bytes});
    }
    std::sort(grads_deferred_ranges_.begin(), grads_deferred_ranges_.end(),
              [](const ByteRange& x, const ByteRange& y) { return x.begin < y.begin; });
    // Everything else, padding included (the norm reads the arena whole).
    size_t at = 0;
    for (const ByteRange& r : grads_deferred_ranges_) {
        if (r.begin > at) grads_cleared_ranges_.push_back({at, r.begin});
        at = std::max(at, r.end);
    }
    const size_t total = grads_.layout().total_bytes();
    if (total > at) grads_cleared_ranges_.push_back({at, total});
}

GradMode Model::take_weight_grad_mode() {
    const bool deferred = grads_deferred_;
    grads_deferred_ = false;
    return deferred ? GradMode::kOverwrite : GradMode::kAccumulate;
}

void Model::clear_deferred_grads() {
    if (!grads_deferred_) return;
    wait_grads_zeroing();
    cuda_zero_ranges(grads_.flat(DType::kU8).data(), grads_deferred_ranges_, ctx_.stream);
    grads_deferred_ = false;
}

bool Model::grads_clear_beside() const {
    return on_cuda() && plan_.shape.gradient_shards == 1 && !grad_window_;
}

void Model::zero_grads_beside_forward() {
    LATHE_CHECK(training(), "zero_grads: the model was created without gradients");
    if (!grads_clear_beside()) {
        zero_grads();
        return;
    }
    CudaState& st = cuda_state_of(ctx_, "model");
    // After every read and write of the gradients enqueued so far (the last step's update).
    st.wait_for(st.optimizer_stream(), st.stream());
    clear_grads_for_next_backward(st.optimizer_stream());
}

bool Model::clear_grads_for_next_backward(CUstream_st* stream) {
    LATHE_CHECK(training(), "zero_grads: the model was created without gradients");
    if (!grads_clear_beside()) return false;
    make_grad_clear_ranges();
    cuda_zero_ranges(grads_.flat(DType::kU8).data(), grads_cleared_ranges_, stream);
    grads_deferred_ = true;
    if (!grads_zeroing_) grads_zeroing_ = std::make_unique<CudaEvent>();
    grads_zeroing_->record(stream);
    grads_zeroing_pending_ = true;
    return true;
}

void Model::wait_grads_zeroing() {
    if (!grads_zeroing_pending_) return;
    grads_zeroing_->wait(ctx_.stream);
    grads_zeroing_pending_ = false;
}

void Model::zero_grad_entry(size_t index) {
    LATHE_CHECK(plan_.shape.gradient_shards == 1,
                "zero_grad_entry: the gradients are sharded (no arena entry per parameter)");
    clear_deferred_grads();
    wait_grads_zeroing();
    grads_.zero_entry(table_.entries().at(index).arena_index);
}

float Model::grad_norm() {
    LATHE_CHECK(training(), "grad_norm: the model was created without gradients");
    clear_deferred_grads();
    wait_grads_zeroing();
    const TensorView norm = scratch_.view(plan_.grad_norm);
    const ConstTensorView grads[] = {grads_flat()};
    grad_norm_l2(norm, grads, ctx_);
    return read_scalar(norm);
}

double Model::grad_sum_of_squares(std::span<const FlatRange> ranges) {
    LATHE_CHECK(training(), "grad_sum_of_squares: the model was created without gradients");
    clear_deferred_grads();
    wait_grads_zeroing();
    const TensorView all = grads_flat();
    if (!on_cuda()) {
        double sum = 0.0;
        for (const FlatRange& r : ranges)
            sum += cpu::sum_of_squares(all.as<float>() + r.begin, r.size());
        return sum;
    }
    const TensorView norm = scratch_.view(plan_.grad_norm);
    std::vector<ConstTensorView> grads;
    grads.reserve(ranges.size());
    for (const FlatRange& r : ranges) grads.push_back(all.slice(r.begin, r.end));
    grad_norm_l2(norm, grads, ctx_);
    const double n = read_scalar(norm);
    return n * n;
}

std::vector<FlatRange> Model::sequence_parallel_partial_ranges() const {
    std::vector<FlatRange> out;
    if (!sequence_parallel()) return out;
    for (const ParamEntry& e : table_.entries()) {
        if (!sequence_parallel_partial_role(e.role)) continue;
        const int64_t begin = int64_t(plan_.params.entries()[e.arena_index].offset / sizeof(float));
        out.push_back(FlatRange{begin, begin + e.shape.numel()});
    }
    return out;
}

void Model::sum_sequence_parallel_grads(std::span<const TensorView> pieces) {
    LATHE_CHECK(sequence_parallel() && training() && tp_sum_,
                "sum_sequence_parallel_grads: a sequence-parallel training model in a group");
    const TensorView packed = scratch_.view(plan_.sequence_parallel_grads);
    int64_t n = 0;
    for (const TensorView& p : pieces) {
        LATHE_CHECK(p.dtype() == DType::kF32 && n + p.numel() <= packed.numel(),
                    "sum_sequence_parallel_grads: {} after {} of {} packed elements", p.to_string(),
                    n, packed.numel());
        n += p.numel();
    }
    // Every rank calls the sum, with pieces or none (a ZeRO-2 shard may hold none of them).
    auto move = [&](bool pack) {
        int64_t at = 0;
        for (const TensorView& p : pieces) {
            const TensorView q = packed.slice(at, at + p.numel());
            const TensorView flat = p.reshape(Shape{p.numel()});
            const TensorView dst = pack ? q : flat, src = pack ? flat : q;
            if (on_cuda())
                cuda_copy_async(dst, src, ctx_.stream);
            else
                std::memcpy(dst.data(), src.data(), src.bytes());
            at += p.numel();
        }
    };
    move(true);
    tp_sum_(packed.slice(0, std::max<int64_t>(n, 1)));
    move(false);
}

void Model::set_grad_norm_value(float norm) {
    LATHE_CHECK(training(), "set_grad_norm_value: the model was created without gradients");
    copy_from_host(scratch_.view(plan_.grad_norm), ConstTensorView(&norm, DType::kF32, Shape{1}));
}

// ---- Model: FP8 ----

void Model::fp8_upload_scales() {
    if (!fp8_state_) return;
    const std::vector<float>& scales = fp8_state_->scales();
    copy_from_host(fp8_arena_.view(plan_.fp8_scales),
                   ConstTensorView(scales.data(), DType::kF32, Shape{int64_t(scales.size())}));
}

void Model::fp8_end_step() {
    if (!fp8_state_) return;
    const TensorView amax = fp8_arena_.view(plan_.fp8_step_amax);
    fp8_host_.resize(size_t(amax.numel()));
    copy_to_host(TensorView(fp8_host_.data(), DType::kF32, amax.shape()), amax);
    for (int64_t t = 0; t < amax.numel(); ++t) fp8_state_->record(t, fp8_host_[size_t(t)]);
    fp8_state_->update();
    fp8_arena_.zero_entry(plan_.fp8_step_amax);
    fp8_upload_scales();
}

BlockFp8 Model::block_fp8(int layer, bool step) const {
    BlockFp8 f8;
    const auto& linear = step || fp8_eval_buffers_.empty() ? fp8_buffers_ : fp8_eval_buffers_;
    for (size_t i = 0; i < size_t(kFp8LinearsPerLayer); ++i) {
        if (!linear.empty()) {
            const Fp8LinearBuffers& b = linear[size_t(layer)][i];
            f8.linear[i] = b.scalars != nullptr ? &b : nullptr;
        }
        if (!fp8_block_buffers_.empty()) {
            const Fp8BlockwiseBuffers& b = fp8_block_buffers_[size_t(layer)][i];
            f8.block[i] = b.cast_scales != nullptr ? &b : nullptr;
        }
    }
    return f8;
}

void Model::fp8_cast_weights(int layer, bool step) {
    const BlockWeights w = block_weights(layer);
    const ConstTensorView weights[kFp8LinearsPerLayer] = {w.wqkv, w.wo, w.w_up, w.w_down};
    const BlockFp8 f8 = block_fp8(layer, step);
    for (size_t i = 0; i < size_t(kFp8LinearsPerLayer); ++i) {
        if (f8.linear[i] == nullptr && f8.block[i] == nullptr) continue;
        LinearSpec spec = plan_.shape.precision.spec(fp8_linear_role(Fp8Linear(i)));
        spec.fp8 = f8.linear[i];
        spec.fp8_block = f8.block[i];
        linear_fp8_cast_weight(weights[i], ctx_, spec);
        ++fp8_weight_casts_;
    }
}

LinearSpec Model::head_spec(bool step) const {
    LinearSpec spec = plan_.shape.precision.spec(LinearRole::kLmHead);
    if (fp8_head_.scalars != nullptr) spec.fp8 = step ? &fp8_head_ : &fp8_head_eval_;
    spec.x_amax = head_x_amax().as<float>();
    return spec;
}

TensorView Model::head_x_amax() const {
    if (fp8_head_.scalars == nullptr || fp8_head_.delayed_scale != nullptr ||
        config_.norm != NormKind::kRmsNorm)
        return {};
    return TensorView(fp8_head_.scalars, DType::kF32, Shape{1}, Device::kCuda);
}

// ---- Model: views ----

TensorView Model::entry_rows(const ModelArena& arena, ParamRole role, int layer, int64_t begin,
                             int64_t end) const {
    const size_t e = table_.find_entry(role, layer);
    if (e == ParamTable::kNone) return TensorView();
    return arena.view(table_.entries()[e].arena_index).slice(begin, end);
}

void Model::set_grad_window_hook(GradWindowHook hook) {
    grad_window_ = std::move(hook);
    grad_window_arena_ =
        grad_window_ ? ModelArena::borrowed(plan_.params, on_cuda() ? Device::kCuda : Device::kCpu)
                     : ModelArena();
}

void Model::set_weight_window_hook(WeightWindowHook hook) {
    weight_window_ = std::move(hook);
    weight_window_arena_ =
        weight_window_ ? ModelArena::borrowed(on_cuda() ? plan_.params_compute : plan_.params,
                                              on_cuda() ? Device::kCuda : Device::kCpu)
                       : ModelArena();
}

const ModelArena& Model::weights_for(int piece) const {
    const TensorView w = weight_window_ ? weight_window_(piece) : TensorView();
    if (w.is_null()) {
        LATHE_CHECK(!params_sharded(),
                    "the parameters are sharded over {} ranks (ZeRO-3): the model computes from "
                    "the weight windows hook's windows (run/data_parallel.h), and it gave none "
                    "for piece {}",
                    plan_.shape.param_shards, piece);
        return weights();
    }
    const ShardLayout& sl = plan_.shards;
    const FlatRange unit = sl.arena[piece == kInputWeights    ? ShardLayout::kFront
                                    : piece == kOutputWeights ? sl.back()
                                                              : sl.layer_unit(piece)];
    const DType dtype = on_cuda() ? DType::kBF16 : DType::kF32;
    LATHE_CHECK(w.dtype() == dtype && w.numel() >= unit.size(),
                "weight window {} for a unit of {} {} elements", w.to_string(), unit.size(),
                dtype_name(dtype));
    weight_window_arena_.place(w.data(), size_t(unit.begin) * dtype_size(dtype));
    return weight_window_arena_;
}

const ModelArena& Model::weights_of(ParamRole role) const {
    const size_t e = table_.find_entry(role);
    if (e == ParamTable::kNone) return weights();
    return weights_for(piece_of_entry(table_.entries()[e].arena_index));
}

TensorView Model::weights_at(size_t arena_index) const {
    return weights_for(piece_of_entry(arena_index)).view(arena_index);
}

int Model::piece_of_entry(size_t arena_index) const {
    const ShardLayout& sl = plan_.shards;
    const int64_t at = int64_t(plan_.params.entries()[arena_index].offset / sizeof(float));
    size_t u = 0;
    while (u + 1 < sl.units() && at >= sl.arena[u].end) ++u;
    return u == ShardLayout::kFront ? kInputWeights : u == sl.back() ? kOutputWeights : int(u) - 1;
}

const ModelArena& Model::grads_for(int piece) const {
    if (!grad_window_) return grads_;
    const TensorView w = grad_window_(piece);
    if (w.is_null()) return grads_;
    const ShardLayout& sl = plan_.shards;
    const FlatRange unit = sl.arena[piece == kInputWeights    ? ShardLayout::kFront
                                    : piece == kOutputWeights ? sl.back()
                                                              : sl.layer_unit(piece)];
    LATHE_CHECK(w.dtype() == DType::kF32 && w.numel() >= unit.size(),
                "gradient window {} for a unit of {} elements", w.to_string(), unit.size());
    grad_window_arena_.place(w.data(), size_t(unit.begin) * sizeof(float));
    return grad_window_arena_;
}

const ModelArena& Model::grads_of(ParamRole role) const {
    const size_t e = table_.find_entry(role);
    if (!grad_window_ || e == ParamTable::kNone) return grads_;
    return grads_for(piece_of_entry(table_.entries()[e].arena_index));
}

TensorView Model::grads_at(size_t arena_index) const {
    if (!grad_window_) return grads_.view(arena_index);
    return grads_for(piece_of_entry(arena_index)).view(arena_index);
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
    v.wqkv = entry_rows(arena, ParamRole::kQkvWeight, l, 0, q + 2 * kv);
    v.bqkv = entry_rows(arena, ParamRole::kQkvBias, l, 0, q + 2 * kv);
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
    fill_block_views(w, weights_for(l), l);
    return w;
}

BlockGrads Model::block_grads(int l) const {
    BlockGrads g;
    fill_block_views(g, grads_for(l), l);
    return g;
}

BlockActs Model::block_acts(int l) const {
    BlockActs a;
    size_t i = 0;
    const std::vector<size_t>& entries = plan_.block_acts[size_t(l)];
    block_acts_for_each(config_, dims_.B, dims_.T, plan_.shape.sequence_shards,
                        activation_dtype(ctx_.backend),
                        [&](const char*, TensorView BlockActs::*member, DType, const Shape& s) {
                            a.*member = act(entries[i++], s);
                        });
    const Shape x = rows_shape();
    a.x_out = l + 1 < config_.num_layers ? act(plan_.block_acts[size_t(l) + 1][0], x)
                                         : act(plan_.final_x, x);
    return a;
}

BlockScratch Model::block_scratch() const {
    BlockScratch s;
    size_t i = 0;
    block_scratch_for_each(
        config_, dims_.B, dims_.T, plan_.shape.sequence_shards, activation_dtype(ctx_.backend),
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
    if (tp_sum_) in.tp_sum = &tp_sum_;
    if (sequence_parallel()) {
        in.tp_rows = &tp_rows_;
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
    const int64_t row_shares = plan_.shape.sequence_shards * std::max(tp_rows_.chunks, 1);
    LATHE_CHECK((d.B * d.T) % row_shares == 0,
                "batch ({}, {}): sequence parallel over {} ranks in {} chunks cuts B T rows in "
                "equal shares",
                d.B, d.T, plan_.shape.sequence_shards, std::max(tp_rows_.chunks, 1));
    const Shape bt{d.B, d.T};
    auto expect = [&](ConstTensorView v, const char* what) {
        LATHE_CHECK(v.shape() == bt && v.dtype() == DType::kI32 && v.device() == Device::kCpu,
                    "{} must be ({}, {}) i32 on the host like tokens, got {}", what, d.B, d.T,
                    v.to_string());
    };
    check_ids(tok, "tokens", 0, config_.vocab_ids(), false);
    // Slots of the pinned buffer's half (CUDA): one (B, T) i32 tensor of the plan's size each.
    const size_t slot = size_t(plan_.shape.batch * plan_.shape.seq_len) * sizeof(int32_t);
    const size_t half = batch_staging_.begin();
    batch_staging_.copy(act(plan_.tokens, bt), tok, half);
    LATHE_CHECK(!need_targets || !batch.targets.is_null(), "forward needs targets");
    if (!batch.targets.is_null()) {
        expect(batch.targets, "targets");
        check_ids(batch.targets, "targets", 0, config_.vocab_ids(), true);
        batch_staging_.copy(act(plan_.targets, bt), batch.targets, half + slot);
    }
    has_docs_ = !batch.docs.is_null();
    if (has_docs_) {
        expect(batch.docs, "docs");
        batch_staging_.copy(act(plan_.docs, bt), batch.docs, half + 2 * slot);
    }
    has_positions_ = !batch.positions.is_null();
    if (has_positions_) {
        expect(batch.positions, "positions");
        check_ids(batch.positions, "positions", 0, plan_.shape.seq_len, false);
        batch_staging_.copy(act(plan_.positions, bt), batch.positions, half + 3 * slot);
    }
    batch_staging_.end();
    dims_ = d;
    return d;
}

void Model::run_forward_blocks(bool step) {
    const Shape bt{dims_.B, dims_.T};
    const Shape btc{dims_.B, dims_.T, config_.hidden_size};
    const bool sp = sequence_parallel();
    LATHE_CHECK(!sp || (tp_rows_.gather && tp_rows_.scatter && tp_rows_.wait),
                "a sequence-parallel model computes in a group (set_tensor_parallel_rows)");
    // Embedding (+ learned positions) into the first block's input.
    TensorView x0 = act(plan_.block_acts[0][0], rows_shape());
    const BlockScratch scratch = block_scratch();
    TensorView wpe;
    ConstTensorView positions;
    if (weights_needed_) weights_needed_(kInputWeights);
    if (config_.position == PositionKind::kLearned) {
        wpe = entry_rows(weights_of(ParamRole::kPositionEmbedding), ParamRole::kPositionEmbedding,
                         -1, 0, config_.max_position_embeddings);
        if (has_positions_) positions = act(plan_.positions, bt);
    }
    const TensorView wte = entry_rows(weights_of(ParamRole::kTokenEmbedding),
                                      ParamRole::kTokenEmbedding, -1, 0, config_.vocab_size);
    if (config_.vocab_parallel()) {
        // The shard's rows, zeros for the ids of the other shards, summed over the group
        // (ops/vocab_parallel.h).
        LATHE_CHECK(tp_sum_ && tp_max_,
                    "a vocabulary shard's model computes in a group "
                    "(set_tensor_parallel_sum and _max)");
        // Sequence parallel: the lookup of every row into the block scratch (free before the
        // first block), reduce-scattered to this rank's rows.
        const TensorView ids = act(plan_.vocab_ids, bt);
        const TensorView x_full = sp ? scratch.tmp : x0;
        vocab_shard_ids(ids, act(plan_.tokens, bt), config_.vocab_begin, config_.vocab_size,
                        config_.vocab_total, ctx_);
        embedding_forward(x_full, ids, positions, wte, wpe, ctx_);
        vocab_shard_zero_rows(x_full, act(plan_.tokens, bt), config_.vocab_begin,
                              config_.vocab_size, ctx_);
        if (sp)
            tp_scatter_rows(tp_rows_, x0, x_full);
        else
            tp_sum_(x0);
    } else {
        embedding_forward(x0, act(plan_.tokens, bt), positions, wte, wpe, ctx_);
    }
    const BlockInputs inputs = block_inputs();
    // The weight codes: cast when stale, and by a training forward after a forward outside the
    // steps cast them under delayed scaling (file comment).
    const bool cast_fp8 = fp8() && (fp8_weights_stale_ || (step && fp8_step_cast_due_));
    for (int l = 0; l < int(config_.num_layers); ++l) {
        if (weights_needed_) weights_needed_(l);
        if (cast_fp8) fp8_cast_weights(l, step);
        block_forward(config_, plan_.shape.precision, l, block_weights(l), block_acts(l), scratch,
                      inputs, ctx_, block_fp8(l, step));
    }
    if (weights_needed_) weights_needed_(kOutputWeights);
    wait_grads_zeroing();
    if (cast_fp8 && fp8_head_.scalars != nullptr) {
        linear_fp8_cast_weight(weights_at(head_entry()), ctx_, head_spec(step));
        ++fp8_weight_casts_;
    }
    if (cast_fp8) {
        fp8_weights_stale_ = false;
        fp8_step_cast_due_ = !step && fp8_state_.has_value();
    }
    // Sequence parallel: the final norm of this rank's rows (into the block scratch), gathered
    // to the full rows the vocabulary-parallel head reads.
    const TensorView norm_out = sp ? scratch.reduced : act(plan_.final_norm_out, btc);
    block_norm_forward(config_, norm_out,
                       plan_.final_norm_mean == MemoryPlan::kNoEntry
                           ? TensorView()
                           : act(plan_.final_norm_mean, Shape{rows()}),
                       act(plan_.final_norm_rstd, Shape{rows()}), act(plan_.final_x, rows_shape()),
                       entry_rows(weights_of(ParamRole::kFinalNormWeight),
                                  ParamRole::kFinalNormWeight, -1, 0, config_.hidden_size),
                       entry_rows(weights_of(ParamRole::kFinalNormBias), ParamRole::kFinalNormBias,
                                  -1, 0, config_.hidden_size),
                       ctx_, sp ? TensorView() : head_x_amax());
    if (sp) tp_gather_rows(tp_rows_, act(plan_.final_norm_out, btc), norm_out);
}

void Model::run_backward_from_final(TensorView dfinal, GradMode weight_mode) {
    const Shape bt{dims_.B, dims_.T};
    const int64_t C = config_.hidden_size;
    const bool sp = sequence_parallel();
    TensorView dres = scratch_.view(plan_.dres, rows_shape());
    const BlockScratch scratch = block_scratch();
    const BlockInputs inputs = block_inputs();
    // dfinal: the head's dx, summed over the vocabulary shards (head_backward), or with sequence
    // parallel still the shard's part: reduce-scattered to this rank's rows here.
    ConstTensorView dnorm = dfinal;
    if (sp) {
        tp_scatter_rows(tp_rows_, scratch.reduced, dfinal);
        dnorm = scratch.reduced;
    }
    block_norm_backward(
        config_, dres,
        entry_rows(grads_of(ParamRole::kFinalNormWeight), ParamRole::kFinalNormWeight, -1, 0, C),
        entry_rows(grads_of(ParamRole::kFinalNormBias), ParamRole::kFinalNormBias, -1, 0, C), dnorm,
        act(plan_.final_x, rows_shape()),
        entry_rows(weights_of(ParamRole::kFinalNormWeight), ParamRole::kFinalNormWeight, -1, 0, C),
        plan_.final_norm_mean == MemoryPlan::kNoEntry ? TensorView()
                                                      : act(plan_.final_norm_mean, Shape{rows()}),
        act(plan_.final_norm_rstd, Shape{rows()}), GradMode::kOverwrite, ctx_);
    for (int l = int(config_.num_layers) - 1; l >= 0; --l) {
        // Full recompute: refill the shared activations from the layer's saved input. Its x_out
        // (the next layer's input, or final_x) is rewritten with the same bits. Selective: refill
        // the shared norm and activation outputs from the layer's kept tensors.
        const BlockFp8 f8 = block_fp8(l);
        if (plan_.shape.recompute == Recompute::kFull)
            block_forward(config_, plan_.shape.precision, l, block_weights(l), block_acts(l),
                          scratch, inputs, ctx_, f8);
        else if (plan_.shape.recompute == Recompute::kSelective)
            block_recompute_selective(config_, block_weights(l), block_acts(l), ctx_);
        BlockGrads grads = block_grads(l);
        grads.weight_mode = weight_mode;
        block_backward(config_, plan_.shape.precision, l, block_weights(l), grads, block_acts(l),
                       scratch, inputs, dres, ctx_, f8);
        if (grads_ready_) grads_ready_(l);
    }
    TensorView dwpe;
    ConstTensorView positions;
    if (config_.position == PositionKind::kLearned) {
        dwpe = entry_rows(grads_of(ParamRole::kPositionEmbedding), ParamRole::kPositionEmbedding,
                          -1, 0, config_.max_position_embeddings);
        if (has_positions_) positions = act(plan_.positions, bt);
    }
    const TensorView ids = act(plan_.tokens, bt);
    const TensorView dwte = entry_rows(grads_of(ParamRole::kTokenEmbedding),
                                       ParamRole::kTokenEmbedding, -1, 0, config_.vocab_size);
    // Sequence parallel: every row's gradient, gathered into the block scratch (free once the
    // blocks' backward is done), reaches the rows of the vocabulary shard.
    TensorView dx0 = dres;
    if (sp) {
        dx0 = scratch.tmp;
        tp_gather_rows(tp_rows_, dx0, dres);
    }
    if (config_.vocab_parallel()) {
        // Only the rows of the ids this shard holds reach its rows; the other ids touch none
        // (ops/vocab_parallel.h).
        vocab_shard_embedding_backward(dwte, dx0, ids, config_.vocab_begin, config_.vocab_total,
                                       ctx_);
        LATHE_CHECK(dwpe.is_null(), "a vocabulary shard's model has no learned positions");
    } else {
        embedding_backward(dwte, dwpe, dx0, ids, positions, ctx_);
    }
    if (grads_ready_) grads_ready_(kOutsideLayers);
}

float Model::forward(const ModelBatch& batch) {
    const float loss = forward_loss(batch, /*step=*/true);
    backward_ready_ = true;
    return loss;
}

float Model::eval_forward(const ModelBatch& batch) {
    return forward_loss(batch, /*step=*/false);
}

float Model::forward_loss(const ModelBatch& batch, bool step) {
    backward_ready_ = false;
    load_batch(batch, /*need_targets=*/true);
    run_forward_blocks(step);
    TensorView loss = act(plan_.loss, Shape{1});
    head_forward(loss, step);
    return read_scalar(loss);
}

void Model::head_forward(TensorView loss, bool step) {
    const int64_t N = dims_.B * dims_.T;
    const TensorView x = act(plan_.final_norm_out, Shape{N, config_.hidden_size});
    const TensorView targets = act(plan_.targets, Shape{N}), lse = act(plan_.lm_lse, Shape{N});
    if (!config_.vocab_parallel()) {
        lm_head_cross_entropy_forward(loss, TensorView(), lse, x, targets, weights_at(head_entry()),
                                      scratch_.view(plan_.lm_chunk), ctx_, head_spec(step));
        return;
    }
    // The shard's statistics, then the group's (ops/vocab_parallel.h): lse becomes the whole
    // vocabulary's, which the backward reads.
    const TensorView vp = scratch_.view(plan_.lm_vocab_parallel).reshape(Shape{4 * N});
    const TensorView losses = vp.slice(3 * N, 4 * N);
    lm_head_cross_entropy_forward(loss, losses, lse, x, targets, weights_at(head_entry()),
                                  scratch_.view(plan_.lm_chunk), ctx_, head_spec(step),
                                  vocab_shard());
    VocabParallelReduce reduce{tp_max_, tp_sum_};
    cross_entropy_vocab_parallel_combine(loss, losses, lse, targets,
                                         vp.slice(0, 3 * N).reshape(Shape{3, N}), reduce, ctx_);
}

void Model::head_backward(TensorView dfinal, float dloss, GradMode weight_mode) {
    const int64_t N = dims_.B * dims_.T, C = config_.hidden_size;
    LinearSpec spec = head_spec(/*step=*/true);
    spec.dweight_mode = weight_mode;
    lm_head_cross_entropy_backward(
        dfinal.reshape(Shape{N, C}), grads_at(head_entry()), act(plan_.final_norm_out, Shape{N, C}),
        act(plan_.targets, Shape{N}), weights_at(head_entry()), act(plan_.lm_lse, Shape{N}), dloss,
        scratch_.view(plan_.lm_chunk), ctx_, spec, vocab_shard());
    // Each shard's dx is its part of the sum over the vocabulary (sequence parallel: summed by
    // the reduce-scatter to the rank's rows, run_backward_from_final).
    if (config_.vocab_parallel() && !sequence_parallel()) tp_sum_(dfinal);
}

LmHeadVocabShard Model::vocab_shard() const {
    if (!config_.vocab_parallel()) return {};
    return LmHeadVocabShard{config_.vocab_begin, config_.vocab_total};
}

void Model::backward(float dloss) {
    LATHE_CHECK(backward_ready_, "backward() must follow a forward() of the same batch");
    LATHE_CHECK(training(), "backward: the model was created without gradients");
    backward_ready_ = false;
    // The gradient at the final norm's output goes to the first block scratch (B, T, C) buffer
    // that the final norm's backward reads before any block writes it.
    TensorView dfinal = block_scratch().dnorm1;
    const GradMode weight_mode = take_weight_grad_mode();
    head_backward(dfinal, dloss, weight_mode);
    run_backward_from_final(dfinal, weight_mode);
}

float Model::forward_backward(const ModelBatch& batch, float dloss) {
    forward_backward_async(batch, dloss, 0);
    float loss = 0.0f;
    read_losses(std::span<float>(&loss, 1));
    return loss;
}

void Model::read_losses(std::span<float> out) const {
    LATHE_CHECK(int64_t(out.size()) <= kLossSlots, "read_losses of {} slots, the model has {}",
                out.size(), kLossSlots);
    if (out.empty()) return;
    const TensorView slots = act(plan_.loss, Shape{int64_t(out.size())});
    copy_to_host(TensorView(out.data(), DType::kF32, slots.shape()), slots);
}

void Model::forward_backward_async(const ModelBatch& batch, float dloss, int64_t loss_slot) {
    LATHE_CHECK(loss_slot >= 0 && loss_slot < kLossSlots, "loss slot {} outside [0, {})", loss_slot,
                kLossSlots);
    LATHE_CHECK(training(), "forward_backward: the model was created without gradients");
    backward_ready_ = false;
    load_batch(batch, /*need_targets=*/true);
    run_forward_blocks(/*step=*/true);
    TensorView loss = acts_.view(plan_.loss).slice(loss_slot, loss_slot + 1);
    TensorView dfinal = block_scratch().dnorm1;
    const GradMode weight_mode = take_weight_grad_mode();
    if (config_.vocab_parallel()) {
        // The fused pass needs the whole row's statistics before its dlogits: the shard's
        // forward, the group's combination, then the backward computes the logits again.
        head_forward(loss, /*step=*/true);
        head_backward(dfinal, dloss, weight_mode);
        run_backward_from_final(dfinal, weight_mode);
        return;
    }
    const int64_t N = dims_.B * dims_.T, C = config_.hidden_size;
    LinearSpec spec = head_spec(/*step=*/true);
    spec.dweight_mode = weight_mode;
    lm_head_cross_entropy_forward_backward(
        loss, TensorView(), dfinal.reshape(Shape{N, C}), grads_at(head_entry()),
        act(plan_.final_norm_out, Shape{N, C}), act(plan_.targets, Shape{N}),
        weights_at(head_entry()), dloss, scratch_.view(plan_.lm_chunk), ctx_, spec);
    run_backward_from_final(dfinal, weight_mode);
}

void Model::logits(TensorView out, const ModelBatch& batch) {
    backward_ready_ = false;
    const Dims d = load_batch(batch, /*need_targets=*/false);
    run_forward_blocks(/*step=*/false);
    const int64_t N = d.B * d.T, C = config_.hidden_size, V = config_.vocab_size;
    LATHE_CHECK(!config_.vocab_parallel(),
                "logits: the model holds a shard of the vocabulary (tensor-parallel training), "
                "not the whole logits");
    LATHE_CHECK(out.device() == Device::kCpu && out.dtype() == DType::kF32 &&
                    out.shape() == Shape({d.B, d.T, V}),
                "logits: out must be ({}, {}, {}) f32 in host memory, got {}", d.B, d.T, V,
                out.to_string());
    const TensorView x = act(plan_.final_norm_out, Shape{N, C});
    if (!on_cuda()) {
        linear_forward(out.reshape(Shape{N, V}), x, weights_at(head_entry()), ConstTensorView(),
                       ctx_, head_spec(/*step=*/false));
        return;
    }
    // Chunk by chunk through the LM head's scratch: bf16 logits, then widened to f32 on the host.
    const TensorView chunk = scratch_.view(plan_.lm_chunk);
    const int64_t rows = plan_.shape.lm_head_chunk_rows;
    HostTensor host(DType::kBF16, Shape{rows, V});
    float* dst = out.as<float>();
    for (int64_t r0 = 0; r0 < N; r0 += rows) {
        const int64_t r = std::min(rows, N - r0);
        const TensorView y(chunk.data(), DType::kBF16, Shape{r, V}, Device::kCuda);
        linear_forward(y, x.slice(r0, r0 + r), weights_at(head_entry()), ConstTensorView(), ctx_,
                       head_spec(/*step=*/false));
        const TensorView h = host.view().slice(0, r);
        cuda_copy_sync(h, y, ctx_.stream);
        const bf16* src = h.as<bf16>();
        for (int64_t i = 0; i < r * V; ++i) dst[r0 * V + i] = bf16_to_float(src[i]);
    }
}

}  // namespace lathe
