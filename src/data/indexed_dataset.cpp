#include "data/indexed_dataset.h"

#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>

#include "core/check.h"
#include "core/strings.h"

namespace lathe {

// The format is little-endian; every host lathe targets (x86-64, aarch64) is too, so values are
// copied as they are.
static_assert(std::endian::native == std::endian::little, "token files are little-endian");

namespace {

template <typename T>
T load(const uint8_t* p) {
    T v;
    std::memcpy(&v, p, sizeof(T));
    return v;
}

template <typename T>
void append(std::string& out, T v) {
    out.append(reinterpret_cast<const char*>(&v), sizeof(T));
}

// Element `j` of a token array of `dtype` starting at `p`, widened to int64.
int64_t load_token(TokenDType dtype, const uint8_t* p, uint64_t j) {
    switch (dtype) {
        case TokenDType::kUInt8:
            return p[j];
        case TokenDType::kInt8:
            return static_cast<int8_t>(p[j]);
        case TokenDType::kInt16:
            return load<int16_t>(p + 2 * j);
        case TokenDType::kUInt16:
            return load<uint16_t>(p + 2 * j);
        case TokenDType::kInt32:
            return load<int32_t>(p + 4 * j);
        case TokenDType::kInt64:
            return load<int64_t>(p + 8 * j);
    }
    return 0;
}

}  // namespace

size_t token_dtype_size(TokenDType dtype) {
    switch (dtype) {
        case TokenDType::kUInt8:
        case TokenDType::kInt8:
            return 1;
        case TokenDType::kInt16:
        case TokenDType::kUInt16:
            return 2;
        case TokenDType::kInt32:
            return 4;
        case TokenDType::kInt64:
            return 8;
    }
    return 0;
}

const char* token_dtype_name(TokenDType dtype) {
    switch (dtype) {
        case TokenDType::kUInt8:
            return "uint8";
        case TokenDType::kInt8:
            return "int8";
        case TokenDType::kInt16:
            return "int16";
        case TokenDType::kInt32:
            return "int32";
        case TokenDType::kInt64:
            return "int64";
        case TokenDType::kUInt16:
            return "uint16";
    }
    return "?";
}

Result<TokenDType> token_dtype_from_code(uint8_t code, std::string_view file) {
    switch (code) {
        case 1:
            return TokenDType::kUInt8;
        case 2:
            return TokenDType::kInt8;
        case 3:
            return TokenDType::kInt16;
        case 4:
            return TokenDType::kInt32;
        case 5:
            return TokenDType::kInt64;
        case 8:
            return TokenDType::kUInt16;
        case 6:
        case 7:
            return invalid_argument_error(
                "{}: dtype code {} is a floating-point type (GPT-NeoX reads it as {}, Megatron-LM "
                "as {}), not token ids; lathe reads token files with integer codes 1-5 and 8",
                file, code, code == 6 ? "float32" : "float64", code == 6 ? "float64" : "float32");
        default:
            return data_loss_error(
                "{}: unknown dtype code {} (GPT-NeoX and Megatron-LM use 1-8; tokens are 4 = "
                "int32 or 8 = uint16)",
                file, code);
    }
}

TokenDType token_dtype_for_vocab(int64_t vocab_size) {
    // The same threshold as GPT-NeoX's __best_fitting_dtype and Megatron-LM's optimal_dtype.
    return vocab_size < 65500 ? TokenDType::kUInt16 : TokenDType::kInt32;
}

bool token_dtype_holds(TokenDType dtype, int64_t value) {
    switch (dtype) {
        case TokenDType::kUInt8:
            return value >= 0 && value <= 255;
        case TokenDType::kInt8:
            return value >= -128 && value <= 127;
        case TokenDType::kInt16:
            return value >= -32768 && value <= 32767;
        case TokenDType::kUInt16:
            return value >= 0 && value <= 65535;
        case TokenDType::kInt32:
            return value >= std::numeric_limits<int32_t>::min() &&
                   value <= std::numeric_limits<int32_t>::max();
        case TokenDType::kInt64:
            return true;
    }
    return false;
}

std::string indexed_bin_path(const std::string& prefix) {
    return prefix + ".bin";
}
std::string indexed_idx_path(const std::string& prefix) {
    return prefix + ".idx";
}

// ---- writer ----

Result<IndexedDatasetWriter> IndexedDatasetWriter::create(const std::string& prefix,
                                                          TokenDType dtype) {
    IndexedDatasetWriter w;
    w.prefix_ = prefix;
    w.dtype_ = dtype;
    LATHE_ASSIGN_OR_RETURN(w.bin_, AtomicFile::create(indexed_bin_path(prefix)));
    return w;
}

Status IndexedDatasetWriter::add_sequence(std::span<const int32_t> tokens) {
    if (finalized_) return failed_precondition_error("{}: add after finalize", prefix_);
    if (tokens.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
        return invalid_argument_error(
            "{}: a sequence of {} tokens does not fit the index (sizes are int32)", prefix_,
            tokens.size());
    }
    const size_t width = token_dtype_size(dtype_);
    scratch_.resize(tokens.size() * width);
    uint8_t* out = scratch_.data();
    for (size_t j = 0; j < tokens.size(); ++j) {
        const int32_t v = tokens[j];
        if (!token_dtype_holds(dtype_, v)) {
            return invalid_argument_error(
                "{}: token {} (at position {} of sequence {}) does not fit dtype {}", prefix_, v, j,
                sizes_.size(), token_dtype_name(dtype_));
        }
        switch (dtype_) {
            case TokenDType::kUInt8:
            case TokenDType::kInt8:
                out[j] = static_cast<uint8_t>(v);
                break;
            case TokenDType::kInt16:
            case TokenDType::kUInt16: {
                const uint16_t u = static_cast<uint16_t>(v);
                std::memcpy(out + 2 * j, &u, 2);
                break;
            }
            case TokenDType::kInt32:
                std::memcpy(out + 4 * j, &v, 4);
                break;
            case TokenDType::kInt64: {
                const int64_t w = v;
                std::memcpy(out + 8 * j, &w, 8);
                break;
            }
        }
    }
    LATHE_RETURN_IF_ERROR(bin_.write(scratch_.data(), scratch_.size()));
    sizes_.push_back(static_cast<int32_t>(tokens.size()));
    tokens_ += tokens.size();
    return ok_status();
}

void IndexedDatasetWriter::end_document() {
    doc_idx_.push_back(static_cast<int64_t>(sizes_.size()));
}

Status IndexedDatasetWriter::add_document(std::span<const int32_t> tokens) {
    LATHE_RETURN_IF_ERROR(add_sequence(tokens));
    end_document();
    return ok_status();
}

Status IndexedDatasetWriter::finalize() {
    if (finalized_) return ok_status();
    LATHE_ASSIGN_OR_RETURN(idx_, AtomicFile::create(indexed_idx_path(prefix_)));
    std::string head;
    head.append(kIndexMagic);
    append<uint64_t>(head, 1);  // version
    append<uint8_t>(head, static_cast<uint8_t>(dtype_));
    append<uint64_t>(head, sizes_.size());
    append<uint64_t>(head, doc_idx_.size());
    LATHE_CHECK(head.size() == kIndexHeaderBytes);
    LATHE_RETURN_IF_ERROR(idx_.write(head));
    LATHE_RETURN_IF_ERROR(idx_.write(sizes_.data(), sizes_.size() * sizeof(int32_t)));
    // pointers[i] = byte offset of sequence i, written in chunks to keep memory flat.
    const int64_t width = static_cast<int64_t>(token_dtype_size(dtype_));
    std::vector<int64_t> chunk;
    chunk.reserve(1 << 16);
    int64_t address = 0;
    for (size_t i = 0; i < sizes_.size(); ++i) {
        chunk.push_back(address);
        address += static_cast<int64_t>(sizes_[i]) * width;
        if (chunk.size() == chunk.capacity() || i + 1 == sizes_.size()) {
            LATHE_RETURN_IF_ERROR(idx_.write(chunk.data(), chunk.size() * sizeof(int64_t)));
            chunk.clear();
        }
    }
    LATHE_CHECK(static_cast<uint64_t>(address) == bin_.bytes_written(), "address={} bin={}",
                address, bin_.bytes_written());
    LATHE_RETURN_IF_ERROR(idx_.write(doc_idx_.data(), doc_idx_.size() * sizeof(int64_t)));
    finalized_ = true;
    return ok_status();
}

namespace {

Status remove_if_present(const std::string& path) {
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
        return io_error("{}: cannot remove the old file: {}", path, std::strerror(errno));
    }
    return ok_status();
}

}  // namespace

