#include "dist/mpi_communicator.h"

#if LATHE_HAVE_MPI

#include <mpi.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/check.h"
#include "core/dtype.h"

namespace lathe {

namespace {

std::string mpi_error_text(int code) {
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) return fmt::format("MPI error {}", code);
    return std::string(text, size_t(len));
}

Status mpi_status(int code, std::string_view call) {
    if (code == MPI_SUCCESS) return ok_status();
    return internal_error("{}: {}", call, mpi_error_text(code));
}

// The bf16 datatype (two bytes, contiguous) and its reductions, created once after MPI_Init.
struct Bf16Types {
    MPI_Datatype type = MPI_DATATYPE_NULL;
    MPI_Op sum = MPI_OP_NULL;
    MPI_Op max = MPI_OP_NULL;
};
Bf16Types g_bf16;

void bf16_sum(void* in, void* inout, int* len, MPI_Datatype*) {
    const bf16* a = static_cast<const bf16*>(in);
    bf16* b = static_cast<bf16*>(inout);
    for (int i = 0; i < *len; ++i) b[i] = float_to_bf16(bf16_to_float(a[i]) + bf16_to_float(b[i]));
}

void bf16_max(void* in, void* inout, int* len, MPI_Datatype*) {
    const bf16* a = static_cast<const bf16*>(in);
    bf16* b = static_cast<bf16*>(inout);
    for (int i = 0; i < *len; ++i)
        if (bf16_to_float(a[i]) > bf16_to_float(b[i])) b[i] = a[i];
}

void finalize_at_exit() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    if (g_bf16.sum != MPI_OP_NULL) MPI_Op_free(&g_bf16.sum);
    if (g_bf16.max != MPI_OP_NULL) MPI_Op_free(&g_bf16.max);
    if (g_bf16.type != MPI_DATATYPE_NULL) MPI_Type_free(&g_bf16.type);
    MPI_Finalize();
}

