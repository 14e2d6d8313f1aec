/* Reports: the comparison gets the right errors on fixed inputs and writes them as a Markdown
 * table; the tables' numbers keep their significant digits; the page's Markdown renders to HTML
 * tables and code blocks; a full report writes every chart (gnuplot exits 0, PNG and SVG not
 * empty), both traces and both pages. */
#include <sys/stat.h>
#include <unistd.h>

#include "fixtures.h"
#include "reports/report.h"
#include "test.h"

static const RptDelta *row(const RptCompare *c, const char *q)
{
    for (int i = 0; i < c->count; i++)
        if (strcmp(c->rows[i].quantity, q) == 0)
            return &c->rows[i];
    fprintf(stderr, "FAILED: no row '%s'\n", q);
    exit(1);
}

static void test_compare_fixed(void)
{
    PxError err = {0};
    /* a one-rank plan whose prediction is written by hand */
    const char *plan_text =
        "{\"schema_version\": 1, \"cluster\": \"local\", \"gpus\": 1,"
        " \"model\": {\"name\": \"m\", \"family\": \"gpt\", \"layers\": 2, \"hidden\": 64, \"heads\": 4, \"vocab\": 256, \"seq_len\": 64},"
        " \"training\": {\"global_batch\": 4, \"micro_batch\": 4, \"seq_len\": 64, \"precision\": \"fp32\"},"
        " \"layout\": {\"dp\": 1, \"tp\": 1, \"pp\": 1},"
        " \"prediction\": {\"time\": {\"step_s\": 0.5, \"bubble_fraction\": 0},"
        "   \"memory\": {\"per_stage\": [{\"stage\": 0, \"weights\": 1000, \"grads\": 1000, \"activations\": 4000, \"runtime\": 7}]},"
        "   \"comm\": {\"per_stage\": [{\"stage\": 0, \"dp_allreduce\": 0}]},"
        "   \"flops\": {\"per_rank_per_step\": [2e9]},"
        "   \"ops\": [{\"name\": \"layer.0.attn.qkv.fwd\", \"stage\": 0, \"seconds\": 0.1},"
        "             {\"name\": \"layer.0.attn.qkv.fwd\", \"stage\": 0, \"seconds\": 0.02},"
        "             {\"name\": \"loss.fwd\", \"stage\": 0, \"seconds\": 0.05}]}}";
    const char *run_text =
        "{\"schema_version\": 1, \"steps\": [{\"step\": 1}, {\"step\": 2}, {\"step\": 3}, {\"step\": 4}],"
        " \"time\": {\"step_s_median\": 0.55, \"bubble_fraction\": 0, \"timed_steps\": 3},"
        " \"memory\": {\"per_rank\": [{\"rank\": 0, \"stage\": 0, \"weights\": 1000, \"grads\": 1000, \"activations\": 3000, \"runtime\": 99}]},"
        " \"comm\": {\"per_rank\": [{\"rank\": 0, \"by_kind\": {\"dp_allreduce\": 0}}]},"
        " \"flops\": {\"per_rank_per_step\": [2.2e9]},"
        " \"ops\": [{\"name\": \"layer.0.attn.qkv.fwd\", \"stage\": 0, \"calls\": 1, \"seconds\": 0.1},"
        "          {\"name\": \"loss.fwd\", \"stage\": 0, \"calls\": 1, \"seconds\": 0.04},"
        "          {\"name\": \"not.predicted\", \"stage\": 0, \"calls\": 1, \"seconds\": 1}]}";
    cJSON *plan = cJSON_Parse(plan_text), *run = cJSON_Parse(run_text);
    CHECK(plan && run);
    RptCompare c;
    CHECK_OK(rpt_compare(plan, run, &c, &err), err);
    CHECK_EQ_INT(4, c.steps);
    CHECK_REL(0.1, row(&c, "step_s")->rel_error, 1e-12);                       /* 0.55 vs 0.5 */
    CHECK(row(&c, "memory rank 0 weights")->rel_error == 0);
    CHECK_REL(-0.25, row(&c, "memory rank 0 activations")->rel_error, 1e-12);  /* 3000 vs 4000 */
    CHECK_REL(0.1, row(&c, "flops rank 0 per step")->rel_error, 1e-12);
    /* ops: predicted summed by name (0.12 s), measured per step (0.1 s) */
    CHECK_REL(0.12, row(&c, "op layer.0.attn.qkv.fwd")->predicted, 1e-12);
    CHECK_REL(0.1, row(&c, "op layer.0.attn.qkv.fwd")->measured, 1e-12);
    CHECK_REL(-1.0 / 6.0, row(&c, "op layer.0.attn.qkv.fwd")->rel_error, 1e-12);
    CHECK_REL(-0.2, row(&c, "op loss.fwd")->rel_error, 1e-12);                 /* 0.04 vs 0.05 */
    for (int i = 0; i < c.count; i++) {
        CHECK(strstr(c.rows[i].quantity, "runtime") == NULL); /* an allowance, not compared */
        CHECK(strstr(c.rows[i].quantity, "not.predicted") == NULL);
    }
    /* the report's table: a header, a delimiter row and a row per quantity, in compare's order */
    char *md = NULL;
    size_t md_len = 0;
    FILE *f = open_memstream(&md, &md_len);
    CHECK(f != NULL);
    rpt_compare_markdown(f, &c, 0);
    fclose(f);
    CHECK_STR("| quantity | predicted | measured | error |\n"
              "|---|---:|---:|---:|\n"
              "| step_s | 0.5 | 0.55 | +10.0% |\n"
              "| bubble_fraction | 0 | 0 | +0.0% |\n"
              "| memory rank 0 weights | 1000 | 1000 | +0.0% |\n"
              "| memory rank 0 grads | 1000 | 1000 | +0.0% |\n"
              "| memory rank 0 activations | 4000 | 3000 | -25.0% |\n"
              "| flops rank 0 per step | 2e+09 | 2.2e+09 | +10.0% |\n"
              "| op layer.0.attn.qkv.fwd | 0.12 | 0.1 | -16.7% |\n"
              "| op loss.fwd | 0.05 | 0.04 | -20.0% |\n",
              md);
    free(md);
    /* a plan without a prediction cannot be compared */
    cJSON_DeleteItemFromObject(plan, "prediction");
    rpt_compare_free(&c);
    CHECK_INPUT_ERROR(rpt_compare(plan, run, &c, &err), err, "no prediction to compare");
    cJSON_Delete(plan);
    cJSON_Delete(run);
}

