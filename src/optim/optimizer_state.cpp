#include "optim/optimizer_state.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <string_view>
#include <system_error>
#include <vector>

#include "core/check.h"
#include "core/finite.h"
#include "core/strings.h"
#include "io/file.h"
#include "io/safetensors.h"

namespace fs = std::filesystem;

namespace lathe {
namespace {

constexpr const char* kExpAvg = "exp_avg";
constexpr const char* kExpAvgSq = "exp_avg_sq";

const std::map<std::string, std::string>& state_metadata() {
    static const std::map<std::string, std::string> m = {{"format", "lathe-adamw"},
                                                         {"layout", "parameter arena"}};
    return m;
}

// The error of moments read from `path` (its tensor `name`) that hold NaN or infinite values
// (`phrase`: non_finite_phrase's words), with what to do: the checkpoint's weights may still be
// sound.
Status non_finite_moments_error(const std::string& path, std::string_view name,
                                const std::string& phrase) {
    return data_loss_error(
        "{}: tensor '{}': {}: the run that wrote this optimizer state diverged or the file is "
        "damaged; resume from an earlier checkpoint, or start a new run from this one's weights "
        "alone (checkpoint.init_from with checkpoint.init_mode: finetune, which reads no "
        "optimizer state)",
        path, name, phrase);
}

}  // namespace

Status optimizer_state_write(const std::string& path, std::span<const float> exp_avg,
                             std::span<const float> exp_avg_sq) {
    LATHE_CHECK(exp_avg.size() == exp_avg_sq.size(), "moments of {} and {} elements",
                exp_avg.size(), exp_avg_sq.size());
    const Shape shape{int64_t(exp_avg.size())};
    const SafetensorsWriteTensor tensors[] = {
        safetensors_write_tensor(kExpAvg, ConstTensorView(exp_avg.data(), DType::kF32, shape)),
        safetensors_write_tensor(kExpAvgSq, ConstTensorView(exp_avg_sq.data(), DType::kF32, shape)),
    };
    return safetensors_write_file(path, tensors, state_metadata());
}

namespace {

// The 8-byte length and the header of the full file of two moments of n elements:
// safetensors_write_file's for these two tensors: keys in data order after "__metadata__", no
// spaces, padded with spaces to a multiple of 8 (a test compares the bytes).
std::string full_file_head(uint64_t n) {
    const uint64_t bytes = n * sizeof(float);
    std::string meta;
    for (const auto& [k, v] : state_metadata())
        meta += fmt::format("{}\"{}\":\"{}\"", meta.empty() ? "" : ",", k, v);
    std::string header = fmt::format(
        "{{\"__metadata__\":{{{3}}},"
        "\"{4}\":{{\"dtype\":\"F32\",\"shape\":[{0}],\"data_offsets\":[0,{1}]}},"
        "\"{5}\":{{\"dtype\":\"F32\",\"shape\":[{0}],\"data_offsets\":[{1},{2}]}}}}",
        n, bytes, 2 * bytes, meta, kExpAvg, kExpAvgSq);
    header.resize((header.size() + 7) / 8 * 8, ' ');
    std::string head(8, '\0');
    const uint64_t len = header.size();
    for (int i = 0; i < 8; ++i) head[size_t(i)] = char((len >> (8 * i)) & 0xFF);  // little-endian
    head += header;
    return head;
}

}  // namespace

Status optimizer_state_write_streamed(
    const std::string& path, uint64_t n,
    const std::function<void(int moment, uint64_t begin, std::span<float> out)>& fill) {
    LATHE_ASSIGN_OR_RETURN(AtomicFile f, AtomicFile::create(path));
    LATHE_RETURN_IF_ERROR(f.write(full_file_head(n)));
    constexpr uint64_t kChunk = uint64_t(1) << 20;
    std::vector<float> buf(size_t(std::min<uint64_t>(n, kChunk)));
    for (int moment = 0; moment < 2; ++moment)
        for (uint64_t b = 0; b < n; b += kChunk) {
            const uint64_t c = std::min(kChunk, n - b);
            fill(moment, b, std::span<float>(buf.data(), size_t(c)));
            LATHE_RETURN_IF_ERROR(f.write(buf.data(), size_t(c) * sizeof(float)));
        }
    return f.commit();
}

Status optimizer_state_write_zeros(const std::string& path, uint64_t n) {
    const uint64_t bytes = n * sizeof(float);
    const std::string head = full_file_head(n);
    const std::string temp = fmt::format("{}.tmp-{}", path, ::getpid());
    const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return io_error("{}: cannot create: {}", path, std::strerror(errno));
    bool ok = ::write(fd, head.data(), head.size()) == ssize_t(head.size());
    ok = ok && ::ftruncate(fd, off_t(head.size() + 2 * bytes)) == 0;
    ok = ok && ::fsync(fd) == 0;
    int err = errno;
    ok = (::close(fd) == 0) && ok;
    if (ok && std::rename(temp.c_str(), path.c_str()) != 0) {
        ok = false;
        err = errno;
    }
    if (!ok) {
        ::unlink(temp.c_str());
        return io_error("{}: cannot write: {}", path, std::strerror(err));
    }
    return ok_status();
}

Status optimizer_state_read(const std::string& path, int64_t total, FlatRange range,
                            std::span<float> exp_avg, std::span<float> exp_avg_sq) {
    LATHE_CHECK(range.begin >= 0 && range.begin <= range.end && range.end <= total &&
                    int64_t(exp_avg.size()) == range.size() &&
                    int64_t(exp_avg_sq.size()) == range.size(),
                "reading [{}, {}) of {} into {} / {} elements", range.begin, range.end, total,
                exp_avg.size(), exp_avg_sq.size());
    LATHE_ASSIGN_OR_RETURN(const SafetensorsFile file, SafetensorsFile::open(path));
    const std::pair<const char*, float*> moments[] = {{kExpAvg, exp_avg.data()},
                                                      {kExpAvgSq, exp_avg_sq.data()}};
    for (const auto& [name, dst] : moments) {
        LATHE_ASSIGN_OR_RETURN(const SafetensorsTensor* t, file.get(name));
        if (t->dtype != SafetensorsDtype::kF32 || t->nbytes() != uint64_t(total) * sizeof(float)) {
            return data_loss_error(
                "{}: tensor '{}' has {} bytes of {}, expected {} f32 values (the model's "
                "parameter count); was it written for another model?",
                path, name, t->nbytes(), safetensors_dtype_name(t->dtype), total);
        }
        if (range.size() > 0)
            std::memcpy(dst, t->data + uint64_t(range.begin) * sizeof(float),
                        size_t(range.size()) * sizeof(float));
        const NonFiniteCount bad = count_non_finite(dst, range.size());
        if (bad.count > 0) {
            return non_finite_moments_error(
                path, name, non_finite_phrase(bad, range.size(), range.begin + bad.first));
        }
    }
    return ok_status();
}

Status optimizer_state_save(const AdamWOptimizer& optimizer, const std::string& path) {
    LATHE_CHECK(optimizer.range().begin == 0 && optimizer.range().end == optimizer.total(),
                "saving the state of a shard [{}, {}) of {} elements", optimizer.range().begin,
                optimizer.range().end, optimizer.total());
    const size_t n = size_t(optimizer.total());
    std::vector<float> m(n), v(n);
    optimizer.read_state(m, v);
    return optimizer_state_write(path, m, v);
}

Status optimizer_state_load(AdamWOptimizer& optimizer, const std::string& path) {
    const size_t n = size_t(optimizer.range().size());
    std::vector<float> m(n), v(n);
    LATHE_RETURN_IF_ERROR(optimizer_state_read(path, optimizer.total(), optimizer.range(), m, v));
    optimizer.write_state(m, v);
    return ok_status();
}

namespace {

constexpr std::string_view kShardPrefix = "optimizer.rank-";
constexpr std::string_view kShardOf = "-of-";
constexpr std::string_view kShardSuffix = ".safetensors";
constexpr const char* kShardFormat = "lathe-adamw-shard";
constexpr const char* kRangesFormat = "lathe-adamw-ranges";
// The metadata keys of each shard format, for messages.
constexpr const char* kShardKeys = "format, range_begin, range_end, total, used, rank, world";
constexpr const char* kRangesKeys = "format, ranges, used, rank, world";

// A non-negative decimal int64 written by fmt ("0", "4096"), or nullopt.
std::optional<int64_t> parse_decimal(std::string_view s) {
    if (s.empty() || !std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; }))
        return std::nullopt;
    int64_t v = 0;
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
    return v;
}

