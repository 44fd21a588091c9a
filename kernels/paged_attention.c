/* Causal attention of query rows over K/V pages, each query on its own (see paged_attention.py).
 *
 * Every query row r attends to positions 0 .. pos[r] of its sequence, whose position p lives in
 * page tables[seq[r] * table_width + p / block] at offset p % block. A query's arithmetic reads
 * only its own vector, its pages and pos[r]: the same loops in the same order whatever the other
 * rows are, so its result has the same bits in a batch of any size and in a chunk of any length.
 *
 * Per query head, keys are folded page by page with an online softmax (scores, page max, weights
 * e^(s - m), running sum and weighted values rescaled by e^(m_old - m_new)); dot products and sums
 * run in LANES independent partial sums, added in one fixed order at the end.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#define LANES 16
#define MAX_BLOCK 1024

typedef float v16 __attribute__((vector_size(64), aligned(4)));
typedef int32_t vi16 __attribute__((vector_size(64), aligned(4)));

static inline v16 splat(float x) { return (v16){0} + x; }

static inline v16 load16(const float *p) {
    v16 x;
    memcpy(&x, p, sizeof x);
    return x;
}

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

/* One query row's kv head h: its G query heads of ND * 16 dims over keys 0 .. last.
 * q: [G, D]; kp: the key of position 0 in the row's first page (head h), V at kp + v_off. */
static inline __attribute__((always_inline)) void attend_head(
    const int G, const int ND, const float *q, float *out, const float *kv, int64_t head_off,
    int64_t v_off, int64_t page_stride, int64_t tok_stride, int64_t block, const int64_t *table,
    int64_t last, float scale, float *s) {
    const int D = ND * LANES;
    v16 qv[G][ND], o[G][ND];
    float m[G], l[G];
    for (int g = 0; g < G; g++) {
        m[g] = -INFINITY;
        l[g] = 0.0f;
        for (int i = 0; i < ND; i++) {
            qv[g][i] = load16(q + g * D + i * LANES);
            o[g][i] = splat(0.0f);
        }
    }
    for (int64_t j = 0; j * block <= last; j++) {
        int64_t n = last - j * block + 1;
        if (n > block) n = block;
        int64_t n16 = (n + LANES - 1) / LANES * LANES;
        const float *kp = kv + table[j] * page_stride + head_off;
        const float *vp = kp + v_off;
        for (int64_t t = 0; t < n; t++) { /* scores; each key read once for the group */
            const float *kt = kp + t * tok_stride;
            v16 acc[G];
            for (int g = 0; g < G; g++) acc[g] = splat(0.0f);
            for (int i = 0; i < ND; i++) {
                v16 k16 = load16(kt + i * LANES);
                for (int g = 0; g < G; g++) acc[g] += qv[g][i] * k16;
            }
            for (int g = 0; g < G; g++) s[g * MAX_BLOCK + t] = hsum(acc[g]) * scale;
        }
        for (int g = 0; g < G; g++) { /* fold the block into the online softmax */
            float *sg = s + g * MAX_BLOCK;
            for (int64_t t = n; t < n16; t++) sg[t] = -INFINITY;
            v16 mv = splat(m[g]);
            for (int64_t t = 0; t < n16; t += LANES) mv = vmax(mv, load16(sg + t));
            float mb = hmax(mv);
            float alpha = exp16(splat(m[g] - mb))[0];
            v16 sum = splat(0.0f);
            for (int64_t t = 0; t < n16; t += LANES) {
                v16 e = exp16(load16(sg + t) - mb);
                memcpy(sg + t, &e, sizeof e);
                sum += e;
            }
            l[g] = l[g] * alpha + hsum(sum);
            m[g] = mb;
            for (int i = 0; i < ND; i++) o[g][i] *= alpha;
        }
        for (int64_t t = 0; t < n; t++) { /* weighted values; each value read once for the group */
            const float *vt = vp + t * tok_stride;
            for (int i = 0; i < ND; i++) {
                v16 v = load16(vt + i * LANES);
                for (int g = 0; g < G; g++) o[g][i] += s[g * MAX_BLOCK + t] * v;
            }
        }
    }
    for (int g = 0; g < G; g++) {
        float inv = 1.0f / l[g];
        for (int i = 0; i < ND; i++) {
            v16 x = o[g][i] * inv;
            memcpy(out + g * D + i * LANES, &x, sizeof x);
        }
    }
}

