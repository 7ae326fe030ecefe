#pragma once
// DataParallel: the collectives that make W processes (ranks) train one model as one process
// would, each computing the gradients of its slice of every global batch (ZeRO stages 0 and 1).
//
// One step over W ranks, each with K micro-batches (TrainStep drives it, run/train_step.h):
//
//   every rank    K forward/backward passes over its micro-batches, dloss 1 / (W K): the local
//                 gradient sum. During the backward of the last micro-batch the model's
//                 gradients-ready hook (model/model.h) hands over each layer as soon as it is
//                 final, and its gradients are summed over the ranks (all-reduce, in place) while
//                 the backward of the layers below it runs: on CUDA on the communication stream,
//                 ordered after the layer's backward with CudaState::wait_for; on the CPU (MPI) at
//                 once. Accumulation reduces once per step: the earlier micro-batches add into
//                 the local gradients only.
//   then          every rank holds the same summed gradients (the compute stream waits for the
//                 reductions), so the norm, the skip decision and the clip are the same on all.
//   ZeRO-0        every rank updates every parameter (the same bits on every rank: the update
//                 is deterministic and its inputs are equal).
//   ZeRO-1        rank r updates shard r only: AdamW's moments exist for that shard alone
//                 (optimizer_range()), then the updated shards reach every rank. On the CPU the
//                 f32 masters (what it computes with) are all-gathered at once. On CUDA the bf16
//                 compute copy travels piece by piece in the next forward's order (embeddings,
//                 layer 0, ..., layer L-1, final norm and head), each piece broadcast from the
//                 rank(s) whose shard holds it on the communication stream, and the forward waits
//                 for each piece just before it reads it (the model's weights-needed hook): the
//                 first layers compute while the last ones are in flight. The f32 masters outside
//                 the shard are gathered only when a checkpoint needs them (gather_masters()).
// The gradients, and so every update, are the same bits at ZeRO 0 and 1: both reduce with the
// same all-reduce calls over the same buffers, and AdamW is elementwise.
//
// Equal shards: ZeRO-1 needs the parameter arena's length to be a multiple of
// kShardAlignElements * W (the model is created with ModelShape::optimizer_shards = W, which pads
// the arena with zeros at its end). Shard r is [r S, (r + 1) S), S = total / W; elements at and
// after params_used() are padding, zero everywhere (parameters, gradients, moments).
//
// Which layer is which range: layer l's entries are contiguous in the parameter table
// (embeddings, layer 0, ..., layer L-1, final norm and head), so each hook call reduces one
// contiguous range of the flat gradients (the alignment gaps between entries are zero and
// reduce to zero); the entries outside the blocks are two ranges, reduced at the last call.
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
    // Errors (invalid argument): another stage; ZeRO-1 over a model whose parameter arena is not
    // padded for comm.size() shards; a model without gradients; a communicator that does not
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
    // The elements of the flat parameter vector this rank's optimizer updates.
    FlatRange optimizer_range() const { return range_; }
    // The flat length without the shard padding (the end of the last real parameter).
    int64_t params_used() const { return used_; }
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
    // Milliseconds the compute waited on communication in the last step; call after the step's
    // gradient norm was read (the events it times have completed then).
    double comm_wait_ms();

private:
    DataParallel(Model& model, Communicator& comm, int zero_stage);
    void on_layer_ready(int layer);
    void on_weights_needed(int piece);
    Status reduce_range(int64_t begin, int64_t end);
    // CUDA: the compute stream waits for every piece still in flight.
    void wait_for_pieces();

    Model& model_;
    Communicator& comm_;
    int zero_stage_ = 0;
    FlatRange range_;
    int64_t total_ = 0, used_ = 0;
    // Flat ranges of each layer's gradients ([l] for layer l) and of the entries outside the
    // blocks (before layer 0 and after the last layer; either may be empty).
    std::vector<FlatRange> layer_ranges_;
    FlatRange front_, back_;
    bool reducing_ = false;
    Status first_error_;
    double host_comm_ms_ = 0.0;  // CPU: time inside collectives this step
    // CUDA: timing events around the compute stream's wait for the gradient reductions;
    // reduced_ says whether they hold an unread interval.
    std::vector<std::unique_ptr<CudaEvent>> events_;
    bool reduced_ = false;
    // CUDA, ZeRO-1: the pieces of the parameter gather, in forward order (front, layers, back):
    // `ready` recorded on the communication stream after the piece's broadcasts, the timing
    // events around the compute stream's wait for it, and whether that wait is unread.
    struct Piece {
        FlatRange range;
        std::unique_ptr<CudaEvent> ready, wait_begin, wait_end;
        bool in_flight = false, waited = false;
    };
    std::vector<Piece> pieces_;
};

}  // namespace lathe
