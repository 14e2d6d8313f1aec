/* cli — option tables shared by the subcommands: each command lists its options once, and
 * getopt_long's table and --help are generated from that list. The layout and training knobs
 * (--tp ... --set) come from model/fields.c's rows and parse into a ModelSpec plus the set of
 * fields the user gave. */
#ifndef CLI_OPTIONS_H
#define CLI_OPTIONS_H

#include "model/model.h"

/* common/px.h's option table entry; CLI_OUTPUT's entries carry the short form 'o' */
typedef PxOption CliOption;

/* Option ids. The knobs are model/fields.c's rows: a field's flag has the field's id
 * (ModelFieldId), its --no- flag CLI_KNOB_NO + the id. */
enum {
    CLI_KNOB_NO = 100,
    /* not fields */
    CLI_MODEL = 200, CLI_CLUSTER, CLI_GPUS, CLI_JSON, CLI_HELP, CLI_OUTPUT, CLI_SET,
    /* command-specific options: their raw values land in CliArgs.extra[id - CLI_EXTRA] */
    CLI_EXTRA = 300, CLI_EXTRA_MAX = 340
};

#define CLI_MAX_SETS 64
/* values a searched knob may list (--ep 1,2,4,8) */
#define CLI_MAX_LIST 16

typedef struct {
    const char *model;
    const char *cluster;
    int gpus;
    int json;
    const char *output;
    ModelSpec spec;
    const char *sets[CLI_MAX_SETS];
    int n_sets;
    unsigned char given[MODEL_FIELD_COUNT]; /* 1 for each field whose flag (or --no- flag) was
                                               on the command line: cli_given */
    const char *positional[8];
    int n_positional;
    const char *extra[CLI_EXTRA_MAX - CLI_EXTRA]; /* value, or "1" for a flag; NULL when absent */
    /* --ep and --etp: one value lands in spec.layout; a list ("1,2,4") or "auto" only here, for
     * the planner to search (n 0: auto, all). Set allow_lists before parsing to accept them. */
    int allow_lists;
    int ep_list[CLI_MAX_LIST], n_ep;
    int etp_list[CLI_MAX_LIST], n_etp;
} CliArgs;

/* The knobs' option rows, made from model/fields.c's (each field with a flag, in its order, then
 * --set): the table the commands that take a layout and a job list among theirs. */
const CliOption *cli_knob_options(void);

/* 1 when field id's flag was on the command line */
static inline int cli_given(const CliArgs *a, ModelFieldId id)
{
    return (int)id >= 0 && id < MODEL_FIELD_COUNT && a->given[id];
}

/* Parses argv against the NULL-terminated list of tables, filling args; up to max_positional
 * bare arguments land in args->positional. Returns -1 to go on, or an exit status: 0 after
 * --help, 2 after a bad option or argument (message printed, naming it). */
int cli_parse(const char *cmd, const char *usage, int argc, char **argv,
              const CliOption *const *tables, int max_positional, CliArgs *args);
/* The same for a program of its own: prog names it in --help and in messages ("exec_mkplan"). */
int cli_parse_as(const char *prog, const char *usage, int argc, char **argv,
                 const CliOption *const *tables, int max_positional, CliArgs *a);
/* The loop under both, for a command with its own option handler: each option of argv goes to
 * on(ctx, ...), then at most max_operands operands follow, argv[*first] the first (getopt_long
 * moves them after the options). -1 to go on, or an exit status as cli_parse's. */
int cli_parse_with(const char *prog, const char *usage, int argc, char **argv,
                   const CliOption *const *tables, int max_operands, PxOptFn on, void *ctx,
                   int *first);

/* "parallax <cmd>: <err->msg>" on stderr; returns the exit status for status (not PX_OK):
 * 2 for PX_EINPUT, else 1. */
int cli_fail(const char *cmd, int status, const PxError *err);
/* j on stdout, indented, and a newline; then deletes j (callers build it only to print it). */
void cli_print_json(cJSON *j);

#endif
