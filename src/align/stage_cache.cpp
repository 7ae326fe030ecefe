#include "align/stage_cache.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <system_error>

#include "core/hash.h"
#include "core/log.h"
#include "io/file.h"
#include "io/json.h"

namespace lathe {
namespace {

// Bumped when the canonical text or the manifest layout changes, so old manifests stop matching.
constexpr int kManifestFormat = 1;

struct FileStat {
    uint64_t size = 0;
    int64_t mtime_ns = 0;
    bool is_dir = false;
    bool is_regular = false;
};

Result<FileStat> stat_path(const std::string& path) {
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) {
        const int err = errno;
        if (err == ENOENT) return not_found_error("{}: no such file or folder", path);
        return io_error("{}: cannot stat: {}", path, std::strerror(err));
    }
    FileStat s;
    s.size = static_cast<uint64_t>(st.st_size);
    s.mtime_ns = int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec;
    s.is_dir = S_ISDIR(st.st_mode);
    s.is_regular = S_ISREG(st.st_mode);
    return s;
}

std::string absolute_path(const std::string& path) {
    std::error_code ec;
    auto abs = std::filesystem::absolute(path, ec);
    if (ec) return path;
    return abs.lexically_normal().string();
}

std::string utc_now_iso8601() {
    const std::time_t now = std::time(nullptr);
    std::tm tm{};
    gmtime_r(&now, &tm);
    char buf[32];
    std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
    return buf;
}

// Settings and input roles are written by code, not users, but keep the canonical text
// unambiguous anyway: one entry per line, so a newline inside a value is escaped.
std::string escape_line(std::string_view s) {
    std::string out;
    out.reserve(s.size());
    for (char c : s) {
        if (c == '\\') {
            out += "\\\\";
        } else if (c == '\n') {
            out += "\\n";
        } else {
            out += c;
        }
    }
    return out;
}

}  // namespace

std::string stage_hash_hex(std::string_view bytes) {
    // Two seeds of core/hash.h's hash: 128 bits.
    const uint64_t a = hash_bytes(bytes, kHashSeed);
    const uint64_t b = hash_bytes(bytes, 0x8CB92BA72F3D8DD7ull);
    return fmt::format("{:016x}{:016x}", a, b);
}

StageFingerprint::StageFingerprint(std::string stage) : stage_(std::move(stage)) {
    canonical_ = fmt::format("lathe-stage {}\nstage {}\n", kManifestFormat, escape_line(stage_));
}

void StageFingerprint::add_setting(std::string_view key, std::string_view value) {
    canonical_ += fmt::format("setting {}={}\n", escape_line(key), escape_line(value));
    settings_.emplace_back(std::string(key), std::string(value));
}

void StageFingerprint::add_setting(std::string_view key, int64_t value) {
    add_setting(key, std::string_view(fmt::format("{}", value)));
}

void StageFingerprint::add_setting(std::string_view key, uint64_t value) {
    add_setting(key, std::string_view(fmt::format("{}", value)));
}

void StageFingerprint::add_setting(std::string_view key, double value) {
    add_setting(key, std::string_view(fmt::format("{:.17g}", value)));
}

void StageFingerprint::add_setting(std::string_view key, bool value) {
    add_setting(key, std::string_view(value ? "true" : "false"));
}

Status StageFingerprint::add_file(std::string_view role, const std::string& shown_path,
                                  const std::string& path) {
    LATHE_ASSIGN_OR_RETURN(FileStat st, stat_path(path));
    nlohmann::json entry;
    entry["role"] = std::string(role);
    entry["path"] = absolute_path(path);
    entry["size"] = st.size;
    if (st.size <= kContentHashMaxBytes) {
        LATHE_ASSIGN_OR_RETURN(std::string bytes, file_read_all(path));
        const std::string h = stage_hash_hex(bytes);
        canonical_ += fmt::format("input {} {} content {} {}\n", escape_line(role),
                                  escape_line(shown_path), bytes.size(), h);
        entry["content_hash"] = h;
    } else {
        canonical_ +=
            fmt::format("input {} {} file {} {} {}\n", escape_line(role), escape_line(shown_path),
                        absolute_path(path), st.size, st.mtime_ns);
        entry["mtime_ns"] = st.mtime_ns;
    }
    if (!inputs_json_.empty()) inputs_json_ += ",";
    inputs_json_ += entry.dump();
    return ok_status();
}