struct ShardName {
    int rank = 0;
    int world = 0;
};

// The rank and world of a name optimizer_state_shard_name writes, or nullopt for any other name
// (temporary files, other files of the checkpoint).
std::optional<ShardName> parse_shard_name(std::string_view name) {
    if (!starts_with(name, kShardPrefix) || !ends_with(name, kShardSuffix)) return std::nullopt;
    const std::string_view mid =
        name.substr(kShardPrefix.size(), name.size() - kShardPrefix.size() - kShardSuffix.size());
    const size_t of = mid.find(kShardOf);
    if (of == std::string_view::npos) return std::nullopt;
    const std::optional<int64_t> rank = parse_decimal(mid.substr(0, of));
    const std::optional<int64_t> world = parse_decimal(mid.substr(of + kShardOf.size()));
    if (!rank || !world || *world < 1 || *world > INT32_MAX || *rank >= *world) return std::nullopt;
    const ShardName n{int(*rank), int(*world)};
    if (optimizer_state_shard_name(n.rank, n.world) != name) return std::nullopt;
    return n;
}

// The two moment tensors of `file`, F32 of `n` elements each, or the error naming the file.
Result<std::pair<const SafetensorsTensor*, const SafetensorsTensor*>> moment_tensors(
    const SafetensorsFile& file, std::optional<int64_t> n) {
    const SafetensorsTensor* t[2] = {};
    const char* names[2] = {kExpAvg, kExpAvgSq};
    for (int i = 0; i < 2; ++i) {
        LATHE_ASSIGN_OR_RETURN(t[i], file.get(names[i]));
        const bool f32 = t[i]->dtype == SafetensorsDtype::kF32 && t[i]->shape.size() == 1;
        const uint64_t want = n ? uint64_t(*n) * sizeof(float) : t[0]->nbytes();
        if (!f32 || t[i]->nbytes() != want) {
            return data_loss_error(
                "{}: tensor '{}' is {} of shape {} ({} bytes), expected one dimension of {} f32 "
                "values; was it written for another model?",
                file.path(), names[i], safetensors_dtype_name(t[i]->dtype), t[i]->shape_string(),
                t[i]->nbytes(), want / sizeof(float));
        }
    }
    return std::make_pair(t[0], t[1]);
}

