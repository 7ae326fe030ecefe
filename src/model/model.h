#pragma once
// Model: one architecture from the registry, its parameters, gradients, saved activations and
// scratch (four arenas sized by the memory plan before the first step), and the forward/backward
// schedule over the ops. Nothing is allocated per step.
//
// Typical training step (gradient accumulation over micro-batches k = 1..K):
//   model.zero_grads();
//   for each micro-batch: loss_k = model.forward_backward(batch_k, dloss_k);   // grads +=
//   model.grad_norm(); optimizer.step(...)   // optim/adamw_optimizer.h owns the moments
// where dloss_k weighs the micro-batch's mean loss in the objective (1/K for a mean of means).
// A training loop that does not want to wait for the GPU per micro-batch uses
// forward_backward_async(batch_k, dloss_k, k) and reads the K losses once, with read_losses().
// Evaluation: model.forward(batch) gives the mean loss; model.logits(out, batch) the logits.
//
// The loss is mean cross-entropy over the targets that are not -100 (kIgnoreIndex), targets
// aligned with the tokens: targets[b, t] is what position t predicts (the caller shifts).
//
// Backends: every tensor the ops see comes from the arenas (ModelArena), whose memory lives where
// context().backend computes. On CUDA the model also keeps a bf16 compute copy of the parameters
// (what the forward and backward read; the optimizer rewrites it in AdamW's pass), bf16
// activations, and a pinned host buffer the batch is copied from asynchronously (BatchStaging).
// Files and host copies of the parameters are model_io's (model_io.h: load, save, the HF-name
// accessors) and ParamStaging's (param_staging.h), through the entry reads and writes below.
// Reading the loss or the gradient norm waits for the GPU; nothing else in a step does.
//
// Gradients: a model created for training (ModelShape::training) has a gradient arena with the
// parameter arena's layout element for element, so params_flat(), grads_flat() and AdamW moments
// of params_flat().numel() elements line up for adamw_update. backward()/forward_backward()
// accumulate (+=) into it; zero_grads() clears it (zero_grads_beside_forward clears all but the
// projections' and the LM head's matrices, which the next backward then writes: see there). A model
// created for evaluation or inference has none (and refuses backward). The optimizer (optim/) lives
// outside the model.
//
// Gradients-ready hook: set_grads_ready_hook(f) makes the backward call f(l) for l = L-1 .. 0, as
// soon as layer l's parameter gradients are final for the micro-batch (its block backward has
// been enqueued: on CUDA the values are final in stream order), then f(kOutsideLayers) once the
// parameters outside the blocks (embeddings, LM head, final norm) are. Where a data-parallel
// all-reduce or an offloaded optimizer starts its work on a layer. Unset, it costs nothing.
//
// FP8 linears (ModelShape::precision with fp8 roles, CUDA only; model/fp8_state.h): the model
// owns every FP8 linear's buffers (the plan's fp8 arena, memory_plan.h) and hands them to the
// block schedule. The weights' fp8 codes are cast from the bf16 compute copy once per optimizer
// step: at the first forward after fp8_weights_updated() (which the step calls after the
// optimizer rewrote the compute copy) or after a parameter write, layer by layer just before
// the layer's forward (after the weights-needed hook, so a gathered layer is cast once it has
// arrived), never per micro-batch. Delayed scaling keeps its Fp8ScalingState here: the casts
// use its scales (on the device) and max their amaxes into a device block, which
// fp8_end_step() reads back once per optimizer step (one wait, at the step's existing one).
// A forward outside the training steps (eval_forward, logits) changes nothing a training step
// computes: its casts put their amaxes in a block nobody reads (a validation pass leaves the
// scales' history as it was), and under delayed scaling the weight codes it casts are not kept
// for training (the next training forward casts them again, with the scales current then, and
// records their amax in its step's block).
//
// Weights-needed hook: set_weights_needed_hook(f) makes every forward (forward, the forward of
// forward_backward, logits) call f(kInputWeights) before the embeddings are read, f(l) before
// layer l's forward is enqueued (l = 0 .. L-1), and f(kOutputWeights) before the final norm and
// the LM head (the embedding, when tied, is an input weight). Where weights that another stream
// writes (a data-parallel gather of updated parameters) are waited for, piece by piece, so that
// the forward of the first layers overlaps the transfer of the last ones. Unset, it costs nothing.
//
// Gradient windows hook: set_grad_window_hook(f) makes the backward call f(piece) before it
// writes the gradients of a unit of the parameter arena (memory_plan.h's ShardLayout), pieces as
// the weights-needed hook names them: f(kOutputWeights) and f(kInputWeights) for the back and
// front units (the LM head, the final norm and the embeddings are written early and late in the
// backward, so these are asked for more than once), f(l) just before layer l's block backward.
// f returns where that unit's gradients go: an f32 window of at least the unit's arena length,
// holding each entry at its offset from the unit's start, or a null view for the gradient arena
// itself. Within one backward every call for a piece must return the same place. The backward
// accumulates (+=) there as it does in the arena. Where ZeRO-2 keeps the full gradient of a
// unit only while it is reduced (run/data_parallel.h), and where a data-parallel step prepares
// a unit's gradients before a micro-batch writes them. Unset, it costs nothing.
//
// Sharded parameters (ModelShape::param_shards = W > 1, ZeRO-3): the masters and the compute
// copy hold this rank's shard (memory_plan.h, MemoryPlan::param_storage): params_flat() and
// params_compute_flat() are the shard vectors (the rank's chunks in unit order, lining up with
// the gradient shard for AdamW), and the weights a forward or backward reads come from windows
// another component fills with the gathered units. Weight windows hook: set_weight_window_hook(f)
// makes the model call f(piece) (pieces as above) each time it takes views of a unit's weights:
// in every forward before the embeddings (kInputWeights), before layer l's forward (its fp8 cast
// included), before the final norm and the LM head (kOutputWeights, or kInputWeights for a tied
// head); in the backward before the LM head's and the final norm's backward, and before layer
// l's block backward (and its recompute), which may ask for l more than once. f returns where
// that unit's weights are: a window of the unit's arena length in the compute dtype (bf16 on
// CUDA, f32 on the CPU), each entry at its offset from the unit's start, or a null view for the
// model's own arena. The views are taken at once, so the window must hold the unit, in stream
// order, until the ops of the piece are enqueued and the next piece is asked for. A sharded model
// refuses to compute without it (checked). Writes of parameter entries (write_param_entry,
// init) write the rank's chunks of each entry; reads (read_param_entry) are refused: the
// gathered copy comes from the component that holds the communicator (run/data_parallel.h).

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/arena.h"
#include "core/status.h"
#include "core/tensor.h"
#include "model/batch_staging.h"
#include "model/block.h"
#include "model/memory_plan.h"
#include "model/model_config.h"
#include "model/param_table.h"
#include "ops/adamw.h"
#include "ops/context.h"
#include "ops/cuda/cuda_state.h"
#include "ops/cuda/memory.h"
#include "ops/lm_head_cross_entropy.h"

