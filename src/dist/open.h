#pragma once
// Opening the world communicator of a process group (dist/process_group.h):
//
//   a single process          LocalCommunicator (no library, no network)
//   several, computing on CPU MpiCommunicator over MPI_COMM_WORLD: the job must be started by
//                             mpirun (or srun with MPI support), so that MPI's world is the group;
//                             under torchrun or `lathe launch` it is an error saying so
//   several, on CUDA          NcclCommunicator on `device`; rank 0's NCCL id reaches the others
//                             through MPI when mpirun started the job and this build has MPI,
//                             otherwise through the TCP rendezvous (dist/rendezvous.h) at
//                             MASTER_ADDR and MASTER_PORT, or MASTER_PORT + 1 under torchrun
//                             (whose own store may listen on MASTER_PORT; below)
//
// Why MASTER_PORT + 1 under torchrun. torchrun's agent (one per node, the parent of that node's
// workers) exports to its workers the MASTER_ADDR and MASTER_PORT of a c10d TCPStore:
//   - static rendezvous (`--master-addr/--master-port`, or `--rdzv-backend static`): node 0's
//     agent itself creates the TCPStore server on MASTER_PORT, before starting any worker, and
//     tells the workers TORCHELASTIC_USE_AGENT_STORE=True, so that PyTorch's env:// init connects
//     to that store as a client instead of listening. The port stays bound by the agent for the
//     whole job: a worker that binds MASTER_PORT fails with "address in use".
//   - c10d rendezvous (`--rdzv-backend c10d`, `--standalone`): MASTER_PORT is either the port of
//     the rendezvous store that the agent shares with its workers (again bound by the agent), or,
//     where the agent does not share it, a free port the agent found by binding port 0 and closing
//     it, left for worker 0's own store.
// So MASTER_PORT may be taken by torchrun and no worker may count on binding it. torchrun claims
// nothing on MASTER_PORT + 1, and rank 0 (a worker on node 0, the host MASTER_ADDR names) binds
// that; a port taken there by something else fails rank 0's rendezvous with an error naming the
// port (then pick another MASTER_PORT). srun, mpirun and `lathe launch` listen on nothing, so
// there the rendezvous uses MASTER_PORT itself.
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
