#include "ops/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "ops/cpu/parallel.h"

namespace lathe::cpu {

namespace {

// The keys query t may see form the range [first_key(t), t] minus other documents' keys.
int64_t first_key(int64_t t, int64_t window) {
    return window > 0 ? std::max<int64_t>(0, t - window + 1) : 0;
}

bool same_doc(const int32_t* docs_b, int64_t t, int64_t j) {
    return docs_b == nullptr || docs_b[j] == docs_b[t];
}

double dot(const float* a, const float* b, int64_t D) {
    double s = 0.0;
    for (int64_t d = 0; d < D; ++d) s += double(a[d]) * double(b[d]);
    return s;
}

}  // namespace

void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                       const int32_t* docs, int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D,
                       int64_t window, float scale) {
    const int64_t group = H / Hkv;  // query heads per key/value head
    LATHE_OMP_PARALLEL_FOR(B * H * T * T * D)
    for (int64_t bh = 0; bh < B * H; ++bh) {
        const int64_t b = bh / H, h = bh % H, g = h / group;
        const int32_t* docs_b = docs ? docs + b * T : nullptr;
        std::vector<double> s(static_cast<size_t>(T)), acc(static_cast<size_t>(D));
        for (int64_t t = 0; t < T; ++t) {
            const float* qt = q + ((b * T + t) * H + h) * D;
            double m = -std::numeric_limits<double>::infinity();
            for (int64_t j = first_key(t, window); j <= t; ++j) {
                if (!same_doc(docs_b, t, j)) continue;
                s[size_t(j)] = double(scale) * dot(qt, k + ((b * T + j) * Hkv + g) * D, D);
                m = std::max(m, s[size_t(j)]);
            }
            double sum = 0.0;
            std::fill(acc.begin(), acc.end(), 0.0);
            for (int64_t j = first_key(t, window); j <= t; ++j) {
                if (!same_doc(docs_b, t, j)) continue;
                const double p = std::exp(s[size_t(j)] - m);
                sum += p;
                const float* vj = v + ((b * T + j) * Hkv + g) * D;
                for (int64_t d = 0; d < D; ++d) acc[size_t(d)] += p * vj[d];
            }
            float* ot = out + ((b * T + t) * H + h) * D;
            for (int64_t d = 0; d < D; ++d) ot[d] = float(acc[size_t(d)] / sum);
            lse[(b * H + h) * T + t] = float(m + std::log(sum));
        }
    }
}

void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q,
                        const float* k, const float* v, const float* out, const float* lse,
                        const int32_t* docs, int64_t B, int64_t T, int64_t H, int64_t Hkv,
                        int64_t D, int64_t window, float scale) {
    const int64_t group = H / Hkv;
    // One (batch, kv head) per iteration: it owns dk and dv of that head and dq of its query
    // heads, so nothing is shared between threads and sums run in a fixed order.
    LATHE_OMP_PARALLEL_FOR(B * H * T * T * D * 3)
    for (int64_t bg = 0; bg < B * Hkv; ++bg) {
        const int64_t b = bg / Hkv, g = bg % Hkv;
        const int32_t* docs_b = docs ? docs + b * T : nullptr;
        std::vector<double> dk_acc(static_cast<size_t>(T * D), 0.0);
        std::vector<double> dv_acc(static_cast<size_t>(T * D), 0.0);
        std::vector<double> dq_acc(static_cast<size_t>(D));
        for (int64_t h = g * group; h < (g + 1) * group; ++h) {
            for (int64_t t = 0; t < T; ++t) {
                const int64_t row = (b * T + t) * H + h;
                const float* qt = q + row * D;
                const float* dout_t = dout + row * D;
                const double di = dot(dout_t, out + row * D, D);
                const double lse_t = lse[(b * H + h) * T + t];
                std::fill(dq_acc.begin(), dq_acc.end(), 0.0);
                for (int64_t j = first_key(t, window); j <= t; ++j) {
                    if (!same_doc(docs_b, t, j)) continue;
                    const float* kj = k + ((b * T + j) * Hkv + g) * D;
                    const float* vj = v + ((b * T + j) * Hkv + g) * D;
                    const double p = std::exp(double(scale) * dot(qt, kj, D) - lse_t);
                    const double ds = p * (dot(dout_t, vj, D) - di);
                    for (int64_t d = 0; d < D; ++d) {
                        dq_acc[size_t(d)] += ds * kj[d];
                        dk_acc[size_t(j * D + d)] += ds * qt[d];
                        dv_acc[size_t(j * D + d)] += p * dout_t[d];
                    }
                }
                for (int64_t d = 0; d < D; ++d)
                    dq[row * D + d] = float(double(scale) * dq_acc[size_t(d)]);
            }
        }
        for (int64_t j = 0; j < T; ++j) {
            for (int64_t d = 0; d < D; ++d) {
                dk[((b * T + j) * Hkv + g) * D + d] =
                    float(double(scale) * dk_acc[size_t(j * D + d)]);
                dv[((b * T + j) * Hkv + g) * D + d] = float(dv_acc[size_t(j * D + d)]);
            }
        }
    }
}

}  // namespace lathe::cpu
