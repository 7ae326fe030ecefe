#pragma once
// The inference engine: a forward-only decoder over a loaded Model's weights that keeps a KV
// cache (kv_cache.h) and gives the logits of the last position only.
//
// Two calls move sequences forward, and they are what a continuous-batching server drives:
//   prefill(seq, tokens)        appends a prompt (or any run of tokens) of T tokens to one
//                               sequence at positions len..len+T-1, in chunks of at most
//                               prefill_chunk tokens: each chunk's keys/values are written into
//                               the cache row, its queries attend to the row's filled prefix
//                               (attention_forward at q_offset = len; a one-token chunk
//                               through attention_decode); logits of the last token.
//   decode(steps)               one token for every open sequence at once, each at its own
//                               position: the new keys/values are written at each row's length,
//                               attention_decode reads each row up to its length; one logits row
//                               per sequence.
// A server keeps requests waiting in its own queue, opens a sequence (open()) when one joins,
// prefills it, then includes it in every decode step until it finishes and is closed (close());
// sequences of different lengths share a step. Joining and leaving happen between steps.
//
// Per layer (the block schedule of model/block.h, forward only, nothing saved):
//   h = norm1(x); q, k, v = h Wq^T + bq, ...; rope(q, k) at the tokens' positions;
//   k, v -> cache; a = attention(q, cache); then the residual and MLP exactly as block_forward.
// Logits: final norm and the LM head on the last row of each sequence only, (n, V).
// Numbers: the CPU computes in f32 through the same ops as the model, so a prompt's logits equal
// Model::logits' last row up to the attention's summation order; CUDA in bf16 (the model's bf16
// compute copy of the weights), cuDNN or lathe's attention as in training, attention_decode for
// decode; logits come back widened to f32.
//
// Tensor parallel (infer/tensor_parallel.h): given a communicator of T > 1 ranks, the model is
// a rank's shard (H/T heads, Hkv/T key/value heads, F/T MLP width) and the engine sums the
// partial outputs of the attention output projection and of the MLP down projection over the
// ranks (all_reduce, on the engine's stream on CUDA) before each residual add: one unfused
// projection, the reduce, then the residual (or the residual norm) in place of the fused op.
// On CUDA with limits.peer_reduce (PeerReduce below), a reduce of at most max_sequences rows (a
// decode step, a short prefill) goes through dist/peer_all_reduce.h (one kernel reading the peers'
// GPU memory, one rounding of the rank-order sum) where every rank reaches its peers; larger
// ones, and every reduce where they do not (one info line says why), through the communicator.
// The KV cache holds the rank's Hkv/T heads. Every rank must make the same calls with the same
// tokens: either every rank runs the same driver and takes rank 0's sampled tokens
// (agree_tokens; generate()), or rank 0 alone drives the engine after lead() and the other ranks
// replay its calls in follow(): each open, close, prefill, prefill_all and decode on rank 0 first
// sends the call (its sequence and tokens) to them, and stop_followers() ends their follow()
// (`lathe serve`, where only rank 0 has a scheduler). Without a communicator, or with one of
// size 1, nothing changes.
//
// CUDA graphs (limits.cuda_graphs): the paged decode step on CUDA (embedding, every layer's
// projections, cache writes and attention, the final norm and LM head into the logits scratch)
// is captured once per batch bucket (1, 2, 4, ... up to max_sequences, and max_sequences) and
// replayed; a step of n sequences runs the bucket of the smallest size >= n, its padding rows
// fed token 0 at position 0 with length 1, a slot of -1 (kv_rows_scatter skips it: no block is
// written) and a table of block 0 (read, never written); their logits are not read back. The
// step's tokens, positions, lengths, slots and tables are copied into the same device buffers
// before every replay; the logits' read-back follows the replay. A bucket's first step runs
// eagerly (the ops' one-time setup: cuBLASLt algorithm choice, kernel attributes), its second is
// captured. Tensor parallel: the graph holds the step's NCCL all-reduces too (NCCL captures them
// as graph nodes), and after each capture the ranks agree (a host all-reduce of each one's
// verdict) so that all replay the bucket's graph or none does, their collectives pairing up
// either way. Eager instead: the CPU; the row cache (its cache writes go to addresses chosen on
// the host per step); prefill (one sequence, shapes that change per chunk); a bucket whose capture
// CUDA refuses on any rank (a capture-specific error starting it, inside it or instantiating its
// graph: CudaGraph::capture_refused): one warning line, and that bucket launches eagerly from then
// on (the failed capture ran nothing). Any other error met while capturing, on any rank, is the
// decode step's error.
//
// Memory: the engine reads the model's weights (the model must outlive it) and owns the KV cache
// and one scratch arena sized for max(prefill_chunk, max_sequences) tokens, allocated once.
// Not thread-safe; one engine per model and stream.

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "dist/communicator.h"
#include "dist/peer_all_reduce.h"
#include "infer/kv_cache.h"
#include "infer/paged_kv_cache.h"
#include "model/block.h"
#include "model/model.h"
#include "ops/cuda/graph.h"
#include "ops/cuda/memory.h"

