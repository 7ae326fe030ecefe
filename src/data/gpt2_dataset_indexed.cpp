// TokenDocuments over a memory-mapped .bin/.idx pair (kept apart from gpt2_dataset.cpp so that
// programs using only in-memory corpora do not pull in the token file reader).

#include <limits>

#include "data/gpt2_dataset.h"
#include "data/indexed_dataset.h"

namespace lathe {
namespace {

class IndexedTokenDocuments final : public TokenDocuments {
public:
    explicit IndexedTokenDocuments(IndexedDataset file) : file_(std::move(file)) {
        // The .idx keeps sizes at byte 34, not 4-byte aligned, so they are copied once
        // (4 bytes per sequence) rather than viewed in place.
        sizes_.resize(file_.sequence_count());
        for (uint64_t i = 0; i < sizes_.size(); ++i) sizes_[i] = file_.sequence_length(i);
    }
    const std::string& name() const override { return file_.prefix(); }
    std::span<const int32_t> sizes() const override { return sizes_; }
    Status read(int64_t document, int64_t offset, std::span<int32_t> out) const override {
        thread_local std::vector<int64_t> wide;
        wide.resize(out.size());
        file_.read(static_cast<uint64_t>(document), static_cast<uint64_t>(offset), out.size(),
                   wide.data());
        for (size_t i = 0; i < out.size(); ++i) {
            if (wide[i] < std::numeric_limits<int32_t>::min() ||
                wide[i] > std::numeric_limits<int32_t>::max()) {
                return data_loss_error(
                    "{}: token {} at position {} of sequence {} does not fit "
                    "int32",
                    indexed_bin_path(file_.prefix()), wide[i], offset + int64_t(i), document);
            }
            out[i] = static_cast<int32_t>(wide[i]);
        }
        return ok_status();
    }

private:
    IndexedDataset file_;
    std::vector<int32_t> sizes_;
};

}  // namespace

Result<std::unique_ptr<TokenDocuments>> open_indexed_token_documents(const std::string& prefix) {
    LATHE_ASSIGN_OR_RETURN(IndexedDataset file, IndexedDataset::open(prefix));
    return std::unique_ptr<TokenDocuments>(
        std::make_unique<IndexedTokenDocuments>(std::move(file)));
}

}  // namespace lathe
