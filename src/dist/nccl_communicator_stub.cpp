// dist/nccl_communicator.h in a build without CUDA (the real one is nccl_communicator.cu).

#include "dist/nccl_communicator.h"

#if !LATHE_HAVE_CUDA

namespace lathe {

namespace {

Status no_nccl() {
    return failed_precondition_error(
        "this lathe was built without CUDA, so without NCCL: GPU collectives need a build where "
        "nvcc is found");
}

}  // namespace

bool nccl_available() {
    return false;
}

Result<NcclId> nccl_unique_id() {
    return no_nccl();
}

Result<std::unique_ptr<Communicator>> nccl_communicator_create(const NcclId&, int, int, int) {
    return no_nccl();
}

}  // namespace lathe

#endif
