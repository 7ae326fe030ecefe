#pragma once
// Tensor-parallel inference (Megatron-style): T processes, one per GPU (or CPU process under
// mpirun), each holding a shard of every block's projections, run the engine together.
//
// A rank's shard is itself a Model, of the local config: the full config with H/T attention
// heads, Hkv/T key/value heads and F/T MLP width (hidden size, vocabulary, layers, head_dim
// unchanged), so the local model's parameter entries ARE the shards. For rank r of T:
//   column-parallel (kOutputs): Wq, Wk, Wv, gate, up and their biases: rows r n .. (r+1) n of the
//       HF [out, in] tensor (n its local rows), i.e. heads r H/T .. (r+1) H/T and the matching
//       key/value heads (GQA groups stay whole: local query head j reads local kv head
//       j / (H/Hkv), as globally); GPT-NeoX's per-head interleaved qkv is a row range too;
//   row-parallel (kInputs): Wo and down: columns r n .. (r+1) n of the HF [out, in] tensor;
//   row-parallel biases (kRankZero): the full bias on rank 0, zeros elsewhere, so that it is
//       added once by the all-reduce that sums the partial outputs;
//   replicated: norms, whole on every rank; in inference also the embeddings and the LM head
//       (the logits are computed whole on every rank);
//   vocabulary-parallel (TpVocab::kParallel, training): the token embedding and the LM head
//       (tied or not) are column-parallel too: rows r V/T .. (r+1) V/T of the vocabulary, V a
//       multiple of T (model/model.h, "Tensor parallel", has the forward and backward).
// The engine (engine.h) all-reduces (sums) the partial outputs of Wo and down before the
// residual add. The families whose projections are sized by the heads (llama, mistral, qwen2)
// split; GPT-2 (q, k, v in one transposed c_attn) and GPT-NeoX (query_key_value and dense sized
// by hidden_size) are refused.
//
// Loading reads each HF tensor of the checkpoint through its memory map, converting only the
// rank's slice to f32 and writing it into the local model one entry at a time: neither the
// full model nor the whole shard sits in host memory at once.
//
// Determinism: every rank must feed the engine the same tokens. Rank 0 reads the input and
// samples; tp_broadcast_bytes / InferenceEngine::agree_tokens carry its choices to the others.

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "dist/communicator.h"
#include "model/memory_plan.h"
#include "model/model.h"
#include "model/model_config.h"
#include "model/param_table.h"
#include "ops/cuda/cuda_state.h"

