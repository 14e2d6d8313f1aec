/* nccl_emu — NCCL's API for code built against kernels/cuda/emu: the collectives and the
 * point-to-point calls of exec/comm/nccl.c, carried out by MPI between the processes of an
 * mpirun job (each rank its own "GPU"), so that the NCCL communication layer runs in CI. Every
 * call is an operation on its CUDA stream (kern_emu_enqueue_op): it starts when the stream gets
 * to it, as NCCL's kernel would, as a non-blocking MPI call on the communicator's own MPI
 * communicator, over host copies of its buffers (MPI never touches the emulator's device
 * memory), and the stream goes on once it completes. Point-to-point messages match in order
 * per pair, as NCCL's do (one tag). The sends and receives of a group (ncclGroupStart/End)
 * start together at ncclGroupEnd; collectives inside a group start one after another, which is
 * enough when every rank issues them in the same order. As NCCL, the first send or receive
 * between two ranks of a communicator connects them on the host and blocks until the peer makes
 * its own (nccl_emu.c: a wait beyond PX_NCCL_EMU_CONNECT_S seconds, 60 by default, is reported
 * as the deadlock it would be on a GPU). Not emulated: anything else of NCCL, its performance,
 * its topology. */
#ifndef KERN_NCCL_EMU_H
#define KERN_NCCL_EMU_H

#include <stddef.h>

#include "kernels/cuda/emu/cuda_emu_runtime.h"

#ifdef __cplusplus
extern "C" {
#endif

#define NCCL_UNIQUE_ID_BYTES 128
typedef struct {
    char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;

typedef struct ncclComm *ncclComm_t;

typedef enum {
    ncclSuccess = 0,
    ncclUnhandledCudaError = 1,
    ncclSystemError = 2,
    ncclInternalError = 3,
    ncclInvalidArgument = 4,
    ncclInvalidUsage = 5,
} ncclResult_t;

typedef enum {
    ncclInt8 = 0,
    ncclUint8 = 1,
    ncclInt32 = 2,
    ncclUint32 = 3,
    ncclInt64 = 4,
    ncclUint64 = 5,
    ncclFloat16 = 6,
    ncclFloat32 = 7,
    ncclFloat64 = 8,
    ncclBfloat16 = 9,
} ncclDataType_t;

typedef enum { ncclSum = 0, ncclProd = 1, ncclMax = 2, ncclMin = 3, ncclAvg = 4 } ncclRedOp_t;

ncclResult_t ncclGetUniqueId(ncclUniqueId *id);
/* Collective over the nranks processes that call it with the same id (MPI must be running). */
ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank);
ncclResult_t ncclCommDestroy(ncclComm_t comm);
const char *ncclGetErrorString(ncclResult_t result);
ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream);
ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream);
ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count,
                        ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm,
                        cudaStream_t stream);
ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm,
                           cudaStream_t stream);
ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclGroupStart(void);
ncclResult_t ncclGroupEnd(void);

#ifdef __cplusplus
}
#endif

#endif
