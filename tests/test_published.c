/* The published runs (the JSON files in published/; docs/calibration.md, "Published runs"): every row of
 * every source priced, each within its stated tolerance, and the rows this test knows at their
 * exact predicted figure (the analytic model is deterministic: a change to any term the rows
 * exercise moves them, and this test says which). Then what the framework does: the torchtitan
 * rows priced as Megatron runs them (no op-level selective recompute, the layout's overlap). */
/* glob */
#define _XOPEN_SOURCE 700
#include <glob.h>

#include "fixtures.h"
#include "sim/internal.h"
#include "test.h"

/* the Llama 3 rows' peak bytes a rank (test_llama3_memory) */
#define LLAMA3_PEAK_8K_8192 98777948416ull
#define LLAMA3_PEAK_8K_16384 91228241920ull
#define LLAMA3_PEAK_128K 91429568512ull

typedef struct {
    const char *id;
    double predicted;
} Known;

static const Known known[] = {
    {"ibm-7b-a100x128-hsdp-noac", 3745.2426831223374},
    {"ibm-34b-a100x128-fsdp-full", 634.2883311801054},
    {"ibm-70b-a100x128-fsdp-full", 316.92655985557826},
    {"ibm-7b-h100x96-hsdp-noac", 9204.96543338466},
    {"ibm-34b-h100x96-fsdp-full", 1690.4874934852448},
    {"ibm-70b-h100x96-fsdp-full", 858.4032178153533},
    {"ibm-7b-a100x128-hsdp-noac-compile", 4188.471690224117},
    {"ibm-7b-h100x96-hsdp-noac-compile", 11232.59151990922},
    {"narayanan-t1-1.7b", 142.84525772714679},
    {"narayanan-t1-3.6b", 141.37441919718762},
    {"narayanan-t1-7.5b", 139.65670370200786},
    {"narayanan-t1-18.4b", 134.2360976145867},
    {"narayanan-t1-39.1b", 141.49320669647912},
    {"narayanan-t1-76.1b", 146.36260406306585},
    {"narayanan-t1-145.6b", 151.60584435548532},
    {"narayanan-t1-310.1b", 156.67208550343634},
    {"narayanan-t1-529.6b", 158.40777489902345},
    {"narayanan-t1-1t", 159.42427909505284},
    {"tt-l3-8b-a100x64-sacop", 2988.8000847258609},
    {"tt-l3-70b-a100x64-full", 311.79889924065219},
    {"tt-l2-13b-a100x64-noac", 2169.1586939084359},
    {"tt-l2-13b-a100x64-sacop", 1920.25015924175},
    {"tt-l2-70b-a100x64-sacop", 375.49927354942002},
    {"tt-l2-70b-a100x64-full", 329.04976345340049},
    /* MoE Parallel Folding: an all-to-all across 8 nodes (G8T8 TP+EP+DP, one EP rank a node)
     * and across 2 (G8T8 without folding, at vpp 1; Mixtral 8x22B TP+EP+DP over 4), at the
     * all-to-all's own rate across nodes (network.all_to_all_efficiency) */
    {"mpf-t4-g8t8-tpepdp-128", 88.63820054014793},
    {"mpf-t4-g8t8-mcore-1024", 126.99572735424454},
    {"mpf-t3-mixtral8x22b-tpepdp-128", 370.5718619232166},
    /* on PaLM's count (flop_count palm): context parallelism's all-gather at 128K */
    {"llama3-405b-8k-h100x8192", 483.9377035904461},
    {"llama3-405b-8k-h100x16384", 453.5879903614732},
    {"llama3-405b-128k-h100x16384", 529.617410752626},
    /* FP8 on Hopper (docs/time.md, "FP8 on Hopper against published runs"): NeMo 25.02's
     * delayed-scaling rows at the SM90 FP8 GEMM rate (matmul_fp8 0.627), B200's unchanged, with
     * bf16 gradients as the 25.02 performance recipes reduce them (grad_reduce_in_fp32 off); MoE
     * Parallel Folding's FP8 rows, their experts' FP8 padding copies priced (docs/time.md, "MoE
     * experts in FP8": 606.96 and 647.04 before) */
    {"nemo2502-gpt3-175b-h100x512-fp8", 835.9527887352398},
    {"nemo2502-gpt3-175b-b200x512-fp8", 1629.0087103550009},
    {"nemo2502-llama3-8b-b200x8-fp8", 31740.93282985364},
    {"nemo2502-llama3-70b-b200x64-fp8", 3457.4281439323654},
    {"nemo2502-llama3-405b-b200x128-fp8", 677.592340949326},
    {"mpf-t2-mixtral8x22b-mcore-128-fp8", 593.227023005246},
    {"mpf-t2-mixtral8x22b-folding-128-fp8", 638.962966342433},
    /* NeMo 25.04 on GB200, current scaling: the amax pass on Blackwell */
    /* DeepSeek-V3 on its 2,048 H800: the flex dispatcher's node-deduplicated all-to-all
     * (docs/time.md, "MoE as it runs"; 1433.88 on the all-to-all's path) */
    {"dsv3-report-h800x2048-fp8", 1571.53029039959},
    {"nemo2504-gpt3-175b-gb200x128-fp8cs", 1683.979717556297},
    {"nemo2504-llama3-8b-gb200x8-fp8cs", 33678.46391309853},
    {"nemo2504-llama3-405b-gb200x128-fp8cs", 751.874531203117},
    /* NeMo 25.04 on B200, Llama 3 8B from 8K to 1024K tokens: context parallelism over the p2p
     * ring (cp 2-16) at long sequences, on NeMo's full (not causal) count */
    {"nemo2504-llama3-8b-b200x2-s8k-cp1", 1764.0976286107862},
    {"nemo2504-llama3-8b-b200x4-s16k-cp1", 1797.3260489584536},
    {"nemo2504-llama3-8b-b200x8-s32k-cp2", 1775.5323497523975},
    {"nemo2504-llama3-8b-b200x16-s64k-cp4", 1777.6176789717263},
    {"nemo2504-llama3-8b-b200x32-s128k-cp4", 1759.2862261846542},
    {"nemo2504-llama3-8b-b200x64-s256k-cp4", 1727.7150673673725},
    {"nemo2504-llama3-8b-b200x128-s512k-cp8", 1763.1321242388537},
    {"nemo2504-llama3-8b-b200x256-s1024k-cp16", 1782.757189475114},
};

