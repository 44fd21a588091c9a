/* Row-wise ops of a dense step (see row_ops.py): RMSNorm, SiLU(gate) * up, and the rotary
 * embedding in place. Each row is computed from its own values only, in one fixed order: a row
 * gets the same bits whatever the other rows are (the engine's batch invariance).
 *
 * Sums run in LANES independent partial sums, added in one fixed order at the end (simd16.h).
 * Each op takes the thread pool's run function (thread_pool.h; NULL: this thread alone) and a
 * thread count: contiguous runs of rows go to the threads, which cannot change a row's bits.
 */
#include "simd16.h"
#include "thread_pool.h"

/* Rows of one call: the op's arguments, and the row function the threads share. */
typedef struct Rows Rows;
struct Rows {
    void (*rows)(const Rows *a, int64_t r0, int64_t r1);
    const float *x, *w, *cos, *sin;
    float *out, *inout;
    int64_t stride, n, heads, d;
    float eps;
};

static void rows_part(void *ctx, int part, int parts) {
    const Rows *a = ctx;
    a->rows(a, a->n * part / parts, a->n * (part + 1) / parts);
}

#define MIN_ROWS_PER_THREAD 8 /* fewer rows than this a thread costs more to wake than it saves */

static void share(const Rows *a, pool_run_fn run, int threads) {
    int64_t most = a->n / MIN_ROWS_PER_THREAD;
    int parts = threads < most ? threads : (int)most;
    if (run == 0 || parts < 2) {
        a->rows(a, 0, a->n);
        return;
    }
    run(rows_part, (void *)a, parts);
}

static void rms_rows(const Rows *a, int64_t r0, int64_t r1) {
    const int64_t h = a->d;
    for (int64_t r = r0; r < r1; r++) {
        const float *xr = a->x + r * a->stride;
        v16 acc = splat(0.0f);
        for (int64_t i = 0; i < h; i += LANES) {
            v16 v = load16(xr + i);
            acc += v * v;
        }
        float scale = 1.0f / sqrtf(hsum(acc) / (float)h + a->eps);
        float *o = a->out + r * h;
        for (int64_t i = 0; i < h; i += LANES) store16(o + i, load16(xr + i) * scale * load16(a->w + i));
    }
}

/* out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w; x rows x_stride apart, out contiguous [rows, h].
 * h must be a multiple of LANES. */
void dsi_rms_norm(const float *x, int64_t x_stride, int64_t rows, int64_t h, const float *w, float eps,
                  float *out, pool_run_fn run, int threads) {
    Rows a = {.rows = rms_rows, .x = x, .w = w, .out = out, .stride = x_stride, .n = rows, .d = h, .eps = eps};
    share(&a, run, threads);
}

static void silu_rows(const Rows *a, int64_t r0, int64_t r1) {
    const int64_t f = a->d;
    for (int64_t r = r0; r < r1; r++) {
        const float *g = a->x + r * a->stride, *u = g + f;
        float *o = a->out + r * f;
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

/* out[r, i] = silu(gu[r, i]) * gu[r, f + i] for i < f; gu rows stride apart, out [rows, f].
 * f must be a multiple of LANES. silu(g) = g * sigmoid(g), sigmoid from e^(-|g|). */
void dsi_silu_mul(const float *gu, int64_t stride, int64_t rows, int64_t f, float *out, pool_run_fn run,
                  int threads) {
    Rows a = {.rows = silu_rows, .x = gu, .out = out, .stride = stride, .n = rows, .d = f};
    share(&a, run, threads);
}

static void rope_rows(const Rows *a, int64_t r0, int64_t r1) {
    const int64_t d = a->d, half = d / 2;
    for (int64_t r = r0; r < r1; r++) {
        const float *c = a->cos + r * half, *s = a->sin + r * half;
        for (int64_t hd = 0; hd < a->heads; hd++) {
            float *x1 = a->inout + r * a->stride + hd * d, *x2 = x1 + half;
            for (int64_t i = 0; i < half; i += LANES) {
                v16 p = load16(x1 + i), q = load16(x2 + i), cv = load16(c + i), sv = load16(s + i);
                store16(x1 + i, p * cv - q * sv);
                store16(x2 + i, q * cv + p * sv);
            }
        }
    }
}

/* x [rows, heads, d] (rows x_stride apart, heads d apart) rotated in place by the angles of each
 * row: cos, sin [rows, d / 2]. (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin) over the halves.
 * d / 2 must be a multiple of LANES. */
void dsi_rope(float *x, int64_t x_stride, int64_t rows, int64_t heads, int64_t d, const float *cos,
              const float *sin, pool_run_fn run, int threads) {
    Rows a = {.rows = rope_rows, .inout = x, .cos = cos, .sin = sin, .stride = x_stride, .n = rows,
              .heads = heads, .d = d};
    share(&a, run, threads);
}
