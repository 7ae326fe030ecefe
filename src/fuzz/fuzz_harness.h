#pragma once
// A seeded random mutator for the readers of user files, run inside GoogleTest executables so that
// CI (gcc, no libFuzzer) fuzzes every reader for a bounded time.
//
// Each target is a function that reads one input (the bytes of a file) and returns a Status:
// accepted (ok) or rejected (an error). Anything else fails the test: an exception that escapes,
// a crash (SIGSEGV, SIGABRT, ...), or one input that runs longer than the hang limit. Before a
// crash or hang ends the process, the input is written to
// $LATHE_FUZZ_CRASH_DIR (default the system temporary folder)/lathe-fuzz-<target>-crash.bin.
//
// Inputs come from the target's seeds (real files) through 1 to 4 stacked mutations: bit flips,
// byte sets to interesting values, byte insertions and deletions, duplicated ranges, truncation,
// splices with another seed, dictionary tokens, numbers in the text replaced by boundary
// values, and 1/2/4/8-byte boundary integers written over binary fields. Inputs that are accepted
// join a bounded pool that later mutations start from, so the search goes past the first check.
//
// Budget, from the environment (defaults keep a CI run of every target under a minute on 2 cores):
//   LATHE_FUZZ_SECONDS   seconds per target (default 4)
//   LATHE_FUZZ_RUNS      most inputs per target (default 200000)
//   LATHE_FUZZ_SEED      seed of the mutation sequence (default 1; the same seed gives the same
//                        inputs, though a time budget may stop at a different input)
//   LATHE_FUZZ_HANG_SECONDS  one input running longer than this is a hang (default 20)
//   LATHE_FUZZ_REPLAY    a saved input (e.g. a crash file) to run alone, for every target run;
//                        pick the target with --gtest_filter
//
// Memory errors: build only this target with AddressSanitizer and UBSan in a folder of its own
// (not done in CI: it rebuilds core, io, tokenizer and data, minutes on 2 cores), then run it
// with a longer budget (the first and the last command each over three lines, to be joined):
//   cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DLATHE_CUDA=OFF
//     -DCMAKE_CXX_FLAGS="-fsanitize=address,undefined -fno-omit-frame-pointer -O1 -g"
//     -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined"
//   ninja -C build-asan fuzz_tests
//   LATHE_FUZZ_SECONDS=30 ASAN_OPTIONS=abort_on_error=1
//     UBSAN_OPTIONS=halt_on_error=1:abort_on_error=1:print_stacktrace=1
//     build-asan/fuzz_tests

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace lathe::fuzz {

struct FuzzTarget {
    std::string name;                     // for messages and the crash file name
    std::vector<std::string> seeds;       // real inputs; each must be accepted
    std::vector<std::string> dictionary;  // tokens of the format ("\"type\"", "null", ...)
    std::function<Status(std::string_view input)> run;
    size_t max_input_bytes = size_t{1} << 20;  // mutated inputs are cut to this
};

struct FuzzReport {
    uint64_t runs = 0;      // inputs run, seeds included
    uint64_t accepted = 0;  // of which accepted
    double seconds = 0.0;
    uint64_t seed = 0;
    // Empty, or what went wrong: a seed that is rejected (with its error), or an exception that
    // escaped (with where the input was saved).
    std::string failure;
};

// Runs the seeds, then mutated inputs until the budget is spent.
FuzzReport fuzz_run(const FuzzTarget& target);

// Applies 1..4 random mutations to `data` (exposed for the mutator's own test).
class Mutator {
public:
    explicit Mutator(uint64_t seed) : state_(seed) {}
    void mutate(std::string& data, const std::vector<std::string>& others,
                const std::vector<std::string>& dictionary, size_t max_bytes);
    uint64_t next();
    // Uniform in [0, n); n > 0.
    uint64_t below(uint64_t n) { return next() % n; }

private:
    void mutate_once(std::string& data, const std::vector<std::string>& others,
                     const std::vector<std::string>& dictionary);
    uint64_t state_;
};

// The environment's budget value `name`, or `fallback` when unset or not a number.
double fuzz_env_number(const char* name, double fallback);

}  // namespace lathe::fuzz
