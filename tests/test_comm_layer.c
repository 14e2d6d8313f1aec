/* The communication layer's wrapper (exec/comm/comm.c): bytes and calls per kind, counted once
 * for every backend as nccl-tests sizes a call (the whole buffer of an all-reduce, the gathered
 * output of an all-gather, the input of a reduce-scatter, the padded group * shard buffer of the
 * sharded calls, the message of a send or receive), and the group-of-one rule (a collective over
 * a group of one moves and counts nothing; an all-gather or reduce-scatter whose out is not in
 * copies through the layer's copy; a message there fails).
 *
 * Without arguments: on a recording backend built on the private table (backend.h), which says
 * which raw operations the wrapper handed it, and on comm_single(). Every expected figure is
 * written out by hand below, and every kind's count is compared after each call, so one byte
 * counted too many or too few, or a call counted where none was made, fails.
 * With `mpi`: the same calls on the MPI layer, two ranks under mpirun (the test starts it), with
 * the values the collectives must produce.
 *
 * Usage: test_comm_layer [mpi] */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "exec/comm/backend.h"
#include "tests/test.h"

/* ---- expected counts, every kind compared at once ---- */

typedef struct {
    uint64_t bytes[MODEL_COMM_COUNT], calls[MODEL_COMM_COUNT];
} Counts;

static void expect(Counts *e, ModelComm kind, uint64_t bytes)
{
    e->bytes[kind] += bytes;
    e->calls[kind]++;
}

static void check_counts_at(const CommLayer *c, const Counts *e, int line)
{
    for (int k = 0; k < MODEL_COMM_COUNT; k++) {
        px_test_checks++;
        const uint64_t b = comm_bytes(c, (ModelComm)k), n = comm_calls(c, (ModelComm)k);
        if (b != e->bytes[k] || n != e->calls[k]) {
            fprintf(stderr,
                    "%s:%d: FAILED: %s on the %s layer\n  expected %" PRIu64 " bytes in %" PRIu64
                    " calls\n  actual   %" PRIu64 " bytes in %" PRIu64 " calls\n",
                    __FILE__, line, model_comm_name((ModelComm)k), comm_name(c), e->bytes[k],
                    e->calls[k], b, n);
            exit(1);
        }
    }
}
#define CHECK_COUNTS(c, e) check_counts_at((c), (e), __LINE__)

/* ---- a recording backend ---- */

enum { OP_ALLREDUCE, OP_ALL_GATHER, OP_REDUCE_SCATTER, OP_RS_SHARD, OP_AG_SHARD, OP_SEND, OP_RECV,
       OP_WAIT, OP_PROGRESS, OP_CONTROL, OP_GATHER_TEXT, OP_BARRIER, OP_COPY, OP_ATTACH, OP_N };

typedef struct {
    CommLayer base; /* first, as every backend's */
    int raw[OP_N];  /* raw operations the wrapper handed on */
    int fail;       /* the next raw collective or message fails */
    size_t copied;  /* bytes of the last copy */
} Fake;

static Fake *fake_of(CommLayer *c) { return (Fake *)c; }

/* A raw call: recorded; a non-blocking one gets handle 7, as a backend's slot would be. */
static int raw(CommLayer *c, int op, int *req, PxError *err)
{
    Fake *f = fake_of(c);
    f->raw[op]++;
    if (f->fail) {
        f->fail = 0;
        return px_fail(err, PX_ERUNTIME, "the recording backend fails as asked");
    }
    if (req)
        *req = 7;
    return PX_OK;
}

static int f_allreduce(CommLayer *c, void *buf, size_t count, PxDtype dtype, CommRedOp op,
                       ModelComm kind, int *req, PxError *err)
{
    (void)buf, (void)count, (void)dtype, (void)op, (void)kind;
    return raw(c, OP_ALLREDUCE, req, err);
}

static int f_all_gather(CommLayer *c, void *out, const void *in, size_t count, PxDtype dtype,
                        ModelComm kind, int *req, PxError *err)
{
    (void)out, (void)in, (void)count, (void)dtype, (void)kind;
    return raw(c, OP_ALL_GATHER, req, err);
}

static int f_reduce_scatter(CommLayer *c, void *out, const void *in, size_t count, PxDtype dtype,
                            ModelComm kind, int *req, PxError *err)
{
    (void)out, (void)in, (void)count, (void)dtype, (void)kind;
    return raw(c, OP_REDUCE_SCATTER, req, err);
}

static int f_rs_shard(CommLayer *c, void *buf, size_t numel, size_t shard, PxDtype dtype,
                      ModelComm kind, int *req, PxError *err)
{
    (void)buf, (void)numel, (void)shard, (void)dtype, (void)kind;
    return raw(c, OP_RS_SHARD, req, err);
}

static int f_ag_shard(CommLayer *c, void *buf, size_t numel, size_t shard, PxDtype dtype,
                      ModelComm kind, int *req, PxError *err)
{
    (void)buf, (void)numel, (void)shard, (void)dtype, (void)kind;
    return raw(c, OP_AG_SHARD, req, err);
}

