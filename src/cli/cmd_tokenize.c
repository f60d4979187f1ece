/* placeholder: replaced by the tokenizer work (issue 4) */
#include <stdio.h>
#include "cli.h"
int osp_cmd_tokenize(int argc, char **argv) { (void)argc; (void)argv; fprintf(stderr, "osprey tokenize: not available yet\n"); return 1; }
int osp_cmd_detokenize(int argc, char **argv) { (void)argc; (void)argv; fprintf(stderr, "osprey detokenize: not available yet\n"); return 1; }
