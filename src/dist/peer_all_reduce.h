#pragma once
// PeerAllReduce: a one-shot sum of small bf16 buffers over the GPUs of one node, each GPU reading
// its peers' memory directly (NVLink or PCIe peer-to-peer), for the all-reduces of tensor-parallel
// decoding: two per layer of a few to a few hundred KB each, where a ring collective's latency,
// not the bytes, sets the time.
//
// One call, on every rank of the group (the same buffer sizes, in the same order, like any
// collective), is one kernel of a fixed grid of kBlocks blocks. Block b of each rank:
//   1. copies its part of the input into slot (call & 1) of this rank's exchange buffer;
//   2. raises its flag in each peer's flag array (a release store at system scope) and waits until
//      every peer's block b has raised its flag here (acquire loads);
//   3. reads its part from every rank's slot, adds in rank order 0, 1, ... in f32, and stores the
//      bf16 rounding of the sum.
// So every rank computes the same bits (one rounding of a sum in a fixed order: closer to the
// exact sum than a ring's rounding after each addition). Two slots alternate: a rank overwrites
// slot s at call k + 2 only after each peer has raised its flag of call k + 1, which it does only
// after its kernel of call k (whose reads of slot s) ended. Flags hold the call number (kept per
// block in device memory), so the kernel needs no host argument that changes between calls and
// can be captured in a CUDA graph and replayed.
//
// A wait that lasts kPeerWaitSeconds (a peer that stopped or diverged: a bug or a dead process)
// ends the kernel with a trap, so the failure surfaces as a CUDA error on every waiting rank
// instead of a hang.
//
// open() is collective over `comm` (an NcclCommunicator of the tensor-parallel group): each rank
// allocates its exchange buffer (flags + 2 x max_bytes), the ranks exchange CUDA IPC handles (or,
// ranks that are threads of one process, device pointers with peer access enabled), open their
// peers' buffers, and then check one sum of known integer-valued data (exact in bf16) against its
// expected value. It returns null, with the reason in `why_not`, on every rank when any rank
// cannot reach a peer (another machine, no peer access between the devices, IPC refused): the
// caller keeps NCCL.
// A self-check that gives wrong sums is an error. The object is bound to the device that was
// current at open(); it must be destroyed before `comm`.

#include <cstdint>
#include <memory>
#include <string>

#include "core/status.h"
#include "core/tensor.h"
#include "dist/communicator.h"

namespace lathe {

class PeerAllReduce {
public:
    static constexpr int kMaxRanks = 8;
    static constexpr int kBlocks = 24;
    static constexpr int kThreads = 512;
    static constexpr double kPeerWaitSeconds = 60.0;

    // Collective over `comm` (every rank calls it with the same max_bytes). Null with `why_not`
    // set when the group cannot use it (see the header comment); errors: CUDA failures, a
    // self-check whose sums are wrong, comm's errors.
    static Result<std::unique_ptr<PeerAllReduce>> open(Communicator& comm, int64_t max_bytes,
                                                       CUstream_st* stream, std::string* why_not);

    ~PeerAllReduce();
    PeerAllReduce(const PeerAllReduce&) = delete;
    PeerAllReduce& operator=(const PeerAllReduce&) = delete;

    int rank() const { return rank_; }
    int size() const { return size_; }
    int64_t max_bytes() const { return max_bytes_; }
    // Whether sum() takes `buf`: bf16 on CUDA, at most max_bytes(), a whole number of 16-byte
    // vectors, 16-byte aligned.
    bool fits(ConstTensorView buf) const;
    // buf = the sum over ranks of buf (in place), enqueued on `stream`. Every rank calls it with
    // the same numel. buf must fit (LATHE_CHECK).
    void sum(TensorView buf, CUstream_st* stream);

private:
    PeerAllReduce() = default;
    int rank_ = 0, size_ = 1, device_ = 0;
    int64_t max_bytes_ = 0;
    void* own_ = nullptr;              // this rank's exchange buffer (cudaMalloc)
    uint32_t* calls_ = nullptr;        // kBlocks call counters (cudaMalloc)
    void* peers_[kMaxRanks] = {};      // every rank's exchange buffer as this device sees it
    bool opened_ipc_[kMaxRanks] = {};  // peers_[r] came from cudaIpcOpenMemHandle
};

}  // namespace lathe
