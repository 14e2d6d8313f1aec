/* Pipeline timing: an event simulation of each stage's schedule (model/schedule.c, the order
 * the executor runs) over per-chunk forward and backward times and point-to-point transfers. */
#include "sim/internal.h"

#include <stdlib.h>
#include <string.h>

static double pipeline(const ModelDims *d, ModelSchedule sched, const double *fwd,
                       const double *bwd, const double *p2p, double *finish,
                       double *last_bwd_start, double *last_bwd_end, SimEvent *events)
{
    const int p = d->p, v = d->v, m = d->m, G = p * v, per_stage = 2 * m * v;
    ModelAction *acts = malloc((size_t)p * per_stage * sizeof *acts);
    double *fend = malloc((size_t)G * m * sizeof *fend);
    double *bend = malloc((size_t)G * m * sizeof *bend);
    int *next = calloc((size_t)p, sizeof *next);
    double *free_at = calloc((size_t)p, sizeof *free_at);
    if (!acts || !fend || !bend || !next || !free_at) {
        free(acts);
        free(fend);
        free(bend);
        free(next);
        free(free_at);
        return -1.0;
    }
    for (int s = 0; s < p; s++)
        model_schedule_build(d, sched, s, acts + (size_t)s * per_stage);
    for (int i = 0; i < G * m; i++)
        fend[i] = bend[i] = -1.0;
    for (int i = 0; i < p * v; i++)
        last_bwd_start[i] = last_bwd_end[i] = 0.0;
    int remaining = p * per_stage;
    double latest = 0.0;
    while (remaining > 0) {
        int progress = 0;
        for (int s = 0; s < p; s++) {
            while (next[s] < per_stage) {
                const ModelAction *a = &acts[(size_t)s * per_stage + next[s]];
                int g = model_global_chunk(d, s, a->chunk);
                double ready;
                if (!a->backward) {
                    if (g == 0) {
                        ready = 0.0;
                    } else {
                        double dep = fend[(g - 1) * m + a->mb];
                        if (dep < 0)
                            break;
                        ready = dep; /* its end includes the transfer */
                    }
                } else {
                    double own = fend[g * m + a->mb];
                    if (own < 0)
                        break;
                    ready = own;
                    if (g < G - 1) {
                        double dep = bend[(g + 1) * m + a->mb];
                        if (dep < 0)
                            break;
                        if (dep > ready)
                            ready = dep;
                    }
                }
                double start = ready > free_at[s] ? ready : free_at[s];
                double dur = a->backward ? bwd[s * v + a->chunk] : fwd[s * v + a->chunk];
                /* Blocking sends (Megatron's send_forward / send_backward): the stage is busy
                 * until its output has left, and the receiver can start when it arrives. */
                double send = 0.0;
                if (!a->backward && g < G - 1)
                    send = p2p[s];
                else if (a->backward && g > 0)
                    send = p2p[(s + p - 1) % p];
                dur += send;
                double end = start + dur;
                free_at[s] = end;
                if (events) {
                    SimEvent *ev = &events[(size_t)s * per_stage + next[s]];
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
                next[s]++;
                remaining--;
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
    free(acts);
    free(fend);
    free(bend);
    free(next);
    free(free_at);
    return remaining > 0 ? -1.0 : latest;
}

double sim_pipeline_event(const ModelDims *d, ModelSchedule sched, const double *fwd,
                          const double *bwd, const double *p2p, double *finish,
                          double *last_bwd_start, double *last_bwd_end)
{
    return pipeline(d, sched, fwd, bwd, p2p, finish, last_bwd_start, last_bwd_end, NULL);
}

int sim_timeline(const SimResult *r, SimEvent **events, int *count, PxError *err)
{
    const ModelDims *d = &r->dims;
    *events = NULL;
    *count = 0;
    if (r->level < SIM_FULL)
        return px_fail(err, PX_ERUNTIME, "the timeline needs a full simulation");
    const int p = d->p, v = d->v, n = 2 * d->m * v * p;
    SimEvent *ev = calloc((size_t)n, sizeof *ev);
    double *fin = calloc((size_t)p, sizeof *fin);
    double *ls = calloc((size_t)(p * v), sizeof *ls), *le = calloc((size_t)(p * v), sizeof *le);
    int rc = PX_OK;
    if (!ev || !fin || !ls || !le ||
        pipeline(d, r->spec.layout.schedule, r->pass_fwd, r->pass_bwd, r->p2p, fin, ls, le, ev) < 0) {
        free(ev);
        rc = px_fail(err, PX_ERUNTIME, "out of memory recording the pipeline timeline");
    } else {
        *events = ev;
        *count = n;
    }
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

