#include "data/npy.h"

#include <cstring>
#include <optional>

#include "core/strings.h"

namespace lathe {
namespace {

constexpr std::string_view kMagic = "\x93NUMPY";
constexpr size_t kMagicLength = 8;  // magic + major + minor, as numpy's MAGIC_LEN
constexpr size_t kArrayAlign = 64;  // numpy's ARRAY_ALIGN: data starts on a multiple of this
// numpy leaves room to grow the first axis in place: len(str(8 * 2**64 - 1)) digits in all.
constexpr size_t kGrowthAxisMaxDigits = 21;

struct DtypeInfo {
    NpyDtype dtype;
    const char* descr;
    size_t size;
};

constexpr DtypeInfo kDtypes[] = {
    {NpyDtype::kInt8, "|i1", 1},    {NpyDtype::kUint8, "|u1", 1},  {NpyDtype::kInt16, "<i2", 2},
    {NpyDtype::kUint16, "<u2", 2},  {NpyDtype::kInt32, "<i4", 4},  {NpyDtype::kUint32, "<u4", 4},
    {NpyDtype::kInt64, "<i8", 8},   {NpyDtype::kUint64, "<u8", 8}, {NpyDtype::kFloat32, "<f4", 4},
    {NpyDtype::kFloat64, "<f8", 8},
};

std::optional<NpyDtype> dtype_from_descr(std::string_view descr) {
    if (descr.size() < 2) return std::nullopt;
    // '=' (native) is little-endian on every machine lathe runs on; '|' means "not applicable"
    // and numpy uses it for one-byte types. Big-endian ('>') data is refused by the caller.
    const char order = descr[0];
    const std::string_view kind_size = descr.substr(1);
    for (const DtypeInfo& info : kDtypes) {
        if (kind_size != std::string_view(info.descr).substr(1)) continue;
        if (order == '<' || order == '=' || (order == '|' && info.size == 1)) return info.dtype;
        if (order == '>' && info.size == 1) return info.dtype;
    }
    return std::nullopt;
}

std::string shape_repr(std::span<const int64_t> shape) {
    if (shape.empty()) return "()";
    std::string out = "(";
    for (size_t i = 0; i < shape.size(); ++i) {
        if (i > 0) out += ", ";
        out += std::to_string(shape[i]);
    }
    if (shape.size() == 1) out += ",";
    out += ")";
    return out;
}

// A tiny reader for the header dict: {'key': value, ...} with values that are strings, True or
// False, or tuples of integers (Python 2 numpy wrote "10L").
class HeaderParser {
public:
    explicit HeaderParser(std::string_view text) : text_(text) {}

    void skip_space() {
        while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t' ||
                                       text_[pos_] == '\n' || text_[pos_] == '\r')) {
            ++pos_;
        }
    }
    bool eat(char c) {
        skip_space();
        if (pos_ < text_.size() && text_[pos_] == c) {
            ++pos_;
            return true;
        }
        return false;
    }
    bool peek(char c) {
        skip_space();
        return pos_ < text_.size() && text_[pos_] == c;
    }
    std::optional<std::string> string() {
        skip_space();
        if (pos_ >= text_.size() || (text_[pos_] != '\'' && text_[pos_] != '"')) return {};
        const char quote = text_[pos_++];
        const size_t end = text_.find(quote, pos_);
        if (end == std::string_view::npos) return {};
        std::string out(text_.substr(pos_, end - pos_));
        pos_ = end + 1;
        return out;
    }
    std::optional<bool> boolean() {
        skip_space();
        if (text_.substr(pos_, 4) == "True") {
            pos_ += 4;
            return true;
        }
        if (text_.substr(pos_, 5) == "False") {
            pos_ += 5;
            return false;
        }
        return {};
    }
    std::optional<std::vector<int64_t>> int_tuple() {
        if (!eat('(')) return {};
        std::vector<int64_t> out;
        while (true) {
            if (eat(')')) return out;
            skip_space();
            const size_t start = pos_;
            int64_t v = 0;
            while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') {
                if (v > (INT64_MAX - 9) / 10) return {};
                v = v * 10 + (text_[pos_] - '0');
                ++pos_;
            }
            if (pos_ == start) return {};
            if (pos_ < text_.size() && text_[pos_] == 'L') ++pos_;
            out.push_back(v);
            if (eat(')')) return out;
            if (!eat(',')) return {};
        }
    }
    // Skips a value we do not interpret (a future key): a string, a tuple or a bare word.
    bool skip_value() {
        skip_space();
        if (peek('\'') || peek('"')) return string().has_value();
        if (peek('(')) return int_tuple().has_value();
        const size_t start = pos_;
        while (pos_ < text_.size() && text_[pos_] != ',' && text_[pos_] != '}') ++pos_;
        return pos_ > start;
    }
    bool at_end() {
        skip_space();
        return pos_ == text_.size();
    }

