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
    CHECK_STR("| quantity | unit | predicted | measured | error: (measured - predicted) / predicted |\n"
              "|---|---|---:|---:|---:|\n"
              "| step_s | s | 0.5 | 0.55 | +10.0% |\n"
              "| bubble_fraction | idle / compute time | 0 | 0 | +0.0% |\n"
              "| memory rank 0 weights | bytes | 1000 | 1000 | +0.0% |\n"
              "| memory rank 0 grads | bytes | 1000 | 1000 | +0.0% |\n"
              "| memory rank 0 activations | bytes | 4000 | 3000 | -25.0% |\n"
              "| flops rank 0 per step | FLOPs per step | 2e+09 | 2.2e+09 | +10.0% |\n"
              "| op layer.0.attn.qkv.fwd | s per step | 0.12 | 0.1 | -16.7% |\n"
              "| op loss.fwd | s per step | 0.05 | 0.04 | -20.0% |\n",
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

/* The header by hand: 1024 GPUs at 8,388,608 tokens a step of 8.388608 s make 1.00M tokens/s;
 * 15T tokens take 15e12 / 1e6 / 86400 = 173.6 days, x 24 x 1024 = 4.27M GPU-hours, $10.7M at
 * $2.50; a bubble of 14.9% of the compute time is 0.149 / 1.149 = 13.0% of the pipeline's. */
static void test_header(void)
{
    RptHeader h;
    rpt_header_init(&h);
    char *md = rpt_header_markdown(&h, 0, "2026-11-28 20:00 UTC", "v1-2-gabc");
    CHECK_STR("| figure | value |\n|---|---|\n| date | 2026-11-28 20:00 UTC |\n| parallax | v1-2-gabc |\n", md);
    free(md);
    snprintf(h.model, sizeof h.model, "llama3-70b");
    snprintf(h.cluster, sizeof h.cluster, "dgx-h100");
    snprintf(h.device, sizeof h.device, "h100-sxm");
    snprintf(h.basis, sizeof h.basis, "test");
    h.gpus = 1024;
    h.node_devices = 8;
    h.have_layout = 1;
    model_spec_defaults(&h.spec);
    h.spec.layout.tp = 4, h.spec.layout.pp = 8, h.spec.layout.dp = 32, h.spec.layout.vpp = 5;
    h.spec.layout.schedule = MODEL_SCHED_INTERLEAVED;
    h.spec.layout.sp = 1, h.spec.layout.zero = 1, h.spec.layout.recompute = MODEL_RECOMPUTE_NONE;
    h.spec.job.micro_batch = 1, h.spec.job.global_batch = 1024, h.spec.job.seq_len = 8192;
    h.step_s = 8.388608;
    h.measured_step_s = 1.05 * 8.388608;
    h.tokens_per_s = 1024.0 * 8192 / 8.388608;
    h.mfu = 0.47;
    h.tflops_per_gpu = 475;
    h.bubble_fraction = 0.149;
    h.train_tokens = 15e12;
    md = rpt_header_markdown(&h, 2.5, "2026-11-28 20:00 UTC", "v1-2-gabc");
    const char *table =
        "| figure | value |\n|---|---|\n"
        "| model | llama3-70b |\n"
        "| cluster | dgx-h100: h100-sxm, 8 per node |\n"
        "| GPUs | 1024 |\n"
        "| layout | tp 4 × pp 8 × dp 32; interleaved schedule, 5 model chunks per rank (vpp); sequence "
        "parallel; ZeRO-1; recompute none; micro-batch 1, global batch 1024 sequences of 8192 tokens |\n"
        "| framework | Megatron-LM (`parallax export` writes its settings, and those of the others) |\n"
        "| step time | 8.39 s predicted, 8.81 s measured (+5.0%) |\n"
        "| tokens/s | 1.00M (the whole job; 977 per GPU) |\n"
        "| MFU | 47.0% (model FLOPs, recompute not counted, over the dense 16-bit peak) |\n"
        "| hardware TFLOP/s per GPU | 475 (recompute counted) |\n"
        "| pipeline bubble | 14.9% of the busiest stage's compute time; 13.0% of its pipeline time idle |\n"
        "| days to train | 174 days for 15.0T tokens (4.27M GPU-hours) |\n"
        "| cost to train | $10.7M at $2.50 per GPU-hour |\n"
        "| date | 2026-11-28 20:00 UTC |\n| parallax | v1-2-gabc |\n| figures from | test |\n";
    char want[4096];
    snprintf(want, sizeof want,
             "**tp 4 × pp 8 × dp 32 (vpp 5) · step 8.39 s · 1.00M tokens/s · MFU 47.0%% · 174 days, $10.7M to "
             "train**\n\n%s",
             table);
    CHECK_STR(want, md);
    free(md);
    /* unpriced and without a budget: each row says how to ask for it */
    h.train_tokens = 0;
    md = rpt_header_markdown(&h, 0, "d", "c");
    contains("header", md, "| days to train | not asked: give the token budget (`parallax plan --tokens 15T`, "
                           "or `parallax report --tokens 15T`) |\n"
                           "| cost to train | not priced: no cluster profile carries a price; give "
                           "`parallax report --gpu-hour-price USD` |\n");
    contains("header", md, "· MFU 47.0%**\n\n");
    free(md);
    /* the build's commit: git describe's form, never empty */
    CHECK(strlen(rpt_commit()) > 0);
}

/* report.html carries each chart's SVG inline, its ids prefixed by the chart's name (gnuplot's
 * gpPt0 markers would otherwise collide between charts), and no <img>. */
static void test_page_inline(void)
{
    PxError err = {0};
    char dir[] = "/tmp/px_test_inline_XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char path[512];
    snprintf(path, sizeof path, "%s/a.svg", dir);
    CHECK_OK(px_write_file_atomic(path, "<?xml version=\"1.0\"?>\n<svg width=\"960\"><defs><path id='gpPt0'/>"
                                        "</defs><use xlink:href='#gpPt0'/><g id=\"x\" fill=\"url(#grad)\"/></svg>\n",
                                  &err),
             err);
    const RptSection sec[2] = {{NULL, NULL, "header text"}, {"A", "a", NULL}};
    RptOutput o = {dir};
    CHECK_OK(rpt_page_write(&o, "t", sec, 2, &err), err);
    char *html = slurp(dir, "report.html"), *md = slurp(dir, "report.md");
    CHECK_STR("# t\n\nheader text\n\n## A\n\n![A](a.png)\n\n([SVG](a.svg), data in `a.dat`, script `a.gp`)\n\n", md);
    contains("report.html", html, "<h1>t</h1>\n<p>header text</p>\n<h2>A</h2>\n"
                                  "<p><span class=\"chart\" data-chart=\"a\"><svg width=\"960\"><defs>"
                                  "<path id='a-gpPt0'/></defs><use xlink:href='#a-gpPt0'/>"
                                  "<g id=\"a-x\" fill=\"url(#a-grad)\"/></svg>\n</span></p>\n");
    CHECK_EQ_INT(0, count(html, "<img"));
    CHECK_EQ_INT(0, count(html, "<?xml"));
    free(html);
    free(md);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
}

/* The landscape's step axis is logarithmic when the steps span more than a decade (60 s to
 * 4,500 s), linear when they do not (60 s to 100 s). */
static void test_landscape_axis(void)
{
    PxError err = {0};
    char dir[] = "/tmp/px_test_axis_XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    RptOutput o = {dir};
    const double x[3] = {10, 20, 30}, wide[3] = {60, 100, 4500}, narrow[3] = {60, 80, 100};
    const int front[3] = {1, 1, 0};
    CHECK_OK(rpt_scatter_pareto(&o, "wide", "t", "GiB", "step (s)", x, wide, front, 3, &err), err);
    CHECK_OK(rpt_scatter_pareto(&o, "narrow", "t", "GiB", "step (s)", x, narrow, front, 3, &err), err);
    char *w = slurp(dir, "wide.gp"), *n = slurp(dir, "narrow.gp");
    CHECK_EQ_INT(1, count(w, "set logscale y 10\n"));
    CHECK_EQ_INT(1, count(w, "set ylabel 'step (s), log scale'\n"));
    CHECK_EQ_INT(0, count(n, "set logscale"));
    CHECK_EQ_INT(1, count(n, "set ylabel 'step (s)'\n"));
    free(w);
    free(n);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
}

/* A 70B plan with interleaving (tp 4, pp 8, vpp 5, 32 micro-batches: 2,560 passes) charts a
 * window, not a barcode: eight rows, each at most the warm-up and eight more passes, the last
 * stage's backwards in it, the window shorter than the step; the trace keeps every pass. The
 * report says each phase on its progress stream. */
static void test_timeline_window(void)
{
    PxError err = {0};
    ProfCluster cl;
    CHECK_OK(prof_cluster_load("dgx-h100", NULL, 0, &cl, &err), err);
    SimPlanRequest q;
    memset(&q, 0, sizeof q);
    model_spec_defaults(&q.base);
    CHECK_OK(model_config_load("llama3-70b", &q.base.model, &err), err);
    q.base.job.global_batch = 1024;
    q.base.job.micro_batch = 1;
    q.base.job.seq_len = 8192;
    q.base.layout.tp = 4, q.base.layout.pp = 8, q.base.layout.vpp = 5, q.base.layout.cp = 1;
    q.base.layout.schedule = MODEL_SCHED_INTERLEAVED;
    q.pinned = SIM_PIN_TP | SIM_PIN_PP | SIM_PIN_VPP | SIM_PIN_CP | SIM_PIN_MBS | SIM_PIN_SCHEDULE;
    q.gpus = 1024;
    q.top = 1;
    SimPlanResult res;
    CHECK_OK(sim_plan(&q, &cl, &res, &err), err);
    ModelPlan plan;
    SimResult full;
    CHECK_OK(sim_plan_best(&res, &cl, "dgx-h100", 1024, &plan, &full, &err), err);
    CHECK_EQ_INT(8, full.dims.p);
    CHECK_EQ_INT(32, full.dims.m);
    cJSON *pj = model_plan_to_json(&plan);
    char dir[] = "/tmp/px_test_window_XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char *prog = NULL;
    size_t prog_len = 0;
    FILE *pf = open_memstream(&prog, &prog_len);
    CHECK(pf != NULL);
    RptRequest rq = {.dir = dir, .plan = pj, .progress = pf};
    CHECK_OK(rpt_build(&rq, NULL, &err), err);
    fclose(pf);
    CHECK_STR("report: memory per pipeline stage (the plan's prediction)\n"
              "report: pipeline timeline (re-simulating the plan)\n"
              "report: pages: report.md and report.html (charts inline)\n",
              prog);
    free(prog);
    char *dat = slurp(dir, "timeline.dat");
    int per_track[8] = {0}, backward_last = 0, lines = 0;
    double end = 0;
    for (char *line = strtok(dat, "\n"); line; line = strtok(NULL, "\n")) {
        int track, kind;
        double t0, t1;
        CHECK(sscanf(line, "%d %d %lf %lf", &track, &kind, &t0, &t1) == 4);
        CHECK(track >= 0 && track < 8);
        per_track[track]++;
        backward_last += track == 7 && kind == 1;
        end = t1 > end ? t1 : end;
        lines++;
    }
    free(dat);
    for (int t = 0; t < 8; t++) {
        CHECK(per_track[t] >= 8);
        CHECK(per_track[t] <= 64); /* the full step has 2 x 5 x 32 = 320 a row */
    }
    CHECK(backward_last >= 4);   /* the steady phase: forwards and backwards alternate */
    CHECK(end < 0.25 * full.step_s);
    char *md = slurp(dir, "report.md");
    contains("report.md", md, "# parallax report: llama3-70b on dgx-h100, 1024 GPUs\n\n");
    contains("report.md", md, "the first ");
    free(md);
    char path[512];
    snprintf(path, sizeof path, "%s/trace_simulated.json", dir);
    cJSON *tr = px_json_read_file(path, &err);
    CHECK(tr != NULL);
    int complete = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, cJSON_GetObjectItem(tr, "traceEvents"))
        complete += strcmp(cJSON_GetObjectItem(e, "ph")->valuestring, "X") == 0;
    CHECK_EQ_INT(8 * 2 * 5 * 32, complete);
    cJSON_Delete(tr);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
    cJSON_Delete(pj);
    model_plan_free(&plan);
    sim_result_free(&full);
    sim_plan_free(&res);
    prof_cluster_free(&cl);
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
    test_header();
    test_page_inline();
    test_landscape_axis();
    test_timeline_window();
    test_full_report();
    TEST_DONE("report");
}
