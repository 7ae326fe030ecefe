// TokenDocuments over a memory-mapped .bin/.idx pair (kept apart from gpt2_dataset.cpp so that
// programs using only in-memory corpora do not pull in the token file reader).

#include <algorithm>
#include <cstdint>
#include <limits>
#include <thread>

#include "core/check.h"
#include "data/gpt2_dataset.h"
#include "data/indexed_dataset.h"
#include "io/file.h"

namespace lathe {
namespace {

// Index of the first of `n` tokens of type T at `tokens` outside [lo, hi], or n when none is.
// Each thread takes one contiguous stretch and keeps its minimum and maximum, over blocks of a
// fixed length so that the compiler vectorizes the reduction; only a stretch whose extremes fall
// outside is searched again for the position. A file in range costs one pass at memory speed.
template <typename T>
uint64_t first_outside(const T* tokens, uint64_t n, int64_t lo, int64_t hi) {
    const uint64_t cores = std::max(1u, std::thread::hardware_concurrency());
    const uint64_t threads = std::clamp<uint64_t>(n >> 20, 1, cores);  // >= 2^20 tokens each
    const uint64_t chunk = (n + threads - 1) / threads;
    std::vector<char> outside(threads, 0);
    auto scan = [&](uint64_t c) {
        const uint64_t begin = std::min(n, c * chunk), end = std::min(n, begin + chunk);
        T mn = std::numeric_limits<T>::max(), mx = std::numeric_limits<T>::lowest();
        constexpr uint64_t kBlock = 4096;
        uint64_t i = begin;
        for (; i + kBlock <= end; i += kBlock) {
            const T* block = tokens + i;
            for (uint64_t j = 0; j < kBlock; ++j) {
                mn = std::min(mn, block[j]);
                mx = std::max(mx, block[j]);
            }
        }
        for (; i < end; ++i) {
            mn = std::min(mn, tokens[i]);
            mx = std::max(mx, tokens[i]);
        }
        outside[c] = begin < end && (int64_t(mn) < lo || int64_t(mx) > hi);
    };
    std::vector<std::thread> pool;
    for (uint64_t c = 1; c < threads; ++c) pool.emplace_back(scan, c);
    scan(0);
    for (std::thread& t : pool) t.join();
    for (uint64_t c = 0; c < threads; ++c) {
        if (!outside[c]) continue;
        for (uint64_t i = c * chunk; i < std::min(n, (c + 1) * chunk); ++i) {
            if (int64_t(tokens[i]) < lo || int64_t(tokens[i]) > hi) return i;
        }
    }
    return n;
}

// The .bin's tokens as an array of T: the mapping starts on a page and token i sits at byte
// i * sizeof(T), so every token is aligned (checked).
template <typename T>
uint64_t first_outside_in(const MappedFile& bin, uint64_t n, int64_t lo, int64_t hi) {
    LATHE_CHECK(
        reinterpret_cast<uintptr_t>(bin.data()) % alignof(T) == 0 && bin.size() >= n * sizeof(T),
        "{}: {} bytes at {} for {} tokens", bin.path(), bin.size(),
        static_cast<const void*>(bin.data()), n);
    return first_outside(reinterpret_cast<const T*>(bin.data()), n, lo, hi);
}

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

    Result<std::optional<TokenIdOutOfRange>> find_id_outside(int64_t vocab,
                                                             bool negative_ok) const override {
        const TokenDType dtype = file_.dtype();
        const int64_t lo = negative_ok ? std::numeric_limits<int64_t>::min() : 0;
        const int64_t hi = vocab - 1;
        // Every value the dtype holds is in range: nothing to read.
        const bool unsigned_dtype = dtype == TokenDType::kUInt8 || dtype == TokenDType::kUInt16;
        const int64_t dtype_max = dtype == TokenDType::kUInt8 ? 255 : 65535;
        const uint64_t n = file_.token_count();
        if (n == 0 || (unsigned_dtype && dtype_max <= hi))
            return std::optional<TokenIdOutOfRange>();
        // open() checked that the .bin holds exactly the tokens the index describes, from byte 0.
        const MappedFile& bin = file_.bin();
        uint64_t at = n;
        switch (dtype) {
            case TokenDType::kUInt8:
                at = first_outside_in<uint8_t>(bin, n, lo, hi);
                break;
            case TokenDType::kInt8:
                at = first_outside_in<int8_t>(bin, n, lo, hi);
                break;
            case TokenDType::kInt16:
                at = first_outside_in<int16_t>(bin, n, lo, hi);
                break;
            case TokenDType::kUInt16:
                at = first_outside_in<uint16_t>(bin, n, lo, hi);
                break;
            case TokenDType::kInt32:
                at = first_outside_in<int32_t>(bin, n, lo, hi);
                break;
            case TokenDType::kInt64:
                at = first_outside_in<int64_t>(bin, n, lo, hi);
                break;
        }
        if (at == n) return std::optional<TokenIdOutOfRange>();
        // The sequence holding token `at` (sequences lie back to back from token 0).
        TokenIdOutOfRange bad;
        uint64_t start = 0;
        for (size_t d = 0; d < sizes_.size(); ++d) {
            if (at < start + uint64_t(sizes_[d])) {
                bad.document = int64_t(d);
                bad.position = int64_t(at - start);
                break;
            }
            start += uint64_t(sizes_[d]);
        }
        std::vector<int64_t> one(1);
        file_.read(uint64_t(bad.document), uint64_t(bad.position), 1, one.data());
        bad.id = one[0];
        return std::optional<TokenIdOutOfRange>(bad);
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
