#pragma once
// Stage 6 of `lathe align` (docs/ALIGN.md): how good an alignment and an adapted model
// are. Three measures, each over the documents of one held-out text file:
//
// Alignment score (TokAlign's eval_matrix.py): for each document, tgt = the target tokenizer's ids
// and src = the source tokenizer's ids (both without special tokens); pred = [MAP[t] for t in
// tgt]; the document's score is sentence BLEU-1 of pred against the single reference src, as
// nltk's sentence_bleu(weights=(1,0,0,0)) computes it: clipped unigram precision times the brevity
// penalty (1 when len(pred) > len(src), else exp(1 - len(src)/len(pred)); 0 for an empty pred).
// The reported score is the mean over documents.
//
// Tokens per byte: tokens of every document (no special tokens) / UTF-8 bytes of the documents.
//
// Bits per byte of a checkpoint (tokenizer-independent, so models with different vocabularies
// compare): each document is tokenized separately with its tokenizer.json and
// add_special_tokens=true, and preceded by one boundary token when the tokenizer adds none at the
// front: the model's bos_token_id, else its first eos_token_id (what separates documents in
// pre-training), so that every text token is predicted from at least that token. The sequence
// s_0 .. s_n of a document (s_0 the boundary or the tokenizer's BOS) is cut into windows of at
// most T + 1 tokens that overlap by one: window i = s[iT, min(n, iT + T) + 1); each window predicts
// its tokens 1.. from the tokens before them within the window, so every s_1..s_n is predicted
// exactly once, with fresh context at each window start. Special tokens the tokenizer adds at the
// end (an EOS) are predicted too. bits/byte = sum of NLL (nats) / ln 2 / UTF-8 bytes of the
// documents. The forward runs on the Context the caller passes (`lathe align eval --device`: the
// CPU computes in fp32, CUDA in the model's bf16 compute copy, so the two differ slightly).

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "io/input.h"
#include "ops/context.h"

namespace lathe {

// BLEU-1 of one hypothesis against one reference, as nltk's sentence_bleu with weights (1,0,0,0).
double align_bleu1(std::span<const int32_t> hypothesis, std::span<const int32_t> reference);

// Reads the documents of a text file: one per line (kLines) or per blank-line-separated block.
// Empty documents are skipped. `max_documents` > 0 keeps the first ones only.
// Errors: the file's (naming it); no non-empty document.
Result<std::vector<std::string>> align_read_documents(const std::string& path,
                                                      TextRecordFormat format,
                                                      int64_t max_documents);

struct AlignEvalRequest {
    std::string documents;
    TextRecordFormat format = TextRecordFormat::kLines;
    int64_t max_documents = 0;
    // Alignment score (all three, or none).
    std::string map, source_tokenizer, target_tokenizer;
    // Tokens per byte under each of these tokenizer.json files.
    std::vector<std::string> tokenizers;
    // Bits per byte of each checkpoint (HF folder or lathe checkpoint, with its tokenizer.json).
    std::vector<std::string> checkpoints;
    int64_t seq_len = 512;  // T
    int64_t batch = 4;      // windows per forward (memory only)
};

struct AlignEvalTokenizer {
    std::string path;
    int64_t tokens = 0;
    double tokens_per_byte = 0.0;
};
struct AlignEvalModel {
    std::string checkpoint;
    int64_t predicted_tokens = 0;
    int64_t windows = 0;
    double nll_nats = 0.0;
    double bits_per_byte = 0.0;
};
struct AlignEvalResult {
    int64_t documents = 0;
    int64_t bytes = 0;
    bool has_alignment = false;
    double alignment_bleu1 = 0.0;
    std::vector<AlignEvalTokenizer> tokenizers;
    std::vector<AlignEvalModel> models;
};

// Bits per byte of one checkpoint over `documents` (see the file comment), the model's forward on
// `ctx`. Errors: a checkpoint that does not load or has no tokenizer.json, a tokenizer whose ids
// exceed the model's vocabulary, T beyond max_position_embeddings, no boundary token (the
// tokenizer adds no BOS and config.json names neither bos_token_id nor eos_token_id).
Result<AlignEvalModel> align_bits_per_byte(const Context& ctx, const std::string& checkpoint,
                                           std::span<const std::string> documents, int64_t seq_len,
                                           int64_t batch);

// Runs every requested measure (at least one must be requested). Errors: as the parts, a map whose
// size differs from the target tokenizer's.
Result<AlignEvalResult> align_eval_run(const Context& ctx, const AlignEvalRequest& request);

// One JSON line (no trailing newline).
std::string align_eval_result_json(const AlignEvalResult& result);

}  // namespace lathe
