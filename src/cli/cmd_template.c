/* placeholder: replaced by the chat-template work (issue 4) */
#include <stdio.h>
#include "cli.h"
int osp_cmd_template(int argc, char **argv) { (void)argc; (void)argv; fprintf(stderr, "osprey template: not available yet\n"); return 1; }