private:
    std::string_view text_;
    size_t pos_ = 0;
};

}  // namespace

size_t npy_dtype_size(NpyDtype dtype) {
    for (const DtypeInfo& info : kDtypes) {
        if (info.dtype == dtype) return info.size;
    }
    return 0;
}

const char* npy_dtype_descr(NpyDtype dtype) {
    for (const DtypeInfo& info : kDtypes) {
        if (info.dtype == dtype) return info.descr;
    }
    return "?";
}

std::string npy_header(NpyDtype dtype, std::span<const int64_t> shape) {
    std::string dict = fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': {}, }}",
                                   npy_dtype_descr(dtype), shape_repr(shape));
    if (!shape.empty()) {
        const size_t digits = std::to_string(shape[0]).size();
        if (digits < kGrowthAxisMaxDigits) dict.append(kGrowthAxisMaxDigits - digits, ' ');
    }
    const size_t text_length = dict.size() + 1;  // + the final '\n'
    for (int major : {1, 2}) {
        const size_t length_field = major == 1 ? 2 : 4;
        const size_t pad =
            kArrayAlign - ((kMagicLength + length_field + text_length) % kArrayAlign);
        const size_t header_length = text_length + pad;
        if (major == 1 && header_length > 0xFFFF) continue;
        std::string out(kMagic);
        out.push_back(static_cast<char>(major));
        out.push_back('\0');
        for (size_t b = 0; b < length_field; ++b) {
            out.push_back(static_cast<char>((header_length >> (8 * b)) & 0xFF));
        }
        out += dict;
        out.append(pad, ' ');
        out.push_back('\n');
        return out;
    }
    LATHE_CHECK(false, "npy header of {} bytes does not fit version 2.0", text_length);
    return {};
}

Status npy_write(const std::string& path, NpyDtype dtype, std::span<const int64_t> shape,
                 const void* bytes, size_t byte_count) {
    int64_t elements = 1;
    for (int64_t d : shape) {
        LATHE_CHECK(d >= 0, "{}: negative dimension {}", path, d);
        elements *= d;
    }
    LATHE_CHECK(static_cast<size_t>(elements) * npy_dtype_size(dtype) == byte_count,
                "{}: shape {} of {} needs {} bytes, got {}", path, shape_repr(shape),
                npy_dtype_descr(dtype), static_cast<size_t>(elements) * npy_dtype_size(dtype),
                byte_count);
    LATHE_ASSIGN_OR_RETURN(AtomicFile file, AtomicFile::create(path));
    LATHE_RETURN_IF_ERROR(file.write(npy_header(dtype, shape)));
    LATHE_RETURN_IF_ERROR(file.write(bytes, byte_count));
    return file.commit();
}

