#include "io/file.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <utility>

#include <fmt/format.h>

namespace lathe {

Result<std::string> file_read_all(const std::string& path) {
    std::FILE* f = std::fopen(path.c_str(), "rb");
    if (f == nullptr) {
        if (errno == ENOENT) return not_found_error("{}: no such file", path);
        return io_error("{}: cannot open: {}", path, std::strerror(errno));
    }
    std::string out;
    char buf[1 << 16];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) out.append(buf, n);
    const bool failed = std::ferror(f) != 0;
    std::fclose(f);
    if (failed) return io_error("{}: read failed", path);
    return out;
}

Result<uint64_t> file_size(const std::string& path) {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) {
        if (errno == ENOENT) return not_found_error("{}: no such file", path);
        return io_error("{}: cannot stat: {}", path, std::strerror(errno));
    }
    return static_cast<uint64_t>(st.st_size);
}

bool file_exists(const std::string& path) {
    struct stat st {};
    return ::stat(path.c_str(), &st) == 0;
}

Status file_write_atomic(const std::string& path, std::string_view data) {
    LATHE_ASSIGN_OR_RETURN(AtomicFile f, AtomicFile::create(path));
    LATHE_RETURN_IF_ERROR(f.write(data));
    return f.commit();
}

// ---- MappedFile ----

Result<MappedFile> MappedFile::open(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT) return not_found_error("{}: no such file", path);
        return io_error("{}: cannot open: {}", path, std::strerror(errno));
    }
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
        const int err = errno;
        ::close(fd);
        return io_error("{}: cannot stat: {}", path, std::strerror(err));
    }
    MappedFile m;
    m.path_ = path;
    m.size_ = static_cast<uint64_t>(st.st_size);
    if (m.size_ > 0) {
        void* p = ::mmap(nullptr, m.size_, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            const int err = errno;
            ::close(fd);
            return io_error("{}: cannot map: {}", path, std::strerror(err));
        }
        m.data_ = static_cast<const uint8_t*>(p);
    }
    ::close(fd);
    return m;
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : path_(std::move(other.path_)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
    if (this != &other) {
        release();
        path_ = std::move(other.path_);
        data_ = std::exchange(other.data_, nullptr);
        size_ = std::exchange(other.size_, 0);
    }
    return *this;
}

MappedFile::~MappedFile() {
    release();
}

void MappedFile::release() {
    if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
    data_ = nullptr;
    size_ = 0;
}

// ---- AtomicFile ----

Result<AtomicFile> AtomicFile::create(const std::string& path) {
    AtomicFile f;
    f.path_ = path;
    struct stat st {};
    if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
        if (S_ISDIR(st.st_mode))
            return invalid_argument_error("{}: is a folder; give a file path to write", path);
        // A FIFO, a device (/dev/null) or a socket: written in place, never replaced by a file.
        f.file_ = std::fopen(path.c_str(), "wb");
        if (f.file_ == nullptr) return io_error("{}: cannot open: {}", path, std::strerror(errno));
        return f;
    }
    f.temp_path_ = path + ".tmp-" + std::to_string(::getpid());
    f.file_ = std::fopen(f.temp_path_.c_str(), "wb");
    if (f.file_ == nullptr) {
        return io_error("{}: cannot create (as {}): {}", path, f.temp_path_, std::strerror(errno));
    }
    std::setvbuf(f.file_, nullptr, _IOFBF, 1 << 20);
    return f;
}

AtomicFile::AtomicFile(AtomicFile&& other) noexcept
    : path_(std::move(other.path_)),
      temp_path_(std::move(other.temp_path_)),
      file_(std::exchange(other.file_, nullptr)),
      bytes_written_(std::exchange(other.bytes_written_, 0)) {}

AtomicFile& AtomicFile::operator=(AtomicFile&& other) noexcept {
    if (this != &other) {
        abandon();
        path_ = std::move(other.path_);
        temp_path_ = std::move(other.temp_path_);
        file_ = std::exchange(other.file_, nullptr);
        bytes_written_ = std::exchange(other.bytes_written_, 0);
    }
    return *this;
}

AtomicFile::~AtomicFile() {
    abandon();
}

