#include "run/train_step.h"

#include <algorithm>
#include <cstddef>
#include <cstring>

#include "core/check.h"
#include "dist/communicator.h"
#include "dist/host_collectives.h"
#include "run/data_parallel.h"

namespace lathe {

TrainStep::TrainStep(Model& model, AdamWOptimizer& optimizer, std::vector<char> frozen,
                     DataParallel* dp, Communicator* tp)
    : model_(model), optimizer_(&optimizer), frozen_(std::move(frozen)), dp_(dp), tp_(tp) {
    LATHE_CHECK(tp_ == nullptr || dp_ != nullptr, "tensor parallel steps through DataParallel");
    LATHE_CHECK(dp_ == nullptr || optimizer.schedule() == OptimizerSchedule::kSerial,
                "data parallel steps with the serial optimizer schedule");
    LATHE_CHECK(frozen_.empty() || frozen_.size() == model_.params().entries().size(),
                "{} frozen flags for {} parameter entries", frozen_.size(),
                model_.params().entries().size());
}

TrainStep::TrainStep(Model& model, HostOptimizer& optimizer, std::vector<char> frozen)
    : model_(model), host_(&optimizer), frozen_(std::move(frozen)) {
    LATHE_CHECK(frozen_.empty() || frozen_.size() == model_.params().entries().size(),
                "{} frozen flags for {} parameter entries", frozen_.size(),
                model_.params().entries().size());
}

Result<TrainStepValues> TrainStep::gradients(int64_t K, const NextBatch& next,
                                             const std::function<int()>& stop_request) {
    LATHE_CHECK(K >= 1, "a step of {} micro-batches", K);
    const int64_t W = dp_ != nullptr ? dp_->world() : 1;
    if (host_ != nullptr) host_->before_zero_grads();
    // After an overlapped device update the gradients are zero, or become zero unit by unit
    // before the forward reads the unit's weights (optim/adamw_optimizer.h): a zero_grads here
    // would wait for every unit's update.
    // One process, serial schedule: the clearing runs beside the forward (model.h).
    if (!grads_zeroed_) {
        if (dp_ == nullptr && host_ == nullptr)
            model_.zero_grads_beside_forward();
        else
            model_.zero_grads();
    }
    grads_zeroed_ = false;
    losses_.resize(size_t(K));
    int64_t read = 0;
    auto read_losses = [&](int64_t upto) {
        model_.read_losses(std::span<float>(losses_.data() + read, size_t(upto - read)));
        read = upto;
    };
    const float dloss = 1.0f / float(W * K);
    for (int64_t k = 0; k < K; ++k) {
        LATHE_ASSIGN_OR_RETURN(const ModelBatch batch, next(k));
        if (k - read == kLossSlots) read_losses(k);
        if (dp_ != nullptr) dp_->begin_micro_batch(k == K - 1);
        if (host_ != nullptr && k == K - 1) host_->arm_gradient_copies();
        model_.forward_backward_async(batch, dloss, k - read);
    }
    if (dp_ != nullptr) LATHE_RETURN_IF_ERROR(dp_->finish_gradients());
    if (model_.sequence_parallel()) {
        LATHE_CHECK(dp_ != nullptr, "sequence parallel steps through DataParallel");
        // Sequence parallel: each tensor rank's norm gradients hold its rows' part (model.h);
        // summed over the group once, where this rank keeps them (the arena, or its ZeRO-2
        // chunks, which are the same on every rank of the group), before the norm reads them.
        model_.sum_sequence_parallel_grads(
            dp_->gradient_pieces(model_.sequence_parallel_partial_ranges()));
    }
    for (size_t e = 0; e < frozen_.size(); ++e)
        if (frozen_[e]) dp_ != nullptr ? dp_->zero_grad_entry(e) : model_.zero_grad_entry(e);
    TrainStepValues out;
    // Data parallel: this rank's part of the norm (a sum of squares), combined once every rank's
    // is gathered.
    double part = dp_ != nullptr ? dp_->local_grad_sum_of_squares() : 0.0;
    out.stop_request = stop_request ? stop_request() : 0;
    if (tp_ != nullptr && tp_->size() > 1) {
        // Tensor parallel: the shards of the group (its replicated entries counted by tensor
        // rank 0 alone, DataParallel::exclude_from_norm), summed in rank order; the stop request
        // travels with them, so that the group's largest goes into the data-parallel gather below
        // and every rank of the world stops after the same step.
        const double mine[2] = {part, double(out.stop_request)};
        std::vector<double> parts(size_t(2 * tp_->size()));
        LATHE_RETURN_IF_ERROR(
            all_gather_bytes(*tp_, std::as_bytes(std::span<const double>(mine, 2)),
                             std::as_writable_bytes(std::span<double>(parts)), dp_->stream())
                .with_context("gathering the tensor-parallel gradient norm"));
        part = 0.0;
        for (size_t r = 0; r < size_t(tp_->size()); ++r) {
            part += parts[2 * r];
            out.stop_request = std::max(out.stop_request, int(parts[2 * r + 1]));
        }
    }
    if (dp_ == nullptr) out.norm = model_.grad_norm();
    read_losses(K);
    // Delayed fp8 scaling: the step's amaxes, read back now that the GPU has caught up.
    model_.fp8_end_step();
    double sum = 0.0;
    if (dp_ == nullptr) {
        for (const float l : losses_) sum += l;
    } else {
        // Every rank's losses, stop request and norm part (its fp64 bytes in two slots) in one
        // gather: rank r's K + 3 values at r (K + 3).
        const int64_t n = K + 3;
        losses_.push_back(float(out.stop_request));
        losses_.resize(size_t(n));
        std::memcpy(&losses_[size_t(K + 1)], &part, sizeof(double));
        gathered_.resize(size_t(W * n));
        LATHE_RETURN_IF_ERROR(
            all_gather_bytes(dp_->comm(), std::as_bytes(std::span<const float>(losses_)),
                             std::as_writable_bytes(std::span<float>(gathered_)), dp_->stream())
                .with_context("gathering the step's losses"));
        losses_.resize(size_t(K));
        for (int64_t k = 0; k < K; ++k)
            for (int64_t r = 0; r < W; ++r) sum += gathered_[size_t(r * n + k)];
        norms_.resize(size_t(W));
        for (int64_t r = 0; r < W; ++r) {
            out.stop_request = std::max(out.stop_request, int(gathered_[size_t(r * n + K)]));
            std::memcpy(&norms_[size_t(r)], &gathered_[size_t(r * n + K + 1)], sizeof(double));
        }
        out.norm = dp_->set_grad_norm(norms_);
        out.comm_wait_ms = dp_->comm_wait_ms();
    }
    out.loss = float(sum / double(W * K));
    norm_ = out.norm;
    return out;
}

Status TrainStep::apply(double lr, double weight_decay, const AdamWHyper& hyper, int64_t adam_step,
                        float max_grad_norm) {
    const std::vector<AdamWSegment> all = model_.adamw_segments(lr, weight_decay);
    segments_.clear();
    for (size_t i = 0; i < all.size(); ++i)
        if (frozen_.empty() || !frozen_[i]) segments_.push_back(all[i]);
    if (host_ != nullptr)
        host_->step(model_, segments_, hyper, adam_step, norm_, max_grad_norm);
    else
        optimizer_->step(optimizer_target(model_), segments_, hyper, adam_step, max_grad_norm);
    grads_zeroed_ =
        optimizer_ != nullptr && optimizer_->schedule() == OptimizerSchedule::kOverlapped;
    model_.fp8_weights_updated();  // the next forward casts the fp8 weight codes (model.h)
    return dp_ != nullptr ? dp_->finish_update() : ok_status();
}

}  // namespace lathe