static int f_send(CommLayer *c, const void *buf, size_t bytes, int peer, int tag, ModelComm kind,
                  int *req, PxError *err)
{
    (void)buf, (void)bytes, (void)peer, (void)tag, (void)kind;
    return raw(c, OP_SEND, req, err);
}

static int f_recv(CommLayer *c, void *buf, size_t bytes, int peer, int tag, ModelComm kind,
                  int *req, PxError *err)
{
    (void)buf, (void)bytes, (void)peer, (void)tag, (void)kind;
    return raw(c, OP_RECV, req, err);
}

static int f_wait(CommLayer *c, int *req, PxError *err)
{
    (void)err;
    fake_of(c)->raw[OP_WAIT]++;
    *req = -1;
    return PX_OK;
}

static void f_progress(CommLayer *c) { fake_of(c)->raw[OP_PROGRESS]++; }

static int f_control(CommLayer *c, double *vals, int n, CommRedOp op, PxError *err)
{
    (void)op, (void)err;
    for (int i = 0; i < n; i++)
        vals[i] *= c->world; /* every rank passed the same */
    fake_of(c)->raw[OP_CONTROL]++;
    return PX_OK;
}

static int f_gather_text(CommLayer *c, const char *text, char ***out, PxError *err)
{
    (void)text, (void)err;
    fake_of(c)->raw[OP_GATHER_TEXT]++;
    *out = NULL;
    return PX_OK;
}

static int f_barrier(CommLayer *c, PxError *err)
{
    (void)err;
    fake_of(c)->raw[OP_BARRIER]++;
    return PX_OK;
}

static int f_attach(CommLayer *c, void *base, size_t bytes, PxError *err)
{
    (void)base, (void)bytes, (void)err;
    fake_of(c)->raw[OP_ATTACH]++;
    return PX_OK;
}

/* a device copy, as the NCCL and staged layers give: here it copies on the host and says so */
static int f_copy(CommLayer *c, void *dst, const void *src, size_t bytes, PxError *err)
{
    (void)err;
    memmove(dst, src, bytes);
    fake_of(c)->raw[OP_COPY]++;
    fake_of(c)->copied = bytes;
    return PX_OK;
}

static void f_free(CommLayer *c)
{
    comm_free(c->inner);
    free(c);
}

static const CommOps fake_ops = {
    .allreduce = f_allreduce,
    .all_gather = f_all_gather,
    .reduce_scatter = f_reduce_scatter,
    .reduce_scatter_shard = f_rs_shard,
    .all_gather_shard = f_ag_shard,
    .send = f_send,
    .recv = f_recv,
    .wait = f_wait,
    .progress = f_progress,
    .control = f_control,
    .gather_text = f_gather_text,
    .barrier = f_barrier,
    .free = f_free,
    .attach = f_attach,
    .copy = f_copy,
};

/* the same without a copy of its own (host memory) or an attach (any pointer) */
static const CommOps fake_host_ops = {
    .allreduce = f_allreduce,
    .all_gather = f_all_gather,
    .reduce_scatter = f_reduce_scatter,
    .reduce_scatter_shard = f_rs_shard,
    .all_gather_shard = f_ag_shard,
    .send = f_send,
    .recv = f_recv,
    .wait = f_wait,
    .control = f_control,
    .gather_text = f_gather_text,
    .barrier = f_barrier,
    .free = f_free,
};

/* rank 1 of `world`, groups of tp, cp, dp (x cp), pp and embed ranks */
static Fake *fake_new(const CommOps *ops, int world, int tp, int cp, int dp, int pp, int embed)
{
    Fake *f = calloc(1, sizeof *f);
    CHECK(f != NULL);
    comm_layer_init(&f->base, ops, "fake", 1, world);
    const int size[COMM_GROUPS] = {tp, cp, dp, pp, embed};
    for (int g = 0; g < COMM_GROUPS; g++) {
        f->base.group_size[g] = size[g];
        f->base.group_rank[g] = size[g] > 1 ? 1 : 0;
    }
    return f;
}

static int raw_total(const Fake *f)
{
    int n = 0;
    for (int i = 0; i < OP_N; i++)
        n += f->raw[i];
    return n;
}

