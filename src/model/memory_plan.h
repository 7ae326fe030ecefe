#pragma once
// The memory plan (DESIGN.md, "Memory is planned, not discovered"): every byte a model needs for
// a batch of B sequences of T tokens, computed from the config before anything is allocated.
//
//   parameters        the parameter table's arena: fp32 master weights; on CUDA also their bf16
//                     compute copy (what the forward and backward read; AdamW rewrites it),
//                     and a CUDA model without training holds the bf16 copy alone
//   gradients         the same layout (+= across micro-batches); none for a model created
//                     for evaluation or inference (ModelShape::training false)
//   optimizer state   AdamW's two moments, the same layout twice (optim/ allocates them; none
//                     without training)
//   activations       what the forward saves for the backward: per layer the tensors block.h
//                     lists, plus the embedding output, the final norm, the LM head's per-row
//                     log-sum-exp, the loss, and the batch's tokens/targets/docs/positions
//   scratch           what every step overwrites: one block's backward buffers, the gradient of
//                     the residual stream, one (Nc, V) chunk of logits for the fused LM head,
//                     and the RoPE cos/sin tables (T, R/2)
// The model allocates parameters, gradients, activations and scratch as one arena each; nothing
// is allocated per step. With activation recompute the activations row shrinks; the
// table is where that shows.
//
//                     On CUDA, cuDNN's attention workspace too: it shares the bytes of the
//                     scratch buffers that are dead while attention runs (below), and adds only
//                     what it needs beyond them (the backward runs in batch chunks that fit
//                     them where it can: attention_backward_cap).
//   runtime           CUDA only: the buffers the CudaState owns (cuBLASLt workspace, op scratch,
//                     attention buffers it had to grow itself, such as the docs mask)
//   fp8 buffers       CUDA with fp8 linear roles only (ModelShape::precision): each FP8 linear's
//                     Fp8LinearBuffers (ops/linear.h): per layer and linear the weight's codes
//                     and their transpose (rewritten once per optimizer step) and the transposed
//                     input codes xqt (written by the forward, read by the layer's backward, so
//                     one per layer); shared by all linears the forward's xq and the backward's
//                     dyq (one buffer: never live at once) and dyqt; the 24 scalars of each
//                     linear (per-tensor recipes) or the blocks' scale grids (blockwise: the
//                     weight's and the saved input's per layer, the rest shared); with delayed
//                     scaling the scales and the step's amaxes of every scaled tensor
//                     (fp8_tensor_index order). With the LM head in fp8 (fp8.lm_head): its
//                     weight's codes "lm_head.fp8.wq" (V, C) and "lm_head.fp8.wqt" (C, V), its 24
//                     scalars after the layers'; its x codes use the shared xq and dyqt buffers
//                     (at least N C bytes each) and its dlogits' codes the logits chunk
//                     (ops/cuda/lm_head_cross_entropy.h), whose rows Nc round up to a multiple
//                     of 16
//
// Dtypes follow the backend (ModelShape::backend): on the CPU reference every float entry is f32;
// on CUDA activations, their gradients and the compute copy of the weights are bf16 while master
// weights, gradients, moments, saved statistics (mean, rstd, lse), the loss and the LM head's
// logits chunk stay f32 (docs/CUDA.md, "Storage policy"). Activation names: "layers.{l}.{name}"
// with the names of block_acts_for_each, and "embed.*", "final.*", "lm_head.*", "input.*".

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/arena.h"
#include "core/status.h"
#include "model/fp8_state.h"
#include "model/host_memory_plan.h"
#include "model/model_config.h"
#include "model/param_table.h"
#include "model/precision_policy.h"
#include "ops/context.h"

