#include "fuzz/fuzz_harness.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <mutex>
#include <thread>

namespace lathe::fuzz {
namespace {

constexpr size_t kMaxPool = 64;

const std::vector<std::string>& interesting_numbers() {
    static const std::vector<std::string> numbers = {"0",
                                                     "-1",
                                                     "1",
                                                     "255",
                                                     "256",
                                                     "65535",
                                                     "65536",
                                                     "-2147483648",
                                                     "2147483647",
                                                     "2147483648",
                                                     "4294967295",
                                                     "4294967296",
                                                     "9223372036854775807",
                                                     "-9223372036854775808",
                                                     "18446744073709551615",
                                                     "99999999999999999999999",
                                                     "1e308",
                                                     "-1e308",
                                                     "1e-320",
                                                     "0.5",
                                                     "-0",
                                                     "1e999",
                                                     "NaN"};
    return numbers;
}

constexpr uint64_t kInterestingInts[] = {0,
                                         1,
                                         0x7f,
                                         0x80,
                                         0xff,
                                         0x7fff,
                                         0x8000,
                                         0xffff,
                                         0x7fffffff,
                                         0x80000000,
                                         0xffffffff,
                                         0x7fffffffffffffff,
                                         0x8000000000000000,
                                         ~uint64_t{0},
                                         0x100000000};

constexpr unsigned char kInterestingBytes[] = {0,   0xff, 0x7f, 0x80, '"',  '\\', '{', '}',
                                               '[', ']',  ',',  ':',  '\n', '0',  '9', '-',
                                               ' ', 0xc3, 0xe2, 0xf0, '%',  '#',  '&', '*'};

// What a crash or hang handler needs, set before each input. A signal handler can reach only
// static storage; these are written by the fuzzing thread alone.
struct CrashContext {
    char path[4096] = {};
    const char* data = nullptr;
    size_t size = 0;
};
CrashContext g_crash;

void write_current_input() {
    if (g_crash.path[0] == '\0' || g_crash.data == nullptr) return;
    const int fd = ::open(g_crash.path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) return;
    size_t done = 0;
    while (done < g_crash.size) {
        const ssize_t n = ::write(fd, g_crash.data + done, g_crash.size - done);
        if (n <= 0) break;
        done += static_cast<size_t>(n);
    }
    ::close(fd);
}

void on_crash_signal(int sig) {
    write_current_input();
    const char msg[] = "\nlathe fuzz: the reader crashed on an input; it is saved in ";
    [[maybe_unused]] ssize_t w = ::write(2, msg, sizeof(msg) - 1);
    w = ::write(2, g_crash.path, std::strlen(g_crash.path));
    w = ::write(2, "\n", 1);
    ::signal(sig, SIG_DFL);
    ::raise(sig);
}

void install_crash_handlers() {
    for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT}) {
        struct sigaction sa {};
        sa.sa_handler = on_crash_signal;
        sigemptyset(&sa.sa_mask);
        sa.sa_flags = static_cast<int>(SA_RESETHAND);
        sigaction(sig, &sa, nullptr);
    }
}

// Stops the process when one input runs longer than the hang limit.
class Watchdog {
public:
    Watchdog(std::string target, double limit_s) : target_(std::move(target)), limit_s_(limit_s) {
        thread_ = std::thread([this] { loop(); });
    }
    ~Watchdog() {
        {
            std::lock_guard<std::mutex> lock(mutex_);
            done_ = true;
        }
        cv_.notify_all();
        thread_.join();
    }
    void start_input() { started_ns_.store(now_ns()); }
    void end_input() { started_ns_.store(0); }

private:
    static int64_t now_ns() {
        return std::chrono::duration_cast<std::chrono::nanoseconds>(
                   std::chrono::steady_clock::now().time_since_epoch())
            .count();
    }
    void loop() {
        std::unique_lock<std::mutex> lock(mutex_);
        while (!done_) {
            cv_.wait_for(lock, std::chrono::milliseconds(200));
            const int64_t t0 = started_ns_.load();
            if (t0 != 0 && double(now_ns() - t0) * 1e-9 > limit_s_) {
                write_current_input();
                fmt::print(stderr,
                           "lathe fuzz: {}: one input ran longer than {} s (a hang); it is saved "
                           "in {}\n",
                           target_, limit_s_, g_crash.path);
                std::fflush(stderr);
                std::_Exit(3);
            }
        }
    }
    std::string target_;
    double limit_s_;
    std::atomic<int64_t> started_ns_{0};
    std::mutex mutex_;
    std::condition_variable cv_;
    bool done_ = false;
    std::thread thread_;
};

}  // namespace

