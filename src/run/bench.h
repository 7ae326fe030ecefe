#pragma once
// `lathe bench`: training throughput of one model shape on random data, measured as `lathe train`
// runs a step, reported as one JSON line (tokens/s, step time, MFU, memory).
//
// The model is a preset (bench_model_presets(): the real GPT-2 small and Llama-3.2-1B configs,
// and tiny ones for tests) or any Hugging Face config.json, built through the same path as
// `lathe train`'s `model.config` (io/hf_config.h -> model/registry.h). Parameters are random
// (Model::init), batches are random token ids (seeded; each row's targets are its tokens shifted
// by one). After `warmup` untimed steps, `steps` steps are timed one by one, each ending when
// the device has finished it (a stream synchronize on CUDA), as torch_baseline.py times its steps.
// A step is `lathe train`'s optimizer step: --accum K micro-batches of B sequences (forward and
// backward each), then the norm, clipping and one update.
//
// Definitions (the same as ../shared/bench/torch_baseline.py, so the two compare directly):
//   tokens_per_s     K * B * T / median step time (K = --accum, micro-batches a step)
//   s_per_it         the median step time in seconds (a step: K forward+backward passes, the
//                    gradient norm, one optimizer update)
//   flops_per_token  6 N + 12 L C T (PaLM's convention), N = the parameters without the input
//                    embedding tables (token and learned positions), with the LM head: a tied
//                    model counts its embedding once, as the head
//   mfu              tokens_per_s * flops_per_token / 989.4e12 on a Hopper GPU (H100 SXM dense
//                    bf16); null on the CPU and on other GPUs (no agreed peak)
//   peak memory      CUDA: device memory in use (cudaMemGetInfo total - free) after each step,
//                    the largest, minus the memory in use before the bench created anything;
//                    transient allocations inside a step that are freed before it ends are not
//                    seen (lathe allocates nothing per step). CPU: the process's peak resident
//                    set (getrusage ru_maxrss), everything included.
//
// Under a launcher (`lathe launch --gpus W lathe bench ...`, torchrun, srun, mpirun; run/world.h)
// the W ranks train one model as `lathe train` does: the same DataParallel (run/data_parallel.h,
// ZeRO stage --zero-stage) passed to the same TrainStep, the same parameters on every rank (one
// seed), each rank its own random batches (seed + rank), B sequences per rank. Each rank times
// its own steps; the ranks' numbers are gathered (dist/host_collectives.h) and rank 0 alone
// prints the line (the others print nothing on stdout and log warnings only):
//   tokens_per_s          the world's: sum over ranks r of B * T / (rank r's median step time)
//   tokens_per_s_per_gpu  tokens_per_s / W
//   mfu                   per GPU: tokens_per_s_per_gpu * flops_per_token / peak
//   comm_wait_ms          per step, the time the compute waited on communication
//                         (DataParallel::comm_wait_ms): each rank's median over the timed
//                         steps, the largest over the ranks
//   peak_memory_bytes     the largest over the ranks (each measured as above); plan_error
//                         against one rank's plan
//   plan_bytes, plan      one rank's memory plan (parameters, gradients, optimizer shard, ...)
//   lm_head_rows          the LM head's chunk of logit rows in that plan (--lm-head-rows, or the
//                         plan's budget when 0)
//   step_ms_*, loss_*     rank 0's step times; the loss and norm of the whole world's batch
//   world_size, zero_stage, launcher
// A single process adds only world_size 1 to the keys above.
//
// Precision (--precision): bf16 (the CUDA backend's; the CPU computes in fp32) or fp8, the
// block's linears (q, k, v, attention output, MLP up and down) in fp8 with --fp8-recipe
// tensorwise, delayed or blockwise (model/fp8_state.h), as `lathe train` with train.precision fp8:
// a GPU with FP8 tensor cores (else an error naming it, never a fallback), the FP8 self-test before
// the first step, and every step's FP8 GEMM count checked against fp8_gemms_per_step. The line's
// fields are the same in both, so that an fp8 line compares with a bf16 one of the same shape
// (mfu: against the same bf16 peak); "precision" says which, and an fp8 line adds fp8_recipe,
// fp8_gemms_per_step (the count the linear ops made each timed step) and
// fp8_weight_casts_per_step (weights cast to fp8: once per step each).
//
// Optimizer schedule (--optimizer-schedule, optimizer.schedule; without --offload): serial or
// overlapped (optim/adamw_optimizer.h: the device AdamW unit by unit on the optimizer stream
// while the next forward waits per unit). Overlapped, a step's time runs from its start to the
// next step's start, as with offload (the last: to where a next step would start). The line's
// "optimizer_schedule" says which (absent with --offload, whose offload_schedule says it), and
// "optimizer_sms" the SMs --optimizer-sms leaves to the overlapped update (0: none).
//
// GEMM algorithm search (--gemm-search, on by default; ops/cuda/gemm.h): on CUDA the line's
// "gemm_search" says whether it ran, "gemm_searched" and "gemm_faster" count the problems it
// timed and those that kept a faster candidate than cuBLASLt's heuristic's first (the same bits
// either way), and "gemm_saved_ms" sums those problems' gains, one launch each, as timed.
//
// Kernel breakdown (--kernel-breakdown N, CUDA): after the timed steps, N more steps run with
// CUPTI recording every kernel, copy and set (ops/cuda/kernel_profile.h; CUPTI slows launches, so
// these steps are not timed ones). The line adds "kernels": steps N, span_ms_per_step (first
// kernel start to last kernel end, over N), busy_ms_per_step (the union of the records' intervals),
// gaps_ms_per_step (span - busy: the GPU idle inside the work), groups (ops/kernel_groups.h's,
// largest first, each name, ms_per_step, launches_per_step, gap_ms_per_step (the idle time its
// records' starts end) and share = ms / busy; kernels that overlap on two streams make the shares
// sum above 1), top (the 12 kernels of largest time, the same keys less share) and by_gap (the 12
// kernels of largest gap_ms_per_step). Under a launcher each rank profiles its own process;
// rank 0's breakdown is the line's. --kernel-trace FILE (with --kernel-breakdown) writes the
// profiled steps' records to FILE as a Chrome trace, one track per stream
// (ops/kernel_groups.h's kernel_trace_json), and names it as kernels.trace.
//
// Optimizer offload (--offload cpu, one process): the step of `lathe train` with
// optimizer.offload: cpu (optim/host_optimizer.h): the model holds no device masters, the
// HostOptimizer's pinned host buffers (checked against the host's memory first) hold the masters
// and moments, the step times include the gradients' D2H copy, the CPU AdamW and the bf16
// weights' H2D copy. --state-dtype bf16 stores the moments in bf16; --offload-schedule serial,
// overlapped or delayed (optimizer.offload_schedule); --offload-fraction F offloads the last units
// holding at least F of the parameters and steps the rest on the device
// (optimizer.offload_fraction, ModelShape::offload_fraction; the plans count both parts). A step's
// time runs from its start to the next step's start (the last: to where a next step would start,
// its update in flight), since the overlapped update ends inside the next step's forward: each
// timed step holds the forward's wait for one update, its predecessor's (the first timed step's:
// the warmup's). The line adds offload, state_dtype, offload_schedule, offload_fraction,
// offloaded_params, host_pinned_bytes (the host memory plan's pinned total), host_peak_rss_bytes
// (getrusage's peak resident set) and, on CUDA, gpu_busy_fraction: over the timed steps, the
// compute stream's time from each step's first forward kernel to its gradient norm (timing events),
// less the forward's waits for weights the CPU was still updating (timing events around each wait,
// HostOptimizer::set_wait_timing), over the steps' wall time, and gpu_weight_wait_ms, those waits'
// milliseconds a timed step (mean; 0 under the delayed schedule, whose forward never waits for the
// CPU: its GPU idles only for the weight copies past the norm, outside the busy span). The
// overlapped and delayed schedules add host_update_ms and
// host_update_ms_max: the CPU update of a timed step's gradients, from the worker's start to its
// last unit done (HostOptimizer::take_host_updates, by AdamW step number), mean and largest, and
// host_updates, how many (one a timed step). The host plan is printed
// under the device's table (with --plan-only too).

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "core/status.h"
#include "dist/process_group.h"
#include "model/fp8_state.h"
#include "model/host_memory_plan.h"
#include "model/memory_plan.h"
#include "model/model_config.h"
#include "ops/context.h"
#include "ops/kernel_groups.h"
#include "optim/adamw_optimizer.h"

