/* The layout and training knobs' option rows (from model/fields.c's), and parsing a command's
 * options (common/px.h's option tables) into CliArgs. */
#include "cli/options.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

_Static_assert((int)MODEL_FIELD_COUNT <= (int)CLI_KNOB_NO && CLI_KNOB_NO + (int)MODEL_FIELD_COUNT <= CLI_MODEL,
               "the knobs' ids come before the other options'");

int cli_fail(const char *cmd, int status, const PxError *err)
{
    fprintf(stderr, "parallax %s: %s\n", cmd, err->msg);
    return status == PX_EINPUT ? 2 : 1;
}

void cli_print_json(cJSON *j)
{
    char *s = cJSON_Print(j);
    printf("%s\n", s);
    cJSON_free(s);
    cJSON_Delete(j);
}

static void print_help_as(const char *prog, const char *usage, const CliOption *const *tables)
{
    char line[2048];
    snprintf(line, sizeof line, "%s %s", prog, usage);
    px_opts_help(stdout, line, tables);
}

/* --ep / --etp: one degree (into *one), a list of them (lists only when the command searches:
 * the planner), or "auto" (search every degree; *n 0). */
static int degree_list(const char *arg, const char *flag, int allow_lists, int *one, int *list,
                       int *n, PxError *err)
{
    *n = 0;
    if (!strcmp(arg, "auto")) {
        if (!allow_lists)
            return px_fail(err, PX_EINPUT, "%s auto: only parallax plan searches the degree; give one value", flag);
        *one = 0;
        return PX_OK;
    }
    const char *p = arg;
    while (*p) {
        const char *comma = strchr(p, ',');
        char item[32];
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        if (len == 0 || len >= sizeof item)
            return px_fail(err, PX_EINPUT, "%s: expected a degree, a list like 1,2,4,8 or auto, got '%s'", flag, arg);
        if (*n == CLI_MAX_LIST)
            return px_fail(err, PX_EINPUT, "%s: at most %d values, got '%s'", flag, CLI_MAX_LIST, arg);
        memcpy(item, p, len);
        item[len] = '\0';
        int rc = px_parse_int(item, flag, 1, 1 << 16, &list[*n], err);
        if (rc)
            return rc;
        (*n)++;
        p = comma ? comma + 1 : p + len;
        if (comma && !*p)
            return px_fail(err, PX_EINPUT, "%s: expected a degree, a list like 1,2,4,8 or auto, got '%s'", flag, arg);
    }
    if (*n > 1 && !allow_lists)
        return px_fail(err, PX_EINPUT, "%s %s: only parallax plan searches a list of degrees; give one value", flag, arg);
    *one = *n == 1 ? list[0] : 0;
    return PX_OK;
}

/* --ep and --etp: a degree, or for the planner a list of them or auto (CliArgs' lists) */
static int parse_ep(CliArgs *a, const ModelField *f, const char *arg, PxError *err)
{
    (void)f;
    return degree_list(arg, "--ep", a->allow_lists, &a->spec.layout.ep, a->ep_list, &a->n_ep, err);
}

static int parse_etp(CliArgs *a, const ModelField *f, const char *arg, PxError *err)
{
    (void)f;
    return degree_list(arg, "--etp", a->allow_lists, &a->spec.layout.etp, a->etp_list, &a->n_etp, err);
}

/* --pp-layers: the stages are the entries, unless --pp says otherwise (the layout rules then
 * name the mismatch) */
static int parse_pp_layers(CliArgs *a, const ModelField *f, const char *arg, PxError *err)
{
    int rc = model_field_parse(f, arg, 0, &a->spec, err);
    if (!rc && !cli_given(a, MODEL_FIELD_PP))
        a->spec.layout.pp = a->spec.layout.n_stage_layers;
    return rc;
}

/* --tokens: a count as people write training budgets, 15T, 300B, 2.5m or 1.5e12 (K, M, B, T:
 * thousand, million, billion, trillion; either case), handed on as a plain number. */
static int parse_tokens(CliArgs *a, const ModelField *f, const char *arg, PxError *err)
{
    static const struct {
        char suffix;
        double scale;
    } units[] = {{'k', 1e3}, {'m', 1e6}, {'b', 1e9}, {'t', 1e12}};
    char *end = NULL;
    errno = 0;
    double v = strtod(arg, &end);
    double scale = 1.0;
    if (end != arg && *end && !end[1])
        for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
            if (tolower((unsigned char)*end) == units[i].suffix) {
                scale = units[i].scale;
                end++;
            }
    if (end == arg || *end || errno || !isfinite(v * scale))
        return px_fail(err, PX_EINPUT,
                       "--tokens: expected a count such as 15T, 300B, 2.5M or 1.5e12 (K, M, B, T: "
                       "thousand to trillion), got '%s'", arg);
    if (v < 0)
        return px_fail(err, PX_EINPUT, "--tokens: must be positive, got '%s'", arg);
    char plain[64];
    snprintf(plain, sizeof plain, "%.17g", v * scale);
    return model_field_parse(f, plain, 0, &a->spec, err);
}

/* The knobs whose flags need more of the command line than their field (fields.c parses the
 * others, and the field-level extras: --fsdp's zero 3, --precision fp8's recipe ...). */
