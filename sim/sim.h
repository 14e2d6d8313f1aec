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
    double compute_s;       /* compute per step on one rank of the stage */
    double tp_comm_s;       /* TP and CP communication the passes cannot hide, per step */
    double pp_comm_s;       /* how much later the stage finishes because of p2p transfers */
    double dp_exposed_s;    /* DP / ZeRO communication not hidden, per step */
    double optimizer_s;
    double pipeline_s;      /* when the stage finishes its last backward */
    double bubble_fraction; /* idle over busy time of the stage without transfers */
    double step_s;          /* the stage's step: pipeline, then reduction, optimizer, gathers */
} SimStageTime;

typedef struct {
    int compact;    /* built with compact tables and graphs (sim_run_ex) */
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
    double **op_seconds;                /* [pp][op] seconds of one execution of each op */
    SimStageTime *stage_time;           /* [pp] */
    /* DESIGN.md's time and throughput, for the stage that ends the step last */
    int critical_stage;
    double step_s, bubble_fraction, compute_s, tp_comm_s, pp_comm_s, dp_comm_exposed_s, optimizer_s;
    double tokens_per_s;
    double tflops_per_gpu; /* hardware FLOPs per second per GPU, in TFLOP/s (Narayanan's metric) */
    double mfu, hfu;       /* model / hardware FLOPs over the dense peak */
} SimResult;

/* Simulates spec on cluster with `gpus` ranks (dp 0 in the spec: what the GPUs leave).
 * PX_EINPUT names the layout rule or the cluster limit that is broken; nothing is allocated. */
int sim_run(const ModelSpec *spec, const ProfCluster *cluster, int gpus, SimResult *out,
            PxError *err);
/* The planner's fast path: compact tables and graphs (one layer per chunk standing for all
 * of them) and one build per distinct stage. Memory, FLOPs, communication and time agree with
 * sim_run's (tests check it); op lists hold one layer per chunk. */
int sim_run_ex(const ModelSpec *spec, const ProfCluster *cluster, int gpus, int compact,
               SimResult *out, PxError *err);
void sim_result_free(SimResult *r);
/* DESIGN.md's Prediction (memory, flops, comm, ops) plus model, layout and training. */
cJSON *sim_result_to_json(const SimResult *r);
void sim_result_print(FILE *f, const SimResult *r);
/* The Prediction object alone (memory, flops, comm, time, throughput, ops): a plan's
 * `prediction`. */
cJSON *sim_prediction_to_json(const SimResult *r);
/* The zoo and the built-in profiles, as tables or JSON. */
int sim_list_models(FILE *f, int json, PxError *err);
int sim_list_profiles(FILE *f, int json, PxError *err);
/* The precision a job gets when none is given: bf16 where the device has bf16 tensor cores,
 * fp32 otherwise (CPU ranks). */
PxDtype sim_default_precision(const ProfDevice *d);

#endif
