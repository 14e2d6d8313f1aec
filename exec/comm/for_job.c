/* The layer a multi-rank job uses: MPI on the CPU; on GPUs each rank takes the GPU of its
 * local rank, NCCL when every rank of the node has its own GPU, else MPI staged through host
 * memory (NCCL refuses two ranks on one device, or was not built). Above the backends: it
 * chooses among them. */
#include <stdio.h>

#include "exec/comm/backend.h" /* comm_mpi_local */
#include "kernels/kernels.h"

int comm_for_job(const ModelSpec *s, int tied_pair, int gpu, CommLayer **out, const char **note,
                 PxError *err)
{
    static char why[128];
    *out = NULL;
    *note = NULL;
    if (!gpu)
        return comm_mpi(&s->layout, tied_pair, out, err);
    int local = 0, per_node = 1;
    comm_mpi_local(&local, &per_node);
    const int gpus = kern_cuda_device_count();
    if (gpus > 0 && kern_cuda_set_device(local % gpus) != PX_OK)
        return px_fail(err, PX_ERUNTIME, "cannot use GPU %d of %d", local % gpus, gpus);
    if (gpus >= per_node && comm_nccl_available())
        return comm_nccl(&s->layout, tied_pair, out, err);
    CommLayer *mpi = NULL;
    int rc = comm_mpi(&s->layout, tied_pair, &mpi, err);
    const KernBackend *k = kern_cuda_with(s->job.precision);
    if (rc || !k) {
        *out = mpi; /* no CUDA backend here: exec_init says so */
        return rc;
    }
    if (!comm_nccl_available())
        snprintf(why, sizeof why, "staged through host memory: built without NCCL");
    else
        snprintf(why, sizeof why, "staged through host memory: %d ranks share %d GPU%s on this node",
                 per_node, gpus, gpus == 1 ? "" : "s");
    *note = why;
    return comm_staged(mpi, k, out, err);
}
