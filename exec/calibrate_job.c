/* `parallax calibrate`: the parts of a calibration (calibrate.c), each its own launch of
 * parallax-worker with as many ranks as it measures, then the profile assembled from them. */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "exec/exec.h"
#include "exec/launch/launch.h"
#include "profiles/profile.h"

/* Removes the parts' folder and what calibrate put in it (plain files only). */
static void remove_dir(const char *dir)
{
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *e;
        char path[1200];
        while ((e = readdir(d)) != NULL) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
                continue;
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            unlink(path);
        }
        closedir(d);
    }
    rmdir(dir);
}

/* A part's arguments after its first n: the job's --quick and --quiet, then the end. */
static void end_args(const ExecCalibrateJob *j, const char **args, int n)
{
    if (j->quick)
        args[n++] = "--quick";
    if (j->quiet)
        args[n++] = "--quiet";
    args[n] = NULL;
}

/* One part: the worker with args on `ranks` ranks; PX_OK with *status 0, or the failure. */
static int run_part(const ExecCalibrateJob *j, int ranks, const char *const *args, int *status,
                    PxError *err)
{
    LaunchJob l = {ranks == 1 && j->launcher == LAUNCH_DEFAULT ? LAUNCH_NONE : j->launcher,
                   ranks, "calibrate"};
    int rc = launch_worker(&l, args, status, err);
    if (!rc && *status != 0)
        rc = px_fail(err, *status == 2 ? PX_EINPUT : PX_ERUNTIME,
                     "the calibration part '%s' on %d rank%s failed (exit %d)", args[2], ranks,
                     ranks > 1 ? "s" : "", *status);
    return rc;
}

int exec_calibrate_job(const ExecCalibrateJob *j, int *exit_status, PxError *err)
{
    *exit_status = 0;
    char output[1200];
    if (j->output) {
        px_strlcpy(output, j->output, sizeof output);
    } else {
        prof_calibrated_path(output, sizeof output);
        /* the default lands in a profiles/ folder: create it when it is missing */
        char dir[1200];
        px_strlcpy(dir, output, sizeof dir);
        char *slash = strrchr(dir, '/');
        if (slash) {
            *slash = '\0';
            if (mkdir(dir, 0755) != 0 && errno != EEXIST)
                return px_fail(err, PX_ERUNTIME, "%s: cannot create: %s", dir, strerror(errno));
        }
    }
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int ranks = j->ranks > 0 ? j->ranks : cores > 0 ? (int)cores : 1;
    if (cores > 0 && ranks > cores)
        px_warn("calibrate: %d ranks on %ld cores: ranks beyond the cores share them, and what "
                "they measure describes no real job",
                ranks, cores);
    char dir[] = "/tmp/parallax-calibrate-XXXXXX";
    if (!mkdtemp(dir))
        return px_fail(err, PX_ERUNTIME, "cannot create a temporary folder: %s", strerror(errno));

    /* concurrency levels 1, 2, 4, ... and the ranks asked for */
    int levels[32], nl = 0;
    for (int c = 1; c < ranks && nl < 30; c *= 2)
        levels[nl++] = c;
    levels[nl++] = ranks;
    char parts[34][1300];
    const char *part_args[34];
    int np = 0, rc = PX_OK, status = 0;
    const char *models = j->models ? j->models : "tiny,tiny-llama";
    const char *base = j->base ? j->base : "local";
    const char *backend = j->backend ? j->backend : "cpu";
    for (int i = 0; i < nl && !rc; i++) {
        snprintf(parts[np], sizeof parts[np], "%s/compute-%d.json", dir, levels[i]);
        const char *args[16] = {"calibrate", "--part", "compute", "-o", parts[np], "--models",
                                models, "--base", base, "--backend", backend};
        end_args(j, args, 11);
        if (!j->quiet) {
            printf("calibrate: part %d of %d: compute with %d rank%s at once\n", i + 1,
                   nl + (ranks > 1) + 1, levels[i], levels[i] > 1 ? "s" : "");
            fflush(stdout);
        }
        rc = run_part(j, levels[i], args, &status, err);
        part_args[np] = parts[np];
        np++;
    }
    if (!rc && ranks > 1) {
        snprintf(parts[np], sizeof parts[np], "%s/comm.json", dir);
        const char *args[10] = {"calibrate", "--part", "comm", "-o", parts[np]};
        end_args(j, args, 5);
        if (!j->quiet) {
            printf("calibrate: part %d of %d: collectives over %d ranks\n", nl + 1, nl + 2, ranks);
            fflush(stdout);
        }
        rc = run_part(j, ranks, args, &status, err);
        part_args[np] = parts[np];
        np++;
    }
    if (!rc) {
        const char *args[48] = {"calibrate", "--part", "assemble", "-o", output, "--base", base};
        int n = 7;
        if (j->quiet)
            args[n++] = "--quiet";
        for (int i = 0; i < np; i++)
            args[n++] = part_args[i];
        args[n] = NULL;
        LaunchJob l = {LAUNCH_NONE, 1, "calibrate"};
        rc = launch_worker(&l, args, &status, err);
        if (!rc && status != 0)
            rc = px_fail(err, status == 2 ? PX_EINPUT : PX_ERUNTIME,
                         "assembling the profile failed (exit %d)", status);
    }
    if (rc) {
        *exit_status = status;
        size_t n = strlen(err->msg);
        snprintf(err->msg + n, sizeof err->msg - n, "; the parts measured so far are in %s", dir);
        return rc;
    }
    remove_dir(dir);
    return PX_OK;
}
