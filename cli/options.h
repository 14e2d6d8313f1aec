/* cli — option tables shared by the subcommands: each command lists its options once, and
 * getopt_long's table and --help are generated from that list. The layout and training knobs
 * (--tp ... --set) parse into a ModelSpec plus the set of knobs the user gave. */
#ifndef CLI_OPTIONS_H
#define CLI_OPTIONS_H

#include "model/model.h"

/* common/px.h's option table entry; CLI_OUTPUT's entries carry the short form 'o' */
typedef PxOption CliOption;

/* Knob identifiers (also bits of CliArgs.given). */
enum {
    CLI_TP = 0, CLI_PP, CLI_DP, CLI_CP, CLI_VPP, CLI_ZERO, CLI_SP, CLI_NO_SP, CLI_RECOMPUTE,
    CLI_SCHEDULE, CLI_MBS, CLI_GBS, CLI_SEQ, CLI_PRECISION, CLI_GRAD_DTYPE, CLI_OPTIMIZER,
    CLI_FLASH, CLI_NO_FLASH, CLI_DROPOUT, CLI_OVERLAP_DP, CLI_NO_OVERLAP_DP, CLI_OVERLAP_TP,
    CLI_NO_OVERLAP_TP, CLI_PAD_VOCAB, CLI_CAUSAL, CLI_SET, CLI_FUSED, CLI_NO_FUSED, CLI_TOKENS,
    CLI_LR, CLI_MIN_LR, CLI_WARMUP, CLI_STEPS, CLI_SEED, CLI_WD, CLI_CLIP, CLI_DATA,
    CLI_PP_LAYERS, CLI_EP, CLI_ETP, CLI_OVERLAP_EP, CLI_NO_OVERLAP_EP, CLI_MOE_IMBALANCE,
    CLI_MOE_FORCE_BALANCE, CLI_FP8_RECIPE, CLI_FP8_FORMAT, CLI_FP8_PARAM_GATHER,
    CLI_FP8_AMAX_HISTORY, CLI_FP8_ATTENTION, CLI_FP8_DISPATCH, CLI_FSDP, CLI_KEEP_GATHERED,
    CLI_RESHARD, CLI_PREFETCH, CLI_BUCKET, CLI_DP_SHARD, CLI_DP_REPLICATE, CLI_OFFLOAD_OPT,
    CLI_OFFLOAD_ACT, CLI_CP_COMM, CLI_EMBED_SPLIT, CLI_LOSS_SPLIT, CLI_FIRST_LAYERS,
    CLI_LAST_LAYERS, CLI_PP_LAYOUT, CLI_ASYNC_TP, CLI_NO_ASYNC_TP,
    CLI_KNOB_COUNT, /* at most CLI_MODEL */
    /* not knobs */
    CLI_MODEL = 80, CLI_CLUSTER, CLI_GPUS, CLI_JSON, CLI_HELP, CLI_OUTPUT,
    /* command-specific options: their raw values land in CliArgs.extra[id - CLI_EXTRA] */
    CLI_EXTRA = 100, CLI_EXTRA_MAX = 140
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
    unsigned char given[CLI_KNOB_COUNT]; /* 1 for each knob on the command line: cli_given */
    const char *positional[8];
    int n_positional;
    const char *extra[CLI_EXTRA_MAX - CLI_EXTRA]; /* value, or "1" for a flag; NULL when absent */
    /* --ep and --etp: one value lands in spec.layout; a list ("1,2,4") or "auto" only here, for
     * the planner to search (n 0: auto, all). Set allow_lists before parsing to accept them. */
    int allow_lists;
    int ep_list[CLI_MAX_LIST], n_ep;
    int etp_list[CLI_MAX_LIST], n_etp;
} CliArgs;

extern const CliOption cli_knob_options[];

/* 1 when knob id was on the command line */
static inline int cli_given(const CliArgs *a, int id) { return id >= 0 && id < CLI_KNOB_COUNT && a->given[id]; }

/* Parses argv against the NULL-terminated list of tables, filling args; up to max_positional
 * bare arguments land in args->positional. Returns -1 to go on, or an exit status: 0 after
 * --help, 2 after a bad option or argument (message printed, naming it). */
int cli_parse(const char *cmd, const char *usage, int argc, char **argv,
              const CliOption *const *tables, int max_positional, CliArgs *args);
/* The same for a program of its own: prog names it in --help and in messages ("exec_mkplan"). */
int cli_parse_as(const char *prog, const char *usage, int argc, char **argv,
                 const CliOption *const *tables, int max_positional, CliArgs *a);

/* "parallax <cmd>: <err->msg>" on stderr; returns the exit status for status (not PX_OK):
 * 2 for PX_EINPUT, else 1. */
int cli_fail(const char *cmd, int status, const PxError *err);
/* j on stdout, indented, and a newline; then deletes j (callers build it only to print it). */
void cli_print_json(cJSON *j);

#endif