namespace lathe {

class ParamStaging;
class SafetensorsTensor;

// How one HF tensor is split among the ranks (header comment).
enum class TpSplit : uint8_t { kReplicated, kOutputs, kInputs, kRankZero };
// Whether the token embedding and the LM head are whole on every rank (inference) or split by
// vocabulary rows (training; header comment).
enum class TpVocab : uint8_t { kReplicated, kParallel };

TpSplit tp_split_of(ParamRole role, TpVocab vocab = TpVocab::kReplicated);
// The vocabulary split of a local config (ModelConfig::vocab_parallel).
TpVocab tp_vocab_of(const ModelConfig& local);

// The local config of rank `rank` of `tp` (header comment); with TpVocab::kParallel its
// vocab_size is V / tp, vocab_total V and vocab_begin rank V / tp. Errors (invalid argument) name
// `flag` and the numbers: tp < 1, or tp not dividing the attention heads, the key/value heads or
// the MLP width, or (kParallel) the vocabulary; a family whose tensors have no shard of this form
// (GPT-2, GPT-NeoX) is unimplemented.
Result<ModelConfig> tp_local_config(const ModelConfig& full, int tp, std::string_view flag,
                                    TpVocab vocab = TpVocab::kReplicated, int rank = 0);

// Copies rank `rank` of `tp`'s part of the HF tensor `full` (the checkpoint's, any float dtype)
// into `out` (host, f32, shape local.shape, the stored layout of `local`, a parameter of the
// local model). Errors name `where` and the tensor: a shape that is not the local shape with the
// split dimension times tp, an unsupported dtype, a layout whose slice is not a row or column
// range (transposed), a NaN or infinite value among those read (kDataLoss, check_finite_weights).
Status tp_read_slice(const SafetensorsTensor& full, const HfParam& local, ParamRole role, int rank,
                     int tp, std::string_view where, TensorView out,
                     TpVocab vocab = TpVocab::kReplicated);

// A model of the local config of `full` for rank `rank` of `tp` on `ctx`, its shard read from the
// safetensors of the checkpoint folder `dir`. Errors: tp_local_config's, Model::create's, the
// checkpoint's (a missing tensor, a shape that disagrees) with "--checkpoint" as context.
Result<Model> tp_model_create_loaded(const ModelConfig& full, int rank, int tp,
                                     const ModelShape& shape, const Context& ctx,
                                     const std::string& dir);

// A model of the local config with random weights from `seed`, for timing shapes that have no
// checkpoint (a 70B config.json alone): each entry is filled on the host with uniform numbers of
// model/init.h's standard deviation (norm weights 1, biases 0), keyed by (seed, tensor name,
// element), on all cores, and written to the model entry by entry. Replicated tensors are thus
// equal on every rank; each rank's shards are those of a full model whose shards repeat. Not a
// trained model: for throughput and memory only. tp = 1 gives the whole model.
Result<Model> tp_model_create_random(const ModelConfig& full, int rank, int tp,
                                     const ModelShape& shape, const Context& ctx, uint64_t seed);

// ---- Training (run/trainer.cpp, parallel.tensor; docs/DISTRIBUTED.md) ----
// A tensor-parallel training rank trains a model of the local config; its Model's tensor-parallel
// sum (model.h) all-reduces over the group of `tp` consecutive ranks.

// Sets `local` (a model of tp_local_config(full, tp)) to rank `rank`'s shard of the weights that
// Model::init(seed) gives a model of `full`: the same full weights at every tp (model/init.h's
// draws are keyed by the tensor name and the element's index in the full tensor).
void tp_model_init(Model& local, const ModelConfig& full, int rank, int tp, uint64_t seed);

// Rank `rank`'s part of the full HF tensor `whole` (host f32, the full HF shape) written into
// `part` (host f32, the local HF shape) as `split` cuts it: the rows or columns of the shard, the
// whole tensor (kReplicated; kRankZero on rank 0), or zeros (kRankZero elsewhere).
void tp_slice_hf(ConstTensorView whole, TpSplit split, int rank, int tp, TensorView part);

// Loads rank `rank`'s shard of `tp` of the checkpoint folder `dir` (a model of the full config)
// into `local`, a model of the local config (its vocabulary split: tp_vocab_of).
// Errors as tp_model_create_loaded's.
Status tp_model_load(Model& local, int rank, int tp, const std::string& dir);

// The arena ranges (params_flat() coordinates) of `local`'s parameter entries that every rank
// holds whole (TpSplit::kReplicated under tp_vocab_of(local.config())): counted once in a global
// gradient norm. (Under sequence parallel their gradients are the same on every rank once
// Model::sum_sequence_parallel_grads has summed the ranks' parts.)
std::vector<FlatRange> tp_replicated_ranges(const Model& local);

// Optimizer moments from one split to another (a checkpoint of parallel.tensor `from` resumed at
// `tp`): `old[r]` is rank r's moment vector of `from` in canonical coordinates (optim/
// optimizer_state.h: the parameter table layout of a model of tp_local_config(full, from), flat
// f32); returns rank `rank`'s of `tp`, each HF tensor's moments assembled whole from the old
// shards and sliced as tp_slice_hf slices the weights, both splits with the vocabulary split
// `vocab`. Both splits must be valid (checked).
std::vector<float> tp_reshard_moments(const ModelConfig& full, int from,
                                      std::span<const std::vector<float>> old, int tp, int rank,
                                      TpVocab vocab = TpVocab::kReplicated);

// The canonical length (optim/optimizer_state.h) of the moments of a rank of `tp` (checked valid).
int64_t tp_canonical_length(const ModelConfig& full, int tp, TpVocab vocab = TpVocab::kReplicated);

// The HF tensors of a model of `full` assembled from the shards of the `tp` ranks of `comm` (the
// tensor-parallel group, comm.size() == tp): each rank passes its local model and `staging`, a
// ParamStaging over it holding its parameters (filled by the caller); rank 0 of `comm` then
// writes `dir`/model.safetensors and `dir`/config.json, the files model_save_hf writes for a
// model of `full`. Collective over `comm` (every rank calls it); the shards travel tensor by
// tensor (on CUDA through a device buffer of `ctx`). Errors: the communicator's, the writer's.
Status tp_save_hf(const Model& local, ParamStaging& staging, const ModelConfig& full,
                  Communicator& comm, const Context& ctx, const std::string& dir);

// Sends rank 0's `bytes` to every rank of `comm` (the size first, then the bytes); on return
// every rank's `bytes` equals rank 0's. CPU communicators move host memory; NCCL goes through a
// device buffer of `ctx`, allocated for the call. Every rank calls it at the same point. Errors:
// the communicator's, an allocation failure.
Status tp_broadcast_bytes(Communicator& comm, const Context& ctx, std::vector<uint8_t>& bytes);

// The same for token-id lists (prompts): rank 0's `lists` on every rank. `rank0_failed` (read on
// rank 0): rank 0 could not make its lists; the other ranks then return a failed-precondition
// error saying so, and rank 0 returns ok (it reports its own error).
Status tp_broadcast_token_lists(Communicator& comm, const Context& ctx,
                                std::vector<std::vector<int32_t>>& lists,
                                bool rank0_failed = false);

// Sequence parallel's moves of the residual stream's rows (model/block.h: TensorParallelRows,
// Model::set_tensor_parallel_rows) over `comm`, the tensor-parallel group, for a model computing
// on `ctx`. With `overlap` on CUDA each move runs on the device's tensor-parallel stream
// (CudaState::tensor_stream) after the compute enqueued before it, and a wait orders the
// compute stream after the move by an event (a ring of kEvents: a wait for a ticket whose event
// has been recorded again waits for a later move, still correct); otherwise each move runs at
// the call, in order on ctx's stream (the host's on the CPU) and a wait does nothing. `chunks`
// as TensorParallelRows::chunks (1 to kEvents / 2). The first failed collective lands in
// `*error` (then later moves do nothing, and the caller stops the step on it). The mover must
// outlive every use of the rows it gives.
class TensorParallelRowMover {
public:
    static constexpr int kEvents = 16;
    // `reserve_sms` (overlap on CUDA): SMs left to the collectives; the block's GEMMs plan for
    // the rest (TensorParallelRows::gemm_sms; 0: they plan for all).
    TensorParallelRowMover(Communicator& comm, const Context& ctx, int chunks, bool overlap,
                           Status* error, int reserve_sms = 0);
    TensorParallelRowMover(const TensorParallelRowMover&) = delete;
    TensorParallelRowMover& operator=(const TensorParallelRowMover&) = delete;

    // The moves, bound to this object.
    TensorParallelRows rows();

private:
    int begin(bool gather, TensorView out, ConstTensorView in);

    Communicator& comm_;
    Context ctx_;
    int chunks_;
    int gemm_sms_ = 0;
    Status* error_;
    std::vector<CudaEvent> done_;  // overlap only
    int next_ = 0;
    int last_ = 0;  // the ticket of the last move begun
};

}  // namespace lathe
