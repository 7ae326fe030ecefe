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
    : running_(size_t(world_size), true), killed_(size_t(world_size), false), grace_s_(grace_s) {}

int LaunchSupervisor::running_count() const {
    int n = 0;
    for (const bool r : running_) n += r ? 1 : 0;
    return n;
}

LaunchSupervisor::Decision LaunchSupervisor::on_exit(int rank, pid_t pid, int wait_status,
                                                     double now) {
    LATHE_CHECK(rank >= 0 && size_t(rank) < running_.size() && running_[size_t(rank)]);
    running_[size_t(rank)] = false;
    Decision d;
    const int code = wait_status_exit_code(wait_status);
    if (code != 0 && exit_code_ == 0) exit_code_ = code;
    if (code == 0 || stopping_) return d;
    for (const int sig : forwarded_)
        if (code == 128 + sig) return d;  // stopped by the user's signal, as asked
    stopping_ = true;
    deadline_ = now + grace_s_;
    for (size_t r = 0; r < running_.size(); ++r)
        if (running_[r]) d.terminate.push_back(int(r));
    const size_t k = d.terminate.size();
    d.error =
        fmt::format("launch: rank {} (pid {}) {}", rank, long(pid), wait_status_text(wait_status));
    if (k == 1) d.error += "; stopping the other rank";
    if (k > 1) d.error += fmt::format("; stopping the other {} ranks", k);
    return d;
}

std::vector<int> LaunchSupervisor::on_signal(int sig) {
    forwarded_.push_back(sig);
    std::vector<int> to;
    for (size_t r = 0; r < running_.size(); ++r)
        if (running_[r]) to.push_back(int(r));
    return to;
}

