#pragma once
// TrainStep: the compute of one optimizer step, as `lathe train` runs it and `lathe bench` times
// it (one function for both). Split in two so that the trainer can decide between them whether
// the step is applied (its skip and spike policy, run/trainer.cpp):
//
//   gradients(K, next)   zero the gradients; for k = 0..K-1, forward and backward of micro-batch
//                        next(k) with dloss 1/K (the objective is the mean of the K means), the
//                        loss left in device memory; zero the frozen entries' gradients; the
//                        global gradient norm (the step's one wait for the GPU); the K losses read
//                        back (every kLossSlots micro-batches when K is larger) and averaged in
//                        micro-batch order (fp64 sum); with delayed fp8 scaling the step's
//                        amaxes read back and the scales updated (Model::fp8_end_step).
//   apply(lr, ...)       one AdamW update of every entry that is not frozen (weight decay on
//                        matrices and embeddings, Model::adamw_segments), clipped by the norm
//                        gradients() computed when max_grad_norm > 0 (inside the update, with no
//                        read back); on CUDA the bf16 compute copy is rewritten in the same pass
//                        (and, with fp8 linears, the model told to cast its weights again).
//
// On the GPU neither adds a synchronization, a device allocation or a copy to what the model and
// the optimizer enqueue; the host builds the segment list (one per parameter entry) while the GPU
// computes.
//
// Data parallel (a DataParallel given, run/data_parallel.h): each of the W ranks runs its K
// micro-batches with dloss 1 / (W K); the last one's backward reduces the gradients over the
// ranks layer by layer; the loss is the mean of all W K micro-batch losses, gathered from every
// rank and summed (fp64) in the order one process with accumulation W K sees them (rank r's
// micro-batch k is that process's micro-batch k W + r: run/batch_loader.h); the norm is
// combined from each rank's sum of squares over its chunks, gathered with the losses; so the loss,
// the norm and every decision taken on them are the same on every rank. apply() updates the rank's
// optimizer ranges and, at ZeRO-1, all-gathers the updated parameters.
//
// Optimizer offload (a HostOptimizer given, optim/host_optimizer.h): apply() runs the host
// optimizer's step, clipped by the norm gradients() read back; everything else is as above. With
// the overlapped schedule gradients() arms the per-unit gradient copies before the last
// micro-batch (and orders zero_grads after the previous step's copies), and apply() returns once
// the update is handed to the optimizer's worker: the next forward waits for it layer by layer,
// and a caller that reads the masters (a checkpoint) calls HostOptimizer::finish() first.
//
// Overlapped device optimizer (AdamWOptimizer::overlap_with, optimizer.schedule: overlapped; one
// process): apply() enqueues the update unit by unit on the optimizer stream and returns; the
// next forward waits per unit (optim/adamw_optimizer.h). The update leaves the gradients cleared
// (as zero_grads_beside_forward does), so the next gradients() does not clear them (a
// gradients() after one that was not applied does); a caller that reads the weights or the
// moments other than through a forward (a checkpoint) calls AdamWOptimizer::finish() first.
//
// Ownership: holds references to the model and the optimizer, which must outlive it.

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "core/status.h"
#include "model/model.h"
#include "ops/adamw.h"
#include "optim/adamw_optimizer.h"
#include "optim/host_optimizer.h"

namespace lathe {

struct TrainStepValues {
    float loss = 0.0f;  // mean over the micro-batches (of every rank)
    float norm = 0.0f;  // global L2 norm of the gradients (before clipping)
    // Data parallel: the largest stop request any rank passed to gradients(), so that every rank
    // stops after the same step; one process: the one it passed.
    int stop_request = 0;
    double comm_wait_ms = 0.0;  // data parallel: DataParallel::comm_wait_ms() of this step
};

class Communicator;  // dist/communicator.h
class DataParallel;  // run/data_parallel.h

class TrainStep {
public:
    // `frozen`: one flag per parameter entry (Model::params().entries()), nonzero for an entry
    // that is not trained; empty trains every entry.
    // `dp`: the data-parallel collectives (null: one process); must outlive the step.
    // `tp`: the tensor-parallel group (null: none; parallel.tensor, run/trainer.cpp): each rank's
    // norm-weight gradients are summed over it first when the model is sequence parallel
    // (Model::sum_sequence_parallel_grads, after the data-parallel reduction); each rank's
    // part of the norm is summed over it (in rank order, fp64) before the data-parallel sum.
    TrainStep(Model& model, AdamWOptimizer& optimizer, std::vector<char> frozen = {},
              DataParallel* dp = nullptr, Communicator* tp = nullptr);
    // The offloaded optimizer of one process (file comment).
    TrainStep(Model& model, HostOptimizer& optimizer, std::vector<char> frozen = {});

    // Micro-batch k of the step (0 <= k < K); the batch's host memory may be reused once
    // gradients() moves to the next one.
    using NextBatch = std::function<Result<ModelBatch>(int64_t k)>;
    // The gradients of one step (file comment); errors are next()'s and the collectives'.
    // `stop_request`: this rank's wish to stop after the step (a signal number, 0 for none), asked
    // after the last micro-batch was enqueued, just before the ranks gather the step's values (so
    // that a signal during the step stops the run after it); null: none.
    Result<TrainStepValues> gradients(int64_t K, const NextBatch& next,
                                      const std::function<int()>& stop_request = nullptr);
    // The AdamW update number `adam_step` (file comment).
    Status apply(double lr, double weight_decay, const AdamWHyper& hyper, int64_t adam_step,
                 float max_grad_norm);

private:
    Model& model_;
    AdamWOptimizer* optimizer_ = nullptr;  // one of optimizer_ and host_
    HostOptimizer* host_ = nullptr;
    float norm_ = 0.0f;  // the last gradients()'s norm (host_'s clipping)
    std::vector<char> frozen_;
    DataParallel* dp_ = nullptr;
    Communicator* tp_ = nullptr;
    std::vector<float> losses_, gathered_;
    std::vector<double> norms_;
    std::vector<AdamWSegment> segments_;
    // The last apply() ran the overlapped device schedule, which zeroes the gradients it read.
    bool grads_zeroed_ = false;
};

}  // namespace lathe
