#include "io/safetensors.h"

#include <dirent.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>

#include "core/check.h"
#include "core/log.h"
#include "core/strings.h"
#include "io/json.h"

namespace lathe {

namespace {

using Json = nlohmann::json;

struct DtypeInfo {
    SafetensorsDtype dtype;
    std::string_view name;
    int bits;
};

// In enum order (checked below): the names and widths of the reference implementation.
constexpr std::array<DtypeInfo, kSafetensorsDtypeCount> kDtypes = {{
    {SafetensorsDtype::kBool, "BOOL", 8},
    {SafetensorsDtype::kF4, "F4", 4},
    {SafetensorsDtype::kF6E2M3, "F6_E2M3", 6},
    {SafetensorsDtype::kF6E3M2, "F6_E3M2", 6},
    {SafetensorsDtype::kU8, "U8", 8},
    {SafetensorsDtype::kI8, "I8", 8},
    {SafetensorsDtype::kF8E5M2, "F8_E5M2", 8},
    {SafetensorsDtype::kF8E4M3, "F8_E4M3", 8},
    {SafetensorsDtype::kF8E8M0, "F8_E8M0", 8},
    {SafetensorsDtype::kF8E4M3Fnuz, "F8_E4M3FNUZ", 8},
    {SafetensorsDtype::kF8E5M2Fnuz, "F8_E5M2FNUZ", 8},
    {SafetensorsDtype::kI16, "I16", 16},
    {SafetensorsDtype::kU16, "U16", 16},
    {SafetensorsDtype::kF16, "F16", 16},
    {SafetensorsDtype::kBF16, "BF16", 16},
    {SafetensorsDtype::kI32, "I32", 32},
    {SafetensorsDtype::kU32, "U32", 32},
    {SafetensorsDtype::kF32, "F32", 32},
    {SafetensorsDtype::kC64, "C64", 64},
    {SafetensorsDtype::kF64, "F64", 64},
    {SafetensorsDtype::kI64, "I64", 64},
    {SafetensorsDtype::kU64, "U64", 64},
}};

constexpr bool dtype_table_in_enum_order() {
    for (int i = 0; i < kSafetensorsDtypeCount; ++i)
        if (static_cast<int>(kDtypes[i].dtype) != i) return false;
    return true;
}
static_assert(dtype_table_in_enum_order(), "kDtypes must list SafetensorsDtype in enum order");

constexpr uint64_t kLengthBytes = 8;  // the little-endian u64 before the header

std::string all_dtype_names() {
    std::string s;
    for (const DtypeInfo& d : kDtypes) s += fmt::format("{}{}", s.empty() ? "" : ", ", d.name);
    return s;
}

// JSON type names for messages.
std::string json_kind(const Json& j) {
    if (j.is_null()) return "null";
    if (j.is_boolean()) return "a boolean";
    if (j.is_number_unsigned()) return fmt::format("the number {}", j.get<uint64_t>());
    if (j.is_number_integer()) return fmt::format("the negative number {}", j.get<int64_t>());
    if (j.is_number_float()) return fmt::format("the non-integer number {}", j.dump());
    if (j.is_string())
        return fmt::format("the string \"{}\"", escape_for_message(j.get<std::string>(), 40));
    if (j.is_array()) return "an array";
    return "an object";
}

// Checked a*b; false on overflow.
bool mul_overflows(uint64_t a, uint64_t b, uint64_t* out) {
    return __builtin_mul_overflow(a, b, out);
}

// Bytes for `numel` elements of `dtype`, or an error message (overflow, or a sub-byte dtype whose
// total is not a whole number of bytes, which the reference rejects as a misaligned slice).
std::optional<std::string> byte_size(SafetensorsDtype dtype, uint64_t numel, uint64_t* bytes) {
    uint64_t bits = 0;
    if (mul_overflows(numel, uint64_t(safetensors_dtype_bits(dtype)), &bits))
        return std::string("the byte size of its shape overflows 64 bits");
    if (bits % 8 != 0)
        return fmt::format("{} elements of {} ({} bits each) are not a whole number of bytes",
                           numel, safetensors_dtype_name(dtype), safetensors_dtype_bits(dtype));
    *bytes = bits / 8;
    return std::nullopt;
}

std::string shape_to_string(std::span<const int64_t> shape) {
    std::string s = "[";
    for (size_t i = 0; i < shape.size(); ++i) s += fmt::format("{}{}", i ? ", " : "", shape[i]);
    return s + "]";
}

// Parses JSON text and reports the first duplicate key of any object (the spec forbids them; a
// plain parse would silently keep the last one).
struct ParsedJson {
    Json value;
    std::string duplicate_key;  // "" when none
};

Result<ParsedJson> parse_json_strict(std::string_view text, const std::string& what) {
    if (json_depth(text) > kJsonMaxDepth)
        return data_loss_error("{} is not valid JSON: {}", what, json_problem(text));
    ParsedJson out;
    std::vector<std::set<std::string>> open_objects;
    auto callback = [&](int /*depth*/, Json::parse_event_t event, Json& parsed) {
        switch (event) {
            case Json::parse_event_t::object_start:
                open_objects.emplace_back();
                break;
            case Json::parse_event_t::object_end:
                if (!open_objects.empty()) open_objects.pop_back();
                break;
            case Json::parse_event_t::key:
                if (!open_objects.empty() && out.duplicate_key.empty() &&
                    !open_objects.back().insert(parsed.get<std::string>()).second)
                    out.duplicate_key = parsed.get<std::string>();
                break;
            default:
                break;
        }
        return true;
    };
    try {
        out.value = Json::parse(text.begin(), text.end(), callback);
    } catch (const Json::exception& e) {
        // nlohmann's message carries the byte position ("at line 1, column 17").
        return data_loss_error("{} is not valid JSON: {}", what, e.what());
    }
    return out;
}

bool is_plain_file_name(std::string_view name) {
    return !name.empty() && name != "." && name != ".." &&
           name.find('/') == std::string_view::npos && name.find('\0') == std::string_view::npos;
}

std::string dir_of(const std::string& path) {
    const size_t slash = path.rfind('/');
    if (slash == std::string::npos) return ".";
    if (slash == 0) return "/";
    return path.substr(0, slash);
}

std::string join_path(const std::string& dir, std::string_view name) {
    if (dir.empty() || dir == ".") return std::string(name);
    if (dir.back() == '/') return dir + std::string(name);
    return dir + "/" + std::string(name);
}

bool is_directory(const std::string& path) {
    DIR* d = ::opendir(path.c_str());
    if (d == nullptr) return false;
    ::closedir(d);
    return true;
}

}  // namespace

// ---- dtypes ----

std::string_view safetensors_dtype_name(SafetensorsDtype t) {
    return kDtypes[static_cast<size_t>(t)].name;
}

int safetensors_dtype_bits(SafetensorsDtype t) {
    return kDtypes[static_cast<size_t>(t)].bits;
}

std::optional<SafetensorsDtype> safetensors_dtype_from_name(std::string_view name) {
    for (const DtypeInfo& d : kDtypes)
        if (d.name == name) return d.dtype;
    return std::nullopt;
}

std::optional<DType> safetensors_dtype_to_dtype(SafetensorsDtype t) {
    switch (t) {
        case SafetensorsDtype::kF32:
            return DType::kF32;
        case SafetensorsDtype::kBF16:
            return DType::kBF16;
        case SafetensorsDtype::kF8E4M3:
            return DType::kE4M3;
        case SafetensorsDtype::kF8E5M2:
            return DType::kE5M2;
        case SafetensorsDtype::kI32:
            return DType::kI32;
        case SafetensorsDtype::kI64:
            return DType::kI64;
        case SafetensorsDtype::kU8:
            return DType::kU8;
        default:
            return std::nullopt;
    }
}

SafetensorsDtype safetensors_dtype_from_dtype(DType t) {
    switch (t) {
        case DType::kF32:
            return SafetensorsDtype::kF32;
        case DType::kBF16:
            return SafetensorsDtype::kBF16;
        case DType::kE4M3:
            return SafetensorsDtype::kF8E4M3;
        case DType::kE5M2:
            return SafetensorsDtype::kF8E5M2;
        case DType::kI32:
            return SafetensorsDtype::kI32;
        case DType::kI64:
            return SafetensorsDtype::kI64;
        case DType::kU8:
            return SafetensorsDtype::kU8;
    }
    LATHE_CHECK(false, "unknown DType {}", static_cast<int>(t));
    return SafetensorsDtype::kU8;
}

// ---- SafetensorsTensor ----

uint64_t SafetensorsTensor::numel() const {
    uint64_t n = 1;
    for (int64_t d : shape) n *= static_cast<uint64_t>(d);  // validated at open: no overflow
    return n;
}

std::string SafetensorsTensor::shape_string() const {
    return shape_to_string(shape);
}

Result<ConstTensorView> SafetensorsTensor::view() const {
    const std::optional<DType> dt = safetensors_dtype_to_dtype(dtype);
    if (!dt)
        return unimplemented_error(
            "tensor '{}': dtype {} has no lathe element type (f32, bf16, e4m3, e5m2, i32, i64, "
            "u8); "
            "read its bytes() and convert",
            name, safetensors_dtype_name(dtype));
    if (shape.size() > size_t(kMaxRank))
        return unimplemented_error("tensor '{}': rank {} exceeds lathe's maximum rank {}", name,
                                   shape.size(), kMaxRank);
    if (reinterpret_cast<uintptr_t>(data) % dtype_size(*dt) != 0)
        return failed_precondition_error(
            "tensor '{}': its data at offset {} is not aligned for {} ({} bytes); the file was not "
            "written in the reference layout: copy bytes() into an aligned buffer instead",
            name, data_begin, safetensors_dtype_name(dtype), dtype_size(*dt));
    Shape s;
    switch (shape.size()) {
        case 0:
            s = Shape{};
            break;
        case 1:
            s = Shape{shape[0]};
            break;
        case 2:
            s = Shape{shape[0], shape[1]};
            break;
        case 3:
            s = Shape{shape[0], shape[1], shape[2]};
            break;
        case 4:
            s = Shape{shape[0], shape[1], shape[2], shape[3]};
            break;
        default:
            s = Shape{shape[0], shape[1], shape[2], shape[3], shape[4]};
            break;
    }
    return ConstTensorView(data, *dt, s, Device::kCpu);
}

// ---- SafetensorsFile ----

Result<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
    SafetensorsFile f;
    LATHE_ASSIGN_OR_RETURN(f.map_, MappedFile::open(path));
    const uint64_t size = f.map_.size();
    const uint8_t* base = f.map_.data();
    auto corrupt = [&](std::string msg) {
        return Status(StatusCode::kDataLoss, fmt::format("{}: {}", path, msg));
    };

