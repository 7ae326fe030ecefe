#pragma once
// Stage 4 of `lathe align` (docs/ALIGN.md): map every target-tokenizer id to a
// source-tokenizer id from token embeddings trained on the same corpus under both tokenizers.
//
// The algorithm (TokAlign's, with the fixes the issue asks for):
//   1. Gold pairs: target tokens whose string is also a source token (TokAlign's exact match over
//      the full vocabularies, added tokens included). With AlignMatch::kByteLevelAware a target
//      token left unmatched is also matched through its raw bytes, so that byte-level BPE's
//      "Ġword", SentencePiece's "▁word" and a plain " word" (an added token) meet, and a byte
//      token "<0x0A>" meets byte-level "Ċ".
//   2. Pivots: the gold pairs are shuffled with `seed`; the first `pivots` whose target id has a
//      target vector and whose source id has a source vector are the pivots.
//   3. Relative representation of a token = its cosines to the pivots of its own side:
//      rel(x) = unit(x) · unit(P)ᵀ, a (pivots)-vector. Both sides now live in the same coordinates.
//   4. Similarity of target token t and source token s: rel(t) · rel(s) (AlignSimilarity::kDot,
//      exactly TokAlign's cal_trans_matrix.py: it multiplies the relative representations without
//      normalising them), or their cosine (kCosine: rel rows scaled to unit length first).
//   5. Each target id is decided in this order:
//        gold       it has a gold partner (kept, whatever the vectors say);
//        term       it is listed in `terms` (mined terms: initialised by FVT in stage 5);
//        fvt        it has no target vector (never seen in the corpus): stage 5 gives it the FVT
//                   initialisation instead of TokAlign's random source id;
//        aligned    the source token with the highest similarity; the second best when the best is
//                   the source tokenizer's unknown token (GloVe's own "<unk>" row has no id and is
//                   never a candidate);
//        threshold  as aligned, but the best similarity is below `threshold`: FVT in stage 5.
//      For term / fvt / threshold the JSON map still needs a source id (TokAlign's format has one
//      for every target id): the first source piece of the token's text (see align_fvt_pieces),
//      or the aligned id for threshold.
//
// Compute: the similarity matrix (target rows x source rows, up to 256k x 152k) is never stored.
// It is computed in tiles by GEMM (BLAS on the CPU, cuBLAS on the GPU), each tile reduced at once
// to a running per-row top-2; memory is the two relative-representation matrices plus one tile per
// thread. Ties go to the lower source row, on both backends.

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "align/vectors.h"
#include "core/status.h"
#include "ops/context.h"
#include "tokenizer/tokenizer.h"

