#include "model/param_staging.h"

#include "core/check.h"
#include "model/model.h"

namespace lathe {

ParamStaging::ParamStaging(const Model& model)
    : model_(&model),
      in_place_(model.context().backend == Backend::kCpu && !model.params_sharded() &&
                model.host_masters().empty()) {
    masters_ = !model.host_masters().empty() && !model.params_sharded();
    if (masters_)
        used_.assign(model.plan().params.size(), 0);
    else if (!in_place_)
        copies_.resize(model.plan().params.size());
}

TensorView ParamStaging::host(size_t arena_index) {
    if (in_place_) return model_->param_entry(arena_index);
    if (masters_) {
        const ArenaEntry& e = model_->plan().params.entries().at(arena_index);
        used_[arena_index] = 1;
        return TensorView(model_->host_masters().data() + e.offset / sizeof(float), e.dtype,
                          e.shape, Device::kCpu);
    }
    LATHE_CHECK(arena_index < copies_.size(), "parameter arena entry {} of {}", arena_index,
                copies_.size());
    HostTensor& copy = copies_[arena_index];
    if (copy.view().data() == nullptr) {  // not staged yet (a default HostTensor holds nothing)
        const ArenaEntry& e = model_->plan().params.entries()[arena_index];
        copy = HostTensor(e.dtype, e.shape);
    }
    return copy.view();
}

void ParamStaging::download(size_t arena_index) {
    if (in_place_ || masters_) return;
    model_->read_param_entry(arena_index, host(arena_index));
}

void ParamStaging::download_all() {
    for (size_t i = 0; i < model_->plan().params.size(); ++i) download(i);
}

void ParamStaging::upload_entry(Model& model, size_t arena_index) {
    LATHE_CHECK(&model == model_, "ParamStaging::upload into another model than its own");
    if (in_place_) return;
    if (masters_) {
        if (used_.at(arena_index)) model.write_param_entry(arena_index, host(arena_index));
        return;
    }
    const HostTensor& copy = copies_.at(arena_index);
    if (copy.view().data() != nullptr) model.write_param_entry(arena_index, copy.view());
}

void ParamStaging::upload(Model& model, size_t arena_index) {
    upload_entry(model, arena_index);
    model.synchronize();
}

void ParamStaging::release(size_t arena_index) {
    if (in_place_ || masters_) return;
    copies_.at(arena_index) = HostTensor();
}

void ParamStaging::upload_all(Model& model) {
    LATHE_CHECK(&model == model_, "ParamStaging::upload_all into another model than its own");
    for (size_t i = 0; i < (masters_ ? used_.size() : copies_.size()); ++i) upload_entry(model, i);
    model.synchronize();
}

}  // namespace lathe