Status ensure_initialized() {
    int initialized = 0;
    LATHE_RETURN_IF_ERROR(mpi_status(MPI_Initialized(&initialized), "MPI_Initialized"));
    if (!initialized) {
        int provided = 0;
        LATHE_RETURN_IF_ERROR(mpi_status(
            MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread"));
        std::atexit(finalize_at_exit);
    }
    if (g_bf16.type == MPI_DATATYPE_NULL) {
        LATHE_RETURN_IF_ERROR(
            mpi_status(MPI_Type_contiguous(2, MPI_BYTE, &g_bf16.type), "MPI_Type_contiguous"));
        LATHE_RETURN_IF_ERROR(mpi_status(MPI_Type_commit(&g_bf16.type), "MPI_Type_commit"));
        LATHE_RETURN_IF_ERROR(mpi_status(MPI_Op_create(bf16_sum, 1, &g_bf16.sum), "MPI_Op_create"));
        LATHE_RETURN_IF_ERROR(mpi_status(MPI_Op_create(bf16_max, 1, &g_bf16.max), "MPI_Op_create"));
    }
    return ok_status();
}

MPI_Datatype mpi_type(DType dtype) {
    return dtype == DType::kF32 ? MPI_FLOAT : g_bf16.type;
}

MPI_Op mpi_op(DType dtype, ReduceOp op) {
    const bool max = op == ReduceOp::kMax;
    if (dtype == DType::kF32) return max ? MPI_MAX : MPI_SUM;
    return max ? g_bf16.max : g_bf16.sum;
}

// Divides an avg's sum by the group size in place.
void divide(TensorView t, int size) {
    if (t.dtype() == DType::kF32) {
        float* p = t.as<float>();
        for (int64_t i = 0; i < t.numel(); ++i) p[i] /= float(size);
    } else {
        bf16* p = t.as<bf16>();
        for (int64_t i = 0; i < t.numel(); ++i)
            p[i] = float_to_bf16(bf16_to_float(p[i]) / float(size));
    }
}

// MPI counts are ints: a buffer beyond 2^31 - 1 elements is split by the caller (a bug here).
int count_of(int64_t numel, std::string_view what) {
    LATHE_CHECK(numel <= int64_t(INT32_MAX), "{}: {} elements, more than one MPI call takes", what,
                numel);
    return int(numel);
}

class MpiCommunicator final : public Communicator {
public:
    explicit MpiCommunicator(MPI_Comm comm) : comm_(comm) {
        MPI_Comm_rank(comm_, &rank_);
        MPI_Comm_size(comm_, &size_);
    }
    ~MpiCommunicator() override {
        int finalized = 0;
        MPI_Finalized(&finalized);
        if (!finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
    }

    int rank() const override { return rank_; }
    int size() const override { return size_; }
    std::string_view backend() const override { return "mpi"; }
    bool accepts(Device device) const override { return device == Device::kCpu; }

    // MPI_Abort from the watchdog's thread while the funneled thread may sit in a collective:
    // OpenMPI's abort goes through its runtime, which kills every process of the job.
    void abort() override { MPI_Abort(comm_, kCommAbortExitCode); }

private:
    Status do_all_reduce(TensorView out, ConstTensorView in, ReduceOp op, CUstream_st*) override {
        const void* send = in.data() == out.data() ? MPI_IN_PLACE : in.data();
        LATHE_RETURN_IF_ERROR(
            mpi_status(MPI_Allreduce(send, out.data(), count_of(out.numel(), "all_reduce"),
                                     mpi_type(out.dtype()), mpi_op(out.dtype(), op), comm_),
                       "all_reduce (MPI_Allreduce)"));
        if (op == ReduceOp::kAvg) divide(out, size_);
        return ok_status();
    }

    Status do_reduce_scatter(TensorView out, ConstTensorView in, ReduceOp op,
                             CUstream_st*) override {
        // MPI's in-place form keeps the result at the front of the buffer, not at chunk rank():
        // an aliased input goes through a copy.
        std::vector<char> copy;
        const void* send = in.data();
        if (static_cast<const char*>(in.data()) <= static_cast<const char*>(out.data()) &&
            static_cast<const char*>(out.data()) <
                static_cast<const char*>(in.data()) + in.bytes()) {
            copy.assign(static_cast<const char*>(in.data()),
                        static_cast<const char*>(in.data()) + in.bytes());
            send = copy.data();
        }
        LATHE_RETURN_IF_ERROR(mpi_status(
            MPI_Reduce_scatter_block(send, out.data(), count_of(out.numel(), "reduce_scatter"),
                                     mpi_type(out.dtype()), mpi_op(out.dtype(), op), comm_),
            "reduce_scatter (MPI_Reduce_scatter_block)"));
        if (op == ReduceOp::kAvg) divide(out, size_);
        return ok_status();
    }

    Status do_all_gather(TensorView out, ConstTensorView in, CUstream_st*) override {
        const bool in_place = static_cast<const char*>(in.data()) ==
                              static_cast<const char*>(out.data()) + size_t(rank_) * in.bytes();
        const int bytes = count_of(int64_t(in.bytes()), "all_gather");
        LATHE_RETURN_IF_ERROR(
            mpi_status(MPI_Allgather(in_place ? MPI_IN_PLACE : in.data(), bytes, MPI_BYTE,
                                     out.data(), bytes, MPI_BYTE, comm_),
                       "all_gather (MPI_Allgather)"));
        return ok_status();
    }

    Status do_broadcast(TensorView buf, int root, CUstream_st*) override {
        return mpi_status(MPI_Bcast(buf.data(), count_of(int64_t(buf.bytes()), "broadcast"),
                                    MPI_BYTE, root, comm_),
                          "broadcast (MPI_Bcast)");
    }

    Result<std::unique_ptr<Communicator>> do_split(int color, int key) override {
        MPI_Comm sub = MPI_COMM_NULL;
        LATHE_RETURN_IF_ERROR(
            mpi_status(MPI_Comm_split(comm_, color == kNoColor ? MPI_UNDEFINED : color, key, &sub),
                       "split (MPI_Comm_split)"));
        if (sub == MPI_COMM_NULL) return std::unique_ptr<Communicator>();
        return std::unique_ptr<Communicator>(std::make_unique<MpiCommunicator>(sub));
    }

    MPI_Comm comm_ = MPI_COMM_NULL;
    int rank_ = 0;
    int size_ = 1;
};

}  // namespace

bool mpi_available() {
    return true;
}

Result<std::unique_ptr<Communicator>> mpi_world_communicator() {
    LATHE_RETURN_IF_ERROR(ensure_initialized());
    MPI_Comm world = MPI_COMM_NULL;
    LATHE_RETURN_IF_ERROR(mpi_status(MPI_Comm_dup(MPI_COMM_WORLD, &world), "MPI_Comm_dup"));
    // Errors come back as codes (to become Statuses), not as MPI's default abort.
    MPI_Comm_set_errhandler(world, MPI_ERRORS_RETURN);
    return std::unique_ptr<Communicator>(std::make_unique<MpiCommunicator>(world));
}

}  // namespace lathe

#else  // !LATHE_HAVE_MPI

namespace lathe {

bool mpi_available() {
    return false;
}

Result<std::unique_ptr<Communicator>> mpi_world_communicator() {
    return failed_precondition_error(
        "this lathe was built without MPI (CMake did not find it): install libopenmpi-dev "
        "(scripts/install-deps.sh) and rebuild");
}

}  // namespace lathe

#endif
