/* The run's record: every step's loss, time, throughput and loss scale as it ran, where the run
 * began (a resumed run's first step), whether it was interrupted; and the median step time. */
#include <stdlib.h>
#include <string.h>

#include "exec/train/internal.h"

int exec_history_init(ExecHistory *H, int steps, PxError *err)
{
    memset(H, 0, sizeof *H);
    const size_t n = (size_t)(steps > 0 ? steps : 1);
    H->loss = calloc(n, sizeof *H->loss);
    H->mtp_loss = calloc(n, sizeof *H->mtp_loss);
    H->time = calloc(n, sizeof *H->time);
    H->tps = calloc(n, sizeof *H->tps);
    H->scale = calloc(n, sizeof *H->scale);
    H->skipped = calloc(n, sizeof *H->skipped);
    if (!H->loss || !H->mtp_loss || !H->time || !H->tps || !H->scale || !H->skipped)
        return px_fail(err, PX_ERUNTIME, "out of memory for the run's record");
    return PX_OK;
}

void exec_history_free(ExecHistory *H)
{
    free(H->loss);
    free(H->mtp_loss);
    free(H->time);
    free(H->tps);
    free(H->scale);
    free(H->skipped);
    memset(H, 0, sizeof *H);
}

double exec_median_step_s(const Exec *ex)
{
    const ExecHistory *H = &ex->hist;
    const int first = H->done > 1 ? 1 : 0;
    return px_median(H->time + first, H->done - first);
}

/* The step's figures into the run's history. */
void exec_history_record(ExecHistory *H, int steps, const ExecStepStats *st)
{
    if (H->done >= steps)
        return;
    H->skipped[H->done] = st->skipped;
    H->scale[H->done] = st->loss_scale;
    H->loss[H->done] = st->loss;
    H->mtp_loss[H->done] = st->mtp_loss;
    H->time[H->done] = st->time_s;
    H->tps[H->done] = st->tokens_per_s;
    H->done++;
}

