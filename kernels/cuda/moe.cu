/* Mixture-of-experts routing, auxiliary loss and permutation in the steps of kernels/cpu/moe.c,
 * the reference these are tested against (kernels.h states the contracts, docs/moe.md the
 * model). Router scores, weights and their gradients are fp32; the permuted rows are act.
 *
 * Routing: one warp per token row (E <= KERN_MOE_MAX_EXPERTS = 1024 scores, 32 per lane at
 * most), the row's scores in shared memory. Top-k is k rounds of a warp arg-max whose order is
 * (score descending, index ascending), so that ties go to the lower index exactly as the CPU's
 * scan does; the group scores and the weights are summed in the CPU's order, so idx matches it
 * exactly whenever the scores do (always under kernels/cuda/emu, where expf is the host's).
 *
 * Permutation: row(n, k) is a stable counting sort of idx, which kernels recompute from idx on
 * every call (kernels.h) and which needs no buffer of its own: a block takes the copies of a run
 * of whole tokens, counts in shared memory every copy (for the experts' starts) and every copy
 * before its run (for the ranks within each expert), ranks its own copies among themselves, and
 * then moves the rows. Each block reads all of idx, so the cost grows as copies^2 / MOE_CHUNK
 * (4 M reads of idx for 4096 tokens x topk 8): small beside the experts' GEMMs at training
 * sizes. An expert index outside [0, E) cannot abort a kernel as the CPU's check does: such a
 * copy is left out (not counted, not moved, its dw 0). */
#include <limits.h>

#include "kernels/cuda/common.cuh"

/* ---- routing ---- */

enum { MOE_ROUTE_WARPS = 4 }; /* token rows per block */

/* Shared memory of one warp of the router: scores p[E], group scores gs[G], then the
 * eligibility bytes ok[E] and gok[G]; a multiple of 16 bytes, so the next warp's floats stay
 * aligned. */
static size_t route_smem_warp(int E, int G)
{
    const size_t bytes = (size_t)(E + G) * sizeof(float) + (size_t)(E + G);
    return (bytes + 15) & ~(size_t)15;
}

/* The arg-max over the warp by (v descending, i ascending); i == INT_MAX marks a lane with no
 * candidate. A total order, so every lane ends with the same pair. */
__device__ __forceinline__ void warp_best(float &v, int &i)
{
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(FULL_MASK, v, o);
        const int oi = __shfl_xor_sync(FULL_MASK, i, o);
        if (oi != INT_MAX && (i == INT_MAX || ov > v || (ov == v && oi < i))) {
            v = ov;
            i = oi;
        }
    }
}

/* The best of v[0..n) among those with ok[i], ties to the lower index (kernels/cpu/moe.c's
 * top_k, one round); every lane of the warp calls it and gets the answer. Each lane scans its
 * indices in ascending order and keeps the first of equal values. */
__device__ __forceinline__ int warp_top1(const float *v, const unsigned char *ok, int n)
{
    float bv = -INFINITY;
    int bi = INT_MAX;
    for (int i = threadIdx.x % 32; i < n; i += 32)
        if (ok[i] && (bi == INT_MAX || v[i] > bv)) {
            bv = v[i];
            bi = i;
        }
    warp_best(bv, bi);
    return bi;
}

__device__ __forceinline__ int renormalised(const KernMoeRoute &r)
{
    return r.score == KERN_MOE_SIGMOID || r.norm_topk;
}

