/* DeepSeek-V4 attention of query rows, each row on its own (see v4_attention.py).
 *
 * A query row attends to two lists of keys, both given by element offsets: its visible SWA keys
 * (rotated, one head per KV head, values beside them) in position order, then its visible global
 * latents (keys = values, shared by every head, read with the unrotated query) in entry order.
 * The row reads only its own vectors and the keys its lists name, with the same loops in the same
 * order whatever the other rows are: its result has the same bits in a decode batch of any size
 * and in a prefill chunk of any length, and no key outside its lists (a stale ring slot, a page's
 * unwritten entry) is ever read.
 *
 * Per head, each list is folded in blocks of BLOCK keys from its first entry with an online
 * softmax (scores, block max, weights e^(s - m), running sum and weighted values rescaled by
 * e^(m_old - m_new)); dot products and sums run in LANES partial sums added in one fixed order.
 * A group's heads share each key's load; a head's arithmetic does not depend on its group, so
 * groups larger than 4 heads run as sub-groups of 4, 2 and 1.
 */
#include "simd16.h"

#define BLOCK 128
#define SUB 4 /* heads per sub-group at most */

/* Fold keys off[0 .. n) (at base + off[t], values at vbase + off[t]) into G heads' state. */
static inline __attribute__((always_inline)) void fold(
    const int G, const int ND, const float *q, const float *base, const float *vbase,
    const int64_t *off, int64_t n, float scale, float *m, float *l, v16 o[][16], float *s) {
    v16 qv[SUB][16];
    for (int g = 0; g < G; g++)
        for (int i = 0; i < ND; i++) qv[g][i] = load16(q + g * ND * LANES + i * LANES);
    for (int64_t j0 = 0; j0 < n; j0 += BLOCK) {
        int64_t nb = n - j0 < BLOCK ? n - j0 : BLOCK;
        for (int64_t t = 0; t < nb; t++) { /* scores; each key read once for the group */
            const float *kt = base + off[j0 + t];
            v16 acc[SUB];
            for (int g = 0; g < G; g++) acc[g] = splat(0.0f);
            for (int i = 0; i < ND; i++) {
                v16 k16 = load16(kt + i * LANES);
                for (int g = 0; g < G; g++) acc[g] += qv[g][i] * k16;
            }
            for (int g = 0; g < G; g++) s[g * BLOCK + t] = hsum(acc[g]) * scale;
        }
        for (int g = 0; g < G; g++) { /* fold the block into the online softmax */
            float alpha = softmax_fold(s + g * BLOCK, nb, &m[g], &l[g]);
            for (int i = 0; i < ND; i++) o[g][i] *= alpha;
        }
        for (int64_t t = 0; t < nb; t++) { /* weighted values; each value read once for the group */
            const float *vt = vbase + off[j0 + t];
            for (int i = 0; i < ND; i++) {
                v16 v = load16(vt + i * LANES);
                for (int g = 0; g < G; g++) o[g][i] += s[g * BLOCK + t] * v;
            }
        }
    }
}

/* G heads (D = ND * LANES) of one row: SWA list, then latent list; out: [G, D]. */
static inline __attribute__((always_inline)) void attend_heads(
    const int G, const int ND, const float *qr, const float *q, float *out, const float *kbase,
    const float *vbase, const int64_t *swa_off, int64_t swa_n, const float *lbase,
    const int64_t *lat_off, int64_t lat_n, float scale, float *s) {
    const int D = ND * LANES;
    float m[SUB], l[SUB];
    v16 o[SUB][16];
    for (int g = 0; g < G; g++) {
        m[g] = -INFINITY;
        l[g] = 0.0f;
        for (int i = 0; i < ND; i++) o[g][i] = splat(0.0f);
    }
    fold(G, ND, qr, kbase, vbase, swa_off, swa_n, scale, m, l, o, s);
    if (lat_n > 0) fold(G, ND, q, lbase, lbase, lat_off, lat_n, scale, m, l, o, s);
    for (int g = 0; g < G; g++) {
        float inv = l[g] > 0.0f ? 1.0f / l[g] : 0.0f; /* no key at all: zeros */
        for (int i = 0; i < ND; i++) store16(out + g * D + i * LANES, o[g][i] * inv);
    }
}