static const Known *find(const char *id)
{
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        if (strcmp(known[i].id, id) == 0)
            return &known[i];
    return NULL;
}

/* Llama 3 8B, FSDP over 8 H100, as framework fw runs it (recompute rc, compiled or eager). */
static double step(ModelFramework fw, ModelRecompute rc, int fused, int overlap)
{
    PxError err = {0};
    ModelSpec s;
    model_spec_defaults(&s);
    CHECK_OK(model_config_load("llama3-8b", &s.model, &err), err);
    s.layout.zero = 3;
    s.layout.fsdp = 1;
    s.layout.recompute = rc;
    s.layout.overlap_dp = overlap;
    s.job.global_batch = 8;
    s.job.micro_batch = 1;
    s.job.seq_len = 8192;
    s.job.fused_kernels = fused;
    s.job.framework = fw;
    ProfCluster cl;
    CHECK_OK(prof_cluster_load("dgx-h100", NULL, 0, &cl, &err), err);
    SimResult r;
    CHECK_OK(sim_run(&s, &cl, 8, &r, &err), err);
    const double t = r.step_s;
    sim_result_free(&r);
    prof_cluster_free(&cl);
    return t;
}

/* Each framework's settings live in its file alone: Megatron's, NeMo's and Bridge's change
 * nothing; torchtitan's, on a compiled job without selective recompute, only turn the DP
 * overlap on; its op-level recompute and eager norms each lengthen the step. */
static void test_frameworks(void)
{
    const double mg = step(MODEL_FW_MEGATRON, MODEL_RECOMPUTE_SELECTIVE, 0, 0);
    CHECK(mg == step(MODEL_FW_NEMO, MODEL_RECOMPUTE_SELECTIVE, 0, 0));
    CHECK(mg == step(MODEL_FW_BRIDGE, MODEL_RECOMPUTE_SELECTIVE, 0, 0));
    CHECK(mg == step(MODEL_FW_DEEPSPEED, MODEL_RECOMPUTE_SELECTIVE, 0, 0));
    const double overlapped = step(MODEL_FW_MEGATRON, MODEL_RECOMPUTE_NONE, 1, 1);
    CHECK(overlapped == step(MODEL_FW_TORCHTITAN, MODEL_RECOMPUTE_NONE, 1, 0));
    const double sac = step(MODEL_FW_TORCHTITAN, MODEL_RECOMPUTE_SELECTIVE, 1, 0);
    CHECK(sac > overlapped * 1.05); /* a third of the matmuls again */
    CHECK(step(MODEL_FW_TORCHTITAN, MODEL_RECOMPUTE_NONE, 0, 0) > step(MODEL_FW_MEGATRON, MODEL_RECOMPUTE_NONE, 0, 1));
}

