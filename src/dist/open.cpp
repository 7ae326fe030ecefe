#include "dist/open.h"

#include "dist/mpi_communicator.h"
#include "dist/nccl_communicator.h"
#include "dist/rendezvous.h"

namespace lathe {

int rendezvous_port(const ProcessGroupInfo& group) {
    // torchrun's agent may hold MASTER_PORT (open.h); `lathe launch`, srun and mpirun hold none.
    if (group.master_port == 0) return 0;
    if (group.launcher != Launcher::kTorchrun) return group.master_port;
    return group.master_port < 65535 ? group.master_port + 1 : 0;
}

namespace {

// MPI's world, checked against what the launcher's variables say.
Result<std::unique_ptr<Communicator>> checked_mpi_world(const ProcessGroupInfo& group) {
    LATHE_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> world, mpi_world_communicator());
    if (world->size() != group.world_size || world->rank() != group.rank)
        return failed_precondition_error(
            "MPI sees rank {} of {} processes, but the environment says {}: start the job with "
            "mpirun (or srun with MPI support) so that both agree",
            world->rank(), world->size(), group.describe());
    return world;
}

}  // namespace

Result<std::unique_ptr<Communicator>> communicator_open(const ProcessGroupInfo& group,
                                                        Backend backend, int device,
                                                        int timeout_ms) {
    if (group.single_process())
        return std::unique_ptr<Communicator>(std::make_unique<LocalCommunicator>());
    if (backend == Backend::kCpu) {
        if (!mpi_available())
            return failed_precondition_error(
                "{} on the CPU needs MPI, and this lathe was built without it: install "
                "libopenmpi-dev (scripts/install-deps.sh), rebuild, and start with mpirun",
                group.describe());
        if (group.launcher == Launcher::kLaunch || group.launcher == Launcher::kTorchrun)
            return failed_precondition_error(
                "the CPU backend's collectives are MPI's, and {} starts processes that MPI does "
                "not know; start the {} ranks with `mpirun -np {} lathe ...` (or srun with MPI "
                "support), or compute on GPUs",
                launcher_name(group.launcher), group.world_size, group.world_size);
        return checked_mpi_world(group);
    }
    NcclId id{};
    if (group.rank == 0) {
        LATHE_ASSIGN_OR_RETURN(id, nccl_unique_id());
    }
    if (group.launcher == Launcher::kMpirun && mpi_available()) {
        LATHE_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> world, checked_mpi_world(group));
        LATHE_RETURN_IF_ERROR(
            world->broadcast(TensorView(id.data(), DType::kU8, {int64_t(id.size())}), 0, nullptr)
                .with_context("handing out the NCCL id over MPI"));
    } else {
        RendezvousOptions options;
        options.host = group.master_addr;
        options.port = rendezvous_port(group);
        options.rank = group.rank;
        options.world_size = group.world_size;
        options.timeout_ms = timeout_ms;
        LATHE_ASSIGN_OR_RETURN(const std::vector<uint8_t> got,
                               rendezvous_broadcast(options, std::span<const uint8_t>(id)));
        if (got.size() != id.size())
            return data_loss_error("rendezvous: rank 0 sent {} bytes for the NCCL id, not {}",
                                   got.size(), id.size());
        std::copy(got.begin(), got.end(), id.begin());
    }
    return nccl_communicator_create(id, group.rank, group.world_size, device);
}

}  // namespace lathe
