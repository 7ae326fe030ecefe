#include "io/input.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>
#include <vector>

namespace lathe {

namespace {

constexpr size_t kRawBufferBytes = size_t{256} << 10;
constexpr size_t kLineChunkBytes = size_t{1} << 20;
// Enough leading bytes to recognise every magic number below (bzip2's is the longest).
constexpr size_t kSniffBytes = 10;
// How often a blocked read on a pipe looks at the cancel flag.
constexpr int kPollIntervalMs = 200;

bool has_prefix(const char* p, size_t n, std::initializer_list<unsigned char> magic) {
    if (n < magic.size()) return false;
    size_t i = 0;
    for (unsigned char b : magic) {
        if (static_cast<unsigned char>(p[i++]) != b) return false;
    }
    return true;
}

}  // namespace

const char* input_compression_name(InputCompression c) {
    switch (c) {
        case InputCompression::kNone:
            return "none";
        case InputCompression::kGzip:
            return "gzip";
        case InputCompression::kZstd:
            return "zstd";
    }
    return "?";
}

struct InputStream::Impl {
    std::string name;
    int fd = -1;
    bool owns_fd = false;
    bool is_regular = false;
    uint64_t raw_size = 0;
    const std::atomic<bool>* cancel = nullptr;
    InputCompression compression = InputCompression::kNone;

    std::vector<char> raw;  // [rpos, rend) not yet consumed
    size_t rpos = 0;
    size_t rend = 0;
    bool raw_eof = false;
    uint64_t raw_read = 0;
    uint64_t out_bytes = 0;
    bool done = false;

    z_stream zs{};
    bool zs_ready = false;
    bool gz_between_members = false;

    ZSTD_DStream* zds = nullptr;
    bool zstd_frame_open = false;

    ~Impl() {
        if (zs_ready) inflateEnd(&zs);
        if (zds != nullptr) ZSTD_freeDStream(zds);
        if (owns_fd && fd >= 0) ::close(fd);
    }

    bool cancelled() const { return cancel != nullptr && cancel->load(std::memory_order_relaxed); }

    // Reads more raw bytes after rend (compacting first); sets raw_eof at the end of the file.
    Status fill_raw() {
        if (raw_eof) return ok_status();
        if (rpos == rend) {
            rpos = rend = 0;
        } else if (rend == raw.size()) {
            std::memmove(raw.data(), raw.data() + rpos, rend - rpos);
            rend -= rpos;
            rpos = 0;
        }
        for (;;) {
            if (cancelled()) return cancelled_error("{}: reading stopped (interrupted)", name);
            if (!is_regular) {
                // Pipes and terminals: wait in short slices so a cancel request is seen promptly.
                pollfd pfd{fd, POLLIN, 0};
                const int pr = ::poll(&pfd, 1, kPollIntervalMs);
                if (pr == 0) continue;
                if (pr < 0 && errno != EINTR) {
                    return io_error("{}: cannot wait for input: {}", name, std::strerror(errno));
                }
                if (pr < 0) continue;
            }
            const ssize_t n = ::read(fd, raw.data() + rend, raw.size() - rend);
            if (n < 0) {
                if (errno == EINTR || errno == EAGAIN) continue;
                return io_error("{}: read failed after {} bytes: {}", name, raw_read,
                                std::strerror(errno));
            }
            if (n == 0) raw_eof = true;
            rend += static_cast<size_t>(n);
            raw_read += static_cast<uint64_t>(n);
            return ok_status();
        }
    }

    Result<size_t> read_plain(char* dst, size_t capacity) {
        if (rpos == rend) {
            LATHE_RETURN_IF_ERROR(fill_raw());
            if (rpos == rend) {
                done = true;
                return size_t{0};
            }
        }
        const size_t n = std::min(capacity, rend - rpos);
        std::memcpy(dst, raw.data() + rpos, n);
        rpos += n;
        return n;
    }

    Result<size_t> read_gzip(char* dst, size_t capacity) {
        zs.next_out = reinterpret_cast<Bytef*>(dst);
        zs.avail_out = static_cast<uInt>(std::min<size_t>(capacity, 1u << 30));
        const uInt out_capacity = zs.avail_out;
        while (zs.avail_out > 0) {
            if (rpos == rend) {
                LATHE_RETURN_IF_ERROR(fill_raw());
                if (rpos == rend) {
                    if (gz_between_members) {
                        done = true;
                        break;
                    }
                    return data_loss_error(
                        "{}: truncated gzip data: the stream ends inside a member, after {} "
                        "compressed bytes (an incomplete download or copy?)",
                        name, raw_read);
                }
            }
            if (gz_between_members) {
                // gzip -d reads concatenated members as one stream and ignores zero padding.
                const unsigned char b = static_cast<unsigned char>(raw[rpos]);
                if (b == 0) {
                    ++rpos;
                    continue;
                }
                if (b != 0x1f) {
                    return data_loss_error(
                        "{}: unexpected data after the end of the gzip stream at compressed byte "
                        "{} (not another gzip member)",
                        name, raw_read - (rend - rpos));
                }
                if (inflateReset(&zs) != Z_OK) {
                    return internal_error("{}: zlib inflateReset failed", name);
                }
                gz_between_members = false;
            }
            zs.next_in = reinterpret_cast<Bytef*>(raw.data() + rpos);
            zs.avail_in = static_cast<uInt>(rend - rpos);
            const int ret = inflate(&zs, Z_NO_FLUSH);
            rpos = rend - zs.avail_in;
            if (ret == Z_STREAM_END) {
                gz_between_members = true;
            } else if (ret == Z_OK || ret == Z_BUF_ERROR) {
                continue;
            } else {
                return data_loss_error("{}: corrupt gzip data near compressed byte {}: {}", name,
                                       raw_read - (rend - rpos),
                                       zs.msg != nullptr ? zs.msg : "inflate failed");
            }
        }
        return static_cast<size_t>(out_capacity - zs.avail_out);
    }

