#pragma once
// Optimizer offload's settings and its host memory plan: what a training run with
// optimizer.offload: cpu keeps in pinned host memory, what that saves on the GPU, and whether
// the host has it.
//
// Design (docs/SFT.md, "Optimizer offload"). A fraction f of the parameters, the last units of
// the parameter arena holding N >= ceil(f * P) of its P elements (offload_split_begin in
// model/memory_plan.h: the elements [P - N, P)), is stepped on the host by optim/cpu_adamw.h
// instead of on the GPU:
//   masters          N f32                 the FP32 master weights of those parameters
//   moments          2 N state_dtype       AdamW's exp_avg and exp_avg_sq (f32, or bf16 with
//                                          optimizer.state_dtype: bf16)
//   gradient landing N f32                 the step's gradients, copied D2H layer by layer on a
//                                          copy stream as the backward finishes each layer; the
//                                          whole step's, since clipping needs the global norm
//                                          before the first update
//   weight staging   N bf16                the updated weights' bf16 copy the CPU AdamW writes,
//                                          copied H2D layer by layer ahead of the next forward
//   master mirror    (P - N) f32           with f < 1: a host copy of the masters that stay on
//                                          the GPU, which the model's entry reads and writes
//                                          (init, checkpoints) go through as they do for the
//                                          offloaded masters; refreshed from the GPU when a
//                                          caller asks for the masters (HostOptimizer::finish)
// all pinned (page-locked), so the copies run at full link speed without a bounce buffer.
// The GPU keeps the bf16 compute copy and the f32 gradients of every parameter and gives up the
// masters and both moments of the N: 12 N bytes saved (8 N with bf16 moments).
// The rest (P - N parameters) stays as it is: masters and moments on the GPU, stepped there by
// the device AdamW (the GPU's memory plan counts them, model/memory_plan.h).
//
// Host memory available (host_memory_available): /proc/meminfo's MemAvailable, lowered to the
// room left under a cgroup's memory limit when the process runs in one (cgroup v2:
// memory.max - memory.current of the process's cgroup; v1: memory.limit_in_bytes -
// memory.usage_in_bytes), since pinned pages count against the cgroup. The parsing is separate
// from the reading (host_memory_available_from), so tests give it fake files.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "core/status.h"

namespace lathe {

// optimizer.offload: where the AdamW state of the offloaded fraction lives.
enum class OptimizerOffload { kNone, kCpu };
const char* optimizer_offload_name(OptimizerOffload o);  // "none" | "cpu"

// optimizer.state_dtype: the storage of AdamW's moments.
enum class AdamWStateDType { kF32, kBF16 };
const char* adamw_state_dtype_name(AdamWStateDType d);  // "fp32" | "bf16"
size_t adamw_state_dtype_bytes(AdamWStateDType d);      // 4 | 2

// optimizer.offload_schedule: how the offloaded step meets the GPU's (optim/host_optimizer.h):
// serial (whole-vector copies after the backward, the CPU update, then the next forward) or
// overlapped (unit by unit: gradient copies during the backward, the update on a worker thread
// while the next forward waits per layer), the same bits; or delayed (the update of step s runs
// on the CPU during step s + 1, which computes with the weights before it: a one-step delayed
// parameter update, other bits; every optimizer update on the host, offload_fraction 1).
enum class OffloadSchedule { kSerial, kOverlapped, kDelayed };
const char* offload_schedule_name(OffloadSchedule s);  // "serial" | "overlapped" | "delayed"

struct OffloadSettings {
    OptimizerOffload offload = OptimizerOffload::kNone;
    double fraction = 1.0;  // optimizer.offload_fraction, in (0, 1]
    AdamWStateDType state_dtype = AdamWStateDType::kF32;
    OffloadSchedule schedule = OffloadSchedule::kOverlapped;
};

struct HostMemoryPlan {
    int64_t params = 0;                // P
    int64_t offloaded_params = 0;      // N (0 with offload none)
    int64_t master_bytes = 0;          // 4 N
    int64_t master_mirror_bytes = 0;   // 4 (P - N)
    int64_t moment_bytes = 0;          // 2 N state bytes
    int64_t grad_landing_bytes = 0;    // 4 N
    int64_t weight_staging_bytes = 0;  // 2 N
    int64_t gpu_bytes_saved = 0;       // 12 N

    int64_t pinned_bytes() const {
        return master_bytes + master_mirror_bytes + moment_bytes + grad_landing_bytes +
               weight_staging_bytes;
    }
    // One line per buffer and the total, as model/memory_plan.h prints its table.
    std::string to_string() const;
};

// The plan for P = params parameters of which [offload_begin, P) are offloaded (MemoryPlan::
// offload_begin, the split settings.fraction gives). Errors (kInvalidArgument): params < 0,
// offload_begin outside [0, P], a fraction outside (0, 1].
Result<HostMemoryPlan> host_memory_plan(int64_t params, int64_t offload_begin,
                                        const OffloadSettings& settings);

struct HostMemoryAvailable {
    int64_t mem_available = 0;           // /proc/meminfo MemAvailable, bytes
    std::optional<int64_t> cgroup_room;  // cgroup limit - usage, bytes, when limited
    std::string cgroup_source;           // the limit's file, when limited
    int64_t bytes() const;               // the smaller of the two
};

// From the files' text: meminfo the text of /proc/meminfo; for cgroup v2 the text of memory.max
// and memory.current (empty: no such file); for v1 the text of memory.limit_in_bytes and
// memory.usage_in_bytes (empty: none). "max" (v2) or a v1 limit above the physical memory means
// no limit. Errors (kInvalidArgument): no MemAvailable line, a number that does not parse.
Result<HostMemoryAvailable> host_memory_available_from(std::string_view meminfo,
                                                       std::string_view v2_max,
                                                       std::string_view v2_current,
                                                       std::string_view v1_limit,
                                                       std::string_view v1_usage);

// Reads /proc/meminfo and the process's cgroup files (/proc/self/cgroup names the cgroup under
// /sys/fs/cgroup). Errors: /proc/meminfo unreadable or unparsable.
Result<HostMemoryAvailable> host_memory_available();

// ok when plan.pinned_bytes() fit in avail.bytes(); else kFailedPrecondition: "optimizer offload
// needs X GiB of pinned host memory (...), Y GiB available (...); lower
// optimizer.offload_fraction or use optimizer.state_dtype: bf16".
Status host_memory_check(const HostMemoryPlan& plan, const HostMemoryAvailable& avail);

}  // namespace lathe