/* Counting on a layer of tp 4, cp 1, dp 3, pp 2 and no tied pair (an embedding group of one). */
static void test_counting(void)
{
    Fake *f = fake_new(&fake_ops, 24, 4, 1, 3, 2, 1);
    CommLayer *c = &f->base;
    PxError err = {0};
    Counts e = {{0}, {0}};
    float buf[64] = {0};
    int req = 0;

    CHECK_STR("fake", comm_name(c));
    CHECK_EQ_INT(1, comm_rank(c));
    CHECK_EQ_INT(24, comm_world(c));
    CHECK_EQ_INT(3, comm_group_size(c, MODEL_GROUP_DP));
    CHECK_EQ_INT(1, comm_group_rank(c, MODEL_GROUP_DP));
    CHECK_EQ_INT(1, comm_group_size(c, (ModelGroup)COMM_GROUPS)); /* no such group: one rank */
    CHECK_COUNTS(c, &e);

    /* all-reduce: the whole buffer, 10 fp32 = 40 bytes; 7 bf16 = 14 */
    CHECK_OK(comm_allreduce(c, buf, 10, PX_FP32, COMM_SUM, MODEL_TP_ALLREDUCE, NULL, &err), err);
    expect(&e, MODEL_TP_ALLREDUCE, 40);
    CHECK_COUNTS(c, &e);
    CHECK_OK(comm_allreduce(c, buf, 7, PX_BF16, COMM_MAX, MODEL_DP_ALLREDUCE, &req, &err), err);
    expect(&e, MODEL_DP_ALLREDUCE, 14);
    CHECK_COUNTS(c, &e);
    CHECK_EQ_INT(7, req); /* the backend's handle */
    CHECK_EQ_INT(2, f->raw[OP_ALLREDUCE]);
    /* over the embedding group of one rank, or of no elements: nothing moves, nothing counts */
    CHECK_OK(comm_allreduce(c, buf, 10, PX_FP32, COMM_SUM, MODEL_EMBED_ALLREDUCE, &req, &err),
             err);
    CHECK_EQ_INT(-1, req);
    CHECK_OK(comm_allreduce(c, buf, 0, PX_FP32, COMM_SUM, MODEL_TP_ALLREDUCE, &req, &err), err);
    CHECK_EQ_INT(-1, req);
    CHECK_OK(comm_allreduce(c, buf, 5, PX_FP32, COMM_SUM, MODEL_CP_ALL_GATHER, NULL, &err), err);
    CHECK_EQ_INT(2, f->raw[OP_ALLREDUCE]);
    CHECK_COUNTS(c, &e);

    /* all-gather: the gathered output, group 4 x 5 fp32 = 80 bytes */
    CHECK_OK(comm_all_gather(c, buf, buf + 5, 5, PX_FP32, MODEL_TP_ALL_GATHER, NULL, &err), err);
    expect(&e, MODEL_TP_ALL_GATHER, 80);
    CHECK_COUNTS(c, &e);
    /* dp 3 x 6 fp16 = 36 bytes */
    CHECK_OK(comm_all_gather(c, buf, buf, 6, PX_FP16, MODEL_DP_ALL_GATHER, &req, &err), err);
    expect(&e, MODEL_DP_ALL_GATHER, 36);
    CHECK_COUNTS(c, &e);

    /* reduce-scatter: the input, group 4 x 6 bf16 = 48 bytes (in place too) */
    CHECK_OK(comm_reduce_scatter(c, buf, buf, 6, PX_BF16, MODEL_TP_REDUCE_SCATTER, NULL, &err),
             err);
    expect(&e, MODEL_TP_REDUCE_SCATTER, 48);
    CHECK_COUNTS(c, &e);
    CHECK_OK(comm_reduce_scatter(c, buf, buf + 32, 8, PX_FP32, MODEL_DP_REDUCE_SCATTER, &req,
                                 &err), err);
    expect(&e, MODEL_DP_REDUCE_SCATTER, 96); /* 3 x 8 x 4 */
    CHECK_COUNTS(c, &e);
    CHECK_EQ_INT(2, f->raw[OP_ALL_GATHER]);
    CHECK_EQ_INT(2, f->raw[OP_REDUCE_SCATTER]);

    /* the sharded calls: 10 elements in shards of 4 over dp 3 are counted as the padded
     * 3 x 4 = 12 elements, not the 10 that memory holds: 48 bytes in fp32, 24 in bf16 */
    CHECK_OK(comm_reduce_scatter_shard(c, buf, 10, 4, PX_FP32, MODEL_DP_REDUCE_SCATTER, &req,
                                       &err), err);
    expect(&e, MODEL_DP_REDUCE_SCATTER, 48);
    CHECK_COUNTS(c, &e);
    CHECK_OK(comm_all_gather_shard(c, buf, 10, 4, PX_BF16, MODEL_DP_ALL_GATHER, NULL, &err), err);
    expect(&e, MODEL_DP_ALL_GATHER, 24);
    CHECK_COUNTS(c, &e);
    /* evenly divided: 12 in shards of 4, the same 48 */
    CHECK_OK(comm_reduce_scatter_shard(c, buf, 12, 4, PX_FP32, MODEL_DP_REDUCE_SCATTER, NULL,
                                       &err), err);
    expect(&e, MODEL_DP_REDUCE_SCATTER, 48);
    CHECK_COUNTS(c, &e);
    CHECK_EQ_INT(2, f->raw[OP_RS_SHARD]);
    CHECK_EQ_INT(1, f->raw[OP_AG_SHARD]);
    /* no elements: nothing */
    CHECK_OK(comm_all_gather_shard(c, buf, 0, 4, PX_FP32, MODEL_DP_ALL_GATHER, &req, &err), err);
    CHECK_EQ_INT(-1, req);
    /* refused, uncounted: a shard call over another group than dp x cp; shards that do not hold
     * the block (13 elements in 3 shards of 4) */
    CHECK(comm_reduce_scatter_shard(c, buf, 8, 2, PX_FP32, MODEL_TP_REDUCE_SCATTER, NULL, &err) ==
          PX_ERUNTIME);
    CHECK(strstr(err.msg, "other than dp x cp") != NULL);
    CHECK(comm_all_gather_shard(c, buf, 13, 4, PX_FP32, MODEL_DP_ALL_GATHER, NULL, &err) ==
          PX_ERUNTIME);
    CHECK(strstr(err.msg, "do not hold a block of 13") != NULL);
    CHECK_EQ_INT(1, f->raw[OP_AG_SHARD]);
    CHECK_COUNTS(c, &e);

    /* messages: their bytes, over the pipeline of 2 stages */
    CHECK_OK(comm_send(c, buf, 100, 0, 3, MODEL_PP_SEND, &req, &err), err);
    expect(&e, MODEL_PP_SEND, 100);
    CHECK_OK(comm_recv(c, buf, 64, 0, 3, MODEL_PP_RECV, NULL, &err), err);
    expect(&e, MODEL_PP_RECV, 64);
    CHECK_COUNTS(c, &e);

    /* a call the backend fails to start counts nothing */
    f->fail = 1;
    CHECK(comm_allreduce(c, buf, 10, PX_FP32, COMM_SUM, MODEL_TP_ALLREDUCE, NULL, &err) ==
          PX_ERUNTIME);
    f->fail = 1;
    CHECK(comm_send(c, buf, 10, 0, 1, MODEL_PP_SEND, NULL, &err) == PX_ERUNTIME);
    f->fail = 1;
    CHECK(comm_all_gather_shard(c, buf, 10, 4, PX_FP32, MODEL_DP_ALL_GATHER, NULL, &err) ==
          PX_ERUNTIME);
    CHECK_COUNTS(c, &e);

    /* a kind that is none: refused, nothing counted */
    CHECK(comm_allreduce(c, buf, 10, PX_FP32, COMM_SUM, MODEL_COMM_COUNT, &req, &err) ==
          PX_ERUNTIME);
    CHECK_EQ_INT(-1, req);
    CHECK(comm_send(c, buf, 10, 0, 1, (ModelComm)-1, NULL, &err) == PX_ERUNTIME);
    CHECK_EQ_U64(0, comm_bytes(c, MODEL_COMM_COUNT));
    CHECK_EQ_U64(0, comm_calls(c, (ModelComm)-1));
    CHECK_COUNTS(c, &e);

    /* waits reach the backend only for a handle it gave out */
    req = 7;
    CHECK_OK(comm_wait(c, &req, &err), err);
    CHECK_EQ_INT(-1, req);
    CHECK_OK(comm_wait(c, &req, &err), err);
    CHECK_OK(comm_wait(c, NULL, &err), err);
    CHECK_EQ_INT(1, f->raw[OP_WAIT]);
    comm_progress(c);
    CHECK_EQ_INT(1, f->raw[OP_PROGRESS]);

    /* control traffic in a world of 24: the backend's, never counted */
    double v[2] = {1, 2};
    CHECK_OK(comm_control(c, v, 2, COMM_SUM, &err), err);
    CHECK(v[0] == 24 && v[1] == 48);
    char **texts = NULL;
    CHECK_OK(comm_gather_text(c, "x", &texts, &err), err);
    CHECK(texts == NULL);
    CHECK_OK(comm_barrier(c, &err), err);
    CHECK_OK(comm_attach(c, buf, sizeof buf, &err), err);
    CHECK_EQ_INT(1, f->raw[OP_CONTROL]);
    CHECK_EQ_INT(1, f->raw[OP_GATHER_TEXT]);
    CHECK_EQ_INT(1, f->raw[OP_BARRIER]);
    CHECK_EQ_INT(1, f->raw[OP_ATTACH]);
    CHECK_COUNTS(c, &e);

    /* the timeout and the step reach the layer it runs on */
    Fake *inner = fake_new(&fake_host_ops, 24, 4, 1, 3, 2, 1);
    c->inner = &inner->base;
    comm_set_timeout(c, 30);
    comm_set_step(c, 5);
    CHECK(c->timeout_s == 30 && inner->base.timeout_s == 30);
    CHECK_EQ_INT(5, inner->base.step);
    comm_free(c); /* and the inner one with it (ASan: no leak) */
}