namespace lathe {

// Which GEMM runs the projections (q/k/v, attention output, MLP, LM head) of a forward of few
// rows, a decode step of a small batch (EngineLimits::decode_gemv). CUDA only; the CPU ignores it.
//   kOff   cuBLASLt, as every other forward
//   kOn    the skinny GEMM of ops/cuda/gemv.h whenever the rows (batch x tokens) are at most
//          cuda::kGemvMaxRows and the kernel takes the shape (cuda::gemv_supports)
//   kAuto  the same for at most kDecodeGemvAutoRows rows (the default): measured on an H100 at
//          the Llama-3-8B decode shapes (cuda_ops_bench --only decode_linear, docs/PERF.md), the
//          kernel is 1.00-1.18x cuBLASLt's speed at 1 and 2 rows on every projection and slower
//          at 4 rows on three of the five (0.79-0.83x), where its fp32 multiply-adds start to
//          cost more than the weights' bytes
enum class DecodeGemv : uint8_t { kOff, kOn, kAuto };
inline constexpr int64_t kDecodeGemvAutoRows = 2;

// "off", "on", "auto".
std::string_view decode_gemv_name(DecodeGemv mode);
// The mode named `text` ("auto", "on", "off"). Errors: any other text, naming `flag`.
Result<DecodeGemv> decode_gemv_parse(std::string_view text, std::string_view flag);

// How a CUDA tensor-parallel engine sums its ranks' partial outputs (EngineLimits::peer_reduce):
//   kOff   NCCL's all_reduce, always
//   kOn    PeerAllReduce (dist/peer_all_reduce.h) for reduces of at most max_sequences rows and
//          kPeerReduceMaxBytes, where every rank reaches its peers; NCCL for the others
//   kAuto  kOn with 4 ranks or more, kOff below: measured on four H100s of one NVLink host
//          (bench/all_reduce_bench.cu, docs/PERF.md), the one-shot sum takes 0.87-0.92x NCCL's
//          time per call from 16 to 128 KB over 4 GPUs, 1.22-1.54x from 256 KB to 1 MB, and
//          1.04-1.19x at every size over 2
enum class PeerReduce : uint8_t { kOff, kOn, kAuto };
inline constexpr int kPeerReduceAutoRanks = 4;
inline constexpr int64_t kPeerReduceMaxBytes = int64_t(128) << 10;

// "off", "on", "auto".
std::string_view peer_reduce_name(PeerReduce mode);
// The mode named `text` ("auto", "on", "off"). Errors: any other text, naming `flag`.
Result<PeerReduce> peer_reduce_parse(std::string_view text, std::string_view flag);

struct EngineLimits {
    int64_t max_sequences = 1;    // S: sequences open at once (KV cache rows)
    int64_t max_len = 0;          // Tmax: tokens per sequence; 0 = max_position_embeddings
    int64_t prefill_chunk = 256;  // tokens of one prefill forward
    // > 0: a paged KV cache (paged_kv_cache.h; CPU, and CUDA for head_dim % 8 == 0) of blocks
    // of this many positions, instead of max_sequences rows of max_len; kv_blocks is its pool
    // (0 = as many as max_sequences full-length sequences need).
    int64_t kv_block_size = 0;
    int64_t kv_blocks = 0;
    // CUDA with the paged cache (tensor parallel too): each decode step is replayed from a CUDA
    // graph of its batch bucket (header comment, "CUDA graphs"). Ignored elsewhere (eager).
    bool cuda_graphs = false;
    // The GEMM of a forward of few rows (DecodeGemv above).
    DecodeGemv decode_gemv = DecodeGemv::kAuto;
    // CUDA tensor parallel: small reduces through PeerAllReduce (PeerReduce above).
    PeerReduce peer_reduce = PeerReduce::kOff;
};

// One sequence's next token in a decode step.
struct DecodeStep {
    SeqId seq = 0;
    int32_t token = 0;
};

class InferenceEngine {
public:
    // Errors: limits below 1, max_len beyond max_position_embeddings, allocation failure, a
    // tensor-parallel communicator that cannot reduce the engine's memory.
    // `tensor_parallel`: the ranks sharing the model (header comment), or null; it must outlive
    // the engine.
    static Result<InferenceEngine> create(const Model& model, const EngineLimits& limits,
                                          Communicator* tensor_parallel = nullptr);

