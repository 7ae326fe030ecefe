#pragma once
// CUDA attention (ops/attention.h has the math and the layouts) through the cuDNN frontend's
// graph API: cuDNN's fused flash-attention forward and backward ("SDPA").
//   forward:  out (B, T, H, D), lse (B, H, T) f32 from q (B, T, H, D), k, v (B, T, Hkv, D)
//   backward: dq, dk, dv (overwritten) from dout, q, k, v, out and lse (f32)
// (all bf16 but lse).
// Causal always; GQA (Hkv divides H) natively; a sliding window as cuDNN's diagonal band
// (left bound = window: keys t - window < j <= t); per-document masks (docs (B, T) i32) as an
// additive bf16 bias (B, 1, T, T), 0 where docs[b, j] == docs[b, t] and -1e9 elsewhere, written by
// a small kernel before each call. cuDNN's softmax stats are max + ln(sum exp) of the scaled (and
// biased) scores, which is our lse exactly (natural log, masked keys contribute exp(-1e9) = 0).
// The backward uses cuDNN's deterministic algorithm (two runs give the same bits) unless the shape
// asks for the nondeterministic one (AttentionShape::nondeterministic_backward).
//
// Graphs: one per distinct (direction, B, T, H, Hkv, D, window, docs or not, scale, algorithm,
// Tkv, kv_rows, qkv_heads), built at first use (or by attention_prepare) and cached in the
// CudaState, at most kAttentionGraphLimit of them (attention_limit_graphs): building one more into
// a full cache first waits for the stream, then drops the least recently used graph
// (ops/lru_cache.h). A training run has a handful of shapes and never reaches the bound, so its
// graphs are built once; inference, whose prompt lengths vary, keeps the memory of its graphs
// bounded. The workspace cuDNN asks for and the docs bias live in buffers of the state that grow
// only when a graph is built (waiting for the stream first), never per call. Call attention_prepare
// for every shape before step 1 (and before capturing a CUDA graph): building allocates and
// synchronizes. Limits (cuDNN's): D <= 128 and D % 8 == 0; bf16 only; sm_80 or newer.
//
// Queries that continue a cache (AttentionShape::Tkv: the dispatcher's Tq < Tk at q_offset, keys
// 0 .. q_offset + Tq - 1) run cuDNN's forward with a bottom-right aligned causal mask (and the
// window as its left bound), when cuDNN takes the shape: no docs (cuDNN's bottom-right mask takes
// no bias), D <= 128. When cuDNN declines such a graph (an older cuDNN), the call runs
// attention_forward_rows instead, and the cache remembers the decline. Documents at an offset and
// the decode step over per-row lengths always run attention_forward_rows, lathe's own kernel
// (ops/cuda/attention_rows.cu): cuDNN's padded-length decode would need a graph per (B, Tmax).
// The kernel: one block per (query row, head), four warps splitting the keys, an online softmax in
// fp32 per warp, merged at the end; bf16 in and out. Correct first: its speed is not tuned (no
// tensor cores, keys re-read by each query head of a group and by each query row of a chunk).
// The decode step runs a split-K path instead when D % 8 == 0 and the caches are 16-byte aligned
// (always, for the engine's caches): blocks of (row, kv head, key split) that serve all the query
// heads of the group, partial softmax states in the op scratch, merged in split order by a second
// kernel (deterministic: the splits depend on the shape, the lengths and the SM count only).
// Device pointers; enqueued on `stream` (the state's). Internal to ops/cuda, CUDA-header free.

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"

struct CUstream_st;

namespace lathe {
struct CudaState;
}

