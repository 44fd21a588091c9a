/* Row-wise ops of a dense step (see row_ops.py): RMSNorm, SiLU(gate) * up, and the rotary
 * embedding in place. Each row is computed from its own values only, in one fixed order: a row
 * gets the same bits whatever the other rows are (the engine's batch invariance).
 *
 * Sums run in LANES independent partial sums, added in one fixed order at the end (simd16.h).
 */
#include "simd16.h"

/* out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w; x rows x_stride apart, out contiguous [rows, h].
 * h must be a multiple of LANES. */
void dsi_rms_norm(const float *x, int64_t x_stride, int64_t rows, int64_t h, const float *w, float eps,
                  float *out) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * x_stride;
        v16 acc = splat(0.0f);
        for (int64_t i = 0; i < h; i += LANES) {
            v16 v = load16(xr + i);
            acc += v * v;
        }
        float scale = 1.0f / sqrtf(hsum(acc) / (float)h + eps);
        float *o = out + r * h;
        for (int64_t i = 0; i < h; i += LANES) store16(o + i, load16(xr + i) * scale * load16(w + i));
    }
}

/* out[r, i] = silu(gu[r, i]) * gu[r, f + i] for i < f; gu rows stride apart, out [rows, f].
 * f must be a multiple of LANES. silu(g) = g * sigmoid(g), sigmoid from e^(-|g|). */
void dsi_silu_mul(const float *gu, int64_t stride, int64_t rows, int64_t f, float *out) {
    for (int64_t r = 0; r < rows; r++) {
        const float *g = gu + r * stride, *u = g + f;
        float *o = out + r * f;
        for (int64_t i = 0; i < f; i += LANES) {
            v16 gv = load16(g + i);
            vi16 neg = gv < 0.0f;
            v16 mabs = (v16)(((vi16)gv & ~neg) | ((vi16)(-gv) & neg)); /* |g| */
            v16 e = exp16(-mabs);
            v16 inv = 1.0f / (1.0f + e);
            v16 sig = (v16)(((vi16)inv & ~neg) | ((vi16)(e * inv) & neg));
            store16(o + i, gv * sig * load16(u + i));
        }
    }
}

/* x [rows, heads, d] (rows x_stride apart, heads d apart) rotated in place by the angles of each
 * row: cos, sin [rows, d / 2]. (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin) over the halves.
 * d / 2 must be a multiple of LANES. */
void dsi_rope(float *x, int64_t x_stride, int64_t rows, int64_t heads, int64_t d, const float *cos,
              const float *sin) {
    int64_t half = d / 2;
    for (int64_t r = 0; r < rows; r++) {
        const float *c = cos + r * half, *s = sin + r * half;
        for (int64_t hd = 0; hd < heads; hd++) {
            float *x1 = x + r * x_stride + hd * d, *x2 = x1 + half;
            for (int64_t i = 0; i < half; i += LANES) {
                v16 a = load16(x1 + i), b = load16(x2 + i), cv = load16(c + i), sv = load16(s + i);
                store16(x1 + i, a * cv - b * sv);
                store16(x2 + i, b * cv + a * sv);
            }
        }
    }
}