    Result<size_t> read_zstd(char* dst, size_t capacity) {
        ZSTD_outBuffer out{dst, capacity, 0};
        while (out.pos < out.size) {
            if (rpos == rend) LATHE_RETURN_IF_ERROR(fill_raw());
            if (rpos == rend && raw_eof && !zstd_frame_open) {
                done = true;
                break;
            }
            ZSTD_inBuffer in{raw.data() + rpos, rend - rpos, 0};
            const size_t out_before = out.pos;
            const size_t ret = ZSTD_decompressStream(zds, &out, &in);
            rpos += in.pos;
            if (ZSTD_isError(ret)) {
                return data_loss_error("{}: corrupt zstd data near compressed byte {}: {}", name,
                                       raw_read - (rend - rpos), ZSTD_getErrorName(ret));
            }
            zstd_frame_open = ret != 0;
            if (in.pos == 0 && out.pos == out_before && rpos == rend && raw_eof) {
                return data_loss_error(
                    "{}: truncated zstd data: the stream ends inside a frame, after {} "
                    "compressed bytes (an incomplete download or copy?)",
                    name, raw_read);
            }
        }
        return out.pos;
    }
};

InputStream::InputStream(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
InputStream::InputStream(InputStream&&) noexcept = default;
InputStream& InputStream::operator=(InputStream&&) noexcept = default;
InputStream::~InputStream() = default;

Result<InputStream> InputStream::open(const std::string& path, const InputOptions& options) {
    auto impl = std::make_unique<Impl>();
    impl->cancel = options.cancel;
    if (path == kStdinPath) {
        impl->name = "<stdin>";
        impl->fd = STDIN_FILENO;
        impl->owns_fd = false;
    } else {
        impl->name = path;
        impl->fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
        if (impl->fd < 0) {
            if (errno == ENOENT) return not_found_error("{}: no such file", path);
            return io_error("{}: cannot open: {}", path, std::strerror(errno));
        }
        impl->owns_fd = true;
    }
    struct stat st {};
    if (::fstat(impl->fd, &st) != 0) {
        return io_error("{}: cannot stat: {}", impl->name, std::strerror(errno));
    }
    if (S_ISDIR(st.st_mode)) {
        return invalid_argument_error("{}: is a directory, expected a file", impl->name);
    }
    impl->is_regular = S_ISREG(st.st_mode);
    impl->raw_size = impl->is_regular ? static_cast<uint64_t>(st.st_size) : 0;
    impl->raw.resize(kRawBufferBytes);

    while (impl->rend - impl->rpos < kSniffBytes && !impl->raw_eof) {
        LATHE_RETURN_IF_ERROR(impl->fill_raw());
    }
    const char* head = impl->raw.data() + impl->rpos;
    const size_t n = impl->rend - impl->rpos;
    const bool zstd_skippable = n >= 4 && (static_cast<unsigned char>(head[0]) & 0xf0) == 0x50 &&
                                has_prefix(head + 1, n - 1, {0x2a, 0x4d, 0x18});
    if (has_prefix(head, n, {0x1f, 0x8b})) {
        impl->compression = InputCompression::kGzip;
        // 15 + 16: a 32 KiB window, gzip wrapper only.
        if (inflateInit2(&impl->zs, 15 + 16) != Z_OK) {
            return internal_error("{}: zlib inflateInit2 failed", impl->name);
        }
        impl->zs_ready = true;
    } else if (has_prefix(head, n, {0x28, 0xb5, 0x2f, 0xfd}) || zstd_skippable) {
        impl->compression = InputCompression::kZstd;
        impl->zds = ZSTD_createDStream();
        if (impl->zds == nullptr)
            return internal_error("{}: ZSTD_createDStream failed", impl->name);
        const size_t r = ZSTD_initDStream(impl->zds);
        if (ZSTD_isError(r)) {
            return internal_error("{}: ZSTD_initDStream: {}", impl->name, ZSTD_getErrorName(r));
        }
    } else if (has_prefix(head, n, {0xfd, '7', 'z', 'X', 'Z', 0x00})) {
        return unimplemented_error(
            "{}: is xz-compressed, which lathe does not read; decompress it (xz -dc) or "
            "recompress with gzip or zstd",
            impl->name);
    } else if (n >= 10 && has_prefix(head, n, {'B', 'Z', 'h'}) && head[3] >= '1' &&
               head[3] <= '9' &&
               has_prefix(head + 4, n - 4, {0x31, 0x41, 0x59, 0x26, 0x53, 0x59})) {
        return unimplemented_error(
            "{}: is bzip2-compressed, which lathe does not read; decompress it (bzip2 -dc) or "
            "recompress with gzip or zstd",
            impl->name);
    }
    return InputStream(std::move(impl));
}

Result<size_t> InputStream::read(char* dst, size_t capacity) {
    Impl& s = *impl_;
    if (s.done || capacity == 0) return size_t{0};
    Result<size_t> r = size_t{0};
    switch (s.compression) {
        case InputCompression::kNone:
            r = s.read_plain(dst, capacity);
            break;
        case InputCompression::kGzip:
            r = s.read_gzip(dst, capacity);
            break;
        case InputCompression::kZstd:
            r = s.read_zstd(dst, capacity);
            break;
    }
    if (r.ok()) s.out_bytes += *r;
    return r;
}

const std::string& InputStream::name() const {
    return impl_->name;
}
InputCompression InputStream::compression() const {
    return impl_->compression;
}
uint64_t InputStream::raw_bytes_read() const {
    return impl_->raw_read;
}
uint64_t InputStream::raw_size() const {
    return impl_->raw_size;
}
uint64_t InputStream::bytes_read() const {
    return impl_->out_bytes;
}

// ---- LineReader ----

LineReader::LineReader(InputStream& in, size_t max_line_bytes)
    : in_(in), max_line_bytes_(max_line_bytes) {}

Result<bool> LineReader::next(std::string_view& line) {
    const auto too_long = [&] {
        return invalid_argument_error(
            "{}:{}: line is longer than {} bytes (is this a text file? binary data or a file "
            "without line breaks cannot be read as lines)",
            in_.name(), line_number_ + 1, max_line_bytes_);
    };
    for (;;) {
        if (scan_ < end_) {
            const void* nl = std::memchr(buf_.data() + scan_, '\n', end_ - scan_);
            if (nl != nullptr) {
                const size_t at = static_cast<size_t>(static_cast<const char*>(nl) - buf_.data());
                if (at - begin_ > max_line_bytes_) return too_long();
                line = std::string_view(buf_.data() + begin_, at - begin_);
                begin_ = scan_ = at + 1;
                ++line_number_;
                return true;
            }
            scan_ = end_;
        }
        if (end_ - begin_ > max_line_bytes_) return too_long();
        if (eof_) {
            if (begin_ == end_) return false;
            line = std::string_view(buf_.data() + begin_, end_ - begin_);
            begin_ = scan_ = end_;
            ++line_number_;
            return true;
        }
        if (begin_ > 0) {  // keep only the unfinished line, at the front
            std::memmove(buf_.data(), buf_.data() + begin_, end_ - begin_);
            end_ -= begin_;
            scan_ -= begin_;
            begin_ = 0;
        }
        if (end_ == buf_.size()) {
            const size_t limit = max_line_bytes_ + kLineChunkBytes;
            buf_.resize(std::min(limit, std::max(kLineChunkBytes, buf_.size() * 2)));
        }
        LATHE_ASSIGN_OR_RETURN(const size_t n, in_.read(buf_.data() + end_, buf_.size() - end_));
        if (n == 0) eof_ = true;
        end_ += n;
    }
}

bool is_blank_line(std::string_view line) {
    for (char c : line) {
        if (c != ' ' && c != '\t' && c != '\r' && c != '\v' && c != '\f') return false;
    }
    return true;
}

// ---- TextRecordReader ----

TextRecordReader::TextRecordReader(InputStream& in, TextRecordFormat format,
                                   size_t max_record_bytes)
    : lines_(in, max_record_bytes), format_(format), max_record_bytes_(max_record_bytes) {}

Result<bool> TextRecordReader::next(TextRecord& record) {
    std::string_view line;
    if (format_ == TextRecordFormat::kLines) {
        LATHE_ASSIGN_OR_RETURN(const bool more, lines_.next(line));
        if (!more) return false;
        record.text = strip_cr(line);
        record.line = lines_.line_number();
        return true;
    }
    block_.clear();
    uint64_t first_line = 0;
    for (;;) {
        LATHE_ASSIGN_OR_RETURN(const bool more, lines_.next(line));
        if (!more) break;
        if (is_blank_line(line)) {
            if (first_line == 0) continue;
            break;
        }
        if (first_line == 0) {
            first_line = lines_.line_number();
        } else {
            block_.push_back('\n');  // the '\r' of a "\r\n" ending stays with the line before
        }
        if (block_.size() + line.size() > max_record_bytes_) {
            return invalid_argument_error("{}:{}: the block starting here is longer than {} bytes",
                                          name(), first_line, max_record_bytes_);
        }
        block_.append(line);
    }
    if (first_line == 0) return false;
    record.text = strip_cr(block_);
    record.line = first_line;
    return true;
}

}  // namespace lathe
