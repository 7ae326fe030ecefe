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
// stderr and process group (a Ctrl-C in a terminal reaches them all directly too), start with no
// signal blocked (whatever mask the launcher was given) and with the signal actions the launcher
// was given, as exec keeps them (a SIGHUP ignored by nohup stays ignored in the ranks), except
// SIGCHLD at its default action (an inherited SIG_IGN would reap a rank's own children before
// its waitpid), and each asks Linux for SIGTERM when the launcher dies
// (PR_SET_PDEATHSIG), so a launcher killed by SIGKILL leaves no orphans. One node only: across
// nodes, srun or mpirun start one process per GPU themselves (docs/DISTRIBUTED.md).
//
// Supervision (LaunchSupervisor holds these rules; launch_run applies them to real processes):
//   - The ranks start in order, 0 first. SIGINT, SIGTERM and SIGHUP reaching the launcher at any
//     moment are sent on to every rank running then (a trainer then saves a checkpoint and exits
//     128 + the signal: 130, 143 or 129); one that arrives before every rank has started also
//     stops the start: no further rank starts.
//   - A rank's end is expected when its code is 0, or 128 + a signal the launcher sent on (a
//     trainer that stopped and saved, or a process that signal killed): the launcher waits for the
//     others however long they take, e.g. while rank 0 writes the model of the checkpoint.
//   - The first other end (a non-zero code, or death by a signal nobody sent on) is a failure:
//     the launcher reports (and `lathe launch` prints)
//       lathe: error: launch: rank R (pid P) exited with status C; stopping the other K ranks
//     (or "was killed by SIGKILL"; K counts the ranks running), starts no further rank, sends the
//     running ones SIGTERM, and SIGKILL to those still running `grace_s` seconds later. A rank
//     that cannot be started (fork, pipe or exec failing) stops the others the same way.
//   - Every rank is reaped as it ends, and launch_run returns only once every rank it started has
//     ended and been reaped, on every path.
//   - The exit code is that of the first rank to end non-zero (128 + the signal's number for a
//     rank killed by a signal), else 128 + the signal that stopped the start before every rank had
//     started, else 0 once every rank has exited 0.

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
// any clock that does not go back. Each rank is to start, running, ended, or never started (the
// start was stopped before it).
class LaunchSupervisor {
public:
    // `world_size` ranks, none started yet.
    LaunchSupervisor(int world_size, double grace_s);

    struct Decision {
        std::vector<int> terminate;  // ranks to send SIGTERM to
        std::string error;           // a line to print after "lathe: error: ", or empty
    };
    // The rank to start next (0, 1, ... in order); nullopt once every rank has started, or once a
    // signal, a failure or a failed start has stopped the start.
    std::optional<int> next_to_start() const;
    // Rank `rank`, next_to_start's, runs.
    void on_started(int rank);
    // Rank `rank`, next_to_start's, could not be started (fork, pipe or exec failed) at `now`:
    // no further rank starts, and the running ranks are to be stopped as after a failure (the
    // ranks to send SIGTERM to; SIGKILL once the grace runs out).
    std::vector<int> on_start_failed(int rank, double now);
    // Rank `rank` (process `pid`), running, ended with waitpid() status `wait_status` at `now`.
    Decision on_exit(int rank, pid_t pid, int wait_status, double now);
    // The launcher received `sig` (SIGINT, SIGTERM, SIGHUP): the running ranks to send it on to.
    // No further rank starts.
    std::vector<int> on_signal(int sig);
    // The ranks to SIGKILL at `now`: those still running once the grace has run out (each once).
    std::vector<int> overdue(double now);
    // When the grace runs out; nullopt while no rank has failed.
    std::optional<double> grace_deadline() const;

    bool running(int rank) const { return state_[size_t(rank)] == RankState::kRunning; }
    int running_count() const;
    // No rank running and none left to start.
    bool finished() const;
    // The first non-zero end's exit code, else 128 + the signal that stopped the start before
    // every rank had started, else 0.
    int exit_code() const;

private:
    enum class RankState { kToStart, kRunning, kEnded, kNeverStarted };
    // The ranks still to start never start.
    void stop_start();
    // The ranks running now, in rank order.
    std::vector<int> running_ranks() const;
    // A failure at `now`: the running ranks, to stop, and the grace's deadline.
    std::vector<int> begin_stopping(double now);

    std::vector<RankState> state_;
    std::vector<bool> killed_;
    double grace_s_;
    std::vector<int> forwarded_;  // the signals sent on
    bool stopping_ = false;       // a rank failed, or could not be started
    std::optional<double> deadline_;
    int exit_code_ = 0;
    int start_stopped_by_ = 0;  // the signal that stopped the start before every rank started
};

// Receives the failure line (LaunchSupervisor::Decision::error) the moment a rank fails, before
// the others are stopped, which may take --grace-s; cli/ prints it after "lathe: error: ".
using LaunchReport = std::function<void(const std::string& error)>;

// Starts options.command as options.gpus ranks and supervises them (above) until all have ended;
// returns the exit code. `report` (may be empty) gets each failure line. Errors, returned once
// every rank started has been stopped and reaped: bad options, a command not found, a command
// that cannot be executed (exec's reason, reported by the child through a close-on-exec pipe),
// fork or pipe failing. SIGINT, SIGTERM, SIGHUP and SIGCHLD are blocked while it runs and taken
// with sigtimedwait, so no other thread of the process may leave them unblocked (the `lathe
// launch` process has one thread); a signal of those three still pending once every rank has
// ended changes nothing.
Result<int> launch_run(const LaunchOptions& options, const LaunchReport& report);

}  // namespace lathe
