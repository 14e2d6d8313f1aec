/* The layer a multi-rank job uses: MPI on the CPU; on GPUs each rank takes a GPU by its local
 * rank, NCCL when no two ranks of a node hold the same physical GPU, else MPI staged through
 * host memory (NCCL refuses two ranks on one device, or was not built). Above the backends: it
 * chooses among them.
 *
 * Which GPU is whose is decided by the GPUs' PCI bus ids, not by counting: under Slurm's
 * --gpus-per-task=1 (or a CUDA_VISIBLE_DEVICES per rank) each rank sees one device, index 0,
 * and eight ranks on a node with eight GPUs each see "1 GPU" while holding eight different
 * ones; with every GPU visible to every rank, local rank r takes index r % count. The ranks of
 * each node compare their bus ids, and all ranks agree on the result. */
#include <stdio.h>

#include "exec/comm/backend.h" /* comm_mpi_local, comm_mpi_node_sharing */
#include "kernels/kernels.h"

int comm_for_job(const ModelSpec *s, int tied_pair, int gpu, CommLayer **out, const char **note,
                 PxError *err)
{
    static char why[192];
    *out = NULL;
    *note = NULL;
    if (!gpu)
        return comm_mpi(&s->layout, tied_pair, out, err);
    int local = 0, per_node = 1;
    comm_mpi_local(&local, &per_node);
    const int gpus = kern_cuda_device_count();
    const int dev = gpus > 0 ? local % gpus : -1;
    char bus[64] = "";
    int failed = 0;
    if (gpus > 0)
        failed = kern_cuda_set_device(dev) != PX_OK ||
                 kern_cuda_device_bus_id(bus, sizeof bus) != PX_OK;
    /* collective: every rank takes part, failed or not, so that none is left waiting */
    int sharing = 1;
    const int any_failed = comm_mpi_node_sharing(bus, failed, &sharing);
    if (failed)
        return px_fail(err, PX_ERUNTIME, "cannot use GPU %d of the %d this rank sees", dev, gpus);
    if (any_failed)
        return px_fail(err, PX_ERUNTIME, "another rank could not take its GPU");
    if (gpus > 0 && sharing == 1 && comm_nccl_available()) {
        snprintf(why, sizeof why,
                 "one GPU per rank (local rank %d: GPU %d of the %d it sees, PCI %s)", local, dev,
                 gpus, bus);
        *note = why;
        return comm_nccl(&s->layout, tied_pair, out, err);
    }
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
        snprintf(why, sizeof why,
                 "staged through host memory: %d ranks of a node share a GPU (local rank %d of "
                 "%d: GPU %d of the %d it sees, PCI %s)",
                 sharing, local, per_node, dev, gpus, bus);
    *note = why;
    return comm_staged(mpi, k, out, err);
}