namespace lathe {

// Activation recompute (train.recompute), what the backward gets back by computing again:
//   none       every layer keeps every tensor block.h lists (BlockActs);
//   selective  every layer keeps the outputs of its GEMMs and of attention (q, k, v, att, lse,
//              x_mid, mlp_in) and the norms' statistics, but not the cheap elementwise outputs
//              (ln1_out, ln2_out: the norms'; mlp_act: GELU/SwiGLU of mlp_in, unless a GEMM
//              epilogue computed it: model/block_recompute.h); those are one shared set,
//              refilled from the kept tensors just before each layer's backward: two norms and
//              an activation pass per layer, no GEMM;
//   full       each layer keeps only its input; the rest of a block's saved tensors is one shared
//              set, refilled by running the block's forward again just before its backward (one
//              more forward per step, about a third more compute, for activations of one layer
//              instead of L).
// Every mode gives bit-identical gradients: the ops are deterministic and the recomputed
// tensors repeat the saved ones.
enum class Recompute { kNone, kSelective, kFull };

// "none", "selective", "full".
const char* recompute_name(Recompute mode);
// The mode called `name` (as recompute_name spells it), or nullopt.
std::optional<Recompute> recompute_from_name(std::string_view name);

struct ModelShape {
    int64_t batch = 1;    // B, the most sequences one forward takes
    int64_t seq_len = 0;  // T, the longest sequence one forward takes
    // Nc, rows of logits the fused LM head holds at once; 0 picks the largest count whose
    // (Nc, V) f32 chunk fits the backend's budget (kLmHeadChunkBytes*, below), at most B*T.
    int64_t lm_head_chunk_rows = 0;
    // Where the model computes; sets the dtypes (above) and the runtime row.
    Backend backend = Backend::kCpu;
    // What the backward recomputes instead of keeping (above).
    Recompute recompute = Recompute::kNone;
    // CUDA: the workspace cuDNN's attention graphs of this shape ask for (the larger of forward
    // and backward, every window the model has). Unset: the plan estimates it
    // (memory_plan_attention_workspace_estimate); Model::create asks cuDNN and plans again.
    std::optional<size_t> attention_workspace_bytes = std::nullopt;
    // Gradients (and an optimizer) exist: false for evaluation and inference.
    bool training = true;
    // The precision of each linear (model/precision_policy.h); kNative everywhere by default.
    PrecisionPolicy precision{};
    // Ranks W of a data-parallel run (run/data_parallel.h). W > 1 pads every unit of the
    // parameter arena (ShardLayout below) with zeros to a multiple of kShardAlignElements * W, so
    // that each rank's chunk of each unit has one length and starts on an arena alignment
    // boundary (the gradients and the bf16 copy share the layout). 1: the parameter table's
    // layout as is.
    int unit_shards = 1;
    // Ranks the AdamW moments are sharded over: the plan counts 1/optimizer_shards of them
    // (ZeRO-1: unit_shards; 1 where every rank keeps the whole state). 1 or unit_shards.
    int optimizer_shards = 1;
    // The fp8 recipe of the policy's fp8 roles (model/fp8_state.h): gradient format, delayed
    // scaling. Read only when a role is fp8.
    Fp8Settings fp8{};
    // Ranks the gradients are sharded over (ZeRO-2: unit_shards; 1 or unit_shards). Above 1 the
    // gradient arena is not the parameter arena's twin: it holds this rank's 1/W shard (its chunk
    // of every unit, in unit order) and the unit-sized windows the backward writes one unit's
    // gradients into (MemoryPlan::gradients below).
    int gradient_shards = 1;
    // Ranks the parameters are sharded over (ZeRO-3: unit_shards; 1 or unit_shards). Above 1 the
    // parameter arena (f32 masters) and, on CUDA, the bf16 compute copy hold this rank's 1/W
    // shard only (its chunk of every unit, in unit order, the layout of the gradient shard), and
    // the arena the model computes with (the compute copy on CUDA, the masters on the CPU) holds
    // unit-sized windows the gathered weights of a unit are read from (MemoryPlan::param_storage
    // below). Needs gradient_shards = unit_shards.
    int param_shards = 1;
    // This process's rank among the unit_shards ranks: which chunks a sharded parameter arena
    // holds (0 with param_shards = 1).
    int shard_rank = 0;
    // Optimizer offload (optimizer.offload: cpu, optim/host_optimizer.h): the f32 masters and the
    // AdamW moments live in host memory outside the model. On CUDA the model holds the bf16
    // compute copy alone (keeps_masters() false; entry reads and writes go through the host
    // masters the optimizer attaches, Model::attach_host_masters); on the CPU it keeps the f32
    // weights it computes with. Needs training and param_shards = 1.
    bool masters_on_host = false;
    // With masters_on_host: optimizer.offload_fraction f, in (0, 1]. The units of the parameter
    // arena whose masters and moments live in host memory are its last ones (the back unit, then
    // layer L-1, L-2, ...), as few as hold at least ceil(f P) of its P elements
    // (offload_split_begin); the units before them, [0, MemoryPlan::offload_begin), keep f32
    // masters and both moments on the device, stepped there by the device AdamW, and the plan
    // counts them (parameters: 4 B, optimizer state: two moments of optimizer_state an element).
    // f = 1 offloads everything.
    double offload_fraction = 1.0;
    // The AdamW moments' storage (optimizer.state_dtype: f32, or bf16 at 2 B an element,
    // ops/adamw.h), on the device; with masters_on_host, of the device units, as the host's
    // (model/host_memory_plan.h).
    AdamWStateDType optimizer_state = AdamWStateDType::kF32;
    // Sequence parallel (model/block.h's header): the tensor-parallel ranks S that the residual
    // stream's rows are cut over (parallel.tensor with parallel.sequence_parallel; 1: none). S > 1
    // plans this rank's N/S rows (N = B T, a multiple of S: Model::create refuses another) of
    // every layer's x, x_mid, ln1_out, ln2_out and the norms' statistics, of final.x and the
    // final norm's statistics, and of the residual gradient; one block's scratch gains the full
    // rows a norm output is gathered into and the rows a sum is reduce-scattered to, and the
    // scratch the norms' partial gradients are summed in (sequence_parallel_partial_role).
    int sequence_shards = 1;
    // Device memory the communicator of a multi-GPU run holds (NCCL's buffers), as measured when
    // it was opened (run/world.h); counted as the plan's `communication` row. 0 for one process.
    size_t communication_bytes = 0;
};

// The parameters whose gradients are per-rank partial sums under sequence parallel (a norm's
// weight and bias: the norm runs on the rank's rows), summed over the tensor-parallel group once
// per step (Model::sum_sequence_parallel_grads).
bool sequence_parallel_partial_role(ParamRole role);

// The chunk alignment of a sharded parameter arena.
inline constexpr int64_t kShardAlignElements = 64;  // f32: ArenaLayout::kDefaultAlignment bytes

// Elements [begin, end) of a flat vector.
struct FlatRange {
    int64_t begin = 0;
    int64_t end = 0;
    int64_t size() const { return end - begin; }
};

// The units of the parameter arena and their chunks, for data parallel over W ranks.
//
// A unit is a contiguous run of parameter entries: the entries before layer 0 (front), each
// layer, the entries after the last layer (back); units are in arena order: front, layer 0, ...,
// layer L-1, back. The canonical coordinates are those of the parameter table's layout (the
// one-process arena): unit u covers canonical [c_u, c_u+1), its entries and their alignment gap,
// and the units tile [0, used). In the plan's arena unit u covers [a_u, a_u + n_u) with
// n_u = round_up(c_u+1 - c_u, kShardAlignElements * W) (zero padding after the unit's own
// elements) and a_u+1 = a_u + n_u; its chunk r is [a_u + r n_u / W, a_u + (r + 1) n_u / W).
// Within a unit the entries keep their offsets from the unit's start, so an element's arena
// index is its canonical index - c_u + a_u. W = 1 adds no padding: the two coordinates agree.
struct ShardLayout {
    static constexpr size_t kFront = 0;  // unit index of the front; layer l is unit l + 1

