/* Initial weights that do not depend on the layout: each element's value is a function of
 * (seed, the full parameter's name, the element's index in the full tensor), drawn from a
 * counter-based generator, so a run sharded over TP, PP or DP ranks starts from the same model
 * as a single rank. GPT-2's scheme (Radford et al. 2019, as nanoGPT and llm.c apply it):
 * normal(0, 0.02) for matrices and embeddings, the residual output projections (attn.proj.w,
 * mlp.fc2.w) scaled by 1/sqrt(2 * layers), biases 0, norm weights 1. */
#define _GNU_SOURCE /* sched_getaffinity: the cores this rank may run on */
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "exec/train/internal.h"

#define EXEC_TWO_PI 6.283185307179586476925

/* FNV-1a of the name, mixed with the seed: the key of a parameter's stream. */
uint64_t exec_hash_name(uint64_t seed, const char *name)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (const unsigned char *p = (const unsigned char *)name; *p; p++)
        h = (h ^ *p) * 0x100000001b3ull;
    return px_mix64(px_mix64(seed) ^ h);
}

/* Box-Muller on the pair index / 2: the even element takes the cosine, the odd one the sine,
 * so every element is still a function of its own index alone. */
double exec_init_normal(uint64_t seed, const char *name, uint64_t index)
{
    uint64_t key = exec_hash_name(seed, name), pair = index >> 1;
    uint64_t a = px_mix64(key ^ px_mix64(2 * pair));
    uint64_t b = px_mix64(key ^ px_mix64(2 * pair + 1));
    double u1 = ((double)(a >> 11) + 1.0) * (1.0 / 9007199254740992.0); /* (0, 1] */
    double u2 = (double)(b >> 11) * (1.0 / 9007199254740992.0);         /* [0, 1) */
    double r = sqrt(-2.0 * log(u1));
    return (index & 1) ? r * sin(EXEC_TWO_PI * u2) : r * cos(EXEC_TWO_PI * u2);
}

/* w[i] = std * normal(full index start + i) for i < n: exec_init_normal's draws, each pair's
 * uniforms computed once. */
static void fill_normal(float *w, uint64_t key, uint64_t start, uint64_t n, double std)
{
    uint64_t i = 0;
    while (i < n) {
        const uint64_t f = start + i, pair = f >> 1;
        uint64_t a = px_mix64(key ^ px_mix64(2 * pair));
        uint64_t b = px_mix64(key ^ px_mix64(2 * pair + 1));
        double u1 = ((double)(a >> 11) + 1.0) * (1.0 / 9007199254740992.0);
        double u2 = (double)(b >> 11) * (1.0 / 9007199254740992.0);
        double r = sqrt(-2.0 * log(u1));
        if (!(f & 1)) {
            w[i++] = (float)(std * r * cos(EXEC_TWO_PI * u2));
            if (i < n)
                w[i++] = (float)(std * r * sin(EXEC_TWO_PI * u2));
        } else {
            w[i++] = (float)(std * r * sin(EXEC_TWO_PI * u2));
        }
    }
}

/* The full tensor's row of local row `row` of p (tensor parallelism's slices, docs/executor.md):
 * QKV rows are this rank's Q heads, then its K heads, then its V heads; SwiGLU's fc1 rows its
 * gate slice, then its up slice; a vocabulary or GeLU fc1 slice its rows tp * rows ... */
