/* sim — the analytic simulator. It costs what model/ describes for a layout on a cluster
 * profile: memory per pipeline stage and category (the tensor table, with the activation peak
 * of the pipeline schedule), FLOPs per step (the op graph), and communication bytes per stage
 * and kind. It links only cJSON and libm: planning works on a laptop.
 *
 * Example:
 *   SimResult r;
 *   if (sim_run(&spec, &cluster, 1536, &r, &err) == PX_OK) {
 *       sim_result_print(stdout, &r);          // tables for people
 *       cJSON *j = sim_result_to_json(&r);     // DESIGN.md's Prediction keys
 *       ...
 *       sim_result_free(&r);
 *   }
 */
#ifndef SIM_H
#define SIM_H

#include <stdio.h>

#include "model/model.h"
#include "profiles/profile.h"

typedef struct {
    uint64_t cat[MODEL_CAT_COUNT]; /* bytes per memory category, activations at their peak */
    uint64_t total;
    int peak_live; /* (chunk, micro-batch) activation sets alive at the activation peak */
} SimStageMemory;

typedef struct {
    ModelSpec spec; /* as normalised by model_spec_check (dp, schedule, global batch filled) */
    ModelDims dims;
    ProfCluster cluster;
    double params; /* parameters of the model as configured (no vocabulary padding) */
    int node_size; /* ranks per node in this job */
    uint64_t rank_memory_bytes; /* memory a rank may use on this cluster */
    SimStageMemory *mem;        /* [pp] */
    uint64_t peak_bytes;
    int peak_stage;
    double model_flops;    /* per step, whole job: forward + backward, no recompute */
    double hardware_flops; /* per step, whole job: recompute included */
    double *rank_flops;    /* [pp] hardware FLOPs of one rank of each stage per step */
    uint64_t (*comm)[MODEL_COMM_COUNT]; /* [pp][kind] bytes one rank moves per step */
    ModelOpGraph *ops;                  /* [pp] op graph of each stage */
} SimResult;

/* Simulates spec on cluster with `gpus` ranks (dp 0 in the spec: what the GPUs leave).
 * PX_EINPUT names the layout rule or the cluster limit that is broken; nothing is allocated. */
int sim_run(const ModelSpec *spec, const ProfCluster *cluster, int gpus, SimResult *out,
            PxError *err);
void sim_result_free(SimResult *r);
/* DESIGN.md's Prediction (memory, flops, comm, ops) plus model, layout and training. */
cJSON *sim_result_to_json(const SimResult *r);
void sim_result_print(FILE *f, const SimResult *r);
/* The zoo and the built-in profiles, as tables or JSON. */
int sim_list_models(FILE *f, int json, PxError *err);
int sim_list_profiles(FILE *f, int json, PxError *err);
/* The precision a job gets when none is given: bf16 where the device has bf16 tensor cores,
 * fp32 otherwise (CPU ranks). */
PxDtype sim_default_precision(const ProfDevice *d);

#endif
