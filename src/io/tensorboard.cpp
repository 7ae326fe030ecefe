#include "io/tensorboard.h"

#include <unistd.h>

#include <algorithm>
#include <boost/crc.hpp>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <utility>

#include "core/check.h"
#include "io/tensorboard_event.pb.h"

namespace lathe {
namespace {

// CRC-32C as Boost.CRC spells it: width, polynomial, initial remainder, final xor, reflected input
// and output.
using Crc32c = boost::crc_optimal<32, 0x1EDC6F41, 0xFFFFFFFF, 0xFFFFFFFF, true, true>;

constexpr uint32_t kCrcMaskDelta = 0xa282ead8u;

void put_le(std::string& out, uint64_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) out.push_back(char((v >> (8 * i)) & 0xff));
}

double unix_now() {
    return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
        .count();
}

std::string host_name() {
    char buf[256] = {};
    if (::gethostname(buf, sizeof buf - 1) != 0 || buf[0] == '\0') return "localhost";
    return buf;
}

}  // namespace

uint32_t crc32c(std::string_view data) {
    Crc32c crc;
    crc.process_bytes(data.data(), data.size());
    return crc.checksum();
}

uint32_t tfrecord_masked_crc(std::string_view data) {
    const uint32_t c = crc32c(data);
    return ((c >> 15) | (c << 17)) + kCrcMaskDelta;
}

std::string tfrecord_frame(std::string_view data) {
    std::string out;
    out.reserve(data.size() + 16);
    put_le(out, data.size(), 8);
    put_le(out, tfrecord_masked_crc(std::string_view(out.data(), 8)), 4);
    out.append(data);
    put_le(out, tfrecord_masked_crc(data), 4);
    return out;
}

std::string tensorboard_version_event(double wall_time) {
    tensorboard::Event e;
    e.set_wall_time(wall_time);
    e.set_file_version("brain.Event:2");
    return e.SerializeAsString();
}

std::string tensorboard_start_event(int64_t step, double wall_time) {
    tensorboard::Event e;
    e.set_wall_time(wall_time);
    e.set_step(step);
    e.mutable_session_log()->set_status(tensorboard::SessionLog::START);
    return e.SerializeAsString();
}

std::string tensorboard_scalars_event(int64_t step, double wall_time,
                                      const std::vector<TensorBoardScalar>& scalars) {
    tensorboard::Event e;
    e.set_wall_time(wall_time);
    e.set_step(step);
    tensorboard::Summary* summary = e.mutable_summary();
    for (const TensorBoardScalar& s : scalars) {
        tensorboard::Summary::Value* v = summary->add_value();
        v->set_tag(s.tag);
        v->set_simple_value(s.value);
    }
    return e.SerializeAsString();
}

Result<TensorBoardWriter> TensorBoardWriter::open(const std::string& dir, int64_t start_step) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) return io_error("{}: cannot create the folder: {}", dir, ec.message());
    const double now = unix_now();
    // The name's seconds: now, or one past the newest events file's, so that names sort in the
    // order the files were written.
    int64_t seconds = int64_t(now);
    for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
        const std::string name = entry.path().filename().string();
        constexpr std::string_view kPrefix = "events.out.tfevents.";
        if (!name.starts_with(kPrefix)) continue;
        int64_t t = 0;
        size_t i = kPrefix.size();
        for (; i < name.size() && name[i] >= '0' && name[i] <= '9'; ++i)
            t = t * 10 + (name[i] - '0');
        if (i > kPrefix.size()) seconds = std::max(seconds, t + 1);
    }
    if (ec) return io_error("{}: cannot list the folder: {}", dir, ec.message());
    const std::string stem =
        (std::filesystem::path(dir) / ("events.out.tfevents." + std::to_string(seconds) + "." +
                                       host_name() + "." + std::to_string(::getpid())))
            .string();
    TensorBoardWriter w;
    // "x": never append to a file of another writer (a second open in the same second).
    for (int n = 0; w.file_ == nullptr; ++n) {
        w.path_ = stem + (n == 0 ? std::string() : "." + std::to_string(n)) + ".lathe";
        w.file_ = std::fopen(w.path_.c_str(), "wbx");
        if (w.file_ == nullptr && (errno != EEXIST || n >= 100))
            return io_error("{}: cannot create: {}", w.path_, std::strerror(errno));
    }
    LATHE_RETURN_IF_ERROR(w.append(tensorboard_version_event(now)));
    LATHE_RETURN_IF_ERROR(w.append(tensorboard_start_event(start_step, now)));
    return w;
}

TensorBoardWriter::TensorBoardWriter(TensorBoardWriter&& other) noexcept
    : path_(std::move(other.path_)), file_(std::exchange(other.file_, nullptr)) {}

TensorBoardWriter& TensorBoardWriter::operator=(TensorBoardWriter&& other) noexcept {
    if (this != &other) {
        if (file_ != nullptr) std::fclose(file_);
        path_ = std::move(other.path_);
        file_ = std::exchange(other.file_, nullptr);
    }
    return *this;
}

TensorBoardWriter::~TensorBoardWriter() {
    if (file_ != nullptr) std::fclose(file_);
}

Status TensorBoardWriter::write_scalars(int64_t step,
                                        const std::vector<TensorBoardScalar>& scalars) {
    return append(tensorboard_scalars_event(step, unix_now(), scalars));
}

Status TensorBoardWriter::append(const std::string& event) {
    LATHE_CHECK(file_ != nullptr, "TensorBoardWriter used before open()");
    const std::string record = tfrecord_frame(event);
    if (std::fwrite(record.data(), 1, record.size(), file_) != record.size() ||
        std::fflush(file_) != 0)
        return io_error("{}: cannot write: {}", path_, std::strerror(errno));
    return ok_status();
}

}  // namespace lathe