    int world = 1;
    int64_t used = 0;                  // canonical length (the table layout's elements)
    int64_t total = 0;                 // arena length (the sum of the n_u)
    std::vector<FlatRange> arena;      // [u] unit u in the plan's arena, padding included
    std::vector<FlatRange> canonical;  // [u] unit u in canonical coordinates

    size_t units() const { return arena.size(); }
    size_t back() const { return arena.size() - 1; }
    size_t layer_unit(int layer) const { return size_t(layer) + 1; }
    // Chunk `rank` of unit u, in arena coordinates (empty for an empty unit).
    FlatRange chunk(size_t u, int rank) const;
    // The non-empty chunks of `rank`, in unit order (arena coordinates).
    std::vector<FlatRange> chunks(int rank) const;
    // Arena ranges (each inside one unit) to canonical: each range cut to its unit's own elements
    // (padding dropped) and moved to canonical coordinates; empty results dropped, order kept.
    std::vector<FlatRange> to_canonical(std::span<const FlatRange> ranges) const;
};

// The units of `table` (entries grouped by ParamEntry::layer; every layer's entries contiguous,
// front and back around them, checked) over `world` ranks.
ShardLayout shard_layout_make(const ParamTable& table, int world);

// Optimizer offload's split (ModelShape::offload_fraction): the first element of the shortest
// run of last units (arena coordinates) holding at least ceil(fraction * total) elements; the
// units before it stay on the device. Why the last units go first: the backward finishes them
// first, so their gradient copies overlap the rest of the backward, and the forward needs them
// last, so their CPU update has the whole forward up to them to finish in; the front unit (the
// embeddings), which the forward needs first and whose CPU update the overlapped schedule
// waits for, is the last to go. fraction 1 gives 0; fraction in (0, 1] (checked).
int64_t offload_split_begin(const ShardLayout& units, double fraction);

// The workspace of cuDNN 9's deterministic flash-attention backward for `config` at (B, T) in one
// call (the plan counts the batch chunk it runs in: MemoryPlan::attention_backward_cap): an
// fp32 partial dQ per block of 128 keys (ceil(T / 128) * B * H * T * D * 4 bytes), a float per
// (b, h, t), and with GQA dK and dV per query head in bf16 (2 * B * H * T * D * 2). That is what
// cuDNN 9.14 asked for at both training shapes of docs/CUDA.md (769.5 MiB for GPT-2 124M at B = 32,
// T = 1024; 2178 MiB for Llama-3.2-1B at B = 8, T = 2048; docs/CUDA.md). What a plan made without a
// GPU counts; Model::create asks cuDNN.
size_t memory_plan_attention_workspace_estimate(const ModelConfig& config, int64_t B, int64_t T);

// Windows for layers' gradients when the gradients are sharded (ModelShape::gradient_shards):
// on CUDA two, the backward writing layer l into one while the reduction of layer l + 1's runs
// from the other on the communication stream; on the CPU one (its reductions finish before the
// backward goes on).
constexpr int gradient_layer_windows(Backend backend) {
    return backend == Backend::kCuda ? 2 : 1;
}

// Windows for layers' gathered weights when the parameters are sharded (ModelShape::param_shards):
// two on every backend, a layer computing from one while the next one's gather fills the other.
inline constexpr int kWeightLayerWindows = 2;

// Device slots for micro-batch losses (Model::forward_backward_async): a training step reads the
// losses of up to this many micro-batches at once.
inline constexpr int64_t kLossSlots = 64;

// Default budget for one chunk of LM-head logits (f32): on the CPU it stays cache-friendly; on
// CUDA a larger chunk means fewer, larger GEMMs (at T = 1024 and V = 50257, about 2,600 rows).
inline constexpr size_t kLmHeadChunkBytes = size_t(64) << 20;
inline constexpr size_t kLmHeadChunkBytesCuda = size_t(512) << 20;
// The FP8 head's (fp8.lm_head): four times the bf16 budget. Each chunk reads and writes the f32
// weight gradient (V, C) once, 8 V C bytes, against 6 r V C flops in its three GEMMs: that
// traffic's share of the chunk's time grows as the rows r fall and as the GEMMs speed up. FP8's
// GEMMs run about twice as fast as bf16's and a row takes twice the chunk's bytes (bf16 dlogits
// and their two code copies, ops/cuda/lm_head_cross_entropy.h), so four times the bytes give the
// traffic the share it has in the bf16 head. At V = 128256: 4,192 rows instead of 1,056.
inline constexpr size_t kLmHeadChunkBytesCudaFp8 = size_t(2048) << 20;

// The dtype of activations and their gradients on `backend`.
constexpr DType activation_dtype(Backend backend) {
    return backend == Backend::kCuda ? DType::kBF16 : DType::kF32;
}

// Whether `p` has a linear role in fp8.
bool precision_has_fp8(const PrecisionPolicy& p);

// The (I, O) of FP8 linear `l` of a block of `config`: its input and output widths.
struct Fp8LinearDims {
    int64_t in = 0, out = 0;
};
Fp8LinearDims fp8_linear_dims(const ModelConfig& config, Fp8Linear l);

// Entry indices into MemoryPlan::fp8 of one FP8 linear (kNoEntry for a native one).
struct Fp8LinearEntries {
    size_t wq = size_t(-1), wqt = size_t(-1), xqt = size_t(-1);
    int64_t scalars_offset = -1;  // per-tensor: its 24 f32 in the "fp8.scalars" entry, in floats
    // Blockwise (ops/fp8_blockwise.h, Fp8BlockwiseBuffers): the weight's two scale grids and the
    // saved transposed input's, per layer like the codes.
    size_t w_scale = size_t(-1), wt_scale = size_t(-1), xt_scale = size_t(-1);
};

struct MemoryPlan {
    static constexpr size_t kNoEntry = size_t(-1);