Status IndexedDatasetWriter::commit() {
    IndexedDatasetWriter* self = this;
    return indexed_commit_together(std::span<IndexedDatasetWriter* const>(&self, 1));
}

Status indexed_commit_together(std::span<IndexedDatasetWriter* const> writers) {
    for (IndexedDatasetWriter* w : writers) {
        if (!w->finalized_) {
            return failed_precondition_error("{}: commit before finalize", w->prefix());
        }
    }
    for (IndexedDatasetWriter* w : writers) {
        LATHE_RETURN_IF_ERROR(remove_if_present(indexed_idx_path(w->prefix())));
    }
    for (IndexedDatasetWriter* w : writers) LATHE_RETURN_IF_ERROR(w->bin_.commit());
    for (size_t i = writers.size(); i-- > 0;) LATHE_RETURN_IF_ERROR(writers[i]->idx_.commit());
    return ok_status();
}

// ---- reader ----

Result<IndexHeader> indexed_read_header(const std::string& idx_path) {
    LATHE_ASSIGN_OR_RETURN(MappedFile idx, MappedFile::open(idx_path));
    const uint8_t* p = idx.data();
    const uint64_t n = idx.size();
    const size_t magic_seen = std::min<uint64_t>(n, kIndexMagic.size());
    // An empty file maps to no address: test its size before comparing bytes.
    if (n == 0 || std::memcmp(p, kIndexMagic.data(), magic_seen) != 0) {
        if (n >= 8 && std::memcmp(p, "TNTIDX\0\0", 8) == 0) {
            return invalid_argument_error(
                "{}: is a fairseq/Megatron 'lazy'/'cached' IndexedDataset (magic TNTIDX); lathe "
                "reads the 'mmap' format (magic MMIDIDX), which GPT-NeoX and Megatron-LM write "
                "by default",
                idx_path);
        }
        return data_loss_error(
            "{}: not a token index: expected the magic \"MMIDIDX\\0\\0\", found {}", idx_path,
            n == 0 ? std::string("an empty file")
                   : "\"" +
                         escape_for_message(
                             std::string_view(reinterpret_cast<const char*>(p), magic_seen)) +
                         "\"");
    }
    if (n < kIndexHeaderBytes) {
        return data_loss_error(
            "{}: truncated: {} bytes, shorter than the {}-byte header (an interrupted copy?)",
            idx_path, n, kIndexHeaderBytes);
    }
    const uint64_t version = load<uint64_t>(p + 9);
    if (version != 1) {
        return data_loss_error("{}: index version {}, expected 1", idx_path, version);
    }
    IndexHeader h;
    h.dtype_code = p[17];
    h.sequence_count = load<uint64_t>(p + 18);
    h.doc_idx_count = load<uint64_t>(p + 26);
    return h;
}

