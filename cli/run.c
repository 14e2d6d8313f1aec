/* parallax run: launches the executor on a plan. */
#include <stdio.h>

#include "cli/commands.h"

int cli_cmd_run(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "parallax run: the executor is not built yet\n");
    return 1;
}
