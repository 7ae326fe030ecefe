#include "optim/optimizer_state.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <vector>

#include "core/check.h"
#include "io/safetensors.h"

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

}  // namespace lathe
