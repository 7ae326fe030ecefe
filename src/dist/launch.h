#pragma once
// `lathe launch`: N processes of one command on this machine, one per GPU, each with the variables
// torchrun gives its workers, so that every lathe command that reads a process group
// (dist/process_group.h) runs data parallel under it as under torchrun:
//
//   RANK = LOCAL_RANK = i (0..N-1), WORLD_SIZE = LOCAL_WORLD_SIZE = N, MASTER_ADDR = 127.0.0.1,
//   MASTER_PORT = --master-port, or a free port of 127.0.0.1 found by binding port 0 (free when
//   looked at; rank 0's rendezvous binds it moments later), LATHE_LAUNCHER = launch (the launcher
//   is then Launcher::kLaunch, whose rendezvous listens on MASTER_PORT itself: dist/open.h).
//
// Every other variable is passed on unchanged. The children keep the launcher's stdin, stdout,
// stderr and process group (a Ctrl-C in a terminal reaches them all directly too), and each asks
// Linux for SIGTERM when the launcher dies (PR_SET_PDEATHSIG), so a launcher killed by SIGKILL
// leaves no orphans. One node only: across nodes, srun or mpirun start one process per GPU
// themselves (docs/DISTRIBUTED.md).
//
// Supervision (LaunchSupervisor holds these rules; launch_run applies them to real processes):
//   - SIGINT, SIGTERM and SIGHUP reaching the launcher are sent on to every rank still running
//     (a trainer then saves a checkpoint and exits 128 + the signal: 130, 143 or 129).
//   - A rank's end is expected when its code is 0, or 128 + a signal the launcher sent on (a
//     trainer that stopped and saved, or a process that signal killed): the launcher waits for the
//     others however long they take, e.g. while rank 0 writes the model of the checkpoint.
//   - The first other end (a non-zero code, or death by a signal nobody sent on) is a failure:
//     the launcher reports (and `lathe launch` prints)
//       lathe: error: launch: rank R (pid P) exited with status C; stopping the other K ranks
//     (or "was killed by SIGKILL"; K counts the ranks still running), sends them SIGTERM, and
//     SIGKILL to those still running `grace_s` seconds later.
//   - The exit code is that of the first rank to end non-zero (128 + the signal's number for a
//     rank killed by a signal), else 0 once every rank has exited 0.

#include <sys/types.h>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "dist/process_group.h"

