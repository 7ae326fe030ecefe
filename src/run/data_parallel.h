#pragma once
// DataParallel: the collectives that make W processes (ranks) train one model as one process
// would, each computing the gradients of its slice of every global batch (ZeRO stages 0 to 3).
//
// Units and chunks (model/memory_plan.h, ShardLayout): the parameter arena is cut into units
// (the entries before layer 0, each layer, the entries after the last layer), each padded with
// zeros to a multiple of kShardAlignElements * W (the model is created with
// ModelShape::unit_shards = W); rank r owns chunk r of every unit.
//
// One step over W ranks, each with K micro-batches (TrainStep drives it, run/train_step.h):
//
//   every rank    K forward/backward passes over its micro-batches, dloss 1 / (W K). During
//                 each backward the model's gradients-ready hook (model/model.h) hands over each
//                 layer as soon as it is final for the micro-batch, and its unit's gradients are
//                 reduce-scattered over the ranks (rank r's chunk receives the sum of every
//                 rank's chunk r) while the backward of the layers below it runs: on CUDA on the
//                 communication stream, ordered after the layer's backward with
//                 CudaState::wait_for; on the CPU (MPI) at once. The front and back units go at
//                 the last call.
//   accumulation  every micro-batch is reduced, and the sums add up in one order at every
//                 stage: before micro-batch k > 1 writes unit u (the model's gradient windows
//                 hook), the unit's buffer holds zeros except this rank's chunk, which holds the
//                 reduced sum of micro-batches 1..k-1; the backward adds its gradients into it
//                 and the reduce-scatter of that buffer gives the sum through k. So the chunk
//                 after K micro-batches is the same bits at ZeRO 0, 1 and 2 (the same values
//                 in the same collective), at the price of K reductions a step instead of one
//                 (docs/DISTRIBUTED.md, "Gradient accumulation").
//   ZeRO-0, 1     the buffer of unit u is its place in the full gradient arena: reduced in
//                 place; for micro-batch k > 1 the other ranks' chunks are zeroed first.
//   ZeRO-2        the gradient arena is the rank's shard (its chunks of every unit, in unit
//                 order: ModelShape::gradient_shards = W) and a few unit-sized windows
//                 (MemoryPlan::gradients): the front and back units' own (their gradients
//                 collect over the whole backward) and gradient_layer_windows() for the layers,
//                 taken in turn. Before the backward writes a unit, its window is zeroed and the
//                 shard's chunk copied into the rank's chunk of it; the window's reduce-scatter
//                 writes the chunk back into the shard. On CUDA the compute stream waits, with
//                 events and no host wait, for the reduction that last read the window and for
//                 the one that last wrote the unit's chunk.
//   ZeRO-0        each reduced chunk of the last micro-batch is all-gathered back into its unit
//                 right after its reduce-scatter, so every rank holds every summed gradient.
//   the norm      each rank's sum of squares over its own chunks (fp64), gathered with the
//                 step's losses, summed in rank order (fp64), its root written back for the
//                 clip: the same value on every rank and at every stage.
//   ZeRO-0        every rank updates every parameter (the same bits on every rank).
//   ZeRO-1, 2     rank r updates its chunks only: AdamW's moments exist for them alone
//                 (optimizer_ranges()), at ZeRO-2 reading the gradients from the shard; then the
//                 updated chunks reach every rank, unit by unit in the next forward's order
//                 (front, layer 0, ..., layer L-1, back), each unit all-gathered in place. On the
//                 CPU the f32 masters (what it computes with) are gathered at once. On CUDA the
//                 bf16 compute copy travels on the communication stream, and the forward waits
//                 for each unit just before it reads it (the model's weights-needed hook): the
//                 first layers compute while the last ones are in flight. The f32 masters
//                 outside the chunks are gathered only when a checkpoint needs them
//                 (gather_masters()).
//   ZeRO-3        the parameters are sharded too (ModelShape::param_shards = W): the f32
//                 masters and on CUDA the bf16 compute copy are the rank's shard (its chunks in
//                 unit order, the gradient shard's layout), which AdamW updates in place, and the
//                 gradients go as at ZeRO-2. The model computes from unit-sized windows
//                 (MemoryPlan::param_storage) that this class fills through the model's weight
//                 windows hook, each unit all-gathered from every rank's shard (the compute copy
//                 on CUDA, the masters on the CPU): the front and back units into their own
//                 windows, once after each update (a forward gathers them, its backward and the
//                 following micro-batches of the step read them again), the layers in turn
//                 through two windows. On CUDA the gathers run on the communication stream,
//                 each after an event recorded on the compute stream when it is issued, and the
//                 compute stream waits for a unit's gather (an event, no host wait) when the
//                 model first asks for it; asked for layer l, the hook also issues the gather of
//                 the layer computed next (l + 1 after l - 1, l - 1 after l + 1: the forward's
//                 and the backward's orders) into the other window, whose last reader has been
//                 enqueued by then, so that it travels while layer l computes; each micro-batch
//                 begins by issuing the front's and layer 0's, and the forward's last two
//                 layers issue the back unit's. On the CPU (MPI) the gathers are
//                 synchronous, when a unit is asked for. After the optimizer step nothing is
//                 gathered: every window is stale until the next forward gathers it again.
//                 The checkpoint's model is gathered entry by entry to rank 0's host memory
//                 (gather_params), unit by unit through the gradient windows.
// At a fixed world size the stages sum the same buffers with the same collectives, so the
// gradients, the norm and every update are the same bits at ZeRO 0, 1, 2 and 3 (ZeRO-3 gathers
// the same bf16 or f32 values ZeRO-1 and 2 gather after their updates).
//
// Checkpoints: the optimizer state is written and read in canonical coordinates (the one-process
// arena, ShardLayout): at ZeRO 1 to 3 each rank its own chunks (optim/optimizer_state.h's
// range-list shard set), at ZeRO-0 rank 0 the full file; so a checkpoint resumes at any world size
// and stage. A ZeRO-3 model reads each rank's chunks of a loaded checkpoint (every rank reads the
// file; Model::write_param_entry keeps its chunks).
//
// Communication time: comm_wait_ms() is what the compute stream spent waiting for
// communication in the last step (CUDA: timed with events around the wait for the last
// micro-batch's reductions and around each wait for a gathered unit, at ZeRO-3 those of the
// forwards and the backwards; the waits before a unit's
// gradients are written, for an earlier micro-batch's reduction or a free ZeRO-2 window, are not
// timed; CPU: the host time inside the collectives, which the CPU does not overlap).
//
// Ownership: holds references to the model and the communicator, which must outlive it; installs
// the model's gradients-ready and gradient windows hooks (and at ZeRO 1 and 2 on CUDA its
// weights-needed hook, at ZeRO-3 its weight windows hook) and removes them when destroyed.

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "dist/communicator.h"
#include "model/model.h"
#include "optim/adamw_optimizer.h"