/* A MoE run: each layer's tokens per expert with their spread and the busiest over the mean
 * (listed one by one up to 16 experts), each rank's expert all-to-all against the plan's
 * buffers, in the table, the printout and the JSON; a malformed layer is an input error. */
static void test_compare_moe(void)
{
    PxError err = {0};
    const char *plan_text =
        "{\"schema_version\": 1, \"cluster\": \"local\", \"gpus\": 1,"
        " \"model\": {\"name\": \"m\", \"family\": \"gpt\", \"layers\": 2, \"hidden\": 64, \"heads\": 4, \"vocab\": 256, \"seq_len\": 64},"
        " \"training\": {\"global_batch\": 4, \"micro_batch\": 4, \"seq_len\": 64, \"precision\": \"fp32\"},"
        " \"layout\": {\"dp\": 1, \"tp\": 1, \"pp\": 1},"
        " \"prediction\": {\"time\": {\"step_s\": 0.5},"
        "   \"memory\": {\"per_stage\": [{\"stage\": 0, \"weights\": 1000}]},"
        "   \"comm\": {\"per_stage\": [{\"stage\": 0, \"ep_all_to_all\": 4096, \"edp_allreduce\": 512}]}}}";
    const char *run_text =
        "{\"schema_version\": 1, \"steps\": [{\"step\": 1}],"
        " \"time\": {\"step_s_median\": 0.5},"
        " \"memory\": {\"per_rank\": [{\"rank\": 0, \"stage\": 0, \"weights\": 1000}]},"
        " \"comm\": {\"per_rank\": [{\"rank\": 0, \"by_kind\": {\"ep_all_to_all\": 3072, \"edp_allreduce\": 512}}]},"
        " \"moe\": {\"experts\": 4, \"topk\": 2, \"layers\": ["
        "   {\"layer\": 1, \"tokens_per_expert\": [100, 60, 20, 20], \"max_over_mean\": 2},"
        "   {\"layer\": 3, \"tokens_per_expert\": [5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,25]}]}}";
    cJSON *plan = cJSON_Parse(plan_text), *run = cJSON_Parse(run_text);
    CHECK(plan && run);
    RptCompare c;
    CHECK_OK(rpt_compare(plan, run, &c, &err), err);
    CHECK_EQ_INT(2, c.n_moe);
    CHECK_EQ_INT(1, c.moe[0].layer);
    CHECK_EQ_INT(4, c.moe[0].experts);
    CHECK(c.moe[0].min == 20 && c.moe[0].max == 100 && c.moe[0].mean == 50);
    CHECK(c.moe[0].max_over_mean == 2.0);
    CHECK_EQ_INT(3, c.moe[1].layer);
    CHECK(c.moe[1].min == 5 && c.moe[1].max == 25 && c.moe[1].mean == 6);
    CHECK_REL(25.0 / 6.0, c.moe[1].max_over_mean, 1e-15);
    CHECK_EQ_INT(1, c.n_a2a);
    CHECK(c.a2a[0].rank == 0 && c.a2a[0].predicted == 4096 && c.a2a[0].measured == 3072);
    CHECK_REL(-0.25, row(&c, "comm rank 0 ep_all_to_all bytes")->rel_error, 1e-15);

    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    CHECK(f != NULL);
    rpt_compare_print(f, &c, 0);
    fclose(f);
    const char *want[] = {
        "MoE routing, last step (token copies per expert, every rank's tokens)\n"
        "layer experts        min        max         mean  max/mean  per expert\n"
        "    1       4         20        100         50.0     2.000  100 60 20 20\n"
        "    3      20          5         25          6.0     4.167  (20 experts: see run.json)\n",
        "expert all-to-all per step (bytes)\n"
        " rank      predicted       measured     ratio\n"
        "    0           4096           3072     0.750\n"};
    for (int i = 0; i < 2; i++)
        if (!strstr(text, want[i])) {
            fprintf(stderr, "FAILED: compare's printout lacks\n%s\nit reads\n%s\n", want[i], text);
            exit(1);
        }
    free(text);

    cJSON *j = rpt_compare_to_json(&c);
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(j, "moe");
    const cJSON *l0 = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(m, "layers"), 0);
    const cJSON *a0 = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(m, "ep_all_to_all"), 0);
    CHECK(cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(l0, "max_over_mean")) == 2.0);
    CHECK_EQ_INT(4, cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(l0, "tokens_per_expert")));
    CHECK(cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(a0, "ratio")) == 0.75);
    CHECK(cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(a0, "predicted_bytes")) == 4096);
    cJSON_Delete(j);
    rpt_compare_free(&c);

    /* a layer without its counts */
    cJSON *l1 = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(run, "moe"), "layers"), 1);
    cJSON_DeleteItemFromObject(l1, "tokens_per_expert");
    CHECK_INPUT_ERROR(rpt_compare(plan, run, &c, &err), err,
                      "run: moe.layers[1]: expected a layer and a non-empty tokens_per_expert");
    cJSON_Delete(plan);
    cJSON_Delete(run);
}

