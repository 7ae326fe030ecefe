#include "dist/launch.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <iterator>
#include <random>

#include "core/check.h"
#include "core/log.h"

namespace lathe {

Status launch_options_check(const LaunchOptions& o) {
    if (o.gpus < 1)
        return invalid_argument_error(
            "launch: --gpus {}: start at least one process (--gpus 1 or "
            "more)",
            o.gpus);
    if (o.gpus > kLaunchMaxRanks)
        return invalid_argument_error(
            "launch: --gpus {}: one machine's ranks, at most {}; across machines start the ranks "
            "with srun or mpirun",
            o.gpus, kLaunchMaxRanks);
    if (o.master_port < 0 || o.master_port > 65535)
        return invalid_argument_error(
            "launch: --master-port {} is not a TCP port (1 to 65535, or 0 for a free one)",
            o.master_port);
    if (!std::isfinite(o.grace_s) || o.grace_s < 0)
        return invalid_argument_error(
            "launch: --grace-s {}: the seconds between SIGTERM and SIGKILL must be 0 or more",
            o.grace_s);
    if (o.command.empty() || o.command.front().empty())
        return invalid_argument_error(
            "launch: no command to start; give it after the options, e.g. `lathe launch --gpus 2 "
            "lathe train configs/tiny.yaml --run-dir runs/tiny`");
    return ok_status();
}

EnvMap launch_rank_environment(const EnvMap& base, int rank, int world_size, int master_port) {
    EnvMap env = base;
    env.insert_or_assign("RANK", std::to_string(rank));
    env.insert_or_assign("LOCAL_RANK", std::to_string(rank));
    env.insert_or_assign("WORLD_SIZE", std::to_string(world_size));
    env.insert_or_assign("LOCAL_WORLD_SIZE", std::to_string(world_size));
    env.insert_or_assign("MASTER_ADDR", "127.0.0.1");
    env.insert_or_assign("MASTER_PORT", std::to_string(master_port));
    env.insert_or_assign("LATHE_LAUNCHER", "launch");
    return env;
}

Result<std::string> launch_resolve_program(std::string_view name, std::string_view path_var,
                                           std::string_view self_exe) {
    if (name.empty()) return invalid_argument_error("launch: the command is an empty string");
    if (name == "lathe") {
        if (self_exe.empty())
            return failed_precondition_error(
                "launch: cannot find this lathe's own file (/proc/self/exe); give the path of "
                "lathe instead of `lathe`");
        return std::string(self_exe);
    }
    if (name.find('/') != std::string_view::npos) return std::string(name);
    std::string not_executable;  // a file of that name that cannot be run, for the message
    size_t start = 0;
    for (;;) {
        size_t colon = path_var.find(':', start);
        if (colon == std::string_view::npos) colon = path_var.size();
        std::string dir(path_var.substr(start, colon - start));
        if (dir.empty()) dir = ".";
        const std::string candidate = dir + "/" + std::string(name);
        struct stat st {};
        if (::stat(candidate.c_str(), &st) == 0 && S_ISREG(st.st_mode)) {
            if (::access(candidate.c_str(), X_OK) == 0) return candidate;
            if (not_executable.empty()) not_executable = candidate;
        }
        if (colon == path_var.size()) break;
        start = colon + 1;
    }
    if (!not_executable.empty())
        return invalid_argument_error(
            "launch: command '{}': {} is not executable (chmod +x it, or give another path)", name,
            not_executable);
    return invalid_argument_error(
        "launch: command '{}' not found: no executable file of that name in the folders of PATH "
        "({}); give its path, or `lathe` for this lathe",
        name, path_var);
}

PortRange launch_parse_port_range(std::string_view text) {
    PortRange r;
    int low = 0, high = 0;
    const std::string t(text);
    if (std::sscanf(t.c_str(), "%d %d", &low, &high) == 2 && low >= 1 && low <= high &&
        high <= 65535)
        r = {low, high};
    return r;
}

namespace {

// Whether a listening socket can bind `port` on every address now, as rank 0 binds it
// (dist/rendezvous.cpp: IPv6 with dual stack where the host has it, else IPv4; SO_REUSEADDR).
bool port_binds_everywhere(int port) {
    for (const int family : {AF_INET6, AF_INET}) {
        const int fd = ::socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0) continue;  // no IPv6 here: IPv4 decides
        const int one = 1, zero = 0;
        ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        bool ok = false;
        if (family == AF_INET6) {
            ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
            sockaddr_in6 a{};
            a.sin6_family = AF_INET6;
            a.sin6_addr = in6addr_any;
            a.sin6_port = htons(uint16_t(port));
            ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
        } else {
            sockaddr_in a{};
            a.sin_family = AF_INET;
            a.sin_addr.s_addr = htonl(INADDR_ANY);
            a.sin_port = htons(uint16_t(port));
            ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
        }
        ::close(fd);
        return ok;
    }
    return false;
}

std::string read_text(const char* path) {
    std::string out;
    if (FILE* f = std::fopen(path, "r")) {
        char buf[128];
        const size_t n = std::fread(buf, 1, sizeof buf, f);
        out.assign(buf, n);
        std::fclose(f);
    }
    return out;
}

// The kernel's pick for port 0 of 127.0.0.1.
Result<int> kernel_free_port() {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return io_error("launch: socket() for a free port: {}", std::strerror(errno));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = 0;
    socklen_t len = sizeof(addr);
    const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
                    ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
    const int err = errno;
    ::close(fd);
    if (!ok)
        return io_error("launch: finding a free port of 127.0.0.1: {}; give one with --master-port",
                        std::strerror(err));
    return int(ntohs(addr.sin_port));
}

}  // namespace

