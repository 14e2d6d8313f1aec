/* Private interfaces between the export files (not part of export.h's public contract): what
 * several formats share (export/common.c) and each format's writer, which export_plan calls with
 * the plan's spec checked and its dims. */
#ifndef EXPORT_INTERNAL_H
#define EXPORT_INTERNAL_H

#include "export/export.h"

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
extern const char *const export_gpipe_note;
/* The context-parallel comm type as Megatron-Core's cp_comm_type spells it: "p2p",
 * "all_gather", "a2a" (TransformerConfig, Transformer Engine's attention). */
const char *export_cp_comm_name(ModelCpComm c);
int export_fp8_param_gather_ok(const ModelPlan *p);
/* MoE and MLA overrides shared by NeMo 1.x (bridge 0) and Megatron-Bridge (bridge 1). */
void export_moe_overrides(FILE *f, const ModelPlan *p, int bridge);
void export_nemo1(FILE *f, const ModelPlan *p, const ModelDims *d);
void export_bridge(FILE *f, const ModelPlan *p, const ModelDims *d);
int export_torchtitan(FILE *f, const ModelPlan *p, const ModelDims *d, PxError *err);
int export_torchtitan_toml(FILE *f, const ModelPlan *p, const ModelDims *d, PxError *err);
int export_slurm(FILE *f, const ModelPlan *p, const ModelDims *d, PxError *err);

#endif
