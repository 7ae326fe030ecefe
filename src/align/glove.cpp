#include "align/glove.h"

#include <cmath>
#include <thread>

#include "align/embed_math.h"
#include "align/embed_random.h"
#include "core/check.h"

namespace lathe {

std::vector<GloveEntry> glove_make_entries(std::span<const CooccurEntry> cooccur,
                                           const GloveOptions& options) {
    std::vector<GloveEntry> entries(cooccur.size());
    for (size_t i = 0; i < cooccur.size(); ++i) {
        const CooccurEntry& e = cooccur[i];
        LATHE_CHECK(e.value > 0.0f, "entry {} ({}, {}) value={}", i, e.row, e.col, e.value);
        const double x = e.value;
        const double f = x < options.x_max ? std::pow(x / options.x_max, options.alpha) : 1.0;
        entries[i] = GloveEntry{e.row, e.col, float(std::log(x)), float(f)};
    }
    // Fisher-Yates with a seeded generator: the same seed gives the same order everywhere.
    EmbedRng rng(options.seed, 0x5348554646ull);  // "SHUFF"
    for (size_t i = entries.size(); i > 1; --i) {
        const size_t j = size_t(rng.below(i));
        std::swap(entries[i - 1], entries[j]);
    }
    return entries;
}

GloveModel glove_init(int64_t V, int64_t D, uint64_t seed) {
    LATHE_CHECK(V > 0 && D > 0, "V={} D={}", V, D);
    GloveModel m;
    m.V = V;
    m.D = D;
    const size_t vd = size_t(V * D);
    m.w.resize(vd);
    m.c.resize(vd);
    m.bw.resize(size_t(V));
    m.bc.resize(size_t(V));
    // glove.c: (rand() / RAND_MAX - 0.5) / vector_size for every parameter.
    const float scale = 1.0f / float(D);
    auto fill = [&](std::vector<float>& v, uint64_t stream) {
        for (size_t i = 0; i < v.size(); ++i)
            v[i] = (embed_uniform_at(seed, stream, i) - 0.5f) * scale;
    };
    fill(m.w, 1);
    fill(m.c, 2);
    fill(m.bw, 3);
    fill(m.bc, 4);
    m.gw.assign(vd, 1.0f);
    m.gc.assign(vd, 1.0f);
    m.gbw.assign(size_t(V), 1.0f);
    m.gbc.assign(size_t(V), 1.0f);
    return m;
}

namespace {

// One entry's update (glove.h); returns its cost (0 when skipped).
inline double glove_step(GloveModel& m, const GloveEntry& e, float lr, float clip) {
    const int64_t D = m.D;
    float* __restrict__ wa = m.w.data() + int64_t(e.row) * D;
    float* __restrict__ cb = m.c.data() + int64_t(e.col) * D;
    float* __restrict__ gwa = m.gw.data() + int64_t(e.row) * D;
    float* __restrict__ gcb = m.gc.data() + int64_t(e.col) * D;
    const float dot = embed_dot_warp_order(wa, cb, D);
    const float diff = ((dot + m.bw[e.row]) + m.bc[e.col]) - e.log_x;
    const float fdiff = e.weight * diff;
    if (!std::isfinite(diff) || !std::isfinite(fdiff)) return 0.0;
    for (int64_t d = 0; d < D; ++d) {
        const float g1 = std::fmin(std::fmax(fdiff * cb[d], -clip), clip) * lr;
        const float g2 = std::fmin(std::fmax(fdiff * wa[d], -clip), clip) * lr;
        wa[d] -= g1 / std::sqrt(gwa[d]);
        cb[d] -= g2 / std::sqrt(gcb[d]);
        gwa[d] += g1 * g1;
        gcb[d] += g2 * g2;
    }
    m.bw[e.row] -= fdiff / std::sqrt(m.gbw[e.row]);
    m.bc[e.col] -= fdiff / std::sqrt(m.gbc[e.col]);
    m.gbw[e.row] += fdiff * fdiff;
    m.gbc[e.col] += fdiff * fdiff;
    return 0.5 * double(fdiff) * double(diff);
}

}  // namespace

double glove_epoch_hogwild_cpu(GloveModel& model, std::span<const GloveEntry> entries, double lr,
                               double grad_clip, int threads) {
    threads = embed_thread_count(threads);
    const size_t n = entries.size();
    if (n == 0) return 0.0;
    const float lr_f = float(lr);
    const float clip_f = float(grad_clip);
    std::vector<double> cost(size_t(threads), 0.0);
    auto work = [&](int t) {
        const size_t begin = n * size_t(t) / size_t(threads);
        const size_t end = n * size_t(t + 1) / size_t(threads);
        double c = 0.0;
        for (size_t i = begin; i < end; ++i) c += glove_step(model, entries[i], lr_f, clip_f);
        cost[size_t(t)] = c;
    };
    std::vector<std::thread> pool;
    for (int t = 1; t < threads; ++t) pool.emplace_back(work, t);
    work(0);
    for (auto& th : pool) th.join();
    double total = 0.0;
    for (double c : cost) total += c;
    return total / double(n);
}

std::vector<float> glove_output_vectors(const GloveModel& model) {
    std::vector<float> out(model.w.size());
    for (size_t i = 0; i < out.size(); ++i) out[i] = model.w[i] + model.c[i];
    return out;
}

}  // namespace lathe