PortRange launch_port_draw_range(int ephemeral_low) {
    return {std::max(1024, ephemeral_low / 2), std::min(ephemeral_low - 1, kLaunchPortCap)};
}

PortRange launch_ephemeral_port_range() {
    return launch_parse_port_range(read_text("/proc/sys/net/ipv4/ip_local_port_range"));
}

Result<int> launch_free_port() {
    const PortRange draw = launch_port_draw_range(launch_ephemeral_port_range().low);
    if (draw.high - draw.low >= 64) {
        std::mt19937 rng(std::random_device{}());
        std::uniform_int_distribution<int> pick(draw.low, draw.high);
        for (int tries = 0; tries < 64; ++tries) {
            const int port = pick(rng);
            if (port_binds_everywhere(port)) return port;
        }
    }
    return kernel_free_port();
}

std::string signal_name(int sig) {
    switch (sig) {
        case SIGHUP:
            return "SIGHUP";
        case SIGINT:
            return "SIGINT";
        case SIGQUIT:
            return "SIGQUIT";
        case SIGILL:
            return "SIGILL";
        case SIGTRAP:
            return "SIGTRAP";
        case SIGABRT:
            return "SIGABRT";
        case SIGBUS:
            return "SIGBUS";
        case SIGFPE:
            return "SIGFPE";
        case SIGKILL:
            return "SIGKILL";
        case SIGUSR1:
            return "SIGUSR1";
        case SIGSEGV:
            return "SIGSEGV";
        case SIGUSR2:
            return "SIGUSR2";
        case SIGPIPE:
            return "SIGPIPE";
        case SIGALRM:
            return "SIGALRM";
        case SIGTERM:
            return "SIGTERM";
        case SIGXCPU:
            return "SIGXCPU";
        case SIGXFSZ:
            return "SIGXFSZ";
        case SIGSYS:
            return "SIGSYS";
        default:
            return fmt::format("signal {}", sig);
    }
}

std::string wait_status_text(int wait_status) {
    if (WIFSIGNALED(wait_status))
        return fmt::format("was killed by {}", signal_name(WTERMSIG(wait_status)));
    return fmt::format("exited with status {}", WEXITSTATUS(wait_status));
}

int wait_status_exit_code(int wait_status) {
    if (WIFSIGNALED(wait_status)) return 128 + WTERMSIG(wait_status);
    return WEXITSTATUS(wait_status);
}

LaunchSupervisor::LaunchSupervisor(int world_size, double grace_s)
    : state_(size_t(world_size), RankState::kToStart),
      killed_(size_t(world_size), false),
      grace_s_(grace_s) {}

int LaunchSupervisor::running_count() const {
    return int(std::count(state_.begin(), state_.end(), RankState::kRunning));
}

bool LaunchSupervisor::finished() const {
    for (const RankState s : state_)
        if (s == RankState::kToStart || s == RankState::kRunning) return false;
    return true;
}

int LaunchSupervisor::exit_code() const {
    if (exit_code_ != 0) return exit_code_;
    if (start_stopped_by_ != 0) return 128 + start_stopped_by_;
    return 0;
}

