#pragma once
// Model: one architecture from the registry, its parameters, gradients, saved activations and
// scratch (four arenas sized by the memory plan before the first step), and the forward/backward
// schedule over the ops. Nothing is allocated per step.
//
// Typical training step (gradient accumulation over micro-batches k = 1..K):
//   model.zero_grads();
//   for each micro-batch: loss_k = model.forward_backward(batch_k, dloss_k);   // grads +=
//   adamw_update(model.params_flat(), m, v, model.grads_flat(), model.adamw_segments(lr, wd), ..)
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
// (what the forward and backward read; optimizer_step() rewrites it in AdamW's pass), bf16
// activations, and a pinned host buffer the batch is copied from asynchronously. init(), load_hf,
// save_hf and the *_hf accessors work on host memory: on CUDA through a host staging copy of the
// parameters, uploaded (and cast to bf16) when they change. Reading the loss or the gradient norm
// waits for the GPU; nothing else in a step does.
//
// Gradients: the gradient arena has the parameter arena's layout element for element, so
// params_flat(), grads_flat() and AdamW moments allocated with plan().params line up for
// adamw_update. backward()/forward_backward() accumulate (+=) into it; zero_grads() clears it.

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/arena.h"
#include "core/status.h"
#include "core/tensor.h"
#include "model/block.h"
#include "model/memory_plan.h"
#include "model/model_config.h"
#include "model/param_table.h"
#include "ops/adamw.h"
#include "ops/context.h"

struct CUevent_st;

namespace lathe {

class SafetensorsCheckpoint;

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

    const ArenaLayout& layout() const { return layout_; }
    TensorView view(size_t index) const { return layout_.view(base_, index, device_); }
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
    ArenaLayout layout_;
    HostArena host_;
    std::shared_ptr<void> device_mem_;  // CUDA: the cudaMalloc block (freed by its deleter)
    CUstream_st* stream_ = nullptr;
    void* base_ = nullptr;
    Device device_ = Device::kCpu;
};

class Model {
public:
    // Plans and allocates a model of `config` (valid, from the registry) for batches up to
    // `shape`. Parameters start at zero: call init() or load_hf(). Errors: from the plan (T too
    // long, ...), allocation failure, a backend without arenas.
    static Result<Model> create(ModelConfig config, const ModelShape& shape, const Context& ctx);

    Model(Model&&) noexcept = default;
    Model& operator=(Model&&) noexcept = default;

    const ModelConfig& config() const { return config_; }
    const ParamTable& params() const { return table_; }
    const MemoryPlan& plan() const { return plan_; }
    const Context& context() const { return ctx_; }

    // ---- parameters ----

    // Initializes every parameter from `seed` (model/init.h).
    void init(uint64_t seed);
    // Loads every parameter from a Hugging Face checkpoint (f32, bf16 or f16 tensors, converted to
    // f32). Names may lack the family's base-model prefix (checkpoints of the bare base model).
    // A tied model ignores a stored head. Errors name the checkpoint and tensor: a missing
    // parameter, a wrong shape, an unsupported dtype. Tensors the model does not use are listed
    // in a warning, except known buffers (ModelFamily::ignored_suffixes).
    Status load_hf(const SafetensorsCheckpoint& checkpoint);
    // Writes `dir`/model.safetensors with the HF names, stored shapes and layouts (f32), and
    // `dir`/config.json (the config's JSON with torch_dtype float32). `dir` must exist.
    Status save_hf(const std::string& dir) const;

    // The parameter / gradient called `name` (an HF name) in its stored HF layout, copied into
    // `out` (host, f32, the HF shape). An unknown name is a bug (checked); see params().find_hf.
    void read_param_hf(std::string_view name, TensorView out) const;
    void read_grad_hf(std::string_view name, TensorView out) const;
    // Sets the parameter `name` from `hf` (host, f32, the HF shape).
    void write_param_hf(std::string_view name, ConstTensorView hf);

    // Arena views of parameter / gradient entry `index` of params().entries() (arena layout).
    TensorView param_entry(size_t index) const { return params_.view(index); }
    TensorView grad_entry(size_t index) const { return grads_.view(index); }
    // Every parameter / gradient as one flat f32 vector (for the optimizer and the grad norm).
    TensorView params_flat() const { return params_.flat_f32(); }
    TensorView grads_flat() const { return grads_.flat_f32(); }
    // AdamW segments over params_flat(): one per entry, weight decay `weight_decay` on matrices
    // and embeddings, 0 on norms and biases, learning rate `lr`.
    std::vector<AdamWSegment> adamw_segments(double lr, double weight_decay) const;
    void zero_grads();
    // Zeroes the gradient of entry `index` (a frozen parameter group).
    void zero_grad_entry(size_t index);

