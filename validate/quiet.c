/* Whether the machine was quiet while validate timed its runs: the host's CPU accounting
 * (/proc/stat: every CPU's busy and steal jiffies), the 1-minute load (/proc/loadavg) and this
 * process tree's own CPU time (getrusage of the process and its reaped children) read before and
 * after the timed runs. What the CPUs did beyond the validation's own tree is other processes'
 * work; the busiest of them are named from /proc/[pid]/stat. docs/calibration.md ("Is the
 * machine quiet?") states the bars and why. */
#include "validate/validate.h"

#include <ctype.h>
#include <dirent.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

int val_proc_stat_parse(const char *text, ValCpuTimes *out)
{
    memset(out, 0, sizeof *out);
    out->steal = -1;
    /* the first line: "cpu  user nice system idle iowait irq softirq steal guest guest_nice";
     * guest time is already inside user and nice, so it is not added again */
    long long f[8];
    int n = sscanf(text, "cpu %lld %lld %lld %lld %lld %lld %lld %lld", &f[0], &f[1], &f[2], &f[3],
                   &f[4], &f[5], &f[6], &f[7]);
    if (n < 4)
        return PX_EINPUT;
    for (int i = 0; i < n; i++)
        out->total += f[i];
    out->busy = f[0] + f[1] + f[2] + (n > 5 ? f[5] : 0) + (n > 6 ? f[6] : 0);
    if (n > 7)
        out->steal = f[7];
    /* the CPUs the figures cover: one "cpuN" line each */
    for (const char *p = strstr(text, "\ncpu"); p; p = strstr(p + 1, "\ncpu"))
        if (isdigit((unsigned char)p[4]))
            out->cpus++;
    return PX_OK;
}

int val_proc_pid_stat_parse(const char *text, ValProc *out)
{
    memset(out, 0, sizeof *out);
    /* "pid (comm) state ppid ...": comm may hold spaces and parentheses, so it ends at the last ')' */
    const char *open = strchr(text, '('), *close = strrchr(text, ')');
    if (!open || !close || close < open || sscanf(text, "%d", &out->pid) != 1)
        return PX_EINPUT;
    size_t len = (size_t)(close - open - 1);
    if (len >= sizeof out->comm)
        len = sizeof out->comm - 1;
    memcpy(out->comm, open + 1, len);
    out->comm[len] = '\0';
    /* after comm: state (field 3) ... utime (14), stime (15) ... starttime (22) */
    unsigned long long ut, st, start;
    if (sscanf(close + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu %*d %*d %*d %*d "
                          "%*d %*d %llu",
               &ut, &st, &start) != 3)
        return PX_EINPUT;
    out->ticks = (long long)(ut + st);
    out->start = (long long)start;
    return PX_OK;
}

/* The text of a /proc file (the first cap - 1 bytes), or NULL. */
static char *read_text(const char *path, char *buf, size_t cap)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return NULL;
    size_t n = fread(buf, 1, cap - 1, f);
    fclose(f);
    buf[n] = '\0';
    return n ? buf : NULL;
}

static int by_pid(const void *a, const void *b)
{
    const ValProc *x = a, *y = b;
    return (x->pid > y->pid) - (x->pid < y->pid);
}

/* Every process's CPU ticks but this one's, sorted by pid (none where /proc cannot be read). */
static void scan_procs(ValHostSnap *s)
{
    DIR *d = opendir("/proc");
    if (!d)
        return;
    const int self = (int)getpid();
    struct dirent *e;
    char path[300], buf[1024];
    while ((e = readdir(d)) != NULL) {
        if (!isdigit((unsigned char)e->d_name[0]))
            continue;
        snprintf(path, sizeof path, "/proc/%s/stat", e->d_name);
        ValProc p;
        if (!read_text(path, buf, sizeof buf) || val_proc_pid_stat_parse(buf, &p) || p.pid == self)
            continue;
        if (s->n_procs == s->cap_procs) {
            int cap = s->cap_procs ? 2 * s->cap_procs : 512;
            ValProc *grown = realloc(s->procs, (size_t)cap * sizeof *grown);
            if (!grown)
                break;
            s->procs = grown, s->cap_procs = cap;
        }
        s->procs[s->n_procs++] = p;
    }
    closedir(d);
    qsort(s->procs, (size_t)s->n_procs, sizeof *s->procs, by_pid);
}

