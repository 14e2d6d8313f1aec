/* Predicted equals measured on one rank: for several models (tiny, tiny-llama, a small
 * GPT-2-shaped model with a padded vocabulary; tiny-dsv3's multi-head latent attention, op by
 * op with its layers dense), every recompute mode, flash attention on and
 * off, dropout on and off, GPipe and 1F1B with several micro-batches, ZeRO-1, SGD and
 * adam-8bit:
 * - memory per category as the executor's arenas hold it equals sim_run's prediction on the
 *   local cluster, byte for byte (runtime is the profile's allowance on both sides), and the
 *   activation pools were full at the schedule's peak;
 * - FLOPs counted from the kernel calls of a step equal sim_run's rank_flops, and op by op the
 *   graph's FLOPs and calls;
 * - every op of the graph ran under its name, and no FLOP ran outside an op;
 * - and, for the GPT-shaped models, FLOPs counted against a closed form written here from
 *   Narayanan et al. 2021 (Sec. 5.1: 24 s h^2 per layer for the linear layers, 4 s^2 h for the
 *   attention scores and context, 2 s h V for the logits; backward twice the forward, the
 *   fused attention's backward 2.5 times; a full recompute one more forward of the layers, a
 *   selective one of the attention core). The oracle shares no code with model/ or exec/: both
 *   now count attention by model_attention_*_flops, so a wrong rule there would pass the
 *   comparison above and fail this one. */
#include "tests/test_exec_common.h"

static int cases, oracles;

/* Hardware FLOPs per step of a GPT-shaped model (ffn 4h, heads x head_dim h) on one rank,
 * from the closed form above. */
static double closed_form_flops(const ModelSpec *s, const ModelDims *d)
{
    const double B = s->job.global_batch, S = d->s, h = s->model.hidden, L = s->model.layers;
    const double V = d->vocab_pad;
    const int flash = s->job.flash_attn, rc = s->layout.recompute;
    const double causal = s->job.causal_flops ? 0.5 : 1.0;
    const double full = rc == MODEL_RECOMPUTE_FULL ? 1 : 0;
    const double selective = rc == MODEL_RECOMPUTE_SELECTIVE && !flash ? 1 : 0;
    /* torchtitan's op-level selective recompute reruns wk (2 s h^2 of the layer's 24), wo (2)
     * and, the MLP not gated, fc2 (8): half the linear layers' forward, and no attention core */
    const double sac = d->recompute_op ? 0.5 : 0.0;
    const double linear = 24.0 * S * h * h * (3.0 + full + sac);
    const double attention = 4.0 * S * S * h * causal * (1.0 + (flash ? 2.5 : 2.0) + full + selective);
    const double logits = 2.0 * S * h * V * 3.0;
    return B * (L * (linear + attention) + logits);
}

