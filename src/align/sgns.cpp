#include "align/sgns.h"

#include <algorithm>
#include <cmath>
#include <thread>

#include "align/embed_math.h"
#include "align/embed_random.h"
#include "align/sgns_step.h"
#include "core/check.h"

namespace lathe {

Result<SgnsCorpus> sgns_load_corpus(const IndexedDataset& data, const EmbedVocab& vocab) {
    SgnsCorpus corpus;
    const uint64_t docs = data.document_count();
    corpus.doc_offsets.reserve(docs + 1);
    corpus.doc_offsets.push_back(0);
    std::vector<int64_t> tokens;
    for (uint64_t k = 0; k < docs; ++k) {
        tokens.clear();
        data.read_document(k, tokens);
        for (int64_t id : tokens) {
            const int32_t r =
                size_t(id) < vocab.row_of_token.size() ? vocab.row_of_token[size_t(id)] : -1;
            if (r >= 0) corpus.rows.push_back(uint32_t(r));
        }
        corpus.doc_offsets.push_back(int64_t(corpus.rows.size()));
    }
    corpus.corpus_tokens = int64_t(corpus.rows.size());
    if (corpus.rows.empty())
        return invalid_argument_error("{}: no token of the vocabulary in the corpus",
                                      data.prefix());
    return corpus;
}

SgnsTables sgns_make_tables(const EmbedVocab& vocab, const SgnsOptions& options) {
    SgnsTables t;
    int64_t total = 0;
    for (int64_t c : vocab.count_of_row) total += c;
    for (int64_t c : vocab.count_of_row) {
        const double f = double(c) / double(total);
        t.keep.push_back(float(std::sqrt(options.subsample / f) + options.subsample / f));
    }
    // fastText's table: 10M entries, row r repeated ceil(count^0.5 / z * size) times. A smaller
    // vocabulary needs fewer entries for the same resolution.
    const double table_size =
        std::min(1e7, std::max(1e4, 100.0 * double(vocab.count_of_row.size())));
    double z = 0;
    for (int64_t c : vocab.count_of_row) z += std::sqrt(double(c));
    for (size_t r = 0; r < vocab.count_of_row.size(); ++r) {
        const double share = std::sqrt(double(vocab.count_of_row[r])) / z * table_size;
        for (int64_t j = 0; j < int64_t(std::ceil(share)); ++j) t.negatives.push_back(uint32_t(r));
    }
    for (int i = 0; i <= kSgnsTableSteps; ++i) {
        const double x = double(i) * 2.0 * kSgnsMaxSigmoid / kSgnsTableSteps - kSgnsMaxSigmoid;
        t.sigmoid.push_back(float(1.0 / (1.0 + std::exp(-x))));
        t.log.push_back(float(std::log((double(i) + 1e-5) / kSgnsTableSteps)));
    }
    return t;
}

SgnsModel sgns_init(int64_t V, int64_t D, uint64_t seed) {
    LATHE_CHECK(V > 0 && D > 0, "V={} D={}", V, D);
    SgnsModel m;
    m.V = V;
    m.D = D;
    m.in.resize(size_t(V * D));
    const float scale = 2.0f / float(D);
    for (size_t i = 0; i < m.in.size(); ++i)
        m.in[i] = (embed_uniform_at(seed, 11, i) - 0.5f) * scale;  // [-1/D, 1/D)
    m.out.assign(size_t(V * D), 0.0f);
    return m;
}

namespace {

SgnsStepConfig sgns_step_config(const SgnsOptions& o, int epoch, const SgnsTables& tables,
                                const SgnsCorpus& corpus) {
    SgnsStepConfig c{};
    c.rows = corpus.rows.data();
    c.keep = tables.keep.data();
    c.negatives = tables.negatives.data();
    c.negatives_size = tables.negatives.size();
    c.sigmoid = tables.sigmoid.data();
    c.log = tables.log.data();
    c.seed = o.seed;
    c.epoch = epoch;
    c.epochs = o.epochs;
    c.window = o.window;
    c.negative = o.negative;
    c.lr = o.lr;
    return c;
}

// The CPU side of sgns_step.h's interface: plain float arrays and loops.
struct CpuSgnsMath {
    float* in;
    float* out;
    int64_t D;
    const float* sigmoid_table;
    const float* log_table;
    float grad[4096];