namespace lathe {

// One batch of token sequences, in host memory (the model copies it into its own arena).
// B <= plan batch and T <= plan seq_len; a smaller batch reuses the front of every buffer.
struct ModelBatch {
    ConstTensorView tokens;     // (B, T) i32, each in [0, V)
    ConstTensorView targets;    // (B, T) i32, in [0, V) or -100; may be null for logits()
    ConstTensorView docs;       // (B, T) i32 document ids for per-document attention, or null
    ConstTensorView positions;  // (B, T) i32 positions in [0, T) (RoPE, or GPT-2's wpe), or
                                // null for 0..T-1 in every row
};

// Memory for one arena, where a Context computes. Move-only owner.
class ModelArena {
public:
    ModelArena() = default;
    // Allocates (zeroed) memory for `layout` where `ctx` computes (host memory, or cudaMalloc on
    // ctx's device). Fails on allocation failure, or for CUDA in a build without it.
    static Result<ModelArena> allocate(ArenaLayout layout, const Context& ctx);
    // `layout`'s entries over memory another owner holds, placed with place(): how a window of
    // one unit shows that unit's entries. Owns nothing; zero() is not for it.
    static ModelArena borrowed(ArenaLayout layout, Device device);
    // The borrowed arena's entries at offsets from `origin_bytes` on lie at `base` + (offset -
    // origin_bytes); entries before the origin are not viewed (checked).
    void place(void* base, size_t origin_bytes);

