#include "ops/cpu/embedding.h"

#include "core/check.h"
#include "ops/cpu/parallel.h"

namespace lathe::cpu {

namespace {
void check_ids(const int32_t* tokens, const int32_t* positions, int64_t N, int64_t T, int64_t V,
               int64_t P, bool have_wpe) {
    for (int64_t n = 0; n < N; ++n) {
        LATHE_CHECK(tokens[n] >= 0 && tokens[n] < V, "token id {} at row {} outside [0, {})",
                    tokens[n], n, V);
        if (have_wpe) {
            const int64_t pos = positions ? positions[n] : n % T;
            LATHE_CHECK(pos >= 0 && pos < P, "position {} at row {} outside [0, {})", pos, n, P);
        }
    }
}
}  // namespace

void embedding_forward(float* out, const int32_t* tokens, const int32_t* positions,
                       const float* wte, const float* wpe, int64_t B, int64_t T, int64_t C,
                       int64_t V, int64_t P) {
    const int64_t N = B * T;
    check_ids(tokens, positions, N, T, V, P, wpe != nullptr);
    LATHE_OMP_PARALLEL_FOR(B * T * C)
    for (int64_t n = 0; n < N; ++n) {
        const float* e = wte + int64_t(tokens[n]) * C;
        float* o = out + n * C;
        if (wpe) {
            const float* p = wpe + (positions ? int64_t(positions[n]) : n % T) * C;
            for (int64_t c = 0; c < C; ++c) o[c] = e[c] + p[c];
        } else {
            for (int64_t c = 0; c < C; ++c) o[c] = e[c];
        }
    }
}

void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                        const int32_t* positions, int64_t B, int64_t T, int64_t C, int64_t V,
                        int64_t P) {
    const int64_t N = B * T;
    check_ids(tokens, positions, N, T, V, P, dwpe != nullptr);
    // Threads split the channels, so every element of dwte/dwpe is summed by one thread in row
    // order: no races and the same result for any thread count.
    LATHE_OMP_PARALLEL_FOR(B * T * C)
    for (int64_t c = 0; c < C; ++c) {
        for (int64_t n = 0; n < N; ++n) {
            const float g = dout[n * C + c];
            if (dwte) dwte[int64_t(tokens[n]) * C + c] += g;
            if (dwpe) dwpe[(positions ? int64_t(positions[n]) : n % T) * C + c] += g;
        }
    }
}

}  // namespace lathe::cpu
