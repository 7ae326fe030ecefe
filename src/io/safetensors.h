#pragma once
// safetensors: a memory-mapped, zero-copy reader and a streaming writer, for single files and for
// Hugging Face sharded checkpoints (model-00001-of-00003.safetensors +
// model.safetensors.index.json).
//
// The format (docs/formats/safetensors.md has the full text):
//   8 bytes      N, the header length, unsigned little-endian 64-bit
//   N bytes      the header: UTF-8 JSON object, starting with '{', padded with spaces (0x20).
//                {"__metadata__": {"k": "v", ...},            optional, string -> string only
//                 "name": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [BEGIN, END]}, ...}
//   the rest     the data region: tensors in C order, little-endian, at [BEGIN, END) relative to
//                the start of the region.
// The reader validates what the reference implementation (huggingface/safetensors, Rust) validates,
// and a little more where the spec says MUST (the leading '{', no duplicate keys): the header
// length (at most 100,000,000 bytes, inside the file), the JSON, each dtype name, each shape and
// its byte size (product(shape) * dtype bits / 8, no overflow), and the data_offsets, which must
// tile the data region exactly: sorted by offset they start at 0, each begins where the previous
// one ends, and the last one ends at the end of the file (no holes, no overlap, no trailing bytes).
// Every error names the file, the tensor where there is one, and the problem.
//
// The writer lays out a file byte for byte as the reference serialize_file does for the same
// tensors and metadata: tensors sorted by dtype (largest alignment first, in the reference enum's
// order), then by name; compact JSON header; header padded with spaces to a multiple of 8 bytes.

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "core/tensor.h"
#include "io/file.h"

namespace lathe {

// Every element type safetensors defines, in the order of the reference implementation's `Dtype`
// enum (which it documents as increasing alignment). The writer sorts tensors by this order,
// descending, so that each tensor's data starts at an offset aligned for its element type.
enum class SafetensorsDtype : uint8_t {
    kBool,
    kF4,      // OCP MX fp4 (E2M1), 4 bits, two per byte
    kF6E2M3,  // OCP MX fp6, 6 bits
    kF6E3M2,  // OCP MX fp6, 6 bits
    kU8,
    kI8,
    kF8E5M2,
    kF8E4M3,  // the "fn" variant (no infinities), as torch.float8_e4m3fn
    kF8E8M0,  // OCP MX scale
    kF8E4M3Fnuz,
    kF8E5M2Fnuz,
    kI16,
    kU16,
    kF16,
    kBF16,
    kI32,
    kU32,
    kF32,
    kC64,  // complex, two F32
    kF64,
    kI64,
    kU64,
};
inline constexpr int kSafetensorsDtypeCount = 22;

// The name used in headers: "BOOL", "F4", ..., "BF16", "F8_E4M3", "U64".
std::string_view safetensors_dtype_name(SafetensorsDtype t);
// Bits per element (4, 6, 8, 16, 32 or 64).
int safetensors_dtype_bits(SafetensorsDtype t);
// The dtype with this header name (exact, case-sensitive), or nullopt.
std::optional<SafetensorsDtype> safetensors_dtype_from_name(std::string_view name);
// The lathe element type with the same bits, or nullopt when lathe has none (F16, I8, ...).
std::optional<DType> safetensors_dtype_to_dtype(SafetensorsDtype t);
// The safetensors dtype of a lathe element type (every DType has one).
SafetensorsDtype safetensors_dtype_from_dtype(DType t);

// Limits the reference implementation enforces; lathe enforces the same.
inline constexpr uint64_t kSafetensorsMaxHeaderBytes = 100'000'000;

// One tensor of an open file. `data` points into the file's read-only map (zero-copy) and stays
// valid as long as the SafetensorsFile that handed it out.
struct SafetensorsTensor {
    std::string name;
    SafetensorsDtype dtype = SafetensorsDtype::kF32;
    std::vector<int64_t> shape;
    uint64_t data_begin = 0;  // data_offsets, relative to the start of the data region
    uint64_t data_end = 0;
    const uint8_t* data = nullptr;

