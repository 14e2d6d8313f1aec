/* The pipeline's transfer protocol cannot deadlock (exec/step.c): every stage has one send and
 * one receive buffer; it keeps its next expected receive posted (the receives of a step come
 * from its schedule, in order) and a send waits only for the stage's previous send before
 * reusing the buffer. Under a rendezvous protocol (a send completes when its receiver has a
 * matching receive posted) this event simulation runs every stage's model_schedule_build order
 * for pp 2..8, vpp 1..4 and up to 24 micro-batches and checks that all of them finish. It also
 * shows why the receive is posted ahead: posting it only when the pass needs its input
 * deadlocks the interleaved schedule (pp 2, vpp 2, 4 micro-batches). */
#include "tests/test.h"
#include "model/model.h"

enum { MAXP = 8, MAXA = 2 * 24 * 4 };

typedef struct {
    int backward, g, mb; /* the message for chunk g's pass (backward: its output gradient) */
} Msg;

static int same(Msg a, Msg b) { return a.backward == b.backward && a.g == b.g && a.mb == b.mb; }

typedef struct {
    ModelAction act[MAXA];
    int n, pc, phase;  /* phase 0: waits for its input, 1: computed, sends */
    Msg recv[MAXA];    /* expected receives in order */
    int n_recv, next;  /* next: the posted (or next to post) receive */
    int posted;        /* a receive is posted and not yet consumed */
    Msg sent;          /* the last send */
    int has_sent;
} Stage;

/* Has message m been sent and is it still unconsumed, or been consumed, by stage r? */
static int delivered(const Stage *st, int r, Msg m)
{
    for (int i = 0; i < st[r].next; i++)
        if (same(st[r].recv[i], m))
            return 1; /* consumed */
    return st[r].posted && st[r].next < st[r].n_recv && same(st[r].recv[st[r].next], m);
}

/* 1 when every stage finished; early: receives posted ahead (exec/step.c), else on demand. */
static int run(int p, int v, int m, ModelSchedule sched, int early)
{
    ModelDims d;
    memset(&d, 0, sizeof d);
    d.p = p;
    d.v = v;
    d.m = m;
    d.chunks = p * v;
    Stage st[MAXP];
    Msg inflight[MAXP * MAXA];
    int n_inflight = 0;
    memset(st, 0, sizeof st);
    for (int s = 0; s < p; s++) {
        Stage *S = &st[s];
        S->n = model_schedule_build(&d, sched, s, S->act);
        for (int i = 0; i < S->n; i++) {
            const ModelAction *a = &S->act[i];
            int g = model_global_chunk(&d, s, a->chunk);
            if ((!a->backward && g > 0) || (a->backward && g < d.chunks - 1))
                S->recv[S->n_recv++] = (Msg){a->backward, g, a->mb};
        }
        S->posted = early && S->n_recv > 0;
    }
    for (;;) {
        int progress = 0, done = 1;
        for (int s = 0; s < p; s++) {
            Stage *S = &st[s];
            while (S->pc < S->n) {
                const ModelAction *a = &S->act[S->pc];
                const int g = model_global_chunk(&d, s, a->chunk);
                if (S->phase == 0) {
                    if ((!a->backward && g > 0) || (a->backward && g < d.chunks - 1)) {
                        Msg want = {a->backward, g, a->mb};
                        CHECK(same(S->recv[S->next], want)); /* receives come in schedule order */
                        S->posted = 1;
                        int arrived = 0;
                        for (int k = 0; k < n_inflight && !arrived; k++)
                            arrived = same(inflight[k], want);
                        if (!arrived)
                            break;
                        S->next++;
                        S->posted = early && S->next < S->n_recv;
                    }
                    S->phase = 1;
                    progress = 1;
                }
                if ((!a->backward && g < d.chunks - 1) || (a->backward && g > 0)) {
                    /* the send buffer is free once its last message was received */
                    if (S->has_sent && !delivered(st, S->sent.g % p, S->sent))
                        break;
                    S->sent = a->backward ? (Msg){1, g - 1, a->mb} : (Msg){0, g + 1, a->mb};
                    S->has_sent = 1;
                    inflight[n_inflight++] = S->sent;
                }
                S->phase = 0;
                S->pc++;
                progress = 1;
            }
            done &= S->pc == S->n;
        }
        if (done)
            return 1;
        if (!progress)
            return 0;
    }
}

int main(void)
{
    int configs = 0;
    for (int p = 2; p <= MAXP; p++)
        for (int v = 1; v <= 4; v++)
            for (int m = 1; m <= 24; m++) {
                if (v == 1) {
                    CHECK(run(p, 1, m, MODEL_SCHED_GPIPE, 1));
                    CHECK(run(p, 1, m, MODEL_SCHED_1F1B, 1));
                    configs += 2;
                } else if (m % p == 0) {
                    if (!run(p, v, m, MODEL_SCHED_INTERLEAVED, 1)) {
                        fprintf(stderr, "FAILED: interleaved pp %d vpp %d m %d deadlocks\n", p, v, m);
                        return 1;
                    }
                    configs++;
                }
            }
    /* receives posted only when needed: 1F1B survives, the interleaved schedule does not */
    CHECK(run(4, 1, 8, MODEL_SCHED_1F1B, 0));
    CHECK(!run(2, 2, 4, MODEL_SCHED_INTERLEAVED, 0));
    printf("%d schedules finish with one send and one receive buffer per stage\n", configs);
    TEST_DONE("test_exec_schedule");
}