#define SHAPES(X)                                                                       \
    X(1, 1) X(2, 1) X(4, 1) X(1, 2) X(2, 2) X(4, 2) X(1, 4) X(2, 4) X(4, 4) X(1, 8) X(2, 8) \
    X(4, 8) X(1, 16) X(2, 16) X(4, 16)
#define DEFINE(G, ND)                                                                              \
    static void heads_##G##_##ND(const float *qr, const float *q, float *out, const float *kbase, \
                                 const float *vbase, const int64_t *swa_off, int64_t swa_n,       \
                                 const float *lbase, const int64_t *lat_off, int64_t lat_n,       \
                                 float scale, float *s) {                                         \
        attend_heads(G, ND, qr, q, out, kbase, vbase, swa_off, swa_n, lbase, lat_off, lat_n,      \
                     scale, s);                                                                   \
    }
SHAPES(DEFINE)

typedef void (*heads_fn)(const float *, const float *, float *, const float *, const float *,
                         const int64_t *, int64_t, const float *, const int64_t *, int64_t, float,
                         float *);

static heads_fn pick(int64_t g, int64_t d) {
#define CASE(G, ND) \
    if (g == G && d == ND * LANES) return heads_##G##_##ND;
    SHAPES(CASE)
#undef CASE
    return 0;
}

/* Whether the kernel takes this head dim (16, 32, 64, 128 or 256; any group size). */
int dsi_v4_attention_supports(int64_t d) { return pick(1, d) != 0; }

/* q, qr: [rows, hq, d] unrotated and rotated queries, rows q_stride / qr_stride elements apart,
 * heads contiguous; out: [rows, hq * d].
 * SWA: row r's keys are swa_off[seq[r] * swa_width + j] for j in [swa_lo[r], swa_hi[r]), element
 * offsets of KV head 0's key from kbase and of its value from vbase; KV head h at + h * head_stride.
 * Latents: lat_off[seq[r] * lat_width + j] for j in [0, lat_n[r]), offsets from lbase (keys =
 * values, d wide). Returns 0, or -1 for a head dim without a variant. */
int dsi_v4_attention(const float *q, int64_t q_stride, const float *qr, int64_t qr_stride,
                      int64_t rows, int64_t hq, int64_t hkv, int64_t d, const float *kbase,
                      const float *vbase, int64_t head_stride, const int64_t *swa_off,
                      int64_t swa_width, const int64_t *swa_lo, const int64_t *swa_hi,
                      const float *lbase, const int64_t *lat_off, int64_t lat_width,
                      const int64_t *lat_n, const int64_t *seq, float scale, float *out) {
    if (!pick(1, d)) return -1;
    static _Thread_local float s[SUB * BLOCK];
    int64_t group = hq / hkv;
    for (int64_t r = 0; r < rows; r++) {
        const int64_t *so = swa_off + seq[r] * swa_width + swa_lo[r];
        const int64_t *lo = lat_off + seq[r] * lat_width;
        for (int64_t h = 0; h < hkv; h++) {
            for (int64_t g0 = 0; g0 < group;) { /* sub-groups of 4, 2, 1 heads */
                int64_t sub = group - g0 >= 4 ? 4 : group - g0 >= 2 ? 2 : 1;
                int64_t head = h * group + g0;
                pick(sub, d)(qr + r * qr_stride + head * d, q + r * q_stride + head * d,
                             out + (r * hq + head) * d, kbase + h * head_stride,
                             vbase + h * head_stride, so, swa_hi[r] - swa_lo[r], lbase, lo,
                             lat_n[r], scale, s);
                g0 += sub;
            }
        }
    }
    return 0;
}