    const ArenaLayout& layout() const { return layout_; }
    TensorView view(size_t index) const {
        return origin_ == 0 ? layout_.view(base_, index, device_) : placed_view(index);
    }
    // Entry `index` seen with a smaller shape of the same dtype (numel <= the entry's; checked):
    // how a batch smaller than planned uses the front of each buffer.
    TensorView view(size_t index, const Shape& shape) const;
    // The whole arena as one flat vector of `dtype` (padding included, zero): for adamw_update.
    TensorView flat(DType dtype = DType::kF32) const;
    TensorView flat_f32() const { return flat(DType::kF32); }
    // Zeroes every byte (on CUDA: enqueued on the allocating context's stream).
    void zero();
    // Zeroes the bytes of entry `index`.
    void zero_entry(size_t index);

private:
    TensorView placed_view(size_t index) const;

    ArenaLayout layout_;
    bool borrowed_ = false;
    size_t origin_ = 0;  // borrowed: the layout offset that `base_` stands for
    HostArena host_;
    std::shared_ptr<void> device_mem_;  // CUDA: the cudaMalloc block (freed by its deleter)
    CUstream_st* stream_ = nullptr;
    void* base_ = nullptr;
    Device device_ = Device::kCpu;
};

// What fp8 linear roles in `shape.precision` need of `config` and the batch, apart from the
// backend (Model::create refuses them off CUDA): the LM head native (its fused op has no fp8
// kernel), a gated MLP (the GELU MLP's fused ops have none), every FP8 linear's width and the
// batch's tokens (B T) multiples of 16 (cuBLASLt's FP8 GEMMs, per-tensor and blockwise). An
// error names the fp8.* key or the dimension; ok without fp8 roles.
Status model_check_fp8(const ModelConfig& config, const ModelShape& shape);

class Model {
public:
    // Plans and allocates a model of `config` (valid, from the registry) for batches up to
    // `shape` (with gradients when shape.training). Parameters start at zero: call init() or
    // model_load_hf(). Errors: from the plan (T too long, ...), allocation failure, a backend
    // without arenas.
    static Result<Model> create(ModelConfig config, const ModelShape& shape, const Context& ctx);

    Model(Model&&) noexcept = default;
    Model& operator=(Model&&) noexcept = default;

    const ModelConfig& config() const { return config_; }
    const ParamTable& params() const { return table_; }
    const MemoryPlan& plan() const { return plan_; }
    const Context& context() const { return ctx_; }
    // Created with gradients (ModelShape::training).
    bool training() const { return plan_.shape.training; }

    // ---- parameters ----

    // Initializes every parameter from `seed` (model/init.h).
    void init(uint64_t seed);
    // Parameter / gradient arena entry `arena_index` copied into `host` (host memory of the
    // entry's dtype and shape), and parameter entry `arena_index` set from `host` (on CUDA its
    // bf16 compute copy too). Synchronous; for files and checks (model_io.h, ParamStaging), never
    // in a step.
    // With sharded parameters (file comment) read_param_entry is refused (checked) and
    // write_param_entry writes this rank's chunks of the entry.
    void read_param_entry(size_t arena_index, TensorView host) const;
    void read_grad_entry(size_t arena_index, TensorView host) const;
    void write_param_entry(size_t arena_index, ConstTensorView host);

