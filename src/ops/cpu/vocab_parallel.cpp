#include "ops/cpu/vocab_parallel.h"

#include <cmath>
#include <cstring>

#include "core/check.h"
#include "ops/cpu/parallel.h"
#include "ops/lm_head_cross_entropy.h"

namespace lathe::cpu {

void vocab_shard_ids(int32_t* local, const int32_t* ids, int64_t N, int64_t begin, int64_t V,
                     int64_t total) {
    for (int64_t n = 0; n < N; ++n) {
        LATHE_CHECK(ids[n] >= 0 && ids[n] < total, "id {} at row {} outside [0, {})", ids[n], n,
                    total);
        const int64_t i = int64_t(ids[n]) - begin;
        local[n] = i >= 0 && i < V ? int32_t(i) : 0;
    }
}

void vocab_shard_zero_rows(float* x, const int32_t* ids, int64_t N, int64_t C, int64_t begin,
                           int64_t V) {
    for (int64_t n = 0; n < N; ++n) {
        const int64_t i = int64_t(ids[n]) - begin;
        if (i < 0 || i >= V) std::memset(x + n * C, 0, size_t(C) * sizeof(float));
    }
}

void vocab_shard_embedding_backward(float* dwte, const float* dx, const int32_t* ids, int64_t N,
                                    int64_t C, int64_t begin, int64_t V, int64_t total) {
    for (int64_t n = 0; n < N; ++n) {
        LATHE_CHECK(ids[n] >= 0 && ids[n] < total, "id {} at row {} outside [0, {})", ids[n], n,
                    total);
    }
    LATHE_OMP_PARALLEL_FOR(N * C)
    for (int64_t c = 0; c < C; ++c) {
        for (int64_t n = 0; n < N; ++n) {
            const int64_t i = int64_t(ids[n]) - begin;
            if (i >= 0 && i < V) dwte[i * C + c] += dx[n * C + c];
        }
    }
}

void cross_entropy_vocab_parallel_prepare(float* work, const float* lse, const float* losses,
                                          int64_t N) {
    float* m = work;
    float* t = work + 2 * N;
    for (int64_t n = 0; n < N; ++n) {
        m[n] = lse[n];
        t[n] = lse[n] - losses[n];
    }
}

void cross_entropy_vocab_parallel_exp(float* work, const float* lse, int64_t N) {
    const float* m = work;
    float* e = work + N;
    for (int64_t n = 0; n < N; ++n) e[n] = std::exp(lse[n] - m[n]);
}

void cross_entropy_vocab_parallel_finish(float* loss, float* losses, float* lse,
                                         const int32_t* targets, const float* work, int64_t N) {
    const float* m = work;
    const float* e = work + N;
    const float* t = work + 2 * N;
    double sum = 0.0;
    int64_t count = 0;
    for (int64_t n = 0; n < N; ++n) {
        lse[n] = m[n] + std::log(e[n]);
        const bool ignored = targets[n] == kIgnoreIndex;
        losses[n] = ignored ? 0.0f : lse[n] - t[n];
        sum += losses[n];
        count += ignored ? 0 : 1;
    }
    *loss = count == 0 ? 0.0f : float(sum / double(count));
}

}  // namespace lathe::cpu