/* The group-of-one rule on the recording backend: collectives over a group of one never reach
 * it, an all-gather or reduce-scatter whose out is not in copies this rank's part through the
 * layer's copy (or memmove where it has none), and a message has no peer. */
static void test_group_of_one(const CommOps *ops)
{
    Fake *f = fake_new(ops, 4, 1, 1, 1, 1, 1); /* four ranks, every group of one (cp 4 aside) */
    f->base.group_size[MODEL_GROUP_CP] = 4;
    CommLayer *c = &f->base;
    PxError err = {0};
    Counts e = {{0}, {0}};
    float in[8], out[8];
    int req = 0;
    for (int i = 0; i < 8; i++) {
        in[i] = (float)(i + 1);
        out[i] = 0;
    }
    for (int k = 0; k < MODEL_COMM_COUNT; k++) {
        const ModelComm kind = (ModelComm)k;
        if (model_comm_group(kind) == MODEL_GROUP_CP)
            continue;
        CHECK_OK(comm_allreduce(c, in, 8, PX_FP32, COMM_SUM, kind, &req, &err), err);
        CHECK_EQ_INT(-1, req);
        memset(out, 0, sizeof out);
        CHECK_OK(comm_all_gather(c, out, in, 6, PX_FP32, kind, &req, &err), err);
        CHECK_EQ_INT(-1, req);
        CHECK(out[5] == 6 && out[6] == 0); /* exactly this rank's 6 elements */
        memset(out, 0, sizeof out);
        CHECK_OK(comm_reduce_scatter(c, out, in, 3, PX_BF16, kind, NULL, &err), err);
        CHECK(memcmp(out, in, 6) == 0 && out[2] == 0); /* 3 bf16 = 6 bytes */
        CHECK_OK(comm_all_gather(c, in, in, 6, PX_FP32, kind, NULL, &err), err); /* in place */
        CHECK_OK(comm_reduce_scatter(c, in, in, 6, PX_FP32, kind, NULL, &err), err);
        CHECK_OK(comm_reduce_scatter_shard(c, in, 8, 8, PX_FP32, kind, &req, &err), err);
        CHECK_EQ_INT(-1, req);
        CHECK_OK(comm_all_gather_shard(c, in, 8, 8, PX_FP32, kind, NULL, &err), err);
        CHECK(comm_send(c, in, 4, 0, 0, kind, &req, &err) == PX_ERUNTIME);
        CHECK_EQ_INT(-1, req);
        CHECK(strstr(err.msg, "no other rank") != NULL);
        CHECK(comm_recv(c, in, 4, 0, 0, kind, NULL, &err) == PX_ERUNTIME);
    }
    for (int i = 0; i < 8; i++)
        CHECK(in[i] == (float)(i + 1)); /* nothing touched the input */
    CHECK_COUNTS(c, &e);
    /* two copies per kind that is not cp's, each through the layer's own copy when it has one */
    int not_cp = 0;
    for (int k = 0; k < MODEL_COMM_COUNT; k++)
        not_cp += model_comm_group((ModelComm)k) != MODEL_GROUP_CP;
    CHECK_EQ_INT(ops->copy ? 2 * not_cp : 0, f->raw[OP_COPY]);
    CHECK_EQ_INT(ops->copy ? 2 * not_cp : 0, raw_total(f));
    if (ops->copy)
        CHECK_EQ_U64(6, f->copied);
    /* the cp group of 4 still communicates and counts */
    CHECK_OK(comm_all_gather(c, out, in, 2, PX_FP32, MODEL_CP_ALL_GATHER, NULL, &err), err);
    expect(&e, MODEL_CP_ALL_GATHER, 32);
    CHECK_COUNTS(c, &e);
    /* an attach without the backend's: nothing to do */
    CHECK_OK(comm_attach(c, in, sizeof in, &err), err);
    comm_progress(c);
    comm_free(c);
}

