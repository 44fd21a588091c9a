/* 16-lane fp32 vectors for the kernels of this folder: loads, stores, a horizontal sum and max
 * in one fixed order, e^x for x <= 0, and an online softmax's step. Included by each kernel's
 * .c file. */
#ifndef DSI_SIMD16_H
#define DSI_SIMD16_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#define LANES 16

typedef float v16 __attribute__((vector_size(64), aligned(4)));
typedef int32_t vi16 __attribute__((vector_size(64), aligned(4)));
/* v16 for loads and stores through a float pointer: one unaligned vector move each. A memcpy
 * of 64 bytes is lowered, with some CPUs' tuning (256-bit preferred), to two 32-byte moves
 * through the stack that a 64-byte load then cannot forward: several times slower. */
typedef float v16m __attribute__((vector_size(64), aligned(4), may_alias));

/* x in every lane: one broadcast (``(v16){0} + x`` costs an add per call, as -0.0 + 0 is +0). */
static inline v16 splat(float x) {
    v16 v = {x};
    return __builtin_shufflevector(v, v, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
}

static inline v16 load16(const float *p) { return *(const v16m *)p; }

/* The 16 lanes of x added in one fixed order: halves, then quarters, ... */
static inline float hsum(v16 x) {
    x += __builtin_shufflevector(x, x, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7);
    x += __builtin_shufflevector(x, x, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3);
    x += __builtin_shufflevector(x, x, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1);
    x += __builtin_shufflevector(x, x, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0);
    return x[0];
}

static inline v16 vmax(v16 a, v16 b) {
    vi16 gt = a > b;
    return (v16)(((vi16)a & gt) | ((vi16)b & ~gt));
}

static inline float hmax(v16 x) {
    x = vmax(x, __builtin_shufflevector(x, x, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7));
    x = vmax(x, __builtin_shufflevector(x, x, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3));
    x = vmax(x, __builtin_shufflevector(x, x, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1));
    x = vmax(x, __builtin_shufflevector(x, x, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0));
    return x[0];
}

/* e^x lane by lane for x <= 0 (x < -87.3 gives 0, -inf included): Cephes' expf polynomial after
 * a round-to-nearest range reduction x = n ln2 + r, |r| <= ln2 / 2; a few ulp. */
static inline v16 exp16(v16 x) {
    const v16 lo = splat(-87.3f), magic = splat(12582912.0f); /* 1.5 * 2^23: rounds to an integer */
    vi16 under = x < lo;
    x = (v16)(((vi16)x & ~under) | ((vi16)lo & under));
    v16 n = (x * 1.44269504088896341f + magic) - magic;
    v16 r = x - n * 0.693359375f + n * 2.12194440e-4f;
    v16 y = ((((1.9875691500e-4f * r + 1.3981999507e-3f) * r + 8.3334519073e-3f) * r +
              4.1665795894e-2f) * r + 1.6666665459e-1f) * r + 5.0000001201e-1f;
    y = y * (r * r) + r + 1.0f;
    vi16 e = (__builtin_convertvector(n, vi16) + 127) << 23;
    v16 out = y * (v16)e;
    return (v16)((vi16)out & ~under);
}

static inline void store16(float *p, v16 x) { *(v16m *)p = x; }

/* One head's online softmax takes a block of scores s[0 .. n): s is padded with -inf to whole
 * LANES and becomes the weights e^(s - m_new) in place; the running max m and sum l are updated
 * (l = l * alpha + sum of the weights); returns alpha = e^(m_old - m_new), by which the caller
 * scales the head's weighted values before adding the block's. */
static inline float softmax_fold(float *s, int64_t n, float *m, float *l) {
    int64_t n16 = (n + LANES - 1) / LANES * LANES;
    for (int64_t t = n; t < n16; t++) s[t] = -INFINITY;
    v16 mv = splat(*m);
    for (int64_t t = 0; t < n16; t += LANES) mv = vmax(mv, load16(s + t));
    float mb = hmax(mv);
    float alpha = exp16(splat(*m - mb))[0];
    v16 sum = splat(0.0f);
    for (int64_t t = 0; t < n16; t += LANES) {
        v16 e = exp16(load16(s + t) - mb);
        store16(s + t, e);
        sum += e;
    }
    *l = *l * alpha + hsum(sum);
    *m = mb;
    return alpha;
}

#endif
