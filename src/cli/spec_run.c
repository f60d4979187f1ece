/* cli/spec_run: speculative decoding for the command line (generate,
 * bench): its flags, the draft model, and a decode loop over a session's
 * rows, plain or speculating (engine/spec.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli.h"
#include "engine/spec.h"
#include "osprey.h"
#include "text/tokenizer.h"

int osp_cli_spec_flag(osp_cli_spec *c, const char *a, const char *v) {
    if (!strcmp(a, "--spec-ngram")) return c->ngram = 1, 2;
    int *num = !strcmp(a, "--num-draft-tokens") || !strcmp(a, "--draft-max") || !strcmp(a, "--draft") ? &c->draft_max
               : !strcmp(a, "--draft-min")                                                           ? &c->draft_min
                                                                                                     : NULL;
    if (!strcmp(a, "--spec-batch-tokens")) {
        char *end;
        long n = v ? strtol(v, &end, 10) : -1;
        if (!v || *end || n < 0 || n > 65536) {
            fprintf(stderr, "osprey: --spec-batch-tokens expects a number of tokens (0 = no cap)\n");
            return -1;
        }
        c->batch_tokens = (int)n;
        return 1;
    }
    if (num) {
        char *end;
        long n = v ? strtol(v, &end, 10) : 0;
        if (!v || *end || n < 1 || n > 64) {
            fprintf(stderr, "osprey: %s expects a number of tokens in [1, 64]\n", a);
            return -1;
        }
        *num = (int)n;
        return 1;
    }
    if (!strcmp(a, "--draft-model") || !strcmp(a, "-md") || !strcmp(a, "--model-draft")) {
        if (!v) return -1;
        c->draft = v;
        return 1;
    }
    return 0;
}

int osp_cli_spec_open(const osp_cli_spec *c, const osp_model *target, int device, const void *tok, osp_session *s,
                      osp_model **draft, osp_spec **sp) {
    *draft = NULL;
    *sp = NULL;
    if (!c->draft && !c->ngram) return 0;
    osp_spec_params p = osp_spec_defaults();
    if (c->draft_max) p.draft_max = c->draft_max;
    if (c->draft_min) p.draft_min = c->draft_min;
    if (p.draft_min > p.draft_max) p.draft_min = p.draft_max;
    p.max_tokens = c->batch_tokens >= 0 ? c->batch_tokens : osp_session_pass_tokens(s);
    p.ngram = c->ngram && !c->draft;
    if (c->draft && osp_spec_load_draft(c->draft, device, tok, draft) != OSP_OK) return -1;
    (void)target;
    return osp_spec_new(&p, *draft, s, sp) == OSP_OK ? 0 : -1;
}

int osp_cli_decode(osp_session *s, osp_spec *sp, osp_stream **st, int B, int *next_in) {
    int32_t rows[B], next[B], act[B], anext[B], feed[B];
    int more[B], amore[B], use[B];
    osp_status rcs[B];
    osp_stream *ast[B];
    int32_t V = osp_model_get_info(osp_session_model(s))->vocab;
    float *lg = malloc(sizeof(float) * V * B);
    if (!lg) return -1;
    for (int b = 0; b < B; b++) rows[b] = b, next[b] = next_in[b], more[b] = 1, use[b] = 1;
    int rc = 0;
    for (;;) {
        int an = 0;
        for (int b = 0; b < B; b++)
            if (more[b]) act[an] = rows[b], ast[an] = st[b], anext[an] = next[b], an++;
        if (!an) break;
        if (sp) {
            if (osp_spec_step(sp, s, act, an, ast, use, anext, amore, rcs) != OSP_OK) {
                rc = -1;
                break;
            }
        } else {
            for (int i = 0; i < an; i++) feed[i] = anext[i];
            if (osp_forward_rows(s, act, an, feed, 1, 0, lg) != OSP_OK) {
                rc = -1;
                break;
            }
            for (int i = 0; i < an; i++)
                amore[i] = osp_stream_next(ast[i], lg + (int64_t)i * V, osp_session_row_pos(s, act[i]), &anext[i], &rcs[i]);
        }
        for (int i = 0; i < an; i++) {
            if (rcs[i] != OSP_OK) rc = -1;
            next[act[i]] = anext[i], more[act[i]] = amore[i] && rcs[i] == OSP_OK;
        }
    }
    free(lg);
    return rc;
}