static void check_case(const char *what, ModelSpec s)
{
    PxError err = {0};
    ProfCluster cl;
    CHECK_OK(prof_cluster_load("local", NULL, 0, &cl, &err), err);
    SimResult r;
    CHECK_OK(sim_run(&s, &cl, 1, &r, &err), err);
    Exec *ex = tx_exec(&s);
    ExecStepStats st;
    CHECK_OK(exec_step(ex, 0, &st, &err), err);
    CHECK(isfinite(st.loss));

    uint64_t mem[MODEL_CAT_COUNT];
    exec_memory(ex, mem);
    for (int c = 0; c < MODEL_CAT_COUNT; c++) {
        if (mem[c] != r.mem[0].cat[c]) {
            fprintf(stderr, "%s: %s: predicted %llu bytes, measured %llu\n", what,
                    model_category_name((ModelCategory)c), (unsigned long long)r.mem[0].cat[c],
                    (unsigned long long)mem[c]);
            exit(1);
        }
    }
    CHECK(mem[MODEL_ACTIVATIONS] > 0 && mem[MODEL_WEIGHTS] > 0 && mem[MODEL_WORKSPACE] > 0);
    /* the schedule really held that many sets at once: the pools were not oversized */
    CHECK_EQ_U64(mem[MODEL_ACTIVATIONS], exec_activations_in_use_peak(ex));

    /* exactly: here every count is a whole number (or a half, with causal FLOPs) far below
     * 2^53, so doubles add them without rounding in any order */
    double counted = exec_step_flops(ex);
    if (counted != r.rank_flops[0]) {
        fprintf(stderr, "%s: FLOPs per step: predicted %.17g, counted %.17g\n", what,
                r.rank_flops[0], counted);
        exit(1);
    }
    CHECK(exec_unattributed_flops(ex) == 0.0);
    if (s.model.family == MODEL_GPT && s.model.ffn_hidden == 4 * s.model.hidden &&
        s.model.heads * s.model.head_dim == s.model.hidden) {
        const double oracle = closed_form_flops(&s, &r.dims);
        if (counted != oracle) {
            fprintf(stderr, "%s: FLOPs per step: the closed form gives %.17g, counted %.17g\n",
                    what, oracle, counted);
            exit(1);
        }
        oracles++;
    }

    /* op by op: the graph's FLOPs and calls per step (not for MoE layers, some of whose
     * FLOP-free ops, the routing and the counts' exchange, run within others' scopes) */
    int n = 0;
    const ExecOpReport *ops = exec_ops(ex, &n);
    CHECK_EQ_INT(r.ops[0].count, n);
    for (int i = 0; i < n && !r.dims.moe; i++) {
        const ModelOp *op = &r.ops[0].op[i];
        char name[96];
        model_op_fullname(op, name, sizeof name);
        CHECK_STR(name, ops[i].name);
        double times = (op->per_microbatch ? r.dims.m : 1) * (double)op->repeat;
        if (ops[i].calls != times || ops[i].flops != op->flops * times) {
            fprintf(stderr, "%s: op %s: predicted %g calls and %.17g FLOPs, measured %g and %.17g\n",
                    what, name, times, op->flops * times, ops[i].calls, ops[i].flops);
            exit(1);
        }
        CHECK(ops[i].seconds >= 0);
    }
    exec_free(ex);
    sim_result_free(&r);
    cases++;
}