void AtomicFile::abandon() {
    if (file_ != nullptr) {
        std::fclose(file_);
        file_ = nullptr;
        if (!temp_path_.empty()) ::unlink(temp_path_.c_str());
    }
}

Status AtomicFile::write(const void* data, size_t size) {
    if (file_ == nullptr) return failed_precondition_error("{}: write after commit", path_);
    if (size > 0 && std::fwrite(data, 1, size, file_) != size) {
        return io_error("{}: write failed: {}", temp_path_.empty() ? path_ : temp_path_,
                        std::strerror(errno));
    }
    bytes_written_ += size;
    return ok_status();
}

Status AtomicFile::commit() {
    if (file_ == nullptr) return failed_precondition_error("{}: commit twice", path_);
    if (temp_path_.empty()) {  // a special file, written in place
        const bool flushed = std::fflush(file_) == 0;
        const int err = errno;
        std::fclose(file_);
        file_ = nullptr;
        if (!flushed) return io_error("{}: write failed: {}", path_, std::strerror(err));
        return ok_status();
    }
    if (std::fflush(file_) != 0 || ::fsync(::fileno(file_)) != 0) {
        const int err = errno;
        abandon();
        return io_error("{}: flush failed: {}", temp_path_, std::strerror(err));
    }
    std::fclose(file_);
    file_ = nullptr;
    if (::rename(temp_path_.c_str(), path_.c_str()) != 0) {
        const int err = errno;
        ::unlink(temp_path_.c_str());
        return io_error("{}: cannot rename from {}: {}", path_, temp_path_, std::strerror(err));
    }
    return ok_status();
}

Status check_output_is_not_input(std::string_view output_flag, const std::string& output,
                                 std::string_view input_flag, const std::string& input) {
    std::error_code ec;
    if (output.empty() || input.empty() || output == "-" || input == "-") return ok_status();
    // A FIFO or device (/dev/stdin and /dev/stdout on one terminal) is read and written in place.
    if (!std::filesystem::is_regular_file(input, ec)) return ok_status();
    if (!std::filesystem::equivalent(output, input, ec)) return ok_status();
    return invalid_argument_error(
        "{} {} is the {} file: writing it would replace the input; write the output elsewhere",
        output_flag, output, input_flag);
}

Status folder_sync(const std::string& dir) {
    const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return io_error("{}: cannot open to sync: {}", dir, std::strerror(errno));
    const int rc = ::fsync(fd);
    const int err = errno;
    ::close(fd);
    if (rc != 0) return io_error("{}: fsync failed: {}", dir, std::strerror(err));
    return ok_status();
}

namespace {

bool folder_is_empty(const std::filesystem::path& dir) {
    std::error_code ec;
    return std::filesystem::directory_iterator(dir, ec) == std::filesystem::directory_iterator();
}

}  // namespace

Status output_folder_check(const std::string& path, bool overwrite, std::string_view what) {
    namespace fs = std::filesystem;
    std::error_code ec;
    if (!fs::exists(path, ec)) return ok_status();
    if (!fs::is_directory(path, ec))
        return invalid_argument_error("{} {} exists and is not a folder", what, path);
    if (!folder_is_empty(path) && !overwrite)
        return invalid_argument_error(
            "{} {} exists and is not empty; choose a new folder or pass --overwrite to replace it",
            what, path);
    return ok_status();
}

Status folder_publish(const std::string& staging, const std::string& final_path,
                      const std::string& aside) {
    namespace fs = std::filesystem;
    LATHE_RETURN_IF_ERROR(folder_sync(staging));
    const fs::path final_dir(final_path);
    std::error_code ec;
    bool moved_aside = false;
    if (fs::exists(final_dir, ec)) {
        if (folder_is_empty(final_dir)) {
            fs::remove(final_dir, ec);
        } else {
            fs::remove_all(aside, ec);
            fs::rename(final_dir, aside, ec);
            moved_aside = !ec;
        }
        if (ec)
            return io_error("{}: cannot replace the existing folder: {}", final_path, ec.message());
    }
    fs::rename(staging, final_dir, ec);
    if (ec)
        return io_error("{}: cannot rename the finished output into place: {}", final_path,
                        ec.message());
    if (moved_aside) fs::remove_all(aside, ec);
    const fs::path parent = final_dir.parent_path();
    return folder_sync(parent.empty() ? std::string(".") : parent.string());
}

