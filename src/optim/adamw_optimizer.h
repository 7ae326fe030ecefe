#pragma once
// AdamWOptimizer: AdamW's two moments and its update step over a flat f32 parameter vector (the
// math is ops/adamw.h's, exactly torch.optim.AdamW's).
//
// What it updates: a flat vector of P f32 elements, its gradients (same layout) and optionally a
// bf16 twin (OptimizerTarget; for a model, optimizer_target(model): the parameter arena seen as
// one vector, padding included, so P = Model::params_flat().numel()).
//
// What it owns: the moments exp_avg and exp_avg_sq of a list of ranges of that vector (sorted,
// disjoint), each moment the ranges' elements concatenated in list order (numel() f32), zeroed
// at creation, where its Context computes. One optimizer over everything has the one range
// {0, P}; a shard owns any sub-range (flat_shard) or any list of them (ZeRO over units: rank r's
// chunk of every unit, ShardLayout::chunks). step() takes the segments of the whole vector
// (Model::adamw_segments: one per parameter entry with its lr and weight decay) and updates the
// parts of them inside its ranges; the rest belongs to other shards. The update is elementwise,
// so optimizers over a partition of [0, P) leave the same bits as one optimizer over all of it.
//
// Where it lives: its Context, given at create(). The update runs where the moments are, and
// reads and writes the target in that memory, so the target must live there too (checked at
// step()); an optimizer on the CPU over a model on CUDA is created with a CPU Context over a
// CUDA target and is refused (kUnimplemented) by create_for(), since the copies of gradients and
// weights between the two are not part of this class (optim/host_optimizer.h offloads).
//
// Cost of step(): one adamw_update_with_copy per range. On CUDA that is one kernel, which
// rewrites the bf16 compute copy in the same pass and clips by the norm in device memory: no
// synchronization, no device allocation, no copy. The segments of the range are built in a host
// vector kept between steps.
//
// Schedules (optimizer.schedule, OptimizerSchedule): serial, the update above inside step(), in
// stream order between the backward and the next forward; or overlapped (overlap_with(model)),
// which takes the update off the compute stream's path and gives the same bits (with
// optimizer.overlap_sms 0, overlap_with):
//   * step() (after the backward and the global gradient norm, which clipping needs before any
//     update) splits the segments over the units of the parameter arena (ShardLayout: the
//     embeddings, each layer, the final norm and LM head) and updates them unit by unit in
//     forward order, each with one adamw_update_with_copy over the unit's segments (one kernel
//     per unit on CUDA: the same kernel and per-element math as the serial launch). On CUDA the
//     units run on the state's optimizer stream (lowest priority, ops/cuda/cuda_state.h), which
//     first waits for everything the compute stream enqueued (the backward, the norm, earlier
//     reads of the weights); each unit records an event. On the CPU step() only posts the units,
//     and each runs when first needed (below): the same schedule, run synchronously.
//   * After the update the gradients are cleared for the next step without a zero_grads() that
//     would have to wait for every unit (TrainStep skips it after such a step). CUDA: on the
//     optimizer stream once every unit is updated, then one more event, by
//     Model::clear_grads_for_next_backward (every byte but the projections' and the LM head's
//     matrices, which the next backward writes instead of adding to) or, where the model clears
//     in place, unit by unit; CPU: each unit's zeroed with the unit. The gradients read zero from
//     then on (Model::grad_norm and the like clear the deferred matrices first).
//   * The model's weights-needed hook, before each unit's weights are read by any forward (a
//     training step's, its recompute in the backward coming after it in stream order, an
//     evaluation's), makes the compute stream wait for that unit's event (cudaStreamWaitEvent,
//     no host wait) or, on the CPU, runs the unit: the next forward's first layers overlap the
//     update of its last ones. The bf16 compute copy (written by the same kernel) and the fp8
//     weight casts (after the hook, model.h) are covered by the same event. The back unit's
//     piece (before the final norm and the LM head, whose fused backward writes the first
//     gradients) also waits for the zeroing.
//   * finish() orders the compute stream after every pending unit (CPU: runs them). A caller
//     that reads or writes the weights, the moments or the gradients other than through a
//     forward (a checkpoint's model.safetensors, an entry write) calls it first;
//     read_state()/write_state() and the destructor call it.
// One process, one range {0, total} over the model's own (unsharded) parameters and gradients;
// data and tensor parallelism and offload keep the serial schedule (overlap_with refuses).
//
// State as host f32 (checkpoints, optim/optimizer_state.h): read_state()/write_state() copy the
// moments out and in, synchronously.
//
// Ownership: move-only; the moments are freed with it. Overlapped, it sets the model's
// weights-needed hook and the destructor unsets it: the model must outlive it and not move.

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "model/host_memory_plan.h"
#include "model/model.h"
#include "ops/adamw.h"
#include "ops/context.h"

