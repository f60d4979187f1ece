/* engine/generate: the single-stream generation loop.
 *
 *   prompt ─► prefill (osp_forward, chunked inside) ─► logits
 *   loop: sample ─► eos? ─► detokenize (UTF-8 safe) ─► stop strings ─► callback
 *         ─► forward one token
 *
 * Everything per stream is allocated before the loop (logits, history,
 * sampler scratch); the detokenizer and stop matcher only grow small
 * buffers when text is held back.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "engine/sampler.h"
#include "model/model.h"
#include "text/detok.h"
#include "text/stop.h"
#include "text/tokenizer.h"

static void add_eos(int32_t *buf, int32_t *n, int32_t id) {
    if (id < 0 || *n >= 32) return;
    for (int32_t i = 0; i < *n; i++)
        if (buf[i] == id) return;
    buf[(*n)++] = id;
}

osp_status osp_gen_defaults(const osp_model *m, const osp_tokenizer *tok, osp_gen_params *p, int32_t *eos_buf) {
    memset(p, 0, sizeof *p);
    p->sampler = osp_sampler_defaults();
    p->skip_special = 1;
    int32_t n = 0;
    const osp_model_info *in = osp_model_get_info(m);
    for (int32_t i = 0; i < in->n_eos; i++) add_eos(eos_buf, &n, in->eos_ids[i]);
    if (tok) add_eos(eos_buf, &n, osp_tokenizer_get_info(tok)->eos_id);
    char path[4200];
    snprintf(path, sizeof path, "%s/generation_config.json", in->dir);
    json_t *g = json_load_file(path, 0, NULL);
    if (g) {
        json_t *v;
        if (json_is_number(v = json_object_get(g, "temperature"))) p->sampler.temperature = (float)json_number_value(v);
        if (json_is_number(v = json_object_get(g, "top_p"))) p->sampler.top_p = (float)json_number_value(v);
        if (json_is_integer(v = json_object_get(g, "top_k"))) p->sampler.top_k = (int32_t)json_integer_value(v);
        if (json_is_number(v = json_object_get(g, "min_p"))) p->sampler.min_p = (float)json_number_value(v);
        if (json_is_number(v = json_object_get(g, "repetition_penalty")))
            p->sampler.repetition_penalty = (float)json_number_value(v);
        if (json_is_false(json_object_get(g, "do_sample"))) p->sampler.temperature = 0;
        v = json_object_get(g, "eos_token_id");
        if (json_is_integer(v)) add_eos(eos_buf, &n, (int32_t)json_integer_value(v));
        size_t i;
        json_t *e;
        if (json_is_array(v)) json_array_foreach(v, i, e) if (json_is_integer(e)) add_eos(eos_buf, &n, (int32_t)json_integer_value(e));
        json_decref(g);
    }
    p->eos = eos_buf;
    p->n_eos = n;
    return OSP_OK;
}

typedef struct gen_state {
    osp_sampler *sampler;
    osp_detok *detok;
    osp_stop *stop;
    float *logits;
    int32_t *hist;
    float *lp;       /* logprobs (only with on_logprob) */
    int32_t *top, *top_scratch;
    float *top_lp;
} gen_state;

static void gen_free(gen_state *g) {
    osp_sampler_free(g->sampler);
    osp_detok_free(g->detok);
    osp_stop_free(g->stop);
    free(g->logits);
    free(g->hist);
    free(g->lp);
    free(g->top);
    free(g->top_scratch);
    free(g->top_lp);
}

static int is_eos(const osp_gen_params *p, int32_t t) {
    for (int32_t i = 0; i < p->n_eos; i++)
        if (p->eos[i] == t) return 1;
    return 0;
}

