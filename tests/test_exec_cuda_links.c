/* The GPU of each rank and the NCCL layer's pipeline links, on the emulated CUDA runtime and
 * NCCL, under mpirun with two ranks (the program starts itself there):
 * - pipeline: comm_for_job on a two-stage pipeline, both emulated GPUs visible to both ranks;
 *   each stage posts its first receive before any send, each direction on its own
 *   communicator, as the 1F1B schedule does at step 1. NCCL (and the emulator) blocks a pair's
 *   first send or receive until the peer's, so this deadlocks unless the layer connected its
 *   links at init; the bytes must arrive, and the layer is NCCL.
 * - visible: each rank sees only its own GPU (CUDA_VISIBLE_DEVICES = its local rank, as Slurm's
 *   --gpus-per-task=1 gives): both see one GPU, index 0, but not the same one: NCCL, said so.
 * - shared: both ranks see only physical GPU 1: MPI staged through host memory, said so.
 * - cold: the pipeline's pattern over two raw NCCL communicators nobody connected: the emulator
 *   must report the deadlock a GPU would hang in (ctest looks for its message).
 * Usage: test_exec_cuda_links pipeline|visible|shared|cold. */
#include <mpi.h>
#include <sys/wait.h>
#include <unistd.h>

#include "exec/comm/comm.h"
#include "kernels/cuda/emu/include/nccl.h"
#include "kernels/kernels.h"
#include "tests/test.h"

enum { BYTES = 4096 };

static ModelSpec two_stages(void)
{
    ModelSpec s;
    model_spec_defaults(&s);
    s.layout.tp = s.layout.cp = s.layout.dp = s.layout.vpp = 1;
    s.layout.pp = 2;
    s.job.precision = PX_BF16;
    return s;
}

/* what `from` sends `to`, byte i */
static unsigned char byte_of(int from, int i) { return (unsigned char)(from * 101 + i * 7); }

/* Each stage receives first, then sends; both messages must arrive whole. */
static void exchange(CommLayer *c, const KernBackend *k, int rank)
{
    PxError err = {0};
    const int peer = 1 - rank;
    unsigned char host[BYTES];
    unsigned char *in = k->alloc(BYTES), *out = k->alloc(BYTES);
    CHECK(in && out);
    CHECK_OK(comm_attach(c, in, BYTES, &err), err);
    CHECK_OK(comm_attach(c, out, BYTES, &err), err);
    for (int i = 0; i < BYTES; i++)
        host[i] = byte_of(rank, i);
    k->to_device(out, host, BYTES);
    int rreq = -1, sreq = -1;
    CHECK_OK(comm_recv(c, in, BYTES, peer, 7, MODEL_PP_RECV, &rreq, &err), err);
    CHECK_OK(comm_send(c, out, BYTES, peer, 7, MODEL_PP_SEND, &sreq, &err), err);
    CHECK_OK(comm_wait(c, &rreq, &err), err);
    CHECK_OK(comm_wait(c, &sreq, &err), err);
    k->sync();
    memset(host, 0, sizeof host);
    k->to_host(host, in, BYTES);
    for (int i = 0; i < BYTES; i++)
        CHECK_EQ_INT(byte_of(peer, i), host[i]);
    CHECK_EQ_U64(BYTES, comm_bytes(c, MODEL_PP_RECV));
    CHECK_EQ_U64(BYTES, comm_bytes(c, MODEL_PP_SEND));
    CHECK_OK(comm_barrier(c, &err), err);
    k->free(in);
    k->free(out);
}

static void check_layer(const char *mode, int rank)
{
    PxError err = {0};
    const ModelSpec s = two_stages();
    CommLayer *c = NULL;
    const char *note = NULL;
    CHECK_OK(comm_for_job(&s, 0, 1, &c, &note, &err), err);
    CHECK(note != NULL);
    const KernBackend *k = kern_cuda_with(PX_BF16);
    CHECK(k != NULL);
    comm_set_timeout(c, 120);
    if (!strcmp(mode, "shared")) {
        CHECK_STR("mpi", comm_name(c));
        CHECK(strstr(note, "staged through host memory: 2 ranks of a node share a GPU") == note);
        CHECK(strstr(note, "PCI 0000:19:00.0") != NULL); /* physical GPU 1 */
    } else {
        CHECK_STR("nccl", comm_name(c));
        CHECK(strstr(note, "one GPU per rank") == note);
        /* visible: each sees one GPU, its own; pipeline: each sees both, takes its local rank's */
        char want[96];
        snprintf(want, sizeof want, "GPU %d of the %d it sees, PCI 0000:%02x:00.0",
                 !strcmp(mode, "visible") ? 0 : rank, !strcmp(mode, "visible") ? 1 : 2, 0x18 + rank);
        if (!strstr(note, want)) {
            fprintf(stderr, "rank %d: expected \"%s\" in the note \"%s\"\n", rank, want, note);
            exit(1);
        }
    }
    exchange(c, k, rank);
    comm_free(c);
}

