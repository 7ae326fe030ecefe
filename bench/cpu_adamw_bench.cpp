// CPU AdamW throughput (optim/cpu_adamw.h): one update of N parameters, per path (scalar and
// every vector path this CPU has) and thread count (1 and all cores), for f32 and bf16 moments.
//
//   ninja -C build cpu_adamw_bench && ./build/cpu_adamw_bench [N] [steps] [threads,...]
//
// N defaults to 1e8 parameters, steps (timed updates after one untimed warm-up) to 3, the thread
// counts to 1 and every core. Prints one line per case: seconds per update (the fastest of the
// timed ones, and the slowest), parameters per second (of the fastest) and
// memory traffic in GB/s, counted as the bytes the update must move per parameter:
//   f32 moments:  reads p, m, v, g (16 B), writes p, m, v (12 B) and the bf16 copy (2 B) = 30 B
//   bf16 moments: reads p, g (8 B) and m, v (4 B), writes p (4 B), m, v (4 B), copy (2 B) = 22 B
// Buffers are allocated untouched and the moments first-touched by zero_state(), as a trainer
// would.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "optim/cpu_adamw.h"

namespace {

using lathe::AdamWStateDType;
using lathe::CpuAdamW;
using lathe::CpuAdamWPath;

template <class T>
std::unique_ptr<T[]> untouched(int64_t n) {
    return std::unique_ptr<T[]>(new T[size_t(n)]);  // default-initialized: no page touched
}

}  // namespace

int main(int argc, char** argv) {
    const int64_t n = argc > 1 ? int64_t(std::atof(argv[1])) : int64_t(100000000);
    const int steps = argc > 2 ? std::atoi(argv[2]) : 3;
    if (n <= 0 || steps <= 0) {
        std::fprintf(
            stderr,
            "cpu_adamw_bench: error: usage: cpu_adamw_bench [N > 0] [steps > 0] [threads,...]\n");
        return 2;
    }
    const int all = int(std::max(1u, std::thread::hardware_concurrency()));
    std::vector<int> thread_counts = {1, all};
    if (argc > 3) {
        thread_counts.clear();
        for (const char* p = argv[3]; *p != '\0';) {
            char* end = nullptr;
            const long t = std::strtol(p, &end, 10);
            if (end == p || t <= 0 || t > 4096 || (*end != ',' && *end != '\0')) {
                thread_counts.clear();
                break;
            }
            thread_counts.push_back(int(t));
            p = *end == ',' ? end + 1 : end;
        }
        if (thread_counts.empty()) {
            std::fprintf(stderr,
                         "cpu_adamw_bench: error: threads \"%s\": a comma-separated list of "
                         "counts from 1 to 4096, e.g. 1,8,16\n",
                         argv[3]);
            return 2;
        }
    }
    std::printf("cpu_adamw_bench: N %lld parameters, %d cores, best path %s\n", (long long)n, all,
                lathe::cpu_adamw_path_name(lathe::cpu_adamw_best_path()));
    auto params = untouched<float>(n);
    auto grads = untouched<float>(n);
    auto copy = untouched<lathe::bf16>(n);
    std::mt19937 rng(1);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    for (int64_t i = 0; i < n; ++i) {
        params[size_t(i)] = 0.02f * dist(rng);
        grads[size_t(i)] = 1e-3f * dist(rng);
    }
    const lathe::AdamWSegment segs[] = {{0, n, 1e-5, 0.1}};
    const lathe::AdamWHyper hyper;
    const float norm = 2.0f;
    for (AdamWStateDType dtype : {AdamWStateDType::kF32, AdamWStateDType::kBF16}) {
        const size_t es = lathe::adamw_state_dtype_bytes(dtype);
        auto m = untouched<char>(n * int64_t(es));
        auto v = untouched<char>(n * int64_t(es));
        const double bytes = dtype == AdamWStateDType::kF32 ? 30.0 : 22.0;
        for (CpuAdamWPath path : {CpuAdamWPath::kScalar, CpuAdamWPath::kAvx2, CpuAdamWPath::kAvx512,
                                  CpuAdamWPath::kNeon}) {
            if (!lathe::cpu_adamw_path_available(path)) continue;
            for (int threads : thread_counts) {
                auto opt = CpuAdamW::create(threads, path);
                if (!opt.ok()) {
                    std::fprintf(stderr, "cpu_adamw_bench: error: %s\n",
                                 opt.status().to_string().c_str());
                    return 1;
                }
                lathe::CpuAdamWBuffers b;
                b.numel = n;
                b.params = params.get();
                b.m = m.get();
                b.v = v.get();
                b.grads = grads.get();
                b.params_bf16 = copy.get();
                b.state_dtype = dtype;
                opt->zero_state(b, segs);
                double best = 1e30, worst = 0.0;
                for (int t = 0; t <= steps; ++t) {
                    const auto t0 = std::chrono::steady_clock::now();
                    opt->step(b, segs, hyper, t + 1, &norm, 1.0f);
                    const double s =
                        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
                            .count();
                    if (t > 0) {  // t = 0 warms up
                        best = std::min(best, s);
                        worst = std::max(worst, s);
                    }
                }
                std::printf(
                    "moments %-4s path %-6s threads %2d: %.3f s/update (slowest %.3f)  %.3g "
                    "params/s  "
                    "%.2f GB/s\n",
                    lathe::adamw_state_dtype_name(dtype), lathe::cpu_adamw_path_name(path), threads,
                    best, worst, double(n) / best, double(n) * bytes / best / 1e9);
            }
        }
    }
    return 0;
}
