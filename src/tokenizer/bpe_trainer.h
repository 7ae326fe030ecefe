#pragma once
// Byte-level BPE training, merge for merge as Hugging Face `tokenizers`' BpeTrainer.
//
// Input: pre-tokenized words with their counts (WordCounts); a word is the raw bytes of one
// pre-tokenizer split. Output: a vocabulary and an ordered merge list (BpeTrainerResult), which
// bpe_trainer_tokenizer_json() turns into a tokenizer.json.
//
// The vocabulary is laid out as HF lays it out: the special tokens first (ids 0..k-1, duplicates
// dropped), then the 256 byte-level symbols sorted by their Unicode code point (the order of
// HF's ByteLevel.alphabet() after BpeTrainer's sort, which is GPT-2's order), then one entry per
// merge that produces a new string.
//
// Merge selection (HF's rule, reproduced): the pair with the highest count is merged next; among
// equal counts the pair (left id, right id) that is smallest in lexicographic order of the ids
// wins. Counts are updated incrementally from the words each merge touches, and a max-heap with
// lazy invalidation (an entry whose count is stale is re-queued with the current count) picks
// the next pair, so a run costs O(merges x affected words), not O(merges x corpus).
// HF's quirks are reproduced on purpose, because they change which merges come out:
//   - The count of a merged pair is not reset; overlapping occurrences ("a a a") lower it.
//   - A merge whose result already is a token (a merge that spells a special token) adds no
//     vocabulary entry but is kept in the merge list.
//   - A merge is applied only to the words recorded with its queue entry; every time a merge
//     creates new occurrences of a pair, a new entry carrying just those words is queued, so after
//     such a repeated token a pair can have several entries and be merged more than once. The
//     merge list then keeps the pair's last position (HF builds its merge map from the list, later
//     ranks overwriting earlier ones). With global merges and byte symbols this needs a special
//     token to collide with, so it is rare; it is reproduced all the same.
// Training stops when the vocabulary has vocab_size entries, when no pair is left, or when the
// best pair occurs fewer than min_frequency times. Deterministic: the result does not depend on
// the number of threads or on the order in which words were counted.

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/status.h"

namespace lathe {

class PreTokenizer;
class Progress;

// Words and their counts: an arena-backed hash map split into shards by hash, so that counts made
// by several threads (one WordCounts each) merge shard by shard in parallel. Not thread-safe;
// one writer at a time.
class WordCounts {
public:
    // shard_count >= 1; use the same shard count for maps that will be merged.
    explicit WordCounts(int shard_count = 16);
    WordCounts(WordCounts&&) noexcept;
    WordCounts& operator=(WordCounts&&) noexcept;
    ~WordCounts();

    // Adds `count` occurrences of `word` (any bytes; the empty word is ignored, as HF's trainer
    // produces no symbols for it).
    void add(std::string_view word, uint64_t count = 1);
    // add(w, 1) for every word, faster for many: all hashes first, each word's slot fetched from
    // memory ahead of its insertion, so cache misses overlap instead of queueing.
    void add_many(std::span<const std::string_view> words);

    // Adds every word of each part into *this, shard by shard on up to `threads` threads; the
    // parts are left empty. Every part must have this map's shard count (checked).
    void merge_from(std::vector<WordCounts>& parts, int threads);

    // Number of distinct words / sum of all counts.
    size_t size() const;
    uint64_t total() const;
    // The count of `word` (0 when absent).
    uint64_t count(std::string_view word) const;

