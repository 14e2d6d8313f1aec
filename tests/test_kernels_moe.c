/* The CPU's mixture-of-experts kernels: routing (softmax, sigmoid, group-limited, forced
 * balance), the weights' backward to the logits, the auxiliary loss, and the permutation, each
 * against values worked out by hand in the comments, and the backwards against central finite
 * differences of the forwards. */
#include <math.h>

#include "kernels/kernels.h"
#include "tests/test.h"

static const KernBackend *K;

static KernMoeRoute route(int N, int E, int topk, KernMoeScore score)
{
    KernMoeRoute r = {0};
    r.N = N;
    r.E = E;
    r.topk = topk;
    r.score = score;
    r.seq_rows = N > 0 ? N : 1;
    r.seq_stride = r.seq_rows;
    return r;
}

/* softmax of log(1..4) is (1, 2, 3, 4) / 10: the two best are experts 3 (0.4) and 2 (0.3) */
static void test_softmax_topk(void)
{
    float logits[4] = {0.0f, logf(2.0f), logf(3.0f), logf(4.0f)};
    float probs[4], w[2];
    int32_t idx[2];
    KernMoeRoute r = route(1, 4, 2, KERN_MOE_SOFTMAX);
    K->moe_route_fwd(probs, idx, w, logits, &r);
    for (int e = 0; e < 4; e++)
        CHECK_REL((e + 1) / 10.0, probs[e], 1e-6);
    CHECK_EQ_INT(3, idx[0]);
    CHECK_EQ_INT(2, idx[1]);
    CHECK_REL(0.4, w[0], 1e-6);
    CHECK_REL(0.3, w[1], 1e-6);
    r.norm_topk = 1; /* renormalised over the chosen: 4/7 and 3/7 */
    K->moe_route_fwd(probs, idx, w, logits, &r);
    CHECK_REL(4.0 / 7.0, w[0], 1e-6);
    CHECK_REL(3.0 / 7.0, w[1], 1e-6);
}

/* sigmoid(0) = 1/2, sigmoid(ln 3) = 3/4, sigmoid(-ln 3) = 1/4: top-2 are 1 (0.75) and 0 (0.5),
 * renormalised to 0.6 and 0.4 */
static void test_sigmoid(void)
{
    float logits[3] = {0.0f, logf(3.0f), -logf(3.0f)};
    float probs[3], w[2];
    int32_t idx[2];
    KernMoeRoute r = route(1, 3, 2, KERN_MOE_SIGMOID);
    K->moe_route_fwd(probs, idx, w, logits, &r);
    CHECK_REL(0.5, probs[0], 1e-6);
    CHECK_REL(0.75, probs[1], 1e-6);
    CHECK_REL(0.25, probs[2], 1e-6);
    CHECK_EQ_INT(1, idx[0]);
    CHECK_EQ_INT(0, idx[1]);
    CHECK_REL(0.6, w[0], 1e-6);
    CHECK_REL(0.4, w[1], 1e-6);
}

/* Eight experts in four groups of two with scores proportional to (1, 9 | 5, 5 | 8, 0.5 | 2, 2):
 * group sums 10, 10, 8.5, 4, so groups 0 and 1 are eligible and the top-2 are experts 1 (9) and
 * 2 (5, tied with 3: the lower index). Without groups they would be 1 and 4 (8). */
static void test_groups(void)
{
    const float v[8] = {1, 9, 5, 5, 8, 0.5f, 2, 2};
    float logits[8], probs[8], w[2];
    int32_t idx[2];
    for (int e = 0; e < 8; e++)
        logits[e] = logf(v[e]);
    KernMoeRoute r = route(1, 8, 2, KERN_MOE_SOFTMAX);
    K->moe_route_fwd(probs, idx, w, logits, &r);
    CHECK_EQ_INT(1, idx[0]);
    CHECK_EQ_INT(4, idx[1]);
    r.groups = 4;
    r.topk_groups = 2;
    K->moe_route_fwd(probs, idx, w, logits, &r);
    CHECK_EQ_INT(1, idx[0]);
    CHECK_EQ_INT(2, idx[1]);
    CHECK_REL(9.0 / 32.5, w[0], 1e-6);
    CHECK_REL(5.0 / 32.5, w[1], 1e-6);
}

