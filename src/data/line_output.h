#pragma once
// Where the line-per-record commands (`lathe tokenize`, `lathe chat`) write: a file written
// atomically (nothing under its name until commit()), or standard output for "-".

#include <memory>
#include <string>
#include <string_view>

#include "core/status.h"

namespace lathe {

class AtomicFile;

class LineOutput {
public:
    // "-" is standard output; any other path is created as an AtomicFile (io/file.h).
    static Result<LineOutput> open(const std::string& path);
    LineOutput(LineOutput&&) noexcept;
    LineOutput& operator=(LineOutput&&) noexcept;
    ~LineOutput();  // a file that was not committed is removed

    Status write(std::string_view data);
    // Renames the file onto its path, or flushes standard output.
    Status commit();

private:
    LineOutput();
    std::unique_ptr<AtomicFile> file_;  // null for standard output
};

}  // namespace lathe
