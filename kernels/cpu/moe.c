/* Mixture-of-experts routing on the CPU: scores, top-k (group-limited as DeepSeek-V3), the
 * weights and their backward to the router's logits, the Switch / GShard auxiliary loss, and
 * the permutation of token copies into expert-grouped order and back. kernels.h states the
 * contracts; the reference the CUDA backend is tested against. */
#include <math.h>
#include <string.h>

#include "kernels/cpu/cpu.h"

static void check_route(const KernMoeRoute *r)
{
    KERN_CHECK(r->N >= 0 && r->E >= 1 && r->E <= KERN_MOE_MAX_EXPERTS && r->topk >= 1 &&
                   r->topk <= r->E,
               "moe: experts or topk out of range");
    KERN_CHECK(r->groups == 0 ||
                   (r->E % r->groups == 0 && r->topk_groups >= 1 && r->topk_groups <= r->groups &&
                    r->topk <= r->topk_groups * (r->E / r->groups)),
               "moe: groups must divide the experts and hold topk of them");
    KERN_CHECK(!r->force_balance || r->seq_rows >= 1, "moe: force_balance needs seq_rows");
}

/* The scores of one row: softmax (max-subtracted) or sigmoid. */
static void scores_row(float *p, const float *x, int E, KernMoeScore score)
{
    if (score == KERN_MOE_SIGMOID) {
        for (int e = 0; e < E; e++)
            p[e] = 1.0f / (1.0f + expf(-x[e]));
        return;
    }
    float mx = x[0];
    for (int e = 1; e < E; e++)
        mx = x[e] > mx ? x[e] : mx;
    double sum = 0;
    for (int e = 0; e < E; e++) {
        p[e] = expf(x[e] - mx);
        sum += p[e];
    }
    const float inv = (float)(1.0 / sum);
    for (int e = 0; e < E; e++)
        p[e] *= inv;
}

/* The k best of v[0..n) among those with ok[i] (NULL: all), best first, ties to the lower index,
 * into out. A selection by repeated scans: k and n are small (topk, groups). */
static void top_k(int *out, const float *v, const unsigned char *ok, int n, int k)
{
    unsigned char taken[KERN_MOE_MAX_EXPERTS];
    memset(taken, 0, (size_t)n);
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int i = 0; i < n; i++)
            if (!taken[i] && (!ok || ok[i]) && (best < 0 || v[i] > v[best]))
                best = i;
        out[j] = best;
        taken[best] = 1;
    }
}

/* The chosen experts of one row by score, group-limited when r->groups > 0. */
static void choose_row(int32_t *idx, const float *p, const KernMoeRoute *r)
{
    const int E = r->E;
    int pick[KERN_MOE_MAX_EXPERTS];
    unsigned char ok[KERN_MOE_MAX_EXPERTS];
    const unsigned char *eligible = NULL;
    if (r->groups > 0) {
        const int G = r->groups, per = E / G;
        float gscore[KERN_MOE_MAX_EXPERTS];
        for (int g = 0; g < G; g++) {
            int two[2];
            const int m = per >= 2 ? 2 : 1;
            top_k(two, p + g * per, NULL, per, m);
            gscore[g] = p[g * per + two[0]] + (m == 2 ? p[g * per + two[1]] : 0.0f);
        }
        int gpick[KERN_MOE_MAX_EXPERTS];
        top_k(gpick, gscore, NULL, G, r->topk_groups);
        memset(ok, 0, (size_t)E);
        for (int j = 0; j < r->topk_groups; j++)
            memset(ok + gpick[j] * per, 1, (size_t)per);
        eligible = ok;
    }
    top_k(pick, p, eligible, E, r->topk);
    for (int k = 0; k < r->topk; k++)
        idx[k] = pick[k];
}

static int renormalised(const KernMoeRoute *r)
{
    return r->score == KERN_MOE_SIGMOID || r->norm_topk;
}

void kern_cpu_moe_route_fwd(float *probs, int32_t *idx, float *w, const float *logits,
                            const KernMoeRoute *r)
{
    // probs, logits are (N,E); idx, w are (N,topk)
    check_route(r);
    const int E = r->E, K = r->topk;
    for (int n = 0; n < r->N; n++) {
        float *p = probs + (size_t)n * E;
        int32_t *ix = idx + (size_t)n * K;
        float *wn = w + (size_t)n * K;
        scores_row(p, logits + (size_t)n * E, E, r->score);
        if (r->force_balance) {
            const uint64_t g = r->first + (uint64_t)(n / r->seq_rows) * (uint64_t)r->seq_stride +
                               (uint64_t)(n % r->seq_rows);
            for (int k = 0; k < K; k++)
                ix[k] = (int32_t)((g * (uint64_t)K + (uint64_t)k) % (uint64_t)E);
        } else {
            choose_row(ix, p, r);
        }
        double sum = 0;
        for (int k = 0; k < K; k++) {
            wn[k] = p[ix[k]];
            sum += wn[k];
        }
        if (renormalised(r)) {
            const float inv = (float)(1.0 / (sum + 1e-20));
            for (int k = 0; k < K; k++)
                wn[k] *= inv;
        }
    }
}