int main(void)
{
    px_log_set_quiet(1);
    char what[160];
    const char *const models[] = {"tiny", "tiny-llama", "gpt2-small"};
    for (int mi = 0; mi < 3; mi++) {
        for (int rc = 0; rc < 3; rc++) {
            for (int flash = 0; flash <= 1; flash++) {
                for (int drop = 0; drop <= 1; drop++) {
                    for (int sched = 0; sched <= 1; sched++) {
                        ModelSpec s;
                        if (mi < 2) {
                            s = tx_spec(models[mi], 16, 4, 1);
                        } else {
                            /* GPT-2's shape at a test's size: 50257-like odd vocabulary padded
                             * to a multiple of 64, untied output layer */
                            s = tx_spec("gpt2-124m", 16, 4, 1);
                            s.model.layers = 2;
                            s.model.hidden = 96;
                            s.model.heads = 3;
                            s.model.kv_heads = 3;
                            s.model.head_dim = 32;
                            s.model.ffn_hidden = 384;
                            s.model.vocab = 1001;
                            s.model.tied_embeddings = sched; /* both, across the cases */
                            s.job.pad_vocab = 64;
                        }
                        s.layout.recompute = (ModelRecompute)rc;
                        s.job.flash_attn = flash;
                        s.job.dropout = drop ? 0.1 : 0.0;
                        s.layout.schedule = sched ? MODEL_SCHED_GPIPE : MODEL_SCHED_1F1B;
                        snprintf(what, sizeof what, "%s recompute %s flash %d dropout %d %s",
                                 models[mi], model_recompute_name(s.layout.recompute), flash, drop,
                                 model_schedule_name(s.layout.schedule));
                        check_case(what, s);
                    }
                }
            }
        }
    }
    /* torchtitan's op-level selective recompute (the other matmuls and the elementwise ops
     * rerun before each layer's backward) with the attention core fused and not, dropout on
     * and off, a GELU and a SwiGLU model, and a MoE model's layers (their attention half) */
    for (int mi = 0; mi < 2; mi++)
        for (int flash = 0; flash <= 1; flash++)
            for (int drop = 0; drop <= 1; drop++) {
                ModelSpec t = tx_spec(models[mi], 16, 4, 1);
                t.job.framework = MODEL_FW_TORCHTITAN;
                t.layout.recompute = MODEL_RECOMPUTE_SELECTIVE;
                t.job.flash_attn = flash;
                t.job.dropout = drop ? 0.1 : 0.0;
                snprintf(what, sizeof what, "%s torchtitan selective flash %d dropout %d",
                         models[mi], flash, drop);
                check_case(what, t);
            }
    {
        ModelSpec t = tx_spec("tiny-moe", 16, 4, 2);
        t.job.framework = MODEL_FW_TORCHTITAN;
        t.layout.recompute = MODEL_RECOMPUTE_SELECTIVE;
        check_case("tiny-moe torchtitan selective", t);
    }
    /* GPipe holds every micro-batch: four activation sets against 1F1B's one */
    ModelSpec s = tx_spec("tiny", 16, 4, 1);
    s.layout.schedule = MODEL_SCHED_GPIPE;
    Exec *ex = tx_exec(&s);
    PxError err = {0};
    ExecStepStats st;
    CHECK_OK(exec_step(ex, 0, &st, &err), err);
    uint64_t gp[MODEL_CAT_COUNT], fb[MODEL_CAT_COUNT];
    exec_memory(ex, gp);
    exec_free(ex);
    s.layout.schedule = MODEL_SCHED_1F1B;
    ex = tx_exec(&s);
    CHECK_OK(exec_step(ex, 0, &st, &err), err);
    exec_memory(ex, fb);
    exec_free(ex);
    CHECK_EQ_U64(4 * fb[MODEL_ACTIVATIONS], gp[MODEL_ACTIVATIONS]);

    /* ZeRO-1 on one rank, SGD with momentum, a longer sequence and micro-batch */
    s = tx_spec("tiny", 64, 4, 2);
    s.layout.zero = 1;
    check_case("tiny zero-1", s);
    /* ZeRO-2 and ZeRO-3 on one rank: the gradient bucket, the gather buffers, the shards */
    s.layout.zero = 2;
    check_case("tiny zero-2", s);
    s.layout.zero = 3;
    s.layout.recompute = MODEL_RECOMPUTE_FULL;
    check_case("tiny zero-3", s);
    s = tx_spec("tiny-llama", 32, 4, 2);
    s.layout.zero = 3;
    check_case("tiny-llama zero-3", s);
    s = tx_spec("tiny", 64, 4, 2);
    s.job.optimizer = MODEL_OPT_SGD_MOMENTUM;
    s.layout.zero = 0;
    check_case("tiny sgd", s);
    /* adam-8bit: a byte a state value and an absmax per 2048 of them, whole and ZeRO-1's
     * shard */
    s.job.optimizer = MODEL_OPT_ADAM_8BIT;
    check_case("tiny adam-8bit", s);
    s.layout.zero = 1;
    check_case("tiny adam-8bit zero-1", s);
    s.layout.zero = 0;
    s = tx_spec("tiny-llama", 32, 6, 3);
    s.job.causal_flops = 1;
    s.job.flash_attn = 0;
    check_case("tiny-llama causal flops", s);
    /* multi-head latent attention in DeepSeek-V3's whole shape (tiny-dsv3 without its
     * multi-token prediction module), and its layers all dense (op by op then): every
     * recompute mode, flash attention on and off, two sequences a micro-batch; and the
     * queries projected directly (q_lora_rank 0) */
    for (int rc = 0; rc < 3; rc++)
        for (int flash = 0; flash <= 1; flash++)
            for (int dense = 0; dense <= 1; dense++) {
            s = tx_spec("tiny-dsv3", 16, 4, 2);
            s.model.mtp_layers = 0;
            if (dense)
                s.model.moe.experts = 0;
            s.layout.recompute = (ModelRecompute)rc;
            s.job.flash_attn = flash;
            snprintf(what, sizeof what, "tiny-dsv3%s recompute %s flash %d", dense ? " dense" : "",
                     model_recompute_name(s.layout.recompute), flash);
            check_case(what, s);
        }
    s = tx_spec("tiny-dsv3", 16, 4, 1);
    s.model.mtp_layers = 0;
    s.model.mla.q_lora_rank = 0;
    check_case("tiny-dsv3 q_lora_rank 0", s);
    printf("%d cases: memory per category and FLOPs equal the prediction; %d against the closed "
           "form\n", cases, oracles);
    CHECK(oracles >= 44);
    TEST_DONE("test_exec_memory");
}