/* fms-fsdp's kernels as its profile gives them (docs/time.md, "Frameworks"), Llama 2 7B with
 * mbs 2 x 4096 = 8,192 tokens on one H100:
 *  - its eager rotary embedding, 36 bytes an element of q and k in 4 kernels a tensor each pass:
 *    36 x 8,192 x (4,096 + 4,096) = 2,415,919,104 bytes and 8 kernels on the QKV projection,
 *    forward and backward; compiled (fused_kernels), nothing;
 *  - its attention on FlashAttention-2's kernels: H100's attention_fa2 0.35 of the peak where
 *    Megatron's fused kernel reaches 0.55 forward and 0.45 backward. */
static void test_fms_kernels(void)
{
    PxError err = {0};
    ProfCluster cl;
    CHECK_OK(prof_cluster_load("dgx-h100", NULL, 0, &cl, &err), err);
    CHECK_REL(0.35, cl.device.attn_fa2_fwd_eff, 1e-12);
    CHECK_REL(0.35, cl.device.attn_fa2_bwd_eff, 1e-12);
    double qkv[2][2] = {{0}}; /* [eager][pass] bytes */
    int kern[2][2] = {{0}};
    double attn_s[2][2] = {{0}}; /* [fms][pass] seconds */
    for (int fms = 0; fms < 2; fms++)
        for (int fused = 0; fused < 2; fused++) {
            ModelSpec s;
            model_spec_defaults(&s);
            CHECK_OK(model_config_load("llama2-7b", &s.model, &err), err);
            s.job.global_batch = 2;
            s.job.micro_batch = 2;
            s.job.seq_len = 4096;
            s.job.fused_kernels = fused;
            s.job.framework = fms ? MODEL_FW_FMS_FSDP : MODEL_FW_MEGATRON;
            ModelDims d;
            CHECK_OK(model_spec_check(&s, 1, &d, &err), err);
            CHECK_EQ_INT(fms, d.attn_fa2);
            CHECK_REL(fms && !fused ? 36.0 : 0.0, d.rope_eager_bytes, 0);
            ModelOpGraph g;
            CHECK_OK(model_ops_build(&s, &d, 0, &g, &err), err);
            SimCtx c;
            sim_ctx_init(&c, &cl, &s, &d, 8);
            for (int i = 0; i < g.count; i++) {
                const ModelOp *op = &g.op[i];
                if (op->layer != 0 || op->phase == MODEL_RECOMPUTE)
                    continue;
                const int bwd = op->phase == MODEL_BWD;
                if (op->kind == MODEL_OP_MATMUL && op->role == MODEL_OPR_QKV && fms) {
                    qkv[!fused][bwd] = op->bytes;
                    kern[!fused][bwd] = op->kernels;
                }
                if (op->kind == MODEL_OP_ATTENTION && fused) {
                    attn_s[fms][bwd] = sim_compute_seconds(&c, op);
                    /* compute-bound: the causal half of the FLOPs at the rate, plus launches */
                    const double eff = fms ? 0.35 : (bwd ? 0.45 : 0.55);
                    CHECK_REL(0.5 * op->flops / (c.peak * eff) + op->kernels * 2e-6, attn_s[fms][bwd], 1e-12);
                }
            }
            model_ops_free(&g);
        }
    for (int pass = 0; pass < 2; pass++) {
        CHECK_REL(2415919104.0, qkv[1][pass] - qkv[0][pass], 1e-12);
        CHECK_EQ_INT(8, kern[1][pass] - kern[0][pass]);
        CHECK(attn_s[1][pass] > attn_s[0][pass]);
    }
    prof_cluster_free(&cl);
}