namespace lathe {

// ---- token spellings (shared with stage 5) ----

// How a tokenizer spells the text of its vocabulary entries.
enum class TokenSpelling : uint8_t {
    kPlain,          // the entry is the text (WordPiece-like, or added tokens)
    kByteLevel,      // GPT-2 byte-to-unicode: each byte one printable character ("Ġ" = space)
    kSentencePiece,  // "▁" for a space, "<0xNN>" byte-fallback entries
};

// A tokenizer with what stage 4/5 need beyond encoding: its spelling, which ids are added tokens
// (their content is plain text whatever the model's spelling) and its unknown token.
struct AlignTokenizer {
    Tokenizer tokenizer;
    std::string path;
    TokenSpelling spelling = TokenSpelling::kPlain;
    std::optional<int32_t> unk_id;  // model.unk_token, when the vocabulary has it
    std::vector<uint8_t> added;     // per id: 1 = an added token (added_tokens[])
    std::vector<uint8_t> special;   // per id: 1 = a special added token
};

// Loads tokenizer.json at `path` and reads its spelling from the decoder / pre-tokenizer
// (ByteLevel -> kByteLevel; Metaspace, or a Replace of "▁", or model.byte_fallback ->
// kSentencePiece; else kPlain). Errors: those of Tokenizer::load; kInvalidArgument for a file
// whose added_tokens are malformed.
Result<AlignTokenizer> align_load_tokenizer(const std::string& path);

// The raw bytes a vocabulary entry stands for: for a byte-level entry the bytes its characters
// encode; for SentencePiece "▁" -> " " and "<0xNN>" -> that byte; added tokens and plain spellings
// as written. nullopt when the entry is not spelled as its spelling says (e.g. a byte-level entry
// with a character outside the byte table), or the id is unused.
std::optional<std::string> align_token_bytes(const AlignTokenizer& tok, int32_t id);

// The source ids whose embeddings FVT averages for target token `target_id`: the source
// tokenizer's encoding (no special tokens) of the target token's raw bytes when they are valid
// UTF-8; else the source's byte entries for each byte (byte-level characters or "<0xNN>"). An
// empty result means no pieces could be found (the caller falls back to the mean row).
std::vector<int32_t> align_fvt_pieces(const AlignTokenizer& target, int32_t target_id,
                                      const AlignTokenizer& source);

// ---- the similarity top-2 (the compute kernel; CPU here, CUDA in map.cu) ----

// For each row i of A, the two best rows of B by score(i, j) = A[i] · B[j] (higher is better),
// ties to the lower j. best/second are -1 (score -inf) when B has fewer rows.
struct AlignTop2 {
    int32_t best = -1;
    int32_t second = -1;
    float best_score = 0.0f;
    float second_score = 0.0f;
};

// A (M, K) and B (N, K), row-major f32, host. out has M entries (=). Computed by tiles of
// `tile_rows` x `tile_cols` scores through BLAS sgemm, each tile merged into the running top-2;
// tiles of A rows run in parallel (OpenMP). Deterministic: the result does not depend on the
// thread count (each row's tiles are visited in column order).
void align_top2_cpu(std::span<AlignTop2> out, const float* A, int64_t M, const float* B, int64_t N,
                    int64_t K, int64_t tile_rows = 256, int64_t tile_cols = 8192);

// Whether this build has the CUDA path (LATHE_HAVE_CUDA) and a GPU is visible.
bool align_top2_cuda_available();
#ifdef LATHE_HAVE_CUDA
// The CUDA twin of align_top2_cpu on the CUDA context `ctx` (its CudaState's stream, cuBLASLt
// handle and workspace): A and B are host matrices, copied to the device; scores by the backend's
// GEMM per tile (ops/cuda/gemm.h: f32, fp32 accumulation, no TF32), then a top-2 kernel (one warp
// per row) merges the tile into the running top-2 kept on the device. Same contract and tie rule;
// scores can differ from the CPU's by GEMM rounding (so can the order of near-ties). Device memory:
// A, B, one tile_rows x tile_cols score tile, allocated for the call and freed on return. Errors:
// kFailedPrecondition when the device's free memory is short (named, with the sizes). Returns
// after the results are on the host.
Status align_top2_cuda(const Context& ctx, std::span<AlignTop2> out, const float* A, int64_t M,
                       const float* B, int64_t N, int64_t K, int64_t tile_rows = 16384,
                       int64_t tile_cols = 8192);
#endif

// ---- the whole stage ----

enum class AlignMatch : uint8_t { kExact, kByteLevelAware };
enum class AlignSimilarity : uint8_t { kDot, kCosine };
enum class AlignDevice : uint8_t { kAuto, kCpu, kCuda };
enum class AlignDecision : uint8_t { kGold, kTerm, kFvt, kAligned, kThreshold };

// "gold", "term", "fvt", "aligned", "threshold".
std::string_view align_decision_name(AlignDecision d);
// Inverse of align_decision_name.
std::optional<AlignDecision> align_decision_from_name(std::string_view name);

// The gold map: for each target id, the source id of the same vocabulary entry (exact string
// match, added tokens included), or -1. kByteLevelAware also matches a non-special target entry
// left unmatched to the lowest non-special source id whose raw bytes (align_token_bytes) are equal.
std::vector<int32_t> align_gold_map(const AlignTokenizer& source, const AlignTokenizer& target,
                                    AlignMatch match);

// Reads token vectors (align/vectors.h, GloVe's text format) for a tokenizer of `vocab_size` ids.
// Errors: those of vectors_read_text; kInvalidArgument naming the file and the id when an id is
// >= vocab_size (the vectors belong to another tokenizer).
Result<TokenVectors> align_load_vectors(const std::string& path, int32_t vocab_size);

struct AlignMapRequest {
    std::string source_tokenizer, target_tokenizer;
    std::string source_vectors, target_vectors;
    std::string output;  // MAP.json
    std::string report;  // per-token TSV; "" = output with .json replaced by .report.tsv
    std::string terms;   // optional: stage 1's terms TSV (term in the first column)
    int64_t pivots = 300;
    uint64_t seed = 0;
    AlignMatch match = AlignMatch::kExact;
    AlignSimilarity similarity = AlignSimilarity::kDot;
    std::optional<double> threshold;
    AlignDevice device = AlignDevice::kAuto;
    bool force = false;  // recompute even when the stage cache says the outputs are up to date
};

// One target id's outcome.
struct AlignEntry {
    int32_t source_id = 0;
    AlignDecision decision = AlignDecision::kAligned;
    float similarity = 0.0f;  // the chosen source token's score (aligned / threshold), else 0
};

struct AlignMapResult {
    std::vector<AlignEntry> entries;  // one per target id
    int64_t gold = 0, gold_exact = 0, terms = 0, fvt = 0, aligned = 0, below_threshold = 0;
    int64_t pivots = 0;
    std::string device;  // "cpu" or "cuda"
    std::string output, report;
    double seconds_top2 = 0.0;
    bool skipped = false;  // outputs were up to date (stage cache); entries is then empty
};

// The in-memory stage: gold map, pivots, relative representations, top-2, decisions.
// `terms` are target ids to mark kTerm. Errors: kFailedPrecondition when the tokenizers share no
// token, or no gold pair has vectors on both sides (no pivots; the message says how many gold
// pairs there were and how many had vectors); kInvalidArgument for vectors of different dims on
// one side.
Result<AlignMapResult> align_map_compute(const AlignTokenizer& source, const AlignTokenizer& target,
                                         const TokenVectors& source_vectors,
                                         const TokenVectors& target_vectors,
                                         std::span<const int32_t> terms,
                                         const AlignMapRequest& request);

// Reads the files, computes, and writes MAP.json ({"target_id": source_id, ...} for every target
// id in id order, TokAlign's format) and the report TSV (header `target_id token decision
// source_id source_token similarity`; tokens escaped as \t \n \\ ...), both atomically, then the
// stage manifest (align/stage_cache.h): a rerun with the same inputs and settings is skipped.
Result<AlignMapResult> align_map_run(const AlignMapRequest& request);

// The report path for a map path: "X.json" -> "X.report.tsv" (else PATH + ".report.tsv").
std::string align_report_path(const std::string& map_path);

// Reads a map written by align_map_run or by TokAlign: an object of "target_id": source_id.
// Returns one source id per target id (size = largest target id + 1). Errors (naming the file):
// not a JSON object, a key that is not an id, a value that is not a non-negative integer, or an
// id missing between 0 and the largest.
Result<std::vector<int32_t>> align_read_map(const std::string& path);

// Reads the decisions of a report TSV (size = rows). Errors name file and line.
Result<std::vector<AlignDecision>> align_read_report(const std::string& path);

// Target ids of the terms in a TSV whose first column is a term (a header line "term..." is
// skipped): each term's id in the target vocabulary (looked up as an added token, then through
// its spelling). Terms the tokenizer does not have as one token are an error naming the line.
Result<std::vector<int32_t>> align_read_terms(const std::string& path,
                                              const AlignTokenizer& target);

// The result as one JSON line (no trailing newline).
std::string align_map_result_json(const AlignMapResult& result);

}  // namespace lathe
