#pragma once
// Token vectors on disk: GloVe's text format, keyed by token id (stage 3 -> stage 4).
//
//   <token id> v1 v2 ... vD\n        one line per token seen in the corpus, fields separated by
//                                    one space, values as decimal floats
//
// This is what the GloVe C tool writes (`glove -model 2` without `-write-header`), with token ids
// as the words, so TokAlign's own scripts read lathe's files and lathe reads the reference tools'
// files. The reader also accepts what those tools add around the rows:
//   - a first line "N D" (word2vec / fastText `.vec`, GloVe `-write-header 1`): checked, skipped;
//   - rows whose word is not a token id (GloVe's `<unk>` average row, fastText's `</s>`): skipped
//     and named in TokenVectors::skipped, since they stand for no token of the vocabulary.
// Values are written in the shortest form that reads back to the same float, so a write/read
// round trip is exact.

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"

namespace lathe {

// N token vectors of D dimensions, row-major: the vector of ids[i] is values[i*D, (i+1)*D).
struct TokenVectors {
    int64_t dim = 0;                   // D
    std::vector<int32_t> ids;          // (N) token ids, in file order, no duplicates
    std::vector<float> values;         // (N, D)
    std::vector<std::string> skipped;  // words of rows that were not token ids ("<unk>", "</s>")

    int64_t size() const { return int64_t(ids.size()); }
    std::span<const float> row(int64_t i) const { return {values.data() + i * dim, size_t(dim)}; }
    // Row index of each token id in [0, vocab_size): -1 for ids without a vector. Ids >= vocab_size
    // are ignored (the caller decides whether that is an error).
    std::vector<int64_t> rows_by_id(int64_t vocab_size) const;
};

// Writes `vectors` in the text format above, atomically (io/file.h): ids.size() lines, one per
// row. Requires values.size() == ids.size() * dim and dim > 0 (checked). Errors: the folder does
// not exist or is not writable.
Status vectors_write_text(const std::string& path, const TokenVectors& vectors);

// Reads a file in the text format above. Errors name the file and line: a row whose value count
// differs from the first row's (or from a header's D), a value that is not a finite decimal
// number, a token id that appears twice or does not fit int32, a header whose N does not match
// the rows read, a file with no rows.
Result<TokenVectors> vectors_read_text(const std::string& path);

}  // namespace lathe