osp_status osp_generate(osp_session *s, const osp_tokenizer *tok, const int32_t *prompt, int32_t n_prompt,
                        const osp_gen_params *p, osp_gen_cb cb, void *user, osp_gen_stats *st) {
    const osp_model_info *in = osp_model_get_info(s->m);
    int32_t V = in->vocab, ctx = s->kv->max_ctx, pos0 = osp_session_row_pos(s, 0);
    if (s->kv->n_rows != 1) return osp_err(OSP_ERR_INVALID, "osp_generate needs a one-row session");
    if (n_prompt <= 0) return osp_err(OSP_ERR_INVALID, "empty prompt");
    if ((int64_t)pos0 + n_prompt >= ctx)
        return osp_err(OSP_ERR_RANGE, "the prompt (%d tokens) does not fit the context of %d tokens (%d in use)",
                       n_prompt, ctx, pos0);
    memset(st, 0, sizeof *st);
    gen_state g = {0};
    osp_status rc = osp_sampler_new(&p->sampler, V, &g.sampler);
    if (rc == OSP_OK && tok) rc = osp_detok_new(tok, p->skip_special, &g.detok);
    if (rc == OSP_OK) rc = osp_stop_new(p->stop, p->n_stop, &g.stop);
    if (rc == OSP_OK) {
        g.logits = malloc(sizeof(float) * V);
        g.hist = malloc(sizeof(int32_t) * ((size_t)n_prompt + ctx + 1));
        if (!g.logits || !g.hist) rc = osp_err(OSP_ERR_NOMEM, "out of memory");
    }
    if (rc == OSP_OK && p->on_logprob) {
        if (p->top_logprobs < 0 || p->top_logprobs > 20 || p->top_logprobs > V)
            rc = osp_err(OSP_ERR_INVALID, "top_logprobs must be in [0, 20], got %d", p->top_logprobs);
        g.lp = malloc(sizeof(float) * V);
        g.top = malloc(sizeof(int32_t) * 21);
        g.top_lp = malloc(sizeof(float) * 21);
        g.top_scratch = malloc(sizeof(int32_t) * V);
        if (rc == OSP_OK && (!g.lp || !g.top || !g.top_lp || !g.top_scratch))
            rc = osp_err(OSP_ERR_NOMEM, "out of memory");
    }
    if (rc != OSP_OK) {
        gen_free(&g);
        return rc;
    }
    memcpy(g.hist, prompt, sizeof(int32_t) * n_prompt);
    int64_t nh = n_prompt;
    double t0 = osp_now_s();
    rc = osp_forward(s, prompt, n_prompt, 0, g.logits);
    double t1 = osp_now_s(), t_first = 0;
    st->n_prompt = n_prompt;
    st->prefill_tok_s = n_prompt / (t1 - t0 > 1e-9 ? t1 - t0 : 1e-9);
    st->finish = OSP_FINISH_LENGTH;
    int done = 0;
    const char *text;
    size_t len;
    double tl = osp_now_s(); /* start of this step's loop work */
    while (rc == OSP_OK && !done) {
        int32_t tok_id = osp_sampler_sample(g.sampler, g.logits, g.hist, nh, g.lp);
        if (st->n_generated == 0) t_first = osp_now_s();
        st->n_generated++;
        g.hist[nh++] = tok_id;
        if (is_eos(p, tok_id)) {
            st->finish = OSP_FINISH_STOP;
            break;
        }
        if (p->on_logprob) {
            int32_t k = p->top_logprobs;
            if (k > 0) osp_top_k_indices(g.lp, V, k, g.top, g.top_scratch);
            for (int32_t i = 0; i < k; i++) g.top_lp[i] = g.lp[g.top[i]];
            p->on_logprob(p->logprob_user, tok_id, g.lp[tok_id], g.top, g.top_lp, k);
        }
        text = "";
        len = 0;
        if (g.detok && (rc = osp_detok_push(g.detok, tok_id, &text, &len)) != OSP_OK) break;
        const char *emit;
        size_t emit_len;
        int stopped = osp_stop_feed(g.stop, text, len, &emit, &emit_len);
        if (cb && cb(user, tok_id, emit, emit_len)) {
            st->finish = OSP_FINISH_CANCELLED;
            break;
        }
        if (stopped) {
            st->finish = OSP_FINISH_STOP;
            done = 1;
            break;
        }
        if ((p->max_tokens > 0 && st->n_generated >= p->max_tokens) || osp_session_row_pos(s, 0) >= ctx) {
            st->finish = OSP_FINISH_LENGTH;
            break;
        }
        double tf = osp_now_s();
        st->loop_s += tf - tl;
        rc = osp_forward(s, &tok_id, 1, 0, g.logits);
        tl = osp_now_s();
        st->forward_s += tl - tf;
    }
    st->loop_s += osp_now_s() - tl;
    if (rc == OSP_OK && !done && st->finish != OSP_FINISH_CANCELLED) { /* the text still held back */
        const char *emit = "";
        size_t emit_len = 0;
        int stopped = 0;
        if (g.detok && osp_detok_flush(g.detok, &text, &len) == OSP_OK && len) {
            stopped = osp_stop_feed(g.stop, text, len, &emit, &emit_len);
            if (cb && emit_len) cb(user, -1, emit, emit_len);
            if (stopped) st->finish = OSP_FINISH_STOP;
        }
        if (!stopped) {
            osp_stop_flush(g.stop, &emit, &emit_len);
            if (cb && emit_len) cb(user, -1, emit, emit_len);
        }
    }
    double t2 = osp_now_s();
    st->ttft_s = st->n_generated ? t_first - t0 : 0;
    st->decode_tok_s = st->n_generated > 1 ? (st->n_generated - 1) / (t2 - t_first > 1e-9 ? t2 - t_first : 1e-9) : 0;
    gen_free(&g);
    return rc;
}
