/* osprey bench with speculative decoding (--draft-model / --spec-ngram):
 * the same greedy generations (n tokens past any end-of-sequence, conc rows
 * at once) decoded plainly and speculatively, interleaved in one run
 * (plain, speculative, plain, speculative), each row prefilled alone first.
 * Reports both decode speeds, their ratio, the acceptance, and whether the
 * tokens were identical (greedy speculation must not change them). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli.h"
#include "engine/sampler.h"
#include "engine/spec.h"
#include "osprey.h"
#include "text/tokenizer.h"

typedef struct run_out {
    double secs;
    long long drafted, accepted;
} run_out;

/* One generation of every row; tokens [conc, n]. */
static int run(osp_session *s, osp_spec *sp, const osp_model *m, const int32_t *ids, int np, int conc, int n,
               int32_t *tokens, run_out *o) {
    int32_t V = osp_model_get_info(m)->vocab, next[conc];
    osp_stream *st[conc];
    float *lg = malloc(sizeof(float) * V);
    osp_gen_params gp = {0};
    gp.sampler = osp_sampler_defaults(); /* greedy */
    gp.sampler.temperature = 0;
    gp.max_tokens = n;
    int rc = lg ? 0 : -1;
    for (int b = 0; b < conc; b++) st[b] = NULL;
    for (int b = 0; b < conc && rc == 0; b++) {
        osp_status src;
        osp_session_reset_row(s, b);
        if (sp) osp_spec_reset_row(sp, b);
        int32_t row = b;
        if (osp_stream_new(m, NULL, ids, np, osp_session_max_ctx(s), &gp, NULL, NULL, &st[b]) != OSP_OK ||
            osp_forward_rows(s, &row, 1, ids, np, 0, lg) != OSP_OK ||
            !osp_stream_next(st[b], lg, osp_session_row_pos(s, b), &next[b], &src))
            rc = -1;
    }
    double t0 = osp_now_s();
    if (rc == 0 && osp_cli_decode(s, sp, st, conc, next) != 0) rc = -1;
    o->secs = osp_now_s() - t0;
    o->drafted = o->accepted = 0;
    for (int b = 0; b < conc; b++) {
        if (!st[b]) continue;
        int32_t nt;
        const int32_t *t = osp_stream_tokens(st[b], &nt);
        if (nt - np != n) rc = -1;
        else memcpy(tokens + (int64_t)b * n, t + np, sizeof(int32_t) * n);
        o->drafted += osp_stream_stats(st[b])->n_draft;
        o->accepted += osp_stream_stats(st[b])->n_draft_accepted;
        osp_stream_free(st[b]);
    }
    free(lg);
    return rc;
}

int osp_bench_spec(const char *model, int device, int fast, int p, int n, int conc, const char *prompt, int chat,
                   const osp_cli_spec *spc, int json) {
    osp_model *m = NULL, *draft = NULL;
    osp_tokenizer *tok = NULL;
    osp_session *s = NULL;
    osp_spec *sp = NULL;
    int32_t *ids = NULL, *ta = NULL, *tb = NULL;
    int np = p, rc = 0;
    osp_model_params mp = {.device = (osp_device)device, .place = 1};
    if (osp_model_load_params(model, &mp, &m) != OSP_OK) return osp_cli_fail("bench");
    const osp_model_info *in = osp_model_get_info(m);
    if (osp_tokenizer_load(in->dir, &tok) != OSP_OK) {
        if (prompt) {
            rc = osp_cli_fail("bench");
            goto done;
        }
        tok = NULL;
    }
    if (prompt) {
        if (osp_cli_prompt_ids(in->dir, tok, NULL, prompt, chat, &ids, &np) != 0) {
            rc = osp_cli_fail("bench");
            goto done;
        }
    } else {
        ids = malloc(sizeof(int32_t) * p);
        for (int i = 0; ids && i < p; i++) ids[i] = (int32_t)((i * 7919 + 13) % in->vocab);
    }
    osp_session_opts so = {.n_rows = conc, .max_ctx = np + n + 70, .spare = 65};
    ta = malloc(sizeof(int32_t) * conc * n), tb = malloc(sizeof(int32_t) * conc * n);
    if (!ids || !ta || !tb || osp_session_new_opts(m, &so, &s) != OSP_OK) {
        rc = osp_cli_fail("bench");
        goto done;
    }
    osp_session_set_fast(s, fast);
    if (osp_cli_spec_open(spc, m, device, tok, s, &draft, &sp) != 0) {
        rc = osp_cli_fail("bench");
        goto done;
    }
    run_out pl[2], sr[2];
    int identical = 1;
    for (int rep = 0; rep < 2 && rc == 0; rep++) {
        if (run(s, NULL, m, ids, np, conc, n, rep ? tb : ta, &pl[rep]) != 0 || run(s, sp, m, ids, np, conc, n, tb, &sr[rep]) != 0) {
            rc = osp_cli_fail("bench");
            break;
        }
        identical &= !memcmp(ta, tb, sizeof(int32_t) * conc * n);
    }
    if (rc) goto done;
    double tp = (pl[0].secs + pl[1].secs) / 2, ts = (sr[0].secs + sr[1].secs) / 2;
    double plain = (double)conc * (n - 1) / tp, spec = (double)conc * (n - 1) / ts;
    long long dr = sr[0].drafted + sr[1].drafted, ac = sr[0].accepted + sr[1].accepted;
    double acc = dr ? (double)ac / dr : 0;
    const char *how = spc->draft ? spc->draft : "n-gram lookup";
    if (json)
        printf("{\"model\":\"%s\",\"device\":\"%s\",\"speculation\":\"%s\",\"prompt_tokens\":%d,\"decode_tokens\":%d,"
               "\"concurrency\":%d,\"decode_tok_s\":%.3f,\"decode_tok_s_plain\":%.3f,\"spec_speedup\":%.4f,"
               "\"acceptance\":%.4f,\"draft_n\":%lld,\"draft_n_accepted\":%lld,\"identical\":%s}\n",
               model, in->device, how, np, n, conc, spec, plain, spec / plain, acc, dr, ac, identical ? "true" : "false");
    else {
        printf("model:        %s (%s), %s precision\n", model, in->device, fast ? "production" : "reference");
        printf("speculation:  %s\n", how);
        printf("prompt:       %d tokens; %d rows x %d tokens, greedy (past end-of-sequence)\n", np, conc, n);
        printf("decode:       %.2f tok/s speculative, %.2f tok/s plain (interleaved, 2 runs each) -> %.2fx\n", spec,
               plain, spec / plain);
        printf("drafts:       %lld drafted, %lld accepted (%.1f%%)\n", dr, ac, 100 * acc);
        printf("output:       %s\n", identical ? "identical tokens" : "DIFFERENT TOKENS (a bug)");
    }
    if (!identical) rc = 1;
done:
    osp_spec_free(sp);
    osp_session_free(s);
    osp_model_free(draft);
    osp_tokenizer_free(tok);
    osp_model_free(m);
    if (prompt) osp_free(ids);
    else free(ids);
    free(ta), free(tb);
    return rc;
}
