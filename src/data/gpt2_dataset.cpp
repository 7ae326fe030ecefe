#include "data/gpt2_dataset.h"

#include <algorithm>

#include "core/check.h"

namespace lathe {

// ---- InMemoryDocuments --------------------------------------------------------------------------

InMemoryDocuments::InMemoryDocuments(std::string name, std::vector<std::vector<int32_t>> documents)
    : name_(std::move(name)), documents_(std::move(documents)) {
    sizes_.reserve(documents_.size());
    for (const auto& d : documents_) {
        LATHE_CHECK(d.size() <= size_t(INT32_MAX), "{}: a document of {} tokens", name_, d.size());
        sizes_.push_back(static_cast<int32_t>(d.size()));
    }
}

Status InMemoryDocuments::read(int64_t document, int64_t offset, std::span<int32_t> out) const {
    LATHE_CHECK(document >= 0 && document < int64_t(documents_.size()), "{}: document {} of {}",
                name_, document, documents_.size());
    const auto& d = documents_[document];
    LATHE_CHECK(offset >= 0 && offset + int64_t(out.size()) <= int64_t(d.size()),
                "{}: tokens [{}, {}) of a document of {}", name_, offset, offset + out.size(),
                d.size());
    std::copy_n(d.begin() + offset, out.size(), out.begin());
    return ok_status();
}

// ---- TokenDocuments -----------------------------------------------------------------------------

Result<std::optional<TokenIdOutOfRange>> TokenDocuments::find_id_outside(int64_t vocab,
                                                                         bool negative_ok) const {
    std::vector<int32_t> tokens;
    const auto n = sizes();
    for (size_t d = 0; d < n.size(); ++d) {
        tokens.resize(size_t(n[d]));
        LATHE_RETURN_IF_ERROR(read(int64_t(d), 0, tokens));
        for (size_t t = 0; t < tokens.size(); ++t) {
            const int64_t id = tokens[t];
            if (id >= vocab || (id < 0 && !negative_ok))
                return std::optional<TokenIdOutOfRange>(
                    TokenIdOutOfRange{id, int64_t(d), int64_t(t)});
        }
    }
    return std::optional<TokenIdOutOfRange>();
}

// ---- Gpt2Dataset --------------------------------------------------------------------------------

Result<std::unique_ptr<Gpt2Dataset>> Gpt2Dataset::create(const IndexMappingRequest& request,
                                                         const TokenDocuments& tokens,
                                                         const TokenDocuments* labels,
                                                         bool use_cache) {
    if (labels != nullptr) {
        const auto a = tokens.sizes();
        const auto b = labels->sizes();
        if (a.size() != b.size()) {
            return invalid_argument_error(
                "label file {} has {} documents but token file {} has {}; a label file must be "
                "written together with its token file (same documents, same lengths)",
                labels->name(), b.size(), tokens.name(), a.size());
        }
        const auto diff = std::mismatch(a.begin(), a.end(), b.begin());
        if (diff.first != a.end()) {
            const auto doc = diff.first - a.begin();
            return invalid_argument_error(
                "label file {} does not line up with token file {}: document {} has {} labels "
                "but {} tokens",
                labels->name(), tokens.name(), doc, *diff.second, *diff.first);
        }
    }
    auto ds = std::unique_ptr<Gpt2Dataset>(new Gpt2Dataset());
    ds->request_ = request;
    ds->tokens_ = &tokens;
    ds->labels_ = labels;
    ds->seq_length_ = request.seq_length;
    if (use_cache) {
        LATHE_ASSIGN_OR_RETURN(ds->mappings_,
                               gpt_load_or_build_index_mappings(request, tokens.sizes()));
    } else {
        LATHE_ASSIGN_OR_RETURN(ds->mappings_, gpt_build_index_mappings(request, tokens.sizes()));
    }
    return ds;
}

int64_t Gpt2Dataset::size() const {
    if (request_.flavor == IndexFlavor::kMegatronSeparateLastEpoch) return mappings_.num_samples();
    // shuffle_idx_len = len(shuffle_idx) - 1, sample_idx_len = len(sample_idx) - 1
    return std::min(mappings_.shuffle_idx.size() - 1, mappings_.num_sample_rows() - 1);
}

Status Gpt2Dataset::get(Sample& out, int64_t index) const {
    LATHE_CHECK(index >= 0, "negative sample index {}", index);
    if (index >= mappings_.shuffle_idx.size()) {
        const int64_t n = size();
        if (n <= 0) {
            return failed_precondition_error(
                "dataset '{}' of {} has no samples to wrap around to (index {})", request_.name,
                request_.data_prefix, index);
        }
        LATHE_CHECK(request_.flavor == IndexFlavor::kGptNeox,
                    "sample {} past the end ({}) of a Megatron-flavored dataset", index, n);
        index %= n;  // GPT2Dataset.__getitem__'s IndexError fallback
    }
    const int64_t row = mappings_.shuffle_idx.at(index);
    const std::vector<SamplePiece> pieces = gpt_sample_pieces(mappings_, tokens_->sizes(), row);
    const int64_t length = seq_length_ + 1;
    out.sample_row = row;
    out.tokens.resize(static_cast<size_t>(length));
    out.labels.resize(labels_ != nullptr ? static_cast<size_t>(length) : 0);
    out.documents.clear();
    int64_t at = 0;
    for (const SamplePiece& p : pieces) {
        LATHE_CHECK(at + p.length <= length, "pieces overflow the sample: {} + {} > {}", at,
                    p.length, length);
        if (p.length == 0) continue;
        std::span<int32_t> dst(out.tokens.data() + at, static_cast<size_t>(p.length));
        LATHE_RETURN_IF_ERROR(tokens_->read(p.document, p.offset, dst));
        if (labels_ != nullptr) {
            std::span<int32_t> ldst(out.labels.data() + at, static_cast<size_t>(p.length));
            LATHE_RETURN_IF_ERROR(labels_->read(p.document, p.offset, ldst));
        }
        out.documents.push_back({at, p.length, p.document});
        at += p.length;
    }
    LATHE_CHECK(at == length, "sample row {} has {} tokens, expected {}", row, at, length);
    return ok_status();
}

}  // namespace lathe
