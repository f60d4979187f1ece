/* cli/: the osprey command-line front end. Each subcommand is one
 * function taking its own argv (argv[0] = subcommand name) and returning
 * the process exit code. Library errors are printed as one line:
 * "osprey <cmd>: <message>". */
#ifndef OSP_CLI_H
#define OSP_CLI_H

int osp_cmd_inspect(int argc, char **argv);
int osp_cmd_logits(int argc, char **argv);
int osp_cmd_generate(int argc, char **argv);
int osp_cmd_synth(int argc, char **argv);
int osp_cmd_bench(int argc, char **argv);
int osp_cmd_tokenize(int argc, char **argv);   /* cli/cmd_tokenize.c */
int osp_cmd_detokenize(int argc, char **argv); /* cli/cmd_tokenize.c */
int osp_cmd_template(int argc, char **argv);   /* cli/cmd_template.c */
int osp_cmd_chat(int argc, char **argv);

/* Print "osprey <cmd>: <last library error>" and return 1. */
int osp_cli_fail(const char *cmd);
/* Default model folder (bundled) when none is given, or NULL. */
const char *osp_cli_default_model(void);

#endif
