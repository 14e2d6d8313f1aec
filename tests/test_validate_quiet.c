/* validate's quietness arithmetic on canned /proc snapshots: the busy, steal and total jiffies
 * of /proc/stat, the CPU time of other processes from /proc/[pid]/stat (a pid reused between the
 * snapshots counts whole), the bars, the verdict and the JSON's keys, all to the exact figure. */
#include "test.h"
#include "validate/validate.h"

/* Two CPUs; between the snapshots: user +400, system +100, softirq +10, steal +10 jiffies of
 * busy-or-stolen time, idle +200, so total +720 (7.2 CPU-s at 100 Hz) and busy +510 (5.1 s). */
static const char *const stat_a =
    "cpu  1000 10 200 5000 50 5 15 20 0 0\n"
    "cpu0 500 5 100 2500 25 3 8 10 0 0\n"
    "cpu1 500 5 100 2500 25 2 7 10 0 0\n"
    "intr 12345 0 0\nctxt 999\nbtime 1700000000\n";
static const char *const stat_b =
    "cpu  1400 10 300 5200 50 5 25 30 0 0\n"
    "cpu0 700 5 150 2600 25 3 13 15 0 0\n"
    "cpu1 700 5 150 2600 25 2 12 15 0 0\n"
    "intr 12999 0 0\nctxt 1999\nbtime 1700000000\n";

/* pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime
 * cutime cstime priority nice threads itreal starttime ... */
static ValProc proc(const char *line)
{
    ValProc p;
    PxError err = {0};
    CHECK_OK(val_proc_pid_stat_parse(line, &p), err);
    return p;
}

static void snap(ValHostSnap *s, const char *stat, double t_s, double load1, double own_s,
                 ValProc *procs, int n)
{
    memset(s, 0, sizeof *s);
    PxError err = {0};
    CHECK_OK(val_proc_stat_parse(stat, &s->cpu), err);
    s->have_stat = 1;
    s->t_s = t_s;
    s->load1 = load1;
    s->own_cpu_s = own_s;
    s->clk_tck = 100;
    s->procs = procs; /* sorted by pid, as val_host_snap leaves them */
    s->n_procs = n;
}

static void test_parse(void)
{
    ValCpuTimes c;
    CHECK_EQ_INT(PX_OK, val_proc_stat_parse(stat_a, &c));
    CHECK_EQ_INT(6300, (int)c.total); /* guest and guest_nice are inside user already */
    CHECK_EQ_INT(1230, (int)c.busy);  /* user + nice + system + irq + softirq */
    CHECK_EQ_INT(20, (int)c.steal);
    CHECK_EQ_INT(2, c.cpus);
    /* an old kernel without steal: reported as unknown, not as zero */
    CHECK_EQ_INT(PX_OK, val_proc_stat_parse("cpu  10 0 5 100 1 0 0\ncpu0 10 0 5 100 1 0 0\n", &c));
    CHECK_EQ_INT(-1, (int)c.steal);
    CHECK_EQ_INT(1, c.cpus);
    CHECK_EQ_INT(PX_EINPUT, val_proc_stat_parse("intr 1 2 3\n", &c));
    /* a command name with spaces and parentheses ends at the last ')' */
    ValProc p = proc("1234 (yes (x)) R 1 1234 1234 0 -1 4194304 100 0 0 0 250 30 0 0 20 0 1 0 "
                     "5000 8192 100\n");
    CHECK_EQ_INT(1234, p.pid);
    CHECK_STR("yes (x)", p.comm);
    CHECK_EQ_INT(280, (int)p.ticks);
    CHECK_EQ_INT(5000, (int)p.start);
    CHECK_EQ_INT(PX_EINPUT, val_proc_pid_stat_parse("1234 yes R 1", &p));
}

