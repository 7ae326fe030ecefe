#pragma once
// ParamStaging: host views of a model's parameters, one per parameter arena entry (the arena
// layout and dtype, f32 masters), for the work that reads or writes them on the host: init,
// loading and saving (model_io.h). Made when such work starts and dropped after it; the training
// step never uses one.
//
// On the CPU the views are the model's own arena (no copy; download and upload do nothing). On
// CUDA they are host copies, allocated zeroed on first use of an entry and freed with the object
// or by release():
// download() fills them from the model, upload() writes them back (Model::write_param_entry,
// which refreshes the bf16 compute copy). Memory: at most the parameter arena's bytes on the host.
// With host masters attached (Model::attach_host_masters, optimizer offload) the views are the
// host masters themselves on either backend (no copy): download does nothing, upload writes the
// entries used so far into the weights the model computes with (write_param_entry).

#include <cstddef>
#include <vector>

#include "core/tensor.h"

namespace lathe {

class Model;

class ParamStaging {
public:
    // Staging for `model`, which must outlive this object.
    explicit ParamStaging(const Model& model);

    // The host view of parameter arena entry `arena_index` (index into plan().params).
    TensorView host(size_t arena_index);
    // Copies entry `arena_index` / every entry from the model into the host views.
    void download(size_t arena_index);
    void download_all();
    // Writes the host view of entry `arena_index` / of every entry used so far back into
    // `model` (the model this staging was made for, checked), then waits for the GPU.
    void upload(Model& model, size_t arena_index);
    void upload_all(Model& model);
    // Frees the host copy of entry `arena_index` (CUDA; nothing on the other views): work that
    // uploads entry by entry holds one entry's copy at a time. A later host() of it starts zeroed.
    void release(size_t arena_index);

private:
    void upload_entry(Model& model, size_t arena_index);

    const Model* model_ = nullptr;
    bool in_place_ = false;           // the model's arena is host memory: the views are it
    bool masters_ = false;            // the views are the model's host masters
    std::vector<char> used_;          // masters_: the entries host() gave out
    std::vector<HostTensor> copies_;  // CUDA: one per arena entry, empty until first used
};

}  // namespace lathe
