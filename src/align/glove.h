#pragma once
// GloVe training (Pennington et al. 2014) as the GloVe C tool (stanfordnlp/GloVe, glove.c) does
// it, on the co-occurrence matrix of align/cooccur.h. CPU (this file's *_cpu functions, the
// specification) and CUDA (glove.cu) share one semantics.
//
// Model: word vectors w (V, D), context vectors c (V, D), word biases bw (V), context biases
// bc (V); AdaGrad sums of squared gradients gw, gc (V, D), gbw, gbc (V), all fp32.
//   Initialisation (glove.c): every parameter uniform in [-0.5, 0.5) / D; every AdaGrad sum 1,
//   so the first step's learning rate is lr.
//   Per entry (a, b, x), in the order of a once-shuffled list (glove.c reads the file that
//   GloVe's shuffle tool wrote once):
//     diff  = w[a] . c[b] + bw[a] + bc[b] - log x
//     fdiff = f(x) * diff,   f(x) = (x / x_max)^alpha if x < x_max else 1
//     cost += 0.5 * fdiff * diff
//     for each d:  g1 = clip(fdiff * c[b][d]) * lr,  g2 = clip(fdiff * w[a][d]) * lr
//                  w[a][d] -= g1 / sqrt(gw[a][d]);  c[b][d] -= g2 / sqrt(gc[b][d])
//                  gw[a][d] += g1^2;                gc[b][d] += g2^2
//                  (clip to [-grad_clip, grad_clip]; both updates read the old w and c)
//     bw[a] -= fdiff / sqrt(gbw[a]);  bc[b] -= fdiff / sqrt(gbc[b]);  gbw[a] += fdiff^2, gbc too
//   The biases step with fdiff itself, not lr * fdiff: glove.c does exactly this (it scales only
//   the vector gradients by eta), and lathe matches it so that results compare with the tool.
//   An entry whose diff is not finite is skipped (glove.c skips it too).
//   The output vector of token a is w[a] + c[a] (glove.c -model 2, its default): GloVe's paper
//   notes the sum is a little better than w alone.
//
// Differences from glove.c, all deliberate: fp32 parameters (glove.c: double), log x and f(x)
// computed once per entry at load (GloveEntry) instead of every epoch, its own seeded RNG (so a
// run is reproducible; glove.c seeds rand() from the clock unless -seed is given).
//
// The dot product is summed in a fixed order on both backends: 32 strided partial sums
// (partial[l] = sum over d = l, l+32, ... of w[d] * c[d]) combined by a butterfly (partial[l] +=
// partial[l ^ m] for m = 16, 8, 4, 2, 1), which is what one CUDA warp computes with its lanes.
// All other arithmetic is one IEEE fp32 operation at a time, without contraction into FMA. So a
// single-threaded CPU epoch and a one-warp CUDA epoch give bitwise the same parameters.
//
// Concurrency: with more than one thread (CPU) or warp (CUDA) updates are Hogwild (lock-free,
// racy, as glove.c's threads): the result depends on timing, not only on the seed. Name:
// glove_epoch_hogwild_*. Pass threads = 1 / warps = 1 for a deterministic run.

#include <cstdint>
#include <span>
#include <vector>

#include "align/cooccur.h"
#include "ops/context.h"

namespace lathe {

// One training entry (16 bytes): the co-occurrence (a, b) with log x and f(x) precomputed.
struct GloveEntry {
    uint32_t row;  // a
    uint32_t col;  // b
    float log_x;   // log(x), fp32 of the double log
    float weight;  // f(x), fp32 of the double pow
};

struct GloveOptions {
    int64_t dim = 300;  // D
    int iters = 15;
    double x_max = 10.0;  // TokAlign's setting (glove.c's default is 100)
    double alpha = 0.75;
    double lr = 0.05;          // glove.c's eta
    double grad_clip = 100.0;  // glove.c's grad_clip_value
    uint64_t seed = 1;
    int threads = 0;  // CPU threads (0: all cores)
};

// Parameters and AdaGrad state, fp32, row-major.
struct GloveModel {
    int64_t V = 0;
    int64_t D = 0;
    std::vector<float> w, c;      // (V, D)
    std::vector<float> bw, bc;    // (V)
    std::vector<float> gw, gc;    // (V, D) AdaGrad sums
    std::vector<float> gbw, gbc;  // (V)
};

// Training entries for `cooccur` under `options` (x_max, alpha), shuffled with a generator seeded
// from options.seed (Fisher-Yates). Entries with x <= 0 never occur (cooccur_count stores
// positives only; checked).
std::vector<GloveEntry> glove_make_entries(std::span<const CooccurEntry> cooccur,
                                           const GloveOptions& options);

// A model of V rows and D dimensions initialised as above from `seed` (a counter-based generator:
// element i of each array depends on seed and i only).
GloveModel glove_init(int64_t V, int64_t D, uint64_t seed);

// One pass over `entries` on `threads` threads, each taking a contiguous slice (as glove.c).
// Returns the mean cost over the entries (sum of 0.5 * fdiff * diff / entries.size(), summed in
// double, per-thread partials added in thread order). threads = 1 is deterministic.
double glove_epoch_hogwild_cpu(GloveModel& model, std::span<const GloveEntry> entries, double lr,
                               double grad_clip, int threads);

// The vectors written out: w[a] + c[a], (V, D).
std::vector<float> glove_output_vectors(const GloveModel& model);

#ifdef LATHE_HAVE_CUDA
// The CUDA trainer: the model and entries live on the device between epochs, in buffers of its
// own; uploads, kernels and downloads run on the compute stream of the CUDA context's CudaState.
class GloveCuda {
public:
    // Uploads `model` and `entries` to the device of `ctx` (a CUDA context, whose CudaState must
    // outlive the trainer). `warps` = resident warps of the Hogwild kernel (0: enough to fill the
    // device, at most about V / 16 so that conflicts stay rare; 1: deterministic, bitwise equal to
    // glove_epoch_hogwild_cpu with threads = 1).
    GloveCuda(const Context& ctx, const GloveModel& model, std::span<const GloveEntry> entries,
              int warps = 0);
    ~GloveCuda();
    GloveCuda(const GloveCuda&) = delete;
    GloveCuda& operator=(const GloveCuda&) = delete;

    // One pass over the entries; returns the mean cost as glove_epoch_hogwild_cpu does. Warp k
    // takes entries k, k + warps, k + 2 * warps, ... (a single warp takes them in order).
    double epoch(double lr, double grad_clip);
    // Copies the parameters and AdaGrad sums back into `model` (same V, D).
    void download(GloveModel& model) const;
    int warps() const { return warps_; }

private:
    struct Buffers;
    Buffers* buffers_ = nullptr;
    int64_t V_ = 0;
    int64_t D_ = 0;
    int64_t n_ = 0;
    int warps_ = 0;
};
#endif

}  // namespace lathe