/* Two raw communicators, one per direction, each stage's receive first: a deadlock on a GPU,
 * which the emulator must report (and abort). */
static void cold(int rank)
{
    CHECK(kern_cuda_set_device(rank) == PX_OK);
    CHECK(kern_cuda_with(PX_BF16) != NULL);
    ncclUniqueId id[2];
    if (rank == 0)
        for (int i = 0; i < 2; i++)
            CHECK_EQ_INT(ncclSuccess, ncclGetUniqueId(&id[i]));
    MPI_Bcast(id, (int)sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
    ncclComm_t fwd, bwd; /* 0 -> 1 and 1 -> 0 */
    CHECK_EQ_INT(ncclSuccess, ncclCommInitRank(&fwd, 2, id[0], rank));
    CHECK_EQ_INT(ncclSuccess, ncclCommInitRank(&bwd, 2, id[1], rank));
    const KernBackend *k = kern_cuda_with(PX_BF16);
    void *buf = k->alloc(16);
    cudaStream_t st;
    CHECK_EQ_INT(cudaSuccess, cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    /* stage 0 waits for the gradient on bwd, stage 1 for the activation on fwd */
    ncclRecv(buf, 16, ncclUint8, 1 - rank, rank == 0 ? bwd : fwd, st);
    ncclSend(buf, 16, ncclUint8, 1 - rank, rank == 0 ? fwd : bwd, st);
    cudaStreamSynchronize(st);
    fprintf(stderr, "test_exec_cuda_links cold: rank %d was not stopped: the emulator let the "
                    "pipeline's first receives through unconnected links\n", rank);
    exit(1);
}

static int under_mpirun(const char *mode)
{
    if (system("command -v mpirun >/dev/null 2>&1") != 0) {
        printf("test_exec_cuda_links: mpirun is not installed: skipped\n");
        return 77;
    }
    char self[1024];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    CHECK(n > 0);
    self[n] = '\0';
    /* the emulator's GPUs: two per node; which each rank sees is the mode's */
    const char *visible = !strcmp(mode, "visible")
                              ? "CUDA_VISIBLE_DEVICES=${OMPI_COMM_WORLD_LOCAL_RANK:-$MPI_LOCALRANKID}"
                          : !strcmp(mode, "shared") ? "CUDA_VISIBLE_DEVICES=1"
                                                    : "";
    char cmd[1600];
    snprintf(cmd, sizeof cmd,
             "PX_CUDA_EMU_DEVICES=2 mpirun -n 2 %s--oversubscribe --bind-to none --quiet "
             "sh -c '%s exec \"$0\" %s' '%s'",
             geteuid() == 0 ? "--allow-run-as-root " : "", visible, mode, self);
    int status = system(cmd);
    if (status == -1 || !WIFEXITED(status))
        return 1;
    return WEXITSTATUS(status);
}

int main(int argc, char **argv)
{
    const char *mode = argc == 2 ? argv[1] : "";
    if (strcmp(mode, "pipeline") && strcmp(mode, "visible") && strcmp(mode, "shared") &&
        strcmp(mode, "cold")) {
        fprintf(stderr, "usage: test_exec_cuda_links pipeline|visible|shared|cold\n");
        return 2;
    }
    if (!comm_mpi_available() || !comm_nccl_available()) {
        printf("test_exec_cuda_links: built without MPI or the emulated NCCL: skipped\n");
        return 77;
    }
    int rank = 0, world = 1;
    if (!comm_mpi_start(&argc, &argv, &rank, &world))
        return under_mpirun(mode);
    CHECK_EQ_INT(2, world);
    if (!strcmp(mode, "cold"))
        cold(rank);
    else
        check_layer(mode, rank);
    comm_mpi_finish();
    if (rank == 0)
        printf("test_exec_cuda_links %s: %d checks passed on rank 0\n", mode, px_test_checks);
    return 0;
}