static int64_t full_row(const ExecCtx *x, const ExecParam *p, int64_t row)
{
    const ModelDims *d = &x->d;
    const ModelConfig *c = &x->spec.model;
    const int64_t tp = x->g.tp_rank;
    switch (p->map) {
    case EXEC_MAP_QKV: {
        const int64_t q = d->q_loc, kv = d->kv_width_loc;
        const int64_t qf = (int64_t)c->heads * c->head_dim, kvf = (int64_t)c->kv_heads * c->head_dim;
        if (row < q)
            return tp * q + row;
        if (row < q + kv)
            return qf + tp * kv + (row - q);
        return qf + kvf + tp * kv + (row - q - kv);
    }
    case EXEC_MAP_SWIGLU: {
        /* a MoE layer's MLP is its shared experts, shared_ffn wide */
        const int moe = p->layer >= 0 && model_layer_is_moe(c, p->layer);
        const int64_t f = moe ? d->sff_loc : d->ffn_loc, full = moe ? c->moe.shared_ffn : c->ffn_hidden;
        return row < f ? tp * f + row : full + tp * f + (row - f);
    }
    case EXEC_MAP_EXPERTS:
    case EXEC_MAP_EXPERTS_FC2: /* whole rows of this rank's experts, a slice of columns */
        return (int64_t)x->g.ep_rank * p->rows + row;
    case EXEC_MAP_EXPERTS_FC1: {
        /* local expert l's rows: with SwiGLU its gate slice, then its up slice, of an
         * expert's 2 F; with GeLU its slice of F */
        const int64_t f = d->eff_loc, fo = d->eff_out_loc, F = c->moe.expert_ffn;
        const int64_t e = (int64_t)x->g.ep_rank * d->experts_loc + row / fo, r = row % fo;
        const int64_t at = x->g.etp_rank * f;
        if (c->mlp != MODEL_SWIGLU)
            return e * F + at + r;
        return e * 2 * F + (r < f ? at + r : F + at + (r - f));
    }
    case EXEC_MAP_ROWS:
        return tp * p->rows + row;
    case EXEC_MAP_KV_B: {
        /* the full tensor's rows: every head's non-rotary key, then every head's value */
        const ModelMla *m = &c->mla;
        const int64_t k = (int64_t)d->heads_loc * m->qk_nope_dim;
        const int64_t v = (int64_t)d->heads_loc * m->v_dim;
        return row < k ? tp * k + row : (int64_t)c->heads * m->qk_nope_dim + tp * v + (row - k);
    }
    default:
        return row;
    }
}

/* Writes local elements [lo, hi) of parameter p into dst. */
static void init_range(const ExecCtx *x, const ExecParam *p, uint64_t lo, uint64_t hi, float *dst)
{
    const ModelConfig *c = &x->spec.model;
    if (exec_is_bias(p->role)) {
        memset(dst, 0, (size_t)(hi - lo) * sizeof *dst);
        return;
    }
    if (p->norm) {
        for (uint64_t e = lo; e < hi; e++)
            dst[e - lo] = 1.0f;
        return;
    }
    const int vocab_rows = p->role == MODEL_TR_WTE || p->role == MODEL_TR_LOGITS_W;
    const int out_proj = p->role == MODEL_TR_PROJ_W || p->role == MODEL_TR_FC2_W ||
                         p->role == MODEL_TR_EXP_FC2_W;
    const double std = out_proj ? 0.02 / sqrt(2.0 * c->layers) : 0.02;
    const uint64_t key = exec_hash_name(x->spec.job.seed, p->init_name);
    const uint64_t cols = (uint64_t)p->cols;
    const uint64_t full_cols = p->map == EXEC_MAP_COLS          ? cols * (uint64_t)x->d.t
                               : p->map == EXEC_MAP_EXPERTS_FC2 ? cols * (uint64_t)x->d.etp
                                                                : cols;
    /* one local row at a time: a contiguous run of the full tensor */
    for (uint64_t e = lo; e < hi;) {
        const uint64_t row = e / cols, col = e % cols;
        uint64_t n = cols - col;
        if (e + n > hi)
            n = hi - e;
        const int64_t fr = full_row(x, p, (int64_t)row);
        /* rows of the vocabulary padding stay 0: their logits are masked anyway, and the
         * padding depends on tp */
        if (vocab_rows && fr >= c->vocab) {
            memset(dst + (e - lo), 0, (size_t)n * sizeof *dst);
        } else {
            uint64_t start = (uint64_t)fr * full_cols + col;
            if (p->map == EXEC_MAP_COLS)
                start += (uint64_t)x->g.tp_rank * cols;
            else if (p->map == EXEC_MAP_EXPERTS_FC2)
                start += (uint64_t)x->g.etp_rank * cols;
            fill_normal(dst + (e - lo), key, start, n, std);
        }
        e += n;
    }
}

/* The host threads that draw the initial values: the cores this rank may run on (one where
 * the launcher binds each rank to a core, as mpirun does on the CPU), at most 32. */