Result<NpyArray> NpyArray::open(const std::string& path) {
    LATHE_ASSIGN_OR_RETURN(MappedFile file, MappedFile::open(path));
    const std::string_view bytes = file.view();
    auto corrupt = [&](std::string_view what) {
        return data_loss_error("{}: not a readable .npy array: {}", path, what);
    };
    if (bytes.size() < kMagicLength + 2 || bytes.substr(0, kMagic.size()) != kMagic) {
        return corrupt("the file does not start with the numpy magic \"\\x93NUMPY\"");
    }
    const int major = static_cast<uint8_t>(bytes[6]);
    if (major < 1 || major > 3) return corrupt(fmt::format("unknown format version {}", major));
    const size_t length_field = major == 1 ? 2 : 4;
    if (bytes.size() < kMagicLength + length_field) return corrupt("truncated header");
    size_t header_length = 0;
    for (size_t b = 0; b < length_field; ++b) {
        header_length |= size_t(static_cast<uint8_t>(bytes[kMagicLength + b])) << (8 * b);
    }
    const size_t data_offset = kMagicLength + length_field + header_length;
    if (data_offset > bytes.size()) {
        return corrupt(fmt::format("header of {} bytes runs past the end of the file ({} bytes)",
                                   header_length, bytes.size()));
    }
    const std::string_view header = bytes.substr(kMagicLength + length_field, header_length);

    HeaderParser p(header);
    std::optional<std::string> descr;
    std::optional<bool> fortran;
    std::optional<std::vector<int64_t>> shape;
    if (!p.eat('{')) return corrupt("the header is not a dict literal");
    while (!p.eat('}')) {
        auto key = p.string();
        if (!key || !p.eat(':')) {
            return corrupt(fmt::format("cannot read the header '{}'", escape_for_message(header)));
        }
        if (*key == "descr") {
            if (p.peek('[')) {
                return corrupt(
                    "structured dtypes are not supported (only plain integer and "
                    "float arrays)");
            }
            descr = p.string();
            if (!descr) return corrupt("'descr' is not a string");
        } else if (*key == "fortran_order") {
            fortran = p.boolean();
            if (!fortran) return corrupt("'fortran_order' is not True or False");
        } else if (*key == "shape") {
            shape = p.int_tuple();
            if (!shape) return corrupt("'shape' is not a tuple of non-negative integers");
        } else if (!p.skip_value()) {
            return corrupt(fmt::format("cannot read the value of '{}'", *key));
        }
        if (!p.eat(',') && !p.peek('}')) {
            return corrupt(fmt::format("cannot read the header '{}'", escape_for_message(header)));
        }
    }
    if (!p.at_end()) return corrupt("text after the header dict");
    if (!descr || !fortran || !shape) {
        return corrupt("the header lacks one of 'descr', 'fortran_order', 'shape'");
    }
    const std::optional<NpyDtype> dtype = dtype_from_descr(*descr);
    if (!dtype) {
        return corrupt(
            fmt::format("dtype '{}' is not supported (little-endian integers and floats "
                        "only)",
                        escape_for_message(*descr)));
    }
    if (*fortran && shape->size() > 1) return corrupt("Fortran-order arrays are not supported");

    NpyArray a;
    a.path_ = path;
    a.dtype_ = *dtype;
    a.shape_ = std::move(*shape);
    const size_t itemsize = npy_dtype_size(*dtype);
    uint64_t elements = 1;
    for (int64_t d : a.shape_) {
        if (d != 0 && elements > UINT64_MAX / uint64_t(d) / itemsize)
            return corrupt("shape overflows");
        elements *= uint64_t(d);
    }
    const uint64_t data_bytes = elements * itemsize;
    if (bytes.size() - data_offset != data_bytes) {
        return corrupt(
            fmt::format("shape {} of '{}' needs {} data bytes but the file has {} after "
                        "its header (truncated or overwritten)",
                        shape_repr(a.shape_), *descr, data_bytes, bytes.size() - data_offset));
    }
    a.size_ = static_cast<int64_t>(elements);
    const uint8_t* data = file.data() + data_offset;
    if (reinterpret_cast<uintptr_t>(data) % itemsize != 0) {
        a.copy_.resize((data_bytes + 7) / 8);
        if (data_bytes > 0) std::memcpy(a.copy_.data(), data, data_bytes);
        a.data_ = a.copy_.data();
    } else {
        a.data_ = data;
        a.file_ = std::move(file);
    }
    return a;
}

}  // namespace lathe
