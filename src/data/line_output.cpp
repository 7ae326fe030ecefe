#include "data/line_output.h"

#include <cstdio>

#include "io/file.h"

namespace lathe {

LineOutput::LineOutput() = default;
LineOutput::LineOutput(LineOutput&&) noexcept = default;
LineOutput& LineOutput::operator=(LineOutput&&) noexcept = default;
LineOutput::~LineOutput() = default;

Result<LineOutput> LineOutput::open(const std::string& path) {
    LineOutput out;
    if (path != "-") {
        LATHE_ASSIGN_OR_RETURN(AtomicFile f, AtomicFile::create(path));
        out.file_ = std::make_unique<AtomicFile>(std::move(f));
    }
    return out;
}

Status LineOutput::write(std::string_view data) {
    if (file_) return file_->write(data);
    if (std::fwrite(data.data(), 1, data.size(), stdout) != data.size()) {
        return io_error("writing to standard output failed");
    }
    return ok_status();
}

Status LineOutput::commit() {
    if (file_) return file_->commit();
    if (std::fflush(stdout) != 0) return io_error("writing to standard output failed");
    return ok_status();
}

}  // namespace lathe
