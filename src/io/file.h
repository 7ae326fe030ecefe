#pragma once
// Files: whole-file reads, read-only memory maps, atomic writes, and staged output folders.
//
// Every output lathe produces goes through AtomicFile: bytes land in "<path>.tmp-<pid>" and are
// renamed onto <path> only by commit(), after a flush and fsync. An error, an exception or a kill
// before commit() leaves nothing under the final name (the destructor removes the temporary).

#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <string_view>

#include "core/status.h"

namespace lathe {

// Reads a whole file. Errors name the path and the OS reason.
Result<std::string> file_read_all(const std::string& path);

// Size in bytes, or an error naming the path.
Result<uint64_t> file_size(const std::string& path);
bool file_exists(const std::string& path);

// An error when `output` names the same regular file as `input` (by the same path or another, a
// link included): the command would replace its input. Nothing when either does not exist, is
// "-", or the input is not a regular file (a FIFO or device is read and written in place).
Status check_output_is_not_input(std::string_view output_flag, const std::string& output,
                                 std::string_view input_flag, const std::string& input);

// Writes `data` to `path` atomically (AtomicFile underneath).
Status file_write_atomic(const std::string& path, std::string_view data);

// A read-only memory map of a whole file. Move-only; unmaps on destruction. An empty file maps to
// an empty view.
class MappedFile {
public:
    static Result<MappedFile> open(const std::string& path);
    MappedFile() = default;
    MappedFile(MappedFile&& other) noexcept;
    MappedFile& operator=(MappedFile&& other) noexcept;
    MappedFile(const MappedFile&) = delete;
    MappedFile& operator=(const MappedFile&) = delete;
    ~MappedFile();

    const uint8_t* data() const { return data_; }
    uint64_t size() const { return size_; }
    std::string_view view() const { return {reinterpret_cast<const char*>(data_), size_}; }
    const std::string& path() const { return path_; }

private:
    void release();
    std::string path_;
    const uint8_t* data_ = nullptr;
    uint64_t size_ = 0;
};

// A file written under a temporary name and renamed into place by commit(). An existing FIFO,
// device or socket at the path is written in place instead (no temporary: a rename would replace
// /dev/null or a pipe's reader's FIFO with a plain file); a folder is an error.
class AtomicFile {
public:
    // Creates "<path>.tmp-<pid>" for writing (buffered). Fails if the folder does not exist.
    static Result<AtomicFile> create(const std::string& path);
    AtomicFile() = default;
    AtomicFile(AtomicFile&& other) noexcept;
    AtomicFile& operator=(AtomicFile&& other) noexcept;
    AtomicFile(const AtomicFile&) = delete;
    AtomicFile& operator=(const AtomicFile&) = delete;
    ~AtomicFile();  // removes the temporary if commit() was not reached

    Status write(const void* data, size_t size);
    Status write(std::string_view data) { return write(data.data(), data.size()); }
    uint64_t bytes_written() const { return bytes_written_; }
    // Flushes, fsyncs and renames onto the final path. After this the object is empty.
    Status commit();
    const std::string& path() const { return path_; }
    const std::string& temp_path() const { return temp_path_; }

private:
    void abandon();
    std::string path_;
    std::string temp_path_;
    std::FILE* file_ = nullptr;
    uint64_t bytes_written_ = 0;
};

// fsync of a folder, so that the names created in it (renames included) are durable.
Status folder_sync(const std::string& dir);

// `what` at `path` (e.g. "OUTPUT_DIR", "--output") may become an output folder: it does not exist,
// or is an empty folder, or `overwrite` allows replacing a non-empty one. Errors say what to do.
Status output_folder_check(const std::string& path, bool overwrite, std::string_view what);

// Puts the finished folder `staging` in place as `final_path`: fsyncs `staging`; an empty folder
// at `final_path` is removed, a non-empty one is renamed to `aside` and deleted after the rename
// (so a crash leaves either the old folder or the new one under the final name); then fsyncs the
// parent folder.
Status folder_publish(const std::string& staging, const std::string& final_path,
                      const std::string& aside);

// An output folder written under a hidden staging sibling, ".NAME.partial-<pid>", and put in place
// by commit() (folder_publish, with ".NAME.old-<pid>" for an existing folder). The destructor
// removes the staging folder if commit() was not reached, so a failure leaves nothing behind.
class StagedFolder {
public:
    // Creates the staging folder beside `final_path` (and the folders above it), replacing a
    // leftover of the same name.
    static Result<StagedFolder> create(const std::string& final_path);
    StagedFolder() = default;
    StagedFolder(StagedFolder&& other) noexcept;
    StagedFolder& operator=(StagedFolder&& other) = delete;
    StagedFolder(const StagedFolder&) = delete;
    StagedFolder& operator=(const StagedFolder&) = delete;
    ~StagedFolder();

    // The staging folder, where the output is written.
    const std::string& path() const { return path_; }
    // `name` inside the staging folder.
    std::string file(std::string_view name) const;
    Status commit();

private:
    std::string final_, path_, aside_;
    bool active_ = false;
};

// An advisory lock on a file (flock(2), exclusive), held while the object lives: how one process
// says it owns a folder (`lathe train` its run folder) and others find out. The file keeps a line
// naming the holder; it is not removed on release (removing would race with the next holder). A
// process killed outright releases the lock with its file descriptors.
class FileLock {
public:
    // Takes the lock of `path` (created if missing) without waiting and writes `holder` into the
    // file. Errors: kFailedPrecondition when another open file holds it (the message is what that
    // holder wrote), kIoError naming the path when it cannot be opened.
    static Result<FileLock> try_exclusive(const std::string& path, std::string_view holder);
    // What the current holder of `path` wrote, or nullopt when nobody holds it (or it does not
    // exist). Takes and drops a shared lock to find out.
    static std::optional<std::string> holder(const std::string& path);

    FileLock() = default;
    FileLock(FileLock&& other) noexcept;
    FileLock& operator=(FileLock&& other) noexcept;
    FileLock(const FileLock&) = delete;
    FileLock& operator=(const FileLock&) = delete;
    ~FileLock();

private:
    int fd_ = -1;
};

}  // namespace lathe
