/* Private interfaces between the export files (not part of export.h's public contract): what
 * several formats share (export/common.c) and each format's writer, which export_plan and
 * export_slurm_job call with the plan's spec checked (model_spec_check) and its dims. */
#ifndef EXPORT_INTERNAL_H
#define EXPORT_INTERNAL_H

#include <stdarg.h>

#include "export/export.h"

/* ---- common.c ---- */

/* One word of a command line, on a line of its own four spaces in: the flag `name` and, with
 * fmt, its value, then `end` ("\n" for an element of a bash array, " \\\n" for a command that
 * goes on on the next line). Each format wraps it as its own printer (flag, arg). */
void export_vflag(FILE *f, const char *end, const char *name, const char *fmt, va_list ap)
    __attribute__((format(printf, 4, 0)));
/* Ranks per node of the plan's job (the cluster profile's node size, the whole job when it is
 * smaller), and in *nodes the nodes they take. */
int export_node_size(const ModelPlan *p, int *nodes);
const char *export_bool(int b); /* "true" / "false", as Hydra, TOML and tyro take them */
/* a / b to 12 significant digits (0 when b is 0): a ratio of two figures a person wrote (8e-7 /
 * 8e-5) as they would, 0.01, not the last bit of its binary quotient */
double export_ratio(double a, double b);
/* The router's score function as Megatron-Core and NeMo name it: "softmax", "sigmoid". */
const char *export_router_score(const ModelMoe *m);

/* Notes that read alike in every format */
/* The routing imbalance a MoE plan assumes, which no framework takes: "...not a <what>". */
void export_imbalance_note(FILE *f, const ModelPlan *p, const char *what);
/* A plan priced for one framework (training.framework) exported to another that runs it
 * differently (profiles/frameworks: op-level selective recompute, always-overlapped data-parallel
 * communication, eager norms): a WARNING naming each difference that touches this plan, that
 * the plan's predicted step is its own framework's, and how to plan for `runs_on`. As "# "
 * lines to f, or, with f NULL, a warning on standard error (a format without comments). Nothing
 * when the two price the plan alike. */
void export_framework_note(FILE *f, const ModelPlan *p, ModelFramework runs_on);
/* GPipe, which Megatron-LM, NeMo and Megatron-Bridge do not offer: NOT EXPRESSIBLE when the plan
 * pipelines with it. */
void export_gpipe_note(FILE *f, const ModelLayout *l);

/* Megatron-Core's pipeline split, which Megatron-LM, NeMo and Megatron-Bridge share */
/* An uneven split as Megatron-Core's first/last stage counts: 0 when its middle stages differ;
 * *first / *last are -1 where not needed. */
int export_megatron_split(const ModelLayout *l, int *first, int *last);
/* The split as Megatron-Core's --pipeline-model-parallel-layout string: "Et*2|t*3|tmL" (mtp:
 * the model's prediction modules, in the last stage) */
void export_megatron_layout(char *buf, size_t cap, const ModelLayout *l, int mtp);
/* The pipeline split in Megatron-Core's terms, said the way the plan says it: the layout
 * string as given, the embedding/loss counted, the first/last stage layers (given, or of a
 * split whose middle stages are even, vpp 1), else the split as a layout string. */
typedef struct {
    int embed, loss;   /* --account-for-embedding/loss-in-pipeline-split */
    int first, last;   /* --decoder-first/last-pipeline-num-layers; -1: not given */
    char layout[4096]; /* --pipeline-model-parallel-layout; "": none */
} ExportMegatronSplit;
/* 0 when the split is the even one (nothing to say) */
int export_megatron_pipeline(const ModelPlan *p, const ModelDims *d, ExportMegatronSplit *out);
/* The context-parallel comm type as Megatron-Core's cp_comm_type spells it: "p2p",
 * "all_gather", "a2a" (TransformerConfig, Transformer Engine's attention). */
const char *export_cp_comm_name(ModelCpComm c);
/* Whether FP8-only weights are expressible: Megatron takes them only with the distributed
 * optimizer or FSDP (ZeRO 1 and up). */
int export_fp8_param_gather_ok(const ModelPlan *p);

/* ---- train.c: the training length and the learning-rate schedule ---- */

/* What every format writes of the training: iterations, the warm-up, the peak and minimum
 * learning rate and the decay, each from the plan (its user set it), the model's published
 * recipe (the zoo's "recipe") or parallax's default, and notes saying which. */
typedef struct {
    int iters;          /* training iterations */
    int warmup;         /* linear warm-up iterations, below decay_iters */
    double lr, min_lr;  /* the peak and the minimum the decay reaches */
    int decay_iters;    /* the iteration where the decay reaches min_lr, counted from 0 and held
                           after (Megatron's lr_decay_iters); may pass iters */
    int wsd;            /* warm-up-stable-decay: the peak held until wsd_iters before decay_iters */
    int wsd_iters;      /* WSD: the cosine decay's iterations */
    int recipe;         /* 1 when a figure is the recipe's */
    int defaults;       /* 1 when a figure is parallax's default (notes say WARNING) */
    char notes[2048];   /* where each figure comes from: lines, each ending in '\n' */
} ExportTrain;
/* The job's training figures; PX_EINPUT when the iterations pass INT_MAX or the zoo's recipe is
 * malformed (export_plan checks it before any format is written). */
int export_train(const ModelPlan *p, const ModelDims *d, ExportTrain *t, PxError *err);
void export_train_comments(FILE *f, const ExportTrain *t); /* the notes as "# " lines */
void export_train_warn(const ExportTrain *t);               /* the notes as warnings */

/* ---- the formats, one file each ---- */

void export_megatron(FILE *f, const ModelPlan *p, const ModelDims *d);  /* megatron.c */
void export_deepspeed(FILE *f, const ModelPlan *p, const ModelDims *d); /* deepspeed.c */
void export_nemo1(FILE *f, const ModelPlan *p, const ModelDims *d);     /* nemo.c */
void export_bridge(FILE *f, const ModelPlan *p, const ModelDims *d);    /* bridge.c */
/* titan.c: torchtitan 0.3's command line, 0.2's TOML job file */
void export_torchtitan(FILE *f, const ModelPlan *p, const ModelDims *d);
void export_torchtitan_toml(FILE *f, const ModelPlan *p, const ModelDims *d);
/* slurm.c: export_slurm_job's script (job NULL: every default); PX_EINPUT when the prediction
 * cannot be read, nothing written then */
int export_slurm(FILE *f, const ModelPlan *p, const ModelDims *d, const ExportSlurmJob *job, PxError *err);

#endif
