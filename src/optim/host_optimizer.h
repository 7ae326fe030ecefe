#pragma once
// HostOptimizer: AdamW with the f32 masters and both moments in host memory, stepped on the CPU
// by optim/cpu_adamw.h (optimizer.offload: cpu; design in docs/SFT.md, "Optimizer offload").
//
// The split (optimizer.offload_fraction f, ModelShape::offload_fraction): the model's plan puts
// the last units of the parameter arena, elements [B, P) with B = MemoryPlan::offload_begin, on
// the host (model/memory_plan.h, offload_split_begin, says which and why); f = 1 gives B = 0, the
// whole optimizer here. The first B elements keep f32 masters and both moments where the model
// computes (an AdamWOptimizer over [0, B) and, on CUDA, a device buffer of B masters; on the CPU
// backend the model's f32 weights are those masters), stepped by the device AdamW in step()
// before the host part, clipped by the norm in device memory: the device optimizer's bits.
//
// What it owns (P = Model::params_total() elements, the parameter arena's layout, padding
// included and zero; N = P - B offloaded):
//   masters   (P) f32          the master weights; the model reads and writes its entries here
//                              (Model::attach_host_masters, done by create_for). [0, B) is a
//                              mirror of the device part's masters: entry writes reach the
//                              device at the next step() (Model::param_writes), the device's
//                              values reach the mirror at finish() and before any entry is
//                              read or written (Model::set_host_masters_hook)
//   m, v      (N) f32 or bf16  AdamW's moments of [B, P), as optimizer.state_dtype
//   landing   (N) f32          CUDA, and the CPU backend's overlapped schedule: the step's
//                              gradients of [B, P) copied from the model's gradient arena
//   staging   (N) bf16         CUDA: the updated weights' bf16 copy, copied to the device
// On CUDA every buffer is pinned (PinnedHostBuffer: cudaMallocHost), so the copies run at the
// link's speed; on the CPU backend they are plain host memory, there is no staging (the model
// computes with f32 weights, copied from the masters) and the serial schedule has no landing
// buffer (it reads the model's gradients, host memory already).
//
// Clipping needs the global gradient norm before any update: the norm comes from the GPU
// (grad_norm over every gradient, the f32 TrainStep::gradients reads back once the backward is
// done), the float the device optimizer clips by, so the update is bitwise the device
// optimizer's (CpuAdamW's math is ops/adamw.h's). Nothing is updated speculatively. Three
// schedules (optimizer.offload_schedule, OffloadSchedule in model/host_memory_plan.h); the serial
// and the overlapped one give the same bits:
//
// Serial (step()): the whole gradient vector goes device -> landing in one copy on the model's
// stream, waited for; CpuAdamW updates masters and moments over the segments and writes the bf16
// copy into staging; staging goes host -> device on the model's stream, enqueued (the next
// forward, on the same stream, runs after it).
//
// Overlapped: the units of the parameter arena (ShardLayout: the embeddings, each layer, the
// final norm and LM head) move one by one.
//   * Gradients: arm_gradient_copies() (TrainStep, before the step's last micro-batch) makes the
//     gradients-ready hook copy each unit's gradients D2H into landing on the copy stream as
//     soon as its backward is enqueued (the copy stream waits for an event of the compute stream
//     recorded there): the back unit and layer L-1 at the hook's first call, then each layer,
//     the front unit last; an event marks the last copy.
//   * Update: step() waits for that event (the front unit, the last the backward writes, lands
//     just after the backward: the CPU cannot start the forward-order update sooner) and hands
//     the update to a worker thread, which steps the units in forward order (front, layer 0, ...,
//     back), each with the segments inside it, and marks each unit done; step() returns at once.
//   * Weights: the weights-needed hook, before each piece of the next forward (or any forward),
//     waits on the host until the worker has done that unit, enqueues the H2D copies of staging
//     for every unit done so far on the copy stream (one event each), and makes the compute
//     stream wait for its unit's event only: layer l computes while the CPU steps layer l + 1.
//     On the CPU backend the worker copies each unit's masters into the model's f32 weights and
//     the hook waits for the unit on the host; the gradients go to landing by memcpy in the hook.
//   * finish() waits for the worker, enqueues what is left and orders the compute stream after
//     every copy: step() (of the next step), save_state, load_state, read/write_state and the
//     destructor call it; a caller reading the masters (a checkpoint's model.safetensors) first
//     (the public finish() also copies the device part's masters into the mirror).
//   With B > 0 the units before B are neither copied nor stepped here: their gradients stay on
//   the device and the forward waits for nothing before them.
// The H2D copies cover the stepped segments only (adjacent entries merged into one copy), so
// frozen entries keep the weights they were written with.
// The next step's gradient copies rewrite a unit's landing gradients only once the worker has
// stepped that unit (the forward before the backward waited for every unit); the compute
// stream's next zero_grads waits for the landing event (before_zero_grads).
//
// Delayed (a one-step delayed parameter update, as ZeRO-Offload's): the overlapped schedule's
// gradient copies and worker, but the next step computes with the weights it has: update s runs
// on the CPU during step s + 1, whose gradients are those of the weights before update s. Its
// weights reach the model in step s + 1's last backward: the gradients-ready hook, armed, waits
// on the host for the worker's update (long done when the step has several micro-batches), then
// enqueues each unit's H2D copies from staging on the optimizer stream (idle with offload; the
// link carries them beside the gradients' D2H on the copy stream) once the backward is done with
// the unit's weights; after the last unit the compute stream is ordered after them (so a step
// skipped for a non-finite loss, which calls no step(), leaves no copy behind), and step() waits
// on the host for them before the worker rewrites staging. So the GPU never waits for the CPU's
// update, only for the weight copies that outlast the backward. The bits are not the serial
// schedule's (each gradient is one update older); finish() (a checkpoint, a validation pass, an
// entry read or write) applies the update in flight, after which the next step computes with
// current weights: a run's bits depend on where it finishes, and a run resumed from a checkpoint
// goes on as the one that wrote it. Every update on the host: a model whose plan keeps a device
// part (offload_fraction below 1) is refused. No weights-needed hook.
//
// Checkpoints: save_state()/load_state() write and read optim/optimizer_state.h's full file (the
// device part's moments read back and written with the host's), the one the device optimizer of
// one process writes (the moments as f32 over the whole vector: bf16
// moments widened exactly, rounded to nearest even on load), so a checkpoint resumes with or
// without offload. Host memory: f32 moments are written from and read into the pinned moments
// directly; bf16 moments are widened (save) and rounded (load) in chunks of at most 2^24
// elements, so neither holds a copy of the state.
// read_state()/write_state() copy the moments as f32 (tests).
//
// Ownership: move-only; owns its buffers, CpuAdamW's threads and the overlapped schedule's worker
// thread; the overlapped schedule sets the model's gradients-ready and weights-needed hooks and
// the destructor unsets them. The model it was created for must outlive it and not move (the
// hooks and the worker hold its address).

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/host_memory_plan.h"
#include "model/model.h"
#include "ops/adamw.h"
#include "optim/cpu_adamw.h"

