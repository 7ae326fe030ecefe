#include "ops/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/check.h"
#include "ops/cpu/gemm.h"
#include "ops/cpu/parallel.h"

// Attention in matrix form, one (batch, head) at a time, as the textbook writes it:
//   S = scale Q K^T (Tq, Tk);  P = softmax(S) over visible keys (0 elsewhere);  O = P V
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

// Whether the query at position p may see key j (the rules of ops/attention.h).
bool visible(int64_t p, int64_t j, int64_t window, const int32_t* docs_b) {
    return j <= p && (window == 0 || j > p - window) &&
           (docs_b == nullptr || docs_b[j] == docs_b[p]);
}

// Rows of P from S (Tq, Tk) in place, row i being the query at position q_offset + i:
// P[i, j] = exp(S[i, j] - lse[i]) for visible j, else 0. With `lse_out`, lse is computed here
// (fp64 sums) and stored; otherwise `lse_in` is used.
void softmax_rows(float* S, int64_t Tq, int64_t Tk, int64_t q_offset, int64_t window,
                  const int32_t* docs_b, float* lse_out, const float* lse_in) {
    for (int64_t i = 0; i < Tq; ++i) {
        const int64_t p = q_offset + i;
        float* row = S + i * Tk;
        double lse;
        if (lse_out) {
            float m = -std::numeric_limits<float>::infinity();
            for (int64_t j = 0; j <= p; ++j)
                if (visible(p, j, window, docs_b)) m = std::max(m, row[j]);
            double sum = 0.0;  // every row sees itself, so sum >= 1
            for (int64_t j = 0; j <= p; ++j)
                if (visible(p, j, window, docs_b)) sum += std::exp(double(row[j]) - m);
            lse = double(m) + std::log(sum);
            lse_out[i] = float(lse);
        } else {
            lse = lse_in[i];
        }
        for (int64_t j = 0; j < Tk; ++j)
            row[j] = visible(p, j, window, docs_b) ? float(std::exp(double(row[j]) - lse)) : 0.0f;
    }
}

// One (batch row, query head): queries qh (Tq rows, stride ldq) at positions q_offset + i against
// keys kg, vg (Tk rows, stride ldk); out rows (stride ldo) and lse (Tq). S is scratch (Tq * Tk).
void forward_head(float* out, float* lse, const float* qh, const float* kg, const float* vg,
                  const int32_t* docs_b, int64_t Tq, int64_t Tk, int64_t q_offset, int64_t ldq,
                  int64_t ldk, int64_t ldo, int64_t D, int64_t window, float scale,
                  std::vector<float>& S) {
    S.resize(static_cast<size_t>(Tq * Tk));
    sgemm_strided(false, true, Tq, Tk, D, scale, qh, ldq, kg, ldk, 0.0f, S.data(), Tk);
    softmax_rows(S.data(), Tq, Tk, q_offset, window, docs_b, lse, nullptr);
    sgemm_strided(false, false, Tq, D, Tk, 1.0f, S.data(), Tk, vg, ldk, 0.0f, out, ldo);
}

// Row strides (elements from one position to the next) of q and of k, v: their own tensors'
// (B, T, H, D) and (B, T, Hkv, D), or the packed buffer's (qkv_heads per row; header).
struct QkvStrides {
    int64_t q, kv;
};
QkvStrides qkv_strides(int64_t H, int64_t Hkv, int64_t D, int64_t qkv_heads) {
    LATHE_CHECK(
        qkv_heads == 0 || qkv_heads == H + 2 * Hkv,
        "cpu attention: qkv_heads {} with H = {}, Hkv = {}; a packed buffer holds H + 2 Hkv",
        qkv_heads, H, Hkv);
    return qkv_heads > 0 ? QkvStrides{qkv_heads * D, qkv_heads * D} : QkvStrides{H * D, Hkv * D};
}

}  // namespace