// The metadata value `key` of a shard file as a decimal int64; `keys` are those of its format.
Result<int64_t> shard_meta(const SafetensorsFile& file, const char* key, const char* keys) {
    const auto it = file.metadata().find(key);
    if (it == file.metadata().end()) {
        return data_loss_error("{}: metadata has no '{}' (an optimizer shard file holds {})",
                               file.path(), key, keys);
    }
    const std::optional<int64_t> v = parse_decimal(it->second);
    if (!v) {
        return data_loss_error("{}: metadata '{}' is '{}', not a non-negative decimal integer",
                               file.path(), key, escape_for_message(it->second));
    }
    return *v;
}

// The format of a shard file, kShardFormat or kRangesFormat, or the error naming the file.
Result<std::string> shard_format(const SafetensorsFile& file) {
    const auto format = file.metadata().find("format");
    if (format == file.metadata().end() ||
        (format->second != kShardFormat && format->second != kRangesFormat)) {
        return data_loss_error("{}: metadata 'format' is {}, expected '{}' or '{}'", file.path(),
                               format == file.metadata().end()
                                   ? std::string("missing")
                                   : "'" + escape_for_message(format->second) + "'",
                               kShardFormat, kRangesFormat);
    }
    return format->second;
}

// Checks the metadata rank and world of a shard file against its name.
Status check_shard_name(const SafetensorsFile& file, ShardName name, const char* keys) {
    LATHE_ASSIGN_OR_RETURN(const int64_t rank, shard_meta(file, "rank", keys));
    LATHE_ASSIGN_OR_RETURN(const int64_t world, shard_meta(file, "world", keys));
    if (rank != name.rank || world != name.world) {
        return data_loss_error("{}: metadata says rank {} of {}, the file name rank {} of {}",
                               file.path(), rank, world, name.rank, name.world);
    }
    return ok_status();
}

// One validated single-range shard file: its range of the writer's vector.
struct ShardFile {
    SafetensorsFile file;
    int64_t begin = 0, end = 0, total = 0, used = 0;
    const SafetensorsTensor* exp_avg = nullptr;
    const SafetensorsTensor* exp_avg_sq = nullptr;
};