    // ---- optimizer (AdamW moments live beside the parameters, on the same device) ----

    // Allocates the two moments (zeroed); a model used only for evaluation never does.
    Status enable_optimizer();
    bool has_optimizer() const { return exp_avg_.layout().size() > 0; }
    // The L2 norm of every gradient (fp64 sums), computed where the model is and read back.
    float grad_norm();
    // One AdamW update of the given segments (enable_optimizer() first); on CUDA the bf16 compute
    // copy is rewritten in the same pass. max_grad_norm > 0 clips by the norm of the last
    // grad_norm() inside the update (the gradients in memory stay as they are): the same update
    // as grad_clip_by_norm (ops/grad_norm.h) followed by an unclipped one, one pass fewer.
    void optimizer_step(std::span<const AdamWSegment> segments, const AdamWHyper& hyper,
                        int64_t step, float max_grad_norm = 0.0f);
    // The moments as flat f32 vectors of params_flat().numel() elements, host side (checkpoints).
    void read_optimizer_state(std::span<float> exp_avg, std::span<float> exp_avg_sq) const;
    void write_optimizer_state(std::span<const float> exp_avg, std::span<const float> exp_avg_sq);

    // Waits for everything the model enqueued (CUDA); no-op on the CPU.
    void synchronize() const;

    // ---- steps ----

    // Runs the forward pass and returns the mean loss; saves what backward() needs.
    // `batch.targets` must be given. Checks (LATHE_CHECK) the ids as the ops would.
    float forward(const ModelBatch& batch);
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
    void run_forward_blocks();
    void run_backward_from_final(TensorView dfinal);
    template <typename Views>
    void fill_block_views(Views& views, const ModelArena& arena, int layer) const;
    BlockWeights block_weights(int layer) const;
    BlockGrads block_grads(int layer) const;
    BlockActs block_acts(int layer) const;
    BlockScratch block_scratch() const;
    BlockInputs block_inputs() const;
    TensorView act(size_t index, const Shape& shape) const { return acts_.view(index, shape); }
    size_t head_entry() const;
    // The arena the ops read weights from: the bf16 compute copy on CUDA, the masters on the CPU.
    const ModelArena& weights() const { return on_cuda() ? params_compute_ : params_; }
    bool on_cuda() const { return ctx_.backend == Backend::kCuda; }
    // Host views of the parameters for init/load/save: the arena itself on the CPU, the staging
    // copy on CUDA (download_params() fills it; upload_params() sends it back and refreshes the
    // bf16 copy).
    TensorView host_param(size_t arena_index) const;
    void download_params(size_t arena_index = size_t(-1)) const;
    void upload_params(size_t arena_index = size_t(-1));
    void copy_in(TensorView dst, ConstTensorView src, size_t pinned_offset);
    size_t begin_staging();
    void end_staging();
    float read_scalar(ConstTensorView v) const;
    TensorView entry_rows(const ModelArena& arena, ParamRole role, int layer, int64_t begin,
                          int64_t end) const;

    ModelConfig config_;
    ParamTable table_;
    MemoryPlan plan_;
    Context ctx_;
    ModelArena params_, grads_, acts_, scratch_;
    ModelArena params_compute_;           // CUDA: bf16 copy of params_
    ModelArena exp_avg_, exp_avg_sq_;     // AdamW moments (enable_optimizer)
    std::unique_ptr<HostArena> staging_;  // CUDA: host copy of params_ for init/load/save
    std::shared_ptr<void> pinned_;        // CUDA: pinned host buffer for the batch, two halves
    size_t pinned_bytes_ = 0;
    int pinned_half_ = 0;                                // the half the last load_batch staged into
    std::array<std::shared_ptr<CUevent_st>, 2> staged_;  // CUDA: recorded after each half's copies
    // CUDA: the loan of the scratch bytes dead during attention to cuDNN's workspace
    // (memory_plan.h); its deleter ends the loan. Declared after the arenas: destroyed first.
    std::shared_ptr<void> attention_loan_;
    Dims dims_;  // of the batch in the activations
    bool has_docs_ = false, has_positions_ = false;
    bool backward_ready_ = false;  // a forward() with targets saved activations for backward()
};

}  // namespace lathe