    // Masters in host memory (ModelShape::masters_on_host): `masters` (params_total() f32,
    // the parameter arena's layout, owned by the caller: optim/host_optimizer.h) becomes where
    // read_param_entry reads and write_param_entry writes the f32 values of an entry;
    // write_param_entry then also writes the weights the model computes with (the bf16 copy,
    // rounded to nearest even, on CUDA; the f32 weights on the CPU). The span must outlive the
    // model's use of it; an empty span detaches. Checked: masters_on_host, the length.
    void attach_host_masters(std::span<float> masters);
    std::span<float> host_masters() const { return host_masters_; }
    // How many write_param_entry calls the model has had: an optimizer holding its own copy of
    // some masters (optim/host_optimizer.h with offload_fraction < 1) sees the entries change.
    uint64_t param_writes() const { return param_writes_; }
    // Called before read_param_entry or write_param_entry touches the host masters: an optimizer
    // whose copy of some masters runs ahead of them (optim/host_optimizer.h, offload_fraction
    // < 1 on CUDA) brings them up to date first. Empty: none.
    using HostMastersHook = std::function<void()>;
    void set_host_masters_hook(HostMastersHook hook) { host_masters_hook_ = std::move(hook); }

    // The parameters are sharded over ModelShape::param_shards > 1 ranks (file comment).
    bool params_sharded() const { return plan_.shape.param_shards > 1; }
    // The length of the flat parameter vector the optimizer's ranges index: the arena's (padding
    // included), also when this rank holds only its shard of it.
    int64_t params_total() const { return int64_t(plan_.params.total_bytes() / sizeof(float)); }

    // Arena views of parameter / gradient entry `index` of params().entries() (arena layout);
    // param_entry is refused with sharded parameters (checked).
    TensorView param_entry(size_t index) const;
    TensorView grad_entry(size_t index) const { return grads_.view(index); }
    // Every parameter / gradient as one flat f32 vector (for the optimizer and the grad norm);
    // with sharded parameters params_flat() is the rank's shard (params_total() / W elements).
    // grads_flat() is empty for a model without gradients.
    TensorView params_flat() const {
        return params_sharded() ? params_.view(plan_.param_shard) : params_.flat_f32();
    }
    TensorView grads_flat() const { return grads_.flat_f32(); }
    // Entry `index` of the gradient arena's layout (plan().gradients): with sharded gradients
    // (ModelShape::gradient_shards > 1) the shard (plan().grad_shard) and the windows.
    TensorView gradient_arena_entry(size_t index) const { return grads_.view(index); }
    // CUDA: the bf16 compute copy as one flat vector, element for element params_flat()'s twin
    // (the optimizer rewrites it with the masters). Null on the CPU.
    // With sharded parameters the compute copy's shard.
    TensorView params_compute_flat() const {
        if (!on_cuda()) return TensorView();
        return params_sharded() ? params_compute_.view(plan_.compute_shard)
                                : params_compute_.flat(DType::kBF16);
    }
    // Entry `index` of the arena the model computes with (plan().compute_storage on CUDA,
    // plan().param_storage on the CPU): with sharded parameters the weight windows
    // (plan().weight_front_window, ...).
    TensorView weight_arena_entry(size_t index) const {
        return (on_cuda() ? params_compute_ : params_).view(index);
    }
    // AdamW segments over params_flat(): one per entry, weight decay `weight_decay` on matrices
    // and embeddings, 0 on norms and biases, learning rate `lr`.
    std::vector<AdamWSegment> adamw_segments(double lr, double weight_decay) const;
    void zero_grads();
    // zero_grads() off the compute stream's path, for a training step's first micro-batch: on
    // CUDA the gradient arena is cleared on the optimizer stream (after everything the compute
    // stream enqueued so far), and the next forward waits for it before the final norm and the
    // LM head, whose fused backward writes the step's first gradients; the forward's blocks run
    // beside the clearing. Also waited for by grad_norm(), zero_grads() and zero_grad_entry().
    // The clearing skips the matrices whose gradient one GEMM a micro-batch writes (each layer's
    // q/k/v, output, up and down projections, and the LM head's weight: most of the arena): the
    // next backward() or forward_backward*() writes them (=) instead of adding, which reads and
    // writes those bytes once less (GEMMs with beta 0, no clearing). Until that backward they
    // hold the last step's values; grad_norm(), grad_sum_of_squares() and zero_grad_entry()
    // clear them first when asked before it. The CPU, and gradients in windows or shards, clear
    // in place as zero_grads() does.
    void zero_grads_beside_forward();
    // zero_grads_beside_forward's clearing enqueued on `stream` by a caller that has ordered it
    // after every read of the gradients itself (the overlapped optimizer, after its update):
    // every byte but the matrices the next backward writes (=), which waits for it as for
    // zero_grads_beside_forward's. False, with nothing done, where the model clears in place
    // (the CPU, gradients in windows or shards): the caller clears them.
    bool clear_grads_for_next_backward(CUstream_st* stream);
    // Zeroes the gradient of entry `index` (a frozen parameter group).
    void zero_grad_entry(size_t index);