Result<ShardFile> open_shard(SafetensorsFile file, ShardName name) {
    ShardFile s;
    LATHE_ASSIGN_OR_RETURN(s.begin, shard_meta(file, "range_begin", kShardKeys));
    LATHE_ASSIGN_OR_RETURN(s.end, shard_meta(file, "range_end", kShardKeys));
    LATHE_ASSIGN_OR_RETURN(s.total, shard_meta(file, "total", kShardKeys));
    LATHE_ASSIGN_OR_RETURN(s.used, shard_meta(file, "used", kShardKeys));
    LATHE_RETURN_IF_ERROR(check_shard_name(file, name, kShardKeys));
    if (s.begin > s.end || s.end > s.total || s.used > s.total) {
        return data_loss_error("{}: metadata range [{}, {}) with used {} does not fit in total {}",
                               file.path(), s.begin, s.end, s.used, s.total);
    }
    LATHE_ASSIGN_OR_RETURN(auto tensors, moment_tensors(file, s.end - s.begin));
    s.exp_avg = tensors.first;
    s.exp_avg_sq = tensors.second;
    s.file = std::move(file);  // the tensors point into the map, which moves with it
    return s;
}

// The metadata "ranges" of a range-list shard file written for `used` elements: non-empty,
// sorted, disjoint, within [0, used).
Result<std::vector<FlatRange>> parse_ranges(const SafetensorsFile& file, int64_t used) {
    const auto it = file.metadata().find("ranges");
    if (it == file.metadata().end()) {
        return data_loss_error("{}: metadata has no 'ranges' (an optimizer shard file holds {})",
                               file.path(), kRangesKeys);
    }
    std::vector<FlatRange> ranges;
    if (it->second.empty()) return ranges;
    const std::vector<std::string_view> items = split(it->second, ',');
    for (size_t i = 0; i < items.size(); ++i) {
        const std::string_view item = items[i];
        const size_t dash = item.find('-');
        const std::optional<int64_t> b =
            dash == std::string_view::npos ? std::nullopt : parse_decimal(item.substr(0, dash));
        const std::optional<int64_t> e =
            dash == std::string_view::npos ? std::nullopt : parse_decimal(item.substr(dash + 1));
        if (!b || !e) {
            return data_loss_error(
                "{}: metadata 'ranges' item {} is '{}', not B-E with non-negative decimal B and E",
                file.path(), i, escape_for_message(item));
        }
        if (*b >= *e) {
            return data_loss_error(
                "{}: metadata 'ranges' item {} is '{}-{}', an empty range (B must be below E)",
                file.path(), i, *b, *e);
        }
        if (!ranges.empty() && *b < ranges.back().end) {
            return data_loss_error(
                "{}: metadata 'ranges' item {} '{}-{}' begins before item {} '{}-{}' ends (the "
                "ranges of a file are sorted and disjoint)",
                file.path(), i, *b, *e, i - 1, ranges.back().begin, ranges.back().end);
        }
        if (*e > used) {
            return data_loss_error("{}: metadata 'ranges' item {} '{}-{}' ends past 'used' {}",
                                   file.path(), i, *b, *e, used);
        }
        ranges.push_back({*b, *e});
    }
    return ranges;
}

// The message for a shard file of another model.
std::string another_model(const std::string& path, int64_t theirs, int64_t ours) {
    return fmt::format(
        "{}: written for a model of {} parameters, this one has {}; the checkpoint belongs to "
        "another model",
        path, theirs, ours);
}

// One validated range-list shard file.
struct ListShardFile {
    SafetensorsFile file;
    int64_t used = 0;
    std::vector<FlatRange> ranges;
    const SafetensorsTensor* exp_avg = nullptr;
    const SafetensorsTensor* exp_avg_sq = nullptr;
};

