#pragma once
// Stage 5 of `lathe align` (docs/ALIGN.md): a new checkpoint with the target tokenizer.
//
//   lathe align apply --checkpoint DIR --map MAP.json --target-tokenizer T.json --output OUT
//                     [--init align|fvt|mean|random] [--fvt-weighting mean|exponential]
//                     [--align-weight W] [--align-head-weight H]
//
// The checkpoint (an HF folder, a lathe checkpoint or run folder: run/convert.h's rules) is read
// through the family's parameter table (model/registry.h). Every tensor except the token embedding
// and the untied output head is written unchanged (same bytes, same dtype). The embedding E and
// head H of the new vocabulary (V' rows, V' = the target tokenizer's size padded, below) are:
//
//   align   (default) row t = source row MAP[t] for gold ids, and for aligned ids that row mixed
//           with the id's FVT row (below; TokAlign's gather with weights 1);
//           FVT for the ids the map's report marks term / fvt / threshold. Without a report every
//           id is gathered.
//           --align-weight W / --align-head-weight H (default 0.25 each; 1 = TokAlign's plain
//           gather) mix an aligned id's gathered row with its FVT row: W * source row + (1 - W) *
//           FVT row (embedding; H for an untied head).
//   fvt     row t = source row of the same token string when the source vocabulary has it
//           (exact match), else FVT. The map is not read.
//   mean    every row = mean source row + normal noise of 1% of the rows' per-dimension std.
//   random  every row ~ normal(0, initializer_range), the family's own init.
//
// FVT (Gee et al. 2022): the target token's raw bytes (align_token_bytes) are cut by the source
// tokenizer into pieces p_1..p_k (align_fvt_pieces) and the row is the mean of their source rows.
// With --fvt-weighting exponential (AdaptiVocab) the input embedding weights piece i by
// exp(2 i) and the output head by exp(-2 i) (normalised): the input row leans on the last piece
// (what the next prediction follows), the output row on the first (what predicting the token
// starts like). A token with no pieces (an empty or unspellable entry) gets the mean row.
//
// Padding: V' = the target size rounded up to `pad_to_multiple`. The default follows the family:
// GPT-NeoX pads to a multiple of 128 (its Megatron heritage; Pythia's 50304 rows for 50277
// tokens); the others are not padded, unless the source model itself was (its vocab_size exceeds
// its tokenizer's and is a multiple of 128: lathe's trainer pads every family so), then 128.
// Padding rows are the mean rows (HF's resize_token_embeddings does the same).
//
// config.json: vocab_size = V'; bos/eos/pad token ids are the target tokenizer's
// (run/special_tokens.h, SpecialIdsMode::kFromTokenizerElseCarried: from its
// tokenizer_config.json, else its <|endoftext|> or post-processor tokens); where the target
// defines no such token, the source id translated by token string stays (dropped when the target
// has no such token either). The target
// tokenizer.json is written as tokenizer.json, with its tokenizer_config.json when one sits next to
// it ("<stem>.tokenizer_config.json" or "tokenizer_config.json" in the same folder), else with one
// made from its special tokens (special_tokens_tokenizer_config). No optimizer
// state: the output is a Hugging Face folder that transformers loads and `lathe train`
// (checkpoint.init_from) fine-tunes. Written in a hidden sibling folder and renamed when complete.

#include <cstdint>
#include <optional>
#include <string>

#include "core/status.h"

namespace lathe {

enum class AlignInit : uint8_t { kAlign, kFvt, kMean, kRandom };
enum class FvtWeighting : uint8_t { kMean, kExponential };

// "align", "fvt", "mean", "random".
std::string_view align_init_name(AlignInit init);

struct AlignApplyRequest {
    std::string checkpoint;        // source model folder
    std::string map;               // MAP.json (required for kAlign)
    std::string report;            // "" = align_report_path(map), used when it exists
    std::string target_tokenizer;  // tokenizer.json
    std::string source_tokenizer;  // "" = the checkpoint's tokenizer.json
    std::string output;            // folder to create
    AlignInit init = AlignInit::kAlign;
    FvtWeighting fvt_weighting = FvtWeighting::kMean;
    // --init align, ids the report marks aligned (not gold): input-embedding row = align_weight *
    // source row MAP[t] + (1 - align_weight) * FVT row; the untied head's row the same with
    // align_head_weight (a tied model uses align_weight). Both in [0, 1]; 1 and 1 = TokAlign's
    // gather. The default 0.25 / 0.25 was chosen on held-out GCIDE in the quality study
    // (docs/ALIGN.md, "Quality"): it beat TokAlign's gather, FVT, 0.5/0.5 and 0.25/0 there, and
    // then beat FVT and random on the held-out medical text for both targets.
    double align_weight = 0.25;
    double align_head_weight = 0.25;
    std::optional<int64_t> pad_to_multiple;  // default: see the header comment
    uint64_t seed = 0;                       // mean / random noise
    bool overwrite = false;
};

struct AlignApplyResult {
    std::string output;
    std::string architecture;
    int64_t source_vocab = 0;   // rows of the source embedding
    int64_t target_tokens = 0;  // the target tokenizer's size
    int64_t vocab_size = 0;     // rows written (padded)
    int64_t gathered = 0;       // rows copied from a source row
    int64_t fvt = 0;            // rows made by FVT
    int64_t blended = 0;        // aligned rows mixed with their FVT rows (align_weight < 1)
    int64_t mean_rows = 0;      // rows set to the mean (no pieces, padding, --init mean)
    int64_t random_rows = 0;
    bool tied = false;
};

// Errors: those of run/convert.h for the checkpoint; kInvalidArgument (naming the file) for a map
// whose size differs from the target tokenizer's or whose source ids exceed the source embedding,
// a source tokenizer larger than the model's vocabulary (the model does not match its tokenizer),
// a missing source tokenizer, an OUTPUT folder that exists and is not empty without `overwrite`;
// kUnimplemented for an unsupported architecture.
Result<AlignApplyResult> align_apply_run(const AlignApplyRequest& request);

// One JSON line (no trailing newline).
std::string align_apply_result_json(const AlignApplyResult& result);

}  // namespace lathe