    // The L2 norm of every gradient (fp64 sums), computed where the model is and read back.
    float grad_norm();
    // The sum of squares of the gradients in `ranges` of grads_flat(), read back: one rank's part
    // of a sharded norm. CPU: fp64 sums, range by range. CUDA: the square of grad_norm_l2's f32
    // norm of the ranges (fp64 sums on the GPU; the root's rounding makes it 2^-23 relative).
    double grad_sum_of_squares(std::span<const FlatRange> ranges);
    // Writes `norm` where grad_norm_value() is (synchronous): the norm of every rank's ranges.
    void set_grad_norm_value(float norm);
    // The (1) f32 where the last grad_norm() left the norm, where the model computes: what the
    // optimizer clips by without reading it back.
    ConstTensorView grad_norm_value() const { return scratch_.view(plan_.grad_norm); }

    // The gradients-ready hook (file comment); an empty function unsets it.
    static constexpr int kOutsideLayers = -1;
    using GradsReadyHook = std::function<void(int layer)>;
    void set_grads_ready_hook(GradsReadyHook hook) { grads_ready_ = std::move(hook); }
    // The weights-needed hook (file comment); an empty function unsets it.
    static constexpr int kInputWeights = -1, kOutputWeights = -2;
    using WeightsNeededHook = std::function<void(int piece)>;
    void set_weights_needed_hook(WeightsNeededHook hook) { weights_needed_ = std::move(hook); }
    bool has_weights_needed_hook() const { return bool(weights_needed_); }
    // The gradient windows hook (file comment); an empty function unsets it.
    using GradWindowHook = std::function<TensorView(int piece)>;
    void set_grad_window_hook(GradWindowHook hook);
    // The weight windows hook (file comment); an empty function unsets it.
    using WeightWindowHook = std::function<TensorView(int piece)>;
    void set_weight_window_hook(WeightWindowHook hook);

    // Tensor parallel (infer/tensor_parallel.h; model/block.h's header): the model is one rank's
    // shard, and `sum` sums a (B, T, C) partial tensor over the tensor-parallel group in place,
    // in stream order: without sequence parallel (below) every forward and backward calls it
    // twice per layer (the row-parallel outputs, the gradients at the norm outputs). An empty
    // function: one rank.
    // A model of a vocabulary shard (ModelConfig::vocab_parallel) also sums the embedding's rows
    // and the LM head's dx, and combines the head's row statistics with `max` (the same in-place
    // form, an elementwise max of an f32 view) and `sum` (ops/vocab_parallel.h); it refuses to
    // compute without both.
    using TensorParallelSum = std::function<void(TensorView)>;
    void set_tensor_parallel_sum(TensorParallelSum sum) { tp_sum_ = std::move(sum); }
    void set_tensor_parallel_max(TensorParallelSum max) { tp_max_ = std::move(max); }
    // Sequence parallel (ModelShape::sequence_shards = S > 1; model/block.h's header): the
    // residual stream holds this rank's rows, moved by `rows` (block.h: TensorParallelRows; in
    // chunks with overlap). Besides the blocks' (two gathers and two scatters per layer, forward
    // and backward), the embedding's vocabulary-parallel lookup is reduce-scattered to the rows
    // and its backward gathers the residual gradient; the final norm runs on the rows and its
    // output is gathered to full rows for the vocabulary-parallel LM head, whose dx is
    // reduce-scattered (instead of summed). A sequence-parallel model refuses to compute without
    // the moves (and the sum and max above); a batch's B T must divide into S x chunks rows.
    void set_tensor_parallel_rows(TensorParallelRows rows) { tp_rows_ = std::move(rows); }
    bool sequence_parallel() const { return plan_.shape.sequence_shards > 1; }
    // Sequence parallel: the gradients of the norms' weights and biases
    // (sequence_parallel_partial_role) hold this rank's rows' part of the sum. The ranges of
    // grads_flat() they occupy (the parameter arena's, params_flat() coordinates), and the sum:
    // `pieces` (f32 views of gradient memory, together at most those ranges' elements: the
    // ranges themselves, or the parts of them a ZeRO-2 shard holds) packed into one buffer,
    // summed over the group with the tensor-parallel sum (one collective), and written back, in
    // stream order. Once per optimizer step, after the last micro-batch's backward and before
    // the gradients are read (their norm, the optimizer); every rank of the group calls it with
    // pieces of the same sizes. A model without sequence parallel: no ranges, and the sum is
    // refused (checked).
    std::vector<FlatRange> sequence_parallel_partial_ranges() const;
    void sum_sequence_parallel_grads(std::span<const TensorView> pieces);

