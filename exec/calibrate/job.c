/* `parallax calibrate`: the parts of a calibration, each its own launch of parallax-worker with
 * as many ranks as it measures, then the profile assembled from them. The front end's part: it
 * starts processes and names files, and needs neither MPI nor the kernels. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h> /* mkdtemp */
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "exec/calibrate/calibrate.h"
#include "profiles/profile.h"

enum { MAX_LEVELS = 32, MAX_PARTS = MAX_LEVELS + 2, PATH_CAP = 1300 };

/* The parts' files in a temporary folder, in the order assemble reads them. */
typedef struct {
    const char *dir;
    char path[MAX_PARTS][PATH_CAP];
    int n;
} Parts;

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

/* The profile to write: -o, else prof_calibrated_path's, whose profiles/ folder is created when
 * it is missing. */
static int output_path(const CalibJob *j, char *output, size_t cap, PxError *err)
{
    if (j->output) {
        px_strlcpy(output, j->output, cap);
        return PX_OK;
    }
    prof_calibrated_path(output, cap);
    char dir[1200];
    px_strlcpy(dir, output, sizeof dir);
    char *slash = strrchr(dir, '/');
    if (slash) {
        *slash = '\0';
        if (px_mkdir_p(dir, err))
            return PX_ERUNTIME;
    }
    return PX_OK;
}

/* The most ranks at once: --ranks, else the cores (a warning when it is more than them). */
static int job_ranks(const CalibJob *j)
{
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int ranks = j->ranks > 0 ? j->ranks : cores > 0 ? (int)cores : 1;
    if (cores > 0 && ranks > cores)
        px_warn("calibrate: %d ranks on %ld cores: ranks beyond the cores share them, and what "
                "they measure describes no real job",
                ranks, cores);
    return ranks;
}

/* A part's arguments after its first n: the job's --quick and --quiet, then the end. */
static void end_args(const CalibJob *j, const char **args, int n)
{
    if (j->quick)
        args[n++] = "--quick";
    if (j->quiet)
        args[n++] = "--quiet";
    args[n] = NULL;
}

/* One part: the worker with args on `ranks` ranks; PX_OK with *status 0, or the failure. */
static int run_part(const CalibJob *j, int ranks, const char *const *args, int *status,
                    PxError *err)
{
    LaunchJob l = {ranks == 1 && j->launcher == LAUNCH_DEFAULT ? LAUNCH_NONE
                                                                       : j->launcher,
                    ranks, "calibrate", NULL};
    int rc = launch_worker(&l, args, status, err);
    if (!rc && *status != 0)
        rc = px_fail(err, *status == 2 ? PX_EINPUT : PX_ERUNTIME,
                     "the calibration part '%s' on %d rank%s failed (exit %d)", args[2], ranks,
                     ranks > 1 ? "s" : "", *status);
    return rc;
}

void calib_log_path(const char *profile, char *out, size_t cap)
{
    px_strlcpy(out, profile, cap);
    size_t n = strlen(out);
    if (n >= 5 && strcmp(out + n - 5, ".json") == 0)
        out[n - 5] = '\0';
    n = strlen(out);
    snprintf(out + n, cap > n ? cap - n : 0, ".calibration.txt");
}

/* The parts print their tables on their stdout, which they inherit: pointed at the log for the
 * measurement (*saved: the terminal's descriptor, to put back; -1: nothing redirected). The
 * progress lines are printed here, between parts, on the terminal. */
static int log_open(const char *log, int *saved, PxError *err)
{
    *saved = -1;
    if (!strcmp(log, "-"))
        return PX_OK;
    int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0)
        return px_fail(err, PX_ERUNTIME, "--log %s: %s", log, strerror(errno));
    fflush(stdout);
    *saved = dup(STDOUT_FILENO);
    if (*saved < 0 || dup2(fd, STDOUT_FILENO) < 0) {
        close(fd);
        return px_fail(err, PX_ERUNTIME, "--log %s: %s", log, strerror(errno));
    }
    close(fd);
    return PX_OK;
}

static void log_close(int saved)
{
    if (saved < 0)
        return;
    fflush(stdout);
    dup2(saved, STDOUT_FILENO);
    close(saved);
}

/* A progress line on the terminal while the parts' output goes to the log. */
static void progress(int saved, const char *line)
{
    if (saved < 0) {
        fputs(line, stdout);
        fflush(stdout);
        return;
    }
    ssize_t n = write(saved, line, strlen(line));
    (void)n; /* a lost progress line is not worth failing a calibration for */
}

/* The compute part at concurrency 1, 2, 4, ... and `ranks`, then the comm part over `ranks`
 * (j: the defaults filled in; term: the terminal's descriptor while stdout is the log, else -1). */