void val_host_snap(ValHostSnap *s)
{
    val_host_snap_free(s);
    memset(s, 0, sizeof *s);
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    s->t_s = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
    char buf[8192];
    const char *text = read_text("/proc/stat", buf, sizeof buf);
    s->have_stat = text && val_proc_stat_parse(text, &s->cpu) == PX_OK;
    s->load1 = -1;
    if ((text = read_text("/proc/loadavg", buf, sizeof buf)) && sscanf(text, "%lf", &s->load1) != 1)
        s->load1 = -1;
    /* the validation's own tree: this process and the runs it has waited for (their launchers
     * and ranks were waited for by them in turn), exact between runs, when none is alive */
    struct rusage self, kids;
    getrusage(RUSAGE_SELF, &self);
    getrusage(RUSAGE_CHILDREN, &kids);
    const struct timeval *tv[4] = {&self.ru_utime, &self.ru_stime, &kids.ru_utime, &kids.ru_stime};
    for (int i = 0; i < 4; i++)
        s->own_cpu_s += (double)tv[i]->tv_sec + 1e-6 * (double)tv[i]->tv_usec;
    long tck = sysconf(_SC_CLK_TCK);
    s->clk_tck = tck > 0 ? tck : 100;
    scan_procs(s);
}

void val_host_snap_free(ValHostSnap *s)
{
    if (!s)
        return;
    free(s->procs);
    s->procs = NULL;
    s->n_procs = s->cap_procs = 0;
}

/* The busiest other programs between a and b: the ticks each process alive at b used in the
 * window (one started within it, or under a reused pid, counts whole), summed by name (a build's
 * many compilers are one "cc1"), the top VAL_QUIET_NAMED into q->busiest. */
static void name_busiest(const ValHostSnap *a, const ValHostSnap *b, ValQuiet *q)
{
    q->n_busiest = 0;
    ValProc *by_name = calloc((size_t)b->n_procs + 1, sizeof *by_name); /* ticks: used in the window */
    int n = 0;
    for (int i = 0; by_name && i < b->n_procs; i++) {
        const ValProc *p = &b->procs[i];
        const ValProc *was = a->n_procs ? bsearch(p, a->procs, (size_t)a->n_procs, sizeof *p, by_pid)
                                        : NULL;
        const long long used = p->ticks - (was && was->start == p->start ? was->ticks : 0);
        if (used <= 0)
            continue;
        int k = 0;
        while (k < n && strcmp(by_name[k].comm, p->comm) != 0)
            k++;
        if (k == n) /* a new name (the array is zeroed) */
            memcpy(by_name[n++].comm, p->comm, sizeof p->comm);
        by_name[k].ticks += used;
    }
    for (int pick = 0; pick < VAL_QUIET_NAMED; pick++) {
        int best = -1;
        for (int k = 0; k < n; k++)
            if (by_name[k].ticks > 0 && (best < 0 || by_name[k].ticks > by_name[best].ticks))
                best = k;
        const double s = best < 0 ? 0 : (double)by_name[best].ticks / (double)b->clk_tck;
        if (!(s >= 0.05)) /* what prints as 0.0 s names nothing */
            break;
        q->busiest_s[q->n_busiest] = s;
        px_strlcpy(q->busiest[q->n_busiest++], by_name[best].comm, sizeof q->busiest[0]);
        by_name[best].ticks = 0;
    }
    free(by_name);
}

