#pragma once
// HostOptimizer: AdamW with the f32 masters and both moments in host memory, stepped on the CPU
// by optim/cpu_adamw.h (optimizer.offload: cpu, the whole optimizer: offload_fraction 1; design in
// docs/SFT.md, "Optimizer offload").
//
// What it owns, each over the model's whole flat parameter vector (P = Model::params_total()
// elements, the parameter arena's layout, padding included and zero):
//   masters   (P) f32          the master weights; the model reads and writes its entries here
//                              (Model::attach_host_masters, done by create_for)
//   m, v      (P) f32 or bf16  AdamW's moments, as optimizer.state_dtype
//   landing   (P) f32          CUDA: the step's gradients copied from the device
//   staging   (P) bf16         CUDA: the updated weights' bf16 copy, copied to the device
// On CUDA every buffer is pinned (PinnedHostBuffer: cudaMallocHost), so the copies run at the
// link's speed; on the CPU backend they are plain host memory, there is no landing buffer (the
// model's gradients are host memory already) and no staging (the model computes with f32
// weights, which step() copies from the masters).
//
// One step (step()): after the backward and the gradient norm (TrainStep::gradients), the whole
// gradient vector goes device -> landing in one copy on the model's stream, waited for; CpuAdamW
// updates masters and moments over the segments and writes the bf16 copy into staging; staging
// goes host -> device in one copy on the model's stream, enqueued (the next forward, on the same
// stream, runs after it; the next step's gradient copy waits for it before staging is written
// again). Clipping uses the norm read back, the float the device optimizer clips by, so the
// update is bitwise the device optimizer's (CpuAdamW's math is ops/adamw.h's).
//
// Checkpoints: save_state()/load_state() write and read optim/optimizer_state.h's full file, the
// one the device optimizer of one process writes (the moments as f32 over the whole vector: bf16
// moments widened exactly, rounded to nearest even on load), so a checkpoint resumes with or
// without offload. Host memory: f32 moments are written from and read into the pinned moments
// directly; bf16 moments are widened (save) and rounded (load) in chunks of at most 2^24
// elements, so neither holds a copy of the state.
// read_state()/write_state() copy the moments as f32 (tests).
//
// Ownership: move-only; owns its buffers and CpuAdamW's threads. The model it was created for
// must outlive it or detach the masters (attach_host_masters({})) first.

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "core/status.h"
#include "model/host_memory_plan.h"
#include "model/model.h"
#include "ops/adamw.h"
#include "optim/cpu_adamw.h"

namespace lathe {

class HostOptimizer {
public:
    // Buffers for every parameter of `model` (created with ModelShape::masters_on_host, checked:
    // kFailedPrecondition), moments of `state_dtype` zeroed, masters zero and attached to the
    // model. threads: CpuAdamW's (0: every core). Errors: allocation failure, CpuAdamW's.
    static Result<HostOptimizer> create_for(Model& model, AdamWStateDType state_dtype,
                                            int threads = 0);

    HostOptimizer(HostOptimizer&&) noexcept;
    HostOptimizer& operator=(HostOptimizer&&) noexcept;
    ~HostOptimizer();

    int64_t total() const { return total_; }
    AdamWStateDType state_dtype() const { return state_dtype_; }
    std::span<float> masters() const;

    // One AdamW update number `step` of `segments` (Model::adamw_segments) with the gradients in
    // `model`'s gradient arena (file comment). norm: the global gradient norm read back; with
    // max_grad_norm > 0 the gradients count as clipped by it.
    void step(Model& model, std::span<const AdamWSegment> segments, const AdamWHyper& hyper,
              int64_t step, float norm, float max_grad_norm);

    // Writes the full optimizer state file `path` (optimizer_state_write's bytes).
    Status save_state(const std::string& path);
    // Reads the moments from the checkpoint folder `dir` (the full file or a complete shard set
    // of any world, optimizer_state_load_ranges) over the canonical elements [0, used), used <=
    // total() (checked); the rest become zero. Errors: the loader's.
    Status load_state(const std::string& dir, int64_t used);

    // The moments as f32, total() elements each (checked).
    void read_state(std::span<float> exp_avg, std::span<float> exp_avg_sq) const;
    void write_state(std::span<const float> exp_avg, std::span<const float> exp_avg_sq);

private:
    struct Impl;
    explicit HostOptimizer(std::unique_ptr<Impl> impl);
    std::unique_ptr<Impl> impl_;
    int64_t total_ = 0;
    AdamWStateDType state_dtype_ = AdamWStateDType::kF32;
};

}  // namespace lathe
