/* The planner for this machine ranks only what the executor runs: on the local cluster every
 * ranked layout passes model_exec_refusal (the statement the executor refuses plans by), the
 * layouts it refuses are counted under SIM_REJECT_EXECUTOR with its sentence, and the known
 * disagreements of the past (MoE with vpp 2, a2a context parallelism with flash attention: both
 * run now; the ring without it: no layout, for the simulator too) are answered by the planner
 * itself; a GPU cluster's plan is not filtered. tiny-dsv3
 * (multi-head latent attention) plans and what is refused of it is named; 16 bits, gradients
 * too, run on either backend. */
#include "fixtures.h"
#include "test.h"

static SimPlanRequest request(const char *model, int gpus, int gbs)
{
    PxError err = {0};
    SimPlanRequest q;
    memset(&q, 0, sizeof q);
    model_spec_defaults(&q.base);
    CHECK_OK(model_config_load(model, &q.base.model, &err), err);
    q.base.job.global_batch = gbs;
    q.base.job.seq_len = 64;
    q.gpus = gpus;
    q.top = 64;
    q.headroom = 0.05;
    return q;
}

/* Every ranked layout runs; returns how many the executor refused. */
static long all_run(const SimPlanRequest *q, const ProfCluster *cl)
{
    PxError err = {0};
    SimPlanResult r;
    CHECK_OK(sim_plan(q, cl, &r, &err), err);
    CHECK(r.n_top > 0);
    for (int i = 0; i < r.n_top; i++) {
        ModelSpec s = r.top[i].spec;
        ModelDims d;
        char why[512] = "";
        CHECK_OK(model_spec_check(&s, q->gpus, &d, &err), err);
        const int refused = model_exec_refusal(&s, &d, 0, why, sizeof why);
        if (refused)
            fprintf(stderr, "ranked #%d refused: %s\n", i + 1, why);
        CHECK_EQ_INT(0, refused);
    }
    const long n = r.rejected[SIM_REJECT_EXECUTOR];
    if (n)
        CHECK(r.example[SIM_REJECT_EXECUTOR][0] != '\0');
    sim_plan_free(&r);
    return n;
}

/* The bytes of the one tensor of the table (stage 0) with this role. */
static uint64_t role_bytes(const ModelSpec *s, const ModelDims *d, ModelTensorRole role)
{
    PxError err = {0};
    ModelTensorTable tt;
    CHECK_OK(model_tensors_build(s, d, 0, &tt, &err), err);
    uint64_t bytes = 0;
    int found = 0;
    for (int i = 0; i < tt.count; i++)
        if (tt.t[i].role == role)
            bytes = tt.t[i].bytes, found++;
    CHECK_EQ_INT(1, found);
    model_tensors_free(&tt);
    return bytes;
}