std::vector<int> LaunchSupervisor::overdue(double now) {
    std::vector<int> to;
    if (!deadline_ || now < *deadline_) return to;
    for (size_t r = 0; r < running_.size(); ++r) {
        if (running_[r] && !killed_[r]) {
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

// While the launcher supervises, SIGINT, SIGTERM, SIGHUP and SIGCHLD are blocked and taken with
// sigtimedwait, and SIGCHLD has its default action (an inherited SIG_IGN would reap the children
// before waitpid sees them). Restores the mask and SIGCHLD's action on scope exit. The children
// get the mask and SIGCHLD's action the launcher started with (`old_mask`, `old_chld`).
class SignalScope {
public:
    SignalScope() {
        sigemptyset(&set_);
        for (const int s : kForwarded) sigaddset(&set_, s);
        sigaddset(&set_, SIGCHLD);
        struct sigaction dfl {};
        dfl.sa_handler = SIG_DFL;
        sigemptyset(&dfl.sa_mask);
        ::sigaction(SIGCHLD, &dfl, &old_chld);
        ::sigprocmask(SIG_BLOCK, &set_, &old_mask);
    }
    ~SignalScope() {
        ::sigprocmask(SIG_SETMASK, &old_mask, nullptr);
        ::sigaction(SIGCHLD, &old_chld, nullptr);
    }
    SignalScope(const SignalScope&) = delete;
    SignalScope& operator=(const SignalScope&) = delete;

    const sigset_t& set() const { return set_; }
    sigset_t old_mask{};
    struct sigaction old_chld {};

private:
    sigset_t set_{};
};

// What one rank's execve needs, built before fork (the child only calls async-signal-safe
// functions).
struct Exec {
    std::vector<std::string> env_strings;
    std::vector<char*> envp;
};

// Sends SIGTERM to the ranks in `pids` (those > 0), waits up to `grace_s` for them, SIGKILLs the
// rest and reaps them all.
void stop_all(std::vector<pid_t>& pids, double grace_s) {
    for (const pid_t p : pids)
        if (p > 0) ::kill(p, SIGTERM);
    const double deadline = monotonic_s() + grace_s;
    bool any = true;
    while (any) {
        any = false;
        for (pid_t& p : pids) {
            if (p <= 0) continue;
            int st = 0;
            if (::waitpid(p, &st, WNOHANG) == p) {
                p = -1;
                continue;
            }
            any = true;
            if (monotonic_s() >= deadline) ::kill(p, SIGKILL);
        }
        if (any) {
            const timespec pause{0, 10'000'000};
            ::nanosleep(&pause, nullptr);
        }
    }
}

}  // namespace

Result<int> launch_run(const LaunchOptions& o, const LaunchReport& report) {
    LATHE_RETURN_IF_ERROR(launch_options_check(o));
    const EnvMap base = process_environment();
    const auto path_it = base.find("PATH");
    // execvp's search path when PATH is unset.
    const std::string path_var = path_it != base.end() ? path_it->second : "/usr/bin:/bin";
    LATHE_ASSIGN_OR_RETURN(const std::string program,
                           launch_resolve_program(o.command.front(), path_var, self_executable()));
    int port = o.master_port;
    if (port == 0) {
        LATHE_ASSIGN_OR_RETURN(port, launch_free_port());
    }
    const int n = o.gpus;

    std::vector<char*> argv;
    for (const std::string& a : o.command) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    std::vector<Exec> execs(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) {
        Exec& e = execs[size_t(r)];
        for (const auto& [k, v] : launch_rank_environment(base, r, n, port))
            e.env_strings.push_back(k + "=" + v);
        for (std::string& s : e.env_strings) e.envp.push_back(s.data());
        e.envp.push_back(nullptr);
    }
    log_info("launch: {} ranks of {} (MASTER_ADDR=127.0.0.1 MASTER_PORT={})", n, program, port);
    std::fflush(stdout);
    std::fflush(stderr);

    SignalScope signals;
    const pid_t launcher = ::getpid();
    std::vector<pid_t> pids(size_t(n), -1);
    for (int r = 0; r < n; ++r) {
        int fds[2];
        if (::pipe2(fds, O_CLOEXEC) != 0) {
            const int err = errno;
            stop_all(pids, o.grace_s);
            return io_error("launch: pipe for rank {}: {}", r, std::strerror(err));
        }
        const pid_t pid = ::fork();
        if (pid < 0) {
            const int err = errno;
            ::close(fds[0]);
            ::close(fds[1]);
            stop_all(pids, o.grace_s);
            return io_error("launch: fork for rank {}: {}", r, std::strerror(err));
        }
        if (pid == 0) {
            // The child: only async-signal-safe calls until execve.
            ::close(fds[0]);
            ::prctl(PR_SET_PDEATHSIG, SIGTERM);
            if (::getppid() != launcher) ::_exit(143);  // the launcher died before prctl
            ::sigaction(SIGCHLD, &signals.old_chld, nullptr);
            ::sigprocmask(SIG_SETMASK, &signals.old_mask, nullptr);
            ::execve(program.c_str(), argv.data(), execs[size_t(r)].envp.data());
            const int err = errno;
            ssize_t w = 0;
            do {
                w = ::write(fds[1], &err, sizeof(err));
            } while (w < 0 && errno == EINTR);
            ::_exit(127);
        }
        ::close(fds[1]);
        pids[size_t(r)] = pid;
        int err = 0;
        ssize_t got = 0;
        do {
            got = ::read(fds[0], &err, sizeof(err));
        } while (got < 0 && errno == EINTR);
        ::close(fds[0]);
        if (got == ssize_t(sizeof(err))) {  // execve failed; end of file means it succeeded
            int st = 0;
            ::waitpid(pid, &st, 0);
            pids[size_t(r)] = -1;
            stop_all(pids, o.grace_s);
            return invalid_argument_error("launch: cannot execute '{}' for rank {}: {}", program, r,
                                          std::strerror(err));
        }
    }

    LaunchSupervisor sup(n, o.grace_s);
    while (!sup.finished()) {
        for (int r = 0; r < n; ++r) {
            if (!sup.running(r)) continue;
            int st = 0;
            if (::waitpid(pids[size_t(r)], &st, WNOHANG) != pids[size_t(r)]) continue;
            const auto d = sup.on_exit(r, pids[size_t(r)], st, monotonic_s());
            if (!d.error.empty() && report) report(d.error);
            for (const int t : d.terminate) ::kill(pids[size_t(t)], SIGTERM);
        }
        if (sup.finished()) break;
        const double now = monotonic_s();
        for (const int r : sup.overdue(now)) {
            log_warning(
                "launch: rank {} (pid {}) still runs {} s after the first failure; "
                "sending SIGKILL",
                r, long(pids[size_t(r)]), o.grace_s);
            ::kill(pids[size_t(r)], SIGKILL);
        }
        // Wake for a signal, at the end of the grace, and at least once a second (a SIGCHLD that
        // arrived between the reaping above and this wait stays pending, so none is lost).
        double wait_s = 1.0;
        if (const auto deadline = sup.grace_deadline(); deadline && *deadline > now)
            wait_s = std::min(wait_s, *deadline - now);
        timespec ts{};
        ts.tv_sec = time_t(wait_s);
        ts.tv_nsec = long((wait_s - double(ts.tv_sec)) * 1e9);
        siginfo_t info{};
        const int sig = ::sigtimedwait(&signals.set(), &info, &ts);
        if (sig == SIGINT || sig == SIGTERM || sig == SIGHUP) {
            for (const int r : sup.on_signal(sig)) ::kill(pids[size_t(r)], sig);
        }
    }
    return sup.exit_code();
}

}  // namespace lathe