namespace lathe {

class CudaEvent;
class ParamStaging;

// Sets `shape`'s unit_shards, optimizer_shards, gradient_shards, param_shards and shard_rank for
// data parallel over `world` ranks at `zero_stage`, this process being `rank` (1 rank: none
// sharded).
void data_parallel_shape(ModelShape& shape, int world, int zero_stage, int rank = 0);

class DataParallel {
public:
    // Over the world `comm` (every rank calls it with the same model shape). zero_stage 0 to 3.
    // Errors (invalid argument): another stage (naming parallel.zero_stage); more than one rank
    // over a model whose units are not padded for comm.size() ranks, or whose optimizer,
    // gradient or parameter shards are not the stage's (ModelShape::optimizer_shards,
    // gradient_shards, param_shards, shard_rank; see data_parallel_shape); a model without
    // gradients; a communicator that does not take the model's memory.
    static Result<std::unique_ptr<DataParallel>> create(Model& model, Communicator& comm,
                                                        int zero_stage);
    ~DataParallel();
    DataParallel(const DataParallel&) = delete;
    DataParallel& operator=(const DataParallel&) = delete;

    int rank() const { return comm_.rank(); }
    int world() const { return comm_.size(); }
    int zero_stage() const { return zero_stage_; }
    Communicator& comm() const { return comm_; }
    // The elements of the flat parameter vector this rank's optimizer updates: everything at
    // ZeRO-0 or with one rank, else the rank's chunks.
    const std::vector<FlatRange>& optimizer_ranges() const { return ranges_; }
    // This rank's chunks (arena coordinates), in unit order.
    const std::vector<FlatRange>& chunks() const { return chunks_; }
    // The canonical length (the end of the last real parameter of the one-process arena).
    int64_t params_used() const { return layout_.used; }
    // The stream host-value collectives run on (the compute stream on CUDA; null on the CPU).
    CUstream_st* stream() const;

