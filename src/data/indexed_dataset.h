#pragma once
// Token files: the MMapIndexedDataset pair `<prefix>.bin` + `<prefix>.idx` of GPT-NeoX
// (megatron/data/indexed_dataset.py) and Megatron-LM (megatron/core/datasets/indexed_dataset.py),
// written and read byte for byte as they do. docs/formats/token-files.md is the full description;
// in short, all little-endian:
//
//   .idx  "MMIDIDX\0\0" (9 bytes) | version u64 = 1 | dtype code u8 | S = sequences u64 |
//         D = doc_idx entries u64 | sizes int32[S] | pointers int64[S] | doc_idx int64[D]
//         (| Megatron-LM multimodal only: modes int8[S])
//   .bin  the tokens of sequence 0, 1, ... back to back, each token one dtype element;
//         pointers[i] is the byte offset of sequence i, sizes[i] its token count.
//   doc_idx[0] = 0 and doc_idx[k+1] = the sequence count when document k ended, so document k is
//   sequences [doc_idx[k], doc_idx[k+1]); there are D - 1 documents.
//
// lathe writes one sequence per document (as GPT-NeoX's preprocess_data.py does), uint16 tokens
// for vocabularies under 65,500 entries and int32 otherwise.

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "io/file.h"

namespace lathe {

// The integer dtype codes that GPT-NeoX and Megatron-LM agree on. Codes 6 and 7 are floats whose
// meaning differs between them (GPT-NeoX: 6 float32, 7 float64; Megatron-LM: 6 float64,
// 7 float32; both before 2023: 6 and 7 float64) and never hold tokens: lathe rejects them.
enum class TokenDType : uint8_t {
    kUInt8 = 1,
    kInt8 = 2,
    kInt16 = 3,
    kInt32 = 4,
    kInt64 = 5,
    kUInt16 = 8,
};

// Bytes per element: 1, 1, 2, 4, 8, 2.
size_t token_dtype_size(TokenDType dtype);
// numpy's name: "uint8", "int8", "int16", "int32", "int64", "uint16".
const char* token_dtype_name(TokenDType dtype);
// The dtype of a code read from `file`, or an error naming the file and the code (floats and
// unknown codes). Codes 1-5 and 8.
Result<TokenDType> token_dtype_from_code(uint8_t code, std::string_view file);
// GPT-NeoX's / Megatron-LM's choice for a vocabulary: uint16 when vocab_size < 65500, else int32.
TokenDType token_dtype_for_vocab(int64_t vocab_size);
// True when `value` is representable in `dtype`.
bool token_dtype_holds(TokenDType dtype, int64_t value);

// "<prefix>.bin" / "<prefix>.idx".
std::string indexed_bin_path(const std::string& prefix);
std::string indexed_idx_path(const std::string& prefix);

// Bytes of the .idx header before the sizes array: 9 + 8 + 1 + 8 + 8.
inline constexpr uint64_t kIndexHeaderBytes = 34;
// The .idx magic, 9 bytes including its two NULs.
inline constexpr std::string_view kIndexMagic{"MMIDIDX\0\0", 9};

// Writes a token file pair. Tokens stream into "<prefix>.bin.tmp-<pid>"; the index (12 bytes per
// sequence plus 8 per document) is kept in memory and written by finalize(); commit() renames
// both into place. Destroying a writer before commit() removes its temporary files, so a failed or
// interrupted run leaves nothing under the final names. Not thread-safe: one writer thread.
class IndexedDatasetWriter {
public:
    // Creates the temporary .bin. Fails if the folder does not exist or is not writable.
    static Result<IndexedDatasetWriter> create(const std::string& prefix, TokenDType dtype);

    IndexedDatasetWriter(IndexedDatasetWriter&&) noexcept = default;
    IndexedDatasetWriter& operator=(IndexedDatasetWriter&&) noexcept = default;

    // Appends one sequence (GPT-NeoX add_item). Errors: a value that does not fit the dtype (named
    // with its position), more than INT32_MAX tokens in one sequence, a write failure.
    Status add_sequence(std::span<const int32_t> tokens);
    // Closes the current document (GPT-NeoX end_document): doc_idx gets the sequence count.
    void end_document();
    // add_sequence + end_document.
    Status add_document(std::span<const int32_t> tokens);

    // Writes the .idx under its temporary name and flushes both files. Nothing is renamed yet.
    Status finalize();
    // Renames the .bin and then the .idx into place, after removing an old "<prefix>.idx" so that
    // a crash between the renames never pairs a new .bin with an old index. Requires finalize().
    Status commit();