// Validates a range-list shard file for a model of `used` elements.
Result<ListShardFile> open_list_shard(SafetensorsFile file, ShardName name, int64_t used) {
    ListShardFile s;
    LATHE_ASSIGN_OR_RETURN(s.used, shard_meta(file, "used", kRangesKeys));
    LATHE_RETURN_IF_ERROR(check_shard_name(file, name, kRangesKeys));
    if (s.used != used) return data_loss_error("{}", another_model(file.path(), s.used, used));
    LATHE_ASSIGN_OR_RETURN(s.ranges, parse_ranges(file, s.used));
    int64_t n = 0;
    for (const FlatRange& r : s.ranges) n += r.size();
    LATHE_ASSIGN_OR_RETURN(auto tensors, moment_tensors(file, n));
    s.exp_avg = tensors.first;
    s.exp_avg_sq = tensors.second;
    s.file = std::move(file);  // the tensors point into the map, which moves with it
    return s;
}

// A run of canonical elements [begin, end) that one mapped file holds: the moments of `begin`
// and on start at m and v.
struct Piece {
    int64_t begin = 0, end = 0;
    const uint8_t* m = nullptr;
    const uint8_t* v = nullptr;
    size_t file = 0;  // index into OpenState::files
};

// A checkpoint's optimizer state, validated: the mapped files and their pieces, sorted by begin,
// tiling [0, used) (the pieces point into the maps, which stay where they are when moved).
struct OpenState {
    std::vector<SafetensorsFile> files;
    std::vector<Piece> pieces;
};

std::string range_string(int64_t begin, int64_t end) {
    return fmt::format("{}-{}", begin, end);
}

// Checks that the pieces of a range-list set (sorted here) tile [0, used), naming the files of
// an overlap or around a gap.
Status check_tiling(const std::string& dir, int world, int64_t used, OpenState& st) {
    std::sort(st.pieces.begin(), st.pieces.end(),
              [](const Piece& a, const Piece& b) { return a.begin < b.begin; });
    int64_t expect = 0;
    const Piece* prev = nullptr;
    for (const Piece& p : st.pieces) {
        if (p.begin < expect) {
            return data_loss_error(
                "{}: range {} overlaps range {} of {}; two files hold the same elements, so the "
                "optimizer shard set does not tile one vector",
                st.files[p.file].path(), range_string(p.begin, p.end),
                range_string(prev->begin, prev->end), st.files[prev->file].path());
        }
        if (p.begin > expect) {
            return data_loss_error(
                "{}: no file of the optimizer shard set of {} ranks holds elements [{}, {}) "
                "(before range {} of {}); the set does not cover the model's {} parameters",
                dir, world, expect, p.begin, range_string(p.begin, p.end), st.files[p.file].path(),
                used);
        }
        expect = p.end;
        prev = &p;
    }
    if (expect != used) {
        if (prev == nullptr) {
            return data_loss_error(
                "{}: no file of the optimizer shard set of {} ranks holds any element (their "
                "'ranges' are empty); the set does not cover the model's {} parameters",
                dir, world, used);
        }
        return data_loss_error(
            "{}: no file of the optimizer shard set of {} ranks holds elements [{}, {}) (after "
            "range {} of {}); the set does not cover the model's {} parameters",
            dir, world, expect, used, range_string(prev->begin, prev->end),
            st.files[prev->file].path(), used);
    }
    return ok_status();
}