/* Forced balance: row n of global id g sends copy k to (g * topk + k) % E. Ids 0, 1, 2 with
 * topk 2 over 4 experts: (0,1), (2,3), (0,1). Rows of two sequences of 2 out of 5 starting at
 * 10 (ids 10, 11, 15, 16): (0,1), (2,3), (2,3), (0,1). The weights are the chosen scores. */
static void test_force_balance(void)
{
    float logits[16] = {0}, probs[16], w[8];
    int32_t idx[8];
    KernMoeRoute r = route(3, 4, 2, KERN_MOE_SOFTMAX);
    r.force_balance = 1;
    K->moe_route_fwd(probs, idx, w, logits, &r);
    const int32_t want[6] = {0, 1, 2, 3, 0, 1};
    for (int i = 0; i < 6; i++) {
        CHECK_EQ_INT(want[i], idx[i]);
        CHECK_REL(0.25, w[i], 1e-6);
    }
    r.N = 4;
    r.first = 10;
    r.seq_rows = 2;
    r.seq_stride = 5;
    K->moe_route_fwd(probs, idx, w, logits, &r);
    const int32_t want2[8] = {0, 1, 2, 3, 2, 3, 0, 1};
    for (int i = 0; i < 8; i++)
        CHECK_EQ_INT(want2[i], idx[i]);
}

/* L(logits) = sum a[n,k] w[n,k] + sum b[n,e] p[n,e]: route_bwd(dprobs = b, dw = a) against
 * central differences, for every score, renormalisation and grouping. */
static double route_loss(const float *logits, const float *a, const float *b,
                         const KernMoeRoute *r, float *probs, int32_t *idx, float *w)
{
    K->moe_route_fwd(probs, idx, w, logits, r);
    double L = 0;
    for (int i = 0; i < r->N * r->topk; i++)
        L += (double)a[i] * w[i];
    for (int i = 0; i < r->N * r->E; i++)
        L += (double)b[i] * probs[i];
    return L;
}

static float frand(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((*s >> 40) & 0xFFFFFF) / 16777216.0f * 2.0f - 1.0f;
}

static void check_route_grad(KernMoeRoute r, const char *what)
{
    enum { N = 5, E = 8, KMAX = 4 };
    float logits[N * E], a[N * KMAX], b[N * E], probs[N * E], w[N * KMAX], dl[N * E];
    int32_t idx[N * KMAX];
    uint64_t s = 12345;
    for (int i = 0; i < N * E; i++) {
        logits[i] = 2.0f * frand(&s);
        b[i] = frand(&s);
    }
    for (int i = 0; i < N * KMAX; i++)
        a[i] = frand(&s);
    route_loss(logits, a, b, &r, probs, idx, w);
    K->moe_route_bwd(dl, b, a, probs, idx, &r);
    int32_t idx0[N * KMAX];
    memcpy(idx0, idx, sizeof idx0);
    for (int i = 0; i < N * E; i++) {
        const float h = 1e-2f, x = logits[i];
        logits[i] = x + h;
        const double up = route_loss(logits, a, b, &r, probs, idx, w);
        CHECK(memcmp(idx, idx0, (size_t)(r.N * r.topk) * sizeof *idx) == 0); /* no flip */
        logits[i] = x - h;
        const double dn = route_loss(logits, a, b, &r, probs, idx, w);
        CHECK(memcmp(idx, idx0, (size_t)(r.N * r.topk) * sizeof *idx) == 0);
        logits[i] = x;
        const double fd = (up - dn) / (2.0 * h);
        if (!(fabs(fd - dl[i]) <= 2e-3 + 1e-2 * fabs(fd))) {
            fprintf(stderr, "%s: dlogits[%d]: analytic %.6g, finite difference %.6g\n", what, i,
                    (double)dl[i], fd);
            exit(1);
        }
    }
    /* dprobs NULL means a zero gradient of the scores */
    float zero[N * E] = {0}, dl0[N * E], dl1[N * E];
    K->moe_route_bwd(dl0, NULL, a, probs, idx, &r);
    K->moe_route_bwd(dl1, zero, a, probs, idx, &r);
    CHECK(memcmp(dl0, dl1, sizeof dl0) == 0);
}