void kern_cpu_moe_route_bwd(float *dlogits, const float *dprobs, const float *dw,
                            const float *probs, const int32_t *idx, const KernMoeRoute *r)
{
    // dlogits, dprobs, probs are (N,E); dw, idx are (N,topk)
    check_route(r);
    const int E = r->E, K = r->topk;
    for (int n = 0; n < r->N; n++) {
        const float *p = probs + (size_t)n * E;
        int32_t ix[KERN_MOE_MAX_EXPERTS]; /* a dropped copy's expert still holds its score */
        for (int k = 0; k < K; k++)
            ix[k] = kern_moe_expert_of(idx[(size_t)n * K + k]);
        const float *dwn = dw + (size_t)n * K;
        float *dl = dlogits + (size_t)n * E;
        /* dl holds d loss / d score first */
        if (!dprobs)
            memset(dl, 0, (size_t)E * sizeof *dl);
        else if (dprobs != dlogits) /* in place, dl already holds the scores' gradient */
            memcpy(dl, dprobs + (size_t)n * E, (size_t)E * sizeof *dl);
        if (renormalised(r)) {
            /* w_k = p_k / S, S = sum_j p_j: dp_k = (dw_k - sum_j dw_j w_j) / S */
            double S = 0, dot = 0;
            for (int k = 0; k < K; k++)
                S += p[ix[k]];
            for (int k = 0; k < K; k++)
                dot += (double)dwn[k] * (p[ix[k]] / S);
            for (int k = 0; k < K; k++)
                dl[ix[k]] += (float)((dwn[k] - dot) / (S + 1e-20));
        } else {
            for (int k = 0; k < K; k++)
                dl[ix[k]] += dwn[k];
        }
        if (r->score == KERN_MOE_SIGMOID) {
            for (int e = 0; e < E; e++)
                dl[e] *= p[e] * (1.0f - p[e]);
        } else {
            double dot = 0;
            for (int e = 0; e < E; e++)
                dot += (double)p[e] * dl[e];
            for (int e = 0; e < E; e++)
                dl[e] = p[e] * (float)(dl[e] - dot);
        }
    }
}

void kern_cpu_moe_counts(float *counts, const int32_t *idx, int N, int topk, int E)
{
    // counts is (E); idx is (N,topk)
    KERN_CHECK(E >= 1 && N >= 0 && topk >= 1, "moe_counts: sizes");
    memset(counts, 0, (size_t)E * sizeof *counts);
    for (size_t i = 0; i < (size_t)N * (size_t)topk; i++) {
        KERN_CHECK(idx[i] >= -E && idx[i] < E, "moe_counts: an expert index out of range");
        if (idx[i] >= 0)
            counts[idx[i]] += 1.0f;
    }
}

void kern_cpu_moe_aux_fwd(float *loss, const float *probs, const float *counts, int N, int E,
                          float scale)
{
    // probs is (N,E); counts is (E)
    double sum = 0;
    for (int e = 0; e < E; e++) {
        double pe = 0;
        for (int n = 0; n < N; n++)
            pe += probs[(size_t)n * E + e];
        sum += (double)counts[e] * pe;
    }
    *loss = (float)(scale * sum);
}

void kern_cpu_moe_aux_bwd(float *dprobs, const float *counts, int N, int E, float scale)
{
    // dprobs is (N,E); counts is (E)
    for (int n = 0; n < N; n++)
        for (int e = 0; e < E; e++)
            dprobs[(size_t)n * E + e] = scale * counts[e];
}

/* row(n, k) of every copy into rows[N*topk]: a stable counting sort of idx by expert; counts
 * (E entries, may be NULL) the rows per expert. */
static void rows_of(int32_t *rows, int32_t *counts, const int32_t *idx, int N, int topk, int E)
{
    KERN_CHECK(E >= 1 && E <= KERN_MOE_MAX_EXPERTS && N >= 0 && topk >= 1, "moe: sizes");
    int32_t next[KERN_MOE_MAX_EXPERTS];
    memset(next, 0, (size_t)E * sizeof *next);
    const size_t copies = (size_t)N * (size_t)topk;
    for (size_t i = 0; i < copies; i++) {
        KERN_CHECK(idx[i] >= -E && idx[i] < E, "moe: an expert index out of range");
        if (idx[i] >= 0)
            next[idx[i]]++;
    }
    if (counts)
        memcpy(counts, next, (size_t)E * sizeof *counts);
    int32_t start = 0;
    for (int e = 0; e < E; e++) {
        const int32_t c = next[e];
        next[e] = start;
        start += c;
    }
    for (size_t i = 0; i < copies; i++)
        rows[i] = idx[i] >= 0 ? next[idx[i]]++ : -1;
}