    const std::string& prefix() const { return prefix_; }
    TokenDType dtype() const { return dtype_; }
    uint64_t sequence_count() const { return sizes_.size(); }
    uint64_t document_count() const { return doc_idx_.size() - 1; }
    uint64_t token_count() const { return tokens_; }

private:
    friend Status indexed_commit_together(std::span<IndexedDatasetWriter* const> writers);
    IndexedDatasetWriter() = default;
    std::string prefix_;
    TokenDType dtype_ = TokenDType::kInt32;
    AtomicFile bin_;
    AtomicFile idx_;
    bool finalized_ = false;
    std::vector<int32_t> sizes_;
    std::vector<int64_t> doc_idx_{0};
    uint64_t tokens_ = 0;
    std::vector<uint8_t> scratch_;  // one sequence converted to the file's dtype
};

// Commits several finalized writers as one unit (tokens and their labels): every old index is
// removed first, then every .bin is renamed, then every .idx, the first writer's last. A crash
// at any point leaves the first prefix either without an index or complete with all the others.
Status indexed_commit_together(std::span<IndexedDatasetWriter* const> writers);

// The header fields of an .idx, read without validating the rest (for `lathe data info` on a
// damaged file).
struct IndexHeader {
    uint8_t dtype_code = 0;
    uint64_t sequence_count = 0;
    uint64_t doc_idx_count = 0;
};
// Reads the first 34 bytes of `idx_path`. Errors: missing file, short file, wrong magic or version.
Result<IndexHeader> indexed_read_header(const std::string& idx_path);

// A validated, memory-mapped token file pair. Move-only; read-only; const methods are safe to
// call from many threads.
class IndexedDataset {
public:
    // Maps "<prefix>.idx" and "<prefix>.bin" and checks, with errors naming the file and what is
    // wrong: magic, version, dtype code, .idx length against the counts in its header (truncated
    // or trailing bytes; Megatron-LM's multimodal modes array is accepted), sizes >= 0, pointers
    // starting at 0 and each equal to the previous pointer plus the previous size times the dtype
    // size (so monotonic and contiguous), the .bin length equal to the bytes the index describes,
    // doc_idx starting at 0, non-decreasing, within [0, S]. A doc_idx that ends before S (written
    // by GPT-NeoX's merge_datasets.py, which does not extend doc_idx) is accepted with a warning:
    // GPT-NeoX ignores doc_idx, Megatron-LM rejects such a file.
    static Result<IndexedDataset> open(const std::string& prefix);

    IndexedDataset(IndexedDataset&&) noexcept = default;
    IndexedDataset& operator=(IndexedDataset&&) noexcept = default;

    TokenDType dtype() const { return dtype_; }
    uint64_t sequence_count() const { return sequence_count_; }
    // doc_idx entries - 1.
    uint64_t document_count() const { return doc_idx_count_ - 1; }
    uint64_t token_count() const { return token_count_; }
    bool has_sequence_modes() const { return has_modes_; }
    // Non-fatal findings of open(), one sentence each.
    const std::vector<std::string>& warnings() const { return warnings_; }

    // Accessors; the index must be in range (checked: a bad index is a bug).
    int32_t sequence_length(uint64_t i) const;
    int64_t sequence_pointer(uint64_t i) const;  // byte offset in .bin
    int64_t doc_idx(uint64_t k) const;           // k in [0, document_count()]
    // Copies `length` tokens of sequence i starting at token `offset` into dst (GPT-NeoX's
    // MMapIndexedDataset.get(i, offset, length)); the range must lie inside the sequence.
    void read(uint64_t i, uint64_t offset, uint64_t length, int64_t* dst) const;
    // All tokens of sequence i / of document k (its sequences back to back), appended to `out`.
    void read_sequence(uint64_t i, std::vector<int64_t>& out) const;
    void read_document(uint64_t k, std::vector<int64_t>& out) const;
    // Total tokens of document k.
    uint64_t document_length(uint64_t k) const;

    const std::string& prefix() const { return prefix_; }
    uint64_t idx_bytes() const { return idx_.size(); }
    uint64_t bin_bytes() const { return bin_.size(); }
    // The mapped .bin (the tokens, from byte 0, as open() checked).
    const MappedFile& bin() const { return bin_; }

private:
    IndexedDataset() = default;
    std::string prefix_;
    MappedFile idx_;
    MappedFile bin_;
    TokenDType dtype_ = TokenDType::kInt32;
    uint64_t sequence_count_ = 0;
    uint64_t doc_idx_count_ = 0;
    uint64_t token_count_ = 0;
    bool has_modes_ = false;
    std::vector<std::string> warnings_;
};

}  // namespace lathe