namespace {

// When "<prefix>.idx" does not exist: what the user most likely passed instead (the .bin or .idx
// file itself, a corpus file, a folder), and what to pass.
Status missing_token_files(const std::string& prefix) {
    for (const std::string_view ext : {".bin", ".idx"}) {
        if (!ends_with(prefix, ext)) continue;
        const std::string stem = prefix.substr(0, prefix.size() - ext.size());
        if (::access(indexed_idx_path(stem).c_str(), F_OK) == 0)
            return invalid_argument_error(
                "{}: a token-file prefix is the path without .bin/.idx: pass {}", prefix, stem);
    }
    const std::string what =
        ::access(prefix.c_str(), F_OK) == 0 ? "not a token-file prefix" : "no token files there";
    return not_found_error(
        "{}: {} ({}: no such file); token files are PREFIX.bin + PREFIX.idx, written by "
        "`lathe prepare --output-prefix PREFIX`",
        prefix, what, indexed_idx_path(prefix));
}

}  // namespace

Result<IndexedDataset> IndexedDataset::open(const std::string& prefix) {
    IndexedDataset ds;
    ds.prefix_ = prefix;
    const std::string idx_path = indexed_idx_path(prefix);
    const std::string bin_path = indexed_bin_path(prefix);
    Result<IndexHeader> header = indexed_read_header(idx_path);
    // No .idx (the only not-found of indexed_read_header): say what to pass instead.
    if (!header.ok() && header.status().code() == StatusCode::kNotFound)
        return missing_token_files(prefix);
    LATHE_ASSIGN_OR_RETURN(const IndexHeader h, std::move(header));
    LATHE_ASSIGN_OR_RETURN(ds.dtype_, token_dtype_from_code(h.dtype_code, idx_path));
    LATHE_ASSIGN_OR_RETURN(ds.idx_, MappedFile::open(idx_path));
    LATHE_ASSIGN_OR_RETURN(ds.bin_, MappedFile::open(bin_path));
    const uint64_t S = h.sequence_count;
    const uint64_t D = h.doc_idx_count;
    const uint64_t idx_size = ds.idx_.size();

    // Compare counts with the file length before multiplying, so absurd counts cannot overflow.
    const uint64_t body = idx_size - kIndexHeaderBytes;
    if (S > body / 12 || D > body / 8 || 12 * S + 8 * D > body) {
        return data_loss_error(
            "{}: truncated: the header announces {} sequences and {} doc_idx entries, which need "
            "{} bytes, but the file has {} (an interrupted write or copy?)",
            idx_path, S, D,
            S > body / 12 || D > body / 8 ? std::string("more")
                                          : std::to_string(kIndexHeaderBytes + 12 * S + 8 * D),
            idx_size);
    }
    const uint64_t expected = kIndexHeaderBytes + 12 * S + 8 * D;
    if (idx_size == expected + S && S > 0) {
        ds.has_modes_ = true;  // Megatron-LM multimodal: one int8 mode per sequence at the end
    } else if (idx_size != expected) {
        return data_loss_error(
            "{}: {} bytes after the arrays: the header announces {} sequences and {} doc_idx "
            "entries ({} bytes in all), the file has {}",
            idx_path, idx_size - expected, S, D, expected, idx_size);
    }
    if (D == 0) {
        return data_loss_error("{}: doc_idx is empty; it must start with 0", idx_path);
    }
    ds.sequence_count_ = S;
    ds.doc_idx_count_ = D;

    const uint8_t* sizes = ds.idx_.data() + kIndexHeaderBytes;
    const uint8_t* pointers = sizes + 4 * S;
    const uint8_t* docs = pointers + 8 * S;
    const uint64_t width = token_dtype_size(ds.dtype_);
    uint64_t address = 0;
    for (uint64_t i = 0; i < S; ++i) {
        const int32_t size = load<int32_t>(sizes + 4 * i);
        const int64_t ptr = load<int64_t>(pointers + 8 * i);
        if (size < 0) {
            return data_loss_error("{}: sizes[{}] = {} is negative", idx_path, i, size);
        }
        if (i > 0 && ptr < load<int64_t>(pointers + 8 * (i - 1))) {
            return data_loss_error(
                "{}: pointers are not monotonic: pointers[{}] = {} is less than pointers[{}] = {}",
                idx_path, i, ptr, i - 1, load<int64_t>(pointers + 8 * (i - 1)));
        }
        if (ptr < 0 || static_cast<uint64_t>(ptr) != address) {
            return data_loss_error(
                "{}: pointers[{}] = {}, expected {} (pointers[{}] + sizes[{}] x {} bytes): the "
                "sequences must lie back to back in the .bin",
                idx_path, i, ptr, address, i == 0 ? 0 : i - 1, i == 0 ? 0 : i - 1, width);
        }
        address += static_cast<uint64_t>(size) * width;
        ds.token_count_ += static_cast<uint64_t>(size);
    }
    if (ds.bin_.size() != address) {
        return data_loss_error(
            "{}: {} bytes, but {} describes {} bytes ({} tokens of {}){}", bin_path, ds.bin_.size(),
            idx_path, address, ds.token_count_, token_dtype_name(ds.dtype_),
            ds.bin_.size() < address ? ": the .bin is truncated"
                                     : ": the .bin has trailing bytes (index and data from "
                                       "different runs?)");
    }
    int64_t prev = 0;
    for (uint64_t k = 0; k < D; ++k) {
        const int64_t d = load<int64_t>(docs + 8 * k);
        if (k == 0 && d != 0) {
            return data_loss_error("{}: doc_idx[0] = {}, expected 0", idx_path, d);
        }
        if (d < prev) {
            return data_loss_error(
                "{}: doc_idx is not monotonic: doc_idx[{}] = {} is less than doc_idx[{}] = {}",
                idx_path, k, d, k - 1, prev);
        }
        if (static_cast<uint64_t>(d) > S) {
            return data_loss_error("{}: doc_idx[{}] = {} is beyond the {} sequences of the file",
                                   idx_path, k, d, S);
        }
        prev = d;
    }
    if (static_cast<uint64_t>(prev) != S) {
        ds.warnings_.push_back(fmt::format(
            "doc_idx ends at sequence {} of {}: the last {} sequences belong to no document "
            "(GPT-NeoX's merge_datasets.py writes such files; GPT-NeoX ignores doc_idx and reads "
            "them, Megatron-LM refuses them)",
            prev, S, S - static_cast<uint64_t>(prev)));
    }
    return ds;
}