void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                       const int32_t* docs, int64_t B, int64_t Tq, int64_t Tk, int64_t q_offset,
                       int64_t H, int64_t Hkv, int64_t D, int64_t window, float scale,
                       int64_t qkv_heads) {
    const int64_t group = H / Hkv;  // query heads per key/value head
    const QkvStrides ld = qkv_strides(H, Hkv, D, qkv_heads);
    const int64_t ldo = H * D;
    // Keys past the last query's position are never visible: leave them out of the products.
    const int64_t Tv = std::min(Tk, q_offset + Tq);
    LATHE_OMP_PARALLEL_FOR(B * H * Tq * Tv * D)
    for (int64_t bh = 0; bh < B * H; ++bh) {
        const int64_t b = bh / H, h = bh % H, g = h / group;
        std::vector<float> S;
        forward_head(out + b * Tq * ldo + h * D, lse + (b * H + h) * Tq, q + b * Tq * ld.q + h * D,
                     k + b * Tk * ld.kv + g * D, v + b * Tk * ld.kv + g * D,
                     docs ? docs + b * Tk : nullptr, Tq, Tv, q_offset, ld.q, ld.kv, ldo, D, window,
                     scale, S);
    }
}

void attention_decode(float* out, float* lse, const float* q, const float* k_cache,
                      const float* v_cache, const int32_t* lengths, int64_t B, int64_t Tmax,
                      int64_t H, int64_t Hkv, int64_t D, int64_t window, float scale) {
    for (int64_t b = 0; b < B; ++b)
        LATHE_CHECK(lengths[b] >= 1 && lengths[b] <= Tmax,
                    "attention_decode: lengths[{}] = {}; each length is in [1, Tmax = {}] (the new "
                    "token's key is in the cache)",
                    b, lengths[b], Tmax);
    const int64_t group = H / Hkv;
    const int64_t ldq = H * D, ldk = Hkv * D;
    LATHE_OMP_PARALLEL_FOR(B * H * Tmax * D)
    for (int64_t bh = 0; bh < B * H; ++bh) {
        const int64_t b = bh / H, h = bh % H, g = h / group, len = lengths[b];
        std::vector<float> S;
        forward_head(out + b * ldq + h * D, lse + b * H + h, q + b * ldq + h * D,
                     k_cache + b * Tmax * ldk + g * D, v_cache + b * Tmax * ldk + g * D, nullptr, 1,
                     len, len - 1, ldq, ldk, ldq, D, window, scale, S);
    }
}

void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q,
                        const float* k, const float* v, const float* out, const float* lse,
                        const int32_t* docs, int64_t B, int64_t T, int64_t H, int64_t Hkv,
                        int64_t D, int64_t window, float scale, int64_t qkv_heads) {
    const int64_t group = H / Hkv;
    const QkvStrides ld = qkv_strides(H, Hkv, D, qkv_heads);
    const int64_t ldq = ld.q, ldk = ld.kv, ldo = H * D;
    LATHE_OMP_PARALLEL_FOR(B * H * T * T * D * 3)
    for (int64_t bg = 0; bg < B * Hkv; ++bg) {
        const int64_t b = bg / Hkv, g = bg % Hkv;
        const int32_t* docs_b = docs ? docs + b * T : nullptr;
        std::vector<float> P(static_cast<size_t>(T * T)), dS(static_cast<size_t>(T * T));
        const int64_t ko = b * T * ldk + g * D;
        for (int64_t h = g * group; h < (g + 1) * group; ++h) {
            // The group's first query head overwrites dk, dv; the others add, in head order.
            const float beta = h == g * group ? 0.0f : 1.0f;
            const int64_t qo = b * T * ldq + h * D, oo = b * T * ldo + h * D;
            sgemm_strided(false, true, T, T, D, scale, q + qo, ldq, k + ko, ldk, 0.0f, P.data(), T);
            softmax_rows(P.data(), T, T, 0, window, docs_b, nullptr, lse + (b * H + h) * T);
            // dV += P^T dO
            sgemm_strided(true, false, T, D, T, 1.0f, P.data(), T, dout + oo, ldo, beta, dv + ko,
                          ldk);
            // dP = dO V^T, then dS = P * (dP - Di) with Di = dot(dO[t], O[t]).
            sgemm_strided(false, true, T, T, D, 1.0f, dout + oo, ldo, v + ko, ldk, 0.0f, dS.data(),
                          T);
            for (int64_t t = 0; t < T; ++t) {
                double di = 0.0;
                for (int64_t d = 0; d < D; ++d)
                    di += double(dout[oo + t * ldo + d]) * out[oo + t * ldo + d];
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
