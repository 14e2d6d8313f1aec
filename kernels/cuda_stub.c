/* kern_cuda() for builds without CUDA: there is no CUDA backend, so callers use kern_cpu().
 * The CUDA backend, when built, defines these in kernels/cuda instead of this file. */
#include "kernels/kernels.h"

const KernBackend *kern_cuda(void) { return NULL; }

const KernBackend *kern_cuda_with(PxDtype act)
{
    (void)act;
    return NULL;
}

const KernBackend *kern_cuda_with_grads(PxDtype act, PxDtype grad)
{
    (void)act;
    (void)grad;
    return NULL;
}

int kern_cuda_device_count(void) { return 0; }

int kern_cuda_set_device(int device)
{
    (void)device;
    return PX_ERUNTIME;
}

int kern_cuda_device_name(char *buf, size_t cap)
{
    if (cap)
        buf[0] = '\0';
    return PX_ERUNTIME;
}

int kern_cuda_device_bus_id(char *buf, size_t cap)
{
    return kern_cuda_device_name(buf, cap);
}
