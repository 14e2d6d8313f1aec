/* The all-to-all of MoE token rows (comm_all_to_all_counts, comm_all_to_allv) on the MPI layer,
 * the staged layer and (built against the emulator) the NCCL layer, under mpirun with 2 and 4
 * ranks: uneven counts, zeros included, every element checked at its place; the bytes counted
 * under MODEL_EP_ALL_TO_ALL are what this rank sent; the counts exchange is not counted; the
 * expert groups follow model_expert_coords (etp fastest, then ep, then expert data parallel).
 * Usage: test_comm_a2a RANKS [mpi|staged|nccl] (starts itself under mpirun). */
#include <sys/wait.h>
#include <unistd.h>

#include "exec/comm/comm.h"
#include "kernels/kernels.h"
#include "tests/test.h"

/* what rank src sends to rank dst of the group: uneven, and none for some pairs */
static int64_t count_of(int src, int dst, int g) { return (int64_t)((src * 3 + dst * 2) % (g + 1)); }

static float value_of(int src, int dst, int i) { return (float)(src * 1000 + dst * 100 + i); }

static void check_layout(const ModelLayout *l, const char *mode, int rank)
{
    PxError err = {0};
    CommLayer *c = NULL;
    const KernBackend *k = kern_cpu();
    if (!strcmp(mode, "nccl")) {
        k = kern_cuda_with(PX_BF16);
        CHECK(k != NULL);
        CHECK_OK(comm_nccl(l, 0, &c, &err), err);
    } else {
        CHECK_OK(comm_mpi(l, 0, &c, &err), err);
        if (!strcmp(mode, "staged")) {
            CommLayer *s = NULL;
            CHECK_OK(comm_staged(c, k, &s, &err), err);
            c = s;
        }
    }
    comm_set_timeout(c, 120);
    int etp, ep, edp, pp;
    model_expert_coords(l, rank, &etp, &ep, &edp, &pp);
    const int g = comm_group_size(c, MODEL_GROUP_EP), me = comm_group_rank(c, MODEL_GROUP_EP);
    CHECK_EQ_INT(l->ep, g);
    CHECK_EQ_INT(ep, me);
    CHECK_EQ_INT(l->etp, comm_group_size(c, MODEL_GROUP_ETP));
    CHECK_EQ_INT(etp, comm_group_rank(c, MODEL_GROUP_ETP));
    CHECK_EQ_INT(l->tp * l->dp / (l->ep * l->etp), comm_group_size(c, MODEL_GROUP_EDP));
    CHECK_EQ_INT(edp, comm_group_rank(c, MODEL_GROUP_EDP));

    /* the exchange of counts */
    int64_t send[8], recv[8];
    int64_t total_send = 0, total_recv = 0;
    for (int j = 0; j < g; j++) {
        send[j] = count_of(me, j, g);
        total_send += send[j];
    }
    CHECK_OK(comm_all_to_all_counts(c, send, recv, MODEL_EP_ALL_TO_ALL, &err), err);
    for (int j = 0; j < g; j++) {
        CHECK_EQ_INT(count_of(j, me, g), recv[j]);
        total_recv += recv[j];
    }
    CHECK_EQ_U64(0, comm_bytes(c, MODEL_EP_ALL_TO_ALL));

    /* the rows, in device memory the layer was told of */
    const size_t cap = 64;
    float host[64];
    float *in = k->alloc(cap * sizeof(float)), *out = k->alloc(cap * sizeof(float));
    CHECK(in && out);
    CHECK_OK(comm_attach(c, in, cap * sizeof(float), &err), err);
    CHECK_OK(comm_attach(c, out, cap * sizeof(float), &err), err);
    size_t o = 0;
    for (int j = 0; j < g; j++)
        for (int i = 0; i < send[j]; i++)
            host[o++] = value_of(me, j, i);
    /* bf16 would round the values: the NCCL test moves them as fp32 all the same */
    k->to_device(in, host, o * sizeof(float));
    CHECK_OK(comm_all_to_allv(c, out, recv, in, send, PX_FP32, MODEL_EP_ALL_TO_ALL, &err), err);
    k->sync();
    memset(host, 0, sizeof host);
    k->to_host(host, out, (size_t)total_recv * sizeof(float));
    o = 0;
    for (int j = 0; j < g; j++)
        for (int i = 0; i < recv[j]; i++, o++)
            if (host[o] != value_of(j, me, i)) {
                fprintf(stderr, "%s rank %d: row %zu from %d: expected %g, got %g\n", mode, rank,
                        o, j, (double)value_of(j, me, i), (double)host[o]);
                exit(1);
            }
    CHECK_EQ_U64((uint64_t)total_send * 4, comm_bytes(c, MODEL_EP_ALL_TO_ALL));
    CHECK_EQ_U64(g > 1 ? 1 : 0, comm_calls(c, MODEL_EP_ALL_TO_ALL));
    /* a kind that is no all-to-all is refused */
    CHECK(comm_all_to_allv(c, out, recv, in, send, PX_FP32, MODEL_TP_ALLREDUCE, &err) ==
          PX_ERUNTIME);
    CHECK_OK(comm_barrier(c, &err), err);
    k->free(in);
    k->free(out);
    comm_free(c);
}

static int under_mpirun(int ranks, const char *mode)
{
    if (system("command -v mpirun >/dev/null 2>&1") != 0) {
        printf("test_comm_a2a: mpirun is not installed: skipped\n");
        return 77;
    }
    char self[1024];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    CHECK(n > 0);
    self[n] = '\0';
    char cmd[1400];
    snprintf(cmd, sizeof cmd, "mpirun -n %d %s--oversubscribe --bind-to none --quiet '%s' %d %s",
             ranks, geteuid() == 0 ? "--allow-run-as-root " : "", self, ranks, mode);
    int status = system(cmd);
    if (status == -1 || !WIFEXITED(status))
        return 1;
    return WEXITSTATUS(status);
}

int main(int argc, char **argv)
{
    if (argc != 3 || (strcmp(argv[2], "mpi") && strcmp(argv[2], "staged") &&
                      strcmp(argv[2], "nccl"))) {
        fprintf(stderr, "usage: test_comm_a2a RANKS mpi|staged|nccl\n");
        return 2;
    }
    const int ranks = atoi(argv[1]);
    const char *mode = argv[2];
    if (!comm_mpi_available() || (!strcmp(mode, "nccl") && !comm_nccl_available())) {
        printf("test_comm_a2a: built without %s: skipped\n", mode);
        return 77;
    }
    int rank = 0, world = 1;
    if (!comm_mpi_start(&argc, &argv, &rank, &world))
        return under_mpirun(ranks, mode);
    CHECK_EQ_INT(ranks, world);
    if (!strcmp(mode, "nccl"))
        CHECK_OK(kern_cuda_set_device(rank), (PxError){0});
    ModelLayout l;
    memset(&l, 0, sizeof l);
    l.tp = l.cp = l.pp = l.vpp = l.etp = 1;
    /* every rank an expert rank */
    l.dp = world;
    l.ep = world;
    check_layout(&l, mode, rank);
    if (world == 4) {
        /* tp 2 x dp 2 with ep 2, etp 1: expert data parallel 2 */
        l.tp = 2;
        l.dp = 2;
        l.ep = 2;
        check_layout(&l, mode, rank);
        /* etp 2 x ep 2 */
        l.etp = 2;
        check_layout(&l, mode, rank);
    }
    comm_mpi_finish();
    if (rank == 0)
        printf("test_comm_a2a %s: %d ranks, %d checks passed on rank 0\n", mode, world,
               px_test_checks);
    return 0;
}