    ModelShape shape;    // lm_head_chunk_rows resolved
    ArenaLayout params;  // also the layout of each AdamW moment
    ShardLayout shards;  // the units of `params` over shape.unit_shards ranks
    // With shape.masters_on_host: elements [0, offload_begin) of the parameter vector keep their
    // masters and moments on the device (ModelShape::offload_fraction); 0 offloads everything.
    int64_t offload_begin = 0;
    ArenaLayout params_compute;  // CUDA: params' entries in bf16, element offsets equal to
                                 // params' (empty on the CPU)
    // What the model allocates for its parameters: `params` and `params_compute` themselves, or
    // with shape.param_shards = W > 1: param_storage "params.shard" (ShardLayout::total / W f32,
    // the rank's chunks of every unit in unit order, the gradient shard's layout) and on CUDA
    // compute_storage "params_compute.shard" (its bf16 twin, element for element); then, in the
    // arena the model computes with (compute_storage on CUDA, in bf16; param_storage on the CPU,
    // in f32), the weight windows "params.window.front" and "params.window.back" (the front and
    // back units' lengths: kept from a forward through its backward) and kWeightLayerWindows
    // windows "params.window.layer.{i}" of the longest layer unit, each a gathered unit's
    // entries at their offsets from the unit's start. `params` and `params_compute` stay the
    // layouts a unit's entries are viewed with (placed over a window). Entry indices below.
    ArenaLayout param_storage, compute_storage;
    size_t param_shard = kNoEntry, compute_shard = kNoEntry;
    size_t weight_front_window = kNoEntry, weight_back_window = kNoEntry;
    std::vector<size_t> weight_layer_windows;  // [i], i < kWeightLayerWindows
    ArenaLayout activations;
    ArenaLayout scratch;