static void test_judge(void)
{
    ValProc pa[] = {proc("1234 (yes (x)) R 1 1 1 0 -1 0 0 0 0 0 250 30 0 0 20 0 1 0 5000 0 0"),
                    proc("1500 (idle) S 1 1 1 0 -1 0 0 0 0 0 70 0 0 0 20 0 1 0 400 0 0"),
                    proc("1600 (old) S 1 1 1 0 -1 0 0 0 0 0 800 100 0 0 20 0 1 0 100 0 0")};
    ValProc pb[] = {proc("1234 (yes (x)) R 1 1 1 0 -1 0 0 0 0 0 460 50 0 0 20 0 1 0 5000 0 0"),
                    proc("1500 (idle) S 1 1 1 0 -1 0 0 0 0 0 70 0 0 0 20 0 1 0 400 0 0"),
                    /* pid 1600 ended and was reused within the window: its 20 ticks count */
                    proc("1600 (sh) S 1 1 1 0 -1 0 0 0 0 0 15 5 0 0 20 0 1 0 9100 0 0"),
                    proc("2000 (cc1) R 1 1 1 0 -1 0 0 0 0 0 40 10 0 0 20 0 1 0 9000 0 0"),
                    /* a second compiler: summed with the first under its name */
                    proc("2001 (cc1) R 1 1 1 0 -1 0 0 0 0 0 8 2 0 0 20 0 1 0 9050 0 0"),
                    /* 4 ticks: 0.04 s would print as 0.0 s and is not named */
                    proc("2002 (ls) R 1 1 1 0 -1 0 0 0 0 0 4 0 0 0 20 0 1 0 9060 0 0")};
    ValHostSnap a, b;
    /* validate's own tree used 4.0 of the 5.1 busy CPU-s: others 1.1 of 7.2, 15.3% */
    snap(&a, stat_a, 10.0, 2.0, 1.5, pa, 3);
    snap(&b, stat_b, 13.6, 3.5, 5.5, pb, 6);
    ValQuiet q;
    val_quiet_judge(&a, &b, &q);
    CHECK_EQ_INT(1, q.measured);
    CHECK_EQ_INT(0, q.quiet);
    CHECK_REL(3.6, q.window_s, 1e-12);
    CHECK_REL(7.2, q.cpu_s, 1e-12);
    CHECK_EQ_INT(2, q.cores);
    CHECK_REL(4.0, q.own_cpu_s, 1e-12);
    CHECK_REL(1.1, q.other_cpu_s, 1e-12);
    CHECK_REL(1.1 / 7.2, q.other_share, 1e-12);
    CHECK_REL(0.1, q.steal_s, 1e-12);
    CHECK_REL(3.5, q.load, 0);
    CHECK_EQ_INT(3, q.n_busiest);
    CHECK_STR("busy: other processes used 15.3% of the 2 cores' time (1.1 of 7.2 CPU-s; bar 5%), "
              "steal 1.4% (bar 1%), load 3.50; busiest: yes (x) 2.3 s, cc1 0.6 s, sh 0.2 s",
              q.verdict);
    /* the JSON's shape: the five keys the report reads, then what they are out of */
    cJSON *j = val_quiet_json(&q, NULL);
    static const char *const keys[] = {"quiet", "load", "other_cpu_s", "steal_s", "verdict",
                                       "window_s", "cores", "cpu_s", "other_share",
                                       "other_share_max", "steal_share_max", NULL};
    const cJSON *it = j->child;
    for (int k = 0; keys[k]; k++, it = it->next) {
        CHECK(it != NULL);
        CHECK_STR(keys[k], it->string);
    }
    CHECK(it == NULL);
    CHECK(cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(j, "quiet")));
    CHECK_REL(3.5, cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(j, "load")), 0);
    CHECK_REL(1.1, cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(j, "other_cpu_s")), 1e-12);
    CHECK_REL(0.1, cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(j, "steal_s")), 1e-12);
    CHECK_STR(q.verdict, cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(j, "verdict")));
    cJSON_Delete(j);

    char why[200];
    val_busy_reason(&q, why, sizeof why);
    CHECK_STR("other processes took 15% of the cores' time (quiet is under 5%)", why);
    /* own tree 5.0 of 5.1: others 0.1 (1.4%) are under 5%, but steal's 1.4% is over 1%, and
     * the reason says so rather than blame the others' 1% */
    snap(&b, stat_b, 13.6, 3.5, 6.5, pb, 6);
    val_quiet_judge(&a, &b, &q);
    CHECK_REL(0.1, q.other_cpu_s, 1e-9);
    CHECK_EQ_INT(0, q.quiet);
    val_busy_reason(&q, why, sizeof why);
    CHECK_STR("the hypervisor took 1.4% of the CPUs' time from this machine (steal; quiet is under "
              "1%)", why);
    /* without steal in the window: quiet */
    const char *stat_c = "cpu  1400 10 300 5210 50 5 25 20 0 0\ncpu0 1 0 0 0\ncpu1 1 0 0 0\n";
    snap(&b, stat_c, 13.6, 0.7, 6.5, pb, 6);
    val_quiet_judge(&a, &b, &q);
    CHECK_EQ_INT(1, q.quiet);
    CHECK_REL(0, q.steal_s, 0);
    CHECK_STR("quiet: other processes used 1.4% of the 2 cores' time (0.1 of 7.2 CPU-s; bar 5%), "
              "steal 0.0% (bar 1%), load 2.00; busiest: yes (x) 2.3 s, cc1 0.6 s, sh 0.2 s",
              q.verdict);
    /* own time above the busy time (counters' rounding) is no negative load */
    snap(&b, stat_c, 13.6, 0.7, 9.0, pb, 6);
    val_quiet_judge(&a, &b, &q);
    CHECK_REL(0, q.other_cpu_s, 0);
    /* no /proc/stat: not measured, quiet null in the JSON, steal null */
    b.have_stat = 0;
    val_quiet_judge(&a, &b, &q);
    CHECK_EQ_INT(0, q.measured);
    j = val_quiet_json(&q, NULL);
    CHECK(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(j, "quiet")));
    CHECK(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(j, "steal_s")));
    cJSON_Delete(j);
}