    // 1. The header length.
    if (size < kLengthBytes)
        return corrupt(fmt::format(
            "the file is {} bytes, too short for the 8-byte header length: truncated, or not a "
            "safetensors file",
            size));
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | base[i];  // little-endian, whatever the host
    if (n > kSafetensorsMaxHeaderBytes)
        return corrupt(fmt::format(
            "header length {} exceeds the limit of {} bytes: not a safetensors file, or its first "
            "8 bytes are corrupt",
            n, kSafetensorsMaxHeaderBytes));
    if (n > size - kLengthBytes)
        return corrupt(fmt::format(
            "header length {} runs past the end of the file ({} bytes, so at most {} header "
            "bytes): the file is truncated",
            n, size, size - kLengthBytes));
    f.header_size_ = n;
    const std::string_view header(reinterpret_cast<const char*>(base + kLengthBytes), n);
    const uint64_t data_size = size - kLengthBytes - n;

    // 2. The header JSON.
    if (header.empty() || header[0] != '{')
        return corrupt(fmt::format(
            "the header does not begin with '{{' (it begins with \"{}\"): corrupt, or not a "
            "safetensors file",
            escape_for_message(header.substr(0, 16), 16)));
    LATHE_ASSIGN_OR_RETURN(ParsedJson parsed, parse_json_strict(header, path + ": the header"));
    if (!parsed.duplicate_key.empty())
        return corrupt(
            fmt::format("the header has the key \"{}\" twice; safetensors forbids "
                        "duplicate keys",
                        escape_for_message(parsed.duplicate_key)));
    const Json& root = parsed.value;
    if (!root.is_object())
        return corrupt(fmt::format("the header is {}, not a JSON object", json_kind(root)));

