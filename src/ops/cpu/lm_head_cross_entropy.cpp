#include "ops/cpu/lm_head_cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/check.h"
#include "ops/cpu/gemm.h"
#include "ops/cpu/parallel.h"
#include "ops/lm_head_cross_entropy.h"

namespace lathe::cpu {

namespace {

// Number of rows with a target; checks that every other target indexes the vocabulary.
int64_t count_targets(const int32_t* targets, int64_t N, int64_t V) {
    int64_t count = 0;
    for (int64_t n = 0; n < N; ++n) {
        if (targets[n] == kIgnoreIndex) continue;
        LATHE_CHECK(targets[n] >= 0 && targets[n] < V,
                    "target {} at row {} is neither -100 nor in [0, {})", targets[n], n, V);
        ++count;
    }
    return count;
}

// Walks the rows Nc at a time: logits chunk = x_chunk W^T into scratch, then
//  - without `lse_in`: computes each row's lse (to lse_out) and, with `losses`, its loss;
//  - with `backward`: turns the chunk into dlogits in place and applies dx, dweight.
// One function for forward, backward and both, so the three cannot drift apart.
struct ChunkWork {
    float* lse_out = nullptr;       // forward: per-row lse
    float* losses = nullptr;        // forward: per-row loss (0 when ignored)
    const float* lse_in = nullptr;  // backward only: lse saved by the forward
    bool backward = false;
    double grad_scale = 0.0;  // dloss / count
    float* dx = nullptr;
    float* dweight = nullptr;
    int64_t vocab_begin = 0;  // the vocabulary id of the weight's row 0 (a shard)
};

void run_chunks(const ChunkWork& w, const float* x, const int32_t* targets, const float* weight,
                float* scratch, int64_t N, int64_t C, int64_t V, int64_t Nc) {
    for (int64_t r0 = 0; r0 < N; r0 += Nc) {
        const int64_t rows = std::min(Nc, N - r0);
        const float* xc = x + r0 * C;
        sgemm(false, true, rows, V, C, 1.0f, xc, weight, 0.0f, scratch);  // (rows, V)
        LATHE_OMP_PARALLEL_FOR(rows * V * 4)
        for (int64_t r = 0; r < rows; ++r) {
            const int64_t n = r0 + r;
            float* logits = scratch + r * V;
            const bool ignored = targets[n] == kIgnoreIndex;
            // The target's column: outside [0, V) when ignored or in another vocabulary shard.
            const int64_t target = ignored ? -1 : int64_t(targets[n]) - w.vocab_begin;
            const bool here = target >= 0 && target < V;
            if (w.lse_in) {  // backward from a saved lse: softmax = exp(logit - lse)
                const float lse = w.lse_in[n];
                for (int64_t v = 0; v < V; ++v)
                    logits[v] = ignored ? 0.0f : float(w.grad_scale) * std::exp(logits[v] - lse);
                if (here) logits[target] -= float(w.grad_scale);
                continue;
            }
            // lse = m + log(sum_v exp(logit - m)): fp32 exponentials, an fp64 sum. With a
            // backward to follow, each exponential is kept in place and reused for the softmax.
            const float m = *std::max_element(logits, logits + V);
            const float target_logit = here ? logits[target] : 0.0f;
            double sum = 0.0;
            for (int64_t v = 0; v < V; ++v) {
                const float e = std::exp(logits[v] - m);
                sum += e;
                if (w.backward) logits[v] = e;
            }
            const double lse = double(m) + std::log(sum);
            w.lse_out[n] = float(lse);
            if (w.losses) w.losses[n] = ignored ? 0.0f : float(lse - target_logit);
            if (!w.backward) continue;
            // dlogits = scale * (softmax - onehot(target)); ignored rows contribute nothing.
            const float k = ignored ? 0.0f : float(w.grad_scale / sum);
            for (int64_t v = 0; v < V; ++v) logits[v] *= k;
            if (here) logits[target] -= float(w.grad_scale);
        }
        if (!w.backward) continue;
        sgemm(false, false, rows, C, V, 1.0f, scratch, weight, 0.0f, w.dx + r0 * C);  // dx = dl W
        if (w.dweight) sgemm(true, false, V, C, rows, 1.0f, scratch, xc, 1.0f, w.dweight);
    }
}

// The mean over rows with a target, summed in fp64 in row order.
float mean_loss(const float* losses, int64_t N, int64_t count) {
    double sum = 0.0;
    for (int64_t n = 0; n < N; ++n) sum += losses[n];
    return count == 0 ? 0.0f : float(sum / double(count));
}

}  // namespace

void lm_head_cross_entropy_forward(float* loss, float* losses, float* lse, const float* x,
                                   const int32_t* targets, const float* weight, float* scratch,
                                   int64_t N, int64_t C, int64_t V, int64_t Nc, int64_t vocab_begin,
                                   int64_t vocab_total) {
    const int64_t count = count_targets(targets, N, vocab_total == 0 ? V : vocab_total);
    std::vector<float> own;  // per-row losses for the mean when the caller wants none
    if (losses == nullptr) {
        own.resize(size_t(N));
        losses = own.data();
    }
    ChunkWork w;
    w.lse_out = lse;
    w.losses = losses;
    w.vocab_begin = vocab_begin;
    run_chunks(w, x, targets, weight, scratch, N, C, V, Nc);
    *loss = mean_loss(losses, N, count);
}

void lm_head_cross_entropy_backward(float* dx, float* dweight, const float* x,
                                    const int32_t* targets, const float* weight, const float* lse,
                                    float dloss, float* scratch, int64_t N, int64_t C, int64_t V,
                                    int64_t Nc, int64_t vocab_begin, int64_t vocab_total) {
    const int64_t count = count_targets(targets, N, vocab_total == 0 ? V : vocab_total);
    ChunkWork w;
    w.vocab_begin = vocab_begin;
    w.lse_in = lse;
    w.backward = true;
    w.grad_scale = count == 0 ? 0.0 : double(dloss) / double(count);
    w.dx = dx;
    w.dweight = dweight;
    run_chunks(w, x, targets, weight, scratch, N, C, V, Nc);
}

void lm_head_cross_entropy_forward_backward(float* loss, float* losses, float* dx, float* dweight,
                                            const float* x, const int32_t* targets,
                                            const float* weight, float dloss, float* scratch,
                                            int64_t N, int64_t C, int64_t V, int64_t Nc) {
    const int64_t count = count_targets(targets, N, V);
    std::vector<float> own(size_t(N) * (losses ? 1 : 2));  // lse, and losses if not given
    ChunkWork w;
    w.lse_out = own.data();
    w.losses = losses ? losses : own.data() + N;
    w.backward = true;
    w.grad_scale = count == 0 ? 0.0 : double(dloss) / double(count);
    w.dx = dx;
    w.dweight = dweight;
    run_chunks(w, x, targets, weight, scratch, N, C, V, Nc);
    *loss = mean_loss(w.losses, N, count);
}

}  // namespace lathe::cpu
