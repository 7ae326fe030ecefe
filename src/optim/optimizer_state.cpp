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
#include "core/strings.h"
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

// The header is safetensors_write_file's for these two tensors: keys in data order after
// "__metadata__", no spaces, padded with spaces to a multiple of 8 (a test compares the bytes).
Status optimizer_state_write_zeros(const std::string& path, uint64_t n) {
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

// The metadata value `key` of a shard file as a decimal int64.
Result<int64_t> shard_meta(const SafetensorsFile& file, const char* key) {
    const auto it = file.metadata().find(key);
    if (it == file.metadata().end()) {
        return data_loss_error("{}: metadata has no '{}' (an optimizer shard file holds {})",
                               file.path(), key,
                               "format, range_begin, range_end, total, used, rank, world");
    }
    const std::optional<int64_t> v = parse_decimal(it->second);
    if (!v) {
        return data_loss_error("{}: metadata '{}' is '{}', not a non-negative decimal integer",
                               file.path(), key, escape_for_message(it->second));
    }
    return *v;
}

// One validated shard file: its range of the writer's vector.
struct ShardFile {
    SafetensorsFile file;
    int64_t begin = 0, end = 0, total = 0, used = 0;
    const SafetensorsTensor* exp_avg = nullptr;
    const SafetensorsTensor* exp_avg_sq = nullptr;
};

Result<ShardFile> open_shard(const std::string& path, ShardName name) {
    LATHE_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::open(path));
    const auto format = file.metadata().find("format");
    if (format == file.metadata().end() || format->second != kShardFormat) {
        return data_loss_error("{}: metadata 'format' is {}, expected '{}'", path,
                               format == file.metadata().end()
                                   ? std::string("missing")
                                   : "'" + escape_for_message(format->second) + "'",
                               kShardFormat);
    }
    ShardFile s;
    LATHE_ASSIGN_OR_RETURN(s.begin, shard_meta(file, "range_begin"));
    LATHE_ASSIGN_OR_RETURN(s.end, shard_meta(file, "range_end"));
    LATHE_ASSIGN_OR_RETURN(s.total, shard_meta(file, "total"));
    LATHE_ASSIGN_OR_RETURN(s.used, shard_meta(file, "used"));
    LATHE_ASSIGN_OR_RETURN(const int64_t rank, shard_meta(file, "rank"));
    LATHE_ASSIGN_OR_RETURN(const int64_t world, shard_meta(file, "world"));
    if (rank != name.rank || world != name.world) {
        return data_loss_error("{}: metadata says rank {} of {}, the file name rank {} of {}", path,
                               rank, world, name.rank, name.world);
    }
    if (s.begin > s.end || s.end > s.total || s.used > s.total) {
        return data_loss_error("{}: metadata range [{}, {}) with used {} does not fit in total {}",
                               path, s.begin, s.end, s.used, s.total);
    }
    LATHE_ASSIGN_OR_RETURN(auto tensors, moment_tensors(file, s.end - s.begin));
    s.exp_avg = tensors.first;
    s.exp_avg_sq = tensors.second;
    s.file = std::move(file);  // the tensors point into the map, which moves with it
    return s;
}

// Copies elements [lo, hi) of the writer's vector from `t` (holding [t_begin, ...)) into `dst`
// (holding [dst_begin, ...)).
void copy_elements(const SafetensorsTensor& t, int64_t t_begin, int64_t lo, int64_t hi, float* dst,
                   int64_t dst_begin) {
    if (hi <= lo) return;
    std::memcpy(dst + (lo - dst_begin), t.data + uint64_t(lo - t_begin) * sizeof(float),
                size_t(hi - lo) * sizeof(float));
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

namespace {

// Validates the state in `dir` for a model of `used` parameters and fills elements
// [r.begin, r.end) of its vector into m and v (r.size() each, zero at and after `used`).
Status read_checkpoint(const std::string& dir, int64_t used, FlatRange r, std::span<float> m,
                       std::span<float> v) {
    LATHE_CHECK(int64_t(m.size()) == r.size() && int64_t(v.size()) == r.size(),
                "range of {} into {} / {} elements", r.size(), m.size(), v.size());
    std::fill(m.begin(), m.end(), 0.0f);
    std::fill(v.begin(), v.end(), 0.0f);
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

    const int64_t lo = r.begin, hi = std::min(r.end, used);  // what is read; the rest is zero
    if (full) {
        const std::string path = (fs::path(dir) / kOptimizerStateFullName).string();
        LATHE_ASSIGN_OR_RETURN(const SafetensorsFile file, SafetensorsFile::open(path));
        LATHE_ASSIGN_OR_RETURN(auto tensors, moment_tensors(file, std::nullopt));
        const int64_t length = int64_t(tensors.first->nbytes() / sizeof(float));
        if (length < used) {
            return data_loss_error(
                "{}: moments of {} f32 values, fewer than the model's {} parameters; was it "
                "written for another model?",
                path, length, used);
        }
        copy_elements(*tensors.first, 0, lo, hi, m.data(), r.begin);
        copy_elements(*tensors.second, 0, lo, hi, v.data(), r.begin);
    } else {
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
        int64_t expect_begin = 0, total = 0;
        for (int k = 0; k < world; ++k) {
            const std::string path =
                (fs::path(dir) / optimizer_state_shard_name(k, world)).string();
            LATHE_ASSIGN_OR_RETURN(const ShardFile s, open_shard(path, {k, world}));
            if (k == 0) total = s.total;
            if (s.total != total || s.begin != expect_begin) {
                return data_loss_error(
                    "{}: range [{}, {}) of total {}, but the shards before it end at {} of total "
                    "{}; the shard set does not tile one vector",
                    path, s.begin, s.end, s.total, expect_begin, total);
            }
            if (s.used != used) {
                return data_loss_error(
                    "{}: written for a model of {} parameters, this one has {}; the checkpoint "
                    "belongs to another model",
                    path, s.used, used);
            }
            expect_begin = s.end;
            copy_elements(*s.exp_avg, s.begin, std::max(lo, s.begin), std::min(hi, s.end), m.data(),
                          r.begin);
            copy_elements(*s.exp_avg_sq, s.begin, std::max(lo, s.begin), std::min(hi, s.end),
                          v.data(), r.begin);
        }
        if (expect_begin != total) {
            return data_loss_error(
                "{}: the {} shards end at {}, not at their total {}; the shard set does not tile "
                "one vector",
                (fs::path(dir) / optimizer_state_shard_name(world - 1, world)).string(), world,
                expect_begin, total);
        }
    }
    return ok_status();
}

}  // namespace

Status optimizer_state_load_checkpoint(AdamWOptimizer& optimizer, const std::string& dir,
                                       int64_t used) {
    const FlatRange r = optimizer.range();
    LATHE_CHECK(used >= 0 && used <= optimizer.total(), "used {} of a vector of {}", used,
                optimizer.total());
    const size_t n = size_t(r.size());
    std::vector<float> m(n), v(n);
    LATHE_RETURN_IF_ERROR(read_checkpoint(dir, used, r, m, v));
    optimizer.write_state(m, v);
    return ok_status();
}

Status optimizer_state_check_checkpoint(const std::string& dir, int64_t used) {
    LATHE_CHECK(used >= 0, "used {}", used);
    return read_checkpoint(dir, used, {0, 0}, {}, {});
}

}  // namespace lathe