/* The tables' numbers: significant digits whatever the magnitude (the scaling table's TFLOP/s per
 * GPU is 0.0128 for the tiny model on a CPU, and was printed 0.0 with one decimal). */
static void test_fmt_sig(void)
{
    char b[32];
    CHECK_STR("0.0128", rpt_fmt_sig(b, sizeof b, 0.0128, 3));
    CHECK_STR("0.0146", rpt_fmt_sig(b, sizeof b, 0.014567, 3));
    CHECK_STR("-0.0128", rpt_fmt_sig(b, sizeof b, -0.0128, 3));
    CHECK_STR("53.9", rpt_fmt_sig(b, sizeof b, 53.94, 3));
    CHECK_STR("2.00", rpt_fmt_sig(b, sizeof b, 2.0, 3));
    CHECK_STR("146", rpt_fmt_sig(b, sizeof b, 145.67, 3));
    CHECK_STR("1234", rpt_fmt_sig(b, sizeof b, 1234.4, 3));     /* integer digits all kept */
    CHECK_STR("10.0", rpt_fmt_sig(b, sizeof b, 9.996, 3));      /* rounding moves the exponent */
    CHECK_STR("0.00100", rpt_fmt_sig(b, sizeof b, 0.00099996, 3));
    CHECK_STR("1.23e-05", rpt_fmt_sig(b, sizeof b, 1.2345e-5, 3));
    CHECK_STR("4.57e+07", rpt_fmt_sig(b, sizeof b, 4.5678e7, 3));
    CHECK_STR("1.00e+06", rpt_fmt_sig(b, sizeof b, 999999.7, 3));
    CHECK_STR("0.01", rpt_fmt_sig(b, sizeof b, 0.0128, 1));
    CHECK_STR("0", rpt_fmt_sig(b, sizeof b, 0.0, 3));
    CHECK_STR("n/a", rpt_fmt_sig(b, sizeof b, NAN, 3));
    CHECK_STR("n/a", rpt_fmt_sig(b, sizeof b, INFINITY, 3));
}