/* Llama 3 405B's Table 4 rows (published/llama3-2024-table4.json) as Meta ran them:
 * tp 8, pp 16, vpp 8 (one layer a chunk, the embedding and the loss each a chunk of their
 * own), SP, no recompute, micro-batch 1, on the row's cluster file, at ZeRO `zero`. */
static void llama3_row(const ProfCluster *cl, int gpus, int gbs, int seq, int cp, int zero,
                       SimResult *r)
{
    PxError err = {0};
    ModelSpec s;
    model_spec_defaults(&s);
    CHECK_OK(model_config_load("llama3-405b", &s.model, &err), err);
    s.layout.tp = 8;
    s.layout.pp = 16;
    s.layout.cp = cp;
    s.layout.vpp = 8;
    s.layout.zero = zero;
    s.layout.sp = 1;
    s.layout.recompute = MODEL_RECOMPUTE_NONE;
    s.layout.schedule = MODEL_SCHED_INTERLEAVED;
    s.layout.overlap_dp = 1;
    s.layout.embed_in_split = 1;
    s.layout.loss_in_split = 1;
    if (cp > 1)
        s.layout.cp_comm = MODEL_CP_COMM_ALLGATHER;
    s.job.global_batch = gbs;
    s.job.micro_batch = 1;
    s.job.seq_len = seq;
    s.job.precision = PX_BF16;
    s.job.grad_dtype = PX_FP32;
    CHECK_OK(sim_run(&s, cl, gpus, r, &err), err);
}

/* Why the Llama 3 rows do not fit (docs/calibration.md, "Llama 3 in memory"). Meta's FSDP
 * (parameters whole through the step, gradients and optimizer state sharded, FP32 gradients
 * accumulated over the micro-batches) is ZeRO-2 under a pipeline: the same step as ZeRO-1, the
 * gradients' FP32 shard (the size of the FP32 master shard) on top. Stage 0 holds
 * 2 (pp - 1) + (V - 1) pp + 1 = 143 one-layer sets at 32 micro-batches and all M V = 128
 * forwards at 16 (M V is below Megatron's warm-up, 142): the activations alone are 71.01 and
 * 63.56 GiB; with every stage's unsharded FP32 gradients counted the rows need 91.99, 84.96
 * and 85.15 GiB of 80, and without them the 16K rows would fit, the 8K-on-8192 row not. */
static void test_llama3_memory(void)
{
    PxError err = {0};
    ProfCluster cl;
    CHECK_OK(prof_cluster_load(PX_SOURCE_DIR "/published/clusters/meta-h100-roce.json", NULL, 0,
                               &cl, &err), err);
    static const struct {
        int gpus, gbs, seq, cp, live0;
        double step_s;
        uint64_t peak;
        int peak_stage, fits_without_grads;
    } rows[] = {
        {8192, 2048, 8192, 1, 143, 11.16412669810501, LLAMA3_PEAK_8K_8192, 0, 0},
        {16384, 2048, 8192, 1, 128, 5.95556094041222, LLAMA3_PEAK_8K_16384, 1, 1},
        {16384, 128, 131072, 16, 128, 10.98620676936077, LLAMA3_PEAK_128K, 1, 1},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        SimResult z1, z2;
        llama3_row(&cl, rows[i].gpus, rows[i].gbs, rows[i].seq, rows[i].cp, 1, &z1);
        llama3_row(&cl, rows[i].gpus, rows[i].gbs, rows[i].seq, rows[i].cp, 2, &z2);
        CHECK(z1.step_s == z2.step_s);
        CHECK_REL(rows[i].step_s, z2.step_s, 1e-9);
        CHECK_EQ_INT(rows[i].live0, z2.mem[0].peak_live);
        for (int k = 0; k < 16; k++)
            for (int c = 0; c < MODEL_CAT_COUNT; c++)
                CHECK(z2.mem[k].cat[c] == z1.mem[k].cat[c] +
                      (c == MODEL_GRADS ? z1.mem[k].cat[MODEL_MASTER] : 0));
        CHECK(z2.peak_bytes == rows[i].peak);
        CHECK_EQ_INT(rows[i].peak_stage, z2.peak_stage);
        CHECK(z2.peak_bytes > z2.rank_memory_bytes);
        const SimStageMemory *m = &z2.mem[z2.peak_stage];
        const uint64_t unsharded = m->cat[MODEL_GRADS] - z1.mem[z2.peak_stage].cat[MODEL_MASTER];
        CHECK_EQ_INT(rows[i].fits_without_grads, m->total - unsharded <= z2.rank_memory_bytes);
        sim_result_free(&z1);
        sim_result_free(&z2);
    }
    prof_cluster_free(&cl);
}