/* comm_single(): every group of one, nothing counted, the world-wide calls trivial. */
static void test_single(void)
{
    CommLayer *c = comm_single();
    CHECK(c != NULL);
    PxError err = {0};
    Counts e = {{0}, {0}};
    CHECK_STR("single", comm_name(c));
    CHECK_EQ_INT(0, comm_rank(c));
    CHECK_EQ_INT(1, comm_world(c));
    for (int g = 0; g < COMM_GROUPS; g++) {
        CHECK_EQ_INT(1, comm_group_size(c, (ModelGroup)g));
        CHECK_EQ_INT(0, comm_group_rank(c, (ModelGroup)g));
    }
    float a[4] = {1, 2, 3, 4}, b[4] = {0};
    int req = 5;
    CHECK_OK(comm_allreduce(c, a, 4, PX_FP32, COMM_SUM, MODEL_DP_ALLREDUCE, &req, &err), err);
    CHECK_EQ_INT(-1, req);
    CHECK(a[0] == 1 && a[3] == 4);
    CHECK_OK(comm_all_gather(c, b, a, 4, PX_FP32, MODEL_TP_ALL_GATHER, NULL, &err), err);
    CHECK(memcmp(a, b, sizeof a) == 0);
    memset(b, 0, sizeof b);
    CHECK_OK(comm_reduce_scatter(c, b, a, 2, PX_FP32, MODEL_DP_REDUCE_SCATTER, NULL, &err), err);
    CHECK(b[0] == 1 && b[1] == 2 && b[2] == 0);
    CHECK_OK(comm_reduce_scatter_shard(c, a, 4, 4, PX_FP32, MODEL_DP_REDUCE_SCATTER, NULL, &err),
             err);
    CHECK_OK(comm_all_gather_shard(c, a, 4, 4, PX_FP32, MODEL_DP_ALL_GATHER, NULL, &err), err);
    CHECK(comm_send(c, a, 16, 1, 0, MODEL_PP_SEND, NULL, &err) == PX_ERUNTIME);
    CHECK(comm_recv(c, a, 16, 1, 0, MODEL_PP_RECV, &req, &err) == PX_ERUNTIME);
    CHECK_EQ_INT(-1, req);
    CHECK_OK(comm_wait(c, &req, &err), err);
    comm_progress(c);
    double v[2] = {3, 4};
    CHECK_OK(comm_control(c, v, 2, COMM_MAX, &err), err);
    CHECK(v[0] == 3 && v[1] == 4);
    char **texts = NULL;
    CHECK_OK(comm_gather_text(c, "rank 0", &texts, &err), err);
    CHECK(texts != NULL);
    CHECK_STR("rank 0", texts[0]);
    free(texts[0]);
    free(texts);
    CHECK_OK(comm_barrier(c, &err), err);
    CHECK_OK(comm_attach(c, a, sizeof a, &err), err);
    comm_set_timeout(c, 10);
    comm_set_step(c, 2);
    CHECK_COUNTS(c, &e);
    comm_free(c);
    comm_free(NULL);
}

