/* kern_cuda() for builds without CUDA: there is no CUDA backend, so callers use kern_cpu().
 * The CUDA backend, when built, defines these in kernels/cuda instead of this file. */
#include "kernels/kernels.h"

const KernBackend *kern_cuda(void) { return NULL; }

const KernBackend *kern_cuda_with(PxDtype act)
{
    (void)act;
    return NULL;
}
