#pragma once
// The world of a run: which process of a multi-process job this one is (dist/process_group.h) and
// the communicator that joins all of them (dist/open.h), opened once per process by the command
// that computes (`lathe train`, `lathe bench`) right after its ComputeDevice.
//
// A process started without a launcher is rank 0 of a world of one, with a LocalCommunicator: the
// single-process path costs nothing. Several processes on the CPU talk over MPI (started by
// mpirun), on GPUs over NCCL (started by `lathe launch`, torchrun, srun or mpirun).
//
// Ownership: World owns the communicator; it must outlive every Context that points at it (the
// Model's; the ComputeDevice's points at it too but never uses it after the model is gone), and
// NCCL's communicator must go before the CUDA state it runs on: declare the World after the
// ComputeDevice and before the Model.

#include <memory>
#include <string>

#include "core/status.h"
#include "dist/communicator.h"
#include "dist/process_group.h"
#include "run/compute_device.h"

namespace lathe {

struct World {
    ProcessGroupInfo group;
    std::unique_ptr<Communicator> comm;
    std::string host;  // this machine's name (gethostname)
    // CUDA, several ranks: the device memory the communicator holds once every collective the
    // training step uses has run once (NCCL allocates its buffers on first use), measured with
    // cudaMemGetInfo around opening it; the memory plan counts it (ModelShape). 0 otherwise.
    size_t device_bytes = 0;

    int rank() const { return group.rank; }
    int size() const { return group.world_size; }
    bool single() const { return group.world_size == 1; }
    // "rank 1 of 4 on host gpu07 (torchrun)", for messages.
    std::string who() const;
};

// Opens the world of this process (its launcher's variables) for `device`, and sets the
// communicator into `device`'s contexts (ComputeDevice::set_comm). On CUDA with several ranks it
// then runs each collective once (all-reduce, all-gather, broadcast over 32 MiB) and measures
// device_bytes. Every rank must call it at the same point. `timeout_ms` bounds the rendezvous.
// Errors: those of process_group_from_env and communicator_open, with the rank in the message.
Result<World> world_open(ComputeDevice& device, int timeout_ms = 300'000);

}  // namespace lathe