/* ---- the MPI layer, two ranks ---- */

static uint16_t bf16_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return (uint16_t)(u >> 16); /* exact for the small integers used here */
}

static void test_mpi(int rank, int world)
{
    PxError err = {0};
    CHECK_EQ_INT(2, world);
    /* dp 2: the data-parallel group has both ranks, tp, cp and the embedding pair one */
    ModelLayout l;
    memset(&l, 0, sizeof l);
    l.tp = l.cp = l.pp = l.vpp = 1;
    l.dp = 2;
    CommLayer *c = NULL;
    CHECK_OK(comm_mpi(&l, 0, &c, &err), err);
    CHECK_STR("mpi", comm_name(c));
    CHECK_EQ_INT(rank, comm_rank(c));
    CHECK_EQ_INT(2, comm_group_size(c, MODEL_GROUP_DP));
    CHECK_EQ_INT(rank, comm_group_rank(c, MODEL_GROUP_DP));
    CHECK_EQ_INT(1, comm_group_size(c, MODEL_GROUP_TP));
    comm_set_timeout(c, 120); /* a lost rank ends the test rather than hanging it */
    Counts e = {{0}, {0}};
    const float me = (float)(rank + 1);
    float buf[16], out[16];

    /* all-reduce of 5 fp32: 20 bytes, blocking and not */
    for (int i = 0; i < 5; i++)
        buf[i] = me * (float)(i + 1);
    CHECK_OK(comm_allreduce(c, buf, 5, PX_FP32, COMM_SUM, MODEL_DP_ALLREDUCE, NULL, &err), err);
    expect(&e, MODEL_DP_ALLREDUCE, 20);
    for (int i = 0; i < 5; i++)
        CHECK(buf[i] == 3.0f * (float)(i + 1));
    int req = -1;
    buf[0] = me;
    CHECK_OK(comm_allreduce(c, buf, 1, PX_FP32, COMM_MAX, MODEL_DP_ALLREDUCE, &req, &err), err);
    CHECK(req >= 0);
    comm_progress(c);
    CHECK_OK(comm_wait(c, &req, &err), err);
    CHECK_EQ_INT(-1, req);
    CHECK(buf[0] == 2.0f);
    expect(&e, MODEL_DP_ALLREDUCE, 4);
    CHECK_COUNTS(c, &e);
    /* bf16 through the layer's 16-bit reduction: 1 + 2 = 3, 3 bf16 = 6 bytes */
    uint16_t h[3] = {bf16_of(me), bf16_of(2 * me), bf16_of(-me)};
    CHECK_OK(comm_allreduce(c, h, 3, PX_BF16, COMM_SUM, MODEL_DP_ALLREDUCE, NULL, &err), err);
    expect(&e, MODEL_DP_ALLREDUCE, 6);
    CHECK(h[0] == bf16_of(3) && h[1] == bf16_of(6) && h[2] == bf16_of(-3));
    /* over the tp group of one: untouched, uncounted */
    buf[0] = me;
    CHECK_OK(comm_allreduce(c, buf, 1, PX_FP32, COMM_SUM, MODEL_TP_ALLREDUCE, NULL, &err), err);
    CHECK(buf[0] == me);
    CHECK_COUNTS(c, &e);

    /* all-gather of 3 per rank into 6: 24 bytes; in place (in is out's own part) too */
    for (int i = 0; i < 3; i++)
        buf[i] = me * 10 + (float)i;
    CHECK_OK(comm_all_gather(c, out, buf, 3, PX_FP32, MODEL_DP_ALL_GATHER, NULL, &err), err);
    expect(&e, MODEL_DP_ALL_GATHER, 24);
    for (int r = 0; r < 2; r++)
        for (int i = 0; i < 3; i++)
            CHECK(out[3 * r + i] == (float)(r + 1) * 10 + (float)i);
    for (int i = 0; i < 3; i++)
        out[3 * rank + i] = me * 20 + (float)i;
    CHECK_OK(comm_all_gather(c, out, out + 3 * rank, 3, PX_FP32, MODEL_DP_ALL_GATHER, &req, &err),
             err);
    CHECK_OK(comm_wait(c, &req, &err), err);
    expect(&e, MODEL_DP_ALL_GATHER, 24);
    CHECK(out[0] == 20 && out[3] == 40 && out[5] == 42);
    /* over the tp group of one: out gets this rank's part, uncounted */
    memset(out, 0, sizeof out);
    CHECK_OK(comm_all_gather(c, out, buf, 3, PX_FP32, MODEL_TP_ALL_GATHER, NULL, &err), err);
    CHECK(out[0] == me * 10 && out[2] == me * 10 + 2 && out[3] == 0);
    CHECK_COUNTS(c, &e);

    /* reduce-scatter of 2 x 4 fp32: the input, 32 bytes; in place leaves the sum at the start */
    for (int i = 0; i < 8; i++)
        buf[i] = me * (float)i;
    CHECK_OK(comm_reduce_scatter(c, out, buf, 4, PX_FP32, MODEL_DP_REDUCE_SCATTER, NULL, &err),
             err);
    expect(&e, MODEL_DP_REDUCE_SCATTER, 32);
    for (int i = 0; i < 4; i++)
        CHECK(out[i] == 3.0f * (float)(4 * rank + i));
    CHECK_OK(comm_reduce_scatter(c, buf, buf, 4, PX_FP32, MODEL_DP_REDUCE_SCATTER, &req, &err),
             err);
    CHECK_OK(comm_wait(c, &req, &err), err);
    expect(&e, MODEL_DP_REDUCE_SCATTER, 32);
    for (int i = 0; i < 4; i++)
        CHECK(buf[i] == 3.0f * (float)(4 * rank + i));
    CHECK_COUNTS(c, &e);

    /* ZeRO's shards: 5 elements in shards of 3 (rank 1 owns 2), counted as the padded 2 x 3 */
    for (int i = 0; i < 5; i++)
        buf[i] = me * (float)(i + 1);
    CHECK_OK(comm_reduce_scatter_shard(c, buf, 5, 3, PX_FP32, MODEL_DP_REDUCE_SCATTER, &req,
                                       &err), err);
    CHECK_OK(comm_wait(c, &req, &err), err);
    expect(&e, MODEL_DP_REDUCE_SCATTER, 24);
    for (int i = 3 * rank; i < 5 && i < 3 * rank + 3; i++)
        CHECK(buf[i] == 3.0f * (float)(i + 1));
    for (int i = 0; i < 5; i++)
        if (i / 3 != rank)
            buf[i] = -1; /* the other rank's shard comes back from it */
    CHECK_OK(comm_all_gather_shard(c, buf, 5, 3, PX_FP32, MODEL_DP_ALL_GATHER, NULL, &err), err);
    expect(&e, MODEL_DP_ALL_GATHER, 24);
    for (int i = 0; i < 5; i++)
        CHECK(buf[i] == 3.0f * (float)(i + 1));
    CHECK_COUNTS(c, &e);

    /* control and text: world-wide, not counted */
    double v[1] = {me};
    CHECK_OK(comm_control(c, v, 1, COMM_SUM, &err), err);
    CHECK(v[0] == 3);
    char **texts = NULL;
    CHECK_OK(comm_gather_text(c, rank ? "one" : "zero", &texts, &err), err);
    if (rank == 0) {
        CHECK_STR("zero", texts[0]);
        CHECK_STR("one", texts[1]);
        free(texts[0]);
        free(texts[1]);
        free(texts);
    } else {
        CHECK(texts == NULL);
    }
    CHECK_OK(comm_barrier(c, &err), err);
    CHECK(comm_send(c, buf, 4, 1 - rank, 0, MODEL_PP_SEND, NULL, &err) == PX_ERUNTIME);
    CHECK_COUNTS(c, &e);
    comm_free(c);

    /* pp 2: messages count their bytes, each on its own side */
    l.dp = 1;
    l.pp = 2;
    CHECK_OK(comm_mpi(&l, 1, &c, &err), err); /* a tied pair: the embedding group has both */
    CHECK_EQ_INT(2, comm_group_size(c, MODEL_GROUP_EMBED));
    CHECK_EQ_INT(2, comm_group_size(c, MODEL_GROUP_PP));
    Counts p = {{0}, {0}};
    float msg[10];
    for (int i = 0; i < 10; i++)
        msg[i] = rank == 0 ? (float)i : 0;
    if (rank == 0) {
        CHECK_OK(comm_send(c, msg, sizeof msg, 1, 9, MODEL_PP_SEND, &req, &err), err);
        CHECK_OK(comm_wait(c, &req, &err), err);
        expect(&p, MODEL_PP_SEND, 40);
    } else {
        CHECK_OK(comm_recv(c, msg, sizeof msg, 0, 9, MODEL_PP_RECV, NULL, &err), err);
        expect(&p, MODEL_PP_RECV, 40);
        CHECK(msg[9] == 9);
    }
    buf[0] = me;
    CHECK_OK(comm_allreduce(c, buf, 1, PX_FP32, COMM_SUM, MODEL_EMBED_ALLREDUCE, NULL, &err), err);
    expect(&p, MODEL_EMBED_ALLREDUCE, 4);
    CHECK(buf[0] == 3);
    CHECK_COUNTS(c, &p);
    comm_free(c);
}

