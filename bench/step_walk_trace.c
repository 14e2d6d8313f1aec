/* The tracer of bench/step_walk.sh: GCC's -finstrument-functions hooks, preloaded
 * (LD_PRELOAD) into a parallax-worker whose code was compiled with that flag. In the worker of
 * rank 0 it records every call and return of the main thread during one call of one function
 * (exec_step: one training step), each as the function's offset in the program, one line an
 * event ("E 1a2b 3c4d": a call of the function at 1a2b from the call site that returns to 3c4d;
 * "X 1a2b": its return), for bench/step_walk.py to map to files and count. Other processes (the front end, mpirun, the other ranks) and other threads (the data
 * loader) record nothing.
 *
 * Compiled by the script alone, never with -finstrument-functions: the hooks must not call
 * themselves. Its settings come from the environment:
 *   PARALLAX_WALK_EXE   the program to trace (its file name: parallax-worker)
 *   PARALLAX_WALK_FUNC  the function's offset in it, hex (nm)
 *   PARALLAX_WALK_CALL  which of its calls to record (1: the first)
 *   PARALLAX_WALK_OUT   the trace file to write */
#define _GNU_SOURCE
#include <link.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void __cyg_profile_func_enter(void *fn, void *site);
void __cyg_profile_func_exit(void *fn, void *site);

static int on;            /* this process records (until the recorded call returns) */
static uintptr_t base;    /* where the program is loaded (PIE) */
static uintptr_t trigger; /* the function whose call is recorded */
static long want, seen;   /* the call to record; calls of it so far */
static long depth;        /* within the recorded call: calls open, 0 outside */
static pthread_t main_thread;
static FILE *out;

/* the program is the first object dl_iterate_phdr reports */
static int first_object(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    *(uintptr_t *)data = (uintptr_t)info->dlpi_addr;
    return 1;
}

static int rank_zero(void)
{
    static const char *const vars[] = {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK",
                                       "SLURM_PROCID"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        if (v)
            return atoi(v) == 0;
    }
    return 1; /* one rank, started directly */
}

__attribute__((constructor)) static void walk_init(void)
{
    const char *exe = getenv("PARALLAX_WALK_EXE"), *func = getenv("PARALLAX_WALK_FUNC");
    const char *call = getenv("PARALLAX_WALK_CALL"), *path = getenv("PARALLAX_WALK_OUT");
    if (!exe || !func || !path || !rank_zero())
        return;
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0)
        return;
    self[n] = '\0';
    const char *name = strrchr(self, '/');
    if (strcmp(name ? name + 1 : self, exe) != 0)
        return;
    dl_iterate_phdr(first_object, &base);
    trigger = base + (uintptr_t)strtoull(func, NULL, 16);
    want = call ? atol(call) : 1;
    if (!(out = fopen(path, "w"))) {
        fprintf(stderr, "step_walk_trace: cannot write %s\n", path);
        return;
    }
    main_thread = pthread_self();
    on = 1;
}

void __cyg_profile_func_enter(void *fn, void *site)
{
    if (!on || !pthread_equal(pthread_self(), main_thread))
        return;
    const uintptr_t a = (uintptr_t)fn;
    if (depth == 0 && (a != trigger || ++seen != want))
        return;
    depth++;
    /* a call from outside the program (a library calling back) has no site in it */
    const uintptr_t s = (uintptr_t)site;
    fprintf(out, "E %lx %lx\n", (unsigned long)(a - base), (unsigned long)(s >= base ? s - base : 0));
}

void __cyg_profile_func_exit(void *fn, void *site)
{
    (void)site;
    if (!on || depth == 0 || !pthread_equal(pthread_self(), main_thread))
        return;
    fprintf(out, "X %lx\n", (unsigned long)((uintptr_t)fn - base));
    if (--depth == 0) {
        fclose(out);
        on = 0;
    }
}
