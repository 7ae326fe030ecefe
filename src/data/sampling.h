#pragma once
// GPT-NeoX's training-sample index, reproduced exactly (megatron/data/gpt2_dataset.py,
// `_build_index_mappings`, and helpers.cpp `build_sample_idx`), so that a lathe run and a
// GPT-NeoX run over the same token files see the same samples in the same order.
//
// The three arrays (all cached as .npy next to the data, named as GPT-NeoX names them):
//   doc_idx     (E * N) int32      the documents of E epochs, each epoch the N documents in order,
//                                  then the whole array shuffled once by RandomState(seed).
//   sample_idx  (S + 1, 2) int32   row i = (index into doc_idx, token offset in that document)
//   where
//               or int64           sample i starts; sample i covers the seq_length + 1 tokens from
//                                  row i through row i + 1 inclusive (consecutive samples share one
//                                  token). S = (E * tokens_per_epoch - 1) // seq_length. int32 when
//                                  2 * (S + 1) < 2^31 - 1 (computed in float64, as GPT-NeoX does).
//   shuffle_idx (S) uint32         a permutation of [0, S) drawn after doc_idx from the same
//               or int64           RandomState; int64 when S >= 2^32 - 2.
// Epochs E: the smallest E with (E * tokens_per_epoch - 1) // seq_length >= num_samples, unless the
// caller fixes E (GPT-NeoX's train_epochs mode; num_samples is then "None" in the file name).
//
// Versions (EleutherAI/gpt-neox):
//   - since 2024-08 (#1240, pack_impl) the cache names end "_{pack_impl}pi" plus "_ac" when
//     allow_chopped (default "packed", True): CacheNaming::kGptNeox. Before, and in
//     Megatron-DeepSpeed: "{prefix}_{name}_indexmap_{ns}ns_{sl}sl_{seed}s": kLegacy.
//   - since 2023-03 (#835) sample_idx is int32 when it fits; before it was always int64 (lathe
//   reads
//     both).
//   - GPT-NeoX has never had Megatron's "separate last epoch".
//   IndexFlavor::kMegatronSeparateLastEpoch
//     reproduces Megatron-LM/Megatron-DeepSpeed's gpt_dataset.py: when E > 1 and the last epoch
//     contributes fewer than 80% of an epoch's samples, doc_idx is (E-1 epochs shuffled) followed
//     by (the last epoch shuffled), and shuffle_idx is a shuffle of the samples of the first E-1
//     epochs followed by a separate shuffle of the rest. Megatron-DeepSpeed's helpers.cpp
//     returns sample_idx as int64 (older Megatron versions: int32); lathe writes the same values
//     with GPT-NeoX's int32/int64 rule, and reads either.
//   - Only pack_impl "packed" is implemented; "pack_until_overflow" and "unpacked" (SFT-only
//     modes added in 2024) are refused as unimplemented.

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/numpy_random.h"
#include "core/status.h"
#include "data/npy.h"

