#pragma once
// Collectives on small host values over any Communicator (dist/communicator.h): the flags,
// counters, hashes and host names ranks agree on outside the model's tensors.
//
//   all_gather_bytes(comm, mine, all)   chunk r of all = rank r's mine          (n -> size*n bytes)
//   all_gather_values<T>(...)           the same for spans of a trivially copyable T
//   all_gather_value<T>(comm, x)        a vector of size() values, [r] = rank r's x
//   barrier(comm)                       returns once every rank has called it
//   all_reduce_max(comm, int)           the largest value any rank passed (e.g. a stop flag)
//   all_reduce_sum(comm, int64|double)  the sum over ranks, added in rank order 0, 1, ...
//
// Every call blocks until the result is in host memory. A communicator that takes host buffers
// (local, MPI) moves them itself. One that does not (NCCL) goes through device memory: one copy to
// the device, the collective enqueued on `stream`, one copy back, then a wait for `stream`; the
// device buffer is kept per thread and device, grows to the largest call and lives as long as the
// thread (a few KB). `stream` must belong to the device the communicator is bound to (the current
// device; usually CudaState::comm_stream()); host communicators ignore it. Cost: about one small
// collective's latency plus two small copies, meant for a few calls per step, not per tensor.
//
// Reductions are computed on every rank from the gathered values, in rank order: exact for
// integers, and the same bits on every rank for doubles whichever library moved them.
//
// Like every collective, each rank calls the same functions in the same order with the same sizes
// (a size that differs between ranks is a bug the transport may answer with a hang or an error).
// all.size() != size() * mine.size() is a bug (LATHE_CHECK). Errors: the communicator's (a peer
// gone, a network or NCCL error) and CUDA's on the staging path, naming the call.

#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>
#include <vector>

#include "core/status.h"
#include "dist/communicator.h"

namespace lathe {

Status all_gather_bytes(Communicator& comm, std::span<const std::byte> mine,
                        std::span<std::byte> all, CUstream_st* stream);

template <typename T>
requires std::is_trivially_copyable_v<T> Status all_gather_values(Communicator& comm,
                                                                  std::span<const T> mine,
                                                                  std::span<T> all,
                                                                  CUstream_st* stream) {
    return all_gather_bytes(comm, std::as_bytes(mine), std::as_writable_bytes(all), stream);
}

template <typename T>
requires std::is_trivially_copyable_v<T> Result<std::vector<T>> all_gather_value(
    Communicator& comm, const T& mine, CUstream_st* stream) {
    std::vector<T> all(size_t(comm.size()));
    LATHE_RETURN_IF_ERROR(
        all_gather_values<T>(comm, std::span<const T>(&mine, 1), std::span<T>(all), stream));
    return all;
}

Status barrier(Communicator& comm, CUstream_st* stream);

Result<int> all_reduce_max(Communicator& comm, int value, CUstream_st* stream);

Result<int64_t> all_reduce_sum(Communicator& comm, int64_t value, CUstream_st* stream);
Result<double> all_reduce_sum(Communicator& comm, double value, CUstream_st* stream);

namespace detail {

// all_gather_bytes through device memory (host_collectives.cu; an error in a build without CUDA,
// host_collectives_stub.cpp). Sizes are checked by the caller.
Status all_gather_bytes_staged(Communicator& comm, std::span<const std::byte> mine,
                               std::span<std::byte> all, CUstream_st* stream);

}  // namespace detail

}  // namespace lathe
