#include "data/blend.h"

#include <cmath>

#include "core/check.h"

namespace lathe {
namespace {

constexpr size_t kPairwiseBlock = 128;    // numpy's PW_BLOCKSIZE
constexpr int kMaxBlendedDatasets = 254;  // dataset_index is uint8 and GPT-NeoX asserts < 255
constexpr double kSpareSamples = 1.005;   // GPT-NeoX's 0.5% extra samples per blended dataset

double pairwise(const double* a, size_t n) {
    if (n < 8) {
        double res = -0.0;  // numpy starts from -0.0 so that a sum of -0.0 stays -0.0
        for (size_t i = 0; i < n; ++i) res += a[i];
        return res;
    }
    if (n <= kPairwiseBlock) {
        double r[8];
        for (int k = 0; k < 8; ++k) r[k] = a[k];
        size_t i = 8;
        for (; i < n - (n % 8); i += 8) {
            for (int k = 0; k < 8; ++k) r[k] += a[i + k];
        }
        double res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        for (; i < n; ++i) res += a[i];
        return res;
    }
    size_t half = n / 2;
    half -= half % 8;
    return pairwise(a, half) + pairwise(a + half, n - half);
}

std::vector<double> numpy_normalized(std::span<const double> weights) {
    const double sum = numpy_pairwise_sum(weights);
    std::vector<double> out(weights.begin(), weights.end());
    for (double& w : out) w /= sum;
    return out;
}

}  // namespace

double numpy_pairwise_sum(std::span<const double> values) {
    return pairwise(values.data(), values.size());
}

Result<NormalizedWeights> gpt_normalized_weights_and_num_samples(
    std::span<const double> weights, std::optional<int64_t> num_samples) {
    if (weights.empty()) return invalid_argument_error("no dataset weights given");
    double sum = 0.0;  // Python's sum(): left to right
    for (double w : weights) {
        if (!std::isfinite(w) || w < 0.0) {
            return invalid_argument_error("dataset weight {} is not a finite non-negative number",
                                          w);
        }
        sum += w;
    }
    if (!(sum > 0.0)) return invalid_argument_error("dataset weights sum to 0");
    NormalizedWeights out;
    for (double w : weights) {
        const double normalized = w / sum;
        out.weights.push_back(normalized);
        if (num_samples) {
            const double n =
                std::ceil(static_cast<double>(*num_samples) * normalized * kSpareSamples);
            out.num_samples.push_back(static_cast<int64_t>(n));
        } else {
            out.num_samples.push_back(std::nullopt);
        }
    }
    return out;
}

std::vector<double> gpt_weights_by_num_docs(std::span<const int64_t> num_docs, double alpha) {
    if (num_docs.size() == 1) return {1.0};
    int64_t total = 0;
    for (int64_t n : num_docs) total += n;
    std::vector<double> unbiased, probs;
    for (int64_t n : num_docs)
        unbiased.push_back(static_cast<double>(n) / static_cast<double>(total));
    double probs_total = 0.0;
    for (double p : unbiased) {
        probs.push_back(std::pow(p, alpha));
        probs_total += probs.back();
    }
    for (double& p : probs) p /= probs_total;
    std::vector<double> weights;
    double weights_total = 0.0;
    for (size_t i = 0; i < probs.size(); ++i) {
        weights.push_back(probs[i] * (1 - unbiased[i]));
        weights_total += weights.back();
    }
    for (double& w : weights) w /= weights_total;
    return weights;
}

BlendingIndices gpt_build_blending_indices(std::span<const double> weights, int64_t size) {
    LATHE_CHECK(!weights.empty() && weights.size() <= size_t(kMaxBlendedDatasets),
                "{} datasets to blend", weights.size());
    const std::vector<double> w = numpy_normalized(weights);
    BlendingIndices out;
    out.dataset_index.resize(static_cast<size_t>(size));
    out.dataset_sample_index.resize(static_cast<size_t>(size));
    std::vector<int64_t> taken(w.size(), 0);
    for (int64_t k = 0; k < size; ++k) {
        const double k_double = std::max(static_cast<double>(k), 1.0);
        size_t best = 0;
        double best_error = w[0] * k_double - static_cast<double>(taken[0]);
        for (size_t d = 1; d < w.size(); ++d) {
            const double error = w[d] * k_double - static_cast<double>(taken[d]);
            if (error > best_error) {
                best_error = error;
                best = d;
            }
        }
        out.dataset_index[k] = static_cast<uint8_t>(best);
        out.dataset_sample_index[k] = taken[best];
        taken[best] += 1;
    }
    return out;
}

Result<std::unique_ptr<BlendedDataset>> BlendedDataset::create(
    std::vector<const SampleSource*> datasets, std::span<const double> weights) {
    if (datasets.empty()) return invalid_argument_error("a blend needs at least one dataset");
    if (datasets.size() != weights.size()) {
        return invalid_argument_error("{} datasets but {} weights", datasets.size(),
                                      weights.size());
    }
    if (datasets.size() > size_t(kMaxBlendedDatasets)) {
        return invalid_argument_error("{} datasets in one blend; GPT-NeoX allows at most {}",
                                      datasets.size(), kMaxBlendedDatasets);
    }
    for (const SampleSource* d : datasets) {
        if (d->seq_length() != datasets[0]->seq_length() ||
            d->has_labels() != datasets[0]->has_labels()) {
            return invalid_argument_error(
                "blended datasets must share the sequence length and all "
                "have label files or none");
        }
    }
    for (double w : weights) {
        if (!std::isfinite(w) || w < 0.0) {
            return invalid_argument_error("blend weight {} is not a finite non-negative number", w);
        }
    }
    if (!(numpy_pairwise_sum(weights) > 0.0)) {
        return invalid_argument_error("blend weights sum to 0");
    }
    auto b = std::unique_ptr<BlendedDataset>(new BlendedDataset());
    b->datasets_ = std::move(datasets);
    b->weights_ = numpy_normalized(weights);
    for (const SampleSource* d : b->datasets_) b->size_ += d->size();
    b->indices_ = gpt_build_blending_indices(weights, b->size_);
    return b;
}

Status BlendedDataset::get(Sample& out, int64_t index) const {
    LATHE_CHECK(index >= 0, "negative sample index {}", index);
    if (index >= size_) {
        if (size_ == 0)
            return failed_precondition_error("the blend has no samples (index {})", index);
        index %= size_;
    }
    const size_t i = static_cast<size_t>(index);
    return datasets_[indices_.dataset_index[i]]->get(out, indices_.dataset_sample_index[i]);
}

// ---- Train / valid / test assembly
// ----------------------------------------------------------------

std::array<std::optional<int64_t>, 3> gpt_neox_num_samples(const GptNeoxDataArgs& a) {
    if (!a.train_iters) return {std::nullopt, std::nullopt, std::nullopt};
    const int64_t train_iters = *a.train_iters;
    const int64_t eval_iters = (train_iters / a.eval_interval + 1) * a.eval_iters;
    return {train_iters * a.train_batch_size, eval_iters * a.train_batch_size,
            a.eval_iters * a.train_batch_size};
}

namespace {

constexpr const char* kSplitNames[3] = {"train", "valid", "test"};

Status check_args(const GptNeoxDataArgs& a) {
    const bool lists =
        !a.train_data_paths.empty() || !a.valid_data_paths.empty() || !a.test_data_paths.empty();
    if (lists && !a.data_path.empty()) {
        return invalid_argument_error(
            "give either data_path or train_data_paths/valid_data_paths/"
            "test_data_paths, not both");
    }
    if (!lists && a.data_path.empty()) {
        return invalid_argument_error(
            "no data: set data_path, or train_data_paths, "
            "valid_data_paths and test_data_paths");
    }
    if (lists &&
        (a.train_data_paths.empty() || a.valid_data_paths.empty() || a.test_data_paths.empty())) {
        return invalid_argument_error(
            "train_data_paths, valid_data_paths and test_data_paths go "
            "together: give all three");
    }
    if (!lists && (!a.train_label_data_paths.empty() || !a.valid_label_data_paths.empty() ||
                   !a.test_label_data_paths.empty())) {
        return invalid_argument_error(
            "label data paths need train_data_paths (GPT-NeoX: 'Must use "
            "train_label_data_paths with train_data_paths, not "
            "data_path')");
    }
    const std::vector<std::string>* paths[3] = {&a.train_data_paths, &a.valid_data_paths,
                                                &a.test_data_paths};
    const std::vector<std::string>* labels[3] = {
        &a.train_label_data_paths, &a.valid_label_data_paths, &a.test_label_data_paths};
    const std::vector<double>* weights[3] = {&a.train_data_weights, &a.valid_data_weights,
                                             &a.test_data_weights};
    for (int s = 0; s < 3; ++s) {
        if (!weights[s]->empty() && weights[s]->size() != paths[s]->size()) {
            return invalid_argument_error("{}_data_weights has {} entries for {} {}_data_paths",
                                          kSplitNames[s], weights[s]->size(), paths[s]->size(),
                                          kSplitNames[s]);
        }
        if (!labels[s]->empty() && labels[s]->size() != paths[s]->size()) {
            return invalid_argument_error("{}_label_data_paths has {} entries for {} {}_data_paths",
                                          kSplitNames[s], labels[s]->size(), paths[s]->size(),
                                          kSplitNames[s]);
        }
    }
    if (a.train_iters.has_value() == a.train_epochs.has_value()) {
        return invalid_argument_error("give exactly one of train_iters and train_epochs");
    }
    if (a.train_iters &&
        (*a.train_iters < 0 || a.train_batch_size < 1 || a.eval_interval < 1 || a.eval_iters < 0)) {
        return invalid_argument_error(
            "train_iters, train_batch_size, eval_interval and eval_iters "
            "must be positive");
    }
    // With train_epochs GPT-NeoX builds one epoch per dataset and derives the iterations itself.
    if (a.train_epochs) {
        for (const auto* w : weights) {
            for (double x : *w) {
                if (x != 1.0) {
                    return invalid_argument_error(
                        "data weights other than 1.0 are not supported "
                        "with train_epochs (as in GPT-NeoX)");
                }
            }
        }
        if (a.weight_by_num_documents) {
            return invalid_argument_error(
                "weight_by_num_documents is not supported with "
                "train_epochs (as in GPT-NeoX)");
        }
    }
    return ok_status();
}

IndexMappingRequest base_request(const GptNeoxDataArgs& a) {
    IndexMappingRequest r;
    r.seq_length = a.seq_length;
    r.seed = a.seed;
    r.flavor = a.flavor;
    r.naming = a.naming;
    r.allow_chopped = a.allow_chopped;
    return r;
}

}  // namespace

Result<GptNeoxDatasets> gpt_neox_build_datasets(const GptNeoxDataArgs& a,
                                                const TokenDocumentsOpener& open) {
    LATHE_RETURN_IF_ERROR(check_args(a));
    const auto num_samples = gpt_neox_num_samples(a);
    const std::optional<int64_t> epochs = a.train_epochs ? std::optional<int64_t>(1) : std::nullopt;
    GptNeoxDatasets out;

    if (!a.data_path.empty()) {
        LATHE_ASSIGN_OR_RETURN(auto file, open(a.data_path));
        const TokenDocuments& tokens = *file;
        out.files.push_back(std::move(file));
        LATHE_ASSIGN_OR_RETURN(const auto ranges,
                               split_document_ranges(a.split, int64_t(tokens.sizes().size())));
        for (int s = 0; s < 3; ++s) {
            if (ranges[s + 1] <= ranges[s]) continue;
            IndexMappingRequest r = base_request(a);
            r.name = kSplitNames[s];
            r.data_prefix = a.data_path;
            r.documents = {ranges[s], ranges[s + 1]};
            r.num_samples = num_samples[s];
            r.num_epochs = epochs;
            LATHE_ASSIGN_OR_RETURN(auto ds, Gpt2Dataset::create(r, tokens, nullptr, a.use_cache));
            out.splits[s] = ds.get();
            out.datasets.push_back(std::move(ds));
        }
        return out;
    }

    const std::vector<std::string>* paths[3] = {&a.train_data_paths, &a.valid_data_paths,
                                                &a.test_data_paths};
    const std::vector<std::string>* labels[3] = {
        &a.train_label_data_paths, &a.valid_label_data_paths, &a.test_label_data_paths};
    const std::vector<double>* given_weights[3] = {&a.train_data_weights, &a.valid_data_weights,
                                                   &a.test_data_weights};
    for (int s = 0; s < 3; ++s) {
        // Open the files of this split first: weight_by_num_documents needs their sizes.
        std::vector<const TokenDocuments*> tokens, label_files;
        for (size_t i = 0; i < paths[s]->size(); ++i) {
            LATHE_ASSIGN_OR_RETURN(auto file, open((*paths[s])[i]));
            tokens.push_back(file.get());
            out.files.push_back(std::move(file));
            if (!labels[s]->empty()) {
                LATHE_ASSIGN_OR_RETURN(auto label_file, open((*labels[s])[i]));
                label_files.push_back(label_file.get());
                out.files.push_back(std::move(label_file));
            }
        }
        std::vector<double> weights = *given_weights[s];
        if (weights.empty()) weights.assign(paths[s]->size(), 1.0);
        if (a.weight_by_num_documents) {
            std::vector<int64_t> num_docs;
            for (const TokenDocuments* t : tokens) num_docs.push_back(int64_t(t->sizes().size()));
            weights = gpt_weights_by_num_docs(num_docs, a.weighted_sampler_alpha);
        }
        auto normalized = gpt_normalized_weights_and_num_samples(weights, num_samples[s]);
        if (!normalized.ok()) {
            return normalized.status().with_context(fmt::format("{}_data_weights", kSplitNames[s]));
        }
        std::vector<const SampleSource*> members;
        for (size_t i = 0; i < tokens.size(); ++i) {
            IndexMappingRequest r = base_request(a);
            r.name = fmt::format("{}_{}", kSplitNames[s], i);
            r.data_prefix = (*paths[s])[i];
            r.documents = {0, int64_t(tokens[i]->sizes().size())};
            r.num_samples = normalized->num_samples[i];
            r.num_epochs = epochs;
            const TokenDocuments* label = label_files.empty() ? nullptr : label_files[i];
            LATHE_ASSIGN_OR_RETURN(auto ds, Gpt2Dataset::create(r, *tokens[i], label, a.use_cache));
            members.push_back(ds.get());
            out.datasets.push_back(std::move(ds));
        }
        LATHE_ASSIGN_OR_RETURN(auto blend, BlendedDataset::create(members, normalized->weights));
        out.splits[s] = blend.get();
        out.blends.push_back(std::move(blend));
    }
    return out;
}

}  // namespace lathe
