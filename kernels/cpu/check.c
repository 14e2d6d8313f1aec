/* What KERN_CHECK calls when a kernel's contract is broken. Its own file, below the kernels and
 * the table that gathers them (backend.c), so that a kernel file depends on nothing that
 * depends on it. */
#include <stdio.h>
#include <stdlib.h>

#include "kernels/cpu/cpu.h"

_Noreturn void kern_cpu_fatal(const char *file, int line, const char *what)
{
    fprintf(stderr, "parallax: %s:%d: kernel contract violated: %s\n", file, line, what);
    abort();
}
