#pragma once
// GPT-NeoX's GPT2Dataset (megatron/data/gpt2_dataset.py, pack_impl "packed"): sample i of a
// dataset is the seq_length + 1 tokens that sample_idx row shuffle_idx[i] covers, read across
// document ends exactly as __getitem__ concatenates them. A label file (SFT, GPT-NeoX's
// train_label_data_paths: same documents, same sizes, -100 where no loss) is read in parallel
// through the same pieces and gives the targets. Each sample also carries where its documents
// start, for per-document attention masking of packed sequences.
//
// How a trainer uses a sample (GPT-NeoX's _get_batch): inputs = tokens[0 .. T-1]; targets =
// tokens[1 .. T] without a label file, else labels[1 .. T] with loss only where the label >= 0.

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "data/sampling.h"

namespace lathe {

// A token that a model cannot take, and where it sits in its file.
struct TokenIdOutOfRange {
    int64_t id = 0;
    int64_t document = 0;  // as TokenDocuments counts them (a sequence of the .idx)
    int64_t position = 0;  // token offset inside the document
};

// What the sample builder needs from a token file: document sizes and token access. The token
// file reader (data/indexed_dataset.h) and in-memory corpora implement it.
class TokenDocuments {
public:
    virtual ~TokenDocuments() = default;
    // For messages: the file prefix or another name the user recognises.
    virtual const std::string& name() const = 0;
    // Tokens per document (GPT-NeoX's `sizes`: one entry per sequence of the .idx).
    virtual std::span<const int32_t> sizes() const = 0;
    // Copies tokens [offset, offset + out.size()) of `document` into `out`, widened to int32.
    // The range lies inside the document (callers guarantee it). Errors: I/O or a token that does
    // not fit int32, naming the file.
    virtual Status read(int64_t document, int64_t offset, std::span<int32_t> out) const = 0;
    // The first token, in file order, outside [0, vocab), or nullopt when there is none. With
    // `negative_ok` (a label file: a negative label means no loss, e.g. -100) negative values
    // pass. Reads every token: this default through read(), the token file reader by scanning
    // its memory-mapped .bin on all cores (or not at all when its dtype cannot hold an id outside
    // the range). Errors: those of reading.
    virtual Result<std::optional<TokenIdOutOfRange>> find_id_outside(int64_t vocab,
                                                                     bool negative_ok) const;
};

// A corpus held in memory (tests, synthetic data, small SFT sets).
class InMemoryDocuments final : public TokenDocuments {
public:
    InMemoryDocuments(std::string name, std::vector<std::vector<int32_t>> documents);
    const std::string& name() const override { return name_; }
    std::span<const int32_t> sizes() const override { return sizes_; }
    Status read(int64_t document, int64_t offset, std::span<int32_t> out) const override;

private:
    std::string name_;
    std::vector<std::vector<int32_t>> documents_;
    std::vector<int32_t> sizes_;
};

// Opens the token file pair <prefix>.bin/.idx (data/indexed_dataset.h) as TokenDocuments. As in
// GPT-NeoX's GPT2Dataset, a "document" is one sequence of the .idx (its `sizes` entry); lathe and
// GPT-NeoX's preprocess_data.py write one sequence per document. Errors come from opening and
// validating the files; a token outside int32 (an int64 file) is reported when read.
Result<std::unique_ptr<TokenDocuments>> open_indexed_token_documents(const std::string& prefix);

// One document's stretch inside a sample: tokens [start, start + length) of the sample come from
// document `document` (an id in the token file). Stretches are in order, cover the sample, and
// empty documents are left out.
struct DocumentSegment {
    int64_t start = 0;
    int64_t length = 0;
    int64_t document = 0;
};

struct Sample {
    std::vector<int32_t> tokens;             // seq_length + 1
    std::vector<int32_t> labels;             // seq_length + 1 with a label file, else empty
    std::vector<DocumentSegment> documents;  // where each document starts inside `tokens`
    int64_t sample_row = 0;                  // the sample_idx row after shuffling (for tests)
};

// Anything that hands out samples by index: one dataset, or a weighted blend of several.
class SampleSource {
public:
    virtual ~SampleSource() = default;
    // The number of samples, as GPT-NeoX's len(): a data loader reads indices [0, size()).
    virtual int64_t size() const = 0;
    virtual int64_t seq_length() const = 0;
    virtual bool has_labels() const = 0;
    // Fills `out` with sample `index` (>= 0). Indices past the end wrap as GPT-NeoX's IndexError
    // fallbacks do. Errors come from reading the token files.
    virtual Status get(Sample& out, int64_t index) const = 0;
};

class Gpt2Dataset final : public SampleSource {
public:
    // Builds or loads the index mappings for `request` (cached next to the data when `use_cache`,
    // as GPT-NeoX does; in memory otherwise) over `tokens`, and checks an optional `labels` file
    // against it: the same number of documents, each of the same size (errors name both files and
    // the first differing document). `tokens` and `labels` must outlive the dataset.
    static Result<std::unique_ptr<Gpt2Dataset>> create(const IndexMappingRequest& request,
                                                       const TokenDocuments& tokens,
                                                       const TokenDocuments* labels,
                                                       bool use_cache = true);

    // GPT-NeoX: min(len(shuffle_idx) - 1, len(sample_idx) - 1), which is one less than the number
    // of samples built (the last shuffled sample is reached only by wrapping or by index). Megatron
    // flavor: the number of samples built.
    int64_t size() const override;
    int64_t seq_length() const override { return seq_length_; }
    bool has_labels() const override { return labels_ != nullptr; }
    // GPT-NeoX's __getitem__: index < len(shuffle_idx) reads shuffle_idx[index]; a larger index
    // is taken modulo size() (GPT-NeoX's IndexError fallback). Megatron flavor: index < size().
    Status get(Sample& out, int64_t index) const override;

    const IndexMappings& mappings() const { return mappings_; }
    const IndexMappingRequest& request() const { return request_; }
    const TokenDocuments& tokens() const { return *tokens_; }

private:
    Gpt2Dataset() = default;
    IndexMappingRequest request_;
    IndexMappings mappings_;
    const TokenDocuments* tokens_ = nullptr;
    const TokenDocuments* labels_ = nullptr;
    int64_t seq_length_ = 0;
};

}  // namespace lathe