namespace lathe {

// The most ranks one launcher starts: one machine's GPUs, with room to spare.
inline constexpr int kLaunchMaxRanks = 256;

struct LaunchOptions {
    int gpus = 0;                      // ranks to start, >= 1 (not checked against the GPUs seen)
    int master_port = 0;               // 1..65535, or 0 for a free port
    double grace_s = 30;               // SIGTERM to SIGKILL, >= 0
    std::vector<std::string> command;  // the program and its arguments; "lathe" is this binary
};

// Errors (invalid argument) name the flag: --gpus below 1, --master-port outside [0, 65535],
// --grace-s negative or not finite, no command.
Status launch_options_check(const LaunchOptions& options);

// `base` with the variables of rank `rank` of `world_size` (above) set, replacing any there.
EnvMap launch_rank_environment(const EnvMap& base, int rank, int world_size, int master_port);

// The file to execute for `name`: `self_exe` for "lathe", `name` itself when it holds a '/', else
// the first executable regular file `name` in the folders of `path_var` (a PATH value; an empty
// entry is the current folder). Errors (invalid argument) name the command and the folders looked
// in; a name with a '/' is left to exec, whose failure launch_run reports.
Result<std::string> launch_resolve_program(std::string_view name, std::string_view path_var,
                                           std::string_view self_exe);

// The kernel's range of ephemeral ports (/proc/sys/net/ipv4/ip_local_port_range: "LOW HIGH"),
// parsed from that file's text; {32768, 60999}, Linux's default, when the text does not parse.
struct PortRange {
    int low = 32768;
    int high = 60999;
};
PortRange launch_parse_port_range(std::string_view text);

// A TCP port for rank 0's rendezvous that every address of this host can bind now (as rank 0 binds
// it: SO_REUSEADDR, IPv6 dual stack where the host has it), drawn at random from half the
// ephemeral range's low end up to the lower of that end and kLaunchPortCap: a port the kernel
// picked for a bind to port 0 and that was then released can go to any later socket that binds or
// connects without a port (NCCL's bootstrap, any client), so rank 0 could find it taken; a port
// below the range is never handed out that way. The cap keeps clear of ports fixed by convention
// just below Linux's default range: torchrun's 29500 (and lathe's srun default from 29500 up) and
// Kubernetes' NodePorts, 30000-32767. The kernel's pick for port 0 is the fallback where that
// leaves fewer than 64 ports or 64 draws find no free one.
inline constexpr int kLaunchPortCap = 29499;
Result<int> launch_free_port();
// The interval launch_free_port draws from for an ephemeral range starting at `ephemeral_low`:
// [max(1024, ephemeral_low / 2), min(ephemeral_low - 1, kLaunchPortCap)]; empty (high < low + 64)
// where that leaves fewer than 64 ports, and the kernel's pick is taken instead.
PortRange launch_port_draw_range(int ephemeral_low);
// This host's ephemeral range (/proc/sys/net/ipv4/ip_local_port_range, parsed as above).
PortRange launch_ephemeral_port_range();

// "SIGKILL" for SIGKILL (the common signals by name), "signal 42" otherwise.
std::string signal_name(int sig);
// What a waitpid() status says: "exited with status 3", "was killed by SIGKILL".
std::string wait_status_text(int wait_status);
// The shell's exit code for a waitpid() status: the status, or 128 + the signal.
int wait_status_exit_code(int wait_status);

// The launcher's decisions, apart from the processes (tests feed it events). Times are seconds on
// any clock that does not go back.
class LaunchSupervisor {
public:
    LaunchSupervisor(int world_size, double grace_s);

    struct Decision {
        std::vector<int> terminate;  // ranks to send SIGTERM to
        std::string error;           // a line to print after "lathe: error: ", or empty
    };
    // Rank `rank` (process `pid`) ended with waitpid() status `wait_status` at `now`.
    Decision on_exit(int rank, pid_t pid, int wait_status, double now);
    // The launcher received `sig` (SIGINT, SIGTERM, SIGHUP): the ranks to send it on to.
    std::vector<int> on_signal(int sig);
    // The ranks to SIGKILL at `now`: those still running once the grace has run out (each once).
    std::vector<int> overdue(double now);
    // When the grace runs out; nullopt while no rank has failed.
    std::optional<double> grace_deadline() const;

    bool running(int rank) const { return running_[size_t(rank)]; }
    int running_count() const;
    bool finished() const { return running_count() == 0; }
    // The first non-zero end's exit code, else 0.
    int exit_code() const { return exit_code_; }

private:
    std::vector<bool> running_;
    std::vector<bool> killed_;
    double grace_s_;
    std::vector<int> forwarded_;  // the signals sent on
    bool stopping_ = false;       // a rank failed
    std::optional<double> deadline_;
    int exit_code_ = 0;
};

// Receives the failure line (LaunchSupervisor::Decision::error) the moment a rank fails, before
// the others are stopped, which may take --grace-s; cli/ prints it after "lathe: error: ".
using LaunchReport = std::function<void(const std::string& error)>;

// Starts options.command as options.gpus ranks and supervises them (above) until all have ended;
// returns the exit code. `report` (may be empty) gets each failure line. Errors, with no rank left
// running: bad options, a command not found, a command that cannot be executed (exec's reason,
// reported by the child through a close-on-exec pipe), fork or pipe failing.
Result<int> launch_run(const LaunchOptions& options, const LaunchReport& report);

}  // namespace lathe