enum { INIT_MAX_THREADS = 32, INIT_MIN_PER_THREAD = 1 << 20 };

static int init_threads(void)
{
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) != 0)
        return 1;
    const int n = CPU_COUNT(&set);
    return n < 1 ? 1 : n > INIT_MAX_THREADS ? INIT_MAX_THREADS : n;
}

typedef struct {
    const ExecCtx *x;
    const ExecParam *p;
    uint64_t lo, hi;
    float *dst;
} InitPart;

static void *init_part(void *arg)
{
    const InitPart *a = arg;
    init_range(a->x, a->p, a->lo, a->hi, a->dst);
    return NULL;
}

/* init_range over [lo, hi) cut into one part per thread: every element is a function of its
 * own index, so the values are the same however the range is cut (a thread that cannot be
 * started draws its part here). A large model's weights took a minute on one core. */
static void init_range_threads(const ExecCtx *x, const ExecParam *p, uint64_t lo, uint64_t hi,
                               float *dst, int threads)
{
    const uint64_t n = hi - lo;
    int parts = threads;
    if ((uint64_t)parts > n / INIT_MIN_PER_THREAD)
        parts = (int)(n / INIT_MIN_PER_THREAD);
    if (parts <= 1) {
        init_range(x, p, lo, hi, dst);
        return;
    }
    InitPart a[INIT_MAX_THREADS];
    pthread_t th[INIT_MAX_THREADS];
    int started[INIT_MAX_THREADS] = {0};
    for (int i = 0; i < parts; i++) {
        const uint64_t b = lo + n * (uint64_t)i / (uint64_t)parts;
        const uint64_t e = lo + n * (uint64_t)(i + 1) / (uint64_t)parts;
        a[i] = (InitPart){x, p, b, e, dst + (b - lo)};
    }
    for (int i = 1; i < parts; i++)
        started[i] = pthread_create(&th[i], NULL, init_part, &a[i]) == 0;
    init_part(&a[0]);
    for (int i = 1; i < parts; i++) {
        if (started[i])
            pthread_join(th[i], NULL);
        else
            init_part(&a[i]);
    }
}

/* n initial values of the fp32 master from src, in host memory (src_host) or in a device
 * scratch. Under optimizer offload the master arena is host memory (bind.c), so they leave the
 * device or stay on the host. */
static void master_put(const ExecCtx *x, float *master, const float *src, uint64_t n,
                       int src_host)
{
    const size_t bytes = (size_t)n * sizeof *src;
    if (model_category_on_host(&x->spec.layout, MODEL_MASTER)) {
        if (src_host)
            memcpy(master, src, bytes);
        else
            x->k->to_host(master, src, bytes);
    } else if (src_host) {
        x->k->to_device(master, src, bytes);
    } else {
        x->k->copy(master, src, bytes);
    }
}

/* 16-bit gradients are too narrow to stage fp32 values in: the host narrows the n values
 * (round to nearest even, as cast_to_act does) into h16 for the weights w, and m_n of them from
 * m_lo go to the fp32 master from the host too. */
static void init_put_16(const ExecCtx *x, uint16_t *h16, void *w, float *master, const float *host,
                        uint64_t n, uint64_t m_lo, uint64_t m_n)
{
    if (m_n)
        master_put(x, master, host + m_lo, m_n, 1);
    if (!w) /* an FP8 parameter: its weights come from its master (exec_pg_updated) */
        return;
    for (uint64_t i = 0; i < n; i++)
        h16[i] = x->act == PX_BF16 ? px_float_to_bf16(host[i]) : px_float_to_half(host[i]);
    x->k->to_device(w, h16, (size_t)n * sizeof *h16);
}

/* Every parameter's initial values are computed on the host in fp32 and go to the device through
 * an fp32 scratch (the parameter's own gradient buffer, or ZeRO-2/3's gradient bucket without a
 * pipeline, both
 * zeroed again at the end): from there they are narrowed into the act weights and copied into
 * the fp32 master weights of this rank's shard. On the CPU (fp32, no master) they go straight
 * into the weights. */