namespace lathe {

class HostOptimizer {
public:
    // Buffers for every parameter of `model` (created with ModelShape::masters_on_host, checked:
    // kFailedPrecondition), split at its plan's offload_begin (file comment), moments of
    // `state_dtype` zeroed (the device part's f32), masters zero and attached to the model.
    // threads: CpuAdamW's (0: every core). Errors: allocation failure, CpuAdamW's; the delayed
    // schedule with a device part (kFailedPrecondition). schedule: serial, overlapped or delayed
    // (file comment); overlapped sets the model's hooks, delayed its gradients-ready hook.
    static Result<HostOptimizer> create_for(
        Model& model, AdamWStateDType state_dtype, int threads = 0,
        OffloadSchedule schedule = OffloadSchedule::kOverlapped);

    HostOptimizer(HostOptimizer&&) noexcept;
    HostOptimizer& operator=(HostOptimizer&&) noexcept;
    ~HostOptimizer();

    int64_t total() const { return total_; }
    OffloadSchedule schedule() const { return schedule_; }
    AdamWStateDType state_dtype() const { return state_dtype_; }
    // The f32 masters; with an update in flight (overlapped, delayed), finish() first to read
    // its result.
    std::span<float> masters() const;

    // One AdamW update number `step` of `segments` (Model::adamw_segments) with the gradients in
    // `model`'s gradient arena (file comment). norm: the global gradient norm read back; with
    // max_grad_norm > 0 the gradients count as clipped by it. Overlapped, delayed: returns once
    // the update is handed to the worker (the gradients of a backward without
    // arm_gradient_copies() are copied whole first).
    void step(Model& model, std::span<const AdamWSegment> segments, const AdamWHyper& hyper,
              int64_t step, float norm, float max_grad_norm);

    // Overlapped and delayed schedules (no-ops in the serial one), file comment:
    // the next backward's gradients-ready hook copies the gradients unit by unit (call before
    // the step's last micro-batch, also before its forward: the update in flight goes on).
    void arm_gradient_copies();
    // The compute stream waits for the gradient copies of the last armed backward (enqueued, no
    // host wait): call before the gradients are zeroed.
    void before_zero_grads();
    // Waits for the update in flight and orders the compute stream after its weight copies (the
    // delayed schedule's update reaches the weights here if the last backward did not take
    // it); with a device part (offload_fraction < 1), copies its masters into masters()[0, B):
    // after it masters() holds every current master.
    void finish();
    // Timing of the forward's waits for the CPU (CUDA, for lathe bench): with `on`, the
    // overlapped schedule's weights-needed hook records timing events around its wait (the
    // delayed schedule's forward never waits for the CPU: 0); take_weight_wait_ms() gives
    // the GPU's stalled milliseconds since the last call (call after the compute stream is
    // synchronized) and starts again at 0.
    void set_wait_timing(bool on);
    double take_weight_wait_ms();
    // Overlapped and delayed schedules, with set_update_timing(true): the updates the worker
    // finished since the last call, each as its AdamW step number and its wall milliseconds (from
    // its start to its last unit done), in order; empty otherwise (nothing is kept while timing is
    // off, as in lathe train). For lathe bench's host_update_ms (run/bench.h).
    void set_update_timing(bool on);
    struct HostUpdateTime {
        int64_t step = 0;
        double ms = 0.0;
    };
    std::vector<HostUpdateTime> take_host_updates();

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
    OffloadSchedule schedule_ = OffloadSchedule::kSerial;
};

}  // namespace lathe