    uint64_t nbytes() const { return data_end - data_begin; }
    // Product of the shape (1 for a scalar, shape []).
    uint64_t numel() const;
    std::span<const uint8_t> bytes() const { return {data, static_cast<size_t>(nbytes())}; }
    // "[2, 3]"
    std::string shape_string() const;
    // A typed view of the bytes, with no copy. Fails (kUnimplemented / kFailedPrecondition, naming
    // the tensor) when the dtype has no lathe DType, the rank exceeds kMaxRank, or the data is not
    // aligned for its element type (possible in files not written by the reference layout); read
    // bytes() then.
    Result<ConstTensorView> view() const;
};

// A safetensors file opened read-only through a memory map and validated as a whole at open().
// Move-only (it owns the map). Tensor data is read lazily by the OS as it is touched.
class SafetensorsFile {
public:
    // Maps and validates `path`. Errors: kNotFound / kIoError from the OS; kDataLoss for a file
    // that is truncated or corrupt (the message names the file, the tensor and the rule broken).
    static Result<SafetensorsFile> open(const std::string& path);

    const std::string& path() const { return map_.path(); }
    uint64_t file_size() const { return map_.size(); }
    // N, the header length as stored (padding included).
    uint64_t header_size() const { return header_size_; }
    // Bytes of the data region: file_size() - 8 - header_size().
    uint64_t data_size() const { return file_size() - 8 - header_size_; }

    // Every tensor, in the order of its data in the file.
    const std::vector<SafetensorsTensor>& tensors() const { return tensors_; }
    // The tensor called `name`, or nullptr.
    const SafetensorsTensor* find(std::string_view name) const;
    // The tensor called `name`, or a kNotFound error naming the file and the closest name.
    Result<const SafetensorsTensor*> get(std::string_view name) const;
    // The "__metadata__" map (empty when the header has none).
    const std::map<std::string, std::string>& metadata() const { return metadata_; }
    bool has_metadata() const { return has_metadata_; }

private:
    MappedFile map_;
    uint64_t header_size_ = 0;
    std::vector<SafetensorsTensor> tensors_;
    std::unordered_map<std::string, size_t> by_name_;
    std::map<std::string, std::string> metadata_;
    bool has_metadata_ = false;
};

// A tensor to write: its bytes are read from `data` while the file is written, never copied into
// one buffer with the rest of the model. `nbytes` must equal numel(shape) * bits / 8.
struct SafetensorsWriteTensor {
    std::string name;
    SafetensorsDtype dtype = SafetensorsDtype::kF32;
    std::vector<int64_t> shape;
    const void* data = nullptr;
    uint64_t nbytes = 0;
};

// Converts elements [begin, begin + n) of `src` into `dst`, n elements of `to`: the float weight
// dtypes F32, BF16 and F16 in any pairing, with core/dtype.h's conversions. Narrowing rounds to
// nearest even (float_to_bf16, float_to_f16); the same dtype copies the bytes, so every bit (NaN
// payloads included) survives.
// Returns false, writing nothing, when `src` is of another dtype (the caller names the tensor);
// `to` must be one of the three (checked).
[[nodiscard]] bool safetensors_convert_elements(const SafetensorsTensor& src, uint64_t begin,
                                                uint64_t n, SafetensorsDtype to, void* dst);

// A write tensor over a host view (shape, dtype and bytes from the view). The view must be on the
// CPU (checked) and outlive the write.
SafetensorsWriteTensor safetensors_write_tensor(std::string name, ConstTensorView view);

// The metadata lathe writes by default, as transformers' save_pretrained does: {"format": "pt"}.
std::map<std::string, std::string> safetensors_default_metadata();

// Writes one safetensors file at `path` atomically (AtomicFile: nothing appears under `path`
// unless the whole file was written and synced). Tensor order and header bytes are those of the
// reference serialize_file (see the file comment); `metadata` becomes "__metadata__", omitted when
// empty. Errors (kInvalidArgument, naming the tensor): a duplicate or reserved name
// ("__metadata__"), a name that is not valid UTF-8, a negative dimension, nbytes that disagree
// with dtype and shape, a null pointer with nbytes > 0, a header over the size limit; kIoError from
// the OS.
Status safetensors_write_file(const std::string& path,
                              std::span<const SafetensorsWriteTensor> tensors,
                              const std::map<std::string, std::string>& metadata);

struct SafetensorsCheckpointWriteOptions {
    // A shard closes before a tensor that would take it past this many bytes of tensor data, as
    // huggingface_hub's split_state_dict_into_shards_factory does (a tensor larger than the limit
    // gets a shard of its own). 0 = no limit (one file). transformers' default is 5 GB (5e9).
    uint64_t max_shard_bytes = 0;
    std::map<std::string, std::string> metadata = safetensors_default_metadata();
};

// What safetensors_write_checkpoint wrote.
struct SafetensorsCheckpointWriteResult {
    std::vector<std::string> files;  // shard file names (not paths), in order
    std::string index_file;          // "model.safetensors.index.json", or "" for a single file
    uint64_t total_size = 0;         // bytes of tensor data, as the index's metadata.total_size
};

// Writes the tensors as a Hugging Face checkpoint into the existing directory `dir`.
// Shards are formed by walking `tensors` in the given order (pass the model's parameter order, as
// transformers passes its state_dict) with the split rule above. One shard is written as
// "model.safetensors" with no index; several as "model-00001-of-0000N.safetensors" ... plus
// "model.safetensors.index.json" ({"metadata": {"total_size": ...}, "weight_map": {...}}, keys
// sorted, indent 2, as transformers writes it), which is written last. Every file is atomic. As
// save_pretrained does, weight files of an earlier save that the new set does not contain
// (model.safetensors, model-*-of-*.safetensors, the index) are removed, so that no reader picks up
// a stale file; a stale model.safetensors goes before the new index is written, since readers
// prefer it. Errors as safetensors_write_file, each naming the file; kNotFound if `dir` is not a
// directory.
Result<SafetensorsCheckpointWriteResult> safetensors_write_checkpoint(
    const std::string& dir, std::span<const SafetensorsWriteTensor> tensors,
    const SafetensorsCheckpointWriteOptions& options = {});

inline constexpr std::string_view kSafetensorsSingleFileName = "model.safetensors";
inline constexpr std::string_view kSafetensorsIndexFileName = "model.safetensors.index.json";

// The tensors of a checkpoint, looked up by name across one file or all the shards of an index.
// Shards are opened (mapped and validated) on first use. tensor() may be called from several
// threads at once. Move-only; pointers it hands out live as long as it does.
class SafetensorsCheckpoint {
public:
    // `path` is a directory (holding model.safetensors, or model.safetensors.index.json: the single
    // file first, as transformers looks), a .safetensors file, or an index .json file.
    // An index is read and checked at once (JSON shape, "weight_map" of tensor -> file name, plain
    // file names, every shard present on disk); shards are not opened yet.
    static Result<SafetensorsCheckpoint> open(const std::string& path);

