#pragma once
// Stage 1 of `lathe align` (docs/ALIGN.md): mine domain terms from a corpus and write a
// target tokenizer.json that has them as tokens.
//
// Candidates. The domain corpus is normalized and pre-tokenized exactly as the source tokenizer
// does it (its own normalizer and pre-tokenizer). A candidate is
//   - a word: one pre-tokenizer piece whose text starts with a space followed by at least one
//     character and no further ASCII whitespace (byte-level " myocardial", i.e. "Ġmyocardial");
//   - an n-gram (2 <= n <= max_ngram, at most 3): n consecutive pieces of one document, each a
//     space followed only by letters, digits or non-ASCII characters (no punctuation, no second
//     whitespace). They are joined by simple concatenation, each keeping its own leading space, so
//     "Ġheart"+"Ġfailure" is the term " heart failure": exactly the text they cover.
// Only pieces that start with a space are candidates because the terms become Hugging Face added
// tokens (below), which match text wherever it occurs: a term "Myocardial" would also match inside
// " Myocardial" and leave a lone "Ġ" token behind, costing a token instead of saving one. With the
// leading space a term matches only where a word starts after a space, which is where the count
// was taken.
//
// Score = count x (pieces - 1): the tokens saved if the term were one token, where pieces is the
// number of source tokens of the term's text. With a general corpus it is multiplied by
// log(p_domain / p_general), p_domain = count / pieces in the domain corpus, p_general =
// (general count + smoothing) / pieces in the general corpus (smoothing 0.5 by default, so a term
// absent from the general corpus counts as seen half a time); terms not more frequent in the
// domain (ratio <= 1) score <= 0 and are dropped. Candidates below min_count, with one piece, or
// whose text already is a token of the source, are dropped. The top K by score (ties: term bytes)
// are kept.
//
// Target tokenizer. The source tokenizer.json with one entry per term appended to "added_tokens":
// {"id": V + i, "content": term, "single_word": false, "lstrip": false, "rstrip": false,
//  "normalized": true, "special": false}, V = the source's vocab_size (largest id + 1), i = rank.
// normalized=true because terms were mined from normalized text (NFC for gpt-neox and qwen3), so
// they are matched against the normalized text as HF does; the content is the raw text (" heart
// failure"), not its byte-level form, since added tokens are matched before the byte-level
// mapping. Added tokens, not vocabulary entries with merges: a byte-level BPE never sees a piece
// crossing a pre-tokenizer boundary, so merges cannot make an n-gram a token, and merges for a
// word need intermediate tokens that change the encoding of other words. A term decodes to its
// content (HF's ByteLevel decoder passes a token holding a character outside the byte alphabet,
// here the space, through unchanged). The written file is loaded back with lathe's tokenizer and
// every term checked to have its id.
//
// Reports. "<stem>.terms.tsv": a header "term\tcount\tpieces\tscore\tid" (+ "\tgeneral_count"
// with a general corpus), then one line per term in rank order. Terms hold no tab, newline or
// carriage return (the candidate rules exclude ASCII whitespace after the leading space), so the
// first column is the added token's content exactly, unescaped (stage 4 reads it so).
// "<stem>.new_tokens.json": {"source_tokenizer", "target_tokenizer", "source_vocab_size",
// "target_vocab_size", "tokens": [{"id", "content", "count", "score", "source_ids"}]}, where
// source_ids is the term's encoding under the source (the pieces FVT averages in stage 5).
//
// tokenizer_config.json: when the source has one (prepare_find_tokenizer_config: chat template,
// bos/eos/pad tokens), a copy is written beside the target (align_terms_tokenizer_config_path) with
// the terms added to its "added_tokens_decoder" (id -> the same properties as in tokenizer.json),
// so `lathe prepare --chat`, stage 5 and transformers find it.
//
// Streaming and memory. The calling thread cuts the inputs into batches of documents (in order,
// core/ordered_pool.h); every worker thread normalizes, pre-tokenizes and counts one batch into a
// local table, then merges it into a shared table split into locked shards. When the shared table
// holds more than max_table_entries keys, every key with a count below a floor is removed (the
// floor starts at 2 and grows until at most half the limit remains), so memory stays bounded by the
// limit; a pruned key that comes back starts again from 0, so its count can be low by at most the
// floors in force when it was removed (reported as `pruned` in TermsReport). Counts, and so the
// outputs, are exact and the same for any thread count when no pruning happened; with pruning and
// several threads, which keys are dropped depends on the order in which batches were merged.

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace lathe {

enum class TermsFormat { kAuto, kText, kTextBlocks, kJsonl };

// "auto", "text", "text-blocks", "jsonl"; the inverse is an error listing the valid names.
const char* terms_format_name(TermsFormat format);
Result<TermsFormat> terms_format_from_name(std::string_view name);

struct TermsOptions {
    std::string source_tokenizer;     // tokenizer.json (a byte-level BPE)
    std::vector<std::string> corpus;  // domain corpus files (text / JSONL; gzip, zstd)
    // Optional: enables the log(p_domain / p_general) factor.
    std::vector<std::string> general_corpus;
    std::string output;  // the target tokenizer.json
    // Reports beside it: "" = <output without .json>.terms.tsv / .new_tokens.json.
    std::string report;
    std::string new_tokens;
    // auto: per file, JSONL when its first non-blank line starts with '{', else one document per
    // line (as `lathe prepare`'s auto).
    TermsFormat format = TermsFormat::kAuto;
    std::string json_key = "text";
    int64_t top_k = 2000;
    int64_t min_count = 5;
    int max_ngram = 3;  // 1..3
    double smoothing = 0.5;
    uint64_t max_table_entries = uint64_t{1} << 24;
    // Invalid UTF-8, malformed JSONL, a document the source tokenizer's normalizer or
    // pre-tokenizer pattern gives up on: skip (counted) or fail.
    bool skip_bad_documents = false;
    int threads = 0;     // 0 = all cores
    bool force = false;  // rerun even when the stage cache says up to date
    bool show_progress = true;
    const std::atomic<bool>* cancel = nullptr;
};

// One kept term.
struct Term {
    std::string text;                 // the added token's content, e.g. " heart failure"
    int32_t id = 0;                   // its id in the target tokenizer
    uint64_t count = 0;               // occurrences in the domain corpus
    uint64_t general_count = 0;       // occurrences in the general corpus (0 without one)
    std::vector<int32_t> source_ids;  // its encoding under the source tokenizer (pieces = size)
    double score = 0.0;
};

struct TermsReport {
    std::vector<Term> terms;  // in rank order (ids source_vocab_size, +1, ...)
    int32_t source_vocab_size = 0;
    int32_t target_vocab_size = 0;
    uint64_t documents = 0;  // domain documents counted
    uint64_t general_documents = 0;
    uint64_t skipped = 0;  // bad documents skipped (skip_bad_documents)
    uint64_t pieces = 0;   // pre-tokenizer pieces in the domain corpus
    uint64_t general_pieces = 0;
    uint64_t input_bytes = 0;         // decompressed bytes of the domain corpus
    uint64_t candidates = 0;          // distinct candidates with count >= min_count
    int pruned = 0;                   // times the table was pruned (0: exact counts)
    uint64_t prune_floor = 0;         // the largest floor used
    double count_seconds = 0.0;       // reading and counting the domain corpus
    double seconds = 0.0;             // the whole stage
    bool skipped_up_to_date = false;  // outputs reused (nothing else in the report is set then)
    std::vector<std::string> outputs;
};

// Runs stage 1. Errors: a source tokenizer that cannot load or is not a byte-level BPE (its
// pre-tokenizer has no ByteLevel step), an unreadable input, a malformed document or one that a
// normalizer or pre-tokenizer pattern gives up on (file:line) unless skip_bad_documents, no
// documents at all, bad options (top_k < 1, min_count < 1, max_ngram outside 1..3),
// cancellation. Outputs are written atomically, the stage manifest last.
Result<TermsReport> align_terms_run(const TermsOptions& options);

// The checks align_terms_run makes of its source tokenizer before reading any corpus: valid JSON
// with an "added_tokens" array, and a ByteLevel pre-tokenizer without add_prefix_space. For
// callers that check every input before starting (`lathe align run`).
Status align_terms_check_tokenizer(const std::string& tokenizer_path);

// The report paths for an output tokenizer path: "<dir>/<stem>.terms.tsv" and
// "<dir>/<stem>.new_tokens.json" (stem = the file name without ".json").
std::string align_terms_default_report(const std::string& output);
std::string align_terms_default_new_tokens(const std::string& output);
// Where the target's tokenizer_config.json goes: "<dir>/tokenizer_config.json" for an output named
// tokenizer.json (a Hugging Face folder), else "<dir>/<stem>.tokenizer_config.json" (the layout
// prepare_find_tokenizer_config reads).
std::string align_terms_tokenizer_config_path(const std::string& output);

// The candidate keys (terms) of one document's pre-tokenizer pieces, given already decoded to
// raw bytes, in order; calls emit(term) once per occurrence. Exposed for tests.
//   is_word(piece):   ' ' then >= 1 non-whitespace bytes, no further ASCII whitespace
//   is_ngram_part:    ' ' then >= 1 bytes, each an ASCII letter or digit or a non-ASCII byte
template <typename Emit>
void terms_emit_candidates(const std::vector<std::string_view>& raw_pieces, int max_ngram,
                           Emit&& emit);

bool terms_is_word(std::string_view raw_piece);
bool terms_is_ngram_part(std::string_view raw_piece);

template <typename Emit>
void terms_emit_candidates(const std::vector<std::string_view>& raw_pieces, int max_ngram,
                           Emit&& emit) {
    std::string key;
    for (size_t i = 0; i < raw_pieces.size(); ++i) {
        const std::string_view p = raw_pieces[i];
        if (terms_is_word(p)) emit(p);
        if (max_ngram < 2 || !terms_is_ngram_part(p)) continue;
        // n-grams ending at piece i: pieces i-n+1 .. i, all n-gram parts, contiguous in the text.
        key.assign(p);
        for (int n = 2; n <= max_ngram && static_cast<size_t>(n) <= i + 1; ++n) {
            const std::string_view prev = raw_pieces[i + 1 - n];
            if (!terms_is_ngram_part(prev)) break;
            key.insert(0, prev);
            emit(std::string_view(key));
        }
    }
}

}  // namespace lathe