int exec_params_init_values(ExecParams *P, const ExecCtx *x, ExecArenas *A, float *bucket,
                            uint64_t bucket_elems, int *threads_out, PxError *err)
{
    const KernBackend *k = x->k;
    const int zero = x->spec.layout.zero, master = x->d.master, threads = init_threads();
    *threads_out = threads;
    uint64_t most = 1;
    for (int i = 0; i < P->n; i++)
        if (P->p[i].numel > most)
            most = P->p[i].numel;
    float *host = malloc((size_t)most * sizeof *host);
    uint16_t *h16 = x->grad != PX_FP32 ? malloc((size_t)most * sizeof *h16) : NULL;
    if (!host || (x->grad != PX_FP32 && !h16)) {
        free(host);
        free(h16);
        return px_fail(err, PX_ERUNTIME, "out of host memory initializing the weights (%.1f MiB)",
                       (double)most * 4.0 / (1024.0 * 1024.0));
    }
    for (int i = 0; i < P->n; i++) {
        const ExecParam *p = &P->p[i];
        const ExecBlock *blk = &P->b[p->block];
        float *scratch = exec_zero_bucketed(x) ? bucket : p->g;
        uint64_t lo, hi;
        const int has_shard = exec_params_own(P, p, &lo, &hi);
        /* the master (and optimizer state) index of block offset o */
        const uint64_t moff = zero == 0 ? 0 : blk->own_off;
        if (h16 && zero < 3) {
            init_range_threads(x, p, 0, p->numel, host, threads);
            init_put_16(x, h16, p->w, has_shard ? blk->master + (lo - moff) : NULL, host, p->numel,
                        lo - p->off, has_shard ? hi - lo : 0);
            continue;
        }
        if (h16) { /* ZeRO-3: this rank's shard */
            if (has_shard) {
                init_range_threads(x, p, lo - p->off, hi - p->off, host, threads);
                init_put_16(x, h16, EXEC_AT(blk->w_shard, lo - blk->own_off, x->ab),
                            blk->master + (lo - blk->own_off), host, hi - lo, 0, hi - lo);
            }
            continue;
        }
        if (zero < 3) {
            init_range_threads(x, p, 0, p->numel, host, threads);
            if (!master) {
                k->to_device(p->w, host, (size_t)p->numel * sizeof *host);
                continue;
            }
            k->to_device(scratch, host, (size_t)p->numel * sizeof *host);
            /* an FP8 parameter's weights come from its master (exec_pg_updated) */
            if (p->w)
                k->cast_to_act(p->w, scratch, (size_t)p->numel);
            if (has_shard)
                master_put(x, blk->master + (lo - moff), scratch + (lo - p->off), hi - lo, 0);
            continue;
        }
        /* ZeRO-3: only this rank's shard of the block exists */
        if (!has_shard)
            continue;
        init_range_threads(x, p, lo - p->off, hi - p->off, host, threads);
        void *w = EXEC_AT(blk->w_shard, lo - blk->own_off, x->ab);
        if (!master) {
            k->to_device(w, host, (size_t)(hi - lo) * sizeof *host);
            continue;
        }
        k->to_device(scratch, host, (size_t)(hi - lo) * sizeof *host);
        k->cast_to_act(w, scratch, (size_t)(hi - lo));
        master_put(x, blk->master + (lo - blk->own_off), scratch, hi - lo, 0);
    }
    free(host);
    free(h16);
    /* ZeRO-3's padding at the end of a shard is never a parameter: keep it 0 */
    for (int b = 0; zero == 3 && b < P->nb; b++) {
        const ExecBlock *blk = &P->b[b];
        if (blk->own_n < blk->shard)
            k->memset0(EXEC_AT(blk->w_shard, blk->own_n, x->ab),
                       (size_t)(blk->shard - blk->own_n) * x->ab);
    }
    /* the scratch held weights: gradients start from zero */
    if (master || zero >= 2) {
        if (A->a[MODEL_GRADS].base)
            k->memset0(A->a[MODEL_GRADS].base, A->a[MODEL_GRADS].cap);
        if (bucket)
            k->memset0(bucket, (size_t)bucket_elems * x->gb);
    }
    k->sync();
    return PX_OK;
}
