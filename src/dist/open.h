#pragma once
// Opening the world communicator of a process group (dist/process_group.h):
//
//   a single process          LocalCommunicator (no library, no network)
//   several, computing on CPU MpiCommunicator over MPI_COMM_WORLD: the job must be started by
//                             mpirun (or srun with MPI support), so that MPI's world is the group
//   several, on CUDA          NcclCommunicator on `device`; rank 0's NCCL id reaches the others
//                             through MPI when mpirun started the job and this build has MPI,
//                             otherwise through the TCP rendezvous (dist/rendezvous.h) at
//                             MASTER_ADDR and MASTER_PORT, or MASTER_PORT + 1 under torchrun
//                             (whose own store listens on MASTER_PORT)
//
// Every rank must call it at the same point; it returns when the communicator is made on all.

#include <memory>

#include "core/status.h"
#include "dist/communicator.h"
#include "dist/process_group.h"
#include "ops/context.h"

namespace lathe {

// The TCP port of the rendezvous for `group` (see above); 0 when MASTER_PORT is unset.
int rendezvous_port(const ProcessGroupInfo& group);

// Errors: a build without the library needed (MPI for CPU, CUDA for NCCL), an MPI world whose size
// or rank disagrees with the launcher's variables, a rendezvous that fails or times out after
// `timeout_ms`, NCCL failing to make the communicator.
Result<std::unique_ptr<Communicator>> communicator_open(const ProcessGroupInfo& group,
                                                        Backend backend, int device,
                                                        int timeout_ms = 300'000);

}  // namespace lathe
