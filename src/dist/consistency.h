#pragma once
// Checking at start that every rank runs the same thing: the same lathe binary, configuration and
// data. Each rank hashes what it runs into named items (RankItem: a key such as "binary", "config",
// "data index" and a 64-bit hash); check_same_across_ranks gathers every rank's items and host
// name (dist/host_collectives.h) and refuses a mismatch, naming the ranks, their hosts and the
// differing keys, on every rank alike (each sees every rank's items), so all ranks stop together.
//
// Two gathers: first each rank's key count, a hash of its key names and its host name (gethostname,
// cut to kHostNameBytes - 1 bytes); only when every rank has the same key list, the hashes. A
// different key list is itself a mismatch: the ranks run different binaries or configurations.
//
// Collective: every rank calls it at the same point; `stream` as in dist/host_collectives.h.

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>

#include "core/status.h"
#include "dist/communicator.h"

namespace lathe {

struct RankItem {
    std::string key;  // what was hashed, named for the message: "binary", "config", ...
    uint64_t hash = 0;
};

// The bytes of a host name as gathered, NUL included (longer names are cut).
inline constexpr size_t kHostNameBytes = 64;

// How many differing ranks a mismatch names (the rest are counted).
inline constexpr int kMaxRanksNamed = 4;

// OK when every rank passed the same keys, in the same order, with the same hashes. Otherwise a
// failed-precondition error, the same on every rank, naming the first rank that differs from
// rank 0 in full and the next ones (up to kMaxRanksNamed in all, then a count) after "; also":
//   parallel: rank R on HOST has a different KEY[, KEY...] than rank 0 on HOST0; every rank must
//   run the same lathe binary, configuration and data (KEY: 0x... on rank 0, 0x... on rank R)
// or, for a different key list (count or names):
//   parallel: rank R on HOST checks other keys (N) than rank 0 on HOST0 (M); every rank must ...
// Other errors: the communicator's.
Status check_same_across_ranks(Communicator& comm, std::span<const RankItem> items,
                               CUstream_st* stream);

// hash_bytes (core/hash.h) of a file's whole content, read through a read-only mapping: a few
// hundred MB/s to GB/s, for the binary (/proc/self/exe) and small index files, not for data
// shards. Errors name the path: missing, unreadable, not a regular file.
Result<uint64_t> file_content_hash(const std::filesystem::path& path);

// This machine's host name (gethostname), "?" when it fails.
std::string host_name();

}  // namespace lathe