    // Every (word, count) in an order fixed by the words alone (a hash of the word, then its
    // bytes), whatever the order they were added in. The views point into this map and stay
    // valid until it is modified or destroyed.
    std::vector<std::pair<std::string_view, uint64_t>> entries() const;
    // Calls f(word, count) for every word, in no particular order (views valid as for entries()).
    void visit(const std::function<void(std::string_view, uint64_t)>& f) const;

private:
    struct Shard;
    int shard_for(uint64_t hash) const;
    std::vector<std::unique_ptr<Shard>> shards_;
};

// Documents handed to bpe_count_words in batches: document i is
// text[(i ? ends[i-1] : 0) .. ends[i]), found at line lines[i] of `origin` (for error messages).
struct BpeDocumentBatch {
    std::string text;
    std::vector<size_t> ends;
    std::vector<uint64_t> lines;
    std::string origin;
    void clear() {
        text.clear();
        ends.clear();
        lines.clear();
    }
    size_t size() const { return ends.size(); }
    std::string_view document(size_t i) const {
        const size_t begin = i ? ends[i - 1] : 0;
        return std::string_view(text).substr(begin, ends[i] - begin);
    }
};

// Fills `batch` (already cleared) with the next documents and returns true, or returns false at
// the end of the input. Called by one thread at a time.
using BpeBatchReader = std::function<Result<bool>(BpeDocumentBatch& batch)>;

// What to do with a document that is not valid UTF-8, or that the pre-tokenizer's pattern gives
// up on.
enum class BpeOnError { kFail, kSkip };

// What counting saw, beyond the words.
struct BpeCountStats {
    uint64_t documents = 0;     // documents counted (skipped ones excluded)
    uint64_t bytes = 0;         // their bytes
    uint64_t skipped = 0;       // documents skipped as bad (kSkip)
    std::string first_skipped;  // "file:line" of the first one skipped
};

// Counts the words of every document that `next_batch` yields, cut exactly as `pre_tokenizer`
// cuts them when encoding (HF's trainer feeds the same splits), on `threads` threads: each thread
// counts into its own WordCounts, merged shard by shard at the end. The pre-tokenizer must end in
// ByteLevel (its pieces are byte-level text); words are returned as the raw bytes they stand for.
// A document that is not valid UTF-8 is an error naming its file and the line of the first bad
// byte (kFail), or is left out and counted in `stats` (kSkip); so is a document that the
// pre-tokenizer's pattern gives up on (it backtracks too far; the error names the document's
// first line). `progress` and `stats` may be null. Errors: the reader's; bad documents under
// kFail. A worker's error comes back here as a Status.
Result<WordCounts> bpe_count_words(const PreTokenizer& pre_tokenizer,
                                   const BpeBatchReader& next_batch, int threads,
                                   BpeOnError on_error, Progress* progress, BpeCountStats* stats);

struct BpeTrainerOptions {
    // Target vocabulary size, special tokens and the 256 byte symbols included. Must be at least
    // (distinct special tokens + 256).
    int64_t vocab_size = 30000;
    // A pair occurring fewer times than this is never merged (HF's min_frequency; 0 and 1 are
    // equivalent).
    uint64_t min_frequency = 0;
    // Added at ids 0..k-1 in this order; a repeated string keeps its first id.
    std::vector<std::string> special_tokens;
    // Threads for counting pairs and applying merges (results do not depend on it).
    int threads = 1;
};

enum class BpeStopReason {
    kVocabSizeReached,  // the vocabulary has vocab_size entries
    kNoPairsLeft,       // every word is a single symbol
    kMinFrequency,      // the best remaining pair occurs fewer than min_frequency times
};
const char* bpe_stop_reason_name(BpeStopReason reason);

struct BpeTrainerResult {
    // id -> token, in byte-level form (each byte shown as GPT-2's printable stand-in: "Ġthe").
    std::vector<std::string> vocab;
    // Merges in rank order, as (left id, right id) into `vocab`.
    std::vector<std::pair<int32_t, int32_t>> merges;
    // Ids of the special tokens, in the order given (duplicates collapse onto the first id).
    std::vector<int32_t> special_ids;
    BpeStopReason stop_reason = BpeStopReason::kVocabSizeReached;
    // Merge steps taken, repeats of an already merged pair included (>= merges.size()).
    int64_t merge_steps = 0;
};

// Trains on `words`. Errors: vocab_size below (distinct special tokens + 256), an empty special
// token, threads < 1. A corpus too small to reach vocab_size is not an error: the result is
// smaller and stop_reason says why.
Result<BpeTrainerResult> bpe_train(const WordCounts& words, const BpeTrainerOptions& options);

// The 256 byte-level symbols: byte b is shown as the UTF-8 string bpe_byte_symbol(b) (GPT-2's
// bytes_to_unicode: printable Latin-1 bytes stand for themselves, the others map to U+0100..).
std::string bpe_byte_symbol(uint8_t byte);

// Which pre-tokenizer the trained tokenizer.json carries.
enum class BpePreTokenizerKind {
    kGpt2,              // ByteLevel with GPT-2's regex (add_prefix_space false)
    kLlama3,            // Split with Llama-3's regex (Isolated), then ByteLevel without regex
    kByteLevelNoRegex,  // ByteLevel without regex: each document (or line) is one word
};
// "gpt2" | "llama3" | "bytelevel-noregex", or an error listing the valid names.
Result<BpePreTokenizerKind> bpe_pre_tokenizer_kind_from_name(std::string_view name);
// The JSON object (text) of the tokenizer.json "pre_tokenizer" field for `kind`.
std::string bpe_pre_tokenizer_json(BpePreTokenizerKind kind);

// The complete tokenizer.json text for a trained model: BPE model (vocab + merges in ["a","b"]
// form), the pre-tokenizer of `kind`, ByteLevel decoder and post-processor, and the special tokens
// as added_tokens (special=true, normalized=false), as HF's Tokenizer.train writes them.
std::string bpe_trainer_tokenizer_json(const BpeTrainerResult& result, BpePreTokenizerKind kind);

}  // namespace lathe
