/* checkpoint — a rank's training state written every N steps and resumed from, so that a run
 * goes on exactly as if it had not stopped.
 *
 * The trainer's semantics make everything but a few regions of memory and counters a function
 * of the step (the batch, the dropout streams and the learning rate all follow it), so the state
 * of a rank is its weights, master and optimizer arenas and the optimizer's and loss scaler's
 * counters: a CkptState the trainer fills. Each rank writes its shard; rank 0 commits a JSON
 * manifest once every shard is on disk; --resume loads this rank's shard of the latest committed
 * checkpoint after checking it belongs to this model and layout. docs/executor.md has the
 * formats and the guarantees. This module knows files, formats and the agreement between ranks;
 * it knows nothing of the trainer beyond the state it is handed.
 *
 * Example (what the trainer does):
 *   CkptState st;   // the regions and counters of this rank
 *   Ckpt *ck = NULL;
 *   CkptOptions o = {"ckpt", 10, 0};
 *   if (ckpt_open(&ck, &o, &st, &err)) ...   // checks the directory; resume: loads st
 *   ...after each step:  ckpt_after_step(ck, &st, step + 1, quiet, &collective, &err);
 *   ckpt_free(ck);
 */
#ifndef EXEC_CHECKPOINT_H
#define EXEC_CHECKPOINT_H

#include "model/model.h"

struct KernBackend;
typedef struct CommLayer CommLayer;

enum { CKPT_SECTIONS = 3 }; /* weights, master, optimizer */

/* One region of a rank's state: device memory the kernels copy from and to, or host memory
 * (host: optimizer offload's master and optimizer arenas), read and written directly. */
typedef struct {
    void *base;
    uint64_t bytes;
    ModelCategory cat;
    int host;
} CkptRegion;

typedef struct {
    int rank, world, stage, tp_rank, dp_rank;
    const struct KernBackend *k; /* its name and act dtype (the weights') are recorded */
    CommLayer *comm;
    const ModelSpec *spec;
    const ModelDims *d;
    const char *plan_path;
    int steps; /* the run's steps */
    CkptRegion region[CKPT_SECTIONS];
    /* counters */
    int opt_steps;
    double loss_scale;
    int scale_clean;
    long skipped;
    int have_loss;     /* the last step's loss, for people reading the manifest */
    double last_loss;
} CkptState;

typedef struct {
    const char *dir; /* NULL or "": no checkpoints */
    int every;       /* a checkpoint every N steps; 0: none (with resume: the checkpoint's own) */
    int resume;      /* continue from the latest complete checkpoint in dir */
} CkptOptions;

typedef struct Ckpt Ckpt;

/* Checks the options and the directory (PX_EINPUT: a bad value, a directory that cannot be
 * written, one that already holds a checkpoint without resume, or resume without one), and with
 * resume loads this rank's shard of the latest committed checkpoint into st's regions and its
 * counters into *st (PX_EINPUT names the file and the key or the check that failed; the regions
 * are then undefined). No communication. *out stays NULL without checkpoints. */
int ckpt_open(Ckpt **out, const CkptOptions *o, CkptState *st, PxError *err);
/* The step the run resumed from (0: none). */
int ckpt_resumed_from(const Ckpt *c);
/* After each step (steps_done: the steps completed so far): the checkpoint, every `every`
 * steps. Collective. A write failure is PX_ERUNTIME on every rank alike (*collective set), the
 * previous checkpoint intact. */
int ckpt_after_step(Ckpt *c, const CkptState *st, int steps_done, int quiet, int *collective,
                    PxError *err);
/* rank 0's lines about the resume (none without one) */
void ckpt_print_resume(const Ckpt *c, const CkptState *st);
/* run.json's "checkpoint" (nothing without checkpoints) */
void ckpt_json(const Ckpt *c, cJSON *run);
void ckpt_free(Ckpt *c);

#endif