/* rows_of for a call that keeps no map of its own: on the stack up to a size, beyond that the
 * expert-grouped position is found by counting (O(copies) per copy, for large inputs only in
 * tests). Kernels allocate nothing: the executor's step loop is allocation-free. */
enum { ROWS_STACK = 16384 };

static int32_t row_at(const int32_t *idx, int N, int topk, int E, size_t i)
{
    (void)E;
    const size_t copies = (size_t)N * (size_t)topk;
    if (idx[i] < 0)
        return -1;
    int32_t r = 0;
    for (size_t j = 0; j < copies; j++)
        if (idx[j] >= 0 && (idx[j] < idx[i] || (idx[j] == idx[i] && j < i)))
            r++;
    return r;
}

#define FOR_EACH_ROW(idx, N, topk, E, body)                                                       \
    do {                                                                                          \
        const size_t copies_ = (size_t)(N) * (size_t)(topk);                                      \
        int32_t stack_[ROWS_STACK];                                                               \
        const int small_ = copies_ <= ROWS_STACK;                                                 \
        if (small_)                                                                               \
            rows_of(stack_, NULL, (idx), (N), (topk), (E));                                       \
        for (size_t i_ = 0; i_ < copies_; i_++) {                                                 \
            const size_t n = i_ / (size_t)(topk), k = i_ % (size_t)(topk);                        \
            const int32_t r_ = small_ ? stack_[i_] : row_at((idx), (N), (topk), (E), i_);         \
            const size_t row = (size_t)r_;                                                        \
            (void)k;                                                                              \
            if (r_ >= 0) /* not dropped */                                                        \
            body                                                                                  \
        }                                                                                         \
    } while (0)

void kern_cpu_moe_permute(void *out, int32_t *counts, int32_t *row_of, const void *x,
                          const int32_t *idx, int N, int C, int topk, int E)
{
    // out is (N*topk,C); x is (N,C); counts is (E); row_of, idx are (N,topk)
    float *o = out;
    const float *xi = x;
    int32_t cnt[KERN_MOE_MAX_EXPERTS];
    KERN_CHECK(E >= 1 && E <= KERN_MOE_MAX_EXPERTS, "moe_permute: experts");
    memset(cnt, 0, (size_t)E * sizeof *cnt);
    for (size_t i = 0; i < (size_t)N * (size_t)topk; i++) {
        KERN_CHECK(idx[i] >= -E && idx[i] < E, "moe_permute: an expert index out of range");
        if (idx[i] >= 0)
            cnt[idx[i]]++;
    }
    memcpy(counts, cnt, (size_t)E * sizeof *counts);
    for (size_t i = 0; row_of && i < (size_t)N * (size_t)topk; i++)
        row_of[i] = -1; /* a dropped copy has no row */
    FOR_EACH_ROW(idx, N, topk, E, {
        if (row_of)
            row_of[i_] = (int32_t)row;
        memcpy(o + row * (size_t)C, xi + n * (size_t)C, (size_t)C * sizeof *o);
    });
}

void kern_cpu_moe_permute_bwd(void *dx, const void *dout, const int32_t *idx, int N, int C,
                              int topk, int E)
{
    // dx is (N,C); dout is (N*topk,C)
    float *d = dx;
    const float *g = dout;
    if (N > 0)
        memset(d, 0, (size_t)N * (size_t)C * sizeof *d);
    FOR_EACH_ROW(idx, N, topk, E, {
        float *dn = d + n * (size_t)C;
        const float *gr = g + row * (size_t)C;
        for (int c = 0; c < C; c++)
            dn[c] += gr[c];
    });
}

void kern_cpu_moe_unpermute(void *y, const void *eout, const float *w, const int32_t *idx, int N,
                            int C, int topk, int E)
{
    // y is (N,C); eout is (N*topk,C); w, idx are (N,topk)
    float *o = y;
    const float *e = eout;
    if (N > 0)
        memset(o, 0, (size_t)N * (size_t)C * sizeof *o);
    FOR_EACH_ROW(idx, N, topk, E, {
        float *yn = o + n * (size_t)C;
        const float *er = e + row * (size_t)C;
        const float wk = w[i_];
        for (int c = 0; c < C; c++)
            yn[c] += wk * er[c];
    });
}

