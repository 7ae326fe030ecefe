#include "ops/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "ops/cpu/gemm.h"
#include "ops/cpu/parallel.h"

// Attention in matrix form, one (batch, head) at a time, as the textbook writes it:
//   S = scale Q K^T (T, T);  P = softmax(S) over visible keys (0 elsewhere);  O = P V
// backward:
//   dV = P^T dO;  dP = dO V^T;  dS = P * (dP - rowsum(dO * O))
//   dQ = scale dS K;  dK = scale dS^T Q
// The matrix products go through sgemm on strided views of the (B, T, H, D) tensors; OpenMP
// threads take whole heads (forward) or whole key/value heads with their query group (backward),
// so each thread owns its outputs and every sum runs in one fixed order.
// S is computed in full, masked entries included (then zeroed): twice the multiply-adds of a
// causal kernel, far faster than scalar loops, and plain to read.

namespace lathe::cpu {

namespace {

// Whether query t may see key j (the rules of ops/attention.h).
bool visible(int64_t t, int64_t j, int64_t window, const int32_t* docs_b) {
    return j <= t && (window == 0 || j > t - window) &&
           (docs_b == nullptr || docs_b[j] == docs_b[t]);
}

// Rows of P from S in place: P[t, j] = exp(S[t, j] - lse[t]) for visible j, else 0. With
// `lse_out`, lse is computed here (fp64 sums) and stored; otherwise `lse_in` is used.
void softmax_rows(float* S, int64_t T, int64_t window, const int32_t* docs_b, float* lse_out,
                  const float* lse_in) {
    for (int64_t t = 0; t < T; ++t) {
        float* row = S + t * T;
        double lse;
        if (lse_out) {
            float m = -std::numeric_limits<float>::infinity();
            for (int64_t j = 0; j <= t; ++j)
                if (visible(t, j, window, docs_b)) m = std::max(m, row[j]);
            double sum = 0.0;  // every row sees itself, so sum >= 1
            for (int64_t j = 0; j <= t; ++j)
                if (visible(t, j, window, docs_b)) sum += std::exp(double(row[j]) - m);
            lse = double(m) + std::log(sum);
            lse_out[t] = float(lse);
        } else {
            lse = lse_in[t];
        }
        for (int64_t j = 0; j < T; ++j)
            row[j] = visible(t, j, window, docs_b) ? float(std::exp(double(row[j]) - lse)) : 0.0f;
    }
}

}  // namespace

void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                       const int32_t* docs, int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D,
                       int64_t window, float scale) {
    const int64_t group = H / Hkv;             // query heads per key/value head
    const int64_t ldq = H * D, ldk = Hkv * D;  // row strides of (B, T, H, D) and (B, T, Hkv, D)
    LATHE_OMP_PARALLEL_FOR(B * H * T * T * D)
    for (int64_t bh = 0; bh < B * H; ++bh) {
        const int64_t b = bh / H, h = bh % H, g = h / group;
        const int32_t* docs_b = docs ? docs + b * T : nullptr;
        std::vector<float> S(static_cast<size_t>(T * T));
        const float* qh = q + b * T * ldq + h * D;
        const float* kg = k + b * T * ldk + g * D;
        const float* vg = v + b * T * ldk + g * D;
        sgemm_strided(false, true, T, T, D, scale, qh, ldq, kg, ldk, 0.0f, S.data(), T);
        softmax_rows(S.data(), T, window, docs_b, lse + (b * H + h) * T, nullptr);
        sgemm_strided(false, false, T, D, T, 1.0f, S.data(), T, vg, ldk, 0.0f,
                      out + b * T * ldq + h * D, ldq);
    }
}

void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q,
                        const float* k, const float* v, const float* out, const float* lse,
                        const int32_t* docs, int64_t B, int64_t T, int64_t H, int64_t Hkv,
                        int64_t D, int64_t window, float scale) {
    const int64_t group = H / Hkv;
    const int64_t ldq = H * D, ldk = Hkv * D;
    LATHE_OMP_PARALLEL_FOR(B * H * T * T * D * 3)
    for (int64_t bg = 0; bg < B * Hkv; ++bg) {
        const int64_t b = bg / Hkv, g = bg % Hkv;
        const int32_t* docs_b = docs ? docs + b * T : nullptr;
        std::vector<float> P(static_cast<size_t>(T * T)), dS(static_cast<size_t>(T * T));
        const int64_t ko = b * T * ldk + g * D;
        for (int64_t h = g * group; h < (g + 1) * group; ++h) {
            // The group's first query head overwrites dk, dv; the others add, in head order.
            const float beta = h == g * group ? 0.0f : 1.0f;
            const int64_t qo = b * T * ldq + h * D;
            sgemm_strided(false, true, T, T, D, scale, q + qo, ldq, k + ko, ldk, 0.0f, P.data(), T);
            softmax_rows(P.data(), T, window, docs_b, nullptr, lse + (b * H + h) * T);
            // dV += P^T dO
            sgemm_strided(true, false, T, D, T, 1.0f, P.data(), T, dout + qo, ldq, beta, dv + ko,
                          ldk);
            // dP = dO V^T, then dS = P * (dP - Di) with Di = dot(dO[t], O[t]).
            sgemm_strided(false, true, T, T, D, 1.0f, dout + qo, ldq, v + ko, ldk, 0.0f, dS.data(),
                          T);
            for (int64_t t = 0; t < T; ++t) {
                double di = 0.0;
                for (int64_t d = 0; d < D; ++d)
                    di += double(dout[qo + t * ldq + d]) * out[qo + t * ldq + d];
                for (int64_t j = 0; j < T; ++j)
                    dS[t * T + j] = P[t * T + j] * (dS[t * T + j] - float(di));
            }
            // dQ = scale dS K;  dK += scale dS^T Q
            sgemm_strided(false, false, T, D, T, scale, dS.data(), T, k + ko, ldk, 0.0f, dq + qo,
                          ldq);
            sgemm_strided(true, false, T, D, T, scale, dS.data(), T, q + qo, ldq, beta, dk + ko,
                          ldk);
        }
    }
}

}  // namespace lathe::cpu
