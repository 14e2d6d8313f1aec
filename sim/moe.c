/* Costing what a MoE layer runs beyond dense ops: the routed experts' GEMMs as Transformer
 * Engine's grouped GEMM issues them, and the dispatcher's device-to-host sync. The all-to-all
 * itself is in cost.c (sim_all_to_all_seconds). docs/time.md, "MoE as it runs", derives each
 * term and the constants it reads. */
#include "sim/internal.h"

/* Transformer Engine's grouped GEMM (general_grouped_gemm, Megatron-Core's TEGroupedLinear,
 * --moe-grouped-gemm) launches one cuBLAS GEMM per local expert, round-robin over its compute
 * streams: 4 (transformer_engine/common/util/multi_stream.cpp, get_num_compute_streams). So at
 * most 4 experts' GEMMs share the SMs at a time, and wave quantization applies to each group
 * of 4, not to all the experts' tiles together: a narrow expert's GEMM that fills part of a
 * wave leaves SMs idle that only the 3 others beside it can take. */
enum { SIM_MOE_GEMM_STREAMS = 4 };

int sim_is_expert_gemm(const ModelOp *op)
{
    return op->kind == MODEL_OP_MATMUL &&
           (op->role == MODEL_OPR_EXP_FC1 || op->role == MODEL_OPR_EXP_FC2);
}

int64_t sim_moe_gemm_split(const ModelOp *op, int i, ModelGemm *four, ModelGemm *rest)
{
    const ModelGemm *g = &op->gemm[i];
    if (!sim_is_expert_gemm(op) || g->batch <= SIM_MOE_GEMM_STREAMS)
        return 0;
    /* batch experts of m x n x k each: full rounds of 4 concurrent GEMMs, then the rest */
    *four = *g;
    *rest = *g;
    four->batch = SIM_MOE_GEMM_STREAMS;
    rest->batch = g->batch % SIM_MOE_GEMM_STREAMS;
    return g->batch / SIM_MOE_GEMM_STREAMS;
}

double sim_host_sync_seconds(const SimCtx *c, const ModelOp *op)
{
    return op->host_syncs * c->cl->device.host_sync_s;
}
