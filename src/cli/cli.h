/* cli/: the osprey command-line front end. Each subcommand is one
 * function taking its own argv (argv[0] = subcommand name) and returning
 * the process exit code. Library errors are printed as one line:
 * "osprey <cmd>: <message>". */
#ifndef OSP_CLI_H
#define OSP_CLI_H

#include <stdint.h>

int osp_cmd_inspect(int argc, char **argv);
int osp_cmd_logits(int argc, char **argv);
int osp_cmd_generate(int argc, char **argv);
int osp_cmd_synth(int argc, char **argv);
int osp_cmd_bench(int argc, char **argv);
int osp_cmd_tokenize(int argc, char **argv);   /* cli/cmd_tokenize.c */
int osp_cmd_detokenize(int argc, char **argv); /* cli/cmd_tokenize.c */
int osp_cmd_template(int argc, char **argv);   /* cli/cmd_template.c */
int osp_cmd_chat(int argc, char **argv);
int osp_cmd_serve(int argc, char **argv);     /* cli/cmd_serve.c */
int osp_cmd_mel(int argc, char **argv);       /* cli/cmd_mel.c */
int osp_cmd_transcribe(int argc, char **argv); /* cli/cmd_transcribe.c */
/* cli/whisper_tools.c: Whisper in synth and bench */
int osp_whisper_preset_known(const char *name);
int osp_whisper_synth(const char *preset, const char *dtype, const char *out, uint64_t seed);
int osp_whisper_bench(const char *model, int n_tokens, int as_json);

/* Print "osprey <cmd>: <last library error>" and return 1. */
int osp_cli_fail(const char *cmd);
/* Sampling flags shared by generate and chat (negative = not given). */
typedef struct osp_cli_sampling {
    float temp, top_p, min_p, rep;
    int top_k;
    long long seed;
} osp_cli_sampling;
#define OSP_CLI_SAMPLING_UNSET {-1, -1, -1, -1, -1, -1}
struct osp_gen_params;
/* If `flag` is a sampling flag, store `value` and return 1 (the caller
 * consumes both); else 0. */
int osp_cli_sampling_flag(osp_cli_sampling *s, const char *flag, const char *value);
/* Override the defaults in p with the flags that were given. */
void osp_cli_sampling_apply(const osp_cli_sampling *s, struct osp_gen_params *p);

/* --device cpu|cuda|auto and llama-server's -ngl/--n-gpu-layers N (any N > 0
 * means the GPU, 0 the CPU): if `flag` is one of them, store the device and
 * return 1 (the caller consumes both); -1 (message printed) for a bad value;
 * else 0. */
int osp_cli_device_flag(const char *cmd, const char *flag, const char *value, int *device);
#define OSP_CLI_DEVICE_HELP                                                                                   \
    "  --device cpu|cuda|auto   where the model runs (auto: the GPU when one is present, else the CPU);\n"  \
    "                           -ngl/--n-gpu-layers N: N > 0 means cuda, 0 means cpu\n"

/* Default model folder (bundled) when none is given, or NULL. */
const char *osp_cli_default_model(void);

#endif
