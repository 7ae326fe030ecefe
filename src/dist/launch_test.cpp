#include "dist/launch.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "dist/mpi_communicator.h"
#include "dist/open.h"

namespace lathe {
namespace {

// waitpid() statuses as Linux encodes them: an exit code in bits 8..15, a signal in bits 0..6.
int exited(int code) {
    return code << 8;
}
int killed(int sig) {
    return sig;
}

// A supervisor of `n` ranks, all started.
LaunchSupervisor started(int n, double grace_s) {
    LaunchSupervisor s(n, grace_s);
    for (int r = 0; r < n; ++r) s.on_started(r);
    return s;
}

// The test process has no child left: launch_run reaped every rank it started.
void expect_no_child() {
    errno = 0;
    EXPECT_EQ(::waitpid(-1, nullptr, WNOHANG), -1);
    EXPECT_EQ(errno, ECHILD);
}

TEST(LaunchStatus, WaitStatusTextAndCode) {
    ASSERT_TRUE(WIFEXITED(exited(3)));
    ASSERT_TRUE(WIFSIGNALED(killed(SIGKILL)));
    EXPECT_EQ(wait_status_text(exited(0)), "exited with status 0");
    EXPECT_EQ(wait_status_text(exited(3)), "exited with status 3");
    EXPECT_EQ(wait_status_text(killed(SIGKILL)), "was killed by SIGKILL");
    EXPECT_EQ(wait_status_text(killed(SIGSEGV)), "was killed by SIGSEGV");
    EXPECT_EQ(wait_status_exit_code(exited(0)), 0);
    EXPECT_EQ(wait_status_exit_code(exited(143)), 143);
    EXPECT_EQ(wait_status_exit_code(killed(SIGKILL)), 137);
    EXPECT_EQ(wait_status_exit_code(killed(SIGTERM)), 143);
    EXPECT_EQ(signal_name(SIGINT), "SIGINT");
    EXPECT_EQ(signal_name(SIGRTMIN + 1), fmt::format("signal {}", SIGRTMIN + 1));
}

TEST(LaunchOptions, BadOptionsNameTheFlag) {
    const auto check = [](LaunchOptions o, const std::string& needle) {
        const Status s = launch_options_check(o);
        ASSERT_FALSE(s.ok()) << needle;
        EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
        EXPECT_NE(s.message().find(needle), std::string::npos) << s.message();
    };
    LaunchOptions good;
    good.gpus = 2;
    good.command = {"lathe", "doctor"};
    EXPECT_TRUE(launch_options_check(good).ok());
    LaunchOptions o = good;
    o.gpus = 0;
    check(o, "--gpus 0: start at least one");
    o = good;
    o.gpus = -3;
    check(o, "--gpus -3");
    o = good;
    o.master_port = 65536;
    check(o, "--master-port 65536 is not a TCP port");
    o = good;
    o.master_port = -1;
    check(o, "--master-port -1");
    o = good;
    o.grace_s = -1;
    check(o, "--grace-s -1");
    o = good;
    o.grace_s = std::nan("");
    check(o, "--grace-s nan");
    o = good;
    o.command.clear();
    check(o, "no command to start");
    o = good;
    o.command = {""};
    check(o, "no command to start");
}

TEST(LaunchEnvironment, TorchrunVariablesAndTheMarker) {
    const EnvMap base = {{"PATH", "/bin"}, {"RANK", "9"}, {"CUDA_VISIBLE_DEVICES", "0,1"}};
    const EnvMap env = launch_rank_environment(base, 1, 3, 41000);
    EXPECT_EQ(env.at("RANK"), "1");  // replaced
    EXPECT_EQ(env.at("LOCAL_RANK"), "1");
    EXPECT_EQ(env.at("WORLD_SIZE"), "3");
    EXPECT_EQ(env.at("LOCAL_WORLD_SIZE"), "3");
    EXPECT_EQ(env.at("MASTER_ADDR"), "127.0.0.1");
    EXPECT_EQ(env.at("MASTER_PORT"), "41000");
    EXPECT_EQ(env.at("LATHE_LAUNCHER"), "launch");
    EXPECT_EQ(env.at("PATH"), "/bin");  // the rest passed on
    EXPECT_EQ(env.at("CUDA_VISIBLE_DEVICES"), "0,1");

    // What a rank reads from it: a `lathe launch` group whose rendezvous is MASTER_PORT itself.
    auto g = process_group_from_env(env);
    ASSERT_TRUE(g.ok()) << g.status().to_string();
    EXPECT_EQ(g->launcher, Launcher::kLaunch);
    EXPECT_EQ(g->rank, 1);
    EXPECT_EQ(g->world_size, 3);
    EXPECT_EQ(g->local_world_size, 3);
    EXPECT_EQ(rendezvous_port(*g), 41000);
}

// On the CPU the collectives are MPI's: ranks that `lathe launch` or torchrun started are told to
// use mpirun, before MPI is touched.
TEST(LaunchEnvironment, CpuRanksNeedMpirun) {
    for (const Launcher l : {Launcher::kLaunch, Launcher::kTorchrun}) {
        ProcessGroupInfo g;
        g.launcher = l;
        g.rank = 1;
        g.world_size = 2;
        g.local_rank = 1;
        auto comm = communicator_open(g, Backend::kCpu, 0);
        ASSERT_FALSE(comm.ok());
        const std::string want = mpi_available() ? "start the 2 ranks with `mpirun -np 2 lathe"
                                                 : "install libopenmpi-dev";
        EXPECT_NE(comm.status().message().find(want), std::string::npos) << comm.status().message();
    }
}

TEST(LaunchProgram, ResolvesOnPathAndLatheIsThisBinary) {
    const auto dir = std::filesystem::path(::testing::TempDir()) /
                     fmt::format("launch_path_{}", long(::getpid()));
    std::filesystem::create_directories(dir / "a");
    std::filesystem::create_directories(dir / "b");
    const auto make = [](const std::filesystem::path& p, bool exec) {
        std::ofstream(p) << "#!/bin/sh\n";
        ::chmod(p.c_str(), exec ? 0755 : 0644);
    };
    make(dir / "a" / "tool", false);  // not executable: skipped for the next folder's
    make(dir / "b" / "tool", true);
    make(dir / "a" / "only_plain", false);
    std::filesystem::create_directories(dir / "a" / "folder");
    const std::string path = (dir / "a").string() + ":" + (dir / "b").string();

    auto t = launch_resolve_program("tool", path, "/self/lathe");
    ASSERT_TRUE(t.ok()) << t.status().to_string();
    EXPECT_EQ(*t, (dir / "b" / "tool").string());
    auto self = launch_resolve_program("lathe", path, "/self/lathe");
    ASSERT_TRUE(self.ok());
    EXPECT_EQ(*self, "/self/lathe");
    auto slash = launch_resolve_program("./x/y", path, "/self/lathe");
    ASSERT_TRUE(slash.ok());
    EXPECT_EQ(*slash, "./x/y");  // exec reports a bad one

    auto missing = launch_resolve_program("no_such_tool", path, "/self/lathe");
    ASSERT_FALSE(missing.ok());
    EXPECT_EQ(missing.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(missing.status().message().find("command 'no_such_tool' not found"),
              std::string::npos)
        << missing.status().message();
    EXPECT_NE(missing.status().message().find(path), std::string::npos);
    auto folder = launch_resolve_program("folder", path, "/self/lathe");
    ASSERT_FALSE(folder.ok());
    auto plain = launch_resolve_program("only_plain", path, "/self/lathe");
    ASSERT_FALSE(plain.ok());
    EXPECT_NE(plain.status().message().find("is not executable"), std::string::npos)
        << plain.status().message();
    auto no_self = launch_resolve_program("lathe", path, "");
    ASSERT_FALSE(no_self.ok());
    std::filesystem::remove_all(dir);
}

TEST(LaunchPort, FreePortIsAPort) {
    auto p = launch_free_port();
    ASSERT_TRUE(p.ok()) << p.status().to_string();
    EXPECT_GE(*p, 1);
    EXPECT_LE(*p, 65535);
}

// Below the kernel's ephemeral range and the cap (where this host's range leaves room), and free
// for rank 0: a listening socket on every address binds it as rank 0 does (SO_REUSEADDR: a port
// whose earlier connections linger in TIME_WAIT binds so, and only so).
TEST(LaunchPort, FreePortIsBelowTheEphemeralRangeAndBinds) {
    const PortRange draw = launch_port_draw_range(launch_ephemeral_port_range().low);
    for (int i = 0; i < 20; ++i) {
        auto p = launch_free_port();
        ASSERT_TRUE(p.ok()) << p.status().to_string();
        if (draw.high - draw.low >= 64) {
            EXPECT_GE(*p, draw.low);
            EXPECT_LE(*p, draw.high);
        }
        const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        ASSERT_GE(fd, 0);
        const int one = 1;
        ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_ANY);
        a.sin_port = htons(uint16_t(*p));
        EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0) << *p;
        EXPECT_EQ(::listen(fd, 1), 0) << *p;
        ::close(fd);
    }
}

TEST(LaunchPort, DrawsBelowTheEphemeralRangeAndTheCap) {
    EXPECT_EQ(launch_port_draw_range(32768).low, 16384);
    EXPECT_EQ(launch_port_draw_range(32768).high, kLaunchPortCap);
    EXPECT_EQ(launch_port_draw_range(20000).low, 10000);
    EXPECT_EQ(launch_port_draw_range(20000).high, 19999);
    const PortRange none = launch_port_draw_range(1080);  // 1024 .. 1079: fewer than 64
    EXPECT_LT(none.high - none.low, 64);
}

TEST(LaunchPort, ParsesTheEphemeralRange) {
    EXPECT_EQ(launch_parse_port_range("32768\t60999\n").low, 32768);
    EXPECT_EQ(launch_parse_port_range("32768\t60999\n").high, 60999);
    EXPECT_EQ(launch_parse_port_range("1024 65000").low, 1024);
    for (const char* bad : {"", "x y", "60999 32768", "0 100", "5000 70000"}) {
        const PortRange r = launch_parse_port_range(bad);
        EXPECT_EQ(r.low, 32768) << bad;
        EXPECT_EQ(r.high, 60999) << bad;
    }
}

// The supervision rules, with made-up events.
TEST(LaunchSupervisor, AllExitZero) {
    LaunchSupervisor s = started(3, 30);
    EXPECT_FALSE(s.finished());
    for (int r : {2, 0, 1}) {
        const auto d = s.on_exit(r, 100 + r, exited(0), 1.0);
        EXPECT_TRUE(d.terminate.empty());
        EXPECT_TRUE(d.error.empty());
    }
    EXPECT_TRUE(s.finished());
    EXPECT_EQ(s.exit_code(), 0);
    EXPECT_FALSE(s.grace_deadline());
}

TEST(LaunchSupervisor, FirstFailureStopsTheOthersAndGivesTheCode) {
    LaunchSupervisor s = started(4, 5);
    EXPECT_TRUE(s.on_exit(3, 103, exited(0), 1.0).error.empty());  // a clean end is no failure
    const auto d = s.on_exit(1, 101, exited(3), 2.0);
    EXPECT_EQ(d.error, "launch: rank 1 (pid 101) exited with status 3; stopping the other 2 ranks");
    EXPECT_EQ(d.terminate, (std::vector<int>{0, 2}));
    ASSERT_TRUE(s.grace_deadline());
    EXPECT_DOUBLE_EQ(*s.grace_deadline(), 7.0);
    EXPECT_EQ(s.exit_code(), 3);
    // The ranks stopped by the launcher end by SIGTERM: neither a new failure nor a new code.
    const auto later = s.on_exit(0, 100, killed(SIGTERM), 3.0);
    EXPECT_TRUE(later.error.empty());
    EXPECT_TRUE(later.terminate.empty());
    EXPECT_EQ(s.exit_code(), 3);
    EXPECT_TRUE(s.overdue(6.9).empty());
    EXPECT_EQ(s.overdue(7.0), (std::vector<int>{2}));  // ignored SIGTERM: SIGKILL once
    EXPECT_TRUE(s.overdue(8.0).empty());
    s.on_exit(2, 102, killed(SIGKILL), 7.1);
    EXPECT_TRUE(s.finished());
    EXPECT_EQ(s.exit_code(), 3);
}

TEST(LaunchSupervisor, KilledRankGives128PlusSignal) {
    LaunchSupervisor s = started(2, 30);
    const auto d = s.on_exit(0, 55, killed(SIGKILL), 0.0);
    EXPECT_EQ(d.error, "launch: rank 0 (pid 55) was killed by SIGKILL; stopping the other rank");
    EXPECT_EQ(d.terminate, (std::vector<int>{1}));
    EXPECT_EQ(s.exit_code(), 137);
    LaunchSupervisor last = started(2, 30);
    last.on_exit(0, 1, exited(0), 0.0);
    const auto alone = last.on_exit(1, 2, exited(9), 0.0);  // nobody left to stop
    EXPECT_EQ(alone.error, "launch: rank 1 (pid 2) exited with status 9");
    EXPECT_TRUE(alone.terminate.empty());
    EXPECT_EQ(last.exit_code(), 9);
}

// A user's signal goes to every running rank. Ends at 128 + that signal (or 0) are expected: no
// error line, no SIGTERM, no grace, however long the others take (rank 0 writing a checkpoint);
// the exit code is still the first non-zero one. Any other end after it is a failure as usual.
TEST(LaunchSupervisor, ForwardedSignal) {
    LaunchSupervisor s = started(4, 10);
    EXPECT_TRUE(s.on_exit(3, 13, exited(0), 0.0).error.empty());
    EXPECT_EQ(s.on_signal(SIGTERM), (std::vector<int>{0, 1, 2}));
    const auto d = s.on_exit(1, 11, exited(143), 1.0);
    EXPECT_TRUE(d.error.empty());
    EXPECT_TRUE(d.terminate.empty());
    EXPECT_EQ(s.exit_code(), 143);
    EXPECT_FALSE(s.grace_deadline());
    EXPECT_TRUE(s.overdue(1000.0).empty());
    EXPECT_TRUE(s.on_exit(2, 12, killed(SIGTERM), 2.0).error.empty());  // killed by it: expected
    EXPECT_FALSE(s.grace_deadline());
    EXPECT_FALSE(s.finished());
    s.on_exit(0, 10, exited(143), 500.0);
    EXPECT_TRUE(s.finished());
    EXPECT_EQ(s.exit_code(), 143);

    LaunchSupervisor other = started(3, 10);  // a rank that fails otherwise after the signal
    other.on_signal(SIGINT);
    other.on_exit(0, 10, exited(130), 0.0);
    const auto f = other.on_exit(1, 11, exited(1), 2.0);
    EXPECT_EQ(f.error, "launch: rank 1 (pid 11) exited with status 1; stopping the other rank");
    EXPECT_EQ(f.terminate, (std::vector<int>{2}));
    ASSERT_TRUE(other.grace_deadline());
    EXPECT_DOUBLE_EQ(*other.grace_deadline(), 12.0);
    EXPECT_EQ(other.overdue(12.0), (std::vector<int>{2}));
    EXPECT_EQ(other.exit_code(), 130);  // the first non-zero end

    LaunchSupervisor wrong = started(2, 10);  // 143 is no stop asked for after SIGINT
    wrong.on_signal(SIGINT);
    EXPECT_FALSE(wrong.on_exit(0, 10, exited(143), 0.0).error.empty());

    LaunchSupervisor clean =
        started(2, 10);  // the signal came after the last step: every rank exits 0
    clean.on_signal(SIGINT);
    clean.on_exit(0, 1, exited(0), 0.0);
    clean.on_exit(1, 2, exited(0), 0.0);
    EXPECT_TRUE(clean.finished());
    EXPECT_EQ(clean.exit_code(), 0);
}

TEST(LaunchSupervisor, RanksStartInOrder) {
    LaunchSupervisor s(3, 30);
    EXPECT_FALSE(s.finished());
    for (int r = 0; r < 3; ++r) {
        ASSERT_EQ(s.next_to_start(), r);
        EXPECT_FALSE(s.running(r));
        s.on_started(r);
        EXPECT_TRUE(s.running(r));
    }
    EXPECT_FALSE(s.next_to_start());
    EXPECT_EQ(s.running_count(), 3);
}

// A signal while the ranks start: it goes to the running ranks only, and no further rank starts.
// With no non-zero end, the code is 128 + that signal: the run was cut short.
TEST(LaunchSupervisor, SignalStopsTheStart) {
    LaunchSupervisor s(4, 10);
    s.on_started(0);
    s.on_started(1);
    EXPECT_EQ(s.on_signal(SIGTERM), (std::vector<int>{0, 1}));
    EXPECT_FALSE(s.next_to_start());
    EXPECT_FALSE(s.running(2));
    EXPECT_FALSE(s.finished());
    EXPECT_TRUE(s.on_exit(0, 10, exited(0), 1.0).error.empty());  // saved and exited 0
    EXPECT_TRUE(s.on_exit(1, 11, exited(0), 1.0).error.empty());
    EXPECT_TRUE(s.finished());
    EXPECT_EQ(s.exit_code(), 143);
    EXPECT_FALSE(s.grace_deadline());

    LaunchSupervisor code(3, 10);  // a rank's own non-zero code comes first
    code.on_started(0);
    code.on_signal(SIGINT);
    code.on_exit(0, 10, exited(130), 0.0);
    EXPECT_TRUE(code.finished());
    EXPECT_EQ(code.exit_code(), 130);

    LaunchSupervisor none(2, 10);  // before any rank started: none starts
    EXPECT_TRUE(none.on_signal(SIGHUP).empty());
    EXPECT_FALSE(none.next_to_start());
    EXPECT_TRUE(none.finished());
    EXPECT_EQ(none.exit_code(), 129);

    LaunchSupervisor after = started(2, 10);  // after every rank started: the ranks' codes decide
    after.on_signal(SIGINT);
    after.on_exit(0, 1, exited(0), 0.0);
    after.on_exit(1, 2, exited(0), 0.0);
    EXPECT_EQ(after.exit_code(), 0);
    EXPECT_TRUE(after.on_signal(SIGTERM).empty());  // once every rank ended: changes nothing
    EXPECT_EQ(after.exit_code(), 0);
}

TEST(LaunchSupervisor, FailureStopsTheStart) {
    LaunchSupervisor s(4, 5);
    s.on_started(0);
    s.on_started(1);
    const auto d = s.on_exit(0, 100, exited(3), 1.0);
    EXPECT_EQ(d.error, "launch: rank 0 (pid 100) exited with status 3; stopping the other rank");
    EXPECT_EQ(d.terminate, (std::vector<int>{1}));
    EXPECT_FALSE(s.next_to_start());
    EXPECT_EQ(s.overdue(6.0), (std::vector<int>{1}));
    s.on_exit(1, 101, killed(SIGKILL), 6.1);
    EXPECT_TRUE(s.finished());
    EXPECT_EQ(s.exit_code(), 3);
}

// Rank 2 cannot be started: ranks 0 and 1 are stopped as after a failure; rank 3 never starts.
TEST(LaunchSupervisor, FailedStartStopsTheOthers) {
    LaunchSupervisor s(4, 5);
    s.on_started(0);
    s.on_started(1);
    EXPECT_EQ(s.on_start_failed(2, 1.0), (std::vector<int>{0, 1}));
    EXPECT_FALSE(s.next_to_start());
    ASSERT_TRUE(s.grace_deadline());
    EXPECT_DOUBLE_EQ(*s.grace_deadline(), 6.0);
    EXPECT_TRUE(s.on_exit(0, 100, killed(SIGTERM), 2.0).error.empty());  // stopped, as asked
    EXPECT_EQ(s.overdue(6.0), (std::vector<int>{1}));
    EXPECT_FALSE(s.finished());
    s.on_exit(1, 101, killed(SIGKILL), 6.1);
    EXPECT_TRUE(s.finished());

    LaunchSupervisor first(2, 5);  // rank 0 cannot be started: nothing runs, nothing to stop
    EXPECT_TRUE(first.on_start_failed(0, 0.0).empty());
    EXPECT_TRUE(first.finished());
}

// launch_run on real processes (sh), the fast cases; tests/test_launch.py drives the binary.
TEST(LaunchRun, ExitCodesOfRealProcesses) {
    LaunchOptions o;
    o.gpus = 2;
    o.grace_s = 5;
    std::vector<std::string> reported;
    const LaunchReport report = [&](const std::string& e) { reported.push_back(e); };
    o.command = {"sh", "-c", "exit 0"};
    auto ok = launch_run(o, report);
    ASSERT_TRUE(ok.ok()) << ok.status().to_string();
    EXPECT_EQ(*ok, 0);
    EXPECT_TRUE(reported.empty());
    expect_no_child();

    // Rank 1 fails at once; rank 0 would sleep 30 s but is stopped by SIGTERM.
    o.command = {"sh", "-c", "if [ \"$RANK\" = 1 ]; then exit 4; fi; exec sleep 30"};
    const auto t0 = std::chrono::steady_clock::now();
    auto fail = launch_run(o, report);
    const double took =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ASSERT_TRUE(fail.ok()) << fail.status().to_string();
    EXPECT_EQ(*fail, 4);
    EXPECT_LT(took, 5.0);
    ASSERT_EQ(reported.size(), 1u);
    EXPECT_NE(reported[0].find("launch: rank 1 (pid "), std::string::npos) << reported[0];
    EXPECT_NE(reported[0].find(") exited with status 4; stopping the other rank"),
              std::string::npos)
        << reported[0];
    expect_no_child();

    o.command = {"/no/such/program"};
    auto bad = launch_run(o, nullptr);
    ASSERT_FALSE(bad.ok());
    EXPECT_NE(bad.status().message().find("cannot execute '/no/such/program' for rank 0: No such "
                                          "file or directory"),
              std::string::npos)
        << bad.status().message();
    expect_no_child();
}

// A SIGTERM already there when launch_run begins: no rank starts (the program does not exist, so
// starting one would be an error), the code is 128 + 15, and the signal is taken, not left pending.
TEST(LaunchRun, SignalBeforeTheStartStartsNoRank) {
    sigset_t term, old;
    sigemptyset(&term);
    sigaddset(&term, SIGTERM);
    ASSERT_EQ(::pthread_sigmask(SIG_BLOCK, &term, &old), 0);
    // Thread-directed, so that no other thread of the test binary, which does not block it,
    // takes it.
    ASSERT_EQ(::pthread_kill(::pthread_self(), SIGTERM), 0);  // pending: blocked here
    LaunchOptions o;
    o.gpus = 3;
    o.command = {"/no/such/program"};
    auto code = launch_run(o, nullptr);
    // Take a SIGTERM launch_run left pending, so that unblocking it does not end the test.
    const timespec zero{0, 0};
    const bool left = ::sigtimedwait(&term, nullptr, &zero) == SIGTERM;
    ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
    EXPECT_FALSE(left);
    ASSERT_TRUE(code.ok()) << code.status().to_string();
    EXPECT_EQ(*code, 143);
    expect_no_child();
}

}  // namespace
}  // namespace lathe