namespace lathe {

// ---- Split strings: data_utils.py get_train_valid_test_split_ --------------------------------

// Document boundaries [0, a, b, num_documents] of the train / valid / test splits from a GPT-NeoX
// split string: "969,30,1" or "969/30/1" (weights; fewer than three are padded with 0, more are
// ignored), normalized and rounded as Python does (round half to even), the rounding error moved
// onto the last boundaries. Errors (invalid argument, naming the string): a piece that is not a
// finite non-negative number, or weights that sum to 0.
Result<std::array<int64_t, 4>> split_document_ranges(std::string_view splits_string,
                                                     int64_t num_documents);

// ---- The index arithmetic --------------------------------------------------------------------

// A contiguous run of documents [begin, end) of one token file (GPT-NeoX always uses ranges).
struct DocumentRange {
    int64_t begin = 0;
    int64_t end = 0;
    int64_t size() const { return end - begin; }
};

// Sum of the document sizes in the range (`_num_tokens`).
int64_t gpt_num_tokens(std::span<const int32_t> sizes, DocumentRange documents);

// `_num_epochs`: the fewest epochs that give at least num_samples samples. Requires
// tokens_per_epoch >= 2 and seq_length >= 1 (checked).
int64_t gpt_num_epochs(int64_t tokens_per_epoch, int64_t seq_length, int64_t num_samples);

// `_build_doc_idx`: the range tiled num_epochs times, as int32, shuffled by `rng`. With
// separate_last_epoch (Megatron), the first num_epochs - 1 epochs and the last one are shuffled
// separately and concatenated.
std::vector<int32_t> gpt_build_doc_idx(DocumentRange documents, int64_t num_epochs,
                                       NumpyRandomState& rng, bool separate_last_epoch);

// `build_sample_idx` (helpers.cpp): (S + 1) rows of (doc_idx index, offset), row-major, as int64
// whatever dtype GPT-NeoX would store. Checks its invariants (enough tokens, int32 ranges).
std::vector<int64_t> gpt_build_sample_idx(std::span<const int32_t> sizes,
                                          std::span<const int32_t> doc_idx, int64_t seq_length,
                                          int64_t num_epochs, int64_t tokens_per_epoch);

// The dtype GPT-NeoX stores sample_idx in for S = (num_epochs * tokens_per_epoch - 1) / seq_length
// computed in float64: int32 when 2 * (S + 1) < 2^31 - 1, else int64.
NpyDtype gpt_sample_idx_dtype(int64_t num_epochs, int64_t tokens_per_epoch, int64_t seq_length);

// `_build_shuffle_idx`: arange(total_size) with [0, first_part) and [first_part, total_size)
// shuffled separately (GPT-NeoX: first_part == total_size, one shuffle). Values as int64.
std::vector<int64_t> gpt_build_shuffle_idx(int64_t first_part, int64_t total_size,
                                           NumpyRandomState& rng);
// uint32, or int64 when total_size >= 2^32 - 2 (GPT-NeoX's threshold).
NpyDtype gpt_shuffle_idx_dtype(int64_t total_size);

// ---- Index mappings: build, cache, load ------------------------------------------------------

enum class IndexFlavor {
    kGptNeox,                    // EleutherAI/gpt-neox (one shuffle over all epochs)
    kMegatronSeparateLastEpoch,  // Megatron-LM / Megatron-DeepSpeed gpt_dataset.py
};

enum class CacheNaming {
    kGptNeox,  // ..._{seed}s_packedpi_ac_doc_idx.npy (gpt-neox since 2024-08)
    kLegacy,   // ..._{seed}s_doc_idx.npy (gpt-neox before 2024-08, Megatron-DeepSpeed)
};

// The arguments of `_build_index_mappings` that decide the arrays and their file names.
struct IndexMappingRequest {
    std::string name;  // "train", "valid", "test"; "train_0", ... for weighted lists
    // The token file prefix: the cache files are named after it and sit next to the data, as in
    // GPT-NeoX. To keep caches elsewhere (read-only data), pass "<cache dir>/<file name>": only
    // names and messages use this string, the documents come from the caller.
    std::string data_prefix;
    DocumentRange documents;
    std::optional<int64_t> num_samples;  // None only when num_epochs is given
    std::optional<int64_t> num_epochs;   // given: used as is (GPT-NeoX train_epochs mode)
    int64_t seq_length = 0;
    uint32_t seed = 0;
    IndexFlavor flavor = IndexFlavor::kGptNeox;
    CacheNaming naming = CacheNaming::kGptNeox;
    bool allow_chopped = true;  // only changes the cache name ("_ac"), as in GPT-NeoX
};

// The three cache paths for a request: {prefix}_{name}_indexmap_{ns}ns_{sl}sl_{seed}s[...]
// followed by _doc_idx.npy, _sample_idx.npy, _shuffle_idx.npy.
struct IndexCachePaths {
    std::string doc_idx;
    std::string sample_idx;
    std::string shuffle_idx;
};
IndexCachePaths index_cache_paths(const IndexMappingRequest& request);

// One of the three index arrays, either owned or memory-mapped from its .npy file. Elements are
// read widened to int64 whatever the stored dtype.
class IndexArray {
public:
    IndexArray() = default;
    // Owned arrays, stored (and written) in their element type: int32, uint32 or int64.
    static IndexArray owned(std::vector<int32_t> values);
    static IndexArray owned(std::vector<uint32_t> values);
    static IndexArray owned(std::vector<int64_t> values);
    static IndexArray mapped(NpyArray file);

