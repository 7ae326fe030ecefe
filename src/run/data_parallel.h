#pragma once
// DataParallel: the collectives that make W processes (ranks) train one model as one process
// would, each computing the gradients of its slice of every global batch (ZeRO stages 0 and 1).
//
// Units and chunks (model/memory_plan.h, ShardLayout): the parameter arena is cut into units
// (the entries before layer 0, each layer, the entries after the last layer), each padded with
// zeros to a multiple of kShardAlignElements * W (the model is created with
// ModelShape::unit_shards = W); rank r owns chunk r of every unit.
//
// One step over W ranks, each with K micro-batches (TrainStep drives it, run/train_step.h):
//
//   every rank    K forward/backward passes over its micro-batches, dloss 1 / (W K): the local
//                 gradient sum. During the backward of the last micro-batch the model's
//                 gradients-ready hook (model/model.h) hands over each layer as soon as it is
//                 final, and its unit's gradients are reduce-scattered over the ranks (in place:
//                 rank r's chunk receives the sum of every rank's chunk r) while the backward of
//                 the layers below it runs: on CUDA on the communication stream, ordered after
//                 the layer's backward with CudaState::wait_for; on the CPU (MPI) at once. The
//                 front and back units go at the last call. Accumulation reduces once per step:
//                 the earlier micro-batches add into the local gradients only.
//   ZeRO-0        each reduced chunk is all-gathered back into its unit right after its
//                 reduce-scatter, so every rank holds every summed gradient.
//   the norm      each rank's sum of squares over its own chunks (fp64), gathered with the
//                 step's losses, summed in rank order (fp64), its root written back for the
//                 clip: the same value on every rank and at every stage.
//   ZeRO-0        every rank updates every parameter (the same bits on every rank).
//   ZeRO-1        rank r updates its chunks only: AdamW's moments exist for them alone
//                 (optimizer_ranges()), then the updated chunks reach every rank, unit by unit in
//                 the next forward's order (front, layer 0, ..., layer L-1, back), each unit
//                 all-gathered in place. On the CPU the f32 masters (what it computes with) are
//                 gathered at once. On CUDA the bf16 compute copy travels on the communication
//                 stream, and the forward waits for each unit just before it reads it (the
//                 model's weights-needed hook): the first layers compute while the last ones are
//                 in flight. The f32 masters outside the chunks are gathered only when a
//                 checkpoint needs them (gather_masters()).
// At a fixed world size the stages sum the same buffers with the same collectives, so the
// gradients, the norm and every update are the same bits at ZeRO 0 and 1.
//
// Checkpoints: the optimizer state is written and read in canonical coordinates (the one-process
// arena, ShardLayout): at ZeRO-1 each rank its own chunks (optim/optimizer_state.h's range-list
// shard set), at ZeRO-0 rank 0 the full file; so a checkpoint resumes at any world size and
// stage.
//
// Communication time: comm_wait_ms() is what the compute stream spent waiting for
// communication in the last step (CUDA: timed with events around each wait; CPU: the host time
// inside the collectives, which the CPU does not overlap).
//
// Ownership: holds references to the model and the communicator, which must outlive it; installs
// the model's gradients-ready hook and removes it when destroyed.

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

class DataParallel {
public:
    // Over the world `comm` (every rank calls it with the same model shape). zero_stage 0 or 1.
    // Errors (invalid argument): another stage; more than one rank over a model whose units are
    // not padded for comm.size() ranks; a model without gradients; a communicator that does not
    // take the model's memory.
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

    // Reduce each layer's gradients as the backward hands it over: on for the backward of the last
    // micro-batch of a step, off otherwise.
    void reduce_during_backward(bool on) { reducing_ = on; }
    // After the last micro-batch's backward was enqueued: the compute stream waits for every
    // reduction; returns the first error a collective gave.
    Status finish_gradients();
    // After the optimizer step (ZeRO-1): every rank's updated shard reaches every rank.
    Status finish_update();
    // ZeRO-1 on CUDA: the f32 masters of every shard gathered onto every rank, for a checkpoint
    // (synchronous). Elsewhere a no-op.
    Status gather_masters();
    // This rank's sum of squares over its chunks, read back (the step's one wait for the GPU),
    // and the world's norm, sqrt of every rank's part summed in rank order (fp64), written where
    // the optimizer clips and returned.
    double local_grad_sum_of_squares() { return model_.grad_sum_of_squares(chunks_); }
    float set_grad_norm(std::span<const double> rank_sums);
    // The optimizer state of this rank's chunks written into the checkpoint folder `dir`
    // (range-list shard, canonical; at ZeRO-0 rank 0 writes the whole canonical vector as the
    // full file and the others nothing), and read back from any checkpoint folder of any world:
    // `optimizer` is this rank's (over optimizer_ranges()). check_checkpoint: rank 0's check that
    // `dir` holds every rank's file.
    Status save_optimizer(const AdamWOptimizer& optimizer, const std::string& dir) const;
    Status load_optimizer(AdamWOptimizer& optimizer, const std::string& dir) const;
    Status check_checkpoint(const std::string& dir) const;
    // Milliseconds the compute waited on communication in the last step; call after the step's
    // gradient norm was read (the events it times have completed then).
    double comm_wait_ms();

private:
    DataParallel(Model& model, Communicator& comm, int zero_stage);
    void on_layer_ready(int layer);
    void on_weights_needed(int piece);
    Status reduce_unit(size_t unit);
    // The moments' offset (optimizer coordinates) of arena element `at` of `optimizer`'s ranges.
    static int64_t moment_offset(const AdamWOptimizer& optimizer, int64_t at);
    // CUDA: the compute stream waits for every piece still in flight.
    void wait_for_pieces();

    Model& model_;
    Communicator& comm_;
    int zero_stage_ = 0;
    const ShardLayout& layout_;  // the model's plan's
    std::vector<FlatRange> chunks_, ranges_;
    bool reducing_ = false;
    Status first_error_;
    double host_comm_ms_ = 0.0;  // CPU: time inside collectives this step
    // CUDA: timing events around the compute stream's wait for the gradient reductions;
    // reduced_ says whether they hold an unread interval.
    std::vector<std::unique_ptr<CudaEvent>> events_;
    bool reduced_ = false;
    // CUDA, ZeRO-1: the pieces of the parameter gather, one per unit in forward order (front,
    // layers, back): `ready` recorded on the communication stream after the unit's all-gather,
    // the timing events around the compute stream's wait for it, and whether that wait is unread.
    struct Piece {
        std::unique_ptr<CudaEvent> ready, wait_begin, wait_end;
        bool in_flight = false, waited = false;
    };
    std::vector<Piece> pieces_;
};

}  // namespace lathe