static void test_route_grads(void)
{
    KernMoeRoute r = route(5, 8, 2, KERN_MOE_SOFTMAX);
    check_route_grad(r, "softmax");
    r.norm_topk = 1;
    check_route_grad(r, "softmax, renormalised");
    r.topk = 4;
    r.groups = 4;
    r.topk_groups = 2;
    check_route_grad(r, "softmax, group-limited");
    r = route(5, 8, 3, KERN_MOE_SIGMOID);
    check_route_grad(r, "sigmoid");
    r.force_balance = 1;
    check_route_grad(r, "sigmoid, forced balance");
    r = route(5, 8, 2, KERN_MOE_SOFTMAX);
    r.force_balance = 1;
    check_route_grad(r, "softmax, forced balance");
}

/* probs (0.6, 0.4 | 0.2, 0.8), counts (1, 3), scale 0.025 (coeff 0.1, E 2, 4 copies, 2
 * tokens): 0.025 * (1 * 0.8 + 3 * 1.2) = 0.11; the gradient is 0.025 * counts on every row.
 * Through the router: central differences of the aux loss of softmax(logits) with the counts
 * held. */
static void test_aux(void)
{
    const float probs[4] = {0.6f, 0.4f, 0.2f, 0.8f}, counts[2] = {1, 3};
    float loss = -1, dp[4];
    K->moe_aux_fwd(&loss, probs, counts, 2, 2, 0.025f);
    CHECK_REL(0.11, loss, 1e-6);
    K->moe_aux_bwd(dp, counts, 2, 2, 0.025f);
    CHECK_REL(0.025, dp[0], 1e-6);
    CHECK_REL(0.075, dp[1], 1e-6);
    CHECK_REL(0.025, dp[2], 1e-6);
    CHECK_REL(0.075, dp[3], 1e-6);

    enum { N = 6, E = 4, TK = 2 };
    float logits[N * E], p[N * E], w[N * TK], cnt[E], dprobs[N * E], dl[N * E], dw0[N * TK] = {0};
    int32_t idx[N * TK];
    uint64_t s = 99;
    for (int i = 0; i < N * E; i++)
        logits[i] = frand(&s);
    KernMoeRoute r = route(N, E, TK, KERN_MOE_SOFTMAX);
    K->moe_route_fwd(p, idx, w, logits, &r);
    K->moe_counts(cnt, idx, N, TK, E);
    float total = 0;
    for (int e = 0; e < E; e++)
        total += cnt[e];
    CHECK_REL(N * TK, total, 0);
    const float scale = 0.01f * E / (N * TK * (float)N);
    K->moe_aux_bwd(dprobs, cnt, N, E, scale);
    K->moe_route_bwd(dl, dprobs, dw0, p, idx, &r);
    for (int i = 0; i < N * E; i++) {
        const float h = 1e-2f, x = logits[i];
        float up, dn;
        logits[i] = x + h;
        K->moe_route_fwd(p, idx, w, logits, &r);
        K->moe_aux_fwd(&up, p, cnt, N, E, scale);
        logits[i] = x - h;
        K->moe_route_fwd(p, idx, w, logits, &r);
        K->moe_aux_fwd(&dn, p, cnt, N, E, scale);
        logits[i] = x;
        const double fd = ((double)up - dn) / (2.0 * h);
        if (!(fabs(fd - dl[i]) <= 1e-5 + 1e-2 * fabs(fd))) {
            fprintf(stderr, "aux: dlogits[%d]: analytic %.6g, finite difference %.6g\n", i,
                    (double)dl[i], fd);
            exit(1);
        }
    }
}

/* Three tokens, topk 2, three experts: idx (2,0), (0,1), (2,1). Expert-grouped, stable by token
 * then k: expert 0 gets copies (0,1), (1,0) -> rows 0, 1; expert 1 (1,1), (2,1) -> 2, 3; expert
 * 2 (0,0), (2,0) -> 4, 5. So row_of = 4 0 1 2 5 3 and out = x0 x1 x1 x2 x0 x2. */
