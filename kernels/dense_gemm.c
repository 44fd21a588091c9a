/* out [M, N] = x [M, K] @ w [K, N] in fp32, with every output element reduced over k = 0 .. K-1
 * in that order, one fused multiply-add at a time, from 0 (see dense_gemm.py):
 *
 *     out[m, n] = fma(x[m, K-1], w[K-1, n], ... fma(x[m, 1], w[1, n], fma(x[m, 0], w[0, n], 0)))
 *
 * A row's bits depend only on that row and w: not on M, on where the row falls in a register
 * tile, on the panel width or vector width the CPU gets, or on how columns are shared among
 * threads. That is the engine's batch invariance without fixed row tiles, and one weight read
 * per product (the row tiles of a library call read the weights once per tile).
 *
 * w is packed once (dsi_gemm_pack) into panels of NR columns, [ceil(N / NR)][K][NR], zero past N.
 * A register tile is MR rows by NR columns held in MR * NV vectors; each k adds one broadcast
 * x value times one packed row of the panel. Threads take contiguous runs of panels through the
 * process's thread pool (thread_pool.c), so the Python caller holds no lock while it runs.
 */
#include "simd16.h"
#include "thread_pool.h"

#if defined(__AVX512F__)
#define NV 3 /* 16-lane vectors per panel row: 48 columns, 24 accumulators of 32 registers */
#define MR 8
#else
#define NV 1 /* 16 columns (two 8-lane registers each), 12 accumulators of 16 registers */
#define MR 6
#endif
#define NR (NV * LANES)
#define MB 96 /* rows per block: a block of x stays in L2 while the thread's panels pass */

int64_t dsi_gemm_panel_width(void) { return NR; }

/* Packs w (element (k, n) at w[k * sk + n * sn]) into out [ceil(N / NR)][K][NR], zero past N. */
void dsi_gemm_pack(const float *w, int64_t k, int64_t n, int64_t sk, int64_t sn, float *out) {
    int64_t panels = (n + NR - 1) / NR;
    for (int64_t p = 0; p < panels; p++) {
        float *dst = out + p * k * NR;
        for (int64_t kk = 0; kk < k; kk++) {
            for (int64_t j = 0; j < NR; j++) {
                int64_t col = p * NR + j;
                dst[kk * NR + j] = col < n ? w[kk * sk + col * sn] : 0.0f;
            }
        }
    }
}

/* rows (a constant in each caller) x NR outputs of one panel; cols <= NR of them are stored. */
static inline __attribute__((always_inline)) void tile(const int rows, const float *x, int64_t xs,
                                                       const float *panel, const float *ahead, int64_t k,
                                                       float *o, int64_t os, int64_t cols) {
    v16 acc[MR][NV];
    _Pragma("GCC unroll 8") for (int r = 0; r < rows; r++)
        _Pragma("GCC unroll 4") for (int j = 0; j < NV; j++) acc[r][j] = splat(0.0f);
    for (int64_t kk = 0; kk < k; kk++) {
        const float *wrow = panel + kk * NR;
        _Pragma("GCC unroll 4") for (int j = 0; j < NV; j++) __builtin_prefetch(ahead + kk * NR + j * LANES, 0, 2);
        v16 wv[NV];
        _Pragma("GCC unroll 4") for (int j = 0; j < NV; j++) wv[j] = load16(wrow + j * LANES);
        _Pragma("GCC unroll 8") for (int r = 0; r < rows; r++) {
            v16 xb = splat(x[r * xs + kk]);
            _Pragma("GCC unroll 4") for (int j = 0; j < NV; j++) acc[r][j] += xb * wv[j];
        }
    }
    if (cols == NR) {
        _Pragma("GCC unroll 8") for (int r = 0; r < rows; r++)
            _Pragma("GCC unroll 4") for (int j = 0; j < NV; j++) store16(o + r * os + j * LANES, acc[r][j]);
        return;
    }
    for (int r = 0; r < rows; r++) {
        float row[NR];
        for (int j = 0; j < NV; j++) store16(row + j * LANES, acc[r][j]);
        memcpy(o + r * os, row, (size_t)cols * sizeof(float));
    }
}

static void tile_rows(int rows, const float *x, int64_t xs, const float *panel, const float *ahead, int64_t k,
                      float *o, int64_t os, int64_t cols) {
    switch (rows) {
#define CASE(R) \
    case R: tile(R, x, xs, panel, ahead, k, o, os, cols); break;
        CASE(1) CASE(2) CASE(3) CASE(4) CASE(5) CASE(6)
#if MR > 6
        CASE(7) CASE(8)
#endif
#undef CASE
    }
}

typedef struct {
    const float *x, *packed;
    float *out;
    int64_t xs, m, k, n, os, panels;
} Product;

/* Panels [p0, p1) of every row. */
static void panels(const Product *g, int64_t p0, int64_t p1) {
    for (int64_t r0 = 0; r0 < g->m; r0 += MB) {
        int64_t r1 = r0 + MB < g->m ? r0 + MB : g->m;
        for (int64_t p = p0; p < p1; p++) {
            const float *panel = g->packed + p * g->k * NR;
            /* The next panel is fetched toward L2 while this one computes: a decode's weights
             * come from memory once per step, and the hardware's prefetchers do not run ahead of
             * a panel that the row tiles read again and again. */
            const float *ahead = p + 1 < p1 ? panel + g->k * NR : panel;
            int64_t cols = g->n - p * NR < NR ? g->n - p * NR : NR;
            for (int64_t r = r0; r < r1; r += MR) {
                int rows = (int)(r1 - r < MR ? r1 - r : MR);
                tile_rows(rows, g->x + r * g->xs, g->xs, panel, ahead, g->k, g->out + r * g->os + p * NR, g->os, cols);
            }
        }
    }
}

static void run_part(void *ctx, int part, int parts) {
    const Product *g = ctx;
    panels(g, g->panels * part / parts, g->panels * (part + 1) / parts);
}

/* out [m, n] (rows os apart) = x [m, k] (rows xs apart) @ the packed weight of n columns; the
 * panels shared among up to `threads` threads through `run` (thread_pool.c's dsi_pool_run; NULL:
 * this thread alone). */
void dsi_gemm(const float *x, int64_t xs, int64_t m, int64_t k, const float *packed, int64_t n, float *out,
              int64_t os, pool_run_fn run, int threads) {
    Product g = {x, packed, out, xs, m, k, n, os, (n + NR - 1) / NR};
    if (m <= 0 || n <= 0) return;
    int parts = threads < g.panels ? threads : (int)g.panels;
    if (run == 0 || parts < 2) {
        panels(&g, 0, g.panels);
        return;
    }
    run(run_part, &g, parts);
}