std::optional<int> LaunchSupervisor::next_to_start() const {
    for (size_t r = 0; r < state_.size(); ++r)
        if (state_[r] == RankState::kToStart) return int(r);
    return std::nullopt;
}

void LaunchSupervisor::on_started(int rank) {
    LATHE_CHECK(next_to_start() == rank);
    state_[size_t(rank)] = RankState::kRunning;
}

void LaunchSupervisor::stop_start() {
    for (RankState& s : state_)
        if (s == RankState::kToStart) s = RankState::kNeverStarted;
}

std::vector<int> LaunchSupervisor::running_ranks() const {
    std::vector<int> to;
    for (size_t r = 0; r < state_.size(); ++r)
        if (state_[r] == RankState::kRunning) to.push_back(int(r));
    return to;
}

std::vector<int> LaunchSupervisor::begin_stopping(double now) {
    stop_start();
    stopping_ = true;
    deadline_ = now + grace_s_;
    return running_ranks();
}

std::vector<int> LaunchSupervisor::on_start_failed(int rank, double now) {
    LATHE_CHECK(next_to_start() == rank);
    return begin_stopping(now);
}

LaunchSupervisor::Decision LaunchSupervisor::on_exit(int rank, pid_t pid, int wait_status,
                                                     double now) {
    LATHE_CHECK(rank >= 0 && size_t(rank) < state_.size() && running(rank));
    state_[size_t(rank)] = RankState::kEnded;
    Decision d;
    const int code = wait_status_exit_code(wait_status);
    if (code != 0 && exit_code_ == 0) exit_code_ = code;
    if (code == 0 || stopping_) return d;
    for (const int sig : forwarded_)
        if (code == 128 + sig) return d;  // stopped by the user's signal, as asked
    d.terminate = begin_stopping(now);
    const size_t k = d.terminate.size();
    d.error =
        fmt::format("launch: rank {} (pid {}) {}", rank, long(pid), wait_status_text(wait_status));
    if (k == 1) d.error += "; stopping the other rank";
    if (k > 1) d.error += fmt::format("; stopping the other {} ranks", k);
    return d;
}

std::vector<int> LaunchSupervisor::on_signal(int sig) {
    forwarded_.push_back(sig);
    if (next_to_start() && start_stopped_by_ == 0) start_stopped_by_ = sig;
    stop_start();
    return running_ranks();
}

std::vector<int> LaunchSupervisor::overdue(double now) {
    std::vector<int> to;
    if (!deadline_ || now < *deadline_) return to;
    for (size_t r = 0; r < state_.size(); ++r) {
        if (state_[r] == RankState::kRunning && !killed_[r]) {
            killed_[r] = true;
            to.push_back(int(r));
        }
    }
    return to;
}

std::optional<double> LaunchSupervisor::grace_deadline() const {
    return deadline_;
}

namespace {

double monotonic_s() {
    timespec ts{};
    ::clock_gettime(CLOCK_MONOTONIC, &ts);
    return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
}

// This binary's path, or empty when /proc is not there.
std::string self_executable() {
    std::error_code ec;
    const auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
    return ec ? std::string() : p.string();
}

constexpr int kForwarded[] = {SIGINT, SIGTERM, SIGHUP};

bool is_forwarded(int sig) {
    return std::find(std::begin(kForwarded), std::end(kForwarded), sig) != std::end(kForwarded);
}

// While the launcher supervises, SIGINT, SIGTERM, SIGHUP and SIGCHLD are blocked and taken with
// sigtimedwait (blocked before the first rank starts, so none that arrives meanwhile is lost), and
// SIGCHLD has its default action (an inherited SIG_IGN would reap the children before waitpid
// sees them). One of the three the launcher was started ignoring (nohup's SIGHUP) is left alone:
// Linux queues a blocked signal even when its action is SIG_IGN, and sigtimedwait would take it.
// Restores the mask and SIGCHLD's action on scope exit.
class SignalScope {
public:
    SignalScope() {
        sigemptyset(&set_);
        for (const int s : kForwarded) {
            struct sigaction now {};
            if (::sigaction(s, nullptr, &now) == 0 && now.sa_handler == SIG_IGN) continue;
            sigaddset(&set_, s);
        }
        sigaddset(&set_, SIGCHLD);
        ::pthread_sigmask(SIG_BLOCK, &set_, &old_mask_);
        struct sigaction dfl {};
        dfl.sa_handler = SIG_DFL;
        sigemptyset(&dfl.sa_mask);
        ::sigaction(SIGCHLD, &dfl, &old_chld_);
    }
    ~SignalScope() {
        ::sigaction(SIGCHLD, &old_chld_, nullptr);
        ::pthread_sigmask(SIG_SETMASK, &old_mask_, nullptr);
    }
    SignalScope(const SignalScope&) = delete;
    SignalScope& operator=(const SignalScope&) = delete;

