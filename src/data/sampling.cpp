#include "data/sampling.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <numeric>

#include "core/check.h"
#include "core/log.h"
#include "core/strings.h"
#include "io/file.h"

namespace lathe {
namespace {

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
constexpr int64_t kUint32Max = std::numeric_limits<uint32_t>::max();
// Megatron separates the last epoch when it holds fewer than this share of an epoch's samples.
constexpr double kSeparateLastEpochShare = 0.80;
constexpr int64_t kSizePrefetchDistance = 16;

// Python's float() on a split piece, restricted to plain decimal numbers: surrounding whitespace,
// digits, one '.', an exponent. Returns nullopt for anything else (inf, nan, hex, '1_000', '').
std::optional<double> parse_split_weight(std::string_view piece) {
    const std::string_view t = trim(piece);
    if (t.empty()) return std::nullopt;
    for (char c : t) {
        const bool ok =
            (c >= '0' && c <= '9') || c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-';
        if (!ok) return std::nullopt;
    }
    const std::string s(t);
    errno = 0;
    char* end = nullptr;
    const double v = std::strtod(s.c_str(), &end);
    if (end != s.c_str() + s.size() || errno == ERANGE || !std::isfinite(v)) return std::nullopt;
    return v;
}

std::string format_num_samples(const std::optional<int64_t>& n) {
    return n ? std::to_string(*n) : std::string("None");  // Python's "{}".format(None)
}

// Number of samples sample_idx gets for E epochs: (E * T - 1) // seq_length.
int64_t sample_count(int64_t num_epochs, int64_t tokens_per_epoch, int64_t seq_length) {
    return (num_epochs * tokens_per_epoch - 1) / seq_length;
}

struct EpochPlan {
    int64_t num_epochs = 0;
    bool separate_last_epoch = false;
    int64_t shuffle_first_part = 0;  // samples shuffled together first
    int64_t num_samples_built = 0;
};

Result<EpochPlan> plan_epochs(const IndexMappingRequest& r, int64_t tokens_per_epoch) {
    EpochPlan plan;
    if (r.num_epochs && *r.num_epochs > 0) {
        plan.num_epochs = *r.num_epochs;
    } else if (r.num_samples) {
        plan.num_epochs = gpt_num_epochs(tokens_per_epoch, r.seq_length, *r.num_samples);
    } else {
        return invalid_argument_error("index '{}' of {}: give a number of samples or of epochs",
                                      r.name, r.data_prefix);
    }
    if (plan.num_epochs > kInt32Max) {
        return invalid_argument_error(
            "index '{}' of {}: {} epochs needed (GPT-NeoX's helper takes an int32 epoch count); "
            "ask for fewer samples or use more data",
            r.name, r.data_prefix, plan.num_epochs);
    }
    plan.num_samples_built = sample_count(plan.num_epochs, tokens_per_epoch, r.seq_length);
    plan.shuffle_first_part = plan.num_samples_built;
    if (r.flavor == IndexFlavor::kMegatronSeparateLastEpoch && plan.num_epochs > 1) {
        if (!r.num_samples) {
            return invalid_argument_error(
                "index '{}' of {}: the separate-last-epoch flavor needs "
                "a number of samples",
                r.name, r.data_prefix);
        }
        const int64_t from_epochs_minus_one =
            sample_count(plan.num_epochs - 1, tokens_per_epoch, r.seq_length);
        const int64_t last_epoch_samples = *r.num_samples - from_epochs_minus_one;
        const int64_t samples_per_epoch = (tokens_per_epoch - 1) / r.seq_length;
        LATHE_CHECK(last_epoch_samples >= 0 && last_epoch_samples < samples_per_epoch + 1,
                    "last epoch samples {} outside [0, {}]", last_epoch_samples, samples_per_epoch);
        // Python: last_epoch_num_samples < int(0.80 * num_samples_per_epoch)
        const auto threshold =
            static_cast<int64_t>(kSeparateLastEpochShare * static_cast<double>(samples_per_epoch));
        plan.separate_last_epoch = last_epoch_samples < threshold;
        if (plan.separate_last_epoch) plan.shuffle_first_part = from_epochs_minus_one;
    }
    return plan;
}

Status check_request(const IndexMappingRequest& r, std::span<const int32_t> sizes) {
    if (r.documents.begin < 0 || r.documents.end > static_cast<int64_t>(sizes.size()) ||
        r.documents.size() <= 0) {
        return invalid_argument_error(
            "index '{}' of {}: document range [{}, {}) is empty or outside the {} documents",
            r.name, r.data_prefix, r.documents.begin, r.documents.end, sizes.size());
    }
    if (r.documents.end - 1 > kInt32Max) {
        return invalid_argument_error(
            "index '{}' of {}: document ids above 2^31 - 1 do not fit "
            "GPT-NeoX's int32 doc_idx",
            r.name, r.data_prefix);
    }
    // GPT-NeoX's helpers.cpp asserts seq_length > 1 (its Makefile keeps asserts on).
    if (r.seq_length < 2 || r.seq_length >= kInt32Max) {
        return invalid_argument_error(
            "index '{}' of {}: sequence length {} must be in [2, 2^31 - 1)", r.name, r.data_prefix,
            r.seq_length);
    }
    if (r.num_samples && *r.num_samples < 0) {
        return invalid_argument_error("index '{}' of {}: negative number of samples {}", r.name,
                                      r.data_prefix, *r.num_samples);
    }
    if (r.num_epochs && *r.num_epochs < 0) {
        return invalid_argument_error("index '{}' of {}: negative number of epochs {}", r.name,
                                      r.data_prefix, *r.num_epochs);
    }
    const int64_t tokens = gpt_num_tokens(sizes, r.documents);
    if (tokens < 2) {
        return invalid_argument_error(
            "index '{}' of {}: documents [{}, {}) hold {} tokens; a sample needs at least 2",
            r.name, r.data_prefix, r.documents.begin, r.documents.end, tokens);
    }
    return ok_status();
}

}  // namespace

// ---- Split strings ------------------------------------------------------------------------------

Result<std::array<int64_t, 4>> split_document_ranges(std::string_view splits_string,
                                                     int64_t num_documents) {
    char sep = 0;
    if (splits_string.find(',') != std::string_view::npos) {
        sep = ',';
    } else if (splits_string.find('/') != std::string_view::npos) {
        sep = '/';
    }
    std::vector<std::string_view> pieces;
    if (sep != 0) {
        pieces = split(splits_string, sep);
    } else {
        pieces.push_back(splits_string);
    }
    std::vector<double> splits;
    for (std::string_view piece : pieces) {
        const std::optional<double> v = parse_split_weight(piece);
        if (!v || *v < 0.0) {
            return invalid_argument_error(
                "split '{}': '{}' is not a non-negative number (expected weights like "
                "\"969,30,1\" or \"98/2/0\")",
                escape_for_message(splits_string), escape_for_message(piece));
        }
        splits.push_back(*v);
    }
    while (splits.size() < 3) splits.push_back(0.0);
    splits.resize(3);
    // Python's sum() over a list of floats, left to right (CPython <= 3.11; 3.12 compensates,
    // which only differs in the last bit for weights that are not exactly representable).
    double sum = 0.0;
    for (double s : splits) sum += s;
    if (!(sum > 0.0)) {
        return invalid_argument_error(
            "split '{}': the weights sum to 0; give at least one positive "
            "weight, e.g. \"969,30,1\"",
            escape_for_message(splits_string));
    }
    std::array<int64_t, 4> index = {0, 0, 0, 0};
    for (int i = 0; i < 3; ++i) {
        const double share = splits[i] / sum;
        // int(round(split * float(size))): round half to even, as std::nearbyint in the default
        // rounding mode.
        index[i + 1] = index[i] + static_cast<int64_t>(
                                      std::nearbyint(share * static_cast<double>(num_documents)));
    }
    const int64_t diff = index[3] - num_documents;
    for (int i = 1; i < 4; ++i) index[i] -= diff;
    LATHE_CHECK(index[3] == num_documents, "split end {} != {}", index[3], num_documents);
    return index;
}

// ---- Index arithmetic ---------------------------------------------------------------------------

int64_t gpt_num_tokens(std::span<const int32_t> sizes, DocumentRange documents) {
    int64_t total = 0;
    for (int64_t d = documents.begin; d < documents.end; ++d) total += sizes[d];
    return total;
}

int64_t gpt_num_epochs(int64_t tokens_per_epoch, int64_t seq_length, int64_t num_samples) {
    LATHE_CHECK(tokens_per_epoch >= 2 && seq_length >= 1, "tokens_per_epoch={} seq_length={}",
                tokens_per_epoch, seq_length);
    // The smallest E with (E * T - 1) // seq_length >= num_samples, without looping E times.
    int64_t epochs = 1;
    if (num_samples > 0) {
        // (E * T - 1) >= num_samples * seq_length  <=>  E >= (num_samples * seq_length + 1) / T
        const __int128 need = static_cast<__int128>(num_samples) * seq_length + 1;
        epochs = static_cast<int64_t>((need + tokens_per_epoch - 1) / tokens_per_epoch);
        epochs = std::max<int64_t>(epochs, 1);
    }
    LATHE_CHECK(
        sample_count(epochs, tokens_per_epoch, seq_length) >= num_samples &&
            (epochs == 1 || sample_count(epochs - 1, tokens_per_epoch, seq_length) < num_samples),
        "epochs {} for T={} sl={} ns={}", epochs, tokens_per_epoch, seq_length, num_samples);
    return epochs;
}

std::vector<int32_t> gpt_build_doc_idx(DocumentRange documents, int64_t num_epochs,
                                       NumpyRandomState& rng, bool separate_last_epoch) {
    auto tiled = [&](int64_t epochs) {
        std::vector<int32_t> out;
        out.reserve(static_cast<size_t>(epochs * documents.size()));
        for (int64_t e = 0; e < epochs; ++e) {
            for (int64_t d = documents.begin; d < documents.end; ++d) {
                out.push_back(static_cast<int32_t>(d));
            }
        }
        rng.shuffle(std::span<int32_t>(out));
        return out;
    };
    if (!separate_last_epoch || num_epochs == 1) return tiled(num_epochs);
    std::vector<int32_t> first = tiled(num_epochs - 1);
    const std::vector<int32_t> last = tiled(1);
    first.insert(first.end(), last.begin(), last.end());
    return first;
}

namespace {

// build_sample_idx into an array of T (int32 or int64, as GPT-NeoX stores it).
template <typename T>
std::vector<T> build_sample_idx_as(std::span<const int32_t> sizes, std::span<const int32_t> doc_idx,
                                   int64_t seq_length, int64_t num_epochs,
                                   int64_t tokens_per_epoch) {
    LATHE_CHECK(seq_length >= 1 && num_epochs > 0 && tokens_per_epoch > 1,
                "seq_length={} num_epochs={} tokens_per_epoch={}", seq_length, num_epochs,
                tokens_per_epoch);
    const int64_t num_samples = sample_count(num_epochs, tokens_per_epoch, seq_length);
    std::vector<T> sample_idx(static_cast<size_t>(2 * (num_samples + 1)));
    const int64_t doc_idx_size = static_cast<int64_t>(doc_idx.size());
    LATHE_CHECK(doc_idx_size <= int64_t(std::numeric_limits<T>::max()),
                "{} doc_idx entries do not fit the sample_idx dtype", doc_idx_size);
    int64_t doc_idx_index = 0;
    // helpers.cpp keeps the offset and the remaining length in int32; the values here always fit
    // (offsets are below a document's int32 size, remaining <= seq_length + 1 < 2^31).
    int64_t doc_offset = 0;
    sample_idx[0] = 0;
    sample_idx[1] = 0;
    for (int64_t sample = 1; sample <= num_samples; ++sample) {
        int64_t remaining = seq_length + 1;
        while (remaining != 0) {
            LATHE_CHECK(
                doc_idx_index < doc_idx_size,
                "sample {} runs past doc_idx ({} entries): sizes do not sum to {} per epoch",
                sample, doc_idx_size, tokens_per_epoch);
            if (doc_idx_index + kSizePrefetchDistance < doc_idx_size) {
                // doc_idx is shuffled: sizes[] is read at random, ahead of time is cheaper.
                __builtin_prefetch(&sizes[doc_idx[doc_idx_index + kSizePrefetchDistance]]);
            }
            const int64_t doc_length = sizes[doc_idx[doc_idx_index]] - doc_offset;
            remaining -= doc_length;
            if (remaining <= 0) {
                // The sample ends inside this document; the next sample starts on its last token
                // (samples overlap by one token: inputs and shifted labels).
                doc_offset += remaining + doc_length - 1;
                remaining = 0;
            } else {
                ++doc_idx_index;
                doc_offset = 0;
            }
        }
        sample_idx[2 * sample] = static_cast<T>(doc_idx_index);
        sample_idx[2 * sample + 1] = static_cast<T>(doc_offset);
    }
    return sample_idx;
}

// _build_shuffle_idx into an array of T (uint32 or int64): the draws depend only on positions.
template <typename T>
std::vector<T> build_shuffle_idx_as(int64_t first_part, int64_t total_size, NumpyRandomState& rng) {
    LATHE_CHECK(0 <= first_part && first_part <= total_size, "first_part={} total_size={}",
                first_part, total_size);
    std::vector<T> out(static_cast<size_t>(total_size));
    std::iota(out.begin(), out.end(), T{0});
    rng.shuffle(std::span<T>(out.data(), static_cast<size_t>(first_part)));
    if (first_part != total_size) {
        rng.shuffle(
            std::span<T>(out.data() + first_part, static_cast<size_t>(total_size - first_part)));
    }
    return out;
}

}  // namespace

std::vector<int64_t> gpt_build_sample_idx(std::span<const int32_t> sizes,
                                          std::span<const int32_t> doc_idx, int64_t seq_length,
                                          int64_t num_epochs, int64_t tokens_per_epoch) {
    return build_sample_idx_as<int64_t>(sizes, doc_idx, seq_length, num_epochs, tokens_per_epoch);
}

NpyDtype gpt_sample_idx_dtype(int64_t num_epochs, int64_t tokens_per_epoch, int64_t seq_length) {
    // num_samples = (num_epochs * tokens_per_epoch - 1) / seq_length  (numpy true division)
    const double num_samples =
        static_cast<double>(num_epochs * tokens_per_epoch - 1) / static_cast<double>(seq_length);
    return 2.0 * (num_samples + 1.0) < static_cast<double>(kInt32Max) ? NpyDtype::kInt32
                                                                      : NpyDtype::kInt64;
}

std::vector<int64_t> gpt_build_shuffle_idx(int64_t first_part, int64_t total_size,
                                           NumpyRandomState& rng) {
    return build_shuffle_idx_as<int64_t>(first_part, total_size, rng);
}

NpyDtype gpt_shuffle_idx_dtype(int64_t total_size) {
    return total_size >= kUint32Max - 1 ? NpyDtype::kInt64 : NpyDtype::kUint32;
}

// ---- IndexArray ---------------------------------------------------------------------------------

IndexArray IndexArray::owned(std::vector<int32_t> values) {
    IndexArray a;
    a.dtype_ = NpyDtype::kInt32;
    a.size_ = static_cast<int64_t>(values.size());
    a.owned32_ = std::move(values);
    a.data_ = a.owned32_.data();
    return a;
}

IndexArray IndexArray::owned(std::vector<uint32_t> values) {
    IndexArray a;
    a.dtype_ = NpyDtype::kUint32;
    a.size_ = static_cast<int64_t>(values.size());
    a.owned_u32_ = std::move(values);
    a.data_ = a.owned_u32_.data();
    return a;
}

IndexArray IndexArray::owned(std::vector<int64_t> values) {
    IndexArray a;
    a.dtype_ = NpyDtype::kInt64;
    a.size_ = static_cast<int64_t>(values.size());
    a.owned64_ = std::move(values);
    a.data_ = a.owned64_.data();
    return a;
}

IndexArray IndexArray::mapped(NpyArray file) {
    IndexArray a;
    a.dtype_ = file.dtype();
    a.size_ = file.size();
    a.data_ = file.data();
    a.file_ = std::move(file);
    return a;
}

Status IndexArray::write_npy(const std::string& path, std::span<const int64_t> shape) const {
    return npy_write(path, dtype_, shape, data_,
                     static_cast<size_t>(size_) * npy_dtype_size(dtype_));
}

// ---- Index mappings -----------------------------------------------------------------------------

IndexCachePaths index_cache_paths(const IndexMappingRequest& r) {
    std::string base = fmt::format("{}_{}_indexmap_{}ns_{}sl_{}s", r.data_prefix, r.name,
                                   format_num_samples(r.num_samples), r.seq_length, r.seed);
    if (r.naming == CacheNaming::kGptNeox) {
        base += "_packedpi";
        if (r.allow_chopped) base += "_ac";
    }
    return {base + "_doc_idx.npy", base + "_sample_idx.npy", base + "_shuffle_idx.npy"};
}

Result<IndexMappings> gpt_build_index_mappings(const IndexMappingRequest& r,
                                               std::span<const int32_t> sizes) {
    LATHE_RETURN_IF_ERROR(check_request(r, sizes));
    const int64_t tokens_per_epoch = gpt_num_tokens(sizes, r.documents);
    LATHE_ASSIGN_OR_RETURN(const EpochPlan plan, plan_epochs(r, tokens_per_epoch));
    const NpyDtype sample_dtype =
        gpt_sample_idx_dtype(plan.num_epochs, tokens_per_epoch, r.seq_length);
    if (sample_dtype == NpyDtype::kInt32 && plan.num_epochs * r.documents.size() > kInt32Max) {
        // GPT-NeoX would silently wrap doc_idx positions stored in its int32 sample_idx.
        return invalid_argument_error(
            "index '{}' of {}: {} epochs x {} documents overflow GPT-NeoX's int32 sample_idx; "
            "GPT-NeoX itself would build a corrupt index here",
            r.name, r.data_prefix, plan.num_epochs, r.documents.size());
    }

    NumpyRandomState rng(r.seed);
    IndexMappings m;
    m.num_epochs = plan.num_epochs;
    m.tokens_per_epoch = tokens_per_epoch;
    m.separate_last_epoch = plan.separate_last_epoch;
    std::vector<int32_t> doc_idx =
        gpt_build_doc_idx(r.documents, plan.num_epochs, rng, plan.separate_last_epoch);
    if (sample_dtype == NpyDtype::kInt32) {
        m.sample_idx = IndexArray::owned(build_sample_idx_as<int32_t>(
            sizes, doc_idx, r.seq_length, plan.num_epochs, tokens_per_epoch));
    } else {
        m.sample_idx = IndexArray::owned(build_sample_idx_as<int64_t>(
            sizes, doc_idx, r.seq_length, plan.num_epochs, tokens_per_epoch));
    }
    const int64_t num_samples = m.num_samples();
    LATHE_CHECK(num_samples == plan.num_samples_built, "{} != {}", num_samples,
                plan.num_samples_built);
    const int64_t first_part = std::min(plan.shuffle_first_part, num_samples);
    if (gpt_shuffle_idx_dtype(num_samples) == NpyDtype::kUint32) {
        m.shuffle_idx =
            IndexArray::owned(build_shuffle_idx_as<uint32_t>(first_part, num_samples, rng));
    } else {
        m.shuffle_idx =
            IndexArray::owned(build_shuffle_idx_as<int64_t>(first_part, num_samples, rng));
    }
    m.doc_idx = IndexArray::owned(std::move(doc_idx));
    return m;
}

namespace {

Status cache_mismatch(const std::string& path, const IndexCachePaths& paths,
                      std::string_view what) {
    return data_loss_error(
        "{}: index cache does not fit the data: {}. It is corrupt, or was built from other "
        "token files under the same name or with another data.split (a cache's name holds no "
        "split, as GPT-NeoX's do not); delete {}, {} and {} to rebuild",
        path, what, paths.doc_idx, paths.sample_idx, paths.shuffle_idx);
}

// Calls f with the elements of `a` as a typed span (int32, uint32 or int64).
template <typename F>
Status visit_elements(const IndexArray& a, F&& f) {
    switch (a.dtype()) {
        case NpyDtype::kInt32:
            return f(std::span<const int32_t>(static_cast<const int32_t*>(a.data()), a.size()));
        case NpyDtype::kUint32:
            return f(std::span<const uint32_t>(static_cast<const uint32_t*>(a.data()), a.size()));
        default:
            return f(std::span<const int64_t>(static_cast<const int64_t*>(a.data()), a.size()));
    }
}

// Checks the dtypes and shapes of cached arrays against what the request implies.
Status check_cached_shapes(const IndexMappingRequest& r, const IndexCachePaths& paths,
                           const EpochPlan& plan, const NpyArray& doc, const NpyArray& sample,
                           const NpyArray& shuffle) {
    const int64_t n_doc_idx = plan.num_epochs * r.documents.size();
    if (doc.shape().size() != 1 ||
        (doc.dtype() != NpyDtype::kInt32 && doc.dtype() != NpyDtype::kInt64)) {
        return cache_mismatch(paths.doc_idx, paths, "expected a 1-D int32 array");
    }
    if (doc.size() != n_doc_idx) {
        return cache_mismatch(
            paths.doc_idx, paths,
            fmt::format("{} entries, expected {} epochs x {} documents = {}", doc.size(),
                        plan.num_epochs, r.documents.size(), n_doc_idx));
    }
    const int64_t rows = plan.num_samples_built + 1;
    if (sample.shape().size() != 2 || sample.shape()[1] != 2 ||
        (sample.dtype() != NpyDtype::kInt32 && sample.dtype() != NpyDtype::kInt64)) {
        return cache_mismatch(paths.sample_idx, paths, "expected an (N, 2) int32 or int64 array");
    }
    if (sample.shape()[0] != rows) {
        return cache_mismatch(paths.sample_idx, paths,
                              fmt::format("{} rows, expected {}", sample.shape()[0], rows));
    }
    if (shuffle.shape().size() != 1 ||
        (shuffle.dtype() != NpyDtype::kUint32 && shuffle.dtype() != NpyDtype::kInt64)) {
        return cache_mismatch(paths.shuffle_idx, paths, "expected a 1-D uint32 or int64 array");
    }
    if (shuffle.size() != rows - 1) {
        return cache_mismatch(paths.shuffle_idx, paths,
                              fmt::format("{} entries, expected {}", shuffle.size(), rows - 1));
    }
    return ok_status();
}

// Checks the values of cached arrays (shapes already checked): doc_idx inside the document
// range, sample_idx rows moving forward through doc_idx with offsets inside their documents,
// shuffle_idx a permutation. Linear in the array sizes; nothing is rebuilt.
Status check_cached_values(const IndexMappingRequest& r, std::span<const int32_t> sizes,
                           const IndexCachePaths& paths, const IndexMappings& m) {
    LATHE_RETURN_IF_ERROR(visit_elements(m.doc_idx, [&](auto doc) -> Status {
        for (size_t i = 0; i < doc.size(); ++i) {
            const int64_t d = doc[i];
            if (d < r.documents.begin || d >= r.documents.end) {
                return cache_mismatch(paths.doc_idx, paths,
                                      fmt::format("entry {} is document {}, outside [{}, {})", i, d,
                                                  r.documents.begin, r.documents.end));
            }
        }
        return ok_status();
    }));
    const int64_t n_doc_idx = m.doc_idx.size();
    LATHE_RETURN_IF_ERROR(visit_elements(m.sample_idx, [&](auto sample) -> Status {
        const int64_t rows = static_cast<int64_t>(sample.size() / 2);
        int64_t previous = 0;
        for (int64_t row = 0; row < rows; ++row) {
            const int64_t d = sample[2 * row];
            const int64_t offset = sample[2 * row + 1];
            bool ok = d >= previous && d < n_doc_idx && offset >= 0 &&
                      (row != 0 || (d == 0 && offset == 0));
            // Offsets stay inside their document; documents of size 0 only at row 0.
            if (ok) ok = offset < std::max<int64_t>(sizes[m.doc_idx.at(d)], 1);
            if (!ok) {
                return cache_mismatch(paths.sample_idx, paths,
                                      fmt::format("row {} = ({}, {}) does not point into the "
                                                  "documents of doc_idx",
                                                  row, d, offset));
            }
            previous = d;
        }
        return ok_status();
    }));
    return visit_elements(m.shuffle_idx, [&](auto shuffle) -> Status {
        std::vector<bool> seen(shuffle.size(), false);
        for (size_t i = 0; i < shuffle.size(); ++i) {
            const int64_t v = static_cast<int64_t>(shuffle[i]);
            if (v < 0 || v >= int64_t(shuffle.size()) || seen[static_cast<size_t>(v)]) {
                return cache_mismatch(
                    paths.shuffle_idx, paths,
                    fmt::format("entry {} = {} is not part of a permutation of [0, {})", i, v,
                                shuffle.size()));
            }
            seen[static_cast<size_t>(v)] = true;
        }
        return ok_status();
    });
}

}  // namespace

Result<IndexMappings> gpt_load_or_build_index_mappings(const IndexMappingRequest& r,
                                                       std::span<const int32_t> sizes) {
    LATHE_RETURN_IF_ERROR(check_request(r, sizes));
    const IndexCachePaths paths = index_cache_paths(r);
    const bool cached = file_exists(paths.doc_idx) && file_exists(paths.sample_idx) &&
                        file_exists(paths.shuffle_idx);
    if (!cached) {
        log_info("index '{}' of {}: building doc/sample/shuffle index (cache files {})", r.name,
                 r.data_prefix, paths.doc_idx);
        LATHE_ASSIGN_OR_RETURN(IndexMappings built, gpt_build_index_mappings(r, sizes));
        const int64_t doc_shape[] = {built.doc_idx.size()};
        const int64_t sample_shape[] = {built.num_sample_rows(), 2};
        const int64_t shuffle_shape[] = {built.shuffle_idx.size()};
        // In GPT-NeoX's order; each file appears complete or not at all.
        LATHE_RETURN_IF_ERROR(built.doc_idx.write_npy(paths.doc_idx, doc_shape));
        LATHE_RETURN_IF_ERROR(built.sample_idx.write_npy(paths.sample_idx, sample_shape));
        LATHE_RETURN_IF_ERROR(built.shuffle_idx.write_npy(paths.shuffle_idx, shuffle_shape));
    }
    // Load (memory-mapped), as GPT-NeoX loads what it has just saved.
    const int64_t tokens_per_epoch = gpt_num_tokens(sizes, r.documents);
    LATHE_ASSIGN_OR_RETURN(const EpochPlan plan, plan_epochs(r, tokens_per_epoch));
    auto open = [&](const std::string& path) -> Result<NpyArray> {
        auto a = NpyArray::open(path);
        if (!a.ok() && a.status().code() == StatusCode::kDataLoss) {
            return data_loss_error("{}; delete {}, {} and {} to rebuild the index",
                                   a.status().message(), paths.doc_idx, paths.sample_idx,
                                   paths.shuffle_idx);
        }
        return a;
    };
    LATHE_ASSIGN_OR_RETURN(NpyArray doc, open(paths.doc_idx));
    LATHE_ASSIGN_OR_RETURN(NpyArray sample, open(paths.sample_idx));
    LATHE_ASSIGN_OR_RETURN(NpyArray shuffle, open(paths.shuffle_idx));
    LATHE_RETURN_IF_ERROR(check_cached_shapes(r, paths, plan, doc, sample, shuffle));
    IndexMappings m;
    m.num_epochs = plan.num_epochs;
    m.tokens_per_epoch = tokens_per_epoch;
    m.separate_last_epoch = plan.separate_last_epoch;
    m.loaded_from_cache = cached;
    m.doc_idx = IndexArray::mapped(std::move(doc));
    m.sample_idx = IndexArray::mapped(std::move(sample));
    m.shuffle_idx = IndexArray::mapped(std::move(shuffle));
    // Files written just now hold what was built; files found on disk are checked in full.
    if (cached) LATHE_RETURN_IF_ERROR(check_cached_values(r, sizes, paths, m));
    if (cached) {
        log_info("index '{}' of {}: loaded {} samples ({} epochs) from {}", r.name, r.data_prefix,
                 m.num_samples(), m.num_epochs, paths.doc_idx);
    }
    return m;
}

// ---- Samples ------------------------------------------------------------------------------------

std::vector<SamplePiece> gpt_sample_pieces(const IndexMappings& m, std::span<const int32_t> sizes,
                                           int64_t row) {
    LATHE_CHECK(row >= 0 && row + 1 < m.num_sample_rows(), "sample row {} of {}", row,
                m.num_sample_rows() - 1);
    const int64_t doc_f = m.sample_doc_index(row);
    const int64_t doc_l = m.sample_doc_index(row + 1);
    const int64_t offset_f = m.sample_offset(row);
    const int64_t offset_l = m.sample_offset(row + 1);
    std::vector<SamplePiece> pieces;
    if (doc_f == doc_l) {
        pieces.push_back({m.doc_idx.at(doc_f), offset_f, offset_l - offset_f + 1});
        return pieces;
    }
    const int64_t first = m.doc_idx.at(doc_f);
    pieces.push_back({first, offset_f, sizes[first] - offset_f});
    for (int64_t i = doc_f + 1; i < doc_l; ++i) {
        const int64_t d = m.doc_idx.at(i);
        pieces.push_back({d, 0, sizes[d]});
    }
    pieces.push_back({m.doc_idx.at(doc_l), 0, offset_l + 1});
    return pieces;
}

// ---- Loader order -------------------------------------------------------------------------------

Result<int64_t> gpt_neox_micro_batch_start(int64_t micro_step, int64_t micro_batch,
                                           int64_t dp_world, int64_t dp_rank,
                                           int64_t dataset_size) {
    LATHE_CHECK(
        micro_step >= 0 && micro_batch >= 1 && dp_world >= 1 && dp_rank >= 0 && dp_rank < dp_world,
        "micro_step={} micro_batch={} dp_world={} dp_rank={}", micro_step, micro_batch, dp_world,
        dp_rank);
    const int64_t global = micro_batch * dp_world;
    const int64_t batches_per_pass = dataset_size / global;  // drop_last
    if (batches_per_pass == 0) {
        return failed_precondition_error(
            "{} samples do not fill one global batch of {} ({} per rank x {} ranks)", dataset_size,
            global, micro_batch, dp_world);
    }
    return (micro_step % batches_per_pass) * global + dp_rank * micro_batch;
}

}  // namespace lathe