    // 3. Each entry.
    f.tensors_.reserve(root.size());
    for (auto it = root.begin(); it != root.end(); ++it) {
        const std::string& key = it.key();
        const Json& v = it.value();
        if (key == "__metadata__") {
            if (v.is_null()) continue;  // the reference reads null as "no metadata"
            if (!v.is_object())
                return corrupt(
                    fmt::format("\"__metadata__\" is {}; it must be an object of "
                                "strings",
                                json_kind(v)));
            f.has_metadata_ = true;
            for (auto m = v.begin(); m != v.end(); ++m) {
                if (!m.value().is_string())
                    return corrupt(fmt::format(
                        "\"__metadata__\" key \"{}\" holds {}; safetensors metadata values must "
                        "be strings",
                        escape_for_message(m.key()), json_kind(m.value())));
                f.metadata_[m.key()] = m.value().get<std::string>();
            }
            continue;
        }
        const std::string tname = escape_for_message(key);
        auto bad = [&](std::string msg) {
            return corrupt(fmt::format("tensor '{}': {}", tname, msg));
        };
        if (!v.is_object()) return bad(fmt::format("its entry is {}, not an object", json_kind(v)));
        for (const char* field : {"dtype", "shape", "data_offsets"})
            if (!v.contains(field)) return bad(fmt::format("its entry has no \"{}\"", field));
        SafetensorsTensor t;
        t.name = key;
        const Json& jd = v["dtype"];
        if (!jd.is_string())
            return bad(fmt::format("\"dtype\" is {}, not a string", json_kind(jd)));
        const std::optional<SafetensorsDtype> dt =
            safetensors_dtype_from_name(jd.get<std::string>());
        if (!dt)
            return bad(fmt::format("unknown dtype \"{}\" (safetensors defines {})",
                                   escape_for_message(jd.get<std::string>()), all_dtype_names()));
        t.dtype = *dt;
        const Json& js = v["shape"];
        if (!js.is_array()) return bad(fmt::format("\"shape\" is {}, not an array", json_kind(js)));
        uint64_t numel = 1;
        for (const Json& d : js) {
            if (!d.is_number_unsigned() || d.get<uint64_t>() > uint64_t(INT64_MAX))
                return bad(
                    fmt::format("\"shape\" holds {}; dimensions are integers >= 0", json_kind(d)));
            const uint64_t dim = d.get<uint64_t>();
            if (mul_overflows(numel, dim, &numel))
                return bad("the element count of its shape overflows 64 bits");
            t.shape.push_back(static_cast<int64_t>(dim));
        }
        const Json& jo = v["data_offsets"];
        if (!jo.is_array() || jo.size() != 2 || !jo[0].is_number_unsigned() ||
            !jo[1].is_number_unsigned())
            return bad(
                fmt::format("\"data_offsets\" is {}; it must be [BEGIN, END], two "
                            "integers >= 0",
                            jo.is_array() ? jo.dump() : json_kind(jo)));
        t.data_begin = jo[0].get<uint64_t>();
        t.data_end = jo[1].get<uint64_t>();
        if (t.data_end < t.data_begin)
            return bad(fmt::format("data_offsets [{}, {}] end before they begin", t.data_begin,
                                   t.data_end));
        uint64_t expected = 0;
        if (auto err = byte_size(t.dtype, numel, &expected)) return bad(*err);
        if (t.nbytes() != expected)
            return bad(fmt::format(
                "data_offsets [{}, {}] hold {} bytes, but dtype {} and shape {} need {} bytes",
                t.data_begin, t.data_end, t.nbytes(), safetensors_dtype_name(t.dtype),
                t.shape_string(), expected));
        if (t.data_end > data_size)
            return bad(fmt::format(
                "data_offsets [{}, {}] run past the end of the data region ({} bytes): the file "
                "is truncated",
                t.data_begin, t.data_end, data_size));
        f.tensors_.push_back(std::move(t));
    }

