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
#include "simd16.h"
#include "thread_pool.h"

#define MAX_BLOCK 1024

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
            float alpha = softmax_fold(s + g * MAX_BLOCK, n, &m[g], &l[g]);
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
            store16(out + g * D + i * LANES, x);
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

typedef struct {
    const float *q, *kv;
    const int64_t *tables, *seq, *pos;
    float *out;
    int64_t q_stride, rows, hq, hkv, d, v_off, page_stride, tok_stride, head_stride, block, table_width;
    float scale;
    head_fn fn;
} Rows;

/* Rows [rows * part / parts, rows * (part + 1) / parts). */
static void rows_part(void *ctx, int part, int parts) {
    const Rows *a = ctx;
    static _Thread_local float s[8 * MAX_BLOCK];
    int64_t group = a->hq / a->hkv, d = a->d;
    for (int64_t r = a->rows * part / parts; r < a->rows * (part + 1) / parts; r++) {
        float *res = a->out + r * a->hq * d;
        if (a->pos[r] < 0) {
            memset(res, 0, sizeof(float) * a->hq * d);
            continue;
        }
        for (int64_t h = 0; h < a->hkv; h++)
            a->fn(a->q + r * a->q_stride + h * group * d, res + h * group * d, a->kv, h * a->head_stride,
                  a->v_off, a->page_stride, a->tok_stride, a->block, a->tables + a->seq[r] * a->table_width,
                  a->pos[r], a->scale, s);
    }
}

/* q: [rows, hq, d], rows q_stride elements apart, heads contiguous; out: [rows, hq * d].
 * kv: this layer's K of page 0 at kv[0]; V at kv[v_off]; page stride page_stride, token stride
 * tok_stride, head stride head_stride (elements). tables: [seqs, table_width]; seq, pos: [rows].
 * A row with pos < 0 gets zeros. The rows are shared among `parts` threads through `run`
 * (thread_pool.c; NULL: this thread alone). Returns 0, or -1 for a shape without a variant. */
int dsi_paged_attention(const float *q, int64_t q_stride, int64_t rows, int64_t hq, int64_t hkv,
                        int64_t d, const float *kv, int64_t v_off, int64_t page_stride,
                        int64_t tok_stride, int64_t head_stride, int64_t block,
                        const int64_t *tables, int64_t table_width, const int64_t *seq,
                        const int64_t *pos, float scale, float *out, pool_run_fn run, int parts) {
    head_fn fn = pick(hq / hkv, d);
    if (!fn || block > MAX_BLOCK) return -1;
    Rows a = {q, kv, tables, seq, pos, out, q_stride, rows, hq, hkv, d, v_off, page_stride, tok_stride,
              head_stride, block, table_width, scale, fn};
    if (parts > rows) parts = (int)rows;
    if (run == 0 || parts < 2)
        rows_part(&a, 0, 1);
    else
        run(rows_part, &a, parts);
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
