#include "run/checkpoint_dir.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <system_error>

#include "io/file.h"

namespace fs = std::filesystem;

namespace lathe {
namespace {

constexpr const char* kStepPrefix = "step-";
constexpr const char* kPartialPrefix = ".partial-";

std::optional<int64_t> parse_step_digits(const std::string& name) {
    if (name.rfind(kStepPrefix, 0) != 0) return std::nullopt;
    const std::string digits = name.substr(5);
    if (digits.empty() || !std::all_of(digits.begin(), digits.end(), ::isdigit)) return std::nullopt;
    return std::stoll(digits);
}

// fsync on a directory makes renames inside it durable.
void sync_dir(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        ::fsync(fd);
        ::close(fd);
    }
}

}  // namespace

std::optional<int64_t> CheckpointDir::parse_step_name(const std::string& name) {
    return parse_step_digits(name);
}

std::string CheckpointDir::step_name(int64_t step) { return fmt::format("{}{:08d}", kStepPrefix, step); }

Result<CheckpointDir> CheckpointDir::open(const std::string& root) {
    std::error_code ec;
    fs::create_directories(root, ec);
    if (ec) return io_error("{}: cannot create checkpoint folder: {}", root, ec.message());
    for (const auto& entry : fs::directory_iterator(root, ec)) {
        const std::string name = entry.path().filename().string();
        if (name.rfind(kPartialPrefix, 0) == 0) fs::remove_all(entry.path(), ec);
    }
    if (ec) return io_error("{}: cannot list: {}", root, ec.message());
    CheckpointDir d;
    d.root_ = root;
    return d;
}

Result<std::vector<int64_t>> CheckpointDir::complete_steps() const {
    std::vector<int64_t> steps;
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(root_, ec)) {
        if (!entry.is_directory()) continue;
        if (auto s = parse_step_name(entry.path().filename().string())) steps.push_back(*s);
    }
    if (ec) return io_error("{}: cannot list: {}", root_, ec.message());
    std::sort(steps.begin(), steps.end());
    return steps;
}

Result<std::optional<std::string>> CheckpointDir::newest() const {
    LATHE_ASSIGN_OR_RETURN(std::vector<int64_t> steps, complete_steps());
    if (steps.empty()) return std::optional<std::string>();
    return std::optional<std::string>((fs::path(root_) / step_name(steps.back())).string());
}

Result<std::string> CheckpointDir::begin(int64_t step) const {
    const fs::path partial = fs::path(root_) / (std::string(kPartialPrefix) + step_name(step));
    std::error_code ec;
    fs::remove_all(partial, ec);
    fs::create_directories(partial, ec);
    if (ec) return io_error("{}: cannot create: {}", partial.string(), ec.message());
    return partial.string();
}

Result<std::string> CheckpointDir::commit(int64_t step, int keep_last) const {
    const fs::path partial = fs::path(root_) / (std::string(kPartialPrefix) + step_name(step));
    const fs::path final_path = fs::path(root_) / step_name(step);
    std::error_code ec;
    if (!fs::is_directory(partial, ec)) {
        return failed_precondition_error("{}: commit without begin for step {}", root_, step);
    }
    sync_dir(partial.string());
    if (fs::exists(final_path, ec)) {
        // Same step written again (e.g. SIGTERM right after an interval save): replace it.
        const fs::path old = fs::path(root_) / (std::string(kPartialPrefix) + "old-" + step_name(step));
        fs::rename(final_path, old, ec);
        if (ec) return io_error("{}: cannot move aside: {}", final_path.string(), ec.message());
        fs::rename(partial, final_path, ec);
        if (ec) return io_error("{}: cannot publish: {}", final_path.string(), ec.message());
        fs::remove_all(old, ec);
    } else {
        fs::rename(partial, final_path, ec);
        if (ec) return io_error("{}: cannot publish: {}", final_path.string(), ec.message());
    }
    sync_dir(root_);
    LATHE_RETURN_IF_ERROR(file_write_atomic((fs::path(root_) / "latest").string(), step_name(step) + "\n"));
    if (keep_last > 0) {
        LATHE_ASSIGN_OR_RETURN(std::vector<int64_t> steps, complete_steps());
        const size_t keep = static_cast<size_t>(keep_last);
        for (size_t i = 0; i + keep < steps.size(); ++i) {
            if (steps[i] == step) continue;  // never prune what was just written
            fs::remove_all(fs::path(root_) / step_name(steps[i]), ec);
            if (ec) return io_error("{}: cannot prune: {}", step_name(steps[i]), ec.message());
        }
    }
    return final_path.string();
}

}  // namespace lathe