namespace lathe::cuda {

// What identifies one attention problem (and its cached graphs). T is the query length (and the
// key length of the training form).
struct AttentionShape {
    int64_t B = 0, T = 0, H = 0, Hkv = 0, D = 0;
    int64_t window = 0;  // 0: none
    bool docs = false;   // per-document masking
    float scale = 0.0f;
    // The backward's default is cuDNN's deterministic algorithm, which keeps a partial dQ per
    // block of 128 keys in its workspace (about ceil(T / 128) x B x H x T x D x 4 bytes: 0.75 GiB
    // at GPT-2 124M's shape, 2.1 GiB at Llama-1B's). true picks cuDNN's atomic-add dQ instead:
    // far less workspace, results that may differ in the last bits from run to run.
    bool nondeterministic_backward = false;
    // 0: the backward runs the whole batch in one cuDNN call. Otherwise a bound on its workspace:
    // when the whole batch's graph asks for more, the backward runs as B / Bc calls on Bc batch
    // rows each (Bc the largest divisor of B that fits; 1 when none does), with a workspace Bc / B
    // the size. Same results (the rows are independent), a little slower (docs/CUDA.md).
    // The training model sets it from its Context (Context::attention_backward_workspace_cap).
    size_t backward_workspace_cap = 0;
    // 0: the training form (T keys, query i at position i). Otherwise the forward-only form of
    // queries that continue a cache: the T queries sit at positions Tkv - T .. Tkv - 1 and see keys
    // 0 .. Tkv - 1 (cuDNN's bottom-right diagonal alignment; no docs); k and v hold kv_rows >= Tkv
    // rows per batch row (0: Tkv), the rows past Tkv unread.
    int64_t Tkv = 0;
    int64_t kv_rows = 0;
    // 0: q, k, v (and the backward's dq, dk, dv) are tensors of their own, (B, T, H, D) and
    // (B, T, Hkv, D). Otherwise H + 2 Hkv, and they are head slices of one (B, T, H + 2 Hkv, D)
    // buffer, what one GEMM over the stacked q, k, v weight writes: q the heads [0, H), k the next
    // Hkv, v the last Hkv (the callers pass the three slices' first elements); dq, dk, dv likewise
    // of one gradient buffer. out and dout stay (B, T, H, D). The training form only (Tkv 0).
    int64_t qkv_heads = 0;
};

// Batch rows one deterministic backward call takes for B rows whose whole-batch workspace is
// `whole_bytes`, under `cap` (AttentionShape::backward_workspace_cap): B when cap is 0 or the whole
// batch fits; else the largest divisor of B whose share (whole_bytes * rows / B: cuDNN's workspace
// grows linearly with B, a partial dQ per row) fits the cap; 1 when none does (the cap is then
// exceeded, as little as possible). The memory plan chooses its estimate's chunk with it too.
inline int64_t attention_backward_chunk_rows(int64_t B, size_t whole_bytes, size_t cap) {
    if (cap == 0 || whole_bytes <= cap) return B;
    const double per_row = double(whole_bytes) / double(B);
    for (int64_t c = B - 1; c >= 1; --c)
        if (B % c == 0 && per_row * double(c) <= double(cap)) return c;
    return 1;
}

// The graphs a CudaState keeps at most unless attention_limit_graphs says otherwise: a training
// run uses 2 or 3 per distinct shape; 64 leaves room for many prompt lengths at a few MB of host
// memory (cuDNN plans) and no device memory (workspaces are shared).
inline constexpr size_t kAttentionGraphLimit = 64;

// Sets the bound on the state's cached graphs (>= 4: a call holds up to three graphs at once),
// evicting the least recently used beyond it (after waiting for the stream).
void attention_limit_graphs(CudaState& state, size_t limit);
// The graphs the state holds now, and how many it has evicted (for tests and logs).
size_t attention_graph_count(const CudaState& state);
size_t attention_graph_evictions(const CudaState& state);

// One inference attention problem for attention_forward_rows.
struct AttentionRowsShape {
    int64_t B = 0, Tq = 0, Tk = 0, H = 0, Hkv = 0, D = 0;
    int64_t q_offset = 0;  // query i is at position q_offset + i (with lengths: unused)
    int64_t window = 0;    // 0: none
    float scale = 0.0f;
};

// Inference attention (the math of ops/attention.h) with lathe's kernels, no cuDNN, nothing
// allocated (the decode path's partials use the state's op scratch): out (B, Tq, H, D) bf16, lse
// (B, H, Tq) f32 from q (B, Tq, H, D), k, v (B, Tk, Hkv, D) bf16. Without `lengths`, query i is at
// position q_offset + i (Tq <= Tk, q_offset + Tq <= Tk) and `docs` (B, Tk) i32 or null masks
// documents. With `lengths` (B) i32 (the decode step; Tq = 1, docs null), row b's query is at
// position lengths[b] - 1; a length outside [1, Tk] makes that row's out and lse NaN. Limits: D <=
// 256.
void attention_forward_rows(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v,
                            const int32_t* docs, const int32_t* lengths,
                            const AttentionRowsShape& shape, CudaState& state, CUstream_st* stream);

// The decode step over a paged cache (infer/paged_kv_cache.h): q, out (B, 1, H, D) bf16, lse
// (B, H, 1) f32; k_pool, v_pool (N, Bk, Hkv, D) bf16; tables (B, table_width) i32, row b's
// position t in block tables[b, t / Bk] at offset t % Bk; lengths (B) i32 in [1, Tk] with
// shape.Tk = table_width * Bk (a length outside makes that row's out and lse NaN). The split-K
// path of attention_forward_rows reading keys through the table (each K/V element once for all
// the query heads of its group); it takes D % 8 == 0 and 16-byte aligned pools (stops otherwise).
void attention_decode_paged(bf16* out, float* lse, const bf16* q, const bf16* k_pool,
                            const bf16* v_pool, const int32_t* tables, int64_t table_width,
                            int64_t block_size, const int32_t* lengths,
                            const AttentionRowsShape& shape, CudaState& state, CUstream_st* stream);

// Rows of row_bytes bytes between a contiguous (n, row) buffer and a pool of rows: scatter writes
// rows[i] to pool[slots[i]], gather reads pool[slots[i]] into rows[i]. Slots must be distinct for
// the scatter and inside the pool (not checked on the device); the scatter skips a negative slot.
void kv_rows_scatter(void* pool, const void* rows, const int32_t* slots, int64_t n,
                     size_t row_bytes, CUstream_st* stream);
void kv_rows_gather(void* rows, const void* pool, const int32_t* slots, int64_t n, size_t row_bytes,
                    CUstream_st* stream);

// Null when this build has cuDNN attention; otherwise a sentence naming what was missing when it
// was built (the cuDNN frontend headers, libcudnn) and how to get it.
const char* attention_unavailable_reason();

// Device memory the attention graphs of `shape` need besides their tensors, in bytes: the larger
// of the forward and backward workspaces cuDNN asks for, plus the docs bias (B * T * T bf16) when
// shape.docs. Builds both graphs if they are not cached yet and grows the state's attention
// buffers to fit them, so that later calls with this shape allocate nothing. Stops when cuDNN
// cannot run the shape, naming it and cuDNN's reason.
size_t attention_prepare(CudaState& state, const AttentionShape& shape);

// Whether cuDNN runs `shape` (building and caching its forward graph if not cached): false for a
// cache-form shape (Tkv > 0) that cuDNN declines, which attention_forward then runs on lathe's
// kernel; true for a training-form shape cuDNN can build (one it cannot stops, as
// attention_prepare does).
bool attention_cudnn_takes(CudaState& state, const AttentionShape& shape);

// Bytes the state's attention buffers (workspace + docs bias) hold now: what a memory plan counts
// after attention_prepare has seen every shape of the run. Lent memory (below) is not counted:
// its owner counts it.
size_t attention_buffer_bytes(const CudaState& state);

// The workspace cuDNN asks for to run `shape` (the larger of its forward and backward graphs;
// the backward's batch chunk as attention_backward picks it), building the graphs if they are
// not cached yet but allocating no workspace: for a memory plan that provides the workspace
// itself (attention_lend_workspace). Stops as attention_prepare does.
size_t attention_workspace_bytes(CudaState& state, const AttentionShape& shape);

// Lends `bytes` of device memory at `ptr` (256-byte aligned) to the attention calls of `state` as
// their workspace: a graph whose workspace fits runs on it instead of on a buffer the state grows
// (one that does not fit grows the state's own buffer, as without a loan). The caller promises
// that no work on the state's stream needs those bytes to keep their contents across an
// attention call, and that they stay allocated until the loan ends (the model lends scratch
// buffers that are dead while attention runs: model/memory_plan.h). A new loan replaces the
// previous one.
void attention_lend_workspace(CudaState& state, void* ptr, size_t bytes);
// Ends the loan of `ptr` if it is the current one (its owner frees it); otherwise does nothing.
void attention_end_loan(CudaState& state, const void* ptr);

// The cuDNN library version the process runs with (e.g. 91900), 0 when not built with cuDNN.
int64_t attention_cudnn_version();

void attention_forward(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v,
                       const int32_t* docs, const AttentionShape& shape, CudaState& state,
                       CUstream_st* stream);

void attention_backward(bf16* dq, bf16* dk, bf16* dv, const bf16* dout, const bf16* q,
                        const bf16* k, const bf16* v, const bf16* out, const float* lse,
                        const int32_t* docs, const AttentionShape& shape, CudaState& state,
                        CUstream_st* stream);

}  // namespace lathe::cuda
