/* Pipeline schedules: the order of forward and backward passes on one stage.
 *
 * GPipe (Huang et al. 2019): every forward, then every backward.
 * 1F1B (Narayanan et al. 2021, PipeDream-Flush): stage s runs min(p-s-1, m) warm-up forwards,
 * then alternates one forward and one backward, then drains the remaining backwards.
 * Interleaved 1F1B (Narayanan et al. 2021, Sec. 2.2.2): each rank holds v model chunks; the
 * order is Megatron-LM's: (p-s-1)*2 + (v-1)*p warm-up micro-steps, forward micro-step k runs
 * chunk (k / p) % v, backward micro-step k runs chunk v-1 - (k / p) % v, and micro-batches
 * advance in groups of p. */
#include <stdlib.h>

#include "model/model.h"

static void fwd_slot(const ModelDims *d, int k, int backward, ModelAction *a)
{
    int group = k / (d->p * d->v);
    int in_group = k % (d->p * d->v);
    int chunk = in_group / d->p;
    a->backward = backward;
    a->chunk = backward ? d->v - 1 - chunk : chunk;
    a->mb = group * d->p + in_group % d->p;
}

/* Emits one stage's actions in order: into out when given, and into the live counts when
 * given (the walk model_schedule_live does, without storing the actions). */
typedef struct {
    ModelAction *out;
    int n;
    int live, most, *cur, *max_live; /* cur, max_live: v entries, with the counts only */
} Walk;

static void emit(Walk *w, ModelAction a)
{
    if (w->out)
        w->out[w->n] = a;
    w->n++;
    if (!w->max_live)
        return;
    int c = a.chunk;
    if (!a.backward) {
        w->live++;
        if (++w->cur[c] > w->max_live[c])
            w->max_live[c] = w->cur[c];
    } else {
        w->live--;
        w->cur[c]--;
    }
    if (w->live > w->most)
        w->most = w->live;
}

static void walk(const ModelDims *d, ModelSchedule sched, int stage, Walk *w)
{
    int m = d->m;
    ModelAction a;
    if (sched == MODEL_SCHED_GPIPE) {
        for (int i = 0; i < m; i++)
            emit(w, (ModelAction){0, 0, i});
        for (int i = 0; i < m; i++)
            emit(w, (ModelAction){1, 0, i});
        return;
    }
    if (sched == MODEL_SCHED_1F1B || d->v == 1) {
        int warm = d->p - stage - 1;
        if (warm > m)
            warm = m;
        int f = 0, bw = 0;
        for (; f < warm; f++)
            emit(w, (ModelAction){0, 0, f});
        while (f < m) {
            emit(w, (ModelAction){0, 0, f++});
            emit(w, (ModelAction){1, 0, bw++});
        }
        while (bw < m)
            emit(w, (ModelAction){1, 0, bw++});
        return;
    }
    int total = m * d->v;
    int warm = (d->p - stage - 1) * 2 + (d->v - 1) * d->p;
    if (warm > total)
        warm = total;
    int f = 0, bw = 0;
    for (; f < warm; f++) {
        fwd_slot(d, f, 0, &a);
        emit(w, a);
    }
    while (f < total) {
        fwd_slot(d, f++, 0, &a);
        emit(w, a);
        fwd_slot(d, bw++, 1, &a);
        emit(w, a);
    }
    while (bw < total) {
        fwd_slot(d, bw++, 1, &a);
        emit(w, a);
    }
}

int model_schedule_build(const ModelDims *d, ModelSchedule sched, int stage, ModelAction *out)
{
    Walk w = {.out = out};
    walk(d, sched, stage, &w);
    return w.n;
}

/* Interleaved counts without visiting every action. Forward slot k runs chunk (k / p) % v and
 * backward slot k chunk v-1 - (k / p) % v, so in the steady state the pairs (forward W+i,
 * backward i) keep both chunks for runs of up to p pairs: over a run a chunk's count moves
 * monotonically (or, when both slots run the same chunk, rises by one and falls back), so its
 * highest count is at the run's end (or one above its start). The warm-up only adds and the
 * drain only removes, and the steady state repeats with a period of v*p pairs. */
