// clang-format off
#include "ops/cuda/nvcc_compat.h"  // first: before any header that includes fmt
// clang-format on

#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <cstring>

#include "core/check.h"
#include "dist/nccl_communicator.h"

namespace lathe {

static_assert(sizeof(ncclUniqueId) == std::tuple_size_v<NcclId>, "NcclId must hold ncclUniqueId");

namespace {

Status nccl_status(ncclResult_t rc, std::string_view what, ncclComm_t comm = nullptr) {
    if (rc == ncclSuccess) return ok_status();
    const char* last = comm != nullptr ? ncclGetLastError(comm) : ncclGetLastError(nullptr);
    return internal_error("{}: NCCL error {} ({}){}{}", what, int(rc), ncclGetErrorString(rc),
                          last != nullptr && *last != '\0' ? "; " : "",
                          last != nullptr ? last : "");
}

Status cuda_status(cudaError_t err, std::string_view what) {
    if (err == cudaSuccess) return ok_status();
    return internal_error("{}: CUDA error {} ({})", what, cudaGetErrorName(err),
                          cudaGetErrorString(err));
}

ncclDataType_t nccl_type(DType dtype) {
    switch (dtype) {
        case DType::kF32:
            return ncclFloat32;
        case DType::kBF16:
            return ncclBfloat16;
        default:
            LATHE_CHECK(false, "NCCL reduction over {}", dtype_name(dtype));
    }
    return ncclFloat32;
}

ncclRedOp_t nccl_op(ReduceOp op) {
    switch (op) {
        case ReduceOp::kSum:
            return ncclSum;
        case ReduceOp::kAvg:
            return ncclAvg;
        case ReduceOp::kMax:
            return ncclMax;
    }
    return ncclSum;
}

cudaStream_t as_stream(CUstream_st* s) {
    return s;
}

class NcclCommunicator final : public Communicator {
public:
    NcclCommunicator(ncclComm_t comm, int device) : comm_(comm), device_(device) {
        ncclCommUserRank(comm_, &rank_);
        ncclCommCount(comm_, &size_);
    }
    ~NcclCommunicator() override {
        // Waits for this communicator's outstanding work, then frees it (abort freed it already).
        if (comm_ != nullptr && !aborted_.load()) ncclCommDestroy(comm_);
    }

    int rank() const override { return rank_; }
    int size() const override { return size_; }
    std::string_view backend() const override { return "nccl"; }
    bool accepts(Device device) const override { return device == Device::kCuda; }

    Status async_error() override {
        if (aborted_.load()) return ok_status();
        ncclResult_t rc = ncclSuccess;
        LATHE_RETURN_IF_ERROR(
            nccl_status(ncclCommGetAsyncError(comm_, &rc), "ncclCommGetAsyncError", comm_));
        // ncclInProgress: a nonblocking operation still running, not an error.
        if (rc == ncclInProgress) return ok_status();
        return nccl_status(rc, "NCCL (asynchronous error)", comm_);
    }

    void abort() override {
        if (aborted_.exchange(true)) return;
        ncclCommAbort(comm_);
    }

private:
    Status do_all_reduce(TensorView out, ConstTensorView in, ReduceOp op,
                         CUstream_st* stream) override {
        return nccl_status(
            ncclAllReduce(in.data(), out.data(), size_t(out.numel()), nccl_type(out.dtype()),
                          nccl_op(op), comm_, as_stream(stream)),
            "all_reduce (ncclAllReduce)", comm_);
    }

    Status do_reduce_scatter(TensorView out, ConstTensorView in, ReduceOp op,
                             CUstream_st* stream) override {
        return nccl_status(
            ncclReduceScatter(in.data(), out.data(), size_t(out.numel()), nccl_type(out.dtype()),
                              nccl_op(op), comm_, as_stream(stream)),
            "reduce_scatter (ncclReduceScatter)", comm_);
    }

    Status do_all_gather(TensorView out, ConstTensorView in, CUstream_st* stream) override {
        // Bytes: any dtype moves.
        return nccl_status(
            ncclAllGather(in.data(), out.data(), in.bytes(), ncclUint8, comm_, as_stream(stream)),
            "all_gather (ncclAllGather)", comm_);
    }

    Status do_broadcast(TensorView buf, int root, CUstream_st* stream) override {
        return nccl_status(ncclBroadcast(buf.data(), buf.data(), buf.bytes(), ncclUint8, root,
                                         comm_, as_stream(stream)),
                           "broadcast (ncclBroadcast)", comm_);
    }

    Result<std::unique_ptr<Communicator>> do_split(int color, int key) override {
        ncclComm_t sub = nullptr;
        LATHE_RETURN_IF_ERROR(cuda_status(cudaSetDevice(device_), "split (cudaSetDevice)"));
        LATHE_RETURN_IF_ERROR(
            nccl_status(ncclCommSplit(comm_, color == kNoColor ? NCCL_SPLIT_NOCOLOR : color, key,
                                      &sub, nullptr),
                        "split (ncclCommSplit)", comm_));
        if (sub == nullptr) return std::unique_ptr<Communicator>();
        return std::unique_ptr<Communicator>(std::make_unique<NcclCommunicator>(sub, device_));
    }

    ncclComm_t comm_ = nullptr;
    std::atomic<bool> aborted_{false};
    int device_ = 0;
    int rank_ = 0;
    int size_ = 1;
};

}  // namespace

bool nccl_available() {
    return true;
}

Result<NcclId> nccl_unique_id() {
    ncclUniqueId id;
    LATHE_RETURN_IF_ERROR(nccl_status(ncclGetUniqueId(&id), "ncclGetUniqueId"));
    NcclId out;
    std::memcpy(out.data(), &id, sizeof id);
    return out;
}

Result<std::unique_ptr<Communicator>> nccl_communicator_create(const NcclId& id, int rank, int size,
                                                               int device) {
    if (size < 1 || rank < 0 || rank >= size)
        return invalid_argument_error("NCCL communicator: rank {} of a world of {}", rank, size);
    LATHE_RETURN_IF_ERROR(cuda_status(cudaSetDevice(device), "NCCL communicator (cudaSetDevice)"));
    ncclUniqueId nid;
    std::memcpy(&nid, id.data(), sizeof nid);
    ncclComm_t comm = nullptr;
    LATHE_RETURN_IF_ERROR(
        nccl_status(ncclCommInitRank(&comm, size, nid, rank),
                    fmt::format("NCCL communicator (ncclCommInitRank, rank {} of {}, cuda:{})",
                                rank, size, device)));
    return std::unique_ptr<Communicator>(std::make_unique<NcclCommunicator>(comm, device));
}

}  // namespace lathe
