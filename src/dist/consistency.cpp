#include "dist/consistency.h"

#include <fmt/ranges.h>
#include <unistd.h>

#include <cstring>
#include <system_error>
#include <vector>

#include "core/hash.h"
#include "dist/host_collectives.h"
#include "io/file.h"

namespace lathe {

namespace {

// What every rank sends first: its key list's fingerprint and its host name.
struct KeysRecord {
    uint64_t keys_hash = 0;
    uint64_t key_count = 0;
    char host[kHostNameBytes] = {};
};
static_assert(std::is_trivially_copyable_v<KeysRecord>);

constexpr std::string_view kWhatToDo =
    "every rank must run the same lathe binary, configuration and data";

uint64_t keys_hash(std::span<const RankItem> items) {
    std::string names;
    for (const RankItem& item : items) {
        names += item.key;
        names += '\0';  // "ab","c" and "a","bc" differ
    }
    return hash_bytes(names);
}

std::string host_of(const KeysRecord& r) {
    return std::string(r.host, strnlen(r.host, kHostNameBytes));
}

std::string hex(uint64_t h) {
    return fmt::format("{:#018x}", h);
}

std::string rank_on(int rank, const KeysRecord& r) {
    return fmt::format("rank {} on {}", rank, host_of(r));
}

// Appends the ranks beyond the first one named: "; also rank 2 on h (config), ...", at most
// kMaxRanksNamed in all, then how many more.
void append_others(std::string& message, const std::vector<std::string>& others) {
    if (others.empty()) return;
    message += "; also";
    const size_t named = std::min(others.size(), size_t(kMaxRanksNamed - 1));
    for (size_t i = 0; i < named; ++i) message += (i == 0 ? " " : ", ") + others[i];
    if (others.size() > named) message += fmt::format(" and {} more ranks", others.size() - named);
}

}  // namespace

std::string host_name() {
    char buf[256] = {};
    if (::gethostname(buf, sizeof buf - 1) != 0 || buf[0] == '\0') return "?";
    return buf;
}

Status check_same_across_ranks(Communicator& comm, std::span<const RankItem> items,
                               CUstream_st* stream) {
    KeysRecord mine;
    mine.keys_hash = keys_hash(items);
    mine.key_count = items.size();
    const std::string host = host_name();
    std::memcpy(mine.host, host.data(), std::min(host.size(), kHostNameBytes - 1));
    LATHE_ASSIGN_OR_RETURN(std::vector<KeysRecord> records, all_gather_value(comm, mine, stream));

    const KeysRecord& first = records[0];
    std::string message;
    std::vector<std::string> others;
    for (int r = 1; r < comm.size(); ++r) {
        const KeysRecord& rec = records[size_t(r)];
        if (rec.keys_hash == first.keys_hash && rec.key_count == first.key_count) continue;
        if (message.empty())
            message = fmt::format(
                "parallel: {} checks other keys ({}) than {} ({}); {} (a different key list "
                "means a different lathe binary or configuration)",
                rank_on(r, rec), rec.key_count, rank_on(0, first), first.key_count, kWhatToDo);
        else
            others.push_back(rank_on(r, rec));
    }
    if (!message.empty()) {
        append_others(message, others);
        return failed_precondition_error("{}", message);
    }

    // Every rank has the same keys: compare the hashes.
    const size_t n = items.size();
    std::vector<uint64_t> hashes(n), all(n * size_t(comm.size()));
    for (size_t i = 0; i < n; ++i) hashes[i] = items[i].hash;
    LATHE_RETURN_IF_ERROR(all_gather_values<uint64_t>(comm, hashes, all, stream));
    for (int r = 1; r < comm.size(); ++r) {
        std::vector<std::string> keys, values;
        for (size_t i = 0; i < n; ++i) {
            const uint64_t theirs = all[size_t(r) * n + i];
            if (theirs == all[i]) continue;
            keys.push_back(items[i].key);
            values.push_back(fmt::format("{}: {} on rank 0, {} on rank {}", items[i].key,
                                         hex(all[i]), hex(theirs), r));
        }
        if (keys.empty()) continue;
        if (message.empty())
            message = fmt::format("parallel: {} has a different {} than {}; {} ({})",
                                  rank_on(r, records[size_t(r)]), fmt::join(keys, ", "),
                                  rank_on(0, first), kWhatToDo, fmt::join(values, "; "));
        else
            others.push_back(
                fmt::format("{} ({})", rank_on(r, records[size_t(r)]), fmt::join(keys, ", ")));
    }
    if (message.empty()) return ok_status();
    append_others(message, others);
    return failed_precondition_error("{}", message);
}

Result<uint64_t> file_content_hash(const std::filesystem::path& path) {
    std::error_code ec;
    const auto status = std::filesystem::status(path, ec);
    if (ec || !std::filesystem::exists(status))
        return not_found_error("{}: no such file (hashed to check that every rank reads the same)",
                               path.string());
    if (!std::filesystem::is_regular_file(status))
        return invalid_argument_error(
            "{}: not a regular file (hashed to check that every rank "
            "reads the same)",
            path.string());
    LATHE_ASSIGN_OR_RETURN(MappedFile file, MappedFile::open(path.string()));
    return hash_bytes(file.view());
}

}  // namespace lathe