/* fms-fsdp's AdamW step as its profile gives it (docs/time.md, "Frameworks"): PyTorch's
 * multi-tensor AdamW on FSDP1's fp32 gradient shards after FSDP1's clip_grad_norm_, 92 bytes
 * per element of the rank's shard (80 for the eight foreach passes, 12 for the norm's read and
 * the clipping's scaling) and 10 kernels, where the fused count is 30 with bf16 gradients
 * (the gradient read 2, the fp32 master read and written 8, m and v 16, the bf16 weight written
 * 2, the norm's read 2): Llama 2 7B, HSDP 8 x 2 on 16 GPUs, the same shard either way, so the
 * ratio is 92 / 30 exactly. */
static void test_fms_optimizer(void)
{
    PxError err = {0};
    double bytes[2] = {0};
    int kernels[2] = {0};
    for (int fms = 0; fms < 2; fms++) {
        ModelSpec s;
        model_spec_defaults(&s);
        CHECK_OK(model_config_load("llama2-7b", &s.model, &err), err);
        s.layout.dp = 16;
        s.layout.zero = 3;
        s.layout.fsdp = 1;
        s.layout.dp_shard = 8;
        s.layout.dp_replicate = 2;
        s.job.global_batch = 32;
        s.job.micro_batch = 2;
        s.job.seq_len = 4096;
        s.job.precision = PX_BF16;
        s.job.grad_dtype = PX_BF16;
        s.job.framework = fms ? MODEL_FW_FMS_FSDP : MODEL_FW_MEGATRON;
        ModelDims d;
        CHECK_OK(model_spec_check(&s, 16, &d, &err), err);
        CHECK_REL(fms ? 92.0 : 0.0, d.adamw_step_bytes, 0);
        ModelOpGraph g;
        CHECK_OK(model_ops_build(&s, &d, 0, &g, &err), err);
        for (int i = 0; i < g.count; i++)
            if (g.op[i].kind == MODEL_OP_OPTIMIZER) {
                bytes[fms] += g.op[i].bytes;
                kernels[fms] += g.op[i].kernels;
            }
        model_ops_free(&g);
    }
    CHECK(bytes[0] > 0);
    CHECK_REL(92.0 / 30.0, bytes[1] / bytes[0], 1e-12);
    CHECK_EQ_INT(1, kernels[0]);
    CHECK_EQ_INT(10, kernels[1]);
}

/* NeMo 25.02's Llama 3 8B on 8 B200 (docs/calibration.md, "FP8 runs: NeMo 25.x"), its row's
 * layout by hand: tp 1, dp 8, micro-batch 2 x 8192, delayed FP8 with FP8 parameters. Its
 * gradients are bf16, as NeMo v2.2.0's performance recipes reduce them (grad_reduce_in_fp32
 * off): the weight-gradient accumulation and the reduce-scatter move half the bytes of fp32's,
 * 4.1759 -> 4.1294 s a step; the row in published/ says so (its pin moves without it). The
 * middle layer's terms the calibration note breaks the step into, one micro-batch in ms:
 * forward GEMMs 3.053, attention core 0.890, elementwise 0.703; backward 6.245, 2.719, 1.287
 * (fp32 gradients) or 1.141 (bf16: the accumulation is an elementwise pass). */
static void nemo_8b_step(PxDtype grad, SimResult *r)
{
    PxError err = {0};
    ModelSpec s;
    model_spec_defaults(&s);
    CHECK_OK(model_config_load("llama3-8b", &s.model, &err), err);
    s.layout.zero = 1;
    s.layout.overlap_dp = 1;
    s.job.global_batch = 128;
    s.job.micro_batch = 2;
    s.job.seq_len = 8192;
    s.job.precision = PX_BF16;
    s.job.grad_dtype = grad;
    s.job.fp8 = MODEL_FP8_DELAYED;
    s.job.fp8_param_gather = 1;
    s.job.pad_vocab = 128;
    s.job.framework = MODEL_FW_NEMO;
    ProfCluster cl;
    CHECK_OK(prof_cluster_load("dgx-b200", NULL, 0, &cl, &err), err);
    CHECK_OK(sim_run(&s, &cl, 8, r, &err), err);
    prof_cluster_free(&cl);
}