static char *slurp(const char *dir, const char *file)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    FILE *f = fopen(path, "rb");
    CHECK(f != NULL);
    char *s = calloc(1 << 16, 1);
    CHECK(s != NULL);
    size_t n = fread(s, 1, (1 << 16) - 1, f);
    fclose(f);
    CHECK(n > 0);
    return s;
}

static int count(const char *s, const char *needle)
{
    int n = 0;
    for (const char *p = strstr(s, needle); p; p = strstr(p + 1, needle))
        n++;
    return n;
}

static void contains(const char *what, const char *text, const char *needle)
{
    px_test_checks++;
    if (!strstr(text, needle)) {
        fprintf(stderr, "FAILED: %s lacks\n%s\nit reads\n%s\n", what, needle, text);
        exit(1);
    }
}

/* The page: report.md is the Markdown as written (PNG charts), report.html that Markdown
 * rendered (SVG charts), its GFM table a <table> with a row per row and its fence a code block. */
static void test_page(void)
{
    PxError err = {0};
    char dir[] = "/tmp/px_test_page_XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    const RptSection sec[2] = {
        {"Numbers <&>", "chart", "| a | b |\n|---|---:|\n| 1 | 2 |\n| 3 | 4 |\n\nafter the table"},
        {"Code", NULL, "```\nx = 1 | 2\n```"}};
    RptOutput o = {dir};
    CHECK_OK(rpt_page_write(&o, "t <1>", sec, 2, &err), err);
    char *md = slurp(dir, "report.md"), *html = slurp(dir, "report.html");
    CHECK_STR("# t <1>\n\n"
              "## Numbers <&>\n\n"
              "![Numbers <&>](chart.png)\n\n"
              "([SVG](chart.svg), data in `chart.dat`, script `chart.gp`)\n\n"
              "| a | b |\n|---|---:|\n| 1 | 2 |\n| 3 | 4 |\n\nafter the table\n\n"
              "## Code\n\n"
              "```\nx = 1 | 2\n```\n\n",
              md);
    contains("report.html", html, "<title>t &lt;1&gt;</title>");
    contains("report.html", html, "<h2>Numbers &lt;&amp;&gt;</h2>\n"
                                  "<p><img src=\"chart.svg\" alt=\"Numbers &lt;&amp;&gt;\" /></p>\n"
                                  "<p>(<a href=\"chart.png\">PNG</a>, data in <code>chart.dat</code>, "
                                  "script <code>chart.gp</code>)</p>\n");
    contains("report.html", html, "<table>\n<thead>\n<tr>\n<th>a</th>\n<th align=\"right\">b</th>\n"
                                  "</tr>\n</thead>\n<tbody>\n"
                                  "<tr>\n<td>1</td>\n<td align=\"right\">2</td>\n</tr>\n"
                                  "<tr>\n<td>3</td>\n<td align=\"right\">4</td>\n</tr>\n"
                                  "</tbody>\n</table>\n<p>after the table</p>\n");
    contains("report.html", html, "<pre><code>x = 1 | 2\n</code></pre>\n");
    CHECK_EQ_INT(1, count(html, "<table>"));
    CHECK_EQ_INT(3, count(html, "<tr>"));
    CHECK_EQ_INT(0, count(html, "<p>|"));
    CHECK_EQ_INT(0, count(html, "```"));
    free(md);
    free(html);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
}

static void nonempty(const char *dir, const char *file)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    struct stat st;
    px_test_checks++;
    if (stat(path, &st) != 0 || st.st_size == 0) {
        fprintf(stderr, "FAILED: %s missing or empty\n", path);
        exit(1);
    }
}

