#pragma once
// NcclCommunicator: the Communicator of dist/communicator.h over NCCL, for buffers in CUDA memory.
// Built with CUDA (NCCL ships with the CUDA toolkit: nccl.h, libnccl.so); in a build without CUDA
// these functions return an error saying so.
//
// Making one: rank 0 makes a unique id (nccl_unique_id), every rank gets it (through MPI or the
// TCP rendezvous, dist/open.h) and calls nccl_communicator_create with it, its rank and the
// world size, on the device it computes on. Creation is itself collective: it returns once every
// rank has called it. The communicator is bound to that device: every buffer must live there and
// every stream belong to it.
//
// Each collective is enqueued on the stream passed in and returns at once; the result is there
// when the stream reaches it. avg is NCCL's ncclAvg; bf16 is ncclBfloat16. split is ncclCommSplit
// (every rank must call it; kNoColor is NCCL_SPLIT_NOCOLOR). An NCCL error (a peer gone, a
// network failure) comes back as a Status naming the collective and NCCL's message.

#include <array>
#include <cstdint>
#include <memory>

#include "core/status.h"
#include "dist/communicator.h"

namespace lathe {

// ncclUniqueId's bytes (NCCL_UNIQUE_ID_BYTES), kept out of CPU code.
using NcclId = std::array<uint8_t, 128>;

// Whether this lathe was built with NCCL.
bool nccl_available();

// A fresh unique id (rank 0 makes it, once per communicator). Errors: a build without NCCL.
Result<NcclId> nccl_unique_id();

// Rank `rank` of a world of `size` processes sharing `id`, on CUDA device `device` (made current).
Result<std::unique_ptr<Communicator>> nccl_communicator_create(const NcclId& id, int rank, int size,
                                                               int device);

}  // namespace lathe