    float dot_out_in(uint32_t t, uint32_t w) const {
        return embed_dot_warp_order(out + int64_t(t) * D, in + int64_t(w) * D, D);
    }
    void clear_grad() { std::fill(grad, grad + D, 0.0f); }
    // grad += a * out[t]; out[t] += a * in[w] (both read the old out[t]).
    void update_target(uint32_t t, uint32_t w, float a) {
        float* __restrict__ o = out + int64_t(t) * D;
        const float* __restrict__ h = in + int64_t(w) * D;
        for (int64_t d = 0; d < D; ++d) {
            const float od = o[d];
            grad[d] += a * od;
            o[d] = od + a * h[d];
        }
    }
    void apply_grad(uint32_t w) {
        float* __restrict__ h = in + int64_t(w) * D;
        for (int64_t d = 0; d < D; ++d) h[d] += grad[d];
    }
};

}  // namespace

double sgns_epoch_hogwild_cpu(SgnsModel& model, const SgnsCorpus& corpus, const SgnsTables& tables,
                              const SgnsOptions& options, int epoch) {
    LATHE_CHECK(model.D <= 4096, "D={}", model.D);
    const int threads = embed_thread_count(options.threads);
    const int64_t docs = int64_t(corpus.doc_offsets.size()) - 1;
    const int64_t N = int64_t(corpus.rows.size());
    std::vector<double> loss(size_t(threads), 0.0);
    std::vector<int64_t> updates(size_t(threads), 0);
    const SgnsStepConfig cfg = sgns_step_config(options, epoch, tables, corpus);

    auto work = [&](int t) {
        // Documents split so that each thread gets about N / threads tokens.
        const int64_t want_begin = N * t / threads, want_end = N * (t + 1) / threads;
        auto doc_at = [&](int64_t pos) {
            return int64_t(
                std::lower_bound(corpus.doc_offsets.begin(), corpus.doc_offsets.end(), pos) -
                corpus.doc_offsets.begin());
        };
        const int64_t d_begin = std::min(doc_at(want_begin), docs);
        const int64_t d_end = t + 1 == threads ? docs : std::min(doc_at(want_end), docs);
        const int64_t p_begin = corpus.doc_offsets[size_t(d_begin)];
        const int64_t p_end = corpus.doc_offsets[size_t(d_end)];
        auto math = std::make_unique<CpuSgnsMath>();
        math->in = model.in.data();
        math->out = model.out.data();
        math->D = model.D;
        math->sigmoid_table = tables.sigmoid.data();
        math->log_table = tables.log.data();
        SgnsStepResult acc;
        int64_t doc = d_begin;
        for (int64_t p = p_begin; p < p_end; ++p) {
            while (corpus.doc_offsets[size_t(doc) + 1] <= p) ++doc;
            // Progress through this worker's share, as all workers advance together.
            const double progress =
                double(p - p_begin) / double(std::max<int64_t>(p_end - p_begin, 1));
            sgns_step(cfg, *math, p, corpus.doc_offsets[size_t(doc)],
                      corpus.doc_offsets[size_t(doc) + 1], progress, acc);
        }
        loss[size_t(t)] = acc.loss;
        updates[size_t(t)] = acc.updates;
    };
    std::vector<std::thread> pool;
    for (int t = 1; t < threads; ++t) pool.emplace_back(work, t);
    work(0);
    for (auto& th : pool) th.join();
    double total = 0;
    int64_t n = 0;
    for (int t = 0; t < threads; ++t) total += loss[size_t(t)], n += updates[size_t(t)];
    return n > 0 ? total / double(n) : 0.0;
}

}  // namespace lathe
