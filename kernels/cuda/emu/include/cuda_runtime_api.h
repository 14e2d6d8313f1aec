/* For C code built against kernels/cuda/emu (exec/comm/nccl.c in px_comm_emu): the emulated CUDA
 * runtime in place of the toolkit's header of this name. */
#ifndef KERN_CUDA_EMU_CUDA_RUNTIME_API_H
#define KERN_CUDA_EMU_CUDA_RUNTIME_API_H

#include "kernels/cuda/emu/cuda_emu_runtime.h"

#endif