static int measure(const CalibJob *j, int ranks, int term, Parts *p, int *status, PxError *err)
{
    int levels[MAX_LEVELS], nl = 0;
    for (int c = 1; c < ranks && nl < MAX_LEVELS - 2; c *= 2)
        levels[nl++] = c;
    levels[nl++] = ranks;
    int rc = PX_OK;
    for (int i = 0; i < nl && !rc; i++) {
        snprintf(p->path[p->n], PATH_CAP, "%s/compute-%d.json", p->dir, levels[i]);
        const char *args[16] = {"calibrate", "--part", "compute", "-o", p->path[p->n++],
                                "--models", j->models, "--base", j->base, "--backend", j->backend};
        end_args(j, args, 11);
        if (!j->quiet) {
            char line[128];
            snprintf(line, sizeof line, "calibrate: part %d of %d: compute with %d rank%s at once\n",
                     i + 1, nl + (ranks > 1) + 1, levels[i], levels[i] > 1 ? "s" : "");
            progress(term, line);
        }
        rc = run_part(j, levels[i], args, status, err);
    }
    if (!rc && ranks > 1) {
        snprintf(p->path[p->n], PATH_CAP, "%s/comm.json", p->dir);
        const char *args[10] = {"calibrate", "--part", "comm", "-o", p->path[p->n++]};
        end_args(j, args, 5);
        if (!j->quiet) {
            char line[128];
            snprintf(line, sizeof line, "calibrate: part %d of %d: collectives over %d ranks\n",
                     nl + 1, nl + 2, ranks);
            progress(term, line);
        }
        rc = run_part(j, ranks, args, status, err);
    }
    return rc;
}

/* The profile from the parts, on one process (j: the defaults filled in). */
static int assemble(const CalibJob *j, const char *output, const Parts *p, int *status,
                    PxError *err)
{
    const char *args[MAX_PARTS + 10] = {"calibrate", "--part", "assemble", "-o", output,
                                        "--base", j->base};
    int n = 7;
    if (j->quiet)
        args[n++] = "--quiet";
    for (int i = 0; i < p->n; i++)
        args[n++] = p->path[i];
    args[n] = NULL;
    LaunchJob l = {LAUNCH_NONE, 1, "calibrate", NULL};
    int rc = launch_worker(&l, args, status, err);
    if (!rc && *status != 0)
        rc = px_fail(err, *status == 2 ? PX_EINPUT : PX_ERUNTIME,
                     "assembling the profile failed (exit %d)", *status);
    return rc;
}

int calib_job(const CalibJob *job, int *exit_status, PxError *err)
{
    *exit_status = 0;
    /* every part is told the models, base and backend: the defaults are filled in once here */
    CalibJob filled = *job;
    const CalibJob *j = &filled;
    if (!filled.models)
        filled.models = CALIB_DEFAULT_MODELS;
    if (!filled.base)
        filled.base = CALIB_DEFAULT_BASE;
    if (!filled.backend)
        filled.backend = CALIB_DEFAULT_BACKEND;
    char output[1200];
    int rc = output_path(j, output, sizeof output, err);
    if (rc)
        return rc;
    const int ranks = job_ranks(j);
    char dir[] = "/tmp/parallax-calibrate-XXXXXX";
    if (!mkdtemp(dir))
        return px_fail(err, PX_ERUNTIME, "cannot create a temporary folder: %s", strerror(errno));
    Parts p;
    p.dir = dir;
    p.n = 0;
    int status = 0;
    char log[1300];
    if (filled.log)
        px_strlcpy(log, filled.log, sizeof log);
    else
        calib_log_path(output, log, sizeof log);
    int saved = -1;
    if ((rc = log_open(log, &saved, err))) {
        remove_dir(dir);
        return rc;
    }
    rc = measure(j, ranks, saved, &p, &status, err);
    log_close(saved);
    if (!rc && !j->quiet && saved >= 0) {
        printf("calibrate: the measurements' tables are in %s\n", log);
        fflush(stdout); /* before the assemble part's own line */
    }
    if (!rc)
        rc = assemble(j, output, &p, &status, err);
    if (rc) {
        *exit_status = status;
        size_t n = strlen(err->msg);
        snprintf(err->msg + n, sizeof err->msg - n, "; the parts measured so far are in %s", dir);
    } else {
        remove_dir(dir);
    }
    return rc;
}

int calib_probe(const char *backend, int quick, double *peak, double *bw, PxError *err)
{
    *peak = *bw = 0;
    char dir[] = "/tmp/parallax-probe-XXXXXX";
    if (!mkdtemp(dir))
        return px_fail(err, PX_ERUNTIME, "cannot create a temporary folder: %s", strerror(errno));
    char path[PATH_CAP];
    snprintf(path, sizeof path, "%s/probe.json", dir);
    const char *args[12] = {"calibrate", "--part", "probe", "-o", path, "--backend",
                            backend ? backend : CALIB_DEFAULT_BACKEND, "--quiet"};
    if (quick)
        args[8] = "--quick";
    LaunchJob l = {LAUNCH_NONE, 1, "calibrate", NULL};
    int status = 0;
    int rc = launch_worker(&l, args, &status, err);
    if (!rc && status != 0)
        rc = px_fail(err, PX_ERUNTIME, "the host probe (parallax-worker calibrate --part probe) failed (exit %d)",
                     status);
    cJSON *j = rc ? NULL : px_json_read_file(path, err);
    if (!rc && !j)
        rc = PX_ERUNTIME;
    if (!rc &&
        ((rc = px_json_double(j, path, "peak_flops", 1, 1, 1e20, peak, err)) ||
         (rc = px_json_double(j, path, "memory_bandwidth", 1, 1, 1e16, bw, err))))
        rc = PX_ERUNTIME;
    cJSON_Delete(j);
    remove_dir(dir);
    return rc;
}
