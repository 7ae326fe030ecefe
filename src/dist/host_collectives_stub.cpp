// detail::all_gather_bytes_staged of dist/host_collectives.h in a build without CUDA (the real
// one is host_collectives.cu): a build without CUDA has no communicator that lacks host buffers.

#include "dist/host_collectives.h"

#if !LATHE_HAVE_CUDA

namespace lathe::detail {

Status all_gather_bytes_staged(Communicator& comm, std::span<const std::byte>, std::span<std::byte>,
                               CUstream_st*) {
    return failed_precondition_error(
        "a host collective over the {} communicator, which takes no host buffers, needs device "
        "memory to stage through: this lathe was built without CUDA",
        comm.backend());
}

}  // namespace lathe::detail

#endif
