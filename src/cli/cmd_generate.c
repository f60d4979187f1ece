/* osprey generate: one completion, streamed to stdout; timings to stderr.
 * --prompt TEXT encodes the text (with the tokenizer's special tokens, or
 * through the model's chat template with --chat); --ids gives token ids
 * directly and prints the generated ids. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli.h"
#include "core/core.h"
#include "osprey.h"
#include "engine/spec.h"
#include "text/tokenizer.h"

static int usage(void) {
    fprintf(stderr,
            "usage: osprey generate [--model MODEL] (--prompt TEXT | --ids 1,2,3) [--chat] [--system TEXT]\n"
            "         [-n N] [--temp T] [--top-p P] [--top-k K] [--min-p P] [--repeat-penalty R] [--seed S]\n"
            "         [--stop STR]... [-t THREADS] [--precise] [--device cpu|cuda|auto]\n"
            OSP_CLI_DEVICE_HELP OSP_CLI_SPEC_HELP
            "  --chat     render the prompt (and --system) through the model's chat template\n"
            "  defaults:  the model's generation_config.json, else greedy; -n 256\n");
    return 2;
}

static int print_text(void *user, int32_t token, const char *text, size_t len) {
    (void)token;
    int *ids_mode = user;
    if (*ids_mode) {
        if (token >= 0) printf(ids_mode[1]++ ? ",%d" : "%d", token);
    } else {
        fwrite(text, 1, len, stdout);
    }
    fflush(stdout);
    return 0;
}

static int32_t *parse_ids(const char *s, int *n) {
    int cap = 1;
    for (const char *p = s; *p; p++) cap += *p == ',';
    int32_t *ids = malloc(sizeof(int32_t) * cap);
    *n = 0;
    for (char *p = (char *)s, *end; *p; p = end + (*end == ',')) {
        long v = strtol(p, &end, 10);
        if (end == p || (*end && *end != ',')) {
            free(ids);
            return NULL;
        }
        ids[(*n)++] = (int32_t)v;
    }
    return ids;
}

int osp_cmd_generate(int argc, char **argv) {
    const char *model = NULL, *ids_s = NULL, *prompt = NULL, *system = NULL;
    const char *stops[16];
    int n = 256, threads = 0, fast = 1, chat = 0, n_stop = 0, device = OSP_DEVICE_AUTO;
    osp_cli_sampling smp = OSP_CLI_SAMPLING_UNSET;
    osp_cli_spec spc = OSP_CLI_SPEC_UNSET;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (osp_cli_sampling_flag(&smp, a, v)) {
            i++;
            continue;
        }
        int sr = osp_cli_spec_flag(&spc, a, v);
        if (sr < 0) return 2;
        if (sr > 0) {
            i += sr == 1;
            continue;
        }
        int dr = osp_cli_device_flag("generate", a, v, &device);
        if (dr) {
            if (dr < 0) return 2;
            i++;
            continue;
        }
#define OPT(name) (!strcmp(a, name) && v && (i++, 1))
        if (OPT("--model") || OPT("-m")) model = v;
        else if (OPT("--ids")) ids_s = v;
        else if (OPT("--prompt") || OPT("-p")) prompt = v;
        else if (OPT("--system")) system = v;
        else if (OPT("-n") || OPT("--max-tokens")) n = atoi(v);
        else if (OPT("--stop") && n_stop < 16) stops[n_stop++] = v;
        else if (OPT("-t") || OPT("--threads")) threads = atoi(v);
        else if (!strcmp(a, "--chat")) chat = 1;
        else if (!strcmp(a, "--precise")) fast = 0;
        else return usage();
#undef OPT
    }
    if (!model) model = osp_cli_default_model();
    if (!model || (!ids_s == !prompt) || n < 0) return usage();
    osp_set_threads(threads);
    osp_model *m = NULL;
    osp_tokenizer *tok = NULL;
    osp_session *s = NULL;
    osp_model *draft = NULL;
    struct osp_spec *sp = NULL;
    int32_t *ids = NULL, eos[32];
    int rc = 0, np = 0;
    osp_model_params mp = {.device = (osp_device)device, .place = 1};
    if (osp_model_load_params(model, &mp, &m) != OSP_OK) return osp_cli_fail("generate");
    const osp_model_info *in = osp_model_get_info(m);
    if (osp_tokenizer_load(in->dir, &tok) != OSP_OK) {
        if (prompt) {
            rc = osp_cli_fail("generate");
            goto done;
        }
        tok = NULL; /* --ids works without a tokenizer */
    }
    if (ids_s) {
        if (!(ids = parse_ids(ids_s, &np)) || np == 0) {
            fprintf(stderr, "osprey generate: --ids must be comma-separated integers\n");
            rc = 2;
            goto done;
        }
    } else if (osp_cli_prompt_ids(in->dir, tok, system, prompt, chat, &ids, &np) != 0) {
        rc = osp_cli_fail("generate");
        goto done;
    }
    osp_gen_params gp;
    osp_gen_defaults(m, tok, &gp, eos);
    if (ids_s) gp.sampler.temperature = 0; /* ids mode: greedy unless asked */
    osp_cli_sampling_apply(&smp, &gp);
    gp.max_tokens = n;
    gp.stop = stops;
    gp.n_stop = n_stop;
    if (ids_s) gp.n_eos = 0; /* ids mode prints exactly n ids */
    osp_session_opts so = {.n_rows = 1, .max_ctx = np + n + 1, .spare = 65};
    if (osp_session_new_opts(m, &so, &s) != OSP_OK) {
        rc = osp_cli_fail("generate");
        goto done;
    }
    osp_session_set_fast(s, fast);
    if (osp_cli_spec_open(&spc, m, device, tok, s, &draft, &sp) != 0) {
        rc = osp_cli_fail("generate");
        goto done;
    }
    int mode[2] = {ids_s != NULL, 0};
    osp_gen_stats st;
    if (!sp) {
        if (osp_generate(s, ids_s ? NULL : tok, ids, np, &gp, print_text, mode, &st) != OSP_OK) {
            rc = osp_cli_fail("generate");
            goto done;
        }
    } else { /* the same stream, decoded in speculative rounds */
        osp_stream *g = NULL;
        float *lg = malloc(sizeof(float) * in->vocab);
        int32_t next = 0;
        osp_status src = lg ? osp_stream_new(m, ids_s ? NULL : tok, ids, np, np + n + 1, &gp, print_text, mode, &g)
                            : OSP_ERR_NOMEM;
        if (src == OSP_OK) src = osp_forward(s, ids, np, 0, lg);
        int more = src == OSP_OK && osp_stream_next(g, lg, osp_session_row_pos(s, 0), &next, &src);
        if (src == OSP_OK && more && osp_cli_decode(s, sp, &g, 1, &next) != 0) src = OSP_ERR_INTERNAL;
        if (g) st = *osp_stream_stats(g);
        osp_stream_free(g);
        free(lg);
        if (src != OSP_OK) {
            rc = osp_cli_fail("generate");
            goto done;
        }
    }
    printf("\n");
    fflush(stdout);
    static const char *FIN[] = {"stop", "length", "cancelled"};
    fprintf(stderr, "prompt %d tokens, %.1f tok/s; generated %d tokens, %.2f tok/s; first token after %.3f s; finish: %s\n",
            st.n_prompt, st.prefill_tok_s, st.n_generated, st.decode_tok_s, st.ttft_s, FIN[st.finish]);
    if (sp)
        fprintf(stderr, "speculative: %d tokens drafted, %d accepted (%.1f%%)\n", st.n_draft, st.n_draft_accepted,
                st.n_draft ? 100.0 * st.n_draft_accepted / st.n_draft : 0.0);
done:
    if (ids_s) free(ids);
    else osp_free(ids);
    osp_spec_free(sp);
    osp_session_free(s);
    osp_model_free(draft);
    osp_tokenizer_free(tok);
    osp_model_free(m);
    return rc;
}