Status StageFingerprint::add_input(std::string_view role, const std::string& path) {
    auto st = stat_path(path);
    if (!st.ok()) return st.status().with_context(fmt::format("input '{}'", role));
    if (!st->is_dir) {
        // The shown path of a single file is "" so that only role + content (or abs path) count.
        Status s = add_file(role, "", path);
        return s.ok() ? s : s.with_context(fmt::format("input '{}'", role));
    }
    std::vector<std::string> files;
    std::error_code ec;
    for (auto it = std::filesystem::recursive_directory_iterator(path, ec);
         !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
        if (it->is_regular_file(ec)) {
            files.push_back(std::filesystem::relative(it->path(), path, ec).string());
        }
    }
    if (ec) return io_error("input '{}': {}: cannot list the folder: {}", role, path, ec.message());
    std::sort(files.begin(), files.end());
    canonical_ += fmt::format("folder {} {}\n", escape_line(role), files.size());
    for (const std::string& rel : files) {
        Status s = add_file(role, rel, (std::filesystem::path(path) / rel).string());
        if (!s.ok()) return s.with_context(fmt::format("input '{}'", role));
    }
    return ok_status();
}

std::string StageFingerprint::digest() const {
    return stage_hash_hex(canonical_);
}

std::string StageFingerprint::description_json() const {
    nlohmann::ordered_json settings = nlohmann::ordered_json::object();
    for (const auto& [k, v] : settings_) settings[k] = v;
    return fmt::format("{{\"settings\":{},\"inputs\":[{}]}}", settings.dump(), inputs_json_);
}

std::string stage_manifest_path(const std::string& primary_output) {
    return primary_output + ".stage.json";
}

bool stage_up_to_date(const std::string& primary_output, const StageFingerprint& fingerprint) {
    const std::string manifest_path = stage_manifest_path(primary_output);
    const std::string& stage = fingerprint.stage();
    if (!file_exists(manifest_path)) {
        log_debug("{}: no manifest {}, running", stage, manifest_path);
        return false;
    }
    auto text = file_read_all(manifest_path);
    if (!text.ok()) {
        log_debug("{}: {}, running", stage, text.status().to_string());
        return false;
    }
    try {
        const nlohmann::json m = json_parse<nlohmann::json>(*text);  // discarded: .at() throws
        if (m.at("format").get<int>() != kManifestFormat ||
            m.at("stage").get<std::string>() != stage) {
            log_debug("{}: {} is for another stage or format, running", stage, manifest_path);
            return false;
        }
        if (m.at("fingerprint").get<std::string>() != fingerprint.digest()) {
            log_info(
                "{}: inputs or settings changed since {} (see its \"settings\" and "
                "\"inputs\"), running",
                stage, manifest_path);
            return false;
        }
        const auto& outputs = m.at("outputs");
        if (!outputs.is_array() || outputs.empty()) return false;
        for (const auto& o : outputs) {
            const std::string path = o.at("path").get<std::string>();
            auto st = stat_path(path);
            if (!st.ok() || st->size != o.at("size").get<uint64_t>() ||
                st->mtime_ns != o.at("mtime_ns").get<int64_t>()) {
                log_info("{}: output {} is missing or changed since {}, running", stage, path,
                         manifest_path);
                return false;
            }
        }
    } catch (const nlohmann::json::exception& e) {
        log_debug("{}: {}: unreadable manifest ({}), running", stage, manifest_path, e.what());
        return false;
    }
    log_info("{}: outputs up to date ({}), skipped; --force reruns", stage, manifest_path);
    return true;
}

Status stage_write_manifest(const std::string& primary_output, const StageFingerprint& fingerprint,
                            const std::vector<std::string>& outputs) {
    nlohmann::ordered_json m;
    m["stage"] = fingerprint.stage();
    m["format"] = kManifestFormat;
    m["fingerprint"] = fingerprint.digest();
    m["lathe_version"] = LATHE_VERSION_STRING;
    m["created"] = utc_now_iso8601();
    const auto desc = nlohmann::ordered_json::parse(fingerprint.description_json());
    m["settings"] = desc.at("settings");
    m["inputs"] = desc.at("inputs");
    m["outputs"] = nlohmann::ordered_json::array();
    for (const std::string& path : outputs) {
        auto st = stat_path(path);
        if (!st.ok()) {
            return failed_precondition_error("{}: cannot record output {} in the manifest: {}",
                                             fingerprint.stage(), path, st.status().message());
        }
        m["outputs"].push_back(
            {{"path", absolute_path(path)}, {"size", st->size}, {"mtime_ns", st->mtime_ns}});
    }
    return file_write_atomic(stage_manifest_path(primary_output), m.dump(2) + "\n");
}

}  // namespace lathe