    // Whether a paged KV cache (EngineLimits::kv_block_size > 0) suits `config` where `ctx`
    // computes: always on the CPU; on CUDA, when the paged decode attention takes its head_dim
    // and GQA group within this device's shared memory per block (ops/attention.h,
    // attention_decode_paged_supports). create() refuses a paged cache otherwise; a caller that
    // picks the cache itself takes the row cache then. Errors: that function's, naming head_dim,
    // the group and the remedy.
    static Status paged_cache_supported(const ModelConfig& config, const Context& ctx);

    InferenceEngine(InferenceEngine&&) noexcept = default;
    InferenceEngine& operator=(InferenceEngine&&) noexcept = default;

    const ModelConfig& config() const { return model_->config(); }
    const EngineLimits& limits() const { return limits_; }
    int64_t vocab_size() const { return model_->config().vocab_size; }
    const KvCache& cache() const { return cache_; }  // the row cache (empty when paged)
    bool paged() const { return paged_; }
    const PagedKvCache& paged_cache() const { return paged_cache_; }
    // Paged: the pool's blocks and how many a sequence of `length` positions holds; 0 and 0 with
    // the row cache (a row holds max_len positions).
    int64_t kv_total_blocks() const { return paged_ ? paged_cache_.shape().blocks : 0; }
    int64_t kv_blocks_for(int64_t length) const {
        return paged_ ? paged_cache_.blocks_for(length) : 0;
    }

    // CUDA graphs: the batch buckets whose decode step is captured (0 without graphs).
    int64_t decode_graphs() const {
        int64_t n = 0;
        for (const CudaGraph& g : graphs_) n += g.empty() ? 0 : 1;
        return n;
    }

    // Tests only: the next CUDA-graph capture of a decode step makes an uncapturable call (a
    // stream synchronization) first, as a broken op would, so that the capture fails and the
    // bucket falls back to eager launches (header comment, "CUDA graphs").
    void testing_fail_next_graph_capture() { fail_next_capture_ = true; }

    // Ranks of the tensor-parallel group (1 without one) and this one's rank.
    int tensor_parallel() const { return tp_ ? tp_->size() : 1; }
    int tensor_parallel_rank() const { return tp_ ? tp_->rank() : 0; }
    // Whether small tensor-parallel reduces go through PeerAllReduce (limits.peer_reduce, and
    // every rank reached its peers).
    bool peer_all_reduce() const { return peer_ != nullptr; }
    // Tensor parallel: overwrites `tokens` with rank 0's (every rank calls it with as many), so
    // that every rank feeds the engine what rank 0 sampled. No-op otherwise. Errors: the
    // communicator's.
    Status agree_tokens(std::span<int32_t> tokens);
    // Tensor parallel, rank 0: every later open/close/prefill/prefill_all/decode is sent to the
    // other ranks before it runs here (header comment). No-op without tensor parallel.
    void lead();
    // Tensor parallel, the other ranks: runs rank 0's calls in its order until stop_followers();
    // a call that fails here failed alike on rank 0 (which reports it) and is skipped. Errors: the
    // communicator's, or a sequence id that differs from rank 0's (the ranks diverged).
    Status follow();
    // Rank 0 after lead(): ends the followers' follow(). Errors: the communicator's.
    Status stop_followers();

