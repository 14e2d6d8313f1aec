/* Pipeline timing: an event simulation of each stage's schedule (model/schedule.c, the order
 * the executor runs) over per-chunk forward and backward times and point-to-point transfers. */
#include "sim/internal.h"

#include <stdlib.h>
#include <string.h>

/* Scratch of one pipeline simulation: each stage's actions in schedule order (built once and
 * shared by every run over the same schedule), when each (global chunk, micro-batch) forward
 * and backward ended, each stage's next action and when it is free. One allocation. */
typedef struct {
    ModelAction *acts;
    int *glob; /* [p * v] global chunk of each stage's local chunk */
    double *fend, *bend;
    int *next;
    double *free_at;
    void *block;
} Pipe;

static int pipe_init(Pipe *w, const ModelDims *d, ModelSchedule sched)
{
    const size_t p = (size_t)d->p, G = p * (size_t)d->v, per = 2 * (size_t)d->m * d->v;
    const size_t n_acts = p * per, n_ends = G * (size_t)d->m;
    size_t bytes = n_acts * sizeof *w->acts + 2 * n_ends * sizeof(double) + p * sizeof(double) +
                   (G + p) * sizeof(int);
    char *b = malloc(bytes);
    if (!b)
        return -1;
    w->block = b;
    w->fend = (double *)b;
    w->bend = w->fend + n_ends;
    w->free_at = w->bend + n_ends;
    w->acts = (ModelAction *)(w->free_at + p);
    w->glob = (int *)(w->acts + n_acts);
    w->next = w->glob + G;
    for (int s = 0; s < d->p; s++) {
        model_schedule_build(d, sched, s, w->acts + (size_t)s * per);
        for (int j = 0; j < d->v; j++)
            w->glob[s * d->v + j] = model_global_chunk(d, s, j);
    }
    return 0;
}

static double pipeline(const ModelDims *d, Pipe *w, const double *fwd, const double *bwd,
                       const double *p2p, double *finish, double *last_bwd_start,
                       double *last_bwd_end, SimEvent *events)
{
    const int p = d->p, v = d->v, m = d->m, G = p * v, per_stage = 2 * m * v;
    double *fend = w->fend, *bend = w->bend, *free_at = w->free_at;
    int *next = w->next;
    for (int i = 0; i < G * m; i++)
        fend[i] = bend[i] = -1.0;
    for (int s = 0; s < p; s++) {
        next[s] = 0;
        free_at[s] = 0.0;
    }
    for (int i = 0; i < p * v; i++)
        last_bwd_start[i] = last_bwd_end[i] = 0.0;
    int remaining = p * per_stage;
    double latest = 0.0;
    while (remaining > 0) {
        int progress = 0;
        for (int s = 0; s < p; s++) {
            const ModelAction *acts = w->acts + (size_t)s * per_stage;
            /* Blocking sends (Megatron's send_forward / send_backward): the stage is busy
             * until its output has left, and the receiver can start when it arrives. */
            const double send_fwd = p2p[s], send_bwd = p2p[(s + p - 1) % p];
            double at = free_at[s];
            int k = next[s];
            while (k < per_stage) {
                const ModelAction *a = &acts[k];
                const int g = w->glob[s * v + a->chunk];
                double ready, dur, send = 0.0;
                if (!a->backward) {
                    ready = 0.0;
                    if (g > 0) {
                        ready = fend[(g - 1) * m + a->mb]; /* its end includes the transfer */
                        if (ready < 0)
                            break;
                    }
                    dur = fwd[s * v + a->chunk];
                    if (g < G - 1)
                        send = send_fwd;
                } else {
                    ready = fend[g * m + a->mb];
                    if (ready < 0)
                        break;
                    if (g < G - 1) {
                        double dep = bend[(g + 1) * m + a->mb];
                        if (dep < 0)
                            break;
                        if (dep > ready)
                            ready = dep;
                    }
                    dur = bwd[s * v + a->chunk];
                    if (g > 0)
                        send = send_bwd;
                }
                const double start = ready > at ? ready : at;
                const double end = start + (dur + send);
                at = end;
                if (events) {
                    SimEvent *ev = &events[(size_t)s * per_stage + k];
                    ev->stage = s;
                    ev->chunk = a->chunk;
                    ev->mb = a->mb;
                    ev->backward = a->backward;
                    ev->start_s = start;
                    ev->end_s = end;
                    ev->send_s = send;
                }
                if (a->backward) {
                    bend[g * m + a->mb] = end;
                    if (end >= last_bwd_end[s * v + a->chunk]) {
                        last_bwd_start[s * v + a->chunk] = start;
                        last_bwd_end[s * v + a->chunk] = end;
                    }
                } else {
                    fend[g * m + a->mb] = end;
                }
                k++;
            }
            if (k != next[s]) {
                remaining -= k - next[s];
                next[s] = k;
                free_at[s] = at;
                progress = 1;
            }
        }
        if (!progress) /* cannot happen for the schedules of model/schedule.c */
            break;
    }
    for (int s = 0; s < p; s++) {
        finish[s] = free_at[s];
        if (free_at[s] > latest)
            latest = free_at[s];
    }
    return remaining > 0 ? -1.0 : latest;
}

