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
int osp_cmd_convert(int argc, char **argv);   /* cli/cmd_convert.c */
int osp_cmd_mel(int argc, char **argv);       /* cli/cmd_mel.c */
int osp_cmd_transcribe(int argc, char **argv); /* cli/cmd_transcribe.c */
int osp_cmd_maskbench(int argc, char **argv);  /* cli/cmd_maskbench.c */
int osp_cmd_embed(int argc, char **argv);      /* cli/cmd_embed.c */
int osp_cmd_rerank(int argc, char **argv);     /* cli/cmd_rerank.c */
/* cli/whisper_tools.c: Whisper in synth and bench */
int osp_whisper_preset_known(const char *name);
int osp_whisper_synth(const char *preset, const char *dtype, const char *out, uint64_t seed);
int osp_whisper_bench(const char *model, int device, int fast, int n_tokens, int as_json);
struct osp_model;
/* bench_embed.c: an embedder's tokens/s embedding n_inputs inputs of p tokens, batch rows at a time */
int osp_bench_embed(struct osp_model *m, int fast, int n_inputs, int p, int batch, int as_json);

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

/* Speculative decoding flags shared by generate and bench (cli/spec_run.c):
 * --draft-model/-md M, --num-draft-tokens K (mlx_lm; = --draft-max),
 * --draft-max K, --draft-min K (llama-server), --spec-ngram. */
typedef struct osp_cli_spec {
    const char *draft;
    int ngram, draft_max, draft_min, batch_tokens; /* batch_tokens: -1 = default */
} osp_cli_spec;
#define OSP_CLI_SPEC_UNSET {NULL, 0, 0, 0, -1}
#define OSP_CLI_SPEC_HELP                                                                                      \
    "  --draft-model M (-md)    speculative decoding with a draft model sharing the tokenizer\n"               \
    "  --spec-ngram             speculative decoding with n-gram lookup in prompt + output (no second model)\n" \
    "  --num-draft-tokens K     tokens drafted per round, at most (default 4; --draft-max); --draft-min K\n" \
    "  --spec-batch-tokens N    most tokens a verification pass computes for all rows (default 8; 0 = no cap)\n"
/* 1 (value consumed) / 2 (no value) if `flag` is one of them; -1 bad value; else 0. */
int osp_cli_spec_flag(osp_cli_spec *c, const char *flag, const char *value);
struct osp_model;
struct osp_session;
struct osp_spec;
struct osp_stream;
/* With speculation asked for: load the draft (on the target's device; its
 * tokenizer checked against tok) and make the speculation for session s.
 * *sp = NULL when not asked for. */
int osp_cli_spec_open(const osp_cli_spec *c, const struct osp_model *target, int device, const void *tok,
                      struct osp_session *s, struct osp_model **draft, struct osp_spec **sp);
/* Decode the B rows (session rows 0..B-1, streams st, next tokens) until
 * every stream ends: batched plain steps, or speculative rounds. 0 ok. */
int osp_cli_decode(struct osp_session *s, struct osp_spec *sp, struct osp_stream **st, int B, int *next);

/* bench with speculation (cli/bench_spec.c) */
int osp_bench_spec(const char *model, int device, int fast, int p, int n, int conc, const char *prompt, int chat,
                   const osp_cli_spec *spc, int json);

struct osp_tokenizer;
/* A prompt as token ids (osp_malloc'd into *ids): rendered through the
 * model's chat template with chat (and a system turn when system is not
 * NULL), else encoded with the tokenizer's special tokens. 0 ok, -1 with
 * the library's message. */
int osp_cli_prompt_ids(const char *dir, const struct osp_tokenizer *tok, const char *system, const char *prompt,
                       int chat, int32_t **ids, int *n);

/* Default model folder (bundled) when none is given, or NULL. */
const char *osp_cli_default_model(void);

#endif