void val_quiet_judge(const ValHostSnap *a, const ValHostSnap *b, ValQuiet *q)
{
    memset(q, 0, sizeof *q);
    q->steal_s = NAN;
    q->window_s = b->t_s - a->t_s;
    q->load = fmax(a->load1, b->load1);
    if (!a->have_stat || !b->have_stat || b->cpu.total <= a->cpu.total) {
        snprintf(q->verdict, sizeof q->verdict, "not measured: /proc/stat could not be read, so "
                 "whether other work shared the machine is unknown");
        return;
    }
    q->measured = 1;
    const double tck = (double)b->clk_tck;
    /* the CPUs' time in the window, from the same counters as the busy time (not the clock):
     * cpus x window, less the moments the counters lag */
    q->cpu_s = (double)(b->cpu.total - a->cpu.total) / tck;
    q->cores = b->cpu.cpus > 0 ? b->cpu.cpus : 1;
    const double busy_s = (double)(b->cpu.busy - a->cpu.busy) / tck;
    q->own_cpu_s = b->own_cpu_s - a->own_cpu_s;
    q->other_cpu_s = fmax(0, busy_s - q->own_cpu_s);
    q->other_share = q->other_cpu_s / q->cpu_s;
    if (a->cpu.steal >= 0 && b->cpu.steal >= 0) {
        q->steal_s = (double)(b->cpu.steal - a->cpu.steal) / tck;
        q->steal_share = q->steal_s / q->cpu_s;
    }
    name_busiest(a, b, q);
    q->quiet = q->other_share < VAL_QUIET_OTHER && !(q->steal_share >= VAL_QUIET_STEAL);
    char steal[96] = "steal not reported";
    if (isfinite(q->steal_s))
        snprintf(steal, sizeof steal, "steal %.1f%%", 100 * q->steal_share);
    size_t n = (size_t)snprintf(q->verdict, sizeof q->verdict,
                                "%s: other processes used %.1f%% of the %d cores' time (%.1f of %.1f "
                                "CPU-s; bar %.0f%%), %s (bar %.0f%%), load %.2f",
                                q->quiet ? "quiet" : "busy", 100 * q->other_share, q->cores,
                                q->other_cpu_s, q->cpu_s, 100 * VAL_QUIET_OTHER, steal,
                                100 * VAL_QUIET_STEAL, q->load);
    for (int k = 0; k < q->n_busiest && n < sizeof q->verdict; k++)
        n += (size_t)snprintf(q->verdict + n, sizeof q->verdict - n, "%s%s %.1f s",
                              k ? ", " : "; busiest: ", q->busiest[k], q->busiest_s[k]);
}

void val_busy_reason(const ValQuiet *q, char *buf, size_t cap)
{
    if (q->other_share >= VAL_QUIET_OTHER || !(q->steal_share >= VAL_QUIET_STEAL))
        snprintf(buf, cap, "other processes took %.0f%% of the cores' time (quiet is under %.0f%%)",
                 100 * q->other_share, 100 * VAL_QUIET_OTHER);
    else
        snprintf(buf, cap, "the hypervisor took %.1f%% of the CPUs' time from this machine (steal; "
                 "quiet is under %.0f%%)", 100 * q->steal_share, 100 * VAL_QUIET_STEAL);
}

cJSON *val_quiet_json(const ValQuiet *q, const ValQuiet *before)
{
    cJSON *j = cJSON_CreateObject();
    if (q->measured)
        cJSON_AddBoolToObject(j, "quiet", q->quiet);
    else
        cJSON_AddNullToObject(j, "quiet");
    cJSON_AddNumberToObject(j, "load", q->load);
    cJSON_AddNumberToObject(j, "other_cpu_s", q->other_cpu_s);
    if (isfinite(q->steal_s))
        cJSON_AddNumberToObject(j, "steal_s", q->steal_s);
    else
        cJSON_AddNullToObject(j, "steal_s");
    cJSON_AddStringToObject(j, "verdict", q->verdict);
    /* what the figures are out of, and the bars */
    cJSON_AddNumberToObject(j, "window_s", q->window_s);
    cJSON_AddNumberToObject(j, "cores", q->cores);
    cJSON_AddNumberToObject(j, "cpu_s", q->cpu_s);
    cJSON_AddNumberToObject(j, "other_share", q->other_share);
    cJSON_AddNumberToObject(j, "other_share_max", VAL_QUIET_OTHER);
    cJSON_AddNumberToObject(j, "steal_share_max", VAL_QUIET_STEAL);
    if (before && before->measured) {
        cJSON *b = cJSON_AddObjectToObject(j, "before");
        cJSON_AddNumberToObject(b, "window_s", before->window_s);
        cJSON_AddNumberToObject(b, "load", before->load);
        cJSON_AddNumberToObject(b, "other_cpu_s", before->other_cpu_s);
        cJSON_AddNumberToObject(b, "other_share", before->other_share);
    }
    return j;
}