    // A new sequence of length 0; error when max_sequences are open.
    Result<SeqId> open();
    void close(SeqId seq);
    int64_t length(SeqId seq) const;
    int64_t open_sequences() const;

    // Appends `tokens` (at least one) to `seq` and writes the logits that follow the last one into
    // `logits` (V floats). Errors: an unknown sequence, no tokens, a token outside [0, V), more
    // tokens than max_len leaves room for.
    Status prefill(SeqId seq, std::span<const int32_t> tokens, std::span<float> logits);
    // The same, with the logits that follow every token of `tokens`: row t of `all_logits`
    // (tokens.size() x V floats) follows tokens[t] (the LM head runs on every position, in pieces
    // of max_sequences rows). A server's echo of prompt log-probabilities reads them.
    Status prefill_all(SeqId seq, std::span<const int32_t> tokens, std::span<float> all_logits);

    // Prefills several new sequences in one forward: prompts[i] (at least one token) into seqs[i]
    // (open, length 0, each listed once), padded to the longest prompt Tm; the logits that follow
    // each prompt's last token go to row i of `logits` (seqs.size() x V floats). The forward has
    // seqs.size() x Tm rows, so a batch of prompts of about one length fills the GPU's GEMMs as
    // one long prompt does where each alone would not; padding rows write no key or value and no
    // real query attends to them (they follow every real token of their row). The paged cache
    // only.
    // Errors: prefill's, and a row cache, a sequence not new or listed twice, or a batch
    // prefill_many_fits refuses.
    Status prefill_many(std::span<const SeqId> seqs,
                        std::span<const std::span<const int32_t>> prompts, std::span<float> logits);
    // Whether prefill_many takes prompts of these lengths in one forward: the paged cache, at
    // least one prompt, at most max_sequences, each at least 1 and within max_len, the longest at
    // least 2 (one-token prompts prefill alone), and their count times the longest within
    // prefill_chunk (and within a tensor-parallel message).
    bool prefill_many_fits(std::span<const int64_t> lengths) const;

    // Appends steps[i].token to steps[i].seq for every open sequence (each exactly once, any
    // order) and writes the logits that follow into rows i of `logits` (steps.size() x V floats).
    // Errors: a sequence missing, repeated, unknown or never prefilled; a token outside [0, V); a
    // sequence at max_len.
    Status decode(std::span<const DecodeStep> steps, std::span<float> logits);
    // decode() with each row's greedy pick in place of its logits: tokens[i] is the lowest id of
    // row i's largest logit (NaN as -inf; infer/sampling.h's temperature 0 without a repetition
    // penalty), picked where the logits are (ops/argmax.h: on CUDA n ids come back, not n x V
    // logits). Errors: decode's, and tokens.size() other than steps.size().
    Status decode_greedy(std::span<const DecodeStep> steps, std::span<int32_t> tokens);