/* Runs this test as two ranks under mpirun and returns its status (77: no mpirun). */
static int under_mpirun(void)
{
    if (system("command -v mpirun >/dev/null 2>&1") != 0) {
        printf("test_comm_layer: mpirun is not installed: skipped\n");
        return 77;
    }
    char self[1024];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    CHECK(n > 0);
    self[n] = '\0';
    char cmd[1400];
    /* as launch.c starts jobs: root allowed, two ranks on however few cores */
    snprintf(cmd, sizeof cmd, "mpirun -n 2 %s--oversubscribe --bind-to none --quiet '%s' mpi",
             geteuid() == 0 ? "--allow-run-as-root " : "", self);
    int status = system(cmd);
    if (status == -1 || !WIFEXITED(status)) {
        fprintf(stderr, "test_comm_layer: %s did not exit\n", cmd);
        return 1;
    }
    return WEXITSTATUS(status);
}

/* The all-gather dispatcher's etp x ep group: a split of its own only when etp and ep both
 * exceed 1 (ranks etp + etp x ep of one edp rank, key etp fastest as its gathered parts are
 * ordered), else the group it equals. */
static void test_etp_ep_group(void)
{
    ModelLayout l;
    memset(&l, 0, sizeof l);
    l.tp = 2, l.cp = l.pp = l.vpp = 1, l.dp = 4, l.ep = 2, l.etp = 2; /* 8 ranks, edp 2 */
    CHECK_EQ_INT(MODEL_GROUP_ETP_EP, comm_group_alias(&l, MODEL_GROUP_ETP_EP));
    CommGroupSplit sp[COMM_SPLITS];
    for (int rank = 0; rank < 8; rank++) {
        const int n = comm_group_splits(&l, rank, 0, -1, sp);
        CHECK_EQ_INT(MODEL_GROUP_ETP_EP, sp[n - 1].group);
        CHECK_EQ_INT(rank / 4, sp[n - 1].color); /* edp rank: 4 consecutive ranks a group */
        CHECK_EQ_INT(rank % 4, sp[n - 1].key);
    }
    l.etp = 1, l.tp = 1, l.dp = 4; /* etp 1: the EP group */
    CHECK_EQ_INT(MODEL_GROUP_EP, comm_group_alias(&l, MODEL_GROUP_ETP_EP));
    CHECK(comm_group_splits(&l, 0, 0, -1, sp) < COMM_SPLITS);
    l.ep = 1, l.etp = 2, l.dp = 2; /* ep 1, etp 2 of tp 1: the ETP group */
    CHECK_EQ_INT(MODEL_GROUP_ETP, comm_group_alias(&l, MODEL_GROUP_ETP_EP));
    l.tp = 2, l.etp = 0, l.dp = 1; /* laid out as the dense layers: TP */
    CHECK_EQ_INT(MODEL_GROUP_TP, comm_group_alias(&l, MODEL_GROUP_ETP_EP));
}

int main(int argc, char **argv)
{
    if (argc == 2 && !strcmp(argv[1], "mpi")) {
        if (!comm_mpi_available()) {
            printf("test_comm_layer: built without MPI: skipped\n");
            return 77;
        }
        int rank = 0, world = 1;
        if (!comm_mpi_start(&argc, &argv, &rank, &world))
            return under_mpirun();
        test_mpi(rank, world);
        comm_mpi_finish();
        if (rank == 0)
            printf("test_comm_layer mpi: 2 ranks, %d checks passed on rank 0\n", px_test_checks);
        return 0;
    }
    if (argc != 1) {
        fprintf(stderr, "usage: test_comm_layer [mpi]\n");
        return 2;
    }
    test_counting();
    test_group_of_one(&fake_ops);
    test_group_of_one(&fake_host_ops);
    test_single();
    test_etp_ep_group();
    TEST_DONE("test_comm_layer");
}
