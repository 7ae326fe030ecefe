#pragma once
// Communicators: the collectives that let several processes train one model.
//
// A Communicator joins `size()` processes (ranks 0..size()-1, this one is `rank()`); every rank
// calls the same collectives in the same order with buffers of the same dtype and shape. A
// collective is a rendezvous: it returns on a rank only once every rank of the group has called
// it (on the GPU: once it is enqueued; it completes on the stream).
//
//   all_reduce(out, in, op)      out = op over ranks of in                      (n    -> n)
//   reduce_scatter(out, in, op)  out = chunk `rank()` of op over ranks of in      (size*n -> n)
//   all_gather(out, in)          chunk r of out = in of rank r                    (n    -> size*n)
//   broadcast(buf, root)         buf = root's buf                                 (n    -> n)
//   split(color, key)            the ranks that pass the same color form a new communicator,
//                                ranked by key (ties by rank); kNoColor leaves the caller out
//
// A chunk is a contiguous run of numel elements, in rank order. op is sum, avg (sum / size(),
// divided after the sum) or max. Reductions take f32 or bf16; broadcast and all_gather move bytes,
// so any dtype. In place: all_reduce with out == in; reduce_scatter with out == chunk rank() of
// in; all_gather with in == chunk rank() of out; broadcast always. Other overlaps are bugs. bf16
// sums are rounded to bf16 after each addition (NCCL's and MPI's order of additions is theirs), so
// a sum over size ranks errs by up to about log2(size) bf16 roundings.
//
// Implementations:
//   LocalCommunicator  one process: every collective is the identity (a copy when out != in)
//   MpiCommunicator    CPU buffers over MPI (dist/mpi_communicator.h; OpenMPI, built when CMake
//                      finds MPI), for CPU training and for handing NCCL its id under mpirun
//   NcclCommunicator   CUDA buffers over NCCL (dist/nccl_communicator.h; built with CUDA),
//                      enqueued on the stream passed in: usually CudaState::comm_stream(), ordered
//                      against compute with CudaState::wait_for both ways
// Buffers live where the communicator says (memory()): Local takes either; the stream is ignored
// by CPU communicators. dist/open.h picks one from the process group (dist/process_group.h).
//
// Ownership: the object that opens the world communicator owns it for the process's life (run/)
// and sets Context::comm (ops/context.h) to it; communicators made by split() are owned by their
// caller and must be destroyed before the communicator they were split from.
//
// Misuse (mismatched shapes or dtypes, a buffer in the wrong memory, a reduction over integers,
// a root out of range) is a bug: LATHE_CHECK stops. A failure of the transport (a peer gone, a
// network or NCCL error) is a Status error saying which collective and what the library said.
//
// Faults on other ranks: a collective whose peer died or hangs may never return. async_error()
// and abort() serve the watchdog (dist/watchdog.h), which calls them from its own thread while
// another thread waits in a collective: async_error() reports an error the library detected in
// the background (NCCL: ncclCommGetAsyncError; others: none), abort() tears the communicator
// down so that no wait on it can last (NCCL: ncclCommAbort, after which the object only awaits
// destruction; MPI: MPI_Abort, which ends every process of the job with kCommAbortExitCode;
// local: nothing). Both are safe to call from any thread.

#include <cstdint>
#include <memory>
#include <string_view>

#include "core/status.h"
#include "core/tensor.h"
#include "ops/context.h"

namespace lathe {

enum class ReduceOp : uint8_t { kSum, kAvg, kMax };

// The exit status of a process ended because a collective could not complete (Communicator::
// abort, the watchdog of dist/watchdog.h): 124, the status timeout(1) gives a command it stopped.
inline constexpr int kCommAbortExitCode = 124;

std::string_view reduce_op_name(ReduceOp op);

class Communicator {
public:
    // split()'s color for a rank that joins no group (it gets a null communicator).
    static constexpr int kNoColor = -1;

    virtual ~Communicator() = default;
    Communicator(const Communicator&) = delete;
    Communicator& operator=(const Communicator&) = delete;

    virtual int rank() const = 0;
    virtual int size() const = 0;
    // "local", "mpi", "nccl".
    virtual std::string_view backend() const = 0;
    // Whether buffers in `device` memory are accepted.
    virtual bool accepts(Device device) const = 0;

    // The collectives (see the header comment); `stream` orders GPU collectives (null: the legacy
    // default stream) and is ignored for CPU buffers.
    Status all_reduce(TensorView out, ConstTensorView in, ReduceOp op, CUstream_st* stream);
    Status reduce_scatter(TensorView out, ConstTensorView in, ReduceOp op, CUstream_st* stream);
    Status all_gather(TensorView out, ConstTensorView in, CUstream_st* stream);
    Status broadcast(TensorView buf, int root, CUstream_st* stream);
    // Every rank must call split. color >= 0 or kNoColor; a rank passing kNoColor gets null.
    Result<std::unique_ptr<Communicator>> split(int color, int key);

    // An error the library detected outside any call (a peer gone, a network failure), or OK.
    // Any thread; cheap enough to poll every 100 ms. The default: OK (nothing runs in the
    // background).
    virtual Status async_error() { return ok_status(); }
    // Ends every pending and future wait on this communicator (see the header comment); any
    // thread; the process is expected to exit right after. The default: nothing.
    virtual void abort() {}

protected:
    Communicator() = default;
    // Called after the shared argument checks; for all_reduce `in` may alias `out` (same data),
    // for reduce_scatter/all_gather the in-place layouts of the header comment.
    virtual Status do_all_reduce(TensorView out, ConstTensorView in, ReduceOp op,
                                 CUstream_st* stream) = 0;
    virtual Status do_reduce_scatter(TensorView out, ConstTensorView in, ReduceOp op,
                                     CUstream_st* stream) = 0;
    virtual Status do_all_gather(TensorView out, ConstTensorView in, CUstream_st* stream) = 0;
    virtual Status do_broadcast(TensorView buf, int root, CUstream_st* stream) = 0;
    virtual Result<std::unique_ptr<Communicator>> do_split(int color, int key) = 0;
};

// One process: rank 0 of 1. Reductions over one rank are the identity (avg divides by 1, exact);
// each collective copies `in` to `out` when they differ (on `stream` for CUDA buffers, so it is
// ordered like a real collective) and does nothing in place. split() gives another local one.
class LocalCommunicator final : public Communicator {
public:
    LocalCommunicator() = default;
    int rank() const override { return 0; }
    int size() const override { return 1; }
    std::string_view backend() const override { return "local"; }
    bool accepts(Device device) const override;

private:
    Status do_all_reduce(TensorView out, ConstTensorView in, ReduceOp op,
                         CUstream_st* stream) override;
    Status do_reduce_scatter(TensorView out, ConstTensorView in, ReduceOp op,
                             CUstream_st* stream) override;
    Status do_all_gather(TensorView out, ConstTensorView in, CUstream_st* stream) override;
    Status do_broadcast(TensorView buf, int root, CUstream_st* stream) override;
    Result<std::unique_ptr<Communicator>> do_split(int color, int key) override;
};

}  // namespace lathe