    // Before each micro-batch's forward/backward: `last` says whether it is the step's last (its
    // reduced gradients are final; at ZeRO-0 they are gathered onto every rank).
    void begin_micro_batch(bool last);
    // After the last micro-batch's backward was enqueued: the compute stream waits for every
    // reduction; returns the first error a collective gave.
    Status finish_gradients();
    // Zeroes this rank's gradients of parameter entry `index` (params().entries(); a frozen
    // group), after finish_gradients(): in the shard at ZeRO-2, in the model's arena otherwise.
    void zero_grad_entry(size_t index);
    // After the optimizer step (ZeRO-1): every rank's updated shard reaches every rank.
    Status finish_update();
    // ZeRO-1 and 2 on CUDA: the f32 masters of every shard gathered onto every rank, for a
    // checkpoint (synchronous). Elsewhere a no-op (ZeRO-3: gather_params).
    Status gather_masters();
    // Whether the model's parameters are sharded (ZeRO-3 over more than one rank): a checkpoint
    // gathers them with gather_params, and no rank holds a parameter entry whole.
    bool params_sharded() const { return params_sharded_; }
    // ZeRO-3: every parameter entry's f32 masters gathered from every rank's shard, unit by unit
    // through the model's gradient windows (the whole model is never on one GPU), into
    // `staging`'s host copy of the entry (ParamStaging over this model), on the ranks that pass
    // one (rank 0 for a checkpoint). Every rank calls it (collective); synchronous, between steps.
    // Errors: a collective's.
    Status gather_params(ParamStaging* staging);
    // This rank's sum of squares over its chunks, read back (the step's one wait for the GPU),
    // and the world's norm, sqrt of every rank's part summed in rank order (fp64), written where
    // the optimizer clips and returned.
    double local_grad_sum_of_squares() { return model_.grad_sum_of_squares(norm_ranges_); }
    float set_grad_norm(std::span<const double> rank_sums);
    // Where this rank keeps the gradients of the parameter arena ranges `arena` (params_flat()
    // coordinates) after finish_gradients(): views of the model's gradient arena over the whole
    // ranges, or with sharded gradients (ZeRO-2 and 3) over their parts in this rank's chunks
    // (in the shard), in the order of `arena` then of the chunks. Ranks of one data-parallel
    // rank and model layout (a tensor-parallel group) get pieces of the same sizes.
    std::vector<TensorView> gradient_pieces(std::span<const FlatRange> arena) const;
    // Leaves the parameter arena ranges `arena` (params_flat() coordinates) out of this rank's
    // sum of squares: the entries another rank counts (tensor parallel's replicated entries on
    // tensor ranks other than 0, run/trainer.cpp).
    void exclude_from_norm(std::span<const FlatRange> arena);
    // The optimizer state of this rank's chunks written into the checkpoint folder `dir`
    // (range-list shard, canonical; at ZeRO-0 rank 0 writes the whole canonical vector as the
    // full file and the others nothing), and read back from any checkpoint folder of any world:
    // `optimizer` is this rank's (over optimizer_ranges()). check_checkpoint: rank 0's check that
    // `dir` holds every rank's file.
    Status save_optimizer(const AdamWOptimizer& optimizer, const std::string& dir) const;
    Status load_optimizer(AdamWOptimizer& optimizer, const std::string& dir) const;
    Status check_checkpoint(const std::string& dir) const;
    // load_optimizer from the whole canonical moment vectors `exp_avg`, `exp_avg_sq` (of
    // params_used() elements) in memory: a state another layout wrote, converted
    // (parallel.tensor, infer/tensor_parallel.h's tp_reshard_moments).
    void load_optimizer_canonical(AdamWOptimizer& optimizer, std::span<const float> exp_avg,
                                  std::span<const float> exp_avg_sq) const;
    // Milliseconds the compute waited on communication in the last step; call after the step's
    // gradient norm was read (the events it times have completed then).
    double comm_wait_ms();

private:
    DataParallel(Model& model, Communicator& comm, int zero_stage);
    void on_layer_ready(int layer);
    void on_weights_needed(int piece);
    // ZeRO-3: the weight windows hook (file comment).
    TensorView on_weight_window(int piece);
    // The gradient windows hook: prepares unit `piece`'s buffer for this micro-batch (once) and
    // returns its window (ZeRO-2) or null (the model's arena).
    TensorView on_grad_window(int piece);
    size_t unit_of_piece(int piece) const;
    Status reduce_unit(size_t unit);
    // The canonical ranges `optimizer`'s moments hold, and each one's moment offset.
    void canonical_ranges(const AdamWOptimizer& optimizer, std::vector<FlatRange>& canonical,
                          std::vector<int64_t>& offsets) const;
    // The moments' offset (optimizer coordinates) of arena element `at` of `optimizer`'s ranges.
    static int64_t moment_offset(const AdamWOptimizer& optimizer, int64_t at);
    // CUDA: the compute stream waits for every piece still in flight.
    void wait_for_pieces();
    // ZeRO-3: weight window `slot` (0 front, 1 back, 2.. layers) made to hold unit `unit` of the
    // current parameters (gathered, or its gather issued, unless it holds it already), and the
    // compute stream made to wait for it when `use`.
    void fill_window(size_t slot, size_t unit, bool use);
    // ZeRO-3, CUDA: the compute stream waits for window `slot`'s gather (timed).
    void wait_for_window(size_t slot);