static const struct {
    ModelFieldId id;
    int (*parse)(CliArgs *a, const ModelField *f, const char *arg, PxError *err);
} cli_hooks[] = {{MODEL_FIELD_EP, parse_ep}, {MODEL_FIELD_ETP, parse_etp},
                 {MODEL_FIELD_STAGE_LAYERS, parse_pp_layers}, {MODEL_FIELD_TRAIN_TOKENS, parse_tokens}};

/* One knob into a (id: a field's, or CLI_KNOB_NO + it for its --no- flag): PX_OK, or
 * PX_EINPUT naming the option and the value. */
static int knob(int id, const char *arg, CliArgs *a, PxError *err)
{
    const int no = id >= CLI_KNOB_NO;
    const ModelField *f = model_field((ModelFieldId)(no ? id - CLI_KNOB_NO : id));
    if (!f)
        return px_fail(err, PX_ERUNTIME, "option id %d is no field's", id);
    int rc = -1;
    for (size_t i = 0; i < sizeof cli_hooks / sizeof cli_hooks[0] && rc < 0; i++)
        if (cli_hooks[i].id == f->id)
            rc = cli_hooks[i].parse(a, f, arg, err);
    if (rc < 0)
        rc = model_field_parse(f, arg, no, &a->spec, err);
    if (!rc)
        a->given[f->id] = 1;
    return rc;
}

/* --set KEY=V: a profile figure, applied when the cluster is loaded */
static int add_set(CliArgs *a, const char *arg, PxError *err)
{
    if (a->n_sets == CLI_MAX_SETS)
        return px_fail(err, PX_EINPUT, "--set: at most %d overrides", CLI_MAX_SETS);
    if (!strchr(arg, '='))
        return px_fail(err, PX_EINPUT, "--set '%s': expected key=value", arg);
    a->sets[a->n_sets++] = arg;
    return PX_OK;
}

const CliOption *cli_knob_options(void)
{
    /* a field's flag and its --no- flag, then --set and the end */
    static CliOption rows[2 * MODEL_FIELD_COUNT + 2];
    if (rows[0].name)
        return rows;
    int n = 0;
    for (int i = 0; i < model_field_count(); i++) {
        const ModelField *f = model_field_at(i);
        if (!f->flag)
            continue;
        rows[n++] = (CliOption){f->flag, f->metavar != NULL, f->metavar, f->help, (int)f->id, 0};
        if (f->no_flag)
            rows[n++] = (CliOption){f->no_flag, 0, NULL, f->no_help, CLI_KNOB_NO + (int)f->id, 0};
    }
    rows[n] = (CliOption){"set", 1, "KEY=V",
                          "override a profile figure, e.g. network.bandwidth_per_device=100e9 (repeatable)",
                          CLI_SET, 0};
    return rows;
}

int cli_parse(const char *cmd, const char *usage, int argc, char **argv,
              const CliOption *const *tables, int max_positional, CliArgs *a)
{
    char prog[96];
    snprintf(prog, sizeof prog, "parallax %s", cmd);
    return cli_parse_as(prog, usage, argc, argv, tables, max_positional, a);
}

/* Any option of a command into ctx (a CliArgs). */
static int cli_option(void *ctx, int id, const char *arg, PxError *err)
{
    CliArgs *a = ctx;
    switch (id) {
    case CLI_MODEL: a->model = arg; break;
    case CLI_CLUSTER: a->cluster = arg; break;
    case CLI_OUTPUT: a->output = arg; break;
    case CLI_JSON: a->json = 1; break;
    case CLI_GPUS: return px_parse_int(arg, "--gpus", 1, 1 << 24, &a->gpus, err);
    case CLI_SET: return add_set(a, arg, err);
    default:
        if (id >= CLI_EXTRA && id < CLI_EXTRA_MAX)
            a->extra[id - CLI_EXTRA] = arg ? arg : "1";
        else if (id >= 0 && id < CLI_KNOB_NO + MODEL_FIELD_COUNT)
            return knob(id, arg, a, err);
        break;
    }
    return PX_OK;
}

int cli_parse_with(const char *prog, const char *usage, int argc, char **argv,
                   const CliOption *const *tables, int max_operands, PxOptFn on, void *ctx,
                   int *first)
{
    char see[96];
    snprintf(see, sizeof see, "(see '%s --help')", prog);
    PxError err = {0};
    int rc = px_opts_parse(tables, argc, argv, see, on, ctx, max_operands, first, &err);
    if (rc == PX_OPTS_HELP) {
        print_help_as(prog, usage, tables);
        return 0;
    }
    if (rc) {
        fprintf(stderr, "%s: %s\n", prog, err.msg);
        return rc;
    }
    return -1;
}

int cli_parse_as(const char *prog, const char *usage, int argc, char **argv,
                 const CliOption *const *tables, int max_positional, CliArgs *a)
{
    const int max = max_positional < 8 ? max_positional : 8;
    int first;
    int rc = cli_parse_with(prog, usage, argc, argv, tables, max, cli_option, a, &first);
    if (rc >= 0)
        return rc;
    if (a->spec.job.moe_force_balance && a->spec.job.moe_imbalance != 1.0) {
        fprintf(stderr, "%s: --moe-force-balance routes tokens round-robin: --moe-imbalance %g cannot go with it\n",
                prog, a->spec.job.moe_imbalance);
        return 2;
    }
    for (int i = first; i < argc; i++)
        a->positional[a->n_positional++] = argv[i];
    return -1;
}