static void test_permute(void)
{
    const int32_t idx[6] = {2, 0, 0, 1, 2, 1};
    const float x[6] = {1, 10, 2, 20, 3, 30};
    float out[12];
    int32_t counts[3], row_of[6];
    K->moe_permute(out, counts, row_of, x, idx, 3, 2, 2, 3);
    const int32_t want_rows[6] = {4, 0, 1, 2, 5, 3};
    const float want_out[12] = {1, 10, 2, 20, 2, 20, 3, 30, 1, 10, 3, 30};
    for (int e = 0; e < 3; e++)
        CHECK_EQ_INT(2, counts[e]);
    for (int i = 0; i < 6; i++)
        CHECK_EQ_INT(want_rows[i], row_of[i]);
    for (int i = 0; i < 12; i++)
        CHECK_REL(want_out[i], out[i], 0);
    K->moe_permute(out, counts, NULL, x, idx, 3, 2, 2, 3); /* row_of is optional */

    /* backward: dx[n] = the sum of its copies' rows; rows r hold (r, 100 r) */
    float dout[12], dx[6];
    for (int r = 0; r < 6; r++) {
        dout[2 * r] = (float)r;
        dout[2 * r + 1] = 100.0f * r;
    }
    K->moe_permute_bwd(dx, dout, idx, 3, 2, 2, 3);
    CHECK_REL(4 + 0, dx[0], 0);
    CHECK_REL(400, dx[1], 0);
    CHECK_REL(1 + 2, dx[2], 0);
    CHECK_REL(5 + 3, dx[4], 0);

    /* combine: eout row r = (r + 1, -(r + 1)); weights (0.5, 0.25), (1, 2), (3, -1):
     * y0 = 0.5 * row 4 + 0.25 * row 0 = 0.5 * 5 + 0.25 * 1 = 2.75
     * y1 = 1 * row 1 + 2 * row 2 = 2 + 6 = 8;  y2 = 3 * row 5 - row 3 = 18 - 4 = 14 */
    float eout[12], y[6];
    for (int r = 0; r < 6; r++) {
        eout[2 * r] = (float)(r + 1);
        eout[2 * r + 1] = -(float)(r + 1);
    }
    const float wt[6] = {0.5f, 0.25f, 1, 2, 3, -1};
    K->moe_unpermute(y, eout, wt, idx, 3, 2, 2, 3);
    CHECK_REL(2.75, y[0], 0);
    CHECK_REL(-2.75, y[1], 0);
    CHECK_REL(8, y[2], 0);
    CHECK_REL(14, y[4], 0);

    /* its backward for dy = (1, 2) per token: deout[row(n,k)] = w * dy[n]; dw[n,k] =
     * dot(dy[n], eout[row]) = (r + 1) - 2 (r + 1) = -(r + 1) */
    const float dy[6] = {1, 2, 1, 2, 1, 2};
    float deout[12], dw[6];
    K->moe_unpermute_bwd(deout, dw, dy, eout, wt, idx, 3, 2, 2, 3);
    for (int i = 0; i < 6; i++) {
        const int r = want_rows[i];
        CHECK_REL(-(r + 1), dw[i], 0);
        CHECK_REL(wt[i] * 1.0f, deout[2 * r], 0);
        CHECK_REL(wt[i] * 2.0f, deout[2 * r + 1], 0);
    }
}

/* The permutation of a large input (beyond the kernels' stack map: the counting path) equals
 * the small path's order. */