    Model& model_;
    Communicator& comm_;
    int zero_stage_ = 0;
    const ShardLayout& layout_;  // the model's plan's
    std::vector<FlatRange> chunks_, ranges_;
    // Where this rank's sum of squares reads: its chunks in the model's arena, or in the shard.
    std::vector<FlatRange> norm_ranges_;
    bool sharded_ = false;             // ZeRO-2 over more than one rank
    int64_t micro_ = 0;                // micro-batches begun in this step (1 for the first)
    int64_t epoch_ = 0;                // micro-batches begun since creation
    bool last_ = false;                // the current micro-batch is the step's last
    std::vector<int64_t> prepared_;    // [u] the epoch unit u's buffer was last prepared for
    std::vector<TensorView> windows_;  // [u] ZeRO-2: unit u's window this micro-batch
    std::vector<int> slot_of_;         // [u] ZeRO-2: its layer window, -1 for front and back
    std::vector<int64_t> shard_at_;    // [u] ZeRO-2: the offset of its chunk in the shard
    int next_slot_ = 0;
    Status first_error_;
    double host_comm_ms_ = 0.0;  // CPU: time inside collectives this step
    // CUDA: timing events around the compute stream's wait for the gradient reductions;
    // reduced_ says whether they hold an unread interval.
    std::vector<std::unique_ptr<CudaEvent>> events_;
    bool reduced_ = false;
    // CUDA: recorded on the communication stream after unit u's reduce-scatter, and after the
    // reduce-scatter that last read layer window i (ZeRO-2).
    std::vector<std::unique_ptr<CudaEvent>> unit_reduced_, window_free_;
    // CUDA, ZeRO-1: the pieces of the parameter gather, one per unit in forward order (front,
    // layers, back): `ready` recorded on the communication stream after the unit's all-gather,
    // the timing events around the compute stream's wait for it, and whether that wait is unread.
    struct Piece {
        std::unique_ptr<CudaEvent> ready, wait_begin, wait_end;
        bool in_flight = false, waited = false;
    };
    std::vector<Piece> pieces_;
    // ZeRO-3: the weight windows, [0] front, [1] back, [2 + i] layer window i: which unit of
    // which parameter version each holds (unit -1: none), and on CUDA `ready` recorded on the
    // communication stream after its gather, `pending` until the compute stream waited for it.
    struct WeightWindow {
        TensorView view;
        int64_t unit = -1, version = -1;
        bool pending = false;
        std::unique_ptr<CudaEvent> ready;
    };
    bool params_sharded_ = false;  // ZeRO-3 over more than one rank
    std::vector<WeightWindow> weight_windows_;
    int64_t version_ = 0;  // parameter updates since creation (finish_update)
    int last_layer_ = -1;  // the layer the weight windows hook was last asked for
    // CUDA: timing events around the compute stream's waits for gathered windows this step, the
    // first waits_ of them recorded (at most kTimedWaits a step; later waits go untimed).
    static constexpr size_t kTimedWaits = 4096;
    std::vector<std::unique_ptr<CudaEvent>> wait_begin_, wait_end_;
    size_t waits_ = 0;
};

}  // namespace lathe