namespace lathe {

// FlatRange (elements [begin, end) of a flat vector) is model/memory_plan.h's.

// optimizer.schedule (file comment): the update between the steps, or unit by unit beside the
// next forward.
enum class OptimizerSchedule { kSerial, kOverlapped };
const char* optimizer_schedule_name(OptimizerSchedule s);  // "serial" | "overlapped"

// `segments` split over `units` (consecutive ranges in ascending order): out[u] (resized to the
// units) holds the segments inside unit u, in their order and as given. A segment's place in the
// units' coordinates is its offset plus `offset` (segments of a part of the vector that starts at
// `offset`, such as the offloaded part's). A segment across a unit boundary or outside every unit
// is a broken invariant (checked): units are runs of whole entries.
void adamw_segments_by_unit(std::span<const FlatRange> units,
                            std::span<const AdamWSegment> segments,
                            std::vector<std::vector<AdamWSegment>>& out, int64_t offset = 0);

// Shard `rank` of `world` contiguous shards of [0, total): the first total % world shards have
// one element more than the others. 0 <= rank < world (checked).
FlatRange flat_shard(int64_t total, int rank, int world);

// The views one optimizer step reads and writes, every one of the full vector's P elements.
struct OptimizerTarget {
    TensorView params;       // (P) f32 master weights, updated in place
    TensorView params_bf16;  // (P) bf16 copy rewritten with them, or null (none kept)
    ConstTensorView grads;   // (P) f32 gradients, or see grads_of_ranges
    // grads holds the gradients of the optimizer's ranges alone, concatenated in list order
    // (numel() elements, the moments' layout): sharded gradients (ZeRO-2), where a rank keeps
    // no gradient outside its chunks.
    bool grads_of_ranges = false;
    // params (and params_bf16) hold the optimizer's ranges alone, concatenated in list order:
    // sharded parameters (ZeRO-3, Model::params_flat() the rank's shard).
    bool params_of_ranges = false;
    ConstTensorView grad_norm;  // (1) f32 global gradient norm to clip by, or null (no clipping)
};

// The target of `model` (created for training): its masters, its bf16 compute copy on CUDA, its
// gradients (with sharded gradients, ModelShape::gradient_shards > 1, the rank's shard:
// grads_of_ranges; with sharded parameters, ModelShape::param_shards > 1, the masters and the
// compute copy are the rank's shard too: params_of_ranges) and the norm its last grad_norm() left
// in device memory.
OptimizerTarget optimizer_target(const Model& model);

class AdamWOptimizer {
public:
    // Moments for `range` of a flat vector of `total` elements, allocated (zeroed) where `ctx`
    // computes. Errors: a range outside [0, total] (kInvalidArgument), allocation failure.
    static Result<AdamWOptimizer> create(int64_t total, FlatRange range, const Context& ctx);
    // Moments for the list `ranges` (sorted, disjoint, inside [0, total]; empty ones kept, they
    // own nothing), stored as `state` (optimizer.state_dtype: f32, or bf16 as ops/adamw.h
    // defines: half the bytes, 8 significant bits kept between steps). Errors: ranges unsorted,
    // overlapping or outside (kInvalidArgument), allocation failure.
    static Result<AdamWOptimizer> create(int64_t total, std::vector<FlatRange> ranges,
                                         const Context& ctx,
                                         AdamWStateDType state = AdamWStateDType::kF32);
    // Moments for `range` of `model`'s parameters (created for training), where `ctx` computes:
    // the model's own context for the usual optimizer. Errors as create(); a model without
    // gradients (kFailedPrecondition); a context on another backend than the model's
    // (kUnimplemented: offload).
    static Result<AdamWOptimizer> create_for(const Model& model, FlatRange range,
                                             const Context& ctx);
    static Result<AdamWOptimizer> create_for(const Model& model, std::vector<FlatRange> ranges,
                                             const Context& ctx,
                                             AdamWStateDType state = AdamWStateDType::kF32);
    // Every parameter of `model`, on the model's context.
    static Result<AdamWOptimizer> create_for(const Model& model);