/* The host's speed around the timed runs: a probe beyond VAL_HOST_DRIFT before them (unless
 * the host was calibrated again then) or after them leaves the rows ungraded, named. */
static void test_steady(void)
{
    ProfMeasured m;
    memset(&m, 0, sizeof m);
    m.peak_flops = 100e9;
    m.memory_bandwidth = 10e9;
    ValHostCheck before, after, none;
    memset(&none, 0, sizeof none);
    char why[200];
    val_host_compare(&m, 105e9, 10.5e9, &before); /* +5%, +5%: within */
    val_host_compare(&m, 110e9, 9e9, &after);     /* +10%, -10%: at the bar is within */
    CHECK_EQ_INT(1, after.probed);
    CHECK_EQ_INT(0, after.drifted);
    CHECK_EQ_INT(1, val_host_steady(&before, &after, why, sizeof why));
    CHECK_STR("", why);
    CHECK_EQ_INT(1, val_host_steady(&none, &none, why, sizeof why)); /* no probe: nothing says */
    /* memory bandwidth 18.5% lower after the runs: the larger change is named */
    val_host_compare(&m, 95e9, 8.15e9, &after);
    CHECK_EQ_INT(1, after.drifted);
    CHECK_EQ_INT(0, val_host_steady(&before, &after, why, sizeof why));
    CHECK_STR("memory bandwidth 18.5% slower after the timed runs than when calibrated", why);
    /* GEMMs 25% faster before them: the before probe first */
    val_host_compare(&m, 125e9, 10e9, &before);
    CHECK_EQ_INT(0, val_host_steady(&before, &none, why, sizeof why));
    CHECK_STR("GEMMs 25.0% faster before the timed runs than when calibrated", why);
    /* calibrated again after that probe: it no longer counts */
    before.recalibrated = 1;
    CHECK_EQ_INT(1, val_host_steady(&before, &none, why, sizeof why));
    CHECK_EQ_INT(0, val_host_steady(&before, &after, why, sizeof why));
    CHECK_STR("memory bandwidth 18.5% slower after the timed runs than when calibrated", why);
}

int main(void)
{
    test_parse();
    test_judge();
    test_steady();
    TEST_DONE("test_validate_quiet");
}