int32_t IndexedDataset::sequence_length(uint64_t i) const {
    LATHE_CHECK(i < sequence_count_, "sequence {} of {}", i, sequence_count_);
    return load<int32_t>(idx_.data() + kIndexHeaderBytes + 4 * i);
}

int64_t IndexedDataset::sequence_pointer(uint64_t i) const {
    LATHE_CHECK(i < sequence_count_, "sequence {} of {}", i, sequence_count_);
    return load<int64_t>(idx_.data() + kIndexHeaderBytes + 4 * sequence_count_ + 8 * i);
}

int64_t IndexedDataset::doc_idx(uint64_t k) const {
    LATHE_CHECK(k < doc_idx_count_, "doc_idx {} of {}", k, doc_idx_count_);
    return load<int64_t>(idx_.data() + kIndexHeaderBytes + 12 * sequence_count_ + 8 * k);
}

void IndexedDataset::read(uint64_t i, uint64_t offset, uint64_t length, int64_t* dst) const {
    const uint64_t size = static_cast<uint64_t>(sequence_length(i));
    LATHE_CHECK(offset <= size && length <= size - offset, "offset={} length={} size={}", offset,
                length, size);
    const uint8_t* p = bin_.data() + sequence_pointer(i);
    for (uint64_t j = 0; j < length; ++j) dst[j] = load_token(dtype_, p, offset + j);
}

void IndexedDataset::read_sequence(uint64_t i, std::vector<int64_t>& out) const {
    const uint64_t size = static_cast<uint64_t>(sequence_length(i));
    const size_t at = out.size();
    out.resize(at + size);
    read(i, 0, size, out.data() + at);
}

void IndexedDataset::read_document(uint64_t k, std::vector<int64_t>& out) const {
    LATHE_CHECK(k < document_count(), "document {} of {}", k, document_count());
    for (int64_t i = doc_idx(k); i < doc_idx(k + 1); ++i)
        read_sequence(static_cast<uint64_t>(i), out);
}

uint64_t IndexedDataset::document_length(uint64_t k) const {
    LATHE_CHECK(k < document_count(), "document {} of {}", k, document_count());
    uint64_t total = 0;
    for (int64_t i = doc_idx(k); i < doc_idx(k + 1); ++i) {
        total += static_cast<uint64_t>(sequence_length(static_cast<uint64_t>(i)));
    }
    return total;
}

}  // namespace lathe