#define SHAPES(X) X(1, 4) X(2, 4) X(3, 4) X(4, 4) X(8, 4) X(1, 8) X(2, 8) X(4, 8) X(1, 16) X(2, 16) X(4, 16)
#define DEFINE(G, ND)                                                                            \
    static void attend_##G##_##ND(const float *q, float *out, const float *kv, int64_t head_off, \
                                  int64_t v_off, int64_t page_stride, int64_t tok_stride,        \
                                  int64_t block, const int64_t *table, int64_t last, float scale, \
                                  float *s) {                                                    \
        attend_head(G, ND, q, out, kv, head_off, v_off, page_stride, tok_stride, block, table,   \
                    last, scale, s);                                                             \
    }
SHAPES(DEFINE)

typedef void (*head_fn)(const float *, float *, const float *, int64_t, int64_t, int64_t, int64_t,
                        int64_t, const int64_t *, int64_t, float, float *);

static head_fn pick(int64_t group, int64_t d) {
#define CASE(G, ND) \
    if (group == G && d == ND * LANES) return attend_##G##_##ND;
    SHAPES(CASE)
#undef CASE
    return 0;
}

/* Whether the kernel has a variant for this group size and head dim (else callers use torch). */
int dsi_paged_attention_supports(int64_t group, int64_t d) { return pick(group, d) != 0; }

/* q: [rows, hq, d], rows q_stride elements apart, heads contiguous; out: [rows, hq * d].
 * kv: this layer's K of page 0 at kv[0]; V at kv[v_off]; page stride page_stride, token stride
 * tok_stride, head stride head_stride (elements). tables: [seqs, table_width]; seq, pos: [rows].
 * A row with pos < 0 gets zeros. Returns 0, or -1 for a shape without a variant. */
int dsi_paged_attention(const float *q, int64_t q_stride, int64_t rows, int64_t hq, int64_t hkv,
                        int64_t d, const float *kv, int64_t v_off, int64_t page_stride,
                        int64_t tok_stride, int64_t head_stride, int64_t block,
                        const int64_t *tables, int64_t table_width, const int64_t *seq,
                        const int64_t *pos, float scale, float *out) {
    int64_t group = hq / hkv;
    head_fn fn = pick(group, d);
    if (!fn || block > MAX_BLOCK) return -1;
    static _Thread_local float s[8 * MAX_BLOCK];
    for (int64_t r = 0; r < rows; r++) {
        float *res = out + r * hq * d;
        if (pos[r] < 0) {
            memset(res, 0, sizeof(float) * hq * d);
            continue;
        }
        for (int64_t h = 0; h < hkv; h++)
            fn(q + r * q_stride + h * group * d, res + h * group * d, kv, h * head_stride, v_off,
               page_stride, tok_stride, block, tables + seq[r] * table_width, pos[r], scale, s);
    }
    return 0;
}

/* Writes k, v: [rows, width] (rows k_stride, v_stride elements apart) into the pages at (page[r], off[r]); rows with
 * page[r] < 0 are skipped (positions whose entries were loaded, or padding). */
void dsi_write_kv(const float *k, int64_t k_stride, const float *v, int64_t v_stride, int64_t rows,
                  int64_t width, float *kv,
                  int64_t v_off, int64_t page_stride, int64_t tok_stride, const int64_t *page,
                  const int64_t *off) {
    for (int64_t r = 0; r < rows; r++) {
        if (page[r] < 0) continue;
        float *dst = kv + page[r] * page_stride + off[r] * tok_stride;
        memcpy(dst, k + r * k_stride, sizeof(float) * width);
        memcpy(dst + v_off, v + r * v_stride, sizeof(float) * width);
    }
}