    // 4. The offsets tile the data region: sorted, contiguous from 0 to its end.
    std::sort(f.tensors_.begin(), f.tensors_.end(), [](const auto& a, const auto& b) {
        return std::tie(a.data_begin, a.data_end, a.name) <
               std::tie(b.data_begin, b.data_end, b.name);
    });
    uint64_t covered = 0;
    const SafetensorsTensor* prev = nullptr;
    for (const SafetensorsTensor& t : f.tensors_) {
        if (t.data_begin < covered)
            return corrupt(
                fmt::format("tensor '{}' at data_offsets [{}, {}] overlaps tensor '{}' at [{}, {}]",
                            escape_for_message(t.name), t.data_begin, t.data_end,
                            escape_for_message(prev->name), prev->data_begin, prev->data_end));
        if (t.data_begin > covered)
            return corrupt(fmt::format(
                "bytes [{}, {}) of the data region belong to no tensor (before tensor '{}'); "
                "safetensors requires the tensors to cover the data region with no holes",
                covered, t.data_begin, escape_for_message(t.name)));
        covered = t.data_end;
        prev = &t;
    }
    if (covered != data_size)
        return corrupt(fmt::format(
            "the tensors cover {} bytes, but the data region holds {} bytes: {} trailing bytes "
            "belong to no tensor",
            covered, data_size, data_size - covered));

    const uint8_t* data_region = base + kLengthBytes + n;
    f.by_name_.reserve(f.tensors_.size());
    for (size_t i = 0; i < f.tensors_.size(); ++i) {
        f.tensors_[i].data = data_region + f.tensors_[i].data_begin;
        f.by_name_.emplace(f.tensors_[i].name, i);
    }
    return f;
}

