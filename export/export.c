/* The exports' public entry points: the format names, and export_plan / export_slurm_job, which
 * check the plan's layout before any format is written. Each format has a file of its own:
 * Megatron-LM (megatron.c), DeepSpeed (deepspeed.c), NeMo 1.x (nemo.c), Megatron-Bridge
 * (bridge.c), torchtitan (titan.c) and Slurm (slurm.c); common.c holds what they share. */
#include "export/internal.h"

#include <string.h>

const char *export_format_name(ExportFormat fmt)
{
    static const char *const names[] = {"megatron", "deepspeed", "nemo", "bridge", "torchtitan", "slurm", "torchtitan-toml"};
    return (unsigned)fmt < EXPORT_COUNT ? names[fmt] : "?";
}

int export_format_from_name(const char *s)
{
    for (int i = 0; i < EXPORT_COUNT; i++)
        if (s && strcmp(s, export_format_name((ExportFormat)i)) == 0)
            return i;
    return -1;
}

/* The plan with its spec as model_spec_check normalises it (dp, schedule, global batch filled)
 * in *p, and its dims: what every writer reads. p->profile and p->prediction are the plan's,
 * not copies. PX_EINPUT when the layout breaks a rule. */
static int checked(const ModelPlan *plan, ModelPlan *p, ModelDims *d, PxError *err)
{
    ModelSpec s = plan->spec;
    int rc = model_spec_check(&s, plan->gpus, d, err);
    if (rc)
        return rc;
    *p = *plan;
    p->spec = s;
    /* the training figures every format writes, refused here rather than half-way through */
    ExportTrain t;
    return export_train(p, d, &t, err);
}

int export_plan(FILE *f, const ModelPlan *plan, ExportFormat fmt, PxError *err)
{
    ModelPlan p;
    ModelDims d;
    int rc = checked(plan, &p, &d, err);
    if (rc)
        return rc;
    switch (fmt) {
    case EXPORT_MEGATRON: export_megatron(f, &p, &d); break;
    case EXPORT_DEEPSPEED: export_deepspeed(f, &p, &d); break;
    case EXPORT_NEMO:
        export_nemo1(f, &p, &d);
        export_bridge(f, &p, &d);
        break;
    case EXPORT_BRIDGE: export_bridge(f, &p, &d); break;
    case EXPORT_TORCHTITAN: export_torchtitan(f, &p, &d); break;
    case EXPORT_SLURM: return export_slurm(f, &p, &d, NULL, err);
    case EXPORT_TORCHTITAN_TOML: export_torchtitan_toml(f, &p, &d); break;
    default: return px_fail(err, PX_EINPUT, "unknown export format %d", (int)fmt);
    }
    return PX_OK;
}

int export_slurm_job(FILE *f, const ModelPlan *plan, const ExportSlurmJob *job, PxError *err)
{
    ModelPlan p;
    ModelDims d;
    int rc = checked(plan, &p, &d, err);
    return rc ? rc : export_slurm(f, &p, &d, job, err);
}
