#pragma once
// Shared by the stage-3 tests (cooccur, glove, sgns; CPU and CUDA): token files made from
// in-memory documents, and a small corpus with known structure.

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "core/check.h"
#include "data/indexed_dataset.h"

namespace lathe::embedtest {

inline std::string temp_dir() {
    const auto dir =
        std::filesystem::temp_directory_path() / ("lathe_embed_test_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    return dir.string();
}

// Writes `docs` as the token file pair "<temp>/<name>.bin/.idx" and opens it.
inline IndexedDataset write_docs(const std::string& name,
                                 const std::vector<std::vector<int32_t>>& docs,
                                 TokenDType dtype = TokenDType::kUInt16) {
    const std::string prefix = temp_dir() + "/" + name;
    auto writer = IndexedDatasetWriter::create(prefix, dtype);
    LATHE_CHECK(writer.ok(), "{}", writer.status().to_string());
    for (const auto& d : docs) LATHE_CHECK(writer->add_document(d).ok());
    LATHE_CHECK(writer->finalize().ok());
    LATHE_CHECK(writer->commit().ok());
    auto data = IndexedDataset::open(prefix);
    LATHE_CHECK(data.ok(), "{}", data.status().to_string());
    return std::move(data).value();
}

// `n_docs` documents of Zipf-distributed ids in [0, vocab) (p(id) ~ 1 / (id + 1)), lengths in
// [1, max_len]: a frequency profile like a real token stream's.
inline std::vector<std::vector<int32_t>> zipf_docs(int n_docs, int max_len, int vocab,
                                                   uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::vector<double> w(static_cast<size_t>(vocab));
    for (int i = 0; i < vocab; ++i) w[size_t(i)] = 1.0 / (i + 1);
    std::discrete_distribution<int> pick(w.begin(), w.end());
    std::uniform_int_distribution<int> len(1, max_len);
    std::vector<std::vector<int32_t>> docs(static_cast<size_t>(n_docs));
    for (auto& d : docs) {
        const int n = len(rng);
        for (int i = 0; i < n; ++i) d.push_back(pick(rng));
    }
    return docs;
}

// Random walks on a ring of `ring` ids (each step -2, -1, +1 or +2, modulo ring), `len` tokens
// per document. Ids close on the ring co-occur often and at short distances, far ones rarely or
// never, so good embeddings put an id's nearest neighbours next to it on the ring.
inline std::vector<std::vector<int32_t>> ring_docs(int n_docs, int len, int ring, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::uniform_int_distribution<int> start(0, ring - 1);
    std::uniform_int_distribution<int> step(0, 3);
    const int steps[4] = {-2, -1, 1, 2};
    std::vector<std::vector<int32_t>> docs(static_cast<size_t>(n_docs));
    for (auto& d : docs) {
        int at = start(rng);
        for (int i = 0; i < len; ++i) {
            d.push_back(at);
            at = (at + steps[step(rng)] + ring) % ring;
        }
    }
    return docs;
}

// Distance of ids a and b on a ring of `ring` ids.
inline int ring_distance(int a, int b, int ring) {
    const int d = std::abs(a - b) % ring;
    return std::min(d, ring - d);
}

// Cosine similarity of two D-vectors.
inline double cosine(const float* a, const float* b, int64_t D) {
    double ab = 0, aa = 0, bb = 0;
    for (int64_t d = 0; d < D; ++d) {
        ab += double(a[d]) * b[d];
        aa += double(a[d]) * a[d];
        bb += double(b[d]) * b[d];
    }
    return ab / std::sqrt(aa * bb + 1e-30);
}

// Fraction of rows whose nearest neighbour (cosine, other rows) is `close` to it.
template <typename Close>
double nearest_neighbour_agreement(const std::vector<float>& vectors, int64_t D, int64_t V,
                                   Close close) {
    int64_t agree = 0;
    for (int64_t a = 0; a < V; ++a) {
        int64_t best = -1;
        double best_sim = -2;
        for (int64_t b = 0; b < V; ++b) {
            if (b == a) continue;
            const double s = cosine(&vectors[size_t(a * D)], &vectors[size_t(b * D)], D);
            if (s > best_sim) best_sim = s, best = b;
        }
        agree += close(a, best) ? 1 : 0;
    }
    return double(agree) / double(V);
}

}  // namespace lathe::embedtest