    // Waits for everything the model enqueued (CUDA); no-op on the CPU.
    void synchronize() const;

    // ---- FP8 (file comment) ----

    // Some linear role runs in fp8.
    bool fp8() const { return fp8_gemms_ != nullptr; }
    // The optimizer rewrote the compute copy: the next forward casts the fp8 weight codes again.
    void fp8_weights_updated() { fp8_weights_stale_ = true; }
    // FP8 GEMMs enqueued since the last call (Fp8LinearBuffers::gemm_count), and the count
    // starts again at 0.
    int64_t fp8_take_gemms() { return fp8_gemms_ ? fp8_gemms_->take() : 0; }
    // Weight casts (linear_fp8_cast_weight calls) since the model was created.
    int64_t fp8_weight_casts() const { return fp8_weight_casts_; }
    // Delayed scaling's state, or null (no fp8, or another recipe).
    Fp8ScalingState* fp8_scaling() { return fp8_state_ ? &*fp8_state_ : nullptr; }
    const Fp8ScalingState* fp8_scaling() const { return fp8_state_ ? &*fp8_state_ : nullptr; }
    // Delayed scaling: copies the scales of fp8_scaling() to the device (after a load).
    void fp8_upload_scales();
    // Delayed scaling, at the end of an optimizer step's micro-batches: reads the step's amaxes
    // back (waits for the GPU), records them in the state, updates its scales for the next step,
    // uploads them and zeroes the device amaxes. No-op without delayed scaling.
    void fp8_end_step();

    // ---- steps ----

    // Runs the forward pass and returns the mean loss; saves what backward() needs.
    // `batch.targets` must be given. Checks (LATHE_CHECK) the ids as the ops would.
    float forward(const ModelBatch& batch);
    // forward() of a batch no training step learns from (a validation loss): the same loss,
    // and no fp8 amax recorded (file comment, "FP8 linears"). A backward() may not follow.
    float eval_forward(const ModelBatch& batch);
    // Backward of `dloss * loss` for the last forward(): gradients += . Must follow forward().
    void backward(float dloss = 1.0f);
    // forward() then backward(dloss) with the LM head run once (its fused forward-backward).
    float forward_backward(const ModelBatch& batch, float dloss = 1.0f);
    // forward_backward without waiting for the GPU: the mean loss stays in device memory, in
    // slot `loss_slot` (0 <= loss_slot < kLossSlots) until read_losses() reads it or a later
    // step writes the slot again. `batch`'s host memory may be reused once this returns (it was
    // staged into the model's pinned buffer, whose two halves alternate between micro-batches:
    // a half is rewritten only after the copy that read it last has finished). On the CPU it
    // computes before returning, as forward_backward does, with the same bits.
    void forward_backward_async(const ModelBatch& batch, float dloss, int64_t loss_slot);
    // The losses in slots [0, out.size()) (out.size() <= kLossSlots), waiting for the GPU.
    void read_losses(std::span<float> out) const;
    // The logits (B, T, V) of `batch` into `out` (f32, host memory, on every backend; CUDA
    // computes them in bf16, LM-head chunk by chunk). Targets are not needed. Leaves the
    // activations of this forward (a following backward() is refused).
    void logits(TensorView out, const ModelBatch& batch);

private:
    Model() = default;