static void test_permute_large(void)
{
    enum { N = 9000, TK = 2, E = 7 };
    int32_t *idx = malloc(sizeof(int32_t) * N * TK), *row_of = malloc(sizeof(int32_t) * N * TK);
    float *x = malloc(sizeof(float) * N), *out = malloc(sizeof(float) * N * TK);
    int32_t counts[E];
    CHECK(idx && row_of && x && out);
    for (int n = 0; n < N; n++) {
        x[n] = (float)n;
        idx[n * TK] = (n * 3) % E;
        idx[n * TK + 1] = (n * 3 + 1 + n % 5) % E == idx[n * TK] ? (idx[n * TK] + 1) % E
                                                                   : (n * 3 + 1 + n % 5) % E;
    }
    K->moe_permute(out, counts, row_of, x, idx, N, 1, TK, E);
    /* rows are grouped by expert and, within one, ascend by token */
    int32_t start[E + 1] = {0};
    for (int e = 0; e < E; e++)
        start[e + 1] = start[e] + counts[e];
    CHECK_EQ_INT(N * TK, start[E]);
    for (int i = 0; i < N * TK; i++) {
        const int e = idx[i];
        CHECK(row_of[i] >= start[e] && row_of[i] < start[e + 1]);
        CHECK_REL(x[i / TK], out[row_of[i]], 0);
    }
    for (int e = 0; e < E; e++)
        for (int r = start[e] + 1; r < start[e + 1]; r++)
            CHECK(out[r - 1] <= out[r]);
    free(idx);
    free(row_of);
    free(x);
    free(out);
}

/* Token dropping, policy "probs", capacity 2: six tokens, topk 1, three experts, idx 0 0 0 1 0 2
 * with weights 0.5 0.9 0.7 0.6 0.9 0.8. Expert 0 has four copies (tokens 0, 1, 2, 4) for two
 * places: it keeps the two of weight 0.9 (tokens 1 and 4, the tie to the lower index, both
 * kept) and drops tokens 0 (0.5) and 2 (0.7): 4 - 2 = 2 copies dropped, marked -1 - 0 = -1.
 * Experts 1 and 2 have one copy each and keep it. */
static void test_drop(void)
{
    int32_t idx[6] = {0, 0, 0, 1, 0, 2};
    const float w[6] = {0.5f, 0.9f, 0.7f, 0.6f, 0.9f, 0.8f};
    K->moe_drop(idx, w, 6, 1, 3, 2);
    const int32_t want[6] = {-1, 0, -1, 1, 0, 2};
    for (int i = 0; i < 6; i++)
        CHECK_EQ_INT(want[i], idx[i]);
    CHECK_EQ_INT(0, kern_moe_expert_of(idx[0]));
    /* the counts leave the dropped out: 2, 1, 1 */
    float cnt[3];
    K->moe_counts(cnt, idx, 6, 1, 3);
    CHECK_REL(2, cnt[0], 0);
    CHECK_REL(1, cnt[1], 0);
    CHECK_REL(1, cnt[2], 0);
    /* the permutation: expert 0 tokens 1, 4 (rows 0, 1), expert 1 token 3 (row 2), expert 2
     * token 5 (row 3); the dropped copies have no row */
    const float x[6] = {10, 11, 12, 13, 14, 15};
    float out[6] = {0};
    int32_t counts[3], row_of[6];
    K->moe_permute(out, counts, row_of, x, idx, 6, 1, 1, 3);
    const int32_t want_rows[6] = {-1, 0, -1, 2, 1, 3};
    for (int i = 0; i < 6; i++)
        CHECK_EQ_INT(want_rows[i], row_of[i]);
    CHECK_EQ_INT(2, counts[0]);
    CHECK_REL(11, out[0], 0);
    CHECK_REL(14, out[1], 0);
    CHECK_REL(13, out[2], 0);
    CHECK_REL(15, out[3], 0);
    /* combine: a dropped token gets nothing (it keeps its residual, the caller's) */
    const float eout[4] = {1, 2, 3, 4};
    float y[6], dx[6], deout[4] = {-7, -7, -7, -7}, dw[6];
    K->moe_unpermute(y, eout, w, idx, 6, 1, 1, 3);
    CHECK_REL(0, y[0], 0);
    CHECK_REL(0.9 * 1, y[1], 1e-6);
    CHECK_REL(0, y[2], 0);
    CHECK_REL(0.6 * 3, y[3], 1e-6);
    CHECK_REL(0.9 * 2, y[4], 1e-6);
    /* no gradient to a dropped copy: dx 0, dw 0 */
    const float dy[6] = {1, 1, 1, 1, 1, 1};
    K->moe_unpermute_bwd(deout, dw, dy, eout, w, idx, 6, 1, 1, 3);
    CHECK_REL(0, dw[0], 0);
    CHECK_REL(0, dw[2], 0);
    CHECK_REL(1, dw[1], 0);
    CHECK_REL(3, dw[3], 0);
    const float drows[4] = {5, 6, 7, 8};
    K->moe_permute_bwd(dx, drows, idx, 6, 1, 1, 3);
    CHECK_REL(0, dx[0], 0);
    CHECK_REL(5, dx[1], 0);
    CHECK_REL(0, dx[2], 0);
    CHECK_REL(6, dx[4], 0);
    /* the router's backward reads a dropped copy's score at its expert: the same gradient as
     * the undropped routing with that copy's dw zero */
    const int32_t undropped[6] = {0, 0, 0, 1, 0, 2};
    float probs[18], d1[18], d2[18];
    for (int i = 0; i < 18; i++)
        probs[i] = (float)(i % 3 + 1) / 6.0f;
    KernMoeRoute r = route(6, 3, 1, KERN_MOE_SOFTMAX);
    K->moe_route_bwd(d1, NULL, dw, probs, idx, &r);
    K->moe_route_bwd(d2, NULL, dw, probs, undropped, &r);
    for (int i = 0; i < 18; i++)
        CHECK_REL(d2[i], d1[i], 0);
    /* capacity at or above every expert's copies: nothing dropped */
    int32_t all[6] = {0, 0, 0, 1, 0, 2};
    K->moe_drop(all, w, 6, 1, 3, 4);
    for (int i = 0; i < 6; i++)
        CHECK_EQ_INT(undropped[i], all[i]);
}

