#pragma once
// Shared by tests: files under a folder of the system's temporary directory named for the test
// program and its process id, so that concurrent runs of a test do not share files.

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

namespace lathe::testutil {

class TempFiles {
public:
    // The folder TMP/PREFIX_PID (created on first use).
    explicit TempFiles(const std::string& prefix)
        : dir_(std::filesystem::temp_directory_path() /
               (prefix + "_" + std::to_string(::getpid()))) {}

    // The path of `name` in the folder, the folder created.
    std::string path(const std::string& name) const {
        std::filesystem::create_directories(dir_);
        return (dir_ / name).string();
    }

    // Writes `bytes` to `name` in the folder and returns its path.
    std::string write(const std::string& name, const std::string& bytes) const {
        const std::string p = path(name);
        std::ofstream(p, std::ios::binary) << bytes;
        return p;
    }

private:
    std::filesystem::path dir_;
};

// The bytes of the file at `path` ("" when it does not open).
inline std::string read_whole_file(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {});
}

}  // namespace lathe::testutil