namespace lathe {

enum class BenchDevice { kAuto, kCpu, kCuda };

struct BenchRequest {
    std::string model;   // a preset name, or a config.json file / a folder holding one
    int64_t batch = 0;   // B
    int64_t seq = 0;     // T
    int64_t steps = 10;  // timed steps
    int64_t warmup = 2;  // untimed steps first (cuBLASLt heuristics, caches, lazy loading)
    int64_t accum = 1;   // K: micro-batches of B sequences per step (gradient accumulation)
    BenchDevice device = BenchDevice::kAuto;
    std::optional<int64_t> vocab_size;       // overrides the config's (e.g. GPT-2 padded to 50304)
    uint64_t seed = 1234;                    // parameters and batches
    int threads = 0;                         // CPU: OpenMP threads, 0 = all cores
    bool plan_only = false;                  // report the shape and memory plan; run nothing
    bool nondeterministic = false;           // Context::deterministic = false (train.deterministic)
    Recompute recompute = Recompute::kNone;  // train.recompute's modes
    int zero_stage = 1;   // parallel.zero_stage of a run of several ranks (ignored by one process)
    int plan_ranks = 1;   // with plan_only: plan one rank of this many at zero_stage
    int plan_tensor = 1;  // with plan_only: ... of which groups of this many are tensor parallel
    bool plan_sequence_parallel = true;  // with plan_tensor > 1: parallel.sequence_parallel
    std::optional<Fp8Settings> fp8;      // --precision fp8 (its recipe); nullopt: bf16
    // --offload cpu: optimizer.offload with the whole optimizer on the host
    // (optim/host_optimizer.h), one process. --state-dtype: the moments' storage (the host's
    // with offload, the device optimizer's without).
    OptimizerOffload offload = OptimizerOffload::kNone;
    AdamWStateDType state_dtype = AdamWStateDType::kF32;
    OffloadSchedule offload_schedule = OffloadSchedule::kOverlapped;  // --offload-schedule
    double offload_fraction = 1.0;  // --offload-fraction: optimizer.offload_fraction, (0, 1]
    // --optimizer-schedule: the device optimizer's (one process, no offload; bench.h).
    OptimizerSchedule optimizer_schedule = OptimizerSchedule::kSerial;
    // --lm-head-rows: ModelShape::lm_head_chunk_rows (0: the plan's budget).
    int64_t lm_head_rows = 0;
    // --optimizer-sms: optimizer.overlap_sms (AdamWOptimizer::overlap_with), overlapped only.
    int optimizer_sms = 0;
    // --gemm-search on|off: CudaState::gemm_search (ops/cuda/gemm.h); CUDA only.
    bool gemm_search = true;
    // --kernel-breakdown N: N more steps after the timed ones, recorded by CUPTI (CUDA only;
    // kernel_breakdown below); 0: none.
    int64_t kernel_breakdown_steps = 0;
    // --kernel-trace FILE: the breakdown's records as a Chrome trace (kernel_trace_json), written
    // whole or not at all; needs kernel_breakdown_steps > 0 (training bench only).
    std::string kernel_trace;
};

struct BenchPreset {
    std::string_view name;
    std::string_view description;
    std::string_view config_json;  // a Hugging Face config.json
};

// The presets: gpt2-124m, llama-1b, llama3-8b, llama3-8b-8l, llama3-8b-10l, llama2-13b, tiny (a
// Llama-family model of 2 layers), tiny-gpt2.
std::span<const BenchPreset> bench_model_presets();

// The ModelConfig of a preset name or config.json path, with `vocab_size` applied. Errors: an
// unknown name that is no file either (listing the presets), and those of the config parser.
Result<ModelConfig> bench_model_config(std::string_view model, std::optional<int64_t> vocab_size);

// N of flops_per_token: parameters without the input embedding tables (see above).
int64_t bench_flop_parameters(const ModelConfig& config);
// 6 N + 12 L C T.
double bench_flops_per_token(const ModelConfig& config, int64_t seq);

// Peak dense bf16 FLOP/s of a GPU of compute capability major.minor for MFU, or 0 when lathe has
// no agreed figure (only Hopper: 989.4e12).
double bench_peak_flops(int cc_major, int cc_minor);

// Where a bench computes: the CPU, or the CUDA device of this process (GPU <local rank> of the
// visible ones: GPU 0 for a single process).
struct BenchPlacement {
    Backend backend = Backend::kCpu;
    int ordinal = 0;        // CUDA device
    std::string name;       // "cpu (16 threads)", "NVIDIA H100 80GB HBM3"
    double peak_flops = 0;  // for MFU; 0 = none
};
// The placement for --device `wanted` (auto takes a usable GPU, else the CPU with a note in the
// log). Errors: cuda without a usable GPU.
Result<BenchPlacement> bench_placement(BenchDevice wanted, const ProcessGroupInfo& group);

// Runs the benchmark and returns its JSON line (no newline); on a rank other than 0 of several,
// an empty string (nothing to print). Progress goes to stderr (log). Every rank of a launcher's
// world calls it with the same request.
// Errors: a bad request (B, T, steps out of range, T beyond the model's positions, a ZeRO stage
// outside 0..3 or one DataParallel does not run), --device cuda without a usable GPU, a plan that
// does not fit the machine's memory (on any rank: every rank stops), the launcher's variables
// and the rendezvous (run/world.h), model creation failures, a collective's failure.
Result<std::string> bench_run(const BenchRequest& request);

// Kernel breakdown ("Kernel breakdown" above): runs step(0) .. step(steps - 1) under CUPTI
// (ops/cuda/kernel_profile.h), `synchronize` (the device's, after any pending optimizer update)
// called before the profile starts and after the last step, and sums what they ran (the 12 kernels
// of largest time in top). Errors: CUPTI cannot start (failed precondition) or stop, or a step's
// error (the profile stopped). `records`, when given, receives every record of the profiled steps.
Result<KernelBreakdown> bench_kernel_breakdown(int64_t steps,
                                               const std::function<Status(int64_t)>& step,
                                               const std::function<void()>& synchronize,
                                               std::vector<KernelRecord>* records = nullptr);
// The line's "kernels" object for a breakdown of `steps` steps (the fields above).
nlohmann::ordered_json bench_kernel_breakdown_json(const KernelBreakdown& kernels, int64_t steps);

}  // namespace lathe