/* The all-gather dispatcher's dense routing: 3 tokens over E 4, topk 2; the dense rows and
 * map, back for the experts [1, 3) in ascending order (the others dropped, keeping their
 * expert), and a dense gradient picked by a token's own order. */
static void test_dense(void)
{
    const int32_t idx[6] = {3, 1, 0, 2, -1 - 1, 2}; /* token 2's copy to expert 1 dropped */
    const float w[6] = {0.75f, 0.25f, 0.5f, 0.5f, 0.125f, 0.875f};
    float probs[12];
    uint8_t map[12];
    K->moe_dense(probs, map, idx, w, 3, 2, 4);
    const float want_p[12] = {0, 0.25f, 0, 0.75f, 0.5f, 0, 0.5f, 0, 0, 0, 0.875f, 0};
    const uint8_t want_m[12] = {0, 1, 0, 1, 1, 0, 1, 0, 0, 0, 1, 0};
    for (int i = 0; i < 12; i++) {
        CHECK_REL(want_p[i], probs[i], 0);
        CHECK_EQ_INT(want_m[i], map[i]);
    }
    int32_t li[6];
    float lw[6];
    K->moe_sparse(li, lw, probs, map, 3, 2, 4, 1, 3);
    /* token 0: experts 1, 3 (not local: -4); token 1: 0 (-1), 2; token 2: 2, then none (-1, 0) */
    const int32_t want_i[6] = {1, -4, -1, 2, 2, -1};
    const float want_w[6] = {0.25f, 0.75f, 0.5f, 0.5f, 0.875f, 0};
    for (int i = 0; i < 6; i++) {
        CHECK_EQ_INT(want_i[i], li[i]);
        CHECK_REL(want_w[i], lw[i], 0);
    }
    /* only the local copies take part: dense from (li, lw) holds experts 1 and 2 alone */
    K->moe_dense(probs, NULL, li, lw, 3, 2, 4);
    CHECK_REL(0.25f, probs[1], 0);
    CHECK_REL(0, probs[3], 0);
    CHECK_REL(0, probs[4], 0);
    CHECK_REL(0.5f, probs[6], 0);
    CHECK_REL(0.875f, probs[10], 0);
    float dw[6];
    const float g[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
    K->moe_pick(dw, g, idx, 3, 2, 4);
    const float want_dw[6] = {4, 2, 5, 7, 0, 11};
    for (int i = 0; i < 6; i++)
        CHECK_REL(want_dw[i], dw[i], 0);
}

int main(void)
{
    K = kern_cpu();
    test_softmax_topk();
    test_sigmoid();
    test_groups();
    test_force_balance();
    test_route_grads();
    test_aux();
    test_permute();
    test_permute_large();
    test_drop();
    test_dense();
    TEST_DONE("test_kernels_moe");
}