const SafetensorsTensor* SafetensorsFile::find(std::string_view name) const {
    const auto it = by_name_.find(std::string(name));
    return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

Result<const SafetensorsTensor*> SafetensorsFile::get(std::string_view name) const {
    if (const SafetensorsTensor* t = find(name)) return t;
    std::vector<std::string> names;
    names.reserve(tensors_.size());
    for (const auto& t : tensors_) names.push_back(t.name);
    return not_found_error("{}: no tensor '{}'{}", path(), escape_for_message(name),
                           did_you_mean(name, names));
}

// ---- writing ----

namespace {

// Readers of element i of a source dtype (unaligned bytes) and writers of an output dtype: one
// type per dtype, so that convert_loop's loop carries no dtype test.
struct ReadF32 {
    float operator()(const uint8_t* in, uint64_t i) const {
        float v;
        std::memcpy(&v, in + 4 * i, 4);
        return v;
    }
};
struct ReadBF16 {
    float operator()(const uint8_t* in, uint64_t i) const {
        uint16_t bits;
        std::memcpy(&bits, in + 2 * i, 2);
        return bf16_to_float(bf16{bits});
    }
};
struct ReadF16 {
    float operator()(const uint8_t* in, uint64_t i) const {
        uint16_t bits;
        std::memcpy(&bits, in + 2 * i, 2);
        return f16_to_float(bits);
    }
};
struct WriteF32 {
    void operator()(uint8_t* out, uint64_t i, float v) const { std::memcpy(out + 4 * i, &v, 4); }
};
struct WriteBF16 {
    void operator()(uint8_t* out, uint64_t i, float v) const {
        const uint16_t bits = float_to_bf16(v).bits;
        std::memcpy(out + 2 * i, &bits, 2);
    }
};
struct WriteF16 {
    void operator()(uint8_t* out, uint64_t i, float v) const {
        const uint16_t bits = float_to_f16(v);
        std::memcpy(out + 2 * i, &bits, 2);
    }
};

template <typename Read, typename Write>
void convert_loop(const uint8_t* in, uint64_t n, uint8_t* out) {
    const Read read;
    const Write write;
    for (uint64_t i = 0; i < n; ++i) write(out, i, read(in, i));
}

// The loop for source dtype `Read` into `to` (a float weight dtype, checked).
template <typename Read>
void convert_to(const uint8_t* in, uint64_t n, SafetensorsDtype to, uint8_t* out) {
    switch (to) {
        case SafetensorsDtype::kF32:
            return convert_loop<Read, WriteF32>(in, n, out);
        case SafetensorsDtype::kBF16:
            return convert_loop<Read, WriteBF16>(in, n, out);
        case SafetensorsDtype::kF16:
            return convert_loop<Read, WriteF16>(in, n, out);
        default:
            LATHE_CHECK(false, "convert to {} is not a weight dtype", safetensors_dtype_name(to));
    }
}

}  // namespace

bool safetensors_convert_elements(const SafetensorsTensor& src, uint64_t begin, uint64_t n,
                                  SafetensorsDtype to, void* dst) {
    if (src.dtype != SafetensorsDtype::kF32 && src.dtype != SafetensorsDtype::kBF16 &&
        src.dtype != SafetensorsDtype::kF16)
        return false;
    const int in_size = safetensors_dtype_bits(src.dtype) / 8;
    const uint8_t* in = src.data + begin * uint64_t(in_size);
    uint8_t* out = static_cast<uint8_t*>(dst);
    if (src.dtype == to) {
        std::memcpy(out, in, n * uint64_t(in_size));
        return true;
    }
    switch (src.dtype) {
        case SafetensorsDtype::kF32:
            convert_to<ReadF32>(in, n, to, out);
            break;
        case SafetensorsDtype::kBF16:
            convert_to<ReadBF16>(in, n, to, out);
            break;
        default:  // kF16
            convert_to<ReadF16>(in, n, to, out);
            break;
    }
    return true;
}

SafetensorsWriteTensor safetensors_write_tensor(std::string name, ConstTensorView view) {
    LATHE_CHECK(view.device() == Device::kCpu, "tensor '{}' is {}; copy it to the host first", name,
                view.to_string());
    SafetensorsWriteTensor t;
    t.name = std::move(name);
    t.dtype = safetensors_dtype_from_dtype(view.dtype());
    for (int i = 0; i < view.rank(); ++i) t.shape.push_back(view.dim(i));
    t.data = view.data();
    t.nbytes = view.bytes();
    return t;
}

std::map<std::string, std::string> safetensors_default_metadata() {
    return {{"format", "pt"}};
}

namespace {

// JSON string literal (quotes included), escaped as serde_json escapes: '"', '\\', and control
// characters (\b \t \n \f \r, else \u00xx); everything else, non-ASCII included, as is.
Result<std::string> json_quote(const std::string& s, std::string_view what) {
    try {
        return Json(s).dump(-1, ' ', false, Json::error_handler_t::strict);
    } catch (const Json::exception&) {
        return invalid_argument_error("{} \"{}\" is not valid UTF-8", what, escape_for_message(s));
    }
}

struct PreparedFile {
    std::string header;  // padded, without the 8 length bytes
    std::vector<const SafetensorsWriteTensor*> order;
    uint64_t data_bytes = 0;
};

// The reference prepare(): validate, sort (dtype descending, then name), lay out offsets, build
// the header and pad it to a multiple of 8 with spaces.
Result<PreparedFile> prepare_file(std::span<const SafetensorsWriteTensor> tensors,
                                  const std::map<std::string, std::string>& metadata) {
    PreparedFile p;
    std::set<std::string_view> seen;
    for (const SafetensorsWriteTensor& t : tensors) {
        const std::string tname = escape_for_message(t.name);
        if (t.name == "__metadata__")
            return invalid_argument_error(
                "tensor name \"__metadata__\" is reserved by safetensors");
        if (!seen.insert(t.name).second)
            return invalid_argument_error("tensor '{}' is given twice", tname);
        uint64_t numel = 1;
        for (int64_t d : t.shape) {
            if (d < 0)
                return invalid_argument_error("tensor '{}': shape {} has a negative dimension",
                                              tname, shape_to_string(t.shape));
            if (mul_overflows(numel, uint64_t(d), &numel))
                return invalid_argument_error("tensor '{}': shape {} overflows", tname,
                                              shape_to_string(t.shape));
        }
        uint64_t expected = 0;
        if (auto err = byte_size(t.dtype, numel, &expected))
            return invalid_argument_error("tensor '{}': {}", tname, *err);
        if (t.nbytes != expected)
            return invalid_argument_error(
                "tensor '{}': {} bytes given, but dtype {} and shape {} need {} bytes", tname,
                t.nbytes, safetensors_dtype_name(t.dtype), shape_to_string(t.shape), expected);
        if (t.data == nullptr && t.nbytes > 0)
            return invalid_argument_error("tensor '{}': null data for {} bytes", tname, t.nbytes);
        p.order.push_back(&t);
    }
    std::sort(p.order.begin(), p.order.end(), [](const auto* a, const auto* b) {
        if (a->dtype != b->dtype) return a->dtype > b->dtype;
        return a->name < b->name;  // byte-wise, as Rust's str ordering
    });

    std::string& h = p.header;
    h = "{";
    if (!metadata.empty()) {
        h += "\"__metadata__\":{";
        bool first = true;
        for (const auto& [k, v] : metadata) {
            LATHE_ASSIGN_OR_RETURN(std::string qk, json_quote(k, "metadata key"));
            LATHE_ASSIGN_OR_RETURN(std::string qv, json_quote(v, "metadata value"));
            h += fmt::format("{}{}:{}", first ? "" : ",", qk, qv);
            first = false;
        }
        h += "}";
    }
    uint64_t offset = 0;
    for (const SafetensorsWriteTensor* t : p.order) {
        LATHE_ASSIGN_OR_RETURN(std::string qn, json_quote(t->name, "tensor name"));
        std::string shape = "[";
        for (size_t i = 0; i < t->shape.size(); ++i)
            shape += fmt::format("{}{}", i ? "," : "", t->shape[i]);
        shape += "]";
        h += fmt::format("{}{}:{{\"dtype\":\"{}\",\"shape\":{},\"data_offsets\":[{},{}]}}",
                         h.size() > 1 ? "," : "", qn, safetensors_dtype_name(t->dtype), shape,
                         offset, offset + t->nbytes);
        offset += t->nbytes;
    }
    h += "}";
    h.resize((h.size() + 7) / 8 * 8, ' ');
    if (h.size() > kSafetensorsMaxHeaderBytes)
        return invalid_argument_error(
            "the header would be {} bytes, over the safetensors limit of {}: split the tensors "
            "into more shards",
            h.size(), kSafetensorsMaxHeaderBytes);
    p.data_bytes = offset;
    return p;
}

}  // namespace

Status safetensors_write_file(const std::string& path,
                              std::span<const SafetensorsWriteTensor> tensors,
                              const std::map<std::string, std::string>& metadata) {
    Result<PreparedFile> prepared = prepare_file(tensors, metadata);
    if (!prepared.ok()) return prepared.status().with_context(path);
    const PreparedFile& p = *prepared;
    LATHE_ASSIGN_OR_RETURN(AtomicFile out, AtomicFile::create(path));
    uint8_t len[kLengthBytes];
    const uint64_t n = p.header.size();
    for (size_t i = 0; i < kLengthBytes; ++i) len[i] = uint8_t(n >> (8 * i));
    LATHE_RETURN_IF_ERROR(out.write(len, sizeof(len)));
    LATHE_RETURN_IF_ERROR(out.write(p.header));
    for (const SafetensorsWriteTensor* t : p.order)
        LATHE_RETURN_IF_ERROR(out.write(t->data, t->nbytes));
    LATHE_CHECK(out.bytes_written() == kLengthBytes + n + p.data_bytes,
                "{}: wrote {} bytes, laid out {}", path, out.bytes_written(),
                kLengthBytes + n + p.data_bytes);
    return out.commit();
}

namespace {

// "model-00002-of-00005.safetensors"
std::string shard_file_name(size_t index, size_t count) {
    return fmt::format("model-{:05d}-of-{:05d}.safetensors", index + 1, count);
}

// Whether `name` is a weight file that a save of this kind produces (so a later save may remove
// it).
bool is_weight_file_name(std::string_view name) {
    if (name == kSafetensorsSingleFileName || name == kSafetensorsIndexFileName) return true;
    // model-DDDDD-of-DDDDD.safetensors
    constexpr std::string_view kPrefix = "model-", kMid = "-of-", kSuffix = ".safetensors";
    if (name.size() != kPrefix.size() + 5 + kMid.size() + 5 + kSuffix.size()) return false;
    if (!starts_with(name, kPrefix) || !ends_with(name, kSuffix)) return false;
    const std::string_view a = name.substr(kPrefix.size(), 5);
    const std::string_view mid = name.substr(kPrefix.size() + 5, kMid.size());
    const std::string_view b = name.substr(kPrefix.size() + 5 + kMid.size(), 5);
    auto digits = [](std::string_view s) {
        return std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
    };
    return mid == kMid && digits(a) && digits(b);
}

}  // namespace

Result<SafetensorsCheckpointWriteResult> safetensors_write_checkpoint(
    const std::string& dir, std::span<const SafetensorsWriteTensor> tensors,
    const SafetensorsCheckpointWriteOptions& options) {
    if (!is_directory(dir))
        return not_found_error("{}: no such directory to write the checkpoint into", dir);
    // Validate names and sizes once for the whole set (duplicates across shards included).
    {
        Result<PreparedFile> all = prepare_file(tensors, {});
        if (!all.ok()) return all.status().with_context(dir);
    }

    // huggingface_hub's split: walk in order; a tensor over the limit gets its own shard at once;
    // otherwise close the current shard when this tensor would tip it over the limit.
    std::vector<std::vector<const SafetensorsWriteTensor*>> shards;
    std::vector<const SafetensorsWriteTensor*> current;
    uint64_t current_bytes = 0, total = 0;
    const uint64_t limit = options.max_shard_bytes;
    for (const SafetensorsWriteTensor& t : tensors) {
        total += t.nbytes;
        if (limit > 0 && t.nbytes > limit) {
            shards.push_back({&t});
            continue;
        }
        if (limit > 0 && current_bytes + t.nbytes > limit && !current.empty()) {
            shards.push_back(std::move(current));
            current.clear();
            current_bytes = 0;
        }
        current.push_back(&t);
        current_bytes += t.nbytes;
    }
    if (!current.empty() || shards.empty()) shards.push_back(std::move(current));

    SafetensorsCheckpointWriteResult result;
    result.total_size = total;
    Json weight_map = Json::object();
    for (size_t s = 0; s < shards.size(); ++s) {
        const std::string name = shards.size() == 1 ? std::string(kSafetensorsSingleFileName)
                                                    : shard_file_name(s, shards.size());
        std::vector<SafetensorsWriteTensor> shard;
        shard.reserve(shards[s].size());
        for (const SafetensorsWriteTensor* t : shards[s]) {
            shard.push_back(*t);  // name, shape and a pointer: the data is not copied
            weight_map[t->name] = name;
        }
        LATHE_RETURN_IF_ERROR(
            safetensors_write_file(join_path(dir, name), shard, options.metadata));
        result.files.push_back(name);
    }
    if (shards.size() > 1) {
        // A stale single file would win over the new index (transformers looks for it first), so
        // it goes before the index appears: a crash in between leaves no index rather than a
        // loadable stale model.
        const std::string single = join_path(dir, kSafetensorsSingleFileName);
        if (file_exists(single) && ::unlink(single.c_str()) != 0)
            return io_error("{}: cannot remove the stale weight file: {}", single,
                            std::strerror(errno));
        Json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
        // json.dumps(index, indent=2, sort_keys=True) + "\n", as transformers writes it.
        const std::string text = index.dump(2, ' ', true) + "\n";
        LATHE_RETURN_IF_ERROR(file_write_atomic(join_path(dir, kSafetensorsIndexFileName), text));
        result.index_file = std::string(kSafetensorsIndexFileName);
    }

    // Remove weight files of an earlier save that this one did not produce.
    std::set<std::string> keep(result.files.begin(), result.files.end());
    if (!result.index_file.empty()) keep.insert(result.index_file);
    DIR* d = ::opendir(dir.c_str());
    if (d == nullptr) return io_error("{}: cannot list: {}", dir, std::strerror(errno));
    std::vector<std::string> stale;
    while (const dirent* e = ::readdir(d)) {
        const std::string name = e->d_name;
        if (is_weight_file_name(name) && !keep.count(name)) stale.push_back(name);
    }
    ::closedir(d);
    for (const std::string& name : stale) {
        const std::string p = join_path(dir, name);
        if (::unlink(p.c_str()) != 0)
            return io_error("{}: cannot remove the stale weight file: {}", p, std::strerror(errno));
        log_info("removed stale weight file {}", p);
    }
    return result;
}

// ---- SafetensorsCheckpoint ----

Result<SafetensorsCheckpoint> SafetensorsCheckpoint::open(const std::string& path) {
    SafetensorsCheckpoint ck;
    ck.source_ = path;
    std::string file = path;
    if (is_directory(path)) {
        const std::string single = join_path(path, kSafetensorsSingleFileName);
        const std::string index = join_path(path, kSafetensorsIndexFileName);
        if (file_exists(single))
            file = single;
        else if (file_exists(index))
            file = index;
        else
            return not_found_error("{}: no {} and no {}: not a safetensors checkpoint directory",
                                   path, kSafetensorsSingleFileName, kSafetensorsIndexFileName);
    }

    if (!ends_with(file, ".json")) {
        // One file: open it now (there is nothing to be lazy about).
        LATHE_ASSIGN_OR_RETURN(SafetensorsFile f, SafetensorsFile::open(file));
        Shard shard;
        shard.path = file;
        for (const SafetensorsTensor& t : f.tensors()) {
            shard.expected.push_back(t.name);
            ck.shard_of_.emplace(t.name, 0);
            ck.names_.push_back(t.name);
        }
        shard.file = std::make_unique<SafetensorsFile>(std::move(f));
        ck.shards_.push_back(std::move(shard));
        std::sort(ck.names_.begin(), ck.names_.end());
        return ck;
    }

    ck.index_path_ = file;
    LATHE_ASSIGN_OR_RETURN(std::string text, file_read_all(file));
    Result<ParsedJson> parsed = parse_json_strict(text, file);
    if (!parsed.ok()) return parsed.status();
    auto bad = [&](std::string msg) {
        return Status(StatusCode::kDataLoss, fmt::format("{}: {}", file, msg));
    };
    if (!parsed->duplicate_key.empty())
        return bad(
            fmt::format("the key \"{}\" appears twice", escape_for_message(parsed->duplicate_key)));
    const Json& root = parsed->value;
    if (!root.is_object())
        return bad(fmt::format("the index is {}, not a JSON object", json_kind(root)));
    if (!root.contains("weight_map"))
        return bad("no \"weight_map\": not a safetensors index (model.safetensors.index.json)");
    const Json& wm = root["weight_map"];
    if (!wm.is_object())
        return bad(fmt::format("\"weight_map\" is {}, not an object", json_kind(wm)));
    if (root.contains("metadata")) {
        const Json& md = root["metadata"];
        if (!md.is_null() && !md.is_object())
            return bad(fmt::format("\"metadata\" is {}, not an object", json_kind(md)));
        if (md.is_object() && md.contains("total_size")) {
            const Json& ts = md["total_size"];
            // Some writers store it as a float (e.g. 1.2e10); accept any exact non-negative
            // integer.
            if (ts.is_number_unsigned())
                ck.index_total_size_ = ts.get<uint64_t>();
            else if (ts.is_number_float() && ts.get<double>() >= 0 &&
                     ts.get<double>() == double(uint64_t(ts.get<double>())))
                ck.index_total_size_ = uint64_t(ts.get<double>());
            else
                return bad(fmt::format("\"metadata.total_size\" is {}; it must be a byte count",
                                       json_kind(ts)));
        }
    }
    const std::string dir = dir_of(file);
    std::map<std::string, size_t> shard_by_file;
    for (auto it = wm.begin(); it != wm.end(); ++it) {
        if (!it.value().is_string())
            return bad(fmt::format("\"weight_map\" entry for tensor '{}' is {}, not a file name",
                                   escape_for_message(it.key()), json_kind(it.value())));
        const std::string shard_name = it.value().get<std::string>();
        if (!is_plain_file_name(shard_name))
            return bad(
                fmt::format("\"weight_map\" sends tensor '{}' to \"{}\", which is not a "
                            "plain file name in the index's directory",
                            escape_for_message(it.key()), escape_for_message(shard_name)));
        shard_by_file.emplace(shard_name, 0);
    }
    if (shard_by_file.empty()) return bad("\"weight_map\" is empty: the index lists no tensors");
    for (auto& [name, idx] : shard_by_file) {
        idx = ck.shards_.size();
        Shard s;
        s.path = join_path(dir, name);
        if (!file_exists(s.path))
            return not_found_error("{}: shard {} is listed in the index but does not exist", file,
                                   s.path);
        ck.shards_.push_back(std::move(s));
    }
    for (auto it = wm.begin(); it != wm.end(); ++it) {
        const size_t idx = shard_by_file.at(it.value().get<std::string>());
        ck.shards_[idx].expected.push_back(it.key());
        ck.shard_of_.emplace(it.key(), idx);
        ck.names_.push_back(it.key());
    }
    std::sort(ck.names_.begin(), ck.names_.end());
    return ck;
}

bool SafetensorsCheckpoint::contains(std::string_view name) const {
    return shard_of_.count(std::string(name)) > 0;
}

Result<const SafetensorsFile*> SafetensorsCheckpoint::open_shard(size_t idx) const {
    std::lock_guard<std::mutex> lock(*mu_);
    Shard& s = shards_[idx];
    if (s.file) return static_cast<const SafetensorsFile*>(s.file.get());
    LATHE_ASSIGN_OR_RETURN(SafetensorsFile f, SafetensorsFile::open(s.path));
    for (const std::string& name : s.expected) {
        if (f.find(name) == nullptr)
            return data_loss_error("{}: the index puts tensor '{}' in {}, which does not hold it",
                                   index_path_, escape_for_message(name), s.path);
    }
    if (f.tensors().size() > s.expected.size()) {
        size_t extra = 0;
        std::string first;
        for (const SafetensorsTensor& t : f.tensors()) {
            const auto it = shard_of_.find(t.name);
            if (it == shard_of_.end() || it->second != idx) {
                if (extra++ == 0) first = t.name;
            }
        }
        if (extra > 0)
            log_warning(
                "{}: {} tensor(s) in this shard are not assigned to it by {} (first: '{}'); "
                "they are ignored, as the index decides",
                s.path, extra, index_path_, escape_for_message(first));
    }
    s.file = std::make_unique<SafetensorsFile>(std::move(f));
    return static_cast<const SafetensorsFile*>(s.file.get());
}

Result<const SafetensorsTensor*> SafetensorsCheckpoint::tensor(std::string_view name) const {
    const auto it = shard_of_.find(std::string(name));
    if (it == shard_of_.end())
        return not_found_error("{}: no tensor '{}'{}", source_, escape_for_message(name),
                               did_you_mean(name, names_));
    LATHE_ASSIGN_OR_RETURN(const SafetensorsFile* f, open_shard(it->second));
    const SafetensorsTensor* t = f->find(name);
    LATHE_CHECK(t != nullptr, "tensor {} vanished from {}", name, f->path());
    return t;
}

Status SafetensorsCheckpoint::open_all() const {
    uint64_t bytes = 0;
    for (size_t i = 0; i < shards_.size(); ++i) {
        LATHE_ASSIGN_OR_RETURN(const SafetensorsFile* f, open_shard(i));
        for (const std::string& name : shards_[i].expected) bytes += f->find(name)->nbytes();
    }
    if (index_total_size_ && *index_total_size_ != bytes)
        log_warning("{}: metadata.total_size is {} but the indexed tensors hold {} bytes",
                    index_path_, *index_total_size_, bytes);
    return ok_status();
}

std::vector<std::string> SafetensorsCheckpoint::shard_paths() const {
    std::vector<std::string> out;
    for (const Shard& s : shards_) out.push_back(s.path);
    return out;
}

Result<std::map<std::string, std::string>> SafetensorsCheckpoint::metadata() const {
    if (shards_.empty()) return not_found_error("{}: no shards", source_);
    LATHE_ASSIGN_OR_RETURN(const SafetensorsFile* f, open_shard(0));
    return f->metadata();
}

}  // namespace lathe
