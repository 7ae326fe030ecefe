#pragma once
// The token statistics that stage 3 (`lathe align embed`) trains on: the vocabulary of a token
// file (ids seen at least min_count times) and GloVe's weighted co-occurrence matrix.
//
// Documents are the token file's documents (its doc_idx): a window never crosses a document
// boundary. The GloVe C tool resets its window at each newline of its text input, so feeding it one
// document per line (what bench/embed_bench.sh does) gives the same matrix; TokAlign writes its
// token ids as lines of text too. Tokens below min_count are dropped before windows are formed,
// so they take no position (as GloVe's cooccur skips out-of-vocabulary words): the distance between
// two kept tokens counts the kept tokens between them.
//
//   X[a, b] = sum over positions p, q of one document with row(p) = a, row(q) = b,
//             1 <= |p - q| <= window:  1 / |p - q|      (or 1 without distance weighting)
//
// X is symmetric (GloVe's -symmetric 1); both (a, b) and (b, a) are stored, as GloVe stores them.

#include <cstdint>
#include <vector>

#include "core/status.h"
#include "data/indexed_dataset.h"

namespace lathe {

// The tokens kept for training. Rows are ordered by descending count, ties by ascending token id
// (GloVe's vocab_count orders by count too), so row 0 is the most frequent token.
struct EmbedVocab {
    std::vector<int32_t> token_of_row;  // (V) token id of each row
    std::vector<int64_t> count_of_row;  // (V) its count in the corpus
    std::vector<int32_t> row_of_token;  // (max id + 1) row of each token id, -1 below min_count
    int64_t corpus_tokens = 0;          // all tokens read, kept or not
    int64_t documents = 0;

    int64_t size() const { return int64_t(token_of_row.size()); }
};

// Counts every token of `data` on `threads` threads (0: all cores) and keeps the ids seen at least
// `min_count` times. Errors: a negative token id (names the document), a corpus with no token
// reaching min_count (says how many tokens it has and which option to lower).
Result<EmbedVocab> embed_count_vocab(const IndexedDataset& data, int64_t min_count, int threads);

// One nonzero of X (12 bytes). value is the sum above, accumulated in double and stored as float.
struct CooccurEntry {
    uint32_t row;  // a (word)
    uint32_t col;  // b (context)
    float value;
};

struct CooccurOptions {
    int window = 15;                            // context tokens on each side
    bool distance_weighting = true;             // 1/distance (GloVe's default) or 1
    int threads = 0;                            // 0: all cores
    uint64_t memory_bytes = uint64_t{4} << 30;  // soft limit for the counting tables, all threads
};

// X for `data` under `vocab`, sorted by (row, col); every stored value is > 0.
//
// How: rows are split into one shard per thread (greedily by count, so each shard sees about the
// same number of window events); every thread scans the whole corpus and adds the events whose
// centre row it owns into its own open-addressing hash table, so no two threads touch the same
// entry and no merge across threads is needed. When a table reaches its share of memory_bytes it
// is sorted into a run and emptied; runs of a shard are merged at the end. The result does not
// depend on the thread count when no table overflowed (each entry is summed in corpus order).
// Memory: the result (12 bytes per entry) plus the tables (at most memory_bytes, soft).
std::vector<CooccurEntry> cooccur_count(const IndexedDataset& data, const EmbedVocab& vocab,
                                        const CooccurOptions& options);

// Threads to use for a request of `threads` (0: hardware concurrency, at least 1).
int embed_thread_count(int threads);

}  // namespace lathe