void kern_cpu_moe_unpermute_bwd(void *deout, float *dw, const void *dy, const void *eout,
                                const float *w, const int32_t *idx, int N, int C, int topk, int E)
{
    // deout, eout are (N*topk,C); dy is (N,C); dw, w, idx are (N,topk)
    float *de = deout;
    const float *g = dy, *e = eout;
    for (size_t i = 0; i < (size_t)N * (size_t)topk; i++)
        dw[i] = 0.0f; /* a dropped copy's weight had no effect */
    FOR_EACH_ROW(idx, N, topk, E, {
        const float *gn = g + n * (size_t)C;
        const float *er = e + row * (size_t)C;
        float *dr = de + row * (size_t)C;
        const float wk = w[i_];
        double dot = 0;
        for (int c = 0; c < C; c++) {
            dot += (double)gn[c] * er[c];
            dr[c] = wk * gn[c];
        }
        dw[i_] = (float)dot;
    });
}

void kern_cpu_moe_drop(int32_t *idx, const float *w, int N, int topk, int E, int capacity)
{
    // idx, w are (N,topk)
    KERN_CHECK(E >= 1 && E <= KERN_MOE_MAX_EXPERTS && N >= 0 && topk >= 1 && capacity >= 0,
               "moe_drop: sizes");
    const size_t copies = (size_t)N * (size_t)topk;
    int32_t cnt[KERN_MOE_MAX_EXPERTS];
    memset(cnt, 0, (size_t)E * sizeof *cnt);
    for (size_t i = 0; i < copies; i++) {
        KERN_CHECK(idx[i] >= -E && idx[i] < E, "moe_drop: an expert index out of range");
        if (idx[i] >= 0)
            cnt[idx[i]]++;
    }
    /* a copy's place among its expert's by weight: only an expert over capacity scans. The
     * marks keep the expert (kern_moe_expert_of), so a copy marked before a later copy's scan
     * still counts in that scan, as the CUDA kernel's threads see it. */
    for (size_t i = 0; i < copies; i++) {
        const int e = idx[i];
        if (e < 0 || cnt[e] <= capacity)
            continue;
        int32_t ahead = 0;
        for (size_t j = 0; j < copies && ahead < capacity; j++)
            if (j != i && kern_moe_expert_of(idx[j]) == e && (w[j] > w[i] || (w[j] == w[i] && j < i)))
                ahead++;
        if (ahead >= capacity)
            idx[i] = -1 - e;
    }
}

void kern_cpu_moe_dense(float *probs, uint8_t *map, const int32_t *idx, const float *w, int N,
                        int topk, int E)
{
    // probs, map are (N,E); idx, w are (N,topk)
    KERN_CHECK(E >= 1 && N >= 0 && topk >= 1, "moe_dense: sizes");
    memset(probs, 0, (size_t)N * (size_t)E * sizeof *probs);
    if (map)
        memset(map, 0, (size_t)N * (size_t)E);
    for (size_t i = 0; i < (size_t)N * (size_t)topk; i++) {
        KERN_CHECK(idx[i] >= -E && idx[i] < E, "moe_dense: an expert index out of range");
        if (idx[i] < 0)
            continue;
        const size_t at = i / (size_t)topk * (size_t)E + (size_t)idx[i];
        probs[at] = w[i];
        if (map)
            map[at] = 1;
    }
}

void kern_cpu_moe_sparse(int32_t *idx, float *w, const float *probs, const uint8_t *map, int N,
                         int topk, int E, int e0, int e1)
{
    // idx, w are (N,topk); probs, map are (N,E)
    KERN_CHECK(E >= 1 && N >= 0 && topk >= 1 && 0 <= e0 && e0 <= e1 && e1 <= E,
               "moe_sparse: sizes");
    for (size_t n = 0; n < (size_t)N; n++) {
        int j = 0;
        for (int e = 0; e < E && j < topk; e++) {
            if (!map[n * (size_t)E + (size_t)e])
                continue;
            idx[n * (size_t)topk + (size_t)j] = e >= e0 && e < e1 ? e : -1 - e;
            w[n * (size_t)topk + (size_t)j] = probs[n * (size_t)E + (size_t)e];
            j++;
        }
        for (; j < topk; j++) {
            idx[n * (size_t)topk + (size_t)j] = -1;
            w[n * (size_t)topk + (size_t)j] = 0.0f;
        }
    }
}

void kern_cpu_moe_pick(float *dw, const float *probs, const int32_t *idx, int N, int topk, int E)
{
    // dw, idx are (N,topk); probs is (N,E)
    KERN_CHECK(E >= 1 && N >= 0 && topk >= 1, "moe_pick: sizes");
    for (size_t i = 0; i < (size_t)N * (size_t)topk; i++) {
        KERN_CHECK(idx[i] >= -E && idx[i] < E, "moe_pick: an expert index out of range");
        dw[i] = idx[i] >= 0 ? probs[i / (size_t)topk * (size_t)E + (size_t)idx[i]] : 0.0f;
    }
}