    // The gradient arena: `params` itself (every element's gradient at its parameter's offset),
    // or with shape.gradient_shards = W > 1: "gradients.shard" (ShardLayout::total / W f32: the
    // rank's chunks of every unit, in unit order, empty units holding none), then the windows
    // "gradients.window.front" and "gradients.window.back" (the front and back units' lengths:
    // they collect gradients over the whole backward) and gradient_layer_windows(backend) windows
    // "gradients.window.layer.{i}" of the longest layer unit. Entry indices below.
    ArenaLayout gradients;
    size_t grad_shard = kNoEntry, grad_front_window = kNoEntry, grad_back_window = kNoEntry;
    std::vector<size_t> grad_layer_windows;  // [i], i < gradient_layer_windows(backend)

    // Entry indices into `activations`, for the model's views. With full recompute every layer's
    // entries but the first (its input) are the same shared indices; with selective recompute
    // those of ln1_out, ln2_out and mlp_act are.
    std::vector<std::vector<size_t>> block_acts;  // [layer][i], in block_acts_for_each order
    // Sequence parallel (ModelShape::sequence_shards): final_x and the final norm's statistics
    // hold the rank's rows; final_norm_out the full rows the LM head reads.
    size_t final_x = 0;                 // (B, T, C) the last block's output
    size_t final_norm_out = 0;          // (B, T, C)
    size_t final_norm_mean = kNoEntry;  // LayerNorm only
    size_t final_norm_rstd = 0;
    size_t lm_lse = 0;  // (B T) per-row log-sum-exp of the logits
    size_t loss = 0;    // (kLossSlots) micro-batch losses (slot 0 for forward())
    size_t tokens = 0, targets = 0, docs = 0, positions = 0;  // (B, T) i32 each
    // A vocabulary shard (ModelConfig::vocab_parallel): (B, T) i32, each token's row in the
    // shard (ops/vocab_parallel.h); the embedding's forward and backward read it.
    size_t vocab_ids = kNoEntry;
    // Entry indices into `scratch`.
    std::vector<size_t> block_scratch;  // in block_scratch_for_each order
    size_t dres = 0;      // (B, T, C) gradient of the residual stream (sequence parallel: the rows)
    size_t lm_chunk = 0;  // (Nc, V)
    size_t rope_cos = kNoEntry, rope_sin = kNoEntry;  // (T, R/2), RoPE families
    size_t grad_norm = 0;                             // (1) f32, the step's gradient norm
    // A vocabulary shard: (4, B T) f32, cross_entropy_vocab_parallel_combine's work (3 rows)
    // and the shard's row losses (ops/vocab_parallel.h).
    size_t lm_vocab_parallel = kNoEntry;
    // Sequence parallel: (P) f32, every sequence_parallel_partial_role entry's gradient packed
    // for one sum over the group (Model::sum_sequence_parallel_grads).
    size_t sequence_parallel_grads = kNoEntry;
    // CUDA: cuDNN's attention workspace lives in the scratch arena, over the scratch entries
    // that no op reads or writes while an attention call runs (their contents never outlive the
    // op sequence that wrote them): one block's tmp, dnorm1, dnorm2 (sequential residual),
    // dmlp_act and dmlp_in, and the LM head's logits chunk, laid out last and contiguous, then
    // an entry "attention.workspace" for what the workspace needs beyond them. The model lends
    // scratch bytes [attention_offset, attention_offset + attention_bytes) to the attention op
    // (ops/cuda/attention.h, attention_lend_workspace). Zero on the CPU.
    size_t attention_workspace = 0;  // bytes the workspace needs (shape's, or the estimate)
    size_t attention_offset = 0, attention_bytes = 0;
    size_t attention_shared = 0;  // of the workspace's bytes, those the dead buffers hold
    // The bytes of those dead buffers: the bound the model puts on the backward's workspace
    // (Context::attention_backward_workspace_cap). Where the whole batch's deterministic
    // backward asks for more, it runs in batch chunks that fit, when one row does
    // (cuda::attention_backward_chunk_rows): the same bits, and no workspace beyond the
    // dead buffers. The estimate takes the chunk the same way.
    size_t attention_backward_cap = 0;
    // CUDA with fp8 roles: the fp8 buffers' arena (file comment) and its entries; empty else.
    ArenaLayout fp8;
    std::vector<std::array<Fp8LinearEntries, kFp8LinearsPerLayer>> fp8_linears;  // [layer][l]
    size_t fp8_q_scratch = kNoEntry;  // (max N I, N O) bytes: xq of a forward, dyq of a backward
    size_t fp8_dyqt = kNoEntry;       // (max O N) bytes
    size_t fp8_scalars = kNoEntry;    // per-tensor: ((L * 6 + head) * 24) f32
    Fp8LinearEntries fp8_head;        // the LM head's wq, wqt (xqt unused) and scalars_offset
    // Blockwise: the shared scale scratch (x_scale of a forward / dy_scale of a backward; the
    // backward's dyt_scale; the casts' row-major scales), each the largest any linear needs.
    size_t fp8_scale_scratch = kNoEntry, fp8_dyt_scale = kNoEntry, fp8_cast_scales = kNoEntry;
    size_t fp8_scales = kNoEntry;     // delayed: (fp8_tensor_count) f32, the casts' scales
    size_t fp8_step_amax = kNoEntry;  // delayed: (fp8_tensor_count) f32, the step's amaxes
    // Delayed: (fp8_tensor_count) f32 where the casts of a forward outside the training steps
    // (Model::eval_forward, Model::logits) put their amaxes, never read.
    size_t fp8_eval_amax = kNoEntry;
    size_t runtime = 0;        // bytes of backend buffers outside the arenas (CUDA: CudaState's)
    size_t communication = 0;  // the communicator's device memory (shape.communication_bytes)