// Opens and validates the state in `dir` for a model of `used` parameters: the full file or a
// complete shard set of either format.
Result<OpenState> open_state(const std::string& dir, int64_t used) {
    // What the folder holds: the full file, shard files by world size.
    std::error_code ec;
    if (!fs::is_directory(dir, ec))
        return not_found_error("{}: no such checkpoint folder (optimizer state)", dir);
    bool full = false;
    std::map<int, std::vector<int>> ranks_by_world;
    for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
        const std::string name = e.path().filename().string();
        if (name == kOptimizerStateFullName) {
            full = true;
        } else if (const std::optional<ShardName> s = parse_shard_name(name)) {
            ranks_by_world[s->world].push_back(s->rank);
        }
    }
    if (ec) return io_error("{}: cannot list: {}", dir, ec.message());
    if (!full && ranks_by_world.empty()) {
        return not_found_error("{}: no optimizer state ({} or {}...)", dir, kOptimizerStateFullName,
                               optimizer_state_shard_name(0, 1));
    }
    if (full && !ranks_by_world.empty()) {
        return data_loss_error(
            "{}: holds both {} and optimizer shard files ({}...); a checkpoint lathe writes holds "
            "one kind, so which is its state is unknown: remove the one that does not belong",
            dir, kOptimizerStateFullName,
            optimizer_state_shard_name(*std::min_element(ranks_by_world.begin()->second.begin(),
                                                         ranks_by_world.begin()->second.end()),
                                       ranks_by_world.begin()->first));
    }
    if (ranks_by_world.size() > 1) {
        std::string worlds;
        for (const auto& [w, ranks] : ranks_by_world)
            worlds += fmt::format("{}{}", worlds.empty() ? "" : ", ", w);
        return data_loss_error(
            "{}: holds optimizer shard files of several world sizes ({}); a checkpoint lathe "
            "writes holds one set, so which is its state is unknown: remove the sets that do not "
            "belong",
            dir, worlds);
    }

    OpenState st;
    if (full) {
        const std::string path = (fs::path(dir) / kOptimizerStateFullName).string();
        LATHE_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::open(path));
        LATHE_ASSIGN_OR_RETURN(auto tensors, moment_tensors(file, std::nullopt));
        const int64_t length = int64_t(tensors.first->nbytes() / sizeof(float));
        if (length < used) {
            return data_loss_error(
                "{}: moments of {} f32 values, fewer than the model's {} parameters; was it "
                "written for another model?",
                path, length, used);
        }
        if (used > 0) st.pieces.push_back({0, used, tensors.first->data, tensors.second->data, 0});
        st.files.push_back(std::move(file));
        return st;
    }

    const int world = ranks_by_world.begin()->first;
    std::vector<int>& ranks = ranks_by_world.begin()->second;
    std::sort(ranks.begin(), ranks.end());
    if (int(ranks.size()) != world) {
        std::string missing;
        int count = 0;
        for (int k = 0, i = 0; k < world; ++k) {
            if (i < int(ranks.size()) && ranks[size_t(i)] == k) {
                ++i;
                continue;
            }
            if (count++ < 8)
                missing += fmt::format("{}{}", missing.empty() ? "" : ", ",
                                       optimizer_state_shard_name(k, world));
        }
        if (count > 8) missing += fmt::format(" and {} more", count - 8);
        return not_found_error(
            "{}: the optimizer shard set of {} ranks is incomplete: missing {} (the checkpoint "
            "was not written by every rank; resume from an older one)",
            dir, world, missing);
    }
    st.files.reserve(size_t(world));
    std::string format;
    int64_t expect_begin = 0, total = 0;  // the single-range set's tiling
    for (int k = 0; k < world; ++k) {
        const std::string path = (fs::path(dir) / optimizer_state_shard_name(k, world)).string();
        LATHE_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::open(path));
        LATHE_ASSIGN_OR_RETURN(const std::string f, shard_format(file));
        if (k == 0) format = f;
        if (f != format) {
            return data_loss_error(
                "{}: metadata 'format' is '{}', but {} is '{}'; the files of a shard set lathe "
                "writes have one format, so the set is not one checkpoint's",
                path, f, optimizer_state_shard_name(0, world), format);
        }
        const size_t index = st.files.size();
        if (f == kShardFormat) {
            LATHE_ASSIGN_OR_RETURN(ShardFile s, open_shard(std::move(file), {k, world}));
            if (k == 0) total = s.total;
            if (s.total != total || s.begin != expect_begin) {
                return data_loss_error(
                    "{}: range [{}, {}) of total {}, but the shards before it end at {} of total "
                    "{}; the shard set does not tile one vector",
                    path, s.begin, s.end, s.total, expect_begin, total);
            }
            if (s.used != used) return data_loss_error("{}", another_model(path, s.used, used));
            expect_begin = s.end;
            // The part below `used`; the padding after it is not read.
            if (s.begin < std::min(s.end, used))
                st.pieces.push_back(
                    {s.begin, std::min(s.end, used), s.exp_avg->data, s.exp_avg_sq->data, index});
            st.files.push_back(std::move(s.file));
        } else {
            LATHE_ASSIGN_OR_RETURN(ListShardFile s,
                                   open_list_shard(std::move(file), {k, world}, used));
            uint64_t offset = 0;  // bytes into each tensor
            for (const FlatRange& r : s.ranges) {
                st.pieces.push_back(
                    {r.begin, r.end, s.exp_avg->data + offset, s.exp_avg_sq->data + offset, index});
                offset += uint64_t(r.size()) * sizeof(float);
            }
            st.files.push_back(std::move(s.file));
        }
    }
    if (format == kShardFormat) {
        if (expect_begin != total) {
            return data_loss_error(
                "{}: the {} shards end at {}, not at their total {}; the shard set does not tile "
                "one vector",
                (fs::path(dir) / optimizer_state_shard_name(world - 1, world)).string(), world,
                expect_begin, total);
        }
    } else {
        LATHE_RETURN_IF_ERROR(check_tiling(dir, world, used, st));
    }
    return st;
}