static void test_nemo_8b_b200(void)
{
    PxError err = {0};
    SimResult f32, b16;
    nemo_8b_step(PX_FP32, &f32);
    nemo_8b_step(PX_BF16, &b16);
    CHECK_REL(4.17592633239916, f32.step_s, 1e-9);
    CHECK_REL(4.129431252150266, b16.step_s, 1e-9);
    /* the row as published/ prices it is the bf16 one: 128 x 8192 / 8 tokens a GPU a step */
    CHECK_REL(31740.93282985364, 131072.0 / b16.step_s, 1e-9);
    SimLayerTime a, b;
    CHECK_OK(sim_layer_time(&f32, &a, &err), err);
    CHECK_OK(sim_layer_time(&b16, &b, &err), err);
    CHECK_REL(3.0530312436729563e-3, b.fwd.gemm_s, 1e-9);
    CHECK_REL(8.904942446674748e-4, b.fwd.attn_core_s, 1e-9);
    CHECK_REL(7.026810453333335e-4, b.fwd.elementwise_s, 1e-9);
    CHECK_REL(6.24455422445337e-3, b.bwd.gemm_s, 1e-9);
    CHECK_REL(2.71884352537284e-3, b.bwd.attn_core_s, 1e-9);
    CHECK_REL(1.2866987946666664e-3, a.bwd.elementwise_s, 1e-9);
    CHECK_REL(1.141296256e-3, b.bwd.elementwise_s, 1e-9);
    CHECK(a.bwd.gemm_s == b.bwd.gemm_s && a.bwd.attn_core_s == b.bwd.attn_core_s);
    sim_result_free(&f32);
    sim_result_free(&b16);
}

int main(void)
{
    px_log_set_quiet(1);
    glob_t g;
    CHECK(glob(PX_SOURCE_DIR "/published/*.json", 0, NULL, &g) == 0);
    int rows = 0, matched = 0;
    PxError err = {0};
    for (size_t k = 0; k < g.gl_pathc; k++) {
        SimPublished p;
        CHECK_OK(sim_published_run(g.gl_pathv[k], &p, &err), err);
        for (int i = 0; i < p.n_rows; i++) {
            const SimPublishedRow *r = &p.rows[i];
            if (!r->inside)
                fprintf(stderr, "%s: %s predicted %g against %g measured: %+.1f%%, outside %.0f%%\n",
                        p.source, r->id, r->predicted, r->measured, 100 * r->error, 100 * r->tolerance);
            CHECK(r->inside);
            const Known *w = find(r->id);
            if (w) {
                CHECK_REL(w->predicted, r->predicted, 1e-9);
                matched++;
            }
            rows++;
        }
        sim_published_free(&p);
    }
    globfree(&g);
    CHECK_EQ_INT((int)(sizeof known / sizeof known[0]), matched);
    /* the framework: op-level selective recompute and FSDP2's overlap make the torchtitan rows
     * what they are; priced as Megatron runs them (selective = the attention core, which flash
     * attention leaves nothing of; overlap off, the layout's default) they move */
    SimPublished mg;
    CHECK_OK(sim_published_run_as(PX_SOURCE_DIR "/published/torchtitan-performance-2024-04.json",
                                  "megatron", &mg, &err), err);
    CHECK_STR("tt-l3-8b-a100x64-sacop", mg.rows[0].id);
    CHECK_REL(3054.2142759822136, mg.rows[0].predicted, 1e-9);
    sim_published_free(&mg);
    /* a bad row names its file, row and key */
    CHECK_INPUT_ERROR(sim_published_run_as(PX_SOURCE_DIR "/published/torchtitan-performance-2024-04.json",
                                           "pytorch", &mg, &err),
                      err, "rows[0] framework");
    test_frameworks();
    test_fms_kernels();
    test_llama3_memory();
    test_fms_optimizer();
    test_nemo_8b_b200();
    printf("test_published: %d rows, %d checks passed\n", rows, px_test_checks);
    return 0;
}
