#pragma once
// One centre position of skip-gram training (sgns.h has the math), shared by the CPU twin and the
// CUDA kernel so that both make the same random draws in the same order. The arithmetic on
// vectors is the caller's `Math`:
//   float dot_out_in(uint32_t t, uint32_t w)       out[t] . in[w], warp order
//   void clear_grad()                              grad = 0
//   void update_target(uint32_t t, uint32_t w, float a)   grad += a * out[t]; out[t] += a * in[w]
//   void apply_grad(uint32_t w)                    in[w] += grad
// On the GPU every lane of a warp calls them with the same arguments (the draws below are the
// same on every lane), and each call returns the same value on every lane.

#include <cstdint>

#include "align/embed_random.h"

namespace lathe {

struct SgnsStepConfig {
    const uint32_t* rows;       // (N) the corpus as vocabulary rows
    const float* keep;          // (V) keep probabilities
    const uint32_t* negatives;  // negative-sampling table
    uint64_t negatives_size;
    const float* sigmoid;  // (kSgnsTableSteps + 1)
    const float* log;      // (kSgnsTableSteps + 1)
    uint64_t seed;
    int epoch;
    int epochs;
    int window;
    int negative;
    double lr;
};

struct SgnsStepResult {
    double loss = 0.0;
    int64_t updates = 0;
};

// Streams of the counter-based generator: subsampling draws, and per-position sequences.
LATHE_EMBED_HD inline uint64_t sgns_subsample_stream(int epoch) {
    return 0x5355425300000000ull + uint64_t(epoch);
}
LATHE_EMBED_HD inline uint64_t sgns_position_stream(int epoch, int64_t p) {
    return embed_mix64(0x504f530000000000ull + uint64_t(epoch)) ^ uint64_t(p);
}

LATHE_EMBED_HD inline bool sgns_kept(const SgnsStepConfig& c, int64_t q) {
    return embed_uniform_at(c.seed, sgns_subsample_stream(c.epoch), uint64_t(q)) <=
           c.keep[c.rows[q]];
}

// fastText's table lookups: sigmoid over [-8, 8] and log over (0, 1] in 512 steps. A NaN (the
// vectors of a diverged run: too large a learning rate) takes an end of the table, never an index
// outside it; the run's vectors are checked for it before they are written (embed.cpp).
LATHE_EMBED_HD inline float sgns_sigmoid(const SgnsStepConfig& c, float x) {
    if (!(x >= -8.0f)) return 0.0f;
    if (x > 8.0f) return 1.0f;
    const float scaled = (x + 8.0f) * 32.0f;  // (x + max) * steps / (2 max)
    return c.sigmoid[int(scaled)];
}
LATHE_EMBED_HD inline float sgns_log(const SgnsStepConfig& c, float x) {
    if (!(x <= 1.0f)) return 0.0f;
    return c.log[int(x * 512.0f)];
}

// One (centre w, context) update with its negatives; draws come from `rng`.
template <typename Math>
LATHE_EMBED_HD inline void sgns_pair(const SgnsStepConfig& c, Math& m, EmbedRng& rng, uint32_t w,
                                     uint32_t ctx, float lr_now, SgnsStepResult& acc) {
    m.clear_grad();
    for (int n = 0; n <= c.negative; ++n) {
        uint32_t t = ctx;
        if (n > 0) {
            // Redraw a negative equal to the context (fastText does); a vocabulary of one
            // token would loop forever, so give up after a few tries.
            for (int tries = 0; tries < 8 && t == ctx; ++tries)
                t = c.negatives[rng.below(c.negatives_size)];
        }
        const float label = n == 0 ? 1.0f : 0.0f;
        const float score = sgns_sigmoid(c, m.dot_out_in(t, w));
        const float a = lr_now * (label - score);
        m.update_target(t, w, a);
        acc.loss -= double(n == 0 ? sgns_log(c, score) : sgns_log(c, 1.0f - score));
    }
    m.apply_grad(w);
    acc.updates += 1;
}

// Centre position p of the document [doc_begin, doc_end); progress in [0, 1) through the epoch's
// share of the worker running it (for the learning-rate decay).
template <typename Math>
LATHE_EMBED_HD inline void sgns_step(const SgnsStepConfig& c, Math& m, int64_t p, int64_t doc_begin,
                                     int64_t doc_end, double progress, SgnsStepResult& acc) {
    if (!sgns_kept(c, p)) return;
    EmbedRng rng(c.seed, sgns_position_stream(c.epoch, p));
    const int b = 1 + int(rng.below(uint64_t(c.window)));
    const float lr_now = float(c.lr * (1.0 - (double(c.epoch) + progress) / double(c.epochs)));
    const uint32_t w = c.rows[p];
    // Left context, farthest first (fastText's order): find the b-th kept token to the left.
    int64_t start = p;
    int found = 0;
    for (int64_t q = p - 1; q >= doc_begin && found < b; --q)
        if (sgns_kept(c, q)) start = q, ++found;
    for (int64_t q = start; q < p; ++q)
        if (sgns_kept(c, q)) sgns_pair(c, m, rng, w, c.rows[q], lr_now, acc);
    found = 0;
    for (int64_t q = p + 1; q < doc_end && found < b; ++q)
        if (sgns_kept(c, q)) {
            ++found;
            sgns_pair(c, m, rng, w, c.rows[q], lr_now, acc);
        }
}

}  // namespace lathe
