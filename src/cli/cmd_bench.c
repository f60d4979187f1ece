#include <stdio.h>
#include "cli.h"
int osp_cmd_bench(int argc, char **argv) {
    fprintf(stderr, "osprey bench: not built yet\n");
    return 1;
}
