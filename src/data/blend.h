#pragma once
// Weighted blends of several datasets and the train / valid / test assembly of GPT-NeoX's
// megatron/data/data_utils.py and blendable_dataset.py (helpers.cpp build_blending_indices),
// reproduced in their floating-point details so that the blend picks the same dataset for every
// sample index:
//   - get_normalized_weights_and_num_samples: w / sum(w) with Python's left-to-right sum, and
//     num_samples_i = ceil(num_samples * w_i * 1.005) (0.5% spare samples per dataset).
//   - BlendableDataset: w normalized again in numpy (pairwise np.sum), size = sum of len(d_i);
//     sample k goes to the dataset with the largest error w_i * max(k, 1) - taken_i (ties: the
//     lowest index), and is that dataset's taken_i-th sample.
//   - weights_by_num_docs (weight_by_num_documents): p_i ∝ (n_i / N)^alpha, weighted by (1 -
//   n_i/N).

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "data/gpt2_dataset.h"

namespace lathe {

// numpy's np.sum over a float64 array (pairwise summation: 8 accumulators up to 128 elements,
// halves above), to the last bit.
double numpy_pairwise_sum(std::span<const double> values);

struct NormalizedWeights {
    std::vector<double> weights;                      // w_i / sum(w)
    std::vector<std::optional<int64_t>> num_samples;  // ceil(num_samples * w_i * 1.005), or None
};

// get_normalized_weights_and_num_samples. Errors (invalid argument): no weights, a negative or
// non-finite weight, or weights summing to 0.
Result<NormalizedWeights> gpt_normalized_weights_and_num_samples(
    std::span<const double> weights, std::optional<int64_t> num_samples);

// weights_by_num_docs(num_docs, alpha): one dataset gets [1.0].
std::vector<double> gpt_weights_by_num_docs(std::span<const int64_t> num_docs, double alpha);

struct BlendingIndices {
    std::vector<uint8_t> dataset_index;         // which dataset serves blend sample k
    std::vector<int64_t> dataset_sample_index;  // and which of its samples
};

// build_blending_indices for `size` samples over weights that are already normalized (the numpy
// step of BlendableDataset included: weights / np.sum(weights)). At most 254 datasets (checked:
// GPT-NeoX asserts num_datasets < 255).
BlendingIndices gpt_build_blending_indices(std::span<const double> weights, int64_t size);

// BlendableDataset over datasets that outlive it.
class BlendedDataset final : public SampleSource {
public:
    // Errors (invalid argument): no datasets, a weight count that differs, more than 254
    // datasets, mismatched sequence lengths or label presence, weights that do not normalize.
    static Result<std::unique_ptr<BlendedDataset>> create(std::vector<const SampleSource*> datasets,
                                                          std::span<const double> weights);

    int64_t size() const override { return size_; }  // sum of the datasets' sizes
    int64_t seq_length() const override { return datasets_.front()->seq_length(); }
    bool has_labels() const override { return datasets_.front()->has_labels(); }
    // Blend sample `index` (taken modulo size() past the end, as BlendableDataset's fallback).
    Status get(Sample& out, int64_t index) const override;

    const BlendingIndices& indices() const { return indices_; }
    const std::vector<double>& weights() const { return weights_; }

private:
    BlendedDataset() = default;
    std::vector<const SampleSource*> datasets_;
    std::vector<double> weights_;
    BlendingIndices indices_;
    int64_t size_ = 0;
};

// ---- Train / valid / test assembly (data_utils.build_train_valid_test_data_loaders) -----------

// Opens the token file with the given prefix (the .bin/.idx reader, or anything else that gives
// documents).
using TokenDocumentsOpener =
    std::function<Result<std::unique_ptr<TokenDocuments>>(const std::string& prefix)>;

// The GPT-NeoX arguments that decide which samples a run sees, in GPT-NeoX's names.
struct GptNeoxDataArgs {
    // Either one data_path split by `split` ...
    std::string data_path;
    std::string split = "969, 30, 1";
    // ... or explicit lists (all three or none), each with weights (default: all 1.0) and, for
    // SFT, label files in parallel with the token files.
    std::vector<std::string> train_data_paths, valid_data_paths, test_data_paths;
    std::vector<std::string> train_label_data_paths, valid_label_data_paths, test_label_data_paths;
    std::vector<double> train_data_weights, valid_data_weights, test_data_weights;
    bool weight_by_num_documents = false;
    double weighted_sampler_alpha = 1.0;

    int64_t seq_length = 2048;
    uint32_t seed = 1234;
    // Samples: train_iters * train_batch_size for training, (train_iters // eval_interval + 1) *
    // eval_iters * train_batch_size for validation, eval_iters * train_batch_size for test; or,
    // with train_epochs, one epoch of each (GPT-NeoX allows only equal weights then).
    std::optional<int64_t> train_iters;
    std::optional<int64_t> train_epochs;
    int64_t train_batch_size = 1;  // micro batch x gradient accumulation x data-parallel ranks
    int64_t eval_interval = 1000;
    int64_t eval_iters = 10;

    IndexFlavor flavor = IndexFlavor::kGptNeox;
    CacheNaming naming = CacheNaming::kGptNeox;
    bool allow_chopped = true;
    bool use_cache = true;  // write/read the .npy index files next to the data
};

// GPT-NeoX's [train, valid, test] sample counts for the arguments (nullopt in epochs mode).
std::array<std::optional<int64_t>, 3> gpt_neox_num_samples(const GptNeoxDataArgs& args);

// Everything the three splits need, owned together: token files, datasets, blends. A split with
// no documents or no paths has a null source.
struct GptNeoxDatasets {
    std::vector<std::unique_ptr<TokenDocuments>> files;
    std::vector<std::unique_ptr<Gpt2Dataset>> datasets;
    std::vector<std::unique_ptr<BlendedDataset>> blends;
    std::array<const SampleSource*, 3> splits = {nullptr, nullptr, nullptr};  // train, valid, test

    const SampleSource* train() const { return splits[0]; }
    const SampleSource* valid() const { return splits[1]; }
    const SampleSource* test() const { return splits[2]; }
};

// Builds the datasets as GPT-NeoX does for dataset_impl "gpt2" and pack_impl "packed": with
// data_path, datasets "train"/"valid"/"test" over the split's document ranges (no blend); with
// lists, datasets "train_{i}" etc. blended per split. Errors (invalid argument) name the
// argument: neither or both modes, lists of unequal length, labels without lists, weights that
// do not fit; other errors come from the files and the index caches.
Result<GptNeoxDatasets> gpt_neox_build_datasets(const GptNeoxDataArgs& args,
                                                const TokenDocumentsOpener& open);

}  // namespace lathe