static void test_full_report(void)
{
    PxError err = {0};
    ProfCluster cl;
    CHECK_OK(prof_cluster_load("local", NULL, 0, &cl, &err), err);
    /* a plan of the tiny model, pp 2, and a run that measured 20% longer passes */
    SimPlanRequest q;
    memset(&q, 0, sizeof q);
    model_spec_defaults(&q.base);
    CHECK_OK(model_config_load("tiny", &q.base.model, &err), err);
    q.base.job.global_batch = 8;
    q.base.layout.pp = 2;
    q.base.layout.tp = 1;
    q.pinned = SIM_PIN_PP | SIM_PIN_TP;
    q.gpus = 2;
    q.top = 1;
    SimPlanResult res;
    CHECK_OK(sim_plan(&q, &cl, &res, &err), err);
    ModelPlan plan;
    SimResult full;
    CHECK_OK(sim_plan_best(&res, &cl, "local", 2, &plan, &full, &err), err);
    cJSON *pj = model_plan_to_json(&plan);
    cJSON *run = cJSON_CreateObject();
    cJSON *tm = cJSON_AddObjectToObject(run, "time");
    cJSON_AddNumberToObject(tm, "step_s_median", 1.2 * full.step_s);
    cJSON_AddNumberToObject(tm, "timed_steps", 1);
    cJSON *tl = cJSON_AddArrayToObject(run, "timeline");
    SimEvent *ev;
    int n;
    CHECK_OK(sim_timeline(&full, &ev, &n, &err), err);
    for (int rank = 0; rank < 2; rank++) {
        cJSON *r = cJSON_CreateObject();
        cJSON_AddNumberToObject(r, "rank", rank);
        cJSON *evs = cJSON_AddArrayToObject(r, "events");
        for (int i = 0; i < n; i++) {
            if (ev[i].stage != rank)
                continue;
            cJSON *e = cJSON_CreateObject();
            cJSON_AddNumberToObject(e, "chunk", ev[i].chunk);
            cJSON_AddNumberToObject(e, "mb", ev[i].mb);
            cJSON_AddBoolToObject(e, "backward", ev[i].backward);
            cJSON_AddNumberToObject(e, "start_s", 1.2 * ev[i].start_s);
            cJSON_AddNumberToObject(e, "end_s", 1.2 * ev[i].end_s);
            cJSON_AddItemToArray(evs, e);
        }
        cJSON_AddItemToArray(tl, r);
    }
    free(ev);
    char dir[] = "/tmp/px_test_report_XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    int gpus[3] = {1, 2, 4};
    RptRequest rq = {.dir = dir, .title = "test", .plan = pj, .run = run, .base = &q.base,
                     .cluster = &cl, .gpus = gpus, .n_gpus = 3, .landscape = 1};
    rq.base = &q.base;
    q.pinned = 0;
    CHECK_OK(rpt_build(&rq, NULL, &err), err);
    const char *charts[6] = {"memory", "timeline", "compare", "scaling", "scaling_sharded", "landscape"};
    for (int i = 0; i < 6; i++) {
        char f[64];
        snprintf(f, sizeof f, "%s.png", charts[i]);
        nonempty(dir, f);
        snprintf(f, sizeof f, "%s.svg", charts[i]);
        nonempty(dir, f);
    }
    nonempty(dir, "report.md");
    nonempty(dir, "report.html");
    /* the ZeRO-3 family holds tp, pp and cp at 1: all its ranks are data-parallel */
    {
        char *text = slurp(dir, "report.md");
        CHECK(strstr(text, "## Sharded data parallelism against 3D") != NULL);
        for (int i = 0; i < 3; i++) {
            char row[64];
            snprintf(row, sizeof row, "\n| %d | dp %d mbs ", gpus[i], gpus[i]);
            CHECK(strstr(text, row) != NULL);
        }
        free(text);
    }
    nonempty(dir, "trace_simulated.json");
    nonempty(dir, "trace_measured.json");
    /* the simulated trace parses and has a complete event per action */
    char path[512];
    snprintf(path, sizeof path, "%s/trace_simulated.json", dir);
    cJSON *tr = px_json_read_file(path, &err);
    CHECK(tr != NULL);
    int complete = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, cJSON_GetObjectItem(tr, "traceEvents"))
        complete += strcmp(cJSON_GetObjectItem(e, "ph")->valuestring, "X") == 0;
    CHECK_EQ_INT(n, complete);
    cJSON_Delete(tr);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
    cJSON_Delete(pj);
    cJSON_Delete(run);
    model_plan_free(&plan);
    sim_result_free(&full);
    sim_plan_free(&res);
}

int main(void)
{
    px_log_set_quiet(1);
    test_compare_fixed();
    test_compare_moe();
    test_fmt_sig();
    test_page();
    test_full_report();
    TEST_DONE("report");
}