    // Whether the model keeps the f32 masters in its own memory: always but for a CUDA model
    // without training, whose forward reads only the bf16 compute copy (an inference model
    // holds 2 bytes a parameter, not 6; entry writes round the host's f32 values into it), and
    // a CUDA model whose masters are in host memory (shape.masters_on_host).
    bool keeps_masters() const {
        return (shape.training && !shape.masters_on_host) || shape.backend != Backend::kCuda;
    }
    // f32 masters of the elements that optimizer offload keeps on the device (CUDA; the CPU's
    // model computes with its f32 weights, which are those masters): 4 B x offload_begin.
    size_t device_master_bytes() const {
        return shape.masters_on_host && shape.backend == Backend::kCuda
                   ? size_t(offload_begin) * sizeof(float)
                   : 0;
    }
    size_t parameter_bytes() const {
        return (keeps_masters() ? param_storage.total_bytes() : 0) + compute_storage.total_bytes() +
               device_master_bytes();
    }
    // Of parameter_bytes() with sharded parameters: the shards (masters and compute copy), and
    // the weight windows (0 otherwise).
    size_t param_shard_bytes() const;
    size_t weight_window_bytes() const;
    size_t gradient_bytes() const { return shape.training ? gradients.total_bytes() : 0; }
    // Of gradient_bytes() with sharded gradients: the shard, and the windows (0 otherwise).
    size_t gradient_shard_bytes() const;
    size_t gradient_window_bytes() const;
    size_t optimizer_bytes() const {
        if (!shape.training) return 0;
        // The parameter arena holds f32 elements; each has two moments of the state's dtype
        // (with offload, those of the device part [0, offload_begin) alone).
        if (shape.masters_on_host)
            return 2 * size_t(offload_begin) * adamw_state_dtype_bytes(shape.optimizer_state);
        return 2 * params.total_bytes() / sizeof(float) *
               adamw_state_dtype_bytes(shape.optimizer_state) / size_t(shape.optimizer_shards);
    }
    size_t activation_bytes() const { return activations.total_bytes(); }
    size_t scratch_bytes() const { return scratch.total_bytes(); }
    size_t fp8_bytes() const { return fp8.total_bytes(); }
    size_t total_bytes() const {
        return parameter_bytes() + gradient_bytes() + optimizer_bytes() + activation_bytes() +
               scratch_bytes() + fp8_bytes() + runtime + communication;
    }

    // The printable table, one row per category with bytes and a human-readable size, then the
    // total; `title` heads it (e.g. the config summary).
    std::string table(std::string_view title) const;
};

// Plans `config` (valid) with `table` (its parameter table) for `shape`. Errors (invalid
// argument): B or T not positive, T beyond max_position_embeddings (the message names the key),
// a negative lm_head_chunk_rows.
Result<MemoryPlan> memory_plan_make(const ModelConfig& config, const ParamTable& table,
                                    const ModelShape& shape);

// "1.50 MiB", "512 B".
std::string format_bytes(size_t bytes);

}  // namespace lathe