    SafetensorsCheckpoint() = default;
    SafetensorsCheckpoint(SafetensorsCheckpoint&&) noexcept = default;
    SafetensorsCheckpoint& operator=(SafetensorsCheckpoint&&) noexcept = default;

    // Every tensor name, sorted.
    const std::vector<std::string>& names() const { return names_; }
    bool contains(std::string_view name) const;
    // The tensor called `name`, opening its shard if needed. Errors: kNotFound naming the
    // checkpoint and the closest name; a shard that fails to open or validate; a shard that lacks
    // a tensor the index assigns to it (kDataLoss naming index, shard and tensor).
    Result<const SafetensorsTensor*> tensor(std::string_view name) const;
    // Opens every shard now and checks that it holds every tensor the index assigns to it.
    Status open_all() const;

    // The index file path, or "" for a single file.
    const std::string& index_path() const { return index_path_; }
    // Shard paths (one for a single file; sorted by file name for an index).
    std::vector<std::string> shard_paths() const;
    // metadata.total_size from the index, when given.
    std::optional<uint64_t> index_total_size() const { return index_total_size_; }
    // "__metadata__" of the first shard (opening it).
    Result<std::map<std::string, std::string>> metadata() const;

private:
    struct Shard {
        std::string path;
        std::vector<std::string> expected;      // tensor names the index assigns to this shard
        std::unique_ptr<SafetensorsFile> file;  // null until opened
    };
    Result<const SafetensorsFile*> open_shard(size_t shard) const;

    std::string source_;  // what open() was given, for messages
    std::string index_path_;
    std::optional<uint64_t> index_total_size_;
    std::vector<std::string> names_;
    std::unordered_map<std::string, size_t> shard_of_;  // tensor name -> shard
    mutable std::vector<Shard> shards_;
    mutable std::unique_ptr<std::mutex> mu_ = std::make_unique<std::mutex>();
};

}  // namespace lathe