// The moments read so far that are NaN or infinite: each moment's count, its first (a canonical
// element) and the file that holds that one.
struct NonFiniteMoments {
    NonFiniteCount moment[2];
    std::string file[2];
    int64_t read = 0;  // elements read of each moment

    void note(int which, const float* values, int64_t n, int64_t canonical_begin,
              const std::string& path) {
        const bool first = moment[which].count == 0;
        add_non_finite(moment[which], values, n, canonical_begin);
        if (first && moment[which].count > 0) file[which] = path;
    }

    // An error naming the first moment with a NaN or infinity, ok when neither has one.
    Status status() const {
        for (int which = 0; which < 2; ++which) {
            const NonFiniteCount& c = moment[which];
            if (c.count == 0) continue;
            return non_finite_moments_error(
                file[which], which == 0 ? kExpAvg : kExpAvgSq,
                non_finite_phrase(c, read, c.first, " of the parameter vector"));
        }
        return ok_status();
    }
};

// Copies canonical elements [want.begin, want.end) (within [0, used)) from the pieces into m
// and v, reading only those bytes, and notes in `bad` the values that are not finite.
void fill(const OpenState& st, FlatRange want, float* m, float* v, NonFiniteMoments& bad) {
    if (want.size() <= 0) return;
    // The last piece beginning at or before want.begin: the pieces tile [0, used).
    auto it = std::upper_bound(st.pieces.begin(), st.pieces.end(), want.begin,
                               [](int64_t at, const Piece& p) { return at < p.begin; });
    LATHE_CHECK(it != st.pieces.begin(), "element {} before the first piece", want.begin);
    --it;
    for (int64_t at = want.begin; at < want.end; ++it) {
        LATHE_CHECK(it != st.pieces.end() && it->begin <= at && at < it->end,
                    "element {} in no piece", at);
        const int64_t hi = std::min(want.end, it->end);
        const uint64_t from = uint64_t(at - it->begin) * sizeof(float);
        const size_t bytes = size_t(hi - at) * sizeof(float);
        std::memcpy(m + (at - want.begin), it->m + from, bytes);
        std::memcpy(v + (at - want.begin), it->v + from, bytes);
        const std::string& path = st.files[it->file].path();
        bad.note(0, m + (at - want.begin), hi - at, at, path);
        bad.note(1, v + (at - want.begin), hi - at, at, path);
        bad.read += hi - at;
        at = hi;
    }
}

}  // namespace

std::string optimizer_state_shard_name(int rank, int world) {
    LATHE_CHECK(rank >= 0 && rank < world, "shard {} of {}", rank, world);
    return fmt::format("{}{:05d}{}{:05d}{}", kShardPrefix, rank, kShardOf, world, kShardSuffix);
}

Status optimizer_state_save_shard(const AdamWOptimizer& optimizer, const std::string& dir, int rank,
                                  int world, int64_t used) {
    const FlatRange r = optimizer.range();
    LATHE_CHECK(used >= 0 && used <= optimizer.total(), "used {} of a vector of {}", used,
                optimizer.total());
    const std::string name = optimizer_state_shard_name(rank, world);
    const size_t n = size_t(r.size());
    std::vector<float> m(n), v(n);
    optimizer.read_state(m, v);
    const Shape shape{int64_t(n)};
    const SafetensorsWriteTensor tensors[] = {
        safetensors_write_tensor(kExpAvg, ConstTensorView(m.data(), DType::kF32, shape)),
        safetensors_write_tensor(kExpAvgSq, ConstTensorView(v.data(), DType::kF32, shape)),
    };
    const std::map<std::string, std::string> metadata = {
        {"format", kShardFormat},
        {"range_begin", std::to_string(r.begin)},
        {"range_end", std::to_string(r.end)},
        {"total", std::to_string(optimizer.total())},
        {"used", std::to_string(used)},
        {"rank", std::to_string(rank)},
        {"world", std::to_string(world)},
    };
    return safetensors_write_file((fs::path(dir) / name).string(), tensors, metadata);
}