int main(void)
{
    px_log_set_quiet(1);
    setenv("PARALLAX_UNCALIBRATED", "1", 1);
    PxError err = {0};
    ProfCluster local, gpu;
    CHECK_OK(prof_cluster_load("local", NULL, 0, &local, &err), err);
    CHECK_OK(prof_cluster_load("dgx-a100", NULL, 0, &gpu, &err), err);

    /* tiny-moe on 2 and 4 ranks: every layout the simulator prices runs (context parallelism's
     * three comm types with flash attention, the default, among them) */
    SimPlanRequest q = request("tiny-moe", 2, 8);
    CHECK_EQ_INT(0, (int)all_run(&q, &local));
    q = request("tiny-moe", 4, 8);
    CHECK_EQ_INT(0, (int)all_run(&q, &local));
    /* the layout of a past disagreement: dp 2, pp 2, ep 2 picked vpp 2, which the executor
     * refused then and runs now (interleaved MoE): some ranked layout interleaves */
    q = request("tiny-moe", 4, 8);
    q.base.layout.dp = 2, q.base.layout.pp = 2, q.base.layout.ep = 2;
    q.pinned = SIM_PIN_DP | SIM_PIN_PP | SIM_PIN_EP;
    SimPlanResult r;
    CHECK_OK(sim_plan(&q, &local, &r, &err), err);
    int interleaved = 0;
    for (int i = 0; i < r.n_top; i++)
        interleaved |= r.top[i].spec.layout.vpp > 1;
    CHECK(interleaved);
    sim_plan_free(&r);
    /* dense models: a2a pinned runs with either core (once refused with flash attention on) */
    q = request("tiny-llama", 4, 8);
    CHECK_EQ_INT(0, (int)all_run(&q, &local));
    q = request("tiny-llama", 2, 8);
    q.base.layout.cp = 2, q.base.layout.cp_comm = MODEL_CP_COMM_A2A;
    q.pinned = SIM_PIN_CP | SIM_PIN_CP_COMM;
    q.base.job.flash_attn = 1;
    CHECK_EQ_INT(0, (int)all_run(&q, &local));
    q.base.job.flash_attn = 0;
    CHECK_EQ_INT(0, (int)all_run(&q, &local));
    /* the ring pinned without flash attention: no layout, by the layout's own rule, on any
     * cluster (the simulator prices none) */
    q.base.layout.cp_comm = MODEL_CP_COMM_P2P;
    CHECK_INPUT_ERROR(sim_plan(&q, &local, &r, &err), err,
                      "p2p context parallelism without the fused attention core (e.g. cp 2 "
                      "with cp comm type p2p runs the fused attention core");
    sim_plan_free(&r);
    CHECK_INPUT_ERROR(sim_plan(&q, &gpu, &r, &err), err, "keep --flash-attn");
    sim_plan_free(&r);
    /* unpinned without flash attention: the ring's layouts are not ranked, the others are */
    q = request("tiny-llama", 2, 8);
    q.base.job.flash_attn = 0;
    CHECK_OK(sim_plan(&q, &local, &r, &err), err);
    CHECK(r.rejected[MODEL_RULE_CP_CORE] > 0);
    for (int i = 0; i < r.n_top; i++)
        CHECK(r.top[i].spec.layout.cp == 1 ||
              r.top[i].spec.layout.cp_comm != MODEL_CP_COMM_P2P);
    sim_plan_free(&r);

    /* 16-bit gradients: run on CUDA in the weights' type and on the CPU (kern_cpu_with_grads),
     * experts and FP8 GEMMs included */
    {
        ModelSpec s = request("tiny", 2, 8).base;
        s.layout.dp = 2, s.layout.zero = 1;
        s.job.precision = PX_BF16, s.job.grad_dtype = PX_BF16;
        ModelDims d;
        char why[512] = "";
        CHECK_OK(model_spec_check(&s, 2, &d, &err), err);
        CHECK_EQ_INT(0, model_exec_refusal(&s, &d, 1, why, sizeof why));
        CHECK_EQ_INT(0, model_exec_refusal(&s, &d, 0, why, sizeof why));
        s.job.precision = PX_FP16, s.job.grad_dtype = PX_FP32;
        CHECK_OK(model_spec_check(&s, 2, &d, &err), err);
        CHECK_EQ_INT(0, model_exec_refusal(&s, &d, 0, why, sizeof why));
        CHECK_STR("", why);
        s.job.fp8 = MODEL_FP8_DELAYED;
        CHECK_OK(model_spec_check(&s, 2, &d, &err), err);
        CHECK_EQ_INT(0, model_exec_refusal(&s, &d, 0, why, sizeof why));
        CHECK_EQ_INT(0, model_exec_refusal(&s, &d, 1, why, sizeof why));
        CHECK_STR("", why);
        s.job.fp8 = MODEL_FP8_NONE;
        /* fp32 (its gradients fp32): on either backend, CUDA's in full fp32 GEMMs */
        s.job.precision = PX_FP32, s.job.grad_dtype = PX_FP32;
        CHECK_OK(model_spec_check(&s, 2, &d, &err), err);
        why[0] = '\0';
        CHECK_EQ_INT(0, model_exec_refusal(&s, &d, 1, why, sizeof why));
        CHECK_EQ_INT(0, model_exec_refusal(&s, &d, 0, why, sizeof why));
        CHECK_STR("", why);
        s.job.precision = PX_BF16, s.job.grad_dtype = PX_BF16;
        /* of another 16-bit type than the weights': no job, the spec's rule */
        s.job.grad_dtype = PX_FP16;
        CHECK_INPUT_ERROR(model_spec_check(&s, 2, &d, &err), err,
                          "16-bit gradients are kept in the weights' type: grad dtype fp16 with "
                          "precision bf16 (use --grad-dtype bf16 or fp32)");
        s = request("tiny-moe", 2, 8).base;
        s.layout.dp = 2;
        s.job.precision = PX_BF16, s.job.grad_dtype = PX_BF16;
        CHECK_OK(model_spec_check(&s, 2, &d, &err), err);
        CHECK_EQ_INT(0, model_exec_refusal(&s, &d, 1, why, sizeof why));
        CHECK_EQ_INT(0, model_exec_refusal(&s, &d, 0, why, sizeof why));
        s.job.fp8 = MODEL_FP8_MXFP8;
        CHECK_OK(model_spec_check(&s, 2, &d, &err), err);
        CHECK_EQ_INT(0, model_exec_refusal(&s, &d, 0, why, sizeof why));
        CHECK_STR("", why);
    }

    /* tiny-dsv3 (multi-head latent attention and its prediction module): every ranked layout on
     * 2 and 4 ranks runs */
    q = request("tiny-dsv3", 2, 8);
    all_run(&q, &local);
    q = request("tiny-dsv3", 4, 8);
    all_run(&q, &local);
    /* and what the executor runs of it: odd key and value widths per rank; FP8 GEMMs without a
     * query latent and with a latent wider than the hidden size; every cp_comm_type, all-gather's
     * with its prediction module; CUDA runs it */
    {
        ModelSpec s = request("tiny-dsv3", 1, 8).base;
        s.job.precision = PX_FP32;
        ModelDims d;
        char why[512] = "";
        CHECK_OK(model_spec_check(&s, 1, &d, &err), err);
        CHECK_EQ_INT(0, model_exec_refusal(&s, &d, 0, why, sizeof why));
        s.layout.cp = 2, s.layout.cp_comm = MODEL_CP_COMM_ALLGATHER; /* MoE layers run it */
        CHECK_OK(model_spec_check(&s, 2, &d, &err), err);
        CHECK_EQ_INT(0, model_exec_refusal(&s, &d, 0, why, sizeof why));
        s = request("tiny-dsv3", 1, 8).base;
        s.job.precision = PX_FP32;
        s.model.mtp_layers = 0;
        CHECK_OK(model_spec_check(&s, 1, &d, &err), err);
        CHECK_EQ_INT(0, model_exec_refusal(&s, &d, 0, why, sizeof why));
        s.job.precision = PX_BF16; /* on CUDA */
        CHECK_OK(model_spec_check(&s, 1, &d, &err), err);
        CHECK_EQ_INT(0, model_exec_refusal(&s, &d, 1, why, sizeof why));
        s.job.fp8 = MODEL_FP8_TENSORWISE; /* FP8 GEMMs run, with a query latent */
        CHECK_OK(model_spec_check(&s, 1, &d, &err), err);
        CHECK_EQ_INT(0, model_exec_refusal(&s, &d, 1, why, sizeof why));
        /* and FP8 attention (once refused with MLA), tensorwise and delayed, on both backends,
         * with tp 2 and SP too */
        s.job.fp8_attention = 1;
        for (int recipe = 0; recipe < 2; recipe++) {
            s.job.fp8 = recipe ? MODEL_FP8_DELAYED : MODEL_FP8_TENSORWISE;
            CHECK_OK(model_spec_check(&s, 1, &d, &err), err);
            CHECK_EQ_INT(0, model_exec_refusal(&s, &d, 1, why, sizeof why));
            s.job.precision = PX_FP32, s.layout.tp = 2, s.layout.sp = 1;
            CHECK_OK(model_spec_check(&s, 2, &d, &err), err);
            CHECK_EQ_INT(0, model_exec_refusal(&s, &d, 0, why, sizeof why));
            s.job.precision = PX_BF16, s.layout.tp = 1, s.layout.sp = 0;
        }
        s.job.fp8 = MODEL_FP8_TENSORWISE, s.job.fp8_attention = 0;
        s.model.mla.q_lora_rank = 0; /* and without a query latent */
        CHECK_OK(model_spec_check(&s, 1, &d, &err), err);
        CHECK_EQ_INT(0, model_exec_refusal(&s, &d, 1, why, sizeof why));
        s.model.mla.kv_lora_rank = 112; /* a latent wider than the hidden size and the queries */
        CHECK_OK(model_spec_check(&s, 1, &d, &err), err);
        CHECK_EQ_INT(0, model_exec_refusal(&s, &d, 1, why, sizeof why));
        s.model.mla.kv_lora_rank = 16;
        s.model.kv_heads = 2; /* no MLA model: the spec refuses it, naming the field */
        CHECK(model_spec_check(&s, 1, &d, &err) == PX_EINPUT);
        CHECK(strstr(err.msg, "kv_heads 2 must equal heads 4 with multi-head latent attention") !=
              NULL);
        s.model.kv_heads = 4;
        s.model.mla.q_lora_rank = 32;
        s.job.fp8 = MODEL_FP8_NONE;
        s.model.mla.v_dim = 15, s.layout.tp = 4, s.layout.sp = 1; /* a head per rank: 24 + 15 */
        CHECK_OK(model_spec_check(&s, 4, &d, &err), err);
        CHECK_EQ_INT(39, d.kv2_loc); /* its keys and values, odd: their exact width */
        CHECK_EQ_INT(0, model_exec_refusal(&s, &d, 1, why, sizeof why));
        s.model.mla.v_dim = 16, s.layout.tp = 1, s.layout.sp = 0;
        s.job.precision = PX_FP32;
        /* MLA and MoE layers over the all-gather's cp 2, and cp 2 x ep 2 on the same 2 ranks */
        s.layout.cp = 2, s.layout.cp_comm = MODEL_CP_COMM_ALLGATHER;
        CHECK_OK(model_spec_check(&s, 2, &d, &err), err);
        CHECK_EQ_INT(0, model_exec_refusal(&s, &d, 0, why, sizeof why));
        s.layout.ep = 2;
        CHECK_OK(model_spec_check(&s, 2, &d, &err), err);
        CHECK_EQ_INT(0, model_exec_refusal(&s, &d, 0, why, sizeof why));
        s.layout.ep = 1;
        /* the ring's and Ulysses' cores too: the ring with flash on (off it is no layout),
         * Ulysses with either */
        s.layout.cp_comm = MODEL_CP_COMM_P2P;
        s.job.flash_attn = 1;
        CHECK_OK(model_spec_check(&s, 2, &d, &err), err);
        CHECK_EQ_INT(0, model_exec_refusal(&s, &d, 0, why, sizeof why));
        s.job.flash_attn = 0;
        CHECK_INPUT_ERROR(model_spec_check(&s, 2, &d, &err), err,
                          "cp 2 with cp comm type p2p runs the fused attention core");
        s.layout.cp_comm = MODEL_CP_COMM_A2A;
        for (int flash = 0; flash <= 1; flash++) {
            s.job.flash_attn = flash;
            CHECK_OK(model_spec_check(&s, 2, &d, &err), err);
            CHECK_EQ_INT(0, model_exec_refusal(&s, &d, 0, why, sizeof why));
        }
        /* FP8 attention with MLA and cp (once refused: its K, V planes not moved in FP8) runs
         * where ordinary attention's does: every cp kind under tensorwise and delayed (the ring
         * and Ulysses under delayed once refused: the output's and dQKV's codes now in MLA's
         * widths, a fourth history on kv_b's amax) */
        s.job.fp8_attention = 1, s.job.flash_attn = 1;
        const ModelCpComm kinds[] = {MODEL_CP_COMM_ALLGATHER, MODEL_CP_COMM_P2P, MODEL_CP_COMM_A2A};
        for (int i = 0; i < 3; i++)
            for (int recipe = 0; recipe < 2; recipe++) {
                s.layout.cp_comm = kinds[i];
                s.job.fp8 = recipe ? MODEL_FP8_DELAYED : MODEL_FP8_TENSORWISE;
                CHECK_OK(model_spec_check(&s, 2, &d, &err), err);
                CHECK_EQ_INT(0, model_exec_refusal(&s, &d, 0, why, sizeof why));
                CHECK_EQ_INT(recipe ? 3 + (i > 0) : 0, model_fp8_attn_history(&s));
                CHECK_EQ_INT(MODEL_TR_KV_B_W, model_fp8_attn_weight(&s));
            }
        /* MXFP8 attention with MLA on the spec's shapes (head widths 32, sequence 128) runs
         * with cp over every kind (once refused by name: the cp cores did not quantize its
         * planes into both copies), the exchanges in the act dtype as ordinary attention's
         * (model_fp8_attn_cp16), and at cp 1 (the column-wise copies one per plane) */
        s.job.fp8 = MODEL_FP8_MXFP8;
        s.model.mla.qk_nope_dim = 24, s.model.mla.v_dim = 32;
        s.model.seq_len = s.job.seq_len = 128;
        for (int i = 0; i < 3; i++) {
            s.layout.cp_comm = kinds[i];
            CHECK_OK(model_spec_check(&s, 2, &d, &err), err);
            CHECK_EQ_INT(1, model_fp8_attn_cp16(&s));
            CHECK_EQ_INT(i == 2, model_fp8_attn_saved(&s));
            CHECK_EQ_INT(0, model_exec_refusal(&s, &d, 0, why, sizeof why));
        }
        s.layout.cp = 1;
        for (int cuda = 0; cuda < 2; cuda++) {
            s.job.precision = cuda ? PX_BF16 : PX_FP32;
            CHECK_OK(model_spec_check(&s, 1, &d, &err), err);
            CHECK_EQ_INT(2, model_fp8_attn_copies(&s));
            CHECK_EQ_INT(0, model_exec_refusal(&s, &d, cuda, why, sizeof why));
        }
    }

    /* the shared experts' gate (Qwen2-MoE) with tp 2 and SP runs, with the MLP's biases and
     * with FP8 GEMMs too; so do GeLU experts, and shared experts wider than the dense MLP */
    {
        ModelSpec s = request("tiny-moe", 2, 8).base;
        ModelDims d;
        char why[512] = "";
        s.job.precision = PX_FP32;
        s.model.moe.shared_gate = 1;
        s.layout.tp = 2, s.layout.sp = 1;
        CHECK_OK(model_spec_check(&s, 2, &d, &err), err);
        CHECK_EQ_INT(0, model_exec_refusal(&s, &d, 0, why, sizeof why));
        s.model.bias = 1;
        CHECK_OK(model_spec_check(&s, 2, &d, &err), err);
        CHECK_EQ_INT(0, model_exec_refusal(&s, &d, 0, why, sizeof why));
        s.job.fp8 = MODEL_FP8_BLOCKWISE;
        CHECK_OK(model_spec_check(&s, 2, &d, &err), err);
        CHECK_EQ_INT(0, model_exec_refusal(&s, &d, 0, why, sizeof why));
        s.model.mlp = MODEL_GELU;
        s.model.moe.shared_ffn = 192; /* wider than ffn_hidden 176 */
        CHECK_OK(model_spec_check(&s, 2, &d, &err), err);
        CHECK_EQ_INT(0, model_exec_refusal(&s, &d, 0, why, sizeof why));
    }

    /* the zoo's Qwen2-57B-A14B (shared_ffn 20480 over ffn_hidden 18944) runs: the MLP's
     * backward scratch is the shared experts' width, ws.dffn [b, s/tp, 2 x 20480/tp] and
     * ws.dact [b, s/tp, 20480/tp] in bf16, their bytes exact */
    {
        ModelSpec s = request("qwen2-57b-a14b", 8, 8).base;
        ModelDims d;
        char why[512] = "";
        s.job.precision = PX_BF16;
        s.job.seq_len = 4096;
        s.job.micro_batch = 1;
        s.layout.tp = 4, s.layout.sp = 1, s.layout.ep = 2, s.layout.dp = 2;
        CHECK_OK(model_spec_check(&s, 8, &d, &err), err);
        CHECK_EQ_INT(0, model_exec_refusal(&s, &d, 1, why, sizeof why));
        CHECK_EQ_U64(4096ull * 2 * 20480 / 4 * 2, role_bytes(&s, &d, MODEL_TR_WS_DFFN));
        CHECK_EQ_U64(4096ull * 20480 / 4 * 2, role_bytes(&s, &d, MODEL_TR_WS_DACT));
    }

    /* the prediction modules under ZeRO: 2 runs (tp 4 with SP too), 3 with the gathers kept
     * from the forward and without (the modules gather the embedding and the output layer
     * again); eh's scratch too narrow made wide enough */
    {
        ModelSpec s = request("tiny", 2, 8).base;
        s.job.precision = PX_FP32;
        s.model.mtp_layers = 1;
        s.layout.dp = 2, s.layout.zero = 2;
        ModelDims d;
        char why[512] = "";
        CHECK_OK(model_spec_check(&s, 2, &d, &err), err);
        CHECK_EQ_INT(0, model_exec_refusal(&s, &d, 0, why, sizeof why));
        s.layout.zero = 3;
        CHECK_OK(model_spec_check(&s, 2, &d, &err), err);
        CHECK_EQ_INT(0, model_exec_refusal(&s, &d, 0, why, sizeof why));
        s.layout.keep_gathered = 1;
        CHECK_OK(model_spec_check(&s, 2, &d, &err), err);
        CHECK_EQ_INT(0, model_exec_refusal(&s, &d, 0, why, sizeof why));
        s.layout.keep_gathered = 0;
        s.layout.zero = 2, s.layout.dp = 1, s.layout.dp_shard = 0, s.layout.sp = 1;
        s.layout.tp = s.layout.etp = 4; /* no experts: etp follows tp */
        s.model.ffn_hidden = 512;       /* eh's input gradient fits the MLP's scratch */
        CHECK_OK(model_spec_check(&s, 4, &d, &err), err);
        CHECK_EQ_INT(0, model_exec_refusal(&s, &d, 0, why, sizeof why));
        /* eh's input gradient fits neither scratch: the MLP's is made 2 x hidden wide */
        s.model.ffn_hidden = 256;
        CHECK_OK(model_spec_check(&s, 4, &d, &err), err);
        CHECK_EQ_INT(0, model_exec_refusal(&s, &d, 0, why, sizeof why));
        /* b 1 x s 64 x 2h 128 x fp32, not the MLP's own 256 / tp 4 = 64 */
        CHECK_EQ_U64(1ull * 64 * 128 * 4, role_bytes(&s, &d, MODEL_TR_WS_DFFN));
    }

    /* the ring, the all-gather and Ulysses at any cp */
    {
        ModelSpec s = request("tiny", 128, 128).base;
        s.job.precision = PX_FP32;
        s.job.seq_len = 256; /* 2 x cp chunks of one token */
        s.model.seq_len = 256;
        s.layout.cp = 128, s.layout.cp_comm = MODEL_CP_COMM_P2P;
        ModelDims d;
        char why[512] = "";
        CHECK_OK(model_spec_check(&s, 128, &d, &err), err);
        CHECK_EQ_INT(0, model_exec_refusal(&s, &d, 0, why, sizeof why));
        s.layout.cp_comm = MODEL_CP_COMM_ALLGATHER;
        CHECK_OK(model_spec_check(&s, 128, &d, &err), err);
        CHECK_EQ_INT(0, model_exec_refusal(&s, &d, 0, why, sizeof why));
        /* Ulysses too (once at most 64, its counts' array): 128 heads and KV heads, one a rank */
        s.model.heads = s.model.kv_heads = 128, s.model.head_dim = 2;
        s.layout.cp_comm = MODEL_CP_COMM_A2A;
        CHECK_OK(model_spec_check(&s, 128, &d, &err), err);
        CHECK_EQ_INT(0, model_exec_refusal(&s, &d, 0, why, sizeof why));
    }

    /* --fp8-param-gather: with a per-tensor scale or blockwise's tiles, under ZeRO-3 or below
     * it, with or without transposed copies, also with the optimizer offloaded (fp32 on the
     * CPU, bf16 on CUDA); MXFP8's below ZeRO-3 and under it */
    {
        ModelSpec s = request("tiny", 2, 8).base;
        s.job.precision = PX_FP32;
        s.layout.dp = 2, s.layout.zero = 1;
        s.job.fp8 = MODEL_FP8_TENSORWISE, s.job.fp8_param_gather = 1;
        ModelDims d;
        char why[512] = "";
        CHECK_OK(model_spec_check(&s, 2, &d, &err), err);
        CHECK_EQ_INT(1, d.master); /* the FP8 weights' fp32 master */
        CHECK_EQ_INT(0, model_exec_refusal(&s, &d, 0, why, sizeof why));
        s.job.precision = PX_BF16;
        CHECK_OK(model_spec_check(&s, 2, &d, &err), err);
        CHECK_EQ_INT(0, model_exec_refusal(&s, &d, 1, why, sizeof why));
        s.job.precision = PX_FP32;
        s.job.fp8 = MODEL_FP8_BLOCKWISE;
        CHECK_OK(model_spec_check(&s, 2, &d, &err), err);
        CHECK_EQ_INT(0, model_exec_refusal(&s, &d, 0, why, sizeof why));
        s.job.fp8_transpose = 1; /* the transposed copy's tiles transposed with their scales */
        CHECK_OK(model_spec_check(&s, 2, &d, &err), err);
        CHECK_EQ_INT(1, d.fp8_wt);
        CHECK_EQ_INT(0, model_exec_refusal(&s, &d, 0, why, sizeof why));
        s.job.precision = PX_BF16;
        CHECK_OK(model_spec_check(&s, 2, &d, &err), err);
        CHECK_EQ_INT(0, model_exec_refusal(&s, &d, 1, why, sizeof why));
        s.job.precision = PX_FP32;
        s.layout.zero = 3; /* each tile's amax all-reduced, as Megatron-FSDP's */
        CHECK_OK(model_spec_check(&s, 2, &d, &err), err);
        CHECK_EQ_INT(0, model_exec_refusal(&s, &d, 0, why, sizeof why));
        s.job.fp8_transpose = 0;
        CHECK_OK(model_spec_check(&s, 2, &d, &err), err);
        CHECK_EQ_INT(0, model_exec_refusal(&s, &d, 0, why, sizeof why));
        /* MXFP8 below ZeRO-3 (gathered in the act dtype, quantized by each rank) and under it
         * (Megatron-FSDP's: each block's amax all-reduced, the shards quantized into the copies
         * each gather carries), with or without --fsdp, on either backend; ZeRO-2 is no job
         * (model/spec.c) */
        s.layout.zero = 1, s.job.fp8 = MODEL_FP8_MXFP8;
        CHECK_OK(model_spec_check(&s, 2, &d, &err), err);
        CHECK_EQ_INT(0, model_exec_refusal(&s, &d, 0, why, sizeof why));
        s.layout.zero = 0;
        CHECK_OK(model_spec_check(&s, 2, &d, &err), err);
        CHECK_EQ_INT(0, model_exec_refusal(&s, &d, 0, why, sizeof why));
        s.layout.zero = 3;
        CHECK_OK(model_spec_check(&s, 2, &d, &err), err);
        CHECK_EQ_INT(1, model_fp8_mx_gather_copies(&s, &d, MODEL_FWD));
        CHECK_EQ_INT(0, model_exec_refusal(&s, &d, 0, why, sizeof why));
        s.layout.fsdp = 1, s.layout.recompute = MODEL_RECOMPUTE_FULL;
        CHECK_OK(model_spec_check(&s, 2, &d, &err), err);
        CHECK_EQ_INT(2, model_fp8_mx_gather_copies(&s, &d, MODEL_BWD));
        CHECK_EQ_INT(0, model_exec_refusal(&s, &d, 0, why, sizeof why));
        s.job.precision = PX_BF16;
        CHECK_OK(model_spec_check(&s, 2, &d, &err), err);
        CHECK_EQ_INT(0, model_exec_refusal(&s, &d, 1, why, sizeof why));
        s.job.precision = PX_FP32;
        s.layout.fsdp = 0, s.layout.recompute = MODEL_RECOMPUTE_NONE;
        s.layout.zero = 2;
        CHECK_EQ_INT(PX_EINPUT, model_spec_check(&s, 2, &d, &err));
        CHECK(strstr(err.msg, "which zero 2 shards: use --zero 1, 0 or 3") != NULL);
        s.layout.zero = 1;
        /* with the optimizer offloaded: the host's master rounded, the act values copied up and
         * quantized on the device (fp8gather.c's updated_act), on either backend */
        s.job.fp8 = MODEL_FP8_TENSORWISE, s.layout.offload_optimizer = 1;
        CHECK_OK(model_spec_check(&s, 2, &d, &err), err);
        CHECK_EQ_INT(0, model_exec_refusal(&s, &d, 0, why, sizeof why));
        s.job.precision = PX_BF16;
        CHECK_OK(model_spec_check(&s, 2, &d, &err), err);
        CHECK_EQ_INT(0, model_exec_refusal(&s, &d, 1, why, sizeof why));
        s.job.precision = PX_FP32, s.job.fp8 = MODEL_FP8_DELAYED, s.layout.zero = 2;
        CHECK_OK(model_spec_check(&s, 2, &d, &err), err);
        CHECK_EQ_INT(0, model_exec_refusal(&s, &d, 0, why, sizeof why));
    }

    /* virtual stages: any number a rank (once at most 64, the executor's arrays): pp 2 x vpp 65
     * of 130 layers */
    {
        ModelSpec s = request("tiny", 2, 8).base;
        s.job.precision = PX_FP32;
        s.model.layers = 130;
        s.layout.pp = 2, s.layout.vpp = 65, s.layout.schedule = MODEL_SCHED_INTERLEAVED;
        ModelDims d;
        char why[512] = "";
        CHECK_OK(model_spec_check(&s, 2, &d, &err), err);
        CHECK_EQ_INT(65, d.v);
        CHECK_EQ_INT(0, model_exec_refusal(&s, &d, 0, why, sizeof why));
    }

    /* --fp8-attention with context parallelism: the all-gather with the fused core runs (its
     * K, V gathered in FP8), and the ring and Ulysses under tensorwise and delayed scaling
     * (delayed: the output and the Q, K, V gradients in their codes, a fourth history), with
     * multi-head latent attention too; the unfused core is no job (the spec's rule) */
    {
        ModelSpec s = request("tiny", 2, 8).base;
        s.job.precision = PX_FP32;
        s.job.fp8 = MODEL_FP8_TENSORWISE, s.job.fp8_attention = 1, s.job.flash_attn = 1;
        s.layout.cp = 2, s.layout.cp_comm = MODEL_CP_COMM_ALLGATHER;
        ModelDims d;
        char why[512] = "";
        CHECK_OK(model_spec_check(&s, 2, &d, &err), err);
        CHECK_EQ_INT(0, model_exec_refusal(&s, &d, 0, why, sizeof why));
        s.job.fp8 = MODEL_FP8_DELAYED;
        CHECK_OK(model_spec_check(&s, 2, &d, &err), err);
        CHECK_EQ_INT(0, model_exec_refusal(&s, &d, 0, why, sizeof why));
        CHECK_EQ_INT(3, model_fp8_attn_history(&s)); /* the gradients stay in the act dtype */
        CHECK_EQ_INT(0, model_fp8_attn_dqkv(&s));
        const ModelCpComm refused[] = {MODEL_CP_COMM_P2P, MODEL_CP_COMM_A2A};
        for (int i = 0; i < 2; i++) {
            s.layout.cp_comm = refused[i];
            CHECK_OK(model_spec_check(&s, 2, &d, &err), err);
            CHECK_EQ_INT(0, model_exec_refusal(&s, &d, 0, why, sizeof why));
            CHECK_EQ_INT(1, model_fp8_attn_dqkv(&s));
            CHECK_EQ_INT(4, model_fp8_attn_history(&s));
            s.model.mla.kv_lora_rank = 16, s.model.mla.qk_rope_dim = 8; /* MLA: runs too */
            CHECK_EQ_INT(0, model_exec_refusal(&s, &d, 0, why, sizeof why));
            s.model.mla.kv_lora_rank = 0, s.model.mla.qk_rope_dim = 0;
        }
        s.layout.cp_comm = MODEL_CP_COMM_ALLGATHER, s.job.flash_attn = 0;
        CHECK_EQ_INT(PX_EINPUT, model_spec_check(&s, 2, &d, &err));
        CHECK(strstr(err.msg, "cp 2 with --fp8-attention runs the fused attention core") != NULL);
        /* the ring and Ulysses under tensorwise run (K, V's codes round the ring; Q, K, V's
         * and dO's through the all-to-alls); no history, no gradients in FP8 */
        s.job.fp8 = MODEL_FP8_TENSORWISE, s.job.flash_attn = 1;
        for (int i = 0; i < 2; i++) {
            s.layout.cp_comm = refused[i];
            CHECK_OK(model_spec_check(&s, 2, &d, &err), err);
            CHECK_EQ_INT(0, model_exec_refusal(&s, &d, 0, why, sizeof why));
            CHECK_EQ_INT(0, model_fp8_attn_dqkv(&s));
            CHECK_EQ_INT(0, model_fp8_attn_history(&s));
        }
    }

    /* --fp8-attention by recipe: tensorwise and delayed run; blockwise is no job (Transformer
     * Engine has no attention backend for it: the spec's rule, exit 2 before any plan); MXFP8
     * runs on Transformer Engine's shapes (the spec's rule), the fused core and the unfused */
    {
        ModelSpec s = request("tiny", 2, 8).base;
        s.job.precision = PX_FP32;
        s.layout.tp = 2, s.layout.sp = 1;
        s.job.fp8_attention = 1;
        ModelDims d;
        char why[512] = "";
        const ModelFp8Recipe runs[] = {MODEL_FP8_TENSORWISE, MODEL_FP8_DELAYED};
        for (int i = 0; i < 2; i++) {
            s.job.fp8 = runs[i];
            CHECK_OK(model_spec_check(&s, 2, &d, &err), err);
            CHECK_EQ_INT(0, model_exec_refusal(&s, &d, 0, why, sizeof why));
        }
        s.job.fp8 = MODEL_FP8_BLOCKWISE;
        CHECK(model_spec_check(&s, 2, &d, &err) == PX_EINPUT);
        CHECK_EQ_INT(MODEL_RULE_JOB, (int)err.code);
        CHECK(strstr(err.msg, "FP8 attention has no blockwise recipe: Transformer Engine runs no "
                              "attention backend with Float8BlockScaling (choose --fp8-recipe "
                              "tensorwise, delayed or mxfp8") != NULL);
        err = (PxError){0};
        s.job.fp8 = MODEL_FP8_MXFP8; /* on TE's shapes: 32 | head widths, 128 | sequence */
        CHECK(model_spec_check(&s, 2, &d, &err) == PX_EINPUT);
        CHECK(strstr(err.msg, "FP8 attention under mxfp8 needs a sequence of a multiple of 128 "
                              "and head widths of multiples of 32") != NULL);
        err = (PxError){0};
        s.model.head_dim = 32, s.model.seq_len = s.job.seq_len = 128;
        for (int fused = 0; fused < 2; fused++) {
            s.job.flash_attn = fused;
            CHECK_OK(model_spec_check(&s, 2, &d, &err), err);
            CHECK_EQ_INT(fused ? 2 : 0, model_fp8_attn_copies(&s));
            CHECK_EQ_INT(0, model_exec_refusal(&s, &d, 0, why, sizeof why));
        }
        /* with context parallelism over every kind (TE's 16-bit exchanges, the core
         * quantizing after them: model_fp8_attn_cp16; Ulysses saves its FP8 head split) */
        s.layout.tp = s.layout.etp = 1, s.layout.sp = 0, s.layout.cp = 2;
        const ModelCpComm kinds[] = {MODEL_CP_COMM_ALLGATHER, MODEL_CP_COMM_P2P, MODEL_CP_COMM_A2A};
        for (int i = 0; i < 3; i++) {
            s.layout.cp_comm = kinds[i];
            CHECK_OK(model_spec_check(&s, 2, &d, &err), err);
            CHECK_EQ_INT(1, model_fp8_attn_cp16(&s));
            CHECK_EQ_INT(0, model_fp8_attn_codes(&s));
            CHECK_EQ_INT(i == 2, model_fp8_attn_saved(&s));
            CHECK_EQ_INT(0, model_exec_refusal(&s, &d, 0, why, sizeof why));
        }
    }

    /* a GPU cluster is not this machine: nothing refused by the executor there */
    q = request("tiny-moe", 4, 8);
    CHECK_OK(sim_plan(&q, &gpu, &r, &err), err);
    CHECK_EQ_INT(0, (int)r.rejected[SIM_REJECT_EXECUTOR]);
    sim_plan_free(&r);
    TEST_DONE("test_plan_runnable");
}
