/* The calibration models and the configurations they are measured in: each model of the list
 * at its own sequence length, TP 1, 2, 4, 8 for GEMM shapes, micro-batches 1, 2, 4, 8. */
#include <string.h>

#include "exec/calibrate/internal.h"

const int calib_tp_sizes[CALIB_SIZES] = {1, 2, 4, 8};
const int calib_mbs_sizes[CALIB_SIZES] = {1, 2, 4, 8};

int calib_quick_skips(const CalibOptions *o, int tp, int mbs)
{
    return o->quick && (tp > 2 || mbs == 2 || mbs == 8);
}

int calib_next_model(const char **p, char *buf, size_t cap)
{
    const char *s = *p;
    while (*s == ',')
        s++;
    if (!*s)
        return 0;
    const char *e = strchr(s, ',');
    size_t n = e ? (size_t)(e - s) : strlen(s);
    if (n >= cap)
        n = cap - 1;
    memcpy(buf, s, n);
    buf[n] = '\0';
    *p = s + n;
    return 1;
}

PxDtype calib_precision(const CalibOptions *o)
{
    return strcmp(o->backend, "cuda") ? PX_FP32 : PX_BF16;
}

int calib_spec(const char *model, int tp, int mbs, int flash, PxDtype precision, ModelSpec *s,
               ModelDims *d, PxError *err)
{
    model_spec_defaults(s);
    int rc = model_config_load(model, &s->model, err);
    if (rc)
        return rc;
    s->layout.tp = tp;
    s->layout.dp = 1;
    s->job.micro_batch = mbs;
    s->job.global_batch = mbs;
    s->job.flash_attn = flash;
    s->job.precision = precision;
    return model_spec_check(s, tp, d, err);
}
