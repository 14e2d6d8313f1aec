/* The executor's backends by name, for the worker and for `parallax run`, which checks
 * --backend before it starts anything (it links this file through px_launch, without the
 * kernels). */
#include <string.h>

#include "exec/exec.h"

int exec_backend_parse(const char *name, ExecBackend *out, PxError *err)
{
    if (!strcmp(name, "auto"))
        *out = EXEC_BACKEND_AUTO;
    else if (!strcmp(name, "cpu"))
        *out = EXEC_BACKEND_CPU;
    else if (!strcmp(name, "cuda"))
        *out = EXEC_BACKEND_CUDA;
    else
        return px_fail(err, PX_EINPUT, "--backend: expected cpu, cuda or auto, got '%s'", name);
    return PX_OK;
}

const char *exec_backend_name(ExecBackend b)
{
    return b == EXEC_BACKEND_CPU ? "cpu" : b == EXEC_BACKEND_CUDA ? "cuda" : "auto";
}
