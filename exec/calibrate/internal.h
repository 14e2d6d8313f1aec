/* Private to exec/calibrate: the parts' pieces, one file each, calling only downwards:
 *   part.c         the options and calib_part_run: the world's layer, then one part
 *   compute.c      the compute part: runs gemm.c and rates.c on every rank, averages, writes
 *   collectives.c  the comm part
 *   assemble.c     the assemble part
 *   rates.c        op samples from real training steps, and the fits
 *   gemm.c         the GEMM shapes of the op graphs and their times; device peak and bandwidth
 *   models.c       the calibration models and configurations
 * (job.c, the front end's, stands apart: it calls none of these.) */
#ifndef EXEC_CALIBRATE_INTERNAL_H
#define EXEC_CALIBRATE_INTERNAL_H

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>

#include "exec/calibrate/calibrate.h"
#include "exec/comm/comm.h"
#include "kernels/kernels.h"
#include "model/model.h"

/* A progress line on stdout, flushed at once (the parts run under mpirun, which buffers), when
 * `loud`: rank 0 of a part that is not quiet. */
static inline void calib_say(int loud, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static inline void calib_say(int loud, const char *fmt, ...)
{
    if (!loud)
        return;
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    fflush(stdout);
}

/* ---- models.c: the calibration models and configurations ---- */

/* TP degrees whose GEMM shapes are timed, and micro-batch sizes timed and trained */
enum { CALIB_SIZES = 4 };
extern const int calib_tp_sizes[CALIB_SIZES];
extern const int calib_mbs_sizes[CALIB_SIZES];
/* --quick leaves out TP beyond 2 and micro-batches 2 and 8 */
int calib_quick_skips(const CalibOptions *o, int tp, int mbs);
/* The next model of a comma-separated list at *p into buf (advancing *p); 0 at the end. */
int calib_next_model(const char **p, char *buf, size_t cap);
/* The precision the backend trains in: the CPU fp32, CUDA bf16 (as the plans it runs). */
PxDtype calib_precision(const CalibOptions *o);
/* A calibration model's spec: its own sequence, one TP degree, one micro-batch size, dp 1.
 * PX_EINPUT naming the model, or a layout rule broken (err->code the rule). */
int calib_spec(const char *model, int tp, int mbs, int flash, PxDtype precision, ModelSpec *s,
               ModelDims *d, PxError *err);

/* ---- gemm.c: GEMMs at the op graphs' shapes; the device's peak and bandwidth ---- */

typedef struct {
    int64_t m, n, k, batch;
    int ta, tb;
    float beta;
    double seconds; /* per call; 0: not timed (its operands would not fit the buffers) */
} CalibShape;

typedef struct {
    CalibShape *s;
    int n, cap;
} CalibShapes;

/* Every distinct (m, n, k, batch) of the matmuls of the calibration models' op graphs, at each
 * TP degree and micro-batch size, with the executor's transposes. */
int calib_shapes_collect(const CalibOptions *o, CalibShapes *sh, PxError *err);
/* Times every shape through the kernels k (sh->s[i].seconds). */
int calib_shapes_time(const CalibOptions *o, const KernBackend *k, CalibShapes *sh, PxError *err);
/* The timed shape of GEMM g; NULL when it was not timed. */
const CalibShape *calib_shape_find(const CalibShapes *sh, const ModelGemm *g);
/* The best GEMM rate of a large square product (the device's practical peak), FLOP/s. */
double calib_peak_flops(const CalibOptions *o, const KernBackend *k);
/* Streaming bandwidth: out = a + b over buffers well beyond the caches, bytes/s. */
double calib_bandwidth(const CalibOptions *o, const KernBackend *k);

/* ---- rates.c: op rates from real training steps ---- */

typedef struct {
    char kind[16], phase[16], variant[24];
    int flash;
    double x, y;  /* ModelOpKey's size; seconds per call (a matmul's without its GEMMs) */
    char op[200]; /* where it came from: model, micro-batch, op name */
} CalibSample;

typedef struct {
    CalibSample *s;
    int n, cap;
} CalibSamples;

typedef struct {
    char kind[16], phase[16], variant[24];
    int flash;
    double rate, overhead_s; /* y = overhead_s + x / rate; rate 1e18: a constant */
    int points;
    double rms_abs; /* root mean square of the fit's errors, seconds */
} CalibFit;

/* Trains one configuration (model, micro-batch, fused attention or not) for a few steps on this
 * rank alone, planned on `base` (o->base's profile, loaded), and adds a sample per compute op:
 * its seconds per call, less its timed GEMMs for a matmul, against its size. ring (NULL: this
 * rank alone): a layer over all the part's ranks (an even number), which train the
 * configuration together with context parallelism 2 over a ring, and only the attention
 * core's samples are added (its variant "hd<d>/ring"). */
int calib_config_samples(const CalibOptions *o, const ProfCluster *base, const char *model,
                         int mbs, int flash, CommLayer *ring, const CalibShapes *sh,
                         CalibSamples *ss, PxError *err);
/* One fit per kind, phase, flash and variant of the samples; *out is the caller's to free. */
int calib_fit_all(const CalibSamples *ss, CalibFit **out, int *n_out, PxError *err);

/* ---- the parts (compute.c, collectives.c, assemble.c) ---- */

/* world: a layer over every rank of the part (dp = ranks), for barriers and averages */
int calib_compute(const CalibOptions *o, CommLayer *world, PxError *err);
int calib_collectives(const CalibOptions *o, CommLayer *world, PxError *err);
int calib_assemble(const CalibOptions *o, PxError *err);
/* one rank: the device's GEMM peak and bandwidth as the compute part measures them */
int calib_probe_part(const CalibOptions *o, PxError *err);

#endif
