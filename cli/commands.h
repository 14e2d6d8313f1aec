/* cli — the subcommands implemented outside parallax.c, each `int cmd(argc, argv)` returning
 * the exit status (0 ok, 1 runtime failure, 2 bad input). */
#ifndef CLI_COMMANDS_H
#define CLI_COMMANDS_H

int cli_cmd_run(int argc, char **argv);
int cli_cmd_plan(int argc, char **argv);
int cli_cmd_export(int argc, char **argv);
int cli_cmd_report(int argc, char **argv);
int cli_cmd_compare(int argc, char **argv);
int cli_cmd_validate(int argc, char **argv);
int cli_cmd_calibrate(int argc, char **argv);
int cli_cmd_published(int argc, char **argv);

#endif