Result<StagedFolder> StagedFolder::create(const std::string& final_path) {
    namespace fs = std::filesystem;
    const fs::path final_dir(final_path);
    const fs::path parent = final_dir.parent_path();
    std::error_code ec;
    if (!parent.empty()) {
        fs::create_directories(parent, ec);
        if (ec) return io_error("{}: cannot create the folder: {}", parent.string(), ec.message());
    }
    const std::string name = final_dir.filename().string();
    StagedFolder s;
    s.final_ = final_path;
    s.path_ = (parent / fmt::format(".{}.partial-{}", name, ::getpid())).string();
    s.aside_ = (parent / fmt::format(".{}.old-{}", name, ::getpid())).string();
    fs::remove_all(s.path_, ec);
    if (!fs::create_directory(s.path_, ec) || ec)
        return io_error("{}: cannot create the staging folder: {}", s.path_,
                        ec ? ec.message() : std::string("it exists"));
    s.active_ = true;
    return s;
}

StagedFolder::StagedFolder(StagedFolder&& other) noexcept
    : final_(std::move(other.final_)),
      path_(std::move(other.path_)),
      aside_(std::move(other.aside_)),
      active_(other.active_) {
    other.active_ = false;
}

StagedFolder::~StagedFolder() {
    if (!active_) return;
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
}

std::string StagedFolder::file(std::string_view name) const {
    return (std::filesystem::path(path_) / name).string();
}

Status StagedFolder::commit() {
    if (!active_) return failed_precondition_error("{}: commit without a staging folder", final_);
    LATHE_RETURN_IF_ERROR(folder_publish(path_, final_, aside_));
    active_ = false;
    return ok_status();
}

Result<FileLock> FileLock::try_exclusive(const std::string& path, std::string_view holder) {
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return io_error("{}: cannot open: {}", path, std::strerror(errno));
    // A reader's probe (holder(): a shared lock for an instant) must not refuse a trainer: retry
    // for half a second before reporting the holder.
    int rc = -1, err = 0;
    for (int tries = 0; tries < 50; ++tries) {
        rc = ::flock(fd, LOCK_EX | LOCK_NB);
        err = errno;
        if (rc == 0 || err != EWOULDBLOCK) break;
        ::usleep(10'000);
    }
    if (rc != 0) {
        ::close(fd);
        if (err == EWOULDBLOCK) {
            Result<std::string> text = file_read_all(path);
            std::string by = text.ok() ? *text : std::string();
            while (!by.empty() && (by.back() == '\n' || by.back() == ' ')) by.pop_back();
            return failed_precondition_error("{}", by.empty() ? "another process" : by);
        }
        return io_error("{}: cannot lock: {}", path, std::strerror(err));
    }
    FileLock lock;
    lock.fd_ = fd;
    const std::string line = std::string(holder) + "\n";
    if (::ftruncate(fd, 0) != 0 ||
        ::pwrite(fd, line.data(), line.size(), 0) != ssize_t(line.size()))
        return io_error("{}: cannot write: {}", path, std::strerror(errno));
    return lock;
}

std::optional<std::string> FileLock::holder(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return std::nullopt;
    const bool held = ::flock(fd, LOCK_SH | LOCK_NB) != 0 && errno == EWOULDBLOCK;
    ::close(fd);  // drops the shared lock when it was taken
    if (!held) return std::nullopt;
    Result<std::string> text = file_read_all(path);
    std::string by = text.ok() ? *text : std::string();
    while (!by.empty() && (by.back() == '\n' || by.back() == ' ')) by.pop_back();
    return by;
}

FileLock::FileLock(FileLock&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}

FileLock& FileLock::operator=(FileLock&& other) noexcept {
    if (this != &other) {
        FileLock old;
        old.fd_ = std::exchange(fd_, std::exchange(other.fd_, -1));
    }
    return *this;
}

FileLock::~FileLock() {
    if (fd_ < 0) return;
    // Emptied before the lock goes, so that nobody quotes a holder that is gone.
    if (::ftruncate(fd_, 0) != 0) {
        // Nothing to do: the next holder rewrites the line.
    }
    ::close(fd_);
}

}  // namespace lathe
