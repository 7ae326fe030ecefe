#pragma once
// Which process of a multi-process job this one is: its rank among all processes (the world), the
// world's size, and its rank among the processes of its own machine (the local rank, which picks
// its GPU). Read from the variables the launcher sets; a process started without a launcher is
// rank 0 of a world of 1.
//
// Launchers, in the order they are looked for (the first whose variables are set wins, since a
// launcher may run inside another's allocation: torchrun or mpirun inside a SLURM job):
//   torchrun   RANK, WORLD_SIZE, LOCAL_RANK (LOCAL_WORLD_SIZE when set), MASTER_ADDR, MASTER_PORT
//   mpirun     OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK
//              (OMPI_COMM_WORLD_LOCAL_SIZE when set)
//   srun       SLURM_PROCID, SLURM_STEP_NUM_TASKS, SLURM_LOCALID; srun is taken to be the launcher
//              only when SLURM_STEP_NUM_TASKS is set, which srun sets for the tasks of a job step
//              (and sbatch does not). SLURM_NTASKS is not read: a batch script's own process
//              sees SLURM_PROCID=0 and the SLURM_NTASKS of the whole allocation, and `srun -E`
//              passes that allocation's count on to the step's tasks. SLURM_STEP_TASKS_PER_NODE
//              is not read either: it may be a list such as "4(x2)".
// `lathe launch` (dist/launch.h) sets torchrun's variables plus LATHE_LAUNCHER=launch, which makes
// the launcher Launcher::kLaunch: the rendezvous then listens on MASTER_PORT itself, where under
// torchrun it keeps clear of torchrun's own store (dist/open.h).
// A process of a SLURM job that srun did not start (the batch script itself, or a shell of
// salloc) is a single process, as without a launcher, whatever SLURM_NTASKS says: a batch script
// runs one copy of itself (`lathe prepare` before the srun line is one process) and the ranks are
// the tasks that srun starts.
// MASTER_ADDR and MASTER_PORT are read whichever launcher is found: they name the TCP rendezvous
// of rank 0 (dist/rendezvous.h) where no MPI carries the NCCL id. Under srun, which sets neither,
// each has a default every task of the step computes alike: MASTER_ADDR the first host of
// SLURM_STEP_NODELIST, the nodes of this step, where srun starts task 0 (a step may leave out the
// job's first node: `srun -r 1`, two steps on half the nodes each, a heterogeneous step; the job's
// SLURM_JOB_NODELIST is used only when the step's list is absent), and MASTER_PORT
// 29500 + SLURM_JOB_ID % 1000 (in [29500, 30499], so two jobs sharing a node differ unless their
// ids differ by a multiple of 1000). The port is the job's, not the step's: two multi-rank steps of
// one job that run at the same time need distinct MASTER_PORTs, set by hand (`MASTER_PORT=29611
// srun ...`), as their first hosts may be the same. Set MASTER_ADDR or MASTER_PORT to override.
//
// Everything here is a pure function of an environment map, so tests hand it any map.

#include <map>
#include <string>
#include <string_view>

#include "core/status.h"

namespace lathe {

enum class Launcher : uint8_t { kNone, kTorchrun, kMpirun, kSlurm, kLaunch };

// "none", "torchrun", "mpirun", "srun", "lathe launch".
std::string_view launcher_name(Launcher launcher);

struct ProcessGroupInfo {
    Launcher launcher = Launcher::kNone;
    int rank = 0;        // in [0, world_size)
    int world_size = 1;  // >= 1
    int local_rank = 0;  // among the processes of this machine, in [0, local_world_size) when known
    int local_world_size = 0;  // processes on this machine; 0 when the launcher does not say
    std::string master_addr;   // rank 0's host for the TCP rendezvous; empty when unset
    int master_port = 0;       // its port, in [1, 65535]; 0 when unset

    bool single_process() const { return world_size == 1; }
    // "rank 3 of 8 (local rank 1, torchrun)", for logs and messages.
    std::string describe() const;
};

using EnvMap = std::map<std::string, std::string, std::less<>>;

// The process group `env` describes. Errors (invalid argument) name the variable: a value that is
// not a whole number, a rank outside [0, world size), a world size below 1, a local rank outside
// [0, local size) or above the rank, a launcher's variable set without its partners (RANK without
// WORLD_SIZE), a world of more than one process without a local rank, a port outside [1, 65535],
// LATHE_LAUNCHER set to anything but "launch" or without RANK and WORLD_SIZE, and under srun a
// SLURM_STEP_NODELIST (SLURM_JOB_NODELIST when that is unset) that is not a SLURM host list or a
// SLURM_JOB_ID that is not a whole number.
Result<ProcessGroupInfo> process_group_from_env(const EnvMap& env);

// The first host of a SLURM host list (SLURM_STEP_NODELIST, SLURM_JOB_NODELIST):
// "gpu[001-004,010],login1" -> "gpu001", "node1,node2" -> "node1", "a[1-2]-ib" -> "a1-ib",
// "r[1-2]n[08-09]" -> "r1n08". Hosts are separated by commas outside brackets; a bracket holds
// comma-separated numbers or low-high ranges (low <= high, digits only), and a host may have
// several brackets. The first host takes each bracket's first number as written, so zero padding
// stays. The whole list is checked: an empty list or host, an unclosed, nested or empty bracket, a
// range that is not low-high numbers, or a space is an error (invalid argument) saying where.
Result<std::string> slurm_first_host(std::string_view nodelist);

// This process's environment (environ), as a map for process_group_from_env.
EnvMap process_environment();

}  // namespace lathe
