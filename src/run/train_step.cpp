#include "run/train_step.h"

#include "core/check.h"

namespace lathe {

TrainStep::TrainStep(Model& model, AdamWOptimizer& optimizer, std::vector<char> frozen)
    : model_(model), optimizer_(optimizer), frozen_(std::move(frozen)) {
    LATHE_CHECK(frozen_.empty() || frozen_.size() == model_.params().entries().size(),
                "{} frozen flags for {} parameter entries", frozen_.size(),
                model_.params().entries().size());
}

Result<TrainStepValues> TrainStep::gradients(int64_t K, const NextBatch& next) {
    LATHE_CHECK(K >= 1, "a step of {} micro-batches", K);
    model_.zero_grads();
    losses_.resize(size_t(K));
    int64_t read = 0;
    auto read_losses = [&](int64_t upto) {
        model_.read_losses(std::span<float>(losses_.data() + read, size_t(upto - read)));
        read = upto;
    };
    for (int64_t k = 0; k < K; ++k) {
        LATHE_ASSIGN_OR_RETURN(const ModelBatch batch, next(k));
        if (k - read == kLossSlots) read_losses(k);
        model_.forward_backward_async(batch, 1.0f / float(K), k - read);
    }
    for (size_t e = 0; e < frozen_.size(); ++e)
        if (frozen_[e]) model_.zero_grad_entry(e);
    TrainStepValues out;
    out.norm = model_.grad_norm();
    read_losses(K);
    double sum = 0.0;
    for (const float l : losses_) sum += l;
    out.loss = float(sum / double(K));
    return out;
}

void TrainStep::apply(double lr, double weight_decay, const AdamWHyper& hyper, int64_t adam_step,
                      float max_grad_norm) {
    const std::vector<AdamWSegment> all = model_.adamw_segments(lr, weight_decay);
    segments_.clear();
    for (size_t i = 0; i < all.size(); ++i)
        if (frozen_.empty() || !frozen_[i]) segments_.push_back(all[i]);
    optimizer_.step(optimizer_target(model_), segments_, hyper, adam_step, max_grad_norm);
}

}  // namespace lathe
