/* Pipeline schedules: the order of forward and backward passes on one stage.
 *
 * GPipe (Huang et al. 2019): every forward, then every backward.
 * 1F1B (Narayanan et al. 2021, PipeDream-Flush): stage s runs min(p-s-1, m) warm-up forwards,
 * then alternates one forward and one backward, then drains the remaining backwards.
 * Interleaved 1F1B (Narayanan et al. 2021, Sec. 2.2.2): each rank holds v model chunks; the
 * order is Megatron-LM's: (p-s-1)*2 + (v-1)*p warm-up micro-steps, forward micro-step k runs
 * chunk (k / p) % v, backward micro-step k runs chunk v-1 - (k / p) % v, and micro-batches
 * advance in groups of p. */
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

int model_schedule_build(const ModelDims *d, ModelSchedule sched, int stage, ModelAction *out)
{
    int n = 0, m = d->m;
    if (sched == MODEL_SCHED_GPIPE) {
        for (int i = 0; i < m; i++)
            out[n++] = (ModelAction){0, 0, i};
        for (int i = 0; i < m; i++)
            out[n++] = (ModelAction){1, 0, i};
        return n;
    }
    if (sched == MODEL_SCHED_1F1B || d->v == 1) {
        int warm = d->p - stage - 1;
        if (warm > m)
            warm = m;
        int f = 0, bw = 0;
        for (; f < warm; f++)
            out[n++] = (ModelAction){0, 0, f};
        while (f < m) {
            out[n++] = (ModelAction){0, 0, f++};
            out[n++] = (ModelAction){1, 0, bw++};
        }
        while (bw < m)
            out[n++] = (ModelAction){1, 0, bw++};
        return n;
    }
    int total = m * d->v;
    int warm = (d->p - stage - 1) * 2 + (d->v - 1) * d->p;
    if (warm > total)
        warm = total;
    int f = 0, bw = 0;
    for (; f < warm; f++)
        fwd_slot(d, f, 0, &out[n++]);
    while (f < total) {
        fwd_slot(d, f++, 0, &out[n++]);
        fwd_slot(d, bw++, 1, &out[n++]);
    }
    while (bw < total)
        fwd_slot(d, bw++, 1, &out[n++]);
    return n;
}

void model_schedule_live(const ModelAction *a, int n, int v, int *peak_live, int *max_live)
{
    int live = 0, most = 0;
    for (int j = 0; j < v; j++)
        max_live[j] = 0;
    int cur[64] = {0}; /* chunks per rank are few; callers keep v <= 64 */
    for (int i = 0; i < n; i++) {
        int c = a[i].chunk;
        if (!a[i].backward) {
            live++;
            if (c < 64 && ++cur[c] > max_live[c])
                max_live[c] = cur[c];
        } else {
            live--;
            if (c < 64)
                cur[c]--;
        }
        if (live > most)
            most = live;
    }
    *peak_live = most;
}

uint64_t model_activation_bytes(const ModelTensorTable *tt, int v, int peak_live,
                                const int *max_live)
{
    uint64_t bytes = (uint64_t)peak_live * tt->act_layer_bytes[0];
    for (int j = 0; j < v; j++)
        bytes += (uint64_t)max_live[j] * (tt->act_chunk_bytes[j] - tt->act_layer_bytes[j]);
    return bytes;
}