    AdamWOptimizer(AdamWOptimizer&&) noexcept;
    AdamWOptimizer& operator=(AdamWOptimizer&&) noexcept;
    ~AdamWOptimizer();

    // The overlapped schedule over `model` (file comment): sets its weights-needed hook.
    // `optimizer_sms` (optimizer.overlap_sms; read on CUDA): with S > 0 the GEMMs the compute
    // stream enqueues between an update's start and the forward's LM-head piece (every unit
    // updated by then) plan for the device's SMs less S (cuBLASLt's SM count target,
    // CudaState::gemm_sm_target), so that the update's blocks run on S SMs beside them rather
    // than only where a GEMM leaves an SM idle. The GEMMs' algorithm may differ with the target,
    // and so may the bits against S = 0; a run with the same S repeats its bits.
    // Errors (kFailedPrecondition, the serial schedule kept): an optimizer not over the one range
    // {0, params_total()} of `model` on its context, sharded gradients or parameters, a model
    // without gradients; called twice. kInvalidArgument: optimizer_sms outside [0,
    // kMaxOptimizerSms] or, on CUDA, not fewer than the device's SMs.
    static constexpr int kMaxOptimizerSms = 64;
    Status overlap_with(Model& model, int optimizer_sms = 0);
    OptimizerSchedule schedule() const {
        return overlap_ ? OptimizerSchedule::kOverlapped : OptimizerSchedule::kSerial;
    }
    // Overlapped: every pending unit's update reaches the weights, the moments and the gradients
    // before anything enqueued on the compute stream afterwards (CPU: runs them). Serial: no-op.
    void finish();

    int64_t total() const { return total_; }
    // The one range of an optimizer over a single range (checked: a list of several has none).
    FlatRange range() const;
    const std::vector<FlatRange>& ranges() const { return ranges_; }
    // Elements owned: the sum of the ranges' sizes.
    int64_t numel() const { return numel_; }
    const Context& context() const { return ctx_; }
    AdamWStateDType state_dtype() const {
        return exp_avg().dtype() == DType::kBF16 ? AdamWStateDType::kBF16 : AdamWStateDType::kF32;
    }
    // The moments, (numel()) elements of state_dtype() each, where the context computes: the
    // ranges' elements in list order (for one range, element i is element range.begin + i of the
    // full vector).
    TensorView exp_avg() const { return moments_.view(0); }
    TensorView exp_avg_sq() const { return moments_.view(1); }

    // One AdamW update, number `step` (1 for the first), of the parts of `segments` (offsets into
    // the full vector, ops/adamw.h's rules) inside the range, with torch's bias corrections for
    // `step`. With max_grad_norm > 0 and target.grad_norm given, the gradients count as clipped
    // by the norm (grad_clip_by_norm's scale, applied inside the update; the gradients in memory
    // stay as they are). The target must hold total() elements where the context computes
    // (checked). Overlapped: the target must be optimizer_target(model) of overlap_with's model
    // (checked); the update is enqueued or posted unit by unit and the gradients zeroed after it
    // (file comment).
    void step(const OptimizerTarget& target, std::span<const AdamWSegment> segments,
              const AdamWHyper& hyper, int64_t step, float max_grad_norm = 0.0f);

    // The moments copied to / from host memory, numel() elements each (checked); bf16 moments
    // widen exactly on the way out and round to nearest even on the way in.
    void read_state(std::span<float> exp_avg, std::span<float> exp_avg_sq) const;
    void write_state(std::span<const float> exp_avg, std::span<const float> exp_avg_sq);

private:
    AdamWOptimizer() = default;
    void step_overlapped(const OptimizerTarget& target, std::span<const AdamWSegment> segments,
                         const AdamWHyper& hyper, int64_t step, float max_grad_norm);

    int64_t total_ = 0;
    std::vector<FlatRange> ranges_;
    int64_t numel_ = 0;
    Context ctx_;
    ModelArena moments_;               // entries exp_avg, exp_avg_sq
    std::vector<AdamWSegment> local_;  // step()'s segments of one range, relative to its begin
    // The overlapped schedule's state (on the heap: the model's hook holds its address).
    struct Overlap;
    std::unique_ptr<Overlap> overlap_;
};

}  // namespace lathe