double sim_pipeline_event(const ModelDims *d, ModelSchedule sched, const double *fwd,
                          const double *bwd, const double *p2p, double *finish,
                          double *last_bwd_start, double *last_bwd_end)
{
    Pipe w;
    if (pipe_init(&w, d, sched) < 0)
        return -1.0;
    double t = pipeline(d, &w, fwd, bwd, p2p, finish, last_bwd_start, last_bwd_end, NULL);
    free(w.block);
    return t;
}

double sim_pipeline_pair(const ModelDims *d, ModelSchedule sched, const double *fwd,
                         const double *bwd, const double *p2p, double *finish,
                         double *last_bwd_start, double *last_bwd_end, double *finish_free,
                         double *scratch)
{
    Pipe w;
    if (pipe_init(&w, d, sched) < 0)
        return -1.0;
    double t = pipeline(d, &w, fwd, bwd, p2p, finish, last_bwd_start, last_bwd_end, NULL);
    int free_transfers = 1;
    for (int s = 0; s < d->p; s++)
        free_transfers &= p2p[s] == 0.0;
    if (t >= 0 && free_transfers) {
        for (int s = 0; s < d->p; s++)
            finish_free[s] = finish[s]; /* the same run */
    } else if (t >= 0) {
        double *zero_p2p = scratch, *ls = scratch + d->p, *le = ls + (size_t)d->p * d->v;
        for (int s = 0; s < d->p; s++)
            zero_p2p[s] = 0.0;
        if (pipeline(d, &w, fwd, bwd, zero_p2p, finish_free, ls, le, NULL) < 0)
            t = -1.0;
    }
    free(w.block);
    return t;
}

int sim_timeline(const SimResult *r, SimEvent **events, int *count, PxError *err)
{
    const ModelDims *d = &r->dims;
    *events = NULL;
    *count = 0;
    if (sim_level(r) < SIM_FULL)
        return px_fail(err, PX_ERUNTIME, "the timeline needs a full simulation");
    const int p = d->p, v = d->v, n = 2 * d->m * v * p;
    SimEvent *ev = calloc((size_t)n, sizeof *ev);
    double *fin = calloc((size_t)p, sizeof *fin);
    double *ls = calloc((size_t)(p * v), sizeof *ls), *le = calloc((size_t)(p * v), sizeof *le);
    int rc = PX_OK;
    Pipe w = {0};
    if (!ev || !fin || !ls || !le || pipe_init(&w, d, r->spec.layout.schedule) < 0 ||
        pipeline(d, &w, r->work->pass_fwd, r->work->pass_bwd, r->work->p2p, fin, ls, le, ev) < 0) {
        free(ev);
        rc = px_fail(err, PX_ERUNTIME, "out of memory recording the pipeline timeline");
    } else {
        *events = ev;
        *count = n;
    }
    free(w.block);
    free(fin);
    free(ls);
    free(le);
    return rc;
}

double sim_pipeline_uniform(const ModelDims *d, ModelSchedule sched, double fwd, double bwd)
{
    (void)sched;
    /* Every stage idles (p - 1) slots of one chunk's forward + backward over m*v of them. */
    return ((double)d->m * d->v + d->p - 1) * (fwd + bwd);
}

