#pragma once
// A small TCP rendezvous: rank 0 hands the same bytes to every other rank of a world (the NCCL
// unique id, when no MPI is there to carry it).
//
// Rank 0 listens on `port` (all interfaces) and waits until the other world_size - 1 ranks have
// connected; each of them connects to `host`:`port`, retrying while rank 0 is not listening yet,
// and says who it is (rank, world size). When all have come, rank 0 sends each the payload and
// closes. Everything is bounded by `timeout_ms` from the call: a rank that never comes, a host
// that does not resolve or a port taken stop with a Status error naming the address and what to
// check. The wire format (all integers little-endian u32):
//   rank r -> rank 0: "LATHERV1", r, world_size
//   rank 0 -> rank r: "LATHERV1", status (0 ok, 1 refused), payload length, payload bytes
// Rank 0 refuses (and fails) a peer announcing another world size, a rank out of range or a rank
// already seen: two jobs on one port, or launchers that disagree.

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"

namespace lathe {

struct RendezvousOptions {
    std::string host;  // rank 0's address, as the other ranks reach it (a name or an IPv4/IPv6)
    int port = 0;      // 1..65535
    int rank = 0;
    int world_size = 1;
    int timeout_ms = 300'000;
};

// On rank 0 returns `payload` after handing it to every other rank; elsewhere returns what rank 0
// sent (`payload` is ignored there). A world of one returns at once.
Result<std::vector<uint8_t>> rendezvous_broadcast(const RendezvousOptions& options,
                                                  std::span<const uint8_t> payload);

}  // namespace lathe