    // The next of the four signals, waiting up to `wait_s` seconds (0: only one already pending);
    // 0 when none came.
    int take(double wait_s) const {
        timespec ts{};
        ts.tv_sec = time_t(wait_s);
        ts.tv_nsec = long((wait_s - double(ts.tv_sec)) * 1e9);
        siginfo_t info{};
        const int sig = ::sigtimedwait(&set_, &info, &ts);
        return sig > 0 ? sig : 0;
    }

private:
    sigset_t set_{};
    sigset_t old_mask_{};
    struct sigaction old_chld_ {};
};

// What the children need, built before the first fork: the child of fork only calls
// async-signal-safe functions.
struct RankExec {
    std::string program;
    std::vector<char*> argv;
    std::vector<std::vector<std::string>> env_strings;  // per rank
    std::vector<std::vector<char*>> envp;               // per rank
    struct sigaction default_action {};
    sigset_t empty_mask{};
    pid_t launcher = 0;
};

// The child of fork for rank `rank`: the signal actions the launcher was given (an ignored signal
// stays ignored, as nohup and a shell's background jobs expect; every other one, and SIGCHLD,
// at its default), no signal blocked, SIGTERM when the launcher dies, then execve. Writes exec's
// errno to `error_fd` (close-on-exec) when it fails.
[[noreturn]] void rank_exec(const RankExec& e, int rank, int error_fd) {
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != e.launcher) ::_exit(143);  // the launcher died before prctl
    // Actions first, then the mask: a signal sent on to this rank before it executes is pending
    // here and takes its default action as it is unblocked.
    for (int sig = 1; sig < NSIG; ++sig) {
        if (sig == SIGKILL || sig == SIGSTOP) continue;
        struct sigaction now {};
        if (::sigaction(sig, nullptr, &now) != 0) continue;
        if (sig == SIGCHLD || now.sa_handler != SIG_IGN)
            ::sigaction(sig, &e.default_action, nullptr);
    }
    ::pthread_sigmask(SIG_SETMASK, &e.empty_mask, nullptr);
    ::execve(e.program.c_str(), e.argv.data(), e.envp[size_t(rank)].data());
    const int err = errno;
    ssize_t w = 0;
    do {
        w = ::write(error_fd, &err, sizeof(err));
    } while (w < 0 && errno == EINTR);
    ::_exit(127);
}

// Forks and executes rank `rank`; returns its pid once execve has succeeded (the error pipe reads
// end of file). A child whose execve failed is reaped here.
Result<pid_t> rank_start(const RankExec& e, int rank) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0)
        return io_error("launch: pipe for rank {}: {}", rank, std::strerror(errno));
    const pid_t pid = ::fork();
    if (pid < 0) {
        const int err = errno;
        ::close(fds[0]);
        ::close(fds[1]);
        return io_error("launch: fork for rank {}: {}", rank, std::strerror(err));
    }
    if (pid == 0) {
        ::close(fds[0]);
        rank_exec(e, rank, fds[1]);
    }
    ::close(fds[1]);
    int err = 0;
    ssize_t got = 0;
    do {
        got = ::read(fds[0], &err, sizeof(err));
    } while (got < 0 && errno == EINTR);
    ::close(fds[0]);
    if (got == ssize_t(sizeof(err))) {  // execve failed; end of file means it succeeded
        int st = 0;
        while (::waitpid(pid, &st, 0) < 0 && errno == EINTR) {
        }
        return invalid_argument_error("launch: cannot execute '{}' for rank {}: {}", e.program,
                                      rank, std::strerror(err));
    }
    return pid;
}

}  // namespace