    // Where the host's time of the last successful decode() or decode_greedy() went, in seconds,
    // three disjoint stretches of the call in order: `inputs` from the call to the step's forward
    // (checks, the tensor-parallel message, block tables and the inputs' upload), `forward` from
    // there until the logits are in host memory (kernel launches or the CUDA graph's, the
    // device's work and the read-back, which waits for it; the whole forward on the CPU) or, for
    // decode_greedy on CUDA, until the picks are (the argmax and the ids' read-back), `widen` the
    // logits widened to f32 into the caller's rows or the picks written there (on the CPU: the
    // argmax and the writes).
    struct DecodeTimes {
        double inputs = 0, forward = 0, widen = 0;
    };
    const DecodeTimes& last_decode_times() const { return decode_times_; }

private:
    InferenceEngine() = default;
    BlockWeights block_weights(int layer) const;
    // Rows [begin, end) of the parameter entry (role, layer) in the compute dtype; null if absent.
    TensorView weight(ParamRole role, int layer, int64_t begin, int64_t end) const;
    TensorView scratch(size_t index, const Shape& shape) const {
        return scratch_.view(index, shape);
    }
    void upload(TensorView dst, std::span<const int32_t> host) const;
    void copy(TensorView dst, ConstTensorView src) const;
    // A prefill's sequence and tokens (`op` names the call in the errors): open, at least one
    // token, each in the vocabulary, and room for them in the sequence's context.
    Status check_prefill(std::string_view op, SeqId seq, std::span<const int32_t> tokens) const;
    // The checks of one decode step both caches share, once the sequence is known open and
    // listed once: it has a prompt, room for one more token, and the token is in the vocabulary.
    Status check_decode_step(const DecodeStep& s, int64_t len) const;
    // The decode step's i32 inputs into their device views: to[i] from host[i] (every i when
    // host is given). On CUDA through the page-locked staging (pinned_inputs_): column i of it,
    // at i x max_sequences (tokens, positions, lengths, slots; the paged block tables after the
    // four), takes host[i] first, or holds what the caller staged there when host is empty; then
    // an asynchronous copy (the previous step's read-back waited for the stream, so no copy still
    // reads the staging).
    void upload_decode_inputs(std::span<const TensorView> to,
                              std::span<const std::span<const int32_t>> host);
    int32_t* staged_inputs() const { return static_cast<int32_t*>(pinned_inputs_.data()); }
    // Runs the blocks over x (B, T, C) = scratch x0 with the given attention; leaves the output
    // in the returned buffer (x0 or x1).
    template <typename Attend>
    Result<TensorView> run_blocks(int64_t B, int64_t T, ConstTensorView tokens,
                                  ConstTensorView positions, Attend&& attend);
    // Tensor parallel: `partial` (a projection's output on this rank) summed over the ranks, in
    // place.
    Status reduce(TensorView partial);
    // Final norm and LM head over the (n, C) rows `x`; logits widened to f32 into `out`, row r
    // into row out_row[r] (row r when out_row is empty). On CUDA the read-back is the call's one
    // wait for the stream.
    void last_logits(ConstTensorView x, int64_t n, std::span<float> out,
                     std::span<const int64_t> out_row = {});
    // last_logits in two halves: the final norm and LM head into the logits scratch (n, V), and
    // the read-back of its first rows.
    TensorView logits_forward(ConstTensorView x, int64_t n);
    void read_logits(ConstTensorView logits, int64_t n, std::span<float> out,
                     std::span<const int64_t> out_row = {});
    // CUDA graphs: the bucket of a step of n sequences.
    int64_t graph_bucket(int64_t n) const;
    // A decode step's projections of its n rows ln (n, 1, C), RoPE applied: q (n, 1, H, D), the
    // new keys and values k, v (n, 1, Hkv, D). One row: one linear over the stacked q/k/v
    // parameter (BlockWeights' wq, wk, wv are its row blocks) into the qkv scratch, whose row
    // holds q, k and v end to end, so the three are views of it: one GEMM instead of three, which
    // also gives the GPU more rows than k's or v's Hkv D alone (on every backend; on the CPU the
    // BLAS may sum a product in another order for this shape than for three, so its last bits can
    // differ from three linears'). More rows: three linears, into q_rows (n, 1, H, D) and the k/v
    // scratch.
    // A prefill's q, k and v projections of `ln` into q, k and v ((B, T, H or Hkv, D)), then
    // RoPE on q and k at `positions` (families with rotary positions).
    void project_qkv(const BlockWeights& w, ConstTensorView ln, const TensorView& q,
                     const TensorView& k, const TensorView& v, ConstTensorView positions,
                     const LinearSpec& spec);
    // project_qkv, then k and v into layer l's paged cache at `slots` (B T of them).
    void prefill_qkv_to_cache(int layer, const BlockWeights& w, ConstTensorView ln,
                              const TensorView& q, const TensorView& k, const TensorView& v,
                              ConstTensorView positions, ConstTensorView slots,
                              const LinearSpec& spec);
    struct DecodeQkv {
        TensorView q, k, v;
    };
    DecodeQkv decode_qkv(int layer, const BlockWeights& w, ConstTensorView ln,
                         const TensorView& q_rows, int64_t n, const LinearSpec& spec,
                         ConstTensorView positions);
    // Whether a forward of `rows` rows runs its projections through the skinny GEMM
    // (limits_.decode_gemv); sets LinearSpec::skinny_gemv.
    bool skinny_gemv(int64_t rows) const;
    // prefill and prefill_all: `logits` holds V floats (the last token's) or, with `all`,
    // tokens.size() x V.
    Status prefill_impl(SeqId seq, std::span<const int32_t> tokens, std::span<float> logits,
                        bool all);
    // What a decode step returns: every row's logits (V floats a row), or every row's greedy
    // token (`tokens` not empty).
    struct DecodeOut {
        std::span<float> logits;
        std::span<int32_t> tokens;
    };
    Status decode_impl(std::span<const DecodeStep> steps, DecodeOut out);
    Status decode_paged(std::span<const DecodeStep> steps, DecodeOut out);
    // The step's (n, V) logits on the device or host as `out` asks: read back widened
    // (read_logits) or picked (argmax_rows) and the n ids read back; row r goes to the caller's
    // row out_row[r] (empty: r).
    void emit_decode(ConstTensorView logits, int64_t n, DecodeOut out,
                     std::span<const int64_t> out_row);
    bool is_open(SeqId seq) const;
    Result<SeqId> open_here();  // open() without sending it
    // lead()/follow(): one call sent from rank 0 (op, sequence, payload of i64).
    enum class Op : int64_t {
        kOpen = 1,
        kClose,
        kPrefill,
        kPrefillAll,
        kDecode,
        kStop,
        kPrefillMany,
        kDecodeGreedy  // decode_greedy: the followers pick too, reading back n ids, not n x V
    };
    // The message of prefill_many: the count n, then (seq, length) n times, then the prompts end
    // to end.
    static std::vector<int64_t> prefill_many_message(
        std::span<const SeqId> seqs, std::span<const std::span<const int32_t>> prompts);
    Status prefill_many_impl(std::span<const SeqId> seqs,
                             std::span<const std::span<const int32_t>> prompts,
                             std::span<float> logits);
    int64_t message_capacity() const;
    Status send(Op op, int64_t seq, std::span<const int64_t> payload);
    Status send_tokens(Op op, SeqId seq, std::span<const int32_t> tokens);
    Status receive(int64_t head[3], std::vector<int64_t>& payload);
    Status broadcast_i64(int64_t* data, int64_t n);
    void set_length(SeqId seq, int64_t length);

