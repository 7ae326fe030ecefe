#include "dist/host_collectives.h"

#include "core/check.h"

namespace lathe {

Status all_gather_bytes(Communicator& comm, std::span<const std::byte> mine,
                        std::span<std::byte> all, CUstream_st* stream) {
    LATHE_CHECK(all.size() == size_t(comm.size()) * mine.size(),
                "all_gather_bytes: {} bytes of output for {} ranks of {} bytes", all.size(),
                comm.size(), mine.size());
    if (mine.empty()) return ok_status();
    if (!comm.accepts(Device::kCpu))
        return detail::all_gather_bytes_staged(comm, mine, all, stream);
    // Communicator::all_gather checks the overlap (only the in-place chunk is allowed).
    const int64_t n = int64_t(mine.size());
    return comm.all_gather(TensorView(all.data(), DType::kU8, {n * comm.size()}),
                           ConstTensorView(mine.data(), DType::kU8, {n}), stream);
}

Status barrier(Communicator& comm, CUstream_st* stream) {
    // A gather returns on a rank only once every rank has contributed its byte.
    const std::byte mine{1};
    std::vector<std::byte> all(size_t(comm.size()));
    return all_gather_bytes(comm, std::span<const std::byte>(&mine, 1), all, stream);
}

Result<int> all_reduce_max(Communicator& comm, int value, CUstream_st* stream) {
    LATHE_ASSIGN_OR_RETURN(std::vector<int> all, all_gather_value(comm, value, stream));
    int max = all[0];
    for (int v : all) max = std::max(max, v);
    return max;
}

Result<int64_t> all_reduce_sum(Communicator& comm, int64_t value, CUstream_st* stream) {
    LATHE_ASSIGN_OR_RETURN(std::vector<int64_t> all, all_gather_value(comm, value, stream));
    int64_t sum = 0;
    for (int64_t v : all) sum += v;
    return sum;
}

Result<double> all_reduce_sum(Communicator& comm, double value, CUstream_st* stream) {
    LATHE_ASSIGN_OR_RETURN(std::vector<double> all, all_gather_value(comm, value, stream));
    double sum = 0;
    for (double v : all) sum += v;
    return sum;
}

}  // namespace lathe