    NpyDtype dtype() const { return dtype_; }   // the dtype on disk (or that would be written)
    const void* data() const { return data_; }  // size() elements of dtype()
    int64_t size() const { return size_; }      // elements (rows * 2 for sample_idx)
    int64_t at(int64_t i) const {
        switch (dtype_) {
            case NpyDtype::kInt32:
                return static_cast<const int32_t*>(data_)[i];
            case NpyDtype::kUint32:
                return static_cast<const uint32_t*>(data_)[i];
            default:
                return static_cast<const int64_t*>(data_)[i];
        }
    }
    // Writes the array as numpy would store it (dtype(), with `shape`).
    Status write_npy(const std::string& path, std::span<const int64_t> shape) const;

private:
    NpyDtype dtype_ = NpyDtype::kInt64;
    int64_t size_ = 0;
    const void* data_ = nullptr;
    std::vector<int64_t> owned64_;
    std::vector<int32_t> owned32_;
    std::vector<uint32_t> owned_u32_;
    NpyArray file_;
};

// doc_idx, sample_idx and shuffle_idx of one dataset.
struct IndexMappings {
    IndexArray doc_idx;
    IndexArray sample_idx;  // row-major (num_sample_rows, 2)
    IndexArray shuffle_idx;
    int64_t num_epochs = 0;
    int64_t tokens_per_epoch = 0;
    bool separate_last_epoch = false;
    bool loaded_from_cache = false;

    int64_t num_sample_rows() const { return sample_idx.size() / 2; }
    // Samples built: rows - 1 (GPT-NeoX's Megatron-style len; GPT-NeoX's own __len__ is one less).
    int64_t num_samples() const { return num_sample_rows() - 1; }
    int64_t sample_doc_index(int64_t row) const { return sample_idx.at(2 * row); }
    int64_t sample_offset(int64_t row) const { return sample_idx.at(2 * row + 1); }
};

// Builds the arrays in memory, exactly as `_build_index_mappings` does with no cache. Errors
// (invalid argument): an empty or out-of-range document range, fewer than 2 tokens in it,
// seq_length < 2 (GPT-NeoX's helper asserts seq_length > 1), neither num_samples nor
// num_epochs, separate-last-epoch without num_samples.
Result<IndexMappings> gpt_build_index_mappings(const IndexMappingRequest& request,
                                               std::span<const int32_t> sizes);

// GPT-NeoX's behaviour with files: when all three cache files exist they are loaded (memory-mapped)
// and checked against the request and `sizes`; otherwise the arrays are built and each file is
// written atomically, then mapped back. A cache that is unreadable or does not fit the data (wrong
// shape, dtype, lengths or values out of range) is an error (data loss) naming the file and telling
// to delete the three files to rebuild: lathe never overwrites index files another run may be
// reading. Write failures are I/O errors naming the file.
Result<IndexMappings> gpt_load_or_build_index_mappings(const IndexMappingRequest& request,
                                                       std::span<const int32_t> sizes);

// ---- Samples ---------------------------------------------------------------------------------

// One stretch of one document inside a sample.
struct SamplePiece {
    int64_t document = 0;  // document id in the token file
    int64_t offset = 0;    // first token within the document
    int64_t length = 0;    // tokens taken
};

// The pieces that make up sample `row` of the sample_idx (not shuffled): the rest of the first
// document from its offset, every document in between, the head of the last document, in the
// order GPT2Dataset.__getitem__ concatenates them; their lengths sum to seq_length + 1. Pieces of
// length 0 (empty documents) are kept so that document boundaries stay visible.
std::vector<SamplePiece> gpt_sample_pieces(const IndexMappings& mappings,
                                           std::span<const int32_t> sizes, int64_t row);

// ---- Loader order ----------------------------------------------------------------------------

// The first dataset index of a micro-batch as GPT-NeoX's loader reads them (make_data_loader:
// SequentialSampler, DistributedBatchSampler with drop_last over global batches of
// micro_batch * dp_world samples, rank r taking the r-th contiguous slice; itertools.cycle
// repeating the first pass). Micro-batch `micro_step` (counted from 0 over the run:
// iteration * gradient_accumulation_steps + k) of rank `dp_rank` is the samples
// [first, first + micro_batch). Errors (failed precondition): a dataset smaller than one global
// batch, where GPT-NeoX's loader yields nothing.
Result<int64_t> gpt_neox_micro_batch_start(int64_t micro_step, int64_t micro_batch,
                                           int64_t dp_world, int64_t dp_rank, int64_t dataset_size);

}  // namespace lathe