    struct Dims {
        int64_t B = 0, T = 0;
    };
    Dims load_batch(const ModelBatch& batch, bool need_targets);
    // `step`: the forward of a training step (forward, forward_backward); false: eval_forward
    // and logits (file comment, "FP8 linears").
    void run_forward_blocks(bool step);
    // The mean loss of `batch`'s forward (forward, eval_forward); backward() refused after it.
    float forward_loss(const ModelBatch& batch, bool step);
    // `weight_mode`: how the projections write their weight gradients (BlockGrads::weight_mode).
    void run_backward_from_final(TensorView dfinal, GradMode weight_mode);
    // kOverwrite once after zero_grads_beside_forward left the GEMM-written matrices uncleared
    // (the backward that takes it writes them), else kAccumulate.
    GradMode take_weight_grad_mode();
    // Clears the matrices zero_grads_beside_forward left for the backward to write, when a
    // reader comes first (grad_norm and the like).
    void clear_deferred_grads();
    // zero_grads_beside_forward's byte ranges of the gradient arena: what it clears (cleared)
    // and what the next backward writes (deferred), made at its first call.
    void make_grad_clear_ranges();
    // The gradients can be cleared off the compute stream and partly left for the backward to
    // write: CUDA, one arena, no windows. Else they are cleared in place (zero_grads).
    bool grads_clear_beside() const;
    // The LM head with cross-entropy into `loss` (1) and the saved lse, and its backward into
    // dfinal (B, T, C) and the head's gradient; a vocabulary shard's combined over the group.
    void head_forward(TensorView loss, bool step);
    void head_backward(TensorView dfinal, float dloss, GradMode weight_mode);
    LmHeadVocabShard vocab_shard() const;
    template <typename Views>
    void fill_block_views(Views& views, const ModelArena& arena, int layer) const;
    BlockWeights block_weights(int layer) const;
    BlockGrads block_grads(int layer) const;
    BlockActs block_acts(int layer) const;
    BlockScratch block_scratch() const;
    BlockInputs block_inputs() const;
    // Layer `layer`'s fp8 buffers; !step: those whose delayed amaxes go to the unread block.
    BlockFp8 block_fp8(int layer, bool step = true) const;
    // The LM head's spec: with fp8.lm_head its buffers (!step: the twin whose delayed amaxes go
    // to the unread block).
    LinearSpec head_spec(bool step) const;
    // The FP8 head's x amax slot, written by the final RMSNorm as it writes the head's input
    // (LinearSpec::x_amax; current scaling only), or a null view.
    TensorView head_x_amax() const;
    // Casts layer `layer`'s fp8 weight codes from the compute copy (file comment).
    void fp8_cast_weights(int layer, bool step);
    TensorView act(size_t index, const Shape& shape) const { return acts_.view(index, shape); }
    // A residual-stream tensor of the batch in the activations: (B, T, C), or this rank's rows
    // under sequence parallel (block_rows_shape), and its per-row statistics (B T or N/S).
    Shape rows_shape() const {
        return block_rows_shape(dims_.B, dims_.T, config_.hidden_size, plan_.shape.sequence_shards);
    }
    int64_t rows() const { return dims_.B * dims_.T / plan_.shape.sequence_shards; }
    size_t head_entry() const;
    // Where the backward writes the gradients of `piece`'s unit: the gradient windows hook's
    // window, or the gradient arena. grads_of / grads_at: of the entry of `role` outside the
    // layers / of parameter arena entry `arena_index`.
    const ModelArena& grads_for(int piece) const;
    const ModelArena& grads_of(ParamRole role) const;
    TensorView grads_at(size_t arena_index) const;
    // The hook piece of the unit holding parameter arena entry `arena_index`.
    int piece_of_entry(size_t arena_index) const;
    // The arena the ops read weights from: the bf16 compute copy on CUDA, the masters on the CPU.
    const ModelArena& weights() const { return on_cuda() ? params_compute_ : params_; }
    // Where the ops read the weights of `piece`'s unit: the weight windows hook's window, or
    // weights(). weights_of / weights_at: of the entry of `role` outside the layers / of
    // parameter arena entry `arena_index`.
    const ModelArena& weights_for(int piece) const;
    const ModelArena& weights_of(ParamRole role) const;
    TensorView weights_at(size_t arena_index) const;
    bool on_cuda() const { return ctx_.backend == Backend::kCuda; }
    // Host -> model memory, synchronous (one-time uploads such as the RoPE tables).
    void copy_from_host(TensorView dst, ConstTensorView src);
    // Model memory -> host, synchronous.
    void copy_to_host(TensorView host, ConstTensorView src) const;
    float read_scalar(ConstTensorView v) const;
    // The compute stream waits for zero_grads_beside_forward's clearing, if one is pending.
    void wait_grads_zeroing();
    TensorView entry_rows(const ModelArena& arena, ParamRole role, int layer, int64_t begin,
                          int64_t end) const;