    const Model* model_ = nullptr;
    Communicator* tp_ = nullptr;           // null or size 1: one process
    std::unique_ptr<PeerAllReduce> peer_;  // CUDA tensor parallel, limits.peer_reduce
    bool leading_ = false;                 // rank 0 after lead()
    Status lead_error_;  // a send of close() that failed, returned by the next call
    std::vector<int64_t> message_;
    EngineLimits limits_;
    Context ctx_;
    DType act_ = DType::kF32;
    KvCache cache_;
    bool paged_ = false;
    PagedKvCache paged_cache_;
    ModelArena scratch_;
    struct Index {
        size_t x0, x1, ln, mean, rstd, q, qkv, knew, vnew, att, lse, tmp, mlp_in, mlp_act, logits,
            tokens, positions, lengths, rope_cos, rope_sin, kgather, vgather, message, tables,
            slots;
    } ix_{};
    std::vector<int32_t> host_i32_;  // staging of tokens / positions / lengths
    std::vector<int32_t> host_pos_, host_len_;
    std::vector<int64_t> step_of_row_;  // decode: the step (caller's order) of batch row r
    // CUDA only (empty on the CPU): page-locked copies of a decode step's tokens, positions and
    // lengths (3 x max_sequences i32), uploaded from here asynchronously (the step's read-back,
    // which waits for the stream, comes after them, so the next step may rewrite them), and the
    // logits' read-back (max_sequences x V bf16). Allocated once, at create().
    PinnedHostBuffer pinned_inputs_, pinned_logits_;
    // decode()'s stretches (DecodeTimes): its start and its forward's, set by decode and
    // decode_paged; read_logits marks the logits staged in host memory (the forward's end);
    // note_decode_times, at a successful decode's end, computes the three.
    DecodeTimes decode_times_;
    std::chrono::steady_clock::time_point decode_start_, forward_start_, staged_at_;
    void note_decode_times();
    // CUDA graphs, indexed by bucket size (max_sequences + 1 entries): the captured step, whether
    // the bucket ran once eagerly, and whether its capture failed (eager from then on).
    std::vector<CudaGraph> graphs_;
    std::vector<char> graph_warm_, graph_failed_;
    bool fail_next_capture_ = false;  // testing_fail_next_graph_capture()
};

}  // namespace lathe
