#include "dist/communicator.h"

#include <cstring>

#include "core/check.h"

#if LATHE_HAVE_CUDA
#include "ops/cuda/cuda_state.h"
#endif

namespace lathe {

std::string_view reduce_op_name(ReduceOp op) {
    switch (op) {
        case ReduceOp::kSum:
            return "sum";
        case ReduceOp::kAvg:
            return "avg";
        case ReduceOp::kMax:
            return "max";
    }
    return "?";
}

namespace {

void check_buffers(const Communicator& comm, std::string_view what, ConstTensorView out,
                   ConstTensorView in) {
    LATHE_CHECK(out.dtype() == in.dtype(), "{}: out {} and in {} differ in dtype", what,
                out.to_string(), in.to_string());
    LATHE_CHECK(out.device() == in.device(), "{}: out {} and in {} live in different memory", what,
                out.to_string(), in.to_string());
    LATHE_CHECK(comm.accepts(out.device()), "{}: the {} communicator does not take {}", what,
                comm.backend(), out.to_string());
    LATHE_CHECK((out.is_null() || out.numel() == 0 || out.data() != nullptr) &&
                    (in.numel() == 0 || in.data() != nullptr),
                "{}: a null buffer", what);
}

void check_reducible(std::string_view what, ConstTensorView t) {
    LATHE_CHECK(t.dtype() == DType::kF32 || t.dtype() == DType::kBF16,
                "{}: reductions take f32 or bf16, not {}", what, t.to_string());
}

const char* byte_ptr(ConstTensorView t) {
    return static_cast<const char*>(t.data());
}

// Whether `part` is chunk `index` of `whole` (the in-place layouts of reduce_scatter/all_gather).
bool is_chunk(ConstTensorView part, ConstTensorView whole, int index) {
    return byte_ptr(part) == byte_ptr(whole) + size_t(index) * part.bytes();
}

// Whether two byte ranges overlap.
bool overlap(ConstTensorView a, ConstTensorView b) {
    return a.bytes() > 0 && b.bytes() > 0 && byte_ptr(a) < byte_ptr(b) + b.bytes() &&
           byte_ptr(b) < byte_ptr(a) + a.bytes();
}

}  // namespace

Status Communicator::all_reduce(TensorView out, ConstTensorView in, ReduceOp op,
                                CUstream_st* stream) {
    check_buffers(*this, "all_reduce", out, in);
    check_reducible("all_reduce", in);
    LATHE_CHECK(out.numel() == in.numel(), "all_reduce: out {} and in {} differ in size",
                out.to_string(), in.to_string());
    LATHE_CHECK(out.data() == in.data() || !overlap(out, in),
                "all_reduce: out and in overlap without being the same buffer");
    if (in.numel() == 0) return ok_status();
    return do_all_reduce(out, in, op, stream);
}

Status Communicator::reduce_scatter(TensorView out, ConstTensorView in, ReduceOp op,
                                    CUstream_st* stream) {
    check_buffers(*this, "reduce_scatter", out, in);
    check_reducible("reduce_scatter", in);
    LATHE_CHECK(in.numel() == int64_t(size()) * out.numel(),
                "reduce_scatter: in {} must hold {} chunks of out {}", in.to_string(), size(),
                out.to_string());
    LATHE_CHECK(!overlap(out, in) || is_chunk(out, in, rank()),
                "reduce_scatter: out overlaps in without being its chunk {}", rank());
    if (in.numel() == 0) return ok_status();
    return do_reduce_scatter(out, in, op, stream);
}

Status Communicator::all_gather(TensorView out, ConstTensorView in, CUstream_st* stream) {
    check_buffers(*this, "all_gather", out, in);
    LATHE_CHECK(out.numel() == int64_t(size()) * in.numel(),
                "all_gather: out {} must hold {} chunks of in {}", out.to_string(), size(),
                in.to_string());
    LATHE_CHECK(!overlap(out, in) || is_chunk(in, out, rank()),
                "all_gather: in overlaps out without being its chunk {}", rank());
    if (in.numel() == 0) return ok_status();
    return do_all_gather(out, in, stream);
}

Status Communicator::broadcast(TensorView buf, int root, CUstream_st* stream) {
    check_buffers(*this, "broadcast", buf, buf);
    LATHE_CHECK(root >= 0 && root < size(), "broadcast: root {} of a group of {}", root, size());
    if (buf.numel() == 0) return ok_status();
    return do_broadcast(buf, root, stream);
}

Result<std::unique_ptr<Communicator>> Communicator::split(int color, int key) {
    LATHE_CHECK(color >= 0 || color == kNoColor, "split: color {} (>= 0, or kNoColor)", color);
    return do_split(color, key);
}

bool LocalCommunicator::accepts(Device device) const {
#if LATHE_HAVE_CUDA
    return device == Device::kCpu || device == Device::kCuda;
#else
    return device == Device::kCpu;
#endif
}

namespace {

// out = in, unless they are the same buffer.
void local_copy(TensorView out, ConstTensorView in, CUstream_st* stream) {
    if (out.data() == in.data()) return;
#if LATHE_HAVE_CUDA
    if (out.device() == Device::kCuda) {
        cuda_copy_sync(out, in, stream);  // device to device: enqueued on the stream, no wait
        return;
    }
#endif
    std::memcpy(out.data(), in.data(), in.bytes());
}

}  // namespace

Status LocalCommunicator::do_all_reduce(TensorView out, ConstTensorView in, ReduceOp,
                                        CUstream_st* stream) {
    local_copy(out, in, stream);
    return ok_status();
}

Status LocalCommunicator::do_reduce_scatter(TensorView out, ConstTensorView in, ReduceOp,
                                            CUstream_st* stream) {
    local_copy(out, in.reshape(out.shape()), stream);
    return ok_status();
}

Status LocalCommunicator::do_all_gather(TensorView out, ConstTensorView in, CUstream_st* stream) {
    local_copy(out.reshape(in.shape()), in, stream);
    return ok_status();
}

Status LocalCommunicator::do_broadcast(TensorView, int, CUstream_st*) {
    return ok_status();
}

Result<std::unique_ptr<Communicator>> LocalCommunicator::do_split(int color, int) {
    if (color == kNoColor) return std::unique_ptr<Communicator>();
    return std::unique_ptr<Communicator>(std::make_unique<LocalCommunicator>());
}

}  // namespace lathe