    ModelConfig config_;
    ParamTable table_;
    MemoryPlan plan_;
    Context ctx_;
    ModelArena params_, grads_, acts_, scratch_;
    ModelArena params_compute_;   // CUDA: bf16 copy of params_
    BatchStaging batch_staging_;  // the batch's way into the activations (pinned on CUDA)
    // CUDA: the loan of the scratch bytes dead during attention to cuDNN's workspace
    // (memory_plan.h); its deleter ends the loan. Declared after the arenas: destroyed first.
    std::shared_ptr<void> attention_loan_;
    GradsReadyHook grads_ready_;
    WeightsNeededHook weights_needed_;
    TensorParallelSum tp_sum_, tp_max_;
    TensorParallelRows tp_rows_;
    Dims dims_;  // of the batch in the activations
    bool has_docs_ = false, has_positions_ = false;
    bool backward_ready_ = false;  // a forward() with targets saved activations for backward()
    // zero_grads_beside_forward: the optimizer stream's clearing (the event made at the first
    // one), and whether the compute stream has yet to wait for it.
    std::unique_ptr<CudaEvent> grads_zeroing_;
    bool grads_zeroing_pending_ = false;
    // The projection matrices' and the LM head's gradient bytes were left for the next backward
    // to write (=): zero_grads_beside_forward; take_weight_grad_mode() hands that on once.
    bool grads_deferred_ = false;
    std::vector<ByteRange> grads_cleared_ranges_, grads_deferred_ranges_;
    // FP8 (file comment): the arena of the plan's fp8 entries, each layer's buffers (empty
    // without fp8; pointers into fp8_), the GEMM counter they count into (on the heap: the
    // buffers point to it across moves), the weight-cast state and the delayed state.
    ModelArena fp8_arena_;
    std::vector<std::array<Fp8LinearBuffers, kFp8LinearsPerLayer>> fp8_buffers_;
    std::vector<std::array<Fp8BlockwiseBuffers, kFp8LinearsPerLayer>> fp8_block_buffers_;
    std::unique_ptr<Fp8GemmCounter> fp8_gemms_;
    bool fp8_weights_stale_ = true;
    // Delayed: a forward outside the steps cast the codes; the next training forward casts again.
    bool fp8_step_cast_due_ = false;
    // Delayed: fp8_buffers_'s twins with step_amax in plan_.fp8_eval_amax (file comment).
    std::vector<std::array<Fp8LinearBuffers, kFp8LinearsPerLayer>> fp8_eval_buffers_;
    int64_t fp8_weight_casts_ = 0;
    // The LM head's buffers with fp8.lm_head (scalars null without), and the eval twin.
    Fp8LinearBuffers fp8_head_, fp8_head_eval_;
    std::optional<Fp8ScalingState> fp8_state_;
    std::vector<float> fp8_host_;  // delayed: the amaxes read back, the scales uploaded

    std::span<float> host_masters_;  // attach_host_masters
    HostMastersHook host_masters_hook_;
    uint64_t param_writes_ = 0;  // write_param_entry calls
    GradWindowHook grad_window_;
    mutable ModelArena grad_window_arena_;  // borrowed over the hook's window (grads_for)
    WeightWindowHook weight_window_;
    mutable ModelArena weight_window_arena_;  // borrowed over the hook's window (weights_for)
};

}  // namespace lathe
