#include "ops/cpu/rope.h"

#include "core/check.h"
#include "ops/cpu/parallel.h"

namespace lathe::cpu {

namespace {
// Rotates each of the first Hx head vectors of row (b, t) (rows of Hs heads) by +angle (sign = 1)
// or -angle (sign = -1).
void rope_rotate(float* out, const float* x, const int32_t* positions, const float* cos,
                 const float* sin, int64_t B, int64_t T, int64_t Hx, int64_t Hs, int64_t D,
                 int64_t R, int64_t P, float sign) {
    const int64_t half = R / 2;
    for (int64_t n = 0; n < B * T; ++n) {
        const int64_t pos = positions ? positions[n] : n % T;
        LATHE_CHECK(pos >= 0 && pos < P, "rope position {} at row {} outside the table [0, {})",
                    pos, n, P);
    }
    LATHE_OMP_PARALLEL_FOR(B * T * Hx * R)
    for (int64_t n = 0; n < B * T; ++n) {
        const int64_t pos = positions ? positions[n] : n % T;
        const float* c = cos + pos * half;
        const float* s = sin + pos * half;
        for (int64_t h = 0; h < Hx; ++h) {
            const float* xh = x + (n * Hs + h) * D;
            float* oh = out + (n * Hs + h) * D;
            for (int64_t i = 0; i < half; ++i) {
                const float x1 = xh[i], x2 = xh[i + half];  // read both before writing (in place)
                const float si = sign * s[i];
                oh[i] = x1 * c[i] - x2 * si;
                oh[i + half] = x2 * c[i] + x1 * si;
            }
            if (oh != xh)
                for (int64_t j = R; j < D; ++j) oh[j] = xh[j];
        }
    }
}
}  // namespace

void rope_forward(float* out, const float* x, const int32_t* positions, const float* cos,
                  const float* sin, int64_t B, int64_t T, int64_t Hx, int64_t D, int64_t R,
                  int64_t P, int64_t stored_heads) {
    rope_rotate(out, x, positions, cos, sin, B, T, Hx, stored_heads > 0 ? stored_heads : Hx, D, R,
                P, 1.0f);
}

// The rotation is orthogonal, so its transpose (what the backward applies) is the rotation by
// the opposite angle:
//   dx[i] = dout[i] c + dout[i + R/2] s,   dx[i + R/2] = dout[i + R/2] c - dout[i] s
void rope_backward(float* dx, const float* dout, const int32_t* positions, const float* cos,
                   const float* sin, int64_t B, int64_t T, int64_t Hx, int64_t D, int64_t R,
                   int64_t P, int64_t stored_heads) {
    rope_rotate(dx, dout, positions, cos, sin, B, T, Hx, stored_heads > 0 ? stored_heads : Hx, D, R,
                P, -1.0f);
}

}  // namespace lathe::cpu