double fuzz_env_number(const char* name, double fallback) {
    const char* v = std::getenv(name);
    if (v == nullptr || *v == '\0') return fallback;
    char* end = nullptr;
    const double d = std::strtod(v, &end);
    return (end != v && *end == '\0' && d >= 0) ? d : fallback;
}

uint64_t Mutator::next() {
    // splitmix64
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

void Mutator::mutate_once(std::string& data, const std::vector<std::string>& others,
                          const std::vector<std::string>& dictionary) {
    const auto pos = [&](size_t extra) { return static_cast<size_t>(below(data.size() + extra)); };
    switch (below(12)) {
        case 0:  // flip a bit
            if (!data.empty()) data[pos(0)] ^= static_cast<char>(1u << below(8));
            break;
        case 1:  // an interesting byte
            if (!data.empty()) {
                data[pos(0)] =
                    static_cast<char>(kInterestingBytes[below(sizeof(kInterestingBytes))]);
            }
            break;
        case 2: {  // insert random bytes
            std::string bytes(1 + below(8), '\0');
            for (char& c : bytes) c = static_cast<char>(below(256));
            data.insert(pos(1), bytes);
            break;
        }
        case 3:  // delete a range
            if (!data.empty()) {
                const size_t at = pos(0);
                data.erase(at, 1 + below(std::min<size_t>(64, data.size() - at)));
            }
            break;
        case 4:  // duplicate a range elsewhere
            if (!data.empty()) {
                const size_t at = pos(0);
                const std::string chunk =
                    data.substr(at, 1 + below(std::min<size_t>(256, data.size() - at)));
                data.insert(pos(1), chunk);
            }
            break;
        case 5:  // truncate
            data.resize(pos(1));
            break;
        case 6:  // splice with another input
            if (!others.empty()) {
                const std::string& o = others[below(others.size())];
                const size_t from = o.empty() ? 0 : static_cast<size_t>(below(o.size()));
                data = data.substr(0, pos(1)) + o.substr(from);
            }
            break;
        case 7:
        case 8:  // a dictionary token, inserted or written over
            if (!dictionary.empty()) {
                const std::string& t = dictionary[below(dictionary.size())];
                const size_t at = pos(1);
                if (below(2) == 0 || at + t.size() > data.size()) {
                    data.insert(at, t);
                } else {
                    data.replace(at, t.size(), t);
                }
            }
            break;
        case 9: {  // replace a number of the text by a boundary value
            if (data.empty()) break;
            size_t at = data.find_first_of("0123456789", pos(0));
            if (at == std::string::npos) at = data.find_first_of("0123456789");
            if (at == std::string::npos) break;
            size_t end = at;
            while (end < data.size() &&
                   (std::isdigit(static_cast<unsigned char>(data[end])) || data[end] == '.'))
                ++end;
            const auto& numbers = interesting_numbers();
            data.replace(at, end - at, numbers[below(numbers.size())]);
            break;
        }
        case 10: {  // a boundary integer written over 1, 2, 4 or 8 bytes (little-endian)
            const size_t width = size_t{1} << below(4);
            if (data.size() < width) break;
            uint64_t v = kInterestingInts[below(std::size(kInterestingInts))];
            if (below(4) == 0) v += below(3) - 1;
            const size_t at = static_cast<size_t>(below(data.size() - width + 1));
            for (size_t i = 0; i < width; ++i) data[at + i] = static_cast<char>(v >> (8 * i));
            break;
        }
        case 11:  // add or subtract a little at one byte
            if (!data.empty()) data[pos(0)] += static_cast<char>(static_cast<int>(below(33)) - 16);
            break;
    }
}

void Mutator::mutate(std::string& data, const std::vector<std::string>& others,
                     const std::vector<std::string>& dictionary, size_t max_bytes) {
    const uint64_t n = 1 + below(4);
    for (uint64_t i = 0; i < n; ++i) mutate_once(data, others, dictionary);
    if (data.size() > max_bytes) data.resize(max_bytes);
}

FuzzReport fuzz_run(const FuzzTarget& target) {
    FuzzReport report;
    report.seed = static_cast<uint64_t>(fuzz_env_number("LATHE_FUZZ_SEED", 1));
    const double budget_s = fuzz_env_number("LATHE_FUZZ_SECONDS", 4);
    const uint64_t max_runs = static_cast<uint64_t>(fuzz_env_number("LATHE_FUZZ_RUNS", 200000));
    const double hang_s = fuzz_env_number("LATHE_FUZZ_HANG_SECONDS", 20);

    std::string dir = std::filesystem::temp_directory_path().string();
    if (const char* d = std::getenv("LATHE_FUZZ_CRASH_DIR"); d != nullptr && *d != '\0') dir = d;
    const std::string crash_path = fmt::format("{}/lathe-fuzz-{}-crash.bin", dir, target.name);
    std::snprintf(g_crash.path, sizeof(g_crash.path), "%s", crash_path.c_str());
    install_crash_handlers();
    Watchdog watchdog(target.name, hang_s);

    const auto t0 = std::chrono::steady_clock::now();
    const auto elapsed = [&] {
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    };
    // Runs one input; false when an exception escaped (report.failure says which).
    const auto run_one = [&](const std::string& input, Status& status) {
        g_crash.data = input.data();
        g_crash.size = input.size();
        watchdog.start_input();
        std::string escaped;
        try {
            status = target.run(input);
        } catch (const std::exception& e) {
            escaped = fmt::format("exception {}", e.what());
        } catch (...) {
            escaped = "an exception that is not a std::exception";
        }
        watchdog.end_input();
        ++report.runs;
        if (!escaped.empty()) {
            write_current_input();
            report.failure = fmt::format("{}: {} escaped the reader on an input saved in {}",
                                         target.name, escaped, crash_path);
            return false;
        }
        if (status.ok()) ++report.accepted;
        return true;
    };

    // Replay: one saved input instead of the seeds and mutants.
    if (const char* replay = std::getenv("LATHE_FUZZ_REPLAY"); replay != nullptr && *replay) {
        std::ifstream in(replay, std::ios::binary);
        const std::string input((std::istreambuf_iterator<char>(in)),
                                std::istreambuf_iterator<char>());
        Status s;
        if (run_one(input, s)) {
            fmt::print(stderr, "lathe fuzz: {}: {} ({} bytes): {}\n", target.name, replay,
                       input.size(), s.ok() ? "accepted" : s.to_string());
        }
        report.seconds = elapsed();
        return report;
    }
    std::vector<std::string> pool;
    for (const std::string& seed : target.seeds) {
        Status s;
        if (!run_one(seed, s)) return report;
        if (!s.ok()) {
            report.failure =
                fmt::format("{}: a seed input is rejected: {}", target.name, s.to_string());
            return report;
        }
        pool.push_back(seed);
    }
    Mutator mutator(report.seed * 0x100000001b3ULL + std::hash<std::string>{}(target.name));
    std::string input;
    while (report.runs < max_runs && elapsed() < budget_s) {
        // Mostly a seed, sometimes an accepted mutant.
        const bool from_pool = pool.size() > target.seeds.size() && mutator.below(3) == 0;
        input = from_pool
                    ? pool[target.seeds.size() + mutator.below(pool.size() - target.seeds.size())]
                    : target.seeds[mutator.below(target.seeds.size())];
        mutator.mutate(input, target.seeds, target.dictionary, target.max_input_bytes);
        Status s;
        if (!run_one(input, s)) return report;
        if (s.ok()) {
            if (pool.size() < target.seeds.size() + kMaxPool) {
                pool.push_back(input);
            } else {
                pool[target.seeds.size() + mutator.below(kMaxPool)] = input;
            }
        }
    }
    report.seconds = elapsed();
    g_crash.data = nullptr;
    g_crash.size = 0;
    return report;
}

}  // namespace lathe::fuzz