Status optimizer_state_save_shard(std::span<const float> exp_avg, std::span<const float> exp_avg_sq,
                                  std::span<const FlatRange> ranges, const std::string& dir,
                                  int rank, int world, int64_t used) {
    LATHE_CHECK(used >= 0, "used {}", used);
    const std::string name = optimizer_state_shard_name(rank, world);
    // The metadata list: empty ranges dropped, adjacent ones merged.
    std::string list;
    int64_t n = 0, prev_end = 0;
    std::optional<FlatRange> open;
    const auto flush = [&] {
        if (open)
            list +=
                fmt::format("{}{}", list.empty() ? "" : ",", range_string(open->begin, open->end));
    };
    for (const FlatRange& r : ranges) {
        LATHE_CHECK(r.begin >= prev_end && r.begin <= r.end && r.end <= used,
                    "range [{}, {}) after one ending at {}, of {} elements: the ranges of a shard "
                    "are sorted, disjoint and within [0, used)",
                    r.begin, r.end, prev_end, used);
        n += r.size();
        prev_end = r.end;
        if (r.size() == 0) continue;
        if (open && open->end == r.begin) {
            open->end = r.end;
        } else {
            flush();
            open = r;
        }
    }
    flush();
    LATHE_CHECK(int64_t(exp_avg.size()) == n && int64_t(exp_avg_sq.size()) == n,
                "moments of {} and {} elements for ranges of {}", exp_avg.size(), exp_avg_sq.size(),
                n);
    const Shape shape{n};
    const SafetensorsWriteTensor tensors[] = {
        safetensors_write_tensor(kExpAvg, ConstTensorView(exp_avg.data(), DType::kF32, shape)),
        safetensors_write_tensor(kExpAvgSq, ConstTensorView(exp_avg_sq.data(), DType::kF32, shape)),
    };
    const std::map<std::string, std::string> metadata = {
        {"format", kRangesFormat},        {"ranges", list},
        {"used", std::to_string(used)},   {"rank", std::to_string(rank)},
        {"world", std::to_string(world)},
    };
    return safetensors_write_file((fs::path(dir) / name).string(), tensors, metadata);
}

Status optimizer_state_load_ranges(const std::string& dir, int64_t used,
                                   std::span<const FlatRange> ranges, std::span<float> exp_avg,
                                   std::span<float> exp_avg_sq) {
    int64_t n = 0;
    for (const FlatRange& r : ranges) {
        LATHE_CHECK(r.begin >= 0 && r.begin <= r.end && r.end <= used,
                    "loading range [{}, {}) of a model of {} elements", r.begin, r.end, used);
        n += r.size();
    }
    LATHE_CHECK(int64_t(exp_avg.size()) == n && int64_t(exp_avg_sq.size()) == n,
                "ranges of {} elements into {} / {}", n, exp_avg.size(), exp_avg_sq.size());
    LATHE_ASSIGN_OR_RETURN(const OpenState st, open_state(dir, used));
    NonFiniteMoments bad;
    int64_t at = 0;
    for (const FlatRange& r : ranges) {
        fill(st, r, exp_avg.data() + at, exp_avg_sq.data() + at, bad);
        at += r.size();
    }
    return bad.status();
}

Status optimizer_state_load_checkpoint(AdamWOptimizer& optimizer, const std::string& dir,
                                       int64_t used) {
    const FlatRange r = optimizer.range();
    LATHE_CHECK(used >= 0 && used <= optimizer.total(), "used {} of a vector of {}", used,
                optimizer.total());
    // Elements at and after `used` are padding: zero.
    const size_t n = size_t(r.size());
    std::vector<float> m(n, 0.0f), v(n, 0.0f);
    LATHE_ASSIGN_OR_RETURN(const OpenState st, open_state(dir, used));
    NonFiniteMoments bad;
    fill(st, {r.begin, std::max(r.begin, std::min(r.end, used))}, m.data(), v.data(), bad);
    LATHE_RETURN_IF_ERROR(bad.status());
    optimizer.write_state(m, v);
    return ok_status();
}

Status optimizer_state_check_checkpoint(const std::string& dir, int64_t used) {
    LATHE_CHECK(used >= 0, "used {}", used);
    return open_state(dir, used).status();
}

}  // namespace lathe