__global__ void moe_route_fwd_kernel(float *probs, int32_t *idx, float *w, const float *logits,
                                     KernMoeRoute r, size_t smem_warp)
{
    // probs, logits are (N,E); idx, w are (N,topk); warp `wid` of block b does row b*WARPS+wid
    const int lane = threadIdx.x % 32, wid = threadIdx.x / 32;
    const int n = blockIdx.x * MOE_ROUTE_WARPS + wid;
    if (n >= r.N)
        return; /* the whole warp: there are no block barriers */
    const int E = r.E, K = r.topk, G = r.groups;
    float *p = reinterpret_cast<float *>(dyn_smem<unsigned char>() + (size_t)wid * smem_warp);
    float *gs = p + E;
    unsigned char *ok = reinterpret_cast<unsigned char *>(gs + G), *gok = ok + E;
    const float *x = logits + (size_t)n * E;
    float *pn = probs + (size_t)n * E;
    int32_t *ix = idx + (size_t)n * K;
    float *wn = w + (size_t)n * K;

    /* the scores (x may be pn: each lane reads its elements before it writes them) */
    if (r.score == KERN_MOE_SIGMOID) {
        for (int e = lane; e < E; e += 32)
            p[e] = 1.0f / (1.0f + expf(-x[e]));
    } else {
        float mx = -INFINITY;
        for (int e = lane; e < E; e += 32)
            mx = fmaxf(mx, x[e]);
        mx = warp_max(mx);
        double sum = 0.0;
        for (int e = lane; e < E; e += 32) {
            p[e] = expf(x[e] - mx);
            sum += p[e];
        }
        const float inv = (float)(1.0 / warp_sum_d(sum));
        for (int e = lane; e < E; e += 32)
            p[e] *= inv;
    }
    for (int e = lane; e < E; e += 32) {
        pn[e] = p[e];
        ok[e] = G > 0 ? 0 : 1;
    }
    __syncwarp();

    if (r.force_balance) {
        if (lane == 0) {
            const uint64_t g = r.first + (uint64_t)(n / r.seq_rows) * (uint64_t)r.seq_stride +
                               (uint64_t)(n % r.seq_rows);
            for (int k = 0; k < K; k++)
                ix[k] = (int32_t)((g * (uint64_t)K + (uint64_t)k) % (uint64_t)E);
        }
    } else {
        if (G > 0) {
            /* a group's score: its best score plus its second best (equal values count twice,
             * as the CPU's top-2 takes both) */
            const int per = E / G;
            for (int g = lane; g < G; g += 32) {
                const float *v = p + (size_t)g * per;
                float b1 = v[0], b2 = -INFINITY;
                for (int i = 1; i < per; i++) {
                    if (v[i] > b1) {
                        b2 = b1;
                        b1 = v[i];
                    } else if (v[i] > b2) {
                        b2 = v[i];
                    }
                }
                gs[g] = b1 + (per >= 2 ? b2 : 0.0f);
                gok[g] = 1;
            }
            __syncwarp();
            for (int j = 0; j < r.topk_groups; j++) {
                const int gb = warp_top1(gs, gok, G);
                for (int i = lane; i < per; i += 32)
                    ok[gb * per + i] = 1;
                if (lane == 0)
                    gok[gb] = 0;
                __syncwarp();
            }
        }
        for (int k = 0; k < K; k++) {
            const int b = warp_top1(p, ok, E);
            if (lane == 0) {
                ix[k] = b;
                ok[b] = 0;
            }
            __syncwarp();
        }
    }

    /* the weights: one lane, in the CPU's order */
    if (lane == 0) {
        double sum = 0.0;
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

/* kernels.h's kern_moe_expert_of on the device: a dropped copy keeps its expert as -1 - e */
__device__ __forceinline__ int expert_of(int32_t i) { return i < 0 ? -1 - i : i; }

__global__ void moe_route_bwd_kernel(float *dlogits, const float *dprobs, const float *dw,
                                     const float *probs, const int32_t *idx, KernMoeRoute r)
{
    // dlogits, dprobs, probs are (N,E); dw, idx are (N,topk); a warp per row as the forward
    const int lane = threadIdx.x % 32, wid = threadIdx.x / 32;
    const int n = blockIdx.x * MOE_ROUTE_WARPS + wid;
    if (n >= r.N)
        return;
    const int E = r.E, K = r.topk;
    float *d = dyn_smem<float>() + (size_t)wid * E;
    const float *p = probs + (size_t)n * E;
    const int32_t *ix = idx + (size_t)n * K;
    const float *dwn = dw + (size_t)n * K;
    float *dl = dlogits + (size_t)n * E;

    /* d holds d loss / d score first (dprobs may be dlogits: read here, written below) */
    for (int e = lane; e < E; e += 32)
        d[e] = dprobs ? dprobs[(size_t)n * E + e] : 0.0f;
    __syncwarp();
    if (lane == 0) {
        if (renormalised(r)) {
            /* w_k = p_k / S, S = sum_j p_j: dp_k = (dw_k - sum_j dw_j w_j) / S */
            double S = 0.0, dot = 0.0;
            /* a dropped copy's expert still holds its score (expert_of) */
            for (int k = 0; k < K; k++)
                S += p[expert_of(ix[k])];
            for (int k = 0; k < K; k++)
                dot += (double)dwn[k] * (p[expert_of(ix[k])] / S);
            for (int k = 0; k < K; k++)
                d[expert_of(ix[k])] += (float)((dwn[k] - dot) / (S + 1e-20));
        } else {
            for (int k = 0; k < K; k++)
                d[expert_of(ix[k])] += dwn[k];
        }
    }
    __syncwarp();
    if (r.score == KERN_MOE_SIGMOID) {
        for (int e = lane; e < E; e += 32)
            dl[e] = d[e] * (p[e] * (1.0f - p[e]));
    } else {
        double dot = 0.0;
        for (int e = lane; e < E; e += 32)
            dot += (double)p[e] * d[e];
        dot = warp_sum_d(dot);
        for (int e = lane; e < E; e += 32)
            dl[e] = p[e] * (float)(d[e] - dot);
    }
}

static void check_route(const KernMoeRoute *r)
{
    KERN_CHECK(r->N >= 0 && r->E >= 1 && r->E <= KERN_MOE_MAX_EXPERTS && r->topk >= 1 &&
                   r->topk <= r->E,
               "moe: experts or topk out of range");
    KERN_CHECK(r->groups == 0 ||
                   (r->groups > 0 && r->E % r->groups == 0 && r->topk_groups >= 1 &&
                    r->topk_groups <= r->groups &&
                    r->topk <= r->topk_groups * (r->E / r->groups)),
               "moe: groups must divide the experts and hold topk of them");
    KERN_CHECK(!r->force_balance || r->seq_rows >= 1, "moe: force_balance needs seq_rows");
}

static unsigned route_blocks(int N)
{
    return (unsigned)((N + MOE_ROUTE_WARPS - 1) / MOE_ROUTE_WARPS);
}

static void moe_route_fwd(float *probs, int32_t *idx, float *w, const float *logits,
                          const KernMoeRoute *r)
{
    check_route(r);
    if (r->N == 0)
        return;
    /* at most 4 x (2048 x 4 + 2048) bytes = 40 KiB: within the default 48 KiB */
    const size_t warp_bytes = route_smem_warp(r->E, r->groups);
    KLAUNCH(moe_route_fwd_kernel, route_blocks(r->N), MOE_ROUTE_WARPS * 32,
            MOE_ROUTE_WARPS * warp_bytes, probs, idx, w, logits, *r, warp_bytes);
}

static void moe_route_bwd(float *dlogits, const float *dprobs, const float *dw,
                          const float *probs, const int32_t *idx, const KernMoeRoute *r)
{
    check_route(r);
    if (r->N == 0)
        return;
    KLAUNCH(moe_route_bwd_kernel, route_blocks(r->N), MOE_ROUTE_WARPS * 32,
            MOE_ROUTE_WARPS * (size_t)r->E * sizeof(float), dlogits, dprobs, dw, probs, idx, *r);
}

/* ---- counts and the auxiliary loss (fp32) ---- */

__global__ void moe_counts_kernel(float *counts, const int32_t *idx, size_t copies, int E)
{
    // counts is (E), zeroed by the caller; idx is (copies); integers, so exact in any order
    GRID_STRIDE(i, copies)
    {
        const int e = idx[i];
        if (e >= 0 && e < E)
            atomicAdd(&counts[e], 1.0f);
    }
}

/* Token dropping (kernels.h's moe_drop): a thread per copy counts the copies of its expert
 * ahead of it by weight (ties to the lower index) and marks itself dropped at capacity or more.
 * The marks keep the expert, so the scans read the same experts whether a mark landed yet or
 * not. O(copies^2) reads, for the sizes the executor's tests and small runs use. */
__global__ void moe_drop_kernel(int32_t *idx, const float *w, size_t copies, int capacity)
{
    GRID_STRIDE(i, copies)
    {
        const int e = idx[i];
        if (e < 0)
            continue;
        const float wi = w[i];
        int ahead = 0;
        for (size_t j = 0; j < copies && ahead < capacity; j++)
            if (j != i && expert_of(idx[j]) == e && (w[j] > wi || (w[j] == wi && j < i)))
                ahead++;
        if (ahead >= capacity)
            idx[i] = -1 - e;
    }
}

static void moe_drop(int32_t *idx, const float *w, int N, int topk, int E, int capacity)
{
    KERN_CHECK(E >= 1 && E <= KERN_MOE_MAX_EXPERTS && N >= 0 && topk >= 1 && capacity >= 0,
               "moe_drop: sizes");
    const size_t copies = (size_t)N * (size_t)topk;
    if (copies)
        KLAUNCH_N(moe_drop_kernel, copies, idx, w, copies, capacity);
}

enum { MOE_AUX_THREADS = 512 };

/* One block: sum_e counts_e sum_n probs[n,e] = sum over every (n, e) of counts_e probs[n,e],
 * in double and in a fixed order (deterministic from run to run). */
__global__ void moe_aux_fwd_kernel(float *loss, const float *probs, const float *counts,
                                   size_t n, int E, float scale)
{
    double s = 0.0;
    for (size_t i = threadIdx.x; i < n; i += blockDim.x)
        s += (double)counts[i % (size_t)E] * probs[i];
    s = block_sum_d(s);
    if (threadIdx.x == 0)
        *loss = (float)(scale * s);
}

__global__ void moe_aux_bwd_kernel(float *dprobs, const float *counts, size_t n, int E,
                                   float scale)
{
    GRID_STRIDE(i, n)
        dprobs[i] = scale * counts[i % (size_t)E];
}

static void moe_counts(float *counts, const int32_t *idx, int N, int topk, int E)
{
    KERN_CHECK(E >= 1 && N >= 0 && topk >= 1, "moe_counts: sizes");
    cudaCheck(cudaMemsetAsync(counts, 0, (size_t)E * sizeof *counts, 0));
    const size_t copies = (size_t)N * (size_t)topk;
    if (copies)
        KLAUNCH_N(moe_counts_kernel, copies, counts, idx, copies, E);
}

static void moe_aux_fwd(float *loss, const float *probs, const float *counts, int N, int E,
                        float scale)
{
    KERN_CHECK(N >= 0 && E >= 1, "moe_aux_fwd: sizes");
    KLAUNCH(moe_aux_fwd_kernel, 1, MOE_AUX_THREADS, 0, loss, probs, counts,
            (size_t)N * (size_t)E, E, scale);
}

static void moe_aux_bwd(float *dprobs, const float *counts, int N, int E, float scale)
{
    KERN_CHECK(N >= 0 && E >= 1, "moe_aux_bwd: sizes");
    const size_t n = (size_t)N * (size_t)E;
    if (n)
        KLAUNCH_N(moe_aux_bwd_kernel, n, dprobs, counts, n, E, scale);
}

/* ---- the permutation ---- */

/* A block's run of tokens holds at most MOE_CHUNK copies: MOE_CHUNK / topk tokens, or one token
 * when topk is larger (topk <= E <= KERN_MOE_MAX_EXPERTS = MOE_CHUNK). */
enum { MOE_PERM_THREADS = 256, MOE_CHUNK = KERN_MOE_MAX_EXPERTS };

static int perm_tokens(int topk) { return topk >= MOE_CHUNK ? 1 : MOE_CHUNK / topk; }

/* The block's copies c0 .. c0+cc (cc <= MOE_CHUNK) into rows[0..cc): their rows of the
 * expert-grouped order, -1 for an expert out of range; total[E] the copies of each expert.
 * Every thread of the block calls it (it has barriers). */
__device__ void perm_rows(int *rows, int *total, const int32_t *idx, size_t copies, size_t c0,
                          int cc, int E)
{
    __shared__ int before[KERN_MOE_MAX_EXPERTS]; /* copies ahead of the run, then the run's start */
    __shared__ int cidx[MOE_CHUNK];
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        total[e] = 0;
        before[e] = 0;
    }
    __syncthreads();
    for (size_t j = threadIdx.x; j < copies; j += blockDim.x) {
        const int e = idx[j];
        if (e >= 0 && e < E) {
            atomicAdd(&total[e], 1);
            if (j < c0)
                atomicAdd(&before[e], 1);
        }
    }
    for (int j = threadIdx.x; j < cc; j += blockDim.x)
        cidx[j] = idx[c0 + (size_t)j];
    __syncthreads();
    /* the experts' starts: an exclusive scan of total, E <= 1024 steps on one thread */
    if (threadIdx.x == 0) {
        int start = 0;
        for (int e = 0; e < E; e++) {
            before[e] += start;
            start += total[e];
        }
    }
    __syncthreads();
    /* ranks within the run: the earlier copies of the same expert (stable) */
    for (int j = threadIdx.x; j < cc; j += blockDim.x) {
        const int e = cidx[j];
        if (e < 0 || e >= E) {
            rows[j] = -1;
            continue;
        }
        int r = before[e];
        for (int m = 0; m < j; m++)
            r += cidx[m] == e;
        rows[j] = r;
    }
    __syncthreads();
}

/* The run of block b: tokens n0 .. n0+nt, copies c0 = n0*topk .. c0+cc. */
struct PermRun {
    int n0, nt, cc;
    size_t c0;
};

__device__ __forceinline__ PermRun perm_run(int N, int topk, int tokens)
{
    PermRun run;
    run.n0 = blockIdx.x * tokens;
    run.nt = N - run.n0 < tokens ? N - run.n0 : tokens;
    run.c0 = (size_t)run.n0 * (size_t)topk;
    run.cc = run.nt * topk;
    return run;
}

template <typename T>
__global__ void moe_permute_kernel(T *out, int32_t *counts, int32_t *row_of, const T *x,
                                   const int32_t *idx, int N, int C, int topk, int E, int tokens)
{
    // out is (N*topk,C); x is (N,C); counts is (E); row_of, idx are (N,topk)
    __shared__ int rows[MOE_CHUNK], total[KERN_MOE_MAX_EXPERTS];
    const PermRun run = perm_run(N, topk, tokens);
    perm_rows(rows, total, idx, (size_t)N * (size_t)topk, run.c0, run.cc, E);
    if (blockIdx.x == 0)
        for (int e = threadIdx.x; e < E; e += blockDim.x)
            counts[e] = total[e];
    if (row_of)
        for (int j = threadIdx.x; j < run.cc; j += blockDim.x)
            row_of[run.c0 + (size_t)j] = rows[j];
    const size_t n = (size_t)run.cc * (size_t)C;
    for (size_t t = threadIdx.x; t < n; t += blockDim.x) {
        const size_t j = t / (size_t)C, c = t % (size_t)C;
        const size_t tok = (run.c0 + j) / (size_t)topk;
        if (rows[j] >= 0)
            out[(size_t)rows[j] * C + c] = x[tok * C + c];
    }
}

template <typename T>
__global__ void moe_permute_bwd_kernel(T *dx, const T *dout, const int32_t *idx, int N, int C,
                                       int topk, int E, int tokens)
{
    // dx is (N,C); dout is (N*topk,C); dx[n] = sum over k in order, in fp32, rounded once
    __shared__ int rows[MOE_CHUNK], total[KERN_MOE_MAX_EXPERTS];
    const PermRun run = perm_run(N, topk, tokens);
    perm_rows(rows, total, idx, (size_t)N * (size_t)topk, run.c0, run.cc, E);
    const size_t n = (size_t)run.nt * (size_t)C;
    for (size_t t = threadIdx.x; t < n; t += blockDim.x) {
        const size_t i = t / (size_t)C, c = t % (size_t)C;
        float acc = 0.0f;
        for (int k = 0; k < topk; k++) {
            const int r = rows[i * (size_t)topk + (size_t)k];
            if (r >= 0)
                acc += to_f(dout[(size_t)r * C + c]);
        }
        dx[((size_t)run.n0 + i) * C + c] = from_f<T>(acc);
    }
}

template <typename T>
__global__ void moe_unpermute_kernel(T *y, const T *eout, const float *w, const int32_t *idx,
                                     int N, int C, int topk, int E, int tokens)
{
    // y is (N,C); eout is (N*topk,C); w, idx are (N,topk)
    __shared__ int rows[MOE_CHUNK], total[KERN_MOE_MAX_EXPERTS];
    const PermRun run = perm_run(N, topk, tokens);
    perm_rows(rows, total, idx, (size_t)N * (size_t)topk, run.c0, run.cc, E);
    const size_t n = (size_t)run.nt * (size_t)C;
    for (size_t t = threadIdx.x; t < n; t += blockDim.x) {
        const size_t i = t / (size_t)C, c = t % (size_t)C;
        float acc = 0.0f;
        for (int k = 0; k < topk; k++) {
            const size_t j = i * (size_t)topk + (size_t)k;
            const int r = rows[j];
            if (r >= 0)
                acc += w[run.c0 + j] * to_f(eout[(size_t)r * C + c]);
        }
        y[((size_t)run.n0 + i) * C + c] = from_f<T>(acc);
    }
}

template <typename T>
__global__ void moe_unpermute_bwd_kernel(T *deout, float *dw, const T *dy, const T *eout,
                                         const float *w, const int32_t *idx, int N, int C,
                                         int topk, int E, int tokens)
{
    // deout, eout are (N*topk,C); dy is (N,C); dw, w, idx are (N,topk)
    __shared__ int rows[MOE_CHUNK], total[KERN_MOE_MAX_EXPERTS];
    const PermRun run = perm_run(N, topk, tokens);
    perm_rows(rows, total, idx, (size_t)N * (size_t)topk, run.c0, run.cc, E);
    const size_t n = (size_t)run.cc * (size_t)C;
    for (size_t t = threadIdx.x; t < n; t += blockDim.x) {
        const size_t j = t / (size_t)C, c = t % (size_t)C;
        const size_t tok = (run.c0 + j) / (size_t)topk;
        if (rows[j] >= 0)
            deout[(size_t)rows[j] * C + c] = from_f<T>(w[run.c0 + j] * to_f(dy[tok * C + c]));
    }
    /* dw: a warp per copy, the dot product over C in fp32 */
    const int lane = threadIdx.x % 32, warps = blockDim.x / 32;
    for (int j = threadIdx.x / 32; j < run.cc; j += warps) {
        const int r = rows[j];
        const size_t tok = (run.c0 + (size_t)j) / (size_t)topk;
        float acc = 0.0f;
        if (r >= 0)
            for (int c = lane; c < C; c += 32)
                acc += to_f(dy[tok * C + c]) * to_f(eout[(size_t)r * C + c]);
        acc = warp_sum(acc);
        if (lane == 0)
            dw[run.c0 + (size_t)j] = acc;
    }
}

static void check_perm(int N, int C, int topk, int E, const char *what)
{
    KERN_CHECK(E >= 1 && E <= KERN_MOE_MAX_EXPERTS && N >= 0 && C >= 0 && topk >= 1 &&
                   topk <= E,
               what);
}

static unsigned perm_blocks(int N, int tokens) { return (unsigned)((N + tokens - 1) / tokens); }

template <typename T>
static void moe_permute(void *out, int32_t *counts, int32_t *row_of, const void *x,
                        const int32_t *idx, int N, int C, int topk, int E)
{
    check_perm(N, C, topk, E, "moe_permute: sizes or experts out of range");
    if (N == 0) {
        cudaCheck(cudaMemsetAsync(counts, 0, (size_t)E * sizeof *counts, 0));
        return;
    }
    const int tokens = perm_tokens(topk);
    KLAUNCH(moe_permute_kernel<T>, perm_blocks(N, tokens), MOE_PERM_THREADS, 0, (T *)out, counts,
            row_of, (const T *)x, idx, N, C, topk, E, tokens);
}

template <typename T>
static void moe_permute_bwd(void *dx, const void *dout, const int32_t *idx, int N, int C,
                            int topk, int E)
{
    check_perm(N, C, topk, E, "moe_permute_bwd: sizes or experts out of range");
    if (N == 0)
        return;
    const int tokens = perm_tokens(topk);
    KLAUNCH(moe_permute_bwd_kernel<T>, perm_blocks(N, tokens), MOE_PERM_THREADS, 0, (T *)dx,
            (const T *)dout, idx, N, C, topk, E, tokens);
}

template <typename T>
static void moe_unpermute(void *y, const void *eout, const float *w, const int32_t *idx, int N,
                          int C, int topk, int E)
{
    check_perm(N, C, topk, E, "moe_unpermute: sizes or experts out of range");
    if (N == 0)
        return;
    const int tokens = perm_tokens(topk);
    KLAUNCH(moe_unpermute_kernel<T>, perm_blocks(N, tokens), MOE_PERM_THREADS, 0, (T *)y,
            (const T *)eout, w, idx, N, C, topk, E, tokens);
}

template <typename T>
static void moe_unpermute_bwd(void *deout, float *dw, const void *dy, const void *eout,
                              const float *w, const int32_t *idx, int N, int C, int topk, int E)
{
    check_perm(N, C, topk, E, "moe_unpermute_bwd: sizes or experts out of range");
    if (N == 0)
        return;
    const int tokens = perm_tokens(topk);
    KLAUNCH(moe_unpermute_bwd_kernel<T>, perm_blocks(N, tokens), MOE_PERM_THREADS, 0, (T *)deout,
            dw, (const T *)dy, (const T *)eout, w, idx, N, C, topk, E, tokens);
}

template <typename T> static void fill(KernBackend *k)
{
    k->moe_permute = moe_permute<T>;
    k->moe_permute_bwd = moe_permute_bwd<T>;
    k->moe_unpermute = moe_unpermute<T>;
    k->moe_unpermute_bwd = moe_unpermute_bwd<T>;
}

/* ---- the all-gather dispatcher's dense routing (kernels.h's moe_dense, moe_sparse, moe_pick):
 * a thread per token, topk and E small ---- */

__global__ void moe_dense_kernel(float *probs, uint8_t *map, const int32_t *idx, const float *w,
                                 int N, int topk, int E)
{
    GRID_STRIDE(n, (size_t)N)
    {
        float *p = probs + n * (size_t)E;
        for (int e = 0; e < E; e++)
            p[e] = 0.0f;
        if (map)
            for (int e = 0; e < E; e++)
                map[n * (size_t)E + (size_t)e] = 0;
        for (int k = 0; k < topk; k++) {
            const int e = idx[n * (size_t)topk + (size_t)k];
            if (e < 0 || e >= E)
                continue;
            p[e] = w[n * (size_t)topk + (size_t)k];
            if (map)
                map[n * (size_t)E + (size_t)e] = 1;
        }
    }
}

__global__ void moe_sparse_kernel(int32_t *idx, float *w, const float *probs, const uint8_t *map,
                                  int N, int topk, int E, int e0, int e1)
{
    GRID_STRIDE(n, (size_t)N)
    {
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

__global__ void moe_pick_kernel(float *dw, const float *probs, const int32_t *idx, size_t copies,
                                int topk, int E)
{
    GRID_STRIDE(i, copies)
    {
        const int e = idx[i];
        dw[i] = e >= 0 && e < E ? probs[i / (size_t)topk * (size_t)E + (size_t)e] : 0.0f;
    }
}

static void moe_dense(float *probs, uint8_t *map, const int32_t *idx, const float *w, int N,
                      int topk, int E)
{
    KERN_CHECK(E >= 1 && N >= 0 && topk >= 1, "moe_dense: sizes");
    if (N > 0)
        KLAUNCH_N(moe_dense_kernel, (size_t)N, probs, map, idx, w, N, topk, E);
}

static void moe_sparse(int32_t *idx, float *w, const float *probs, const uint8_t *map, int N,
                       int topk, int E, int e0, int e1)
{
    KERN_CHECK(E >= 1 && N >= 0 && topk >= 1 && 0 <= e0 && e0 <= e1 && e1 <= E,
               "moe_sparse: sizes");
    if (N > 0)
        KLAUNCH_N(moe_sparse_kernel, (size_t)N, idx, w, probs, map, N, topk, E, e0, e1);
}

static void moe_pick(float *dw, const float *probs, const int32_t *idx, int N, int topk, int E)
{
    KERN_CHECK(E >= 1 && N >= 0 && topk >= 1, "moe_pick: sizes");
    const size_t copies = (size_t)N * (size_t)topk;
    if (copies)
        KLAUNCH_N(moe_pick_kernel, copies, dw, probs, idx, copies, topk, E);
}

void kern_cuda_table_moe(KernBackend *k)
{
    if (k->act == PX_FP32)
        fill<float>(k);
    else if (k->act == PX_BF16)
        fill<__nv_bfloat16>(k);
    else
        fill<__half>(k);
    k->moe_route_fwd = moe_route_fwd;
    k->moe_route_bwd = moe_route_bwd;
    k->moe_counts = moe_counts;
    k->moe_drop = moe_drop;
    k->moe_aux_fwd = moe_aux_fwd;
    k->moe_aux_bwd = moe_aux_bwd;
    k->moe_dense = moe_dense;
    k->moe_sparse = moe_sparse;
    k->moe_pick = moe_pick;
}
