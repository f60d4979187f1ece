/* osprey chat: an interactive multi-turn conversation through the model's
 * chat template. /reset forgets the conversation, /quit (or Ctrl-D) ends.
 * Each turn re-renders the whole conversation and prefills it into a fresh
 * session (the prefix cache will make this incremental). */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "cli.h"
#include "core/core.h"
#include "osprey.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

typedef struct reply {
    char *buf;
    size_t len, cap;
} reply;

static int on_text(void *user, int32_t token, const char *text, size_t len) {
    (void)token;
    reply *r = user;
    fwrite(text, 1, len, stdout);
    fflush(stdout);
    if (r->len + len + 1 > r->cap) {
        size_t nc = (r->len + len + 1) * 2;
        char *nb = realloc(r->buf, nc);
        if (!nb) return 1;
        r->buf = nb;
        r->cap = nc;
    }
    memcpy(r->buf + r->len, text, len);
    r->len += len;
    r->buf[r->len] = 0;
    return 0;
}

static int usage(void) {
    fprintf(stderr, "usage: osprey chat [--model MODEL] [--system TEXT] [--temp T] [--top-p P] [--top-k K] [--min-p P]\n"
                    "         [--repeat-penalty R] [--seed S] [-n MAX_TOKENS_PER_REPLY] [-c CONTEXT] [-t THREADS]\n"
                    "         [--device cpu|cuda|auto]\n" OSP_CLI_DEVICE_HELP
                    "  commands during the chat: /reset (new conversation), /quit (or Ctrl-D)\n");
    return 2;
}

int osp_cmd_chat(int argc, char **argv) {
    const char *model = NULL, *system = NULL;
    int n = 512, ctx = 4096, threads = 0, device = OSP_DEVICE_AUTO;
    osp_cli_sampling smp = OSP_CLI_SAMPLING_UNSET;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (osp_cli_sampling_flag(&smp, a, v)) {
            i++;
            continue;
        }
        int dr = osp_cli_device_flag("chat", a, v, &device);
        if (dr) {
            if (dr < 0) return 2;
            i++;
            continue;
        }
#define OPT(name) (!strcmp(a, name) && v && (i++, 1))
        if (OPT("--model") || OPT("-m")) model = v;
        else if (OPT("--system")) system = v;
        else if (OPT("-n") || OPT("--max-tokens")) n = atoi(v);
        else if (OPT("-c") || OPT("--ctx-size")) ctx = atoi(v);
        else if (OPT("-t") || OPT("--threads")) threads = atoi(v);
        else return usage();
#undef OPT
    }
    if (!model) model = osp_cli_default_model();
    if (!model) return usage();
    osp_set_threads(threads);
    int tty = isatty(STDIN_FILENO) && isatty(STDERR_FILENO);
    double t0 = osp_now_s();
    if (tty) fprintf(stderr, "loading %s ...", model);
    osp_model *m = NULL;
    osp_tokenizer *tok = NULL;
    osp_chat_template *ct = NULL;
    osp_model_params mp = {.device = (osp_device)device, .place = 1};
    if (osp_model_load_params(model, &mp, &m) != OSP_OK) {
        if (tty) fprintf(stderr, "\n");
        return osp_cli_fail("chat");
    }
    const osp_model_info *in = osp_model_get_info(m);
    int rc = 0;
    if (osp_tokenizer_load(in->dir, &tok) != OSP_OK || osp_chat_template_load(in->dir, NULL, &ct) != OSP_OK) {
        if (tty) fprintf(stderr, "\n");
        rc = osp_cli_fail("chat");
        goto done;
    }
    if (tty) fprintf(stderr, "\r%*s\r", 64, "");
    if (tty && osp_now_s() - t0 > 1.0) fprintf(stderr, "loaded in %.1f s\n", osp_now_s() - t0);
    if (tty) fprintf(stderr, "chatting with %s (%s); /reset, /quit\n", model, in->architecture);
    if (ctx > in->max_ctx) ctx = in->max_ctx;
    int32_t eos[32];
    osp_gen_params gp;
    osp_gen_defaults(m, tok, &gp, eos);
    osp_cli_sampling_apply(&smp, &gp);
    uint64_t seed0 = gp.sampler.seed;
    gp.max_tokens = n;
    json_t *msgs = json_array();
    if (system) json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", "system", "content", system));
    char *line = NULL;
    size_t lcap = 0;
    uint64_t turn = 0;
    for (;;) {
        if (tty) fprintf(stderr, "> ");
        ssize_t got = getline(&line, &lcap, stdin);
        if (got < 0) break;
        while (got > 0 && (line[got - 1] == '\n' || line[got - 1] == '\r')) line[--got] = 0;
        if (!strcmp(line, "/quit") || !strcmp(line, "/exit")) break;
        if (!strcmp(line, "/reset")) {
            json_array_clear(msgs);
            if (system) json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", "system", "content", system));
            if (tty) fprintf(stderr, "(conversation reset)\n");
            continue;
        }
        if (!got) continue;
        json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", "user", "content", line));
        char *text = NULL;
        size_t tlen = 0, np = 0;
        int32_t *ids = NULL;
        osp_session *s = NULL;
        reply r = {0};
        osp_gen_stats st;
        gp.sampler.seed = smp.seed >= 0 ? seed0 + turn++ : (uint64_t)(osp_now_s() * 1e6);
        if (osp_chat_template_render(ct, msgs, NULL, 1, NULL, NULL, &text, &tlen) != OSP_OK ||
            osp_tokenizer_encode_alloc(tok, text, tlen, 0, &ids, &np) != OSP_OK ||
            osp_session_new(m, 1, ctx, &s) != OSP_OK) {
            osp_cli_fail("chat");
            json_array_remove(msgs, json_array_size(msgs) - 1);
        } else {
            osp_session_set_fast(s, 1);
            if (osp_generate(s, tok, ids, (int32_t)np, &gp, on_text, &r, &st) != OSP_OK) {
                printf("\n");
                osp_cli_fail("chat");
                json_array_remove(msgs, json_array_size(msgs) - 1);
            } else {
                printf("\n");
                json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", "assistant", "content", r.buf ? r.buf : ""));
                if (tty) fprintf(stderr, "[%d tokens, %.1f tok/s]\n", st.n_generated, st.decode_tok_s);
            }
        }
        fflush(stdout);
        free(r.buf);
        osp_session_free(s);
        osp_free(ids);
        osp_free(text);
    }
    free(line);
    json_decref(msgs);
done:
    osp_chat_template_free(ct);
    osp_tokenizer_free(tok);
    osp_model_free(m);
    return rc;
}
