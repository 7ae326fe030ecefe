#pragma once
// Kernel-time breakdown of GPU work (`lathe bench --kernel-breakdown N`): the kernels, copies
// and sets that a profiler recorded (ops/cuda/kernel_profile.h: CUPTI's activity records), each
// put in a group by its name, summed per group, and the time the GPU ran nothing.
//
// Groups (kernel_group, first match in this order, on the lower-cased name):
//   communication  NCCL's kernels ("nccl")
//   attention      cuDNN's fused attention and lathe's own ("cudnn", "fmha", "flash", "sdpa",
//                  "attention", "decode_split", "decode_combine", "docs_bias")
//   gemm           cuBLAS/cuBLASLt matmuls ("gemm", "gemv", "nvjet", "cutlass", "xmma", "cublas")
//   optimizer      AdamW and the gradient norm ("adamw", "grad_scale", "sum_of_squares",
//                  "norm_from_partials")
//   lm_head_ce     the cross-entropy around the LM head's GEMMs ("cross_entropy", "held_row",
//                  "stream_row"); the head's GEMMs themselves are in gemm
//   norms          RMSNorm and LayerNorm ("rmsnorm", "layernorm")
//   fp8_casts      FP8 casts and amaxes ("amax", "cast_transpose", "block_cast", "scales_to_gemm",
//                  "fp8", and "cast_kernel")
//   elementwise    RoPE, SwiGLU, GELU, residual adds, embeddings, bf16/f32 casts, bias
//                  reductions, fills ("rope", "swiglu", "gelu", "residual", "embedding", "cast",
//                  "column_partials", "fill", "add_one")
//   copies         memcpy and memset records (is_copy)
//   other          anything else (named in the top kernels list)
// busy: the length of the union of all records' [start, end) intervals; span: from the first
// start to the last end; gaps = span - busy, the time inside the profiled work when the GPU ran
// nothing (launch latency, host work, waits on the host). Each gap is charged to the record that
// starts when it ends (gap_ms of its group and of its name; `by_gap`: the top_n names with the
// most), so a step's idle time shows which launches wait: on the host (the first kernel of a
// step) or on the GPU's own launch path (a kernel of a graph that starts late after the last).

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace lathe {

struct KernelRecord {
    std::string name;  // a kernel's (demangled where possible); "memcpy ..." / "memset" for copies
    uint64_t start_ns = 0;
    uint64_t end_ns = 0;
    bool is_copy = false;
    uint32_t stream = 0;  // the CUDA stream's id (CUPTI's streamId)
};

std::string_view kernel_group(std::string_view name, bool is_copy = false);

struct KernelTotal {
    std::string name;  // the group's, or the kernel's in `top`
    double ms = 0;     // summed duration
    int64_t count = 0;
    double gap_ms = 0;  // idle time ended by these records' starts
};

struct KernelBreakdown {
    double span_ms = 0;
    double busy_ms = 0;
    std::vector<KernelTotal> groups;  // every group with a record, largest time first
    std::vector<KernelTotal> top;     // the `top_n` kernels (by name) of largest time
    std::vector<KernelTotal> by_gap;  // the `top_n` kernels (by name) of largest gap_ms
};

KernelBreakdown summarize_kernels(std::span<const KernelRecord> records, int top_n);

// The records as a Chrome trace (the JSON object format of the Trace Event Format, which
// Perfetto and chrome://tracing open; `lathe bench --kernel-trace FILE`): one complete event
// ("ph": "X") per record, named as recorded, its group as "cat", "ts" and "dur" in microseconds
// from the first record's start, on thread "stream N" (tid N) of process 0, so that kernels
// that overlap on two streams show side by side; a thread_name metadata event per stream.
std::string kernel_trace_json(std::span<const KernelRecord> records);

}  // namespace lathe