Result<int> launch_run(const LaunchOptions& o, const LaunchReport& report) {
    LATHE_RETURN_IF_ERROR(launch_options_check(o));
    const EnvMap base = process_environment();
    const auto path_it = base.find("PATH");
    // execvp's search path when PATH is unset.
    const std::string path_var = path_it != base.end() ? path_it->second : "/usr/bin:/bin";
    RankExec e;
    LATHE_ASSIGN_OR_RETURN(e.program,
                           launch_resolve_program(o.command.front(), path_var, self_executable()));
    int port = o.master_port;
    if (port == 0) {
        LATHE_ASSIGN_OR_RETURN(port, launch_free_port());
    }
    const int n = o.gpus;

    for (const std::string& a : o.command) e.argv.push_back(const_cast<char*>(a.c_str()));
    e.argv.push_back(nullptr);
    e.env_strings.resize(size_t(n));
    e.envp.resize(size_t(n));
    for (int r = 0; r < n; ++r) {
        for (const auto& [k, v] : launch_rank_environment(base, r, n, port))
            e.env_strings[size_t(r)].push_back(k + "=" + v);
        for (std::string& s : e.env_strings[size_t(r)]) e.envp[size_t(r)].push_back(s.data());
        e.envp[size_t(r)].push_back(nullptr);
    }
    e.default_action.sa_handler = SIG_DFL;
    sigemptyset(&e.default_action.sa_mask);
    sigemptyset(&e.empty_mask);
    e.launcher = ::getpid();
    log_info("launch: {} ranks of {} (MASTER_ADDR=127.0.0.1 MASTER_PORT={})", n, e.program, port);
    std::fflush(stdout);
    std::fflush(stderr);

    const SignalScope signals;
    LaunchSupervisor sup(n, o.grace_s);
    std::vector<pid_t> pids(size_t(n), -1);
    Status start_error;  // the first rank that could not be started, returned once all have ended
    const auto send = [&](const std::vector<int>& ranks, int sig) {
        for (const int r : ranks) {
            LATHE_CHECK(pids[size_t(r)] > 0, "rank {} has no process to send {} to", r, sig);
            ::kill(pids[size_t(r)], sig);
        }
    };
    const auto on_signal = [&](int sig) {
        if (is_forwarded(sig)) send(sup.on_signal(sig), sig);
        // SIGCHLD only wakes the loop: reap() below looks at every running rank.
    };
    const auto reap = [&] {
        for (int r = 0; r < n; ++r) {
            if (!sup.running(r)) continue;
            int st = 0;
            if (::waitpid(pids[size_t(r)], &st, WNOHANG) != pids[size_t(r)]) continue;
            // A signal that reached the launcher with this end (a Ctrl-C the terminal sent to the
            // whole process group) is sent on first, so that the end it caused counts as expected.
            while (const int sig = signals.take(0)) on_signal(sig);
            const auto d = sup.on_exit(r, pids[size_t(r)], st, monotonic_s());
            if (!d.error.empty() && report) report(d.error);
            send(d.terminate, SIGTERM);
        }
    };

    // Each pass takes the signals and the ends already there before it starts a rank, so that no
    // rank starts after a signal or a failure, and no rank that ended stays a zombie while the
    // others start.
    for (;;) {
        while (const int sig = signals.take(0)) on_signal(sig);
        reap();
        const double now = monotonic_s();
        for (const int r : sup.overdue(now)) {
            log_warning(
                "launch: rank {} (pid {}) still runs {} s after the first failure; "
                "sending SIGKILL",
                r, long(pids[size_t(r)]), o.grace_s);
            send({r}, SIGKILL);
        }
        if (sup.finished()) break;
        if (const auto next = sup.next_to_start()) {
            auto pid = rank_start(e, *next);
            if (pid.ok()) {
                pids[size_t(*next)] = *pid;
                sup.on_started(*next);
            } else {
                start_error = pid.status();
                send(sup.on_start_failed(*next, monotonic_s()), SIGTERM);
            }
            continue;
        }
        // Wake for a signal (a SIGCHLD that arrived since the reaping above stays pending, so none
        // is lost), at the end of the grace, and at least once a second.
        double wait_s = 1.0;
        if (const auto deadline = sup.grace_deadline(); deadline && *deadline > now)
            wait_s = std::min(wait_s, *deadline - now);
        if (const int sig = signals.take(wait_s)) on_signal(sig);
    }
    // Every rank has ended: a signal still pending has nobody to go to.
    while (signals.take(0) != 0) {
    }
    if (!start_error.ok()) return start_error;
    return sup.exit_code();
}

}  // namespace lathe