static void interleaved_peak(const ModelDims *d, int stage, int *peak_live, int *max_live,
                             int *cur)
{
    const int p = d->p, v = d->v, total = d->m * v;
    int warm = (p - stage - 1) * 2 + (v - 1) * p;
    if (warm > total)
        warm = total;
    for (int k = 0; k < warm; k += p) { /* warm-up forwards, runs of p slots per chunk */
        int len = warm - k < p - k % p ? warm - k : p - k % p;
        int c = (k / p) % v;
        cur[c] += len;
    }
    for (int j = 0; j < v; j++)
        max_live[j] = cur[j];
    const int steady = total - warm;
    /* both slots' chunks repeat every v*p pairs, in which each chunk gets p forwards and p
     * backwards: the counts repeat too, so the first period holds every peak */
    const int span = steady < v * p ? steady : v * p;
    for (int i = 0; i < span;) {
        const int kf = warm + i;
        int len = p - kf % p;
        if (p - i % p < len)
            len = p - i % p;
        if (span - i < len)
            len = span - i;
        const int fc = (kf / p) % v, bc = v - 1 - (i / p) % v;
        if (fc == bc) {
            if (cur[fc] + 1 > max_live[fc])
                max_live[fc] = cur[fc] + 1;
        } else {
            if (cur[fc] + 1 > max_live[fc])
                max_live[fc] = cur[fc] + 1; /* the run's first forward, before any backward */
            cur[fc] += len;
            cur[bc] -= len;
            if (cur[fc] > max_live[fc])
                max_live[fc] = cur[fc];
        }
        i += len;
    }
    *peak_live = steady > 0 ? warm + 1 : warm;
}

int model_schedule_peak(const ModelDims *d, ModelSchedule sched, int stage, int *peak_live,
                        int *max_live)
{
    int *cur = calloc((size_t)(d->v > 0 ? d->v : 1), sizeof *cur); /* each chunk's sets alive now */
    if (!cur)
        return PX_ERUNTIME;
    if (sched == MODEL_SCHED_INTERLEAVED && d->v > 1) {
        interleaved_peak(d, stage, peak_live, max_live, cur);
    } else {
        Walk w = {.max_live = max_live, .cur = cur};
        for (int j = 0; j < d->v; j++)
            max_live[j] = 0;
        walk(d, sched, stage, &w);
        *peak_live = w.most;
    }
    free(cur);
    return PX_OK;
}

int model_schedule_live(const ModelAction *a, int n, int v, int *peak_live, int *max_live)
{
    int live = 0, most = 0;
    int *cur = calloc((size_t)(v > 0 ? v : 1), sizeof *cur); /* each chunk's sets alive now */
    if (!cur)
        return PX_ERUNTIME;
    for (int j = 0; j < v; j++)
        max_live[j] = 0;
    for (int i = 0; i < n; i++) {
        int c = a[i].chunk;
        if (!a[i].backward) {
            live++;
            if (++cur[c] > max_live[c])
                max_live[c] = cur[c];
        } else {
            live--;
            cur[c]--;
        }
        if (live > most)
            most = live;
    }
    *peak_live = most;
    free(cur);
    return PX_OK;
}

uint64_t model_activation_bytes(const ModelTensorTable *tt, int v, int peak_live,
                                const int *max_live)
{
    /* a slot holds the largest chunk's layer set (chunks differ when some hold MoE layers) */
    uint64_t slot = 0;
    for (int j = 0; j < v; j++)
        if (tt->act_layer_bytes[j] > slot)
            slot = tt->act_layer_bytes[j];
    uint64_t bytes = (uint64_t)peak_live * slot;
    for (int j = 0; j < v; j++)
        bytes += (uint64_t)max_live[j] * (tt->act_chunk_bytes[j] - tt->act_layer_bytes[j]);
    return bytes;
}
