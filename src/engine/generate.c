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
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "engine/sampler.h"
#include "grammar/grammar.h"
#include "model/model.h"
#include "text/detok.h"
#include "text/stop.h"
#include "text/tokenizer.h"
#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

/* A grammar's masked logits (-inf) make the sampler's exponentials of them subnormal (its exp clamps rather than
 * reaching 0), which x86 computes in microcode, many times slower than the rest of the pass. While a grammar's
 * stream samples, its thread flushes them to zero (FTZ and DAZ in MXCSR, restored after): probabilities below
 * the smallest normal float are 0, and other streams' numbers are untouched. */
static unsigned flush_subnormals(int on) {
#if defined(__x86_64__) || defined(__i386__)
    unsigned csr = _mm_getcsr();
    if (on) _mm_setcsr(csr | 0x8040);
    return csr;
#else
    (void)on;
    return 0;
#endif
}

static void restore_subnormals(int on, unsigned csr) {
#if defined(__x86_64__) || defined(__i386__)
    if (on) _mm_setcsr(csr);
#else
    (void)on, (void)csr;
#endif
}

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

/* One generation's state, apart from any session. */
struct osp_stream {
    osp_gen_params p;          /* arrays referenced, not copied (the caller keeps them) */
    osp_gen_cb cb;
    void *user;
    int32_t V, ctx;
    osp_sampler *sampler;
    osp_detok *detok;
    osp_stop *stop;
    int32_t *hist;
    int64_t nh;
    float *lp;                 /* logprobs (only with on_logprob) */
    float *pbuf, *rbuf;        /* speculative verification: the target's distribution, the residual [V] */
    int32_t *top, *top_scratch;
    float *top_lp;
    uint32_t *allowed;         /* with a grammar: the tokens it allows now, a bitset [ceil(V / 32)] */
    int g_on;                  /* the grammar holds now (always, without a trigger) */
    int g_n;                   /* commits to it since it began to hold (a trigger's grammar is rolled back) */
    size_t trig_have;          /* bytes of the trigger matched at the text's end */
    int mask_ready;            /* allowed holds the mask for the next token (osp_stream_mask_ahead) */
    int64_t n_allowed;
    osp_gen_stats st;
    double t0, t_first;
    int over;
};

void osp_stream_free(osp_stream *g) {
    if (!g) return;
    osp_sampler_free(g->sampler);
    osp_detok_free(g->detok);
    osp_stop_free(g->stop);
    free(g->hist);
    free(g->lp);
    free(g->pbuf);
    free(g->rbuf);
    free(g->top);
    free(g->top_scratch);
    free(g->top_lp);
    free(g->allowed);
    free(g);
}

static int is_eos(const osp_gen_params *p, int32_t t) {
    for (int32_t i = 0; i < p->n_eos; i++)
        if (p->eos[i] == t) return 1;
    return 0;
}

osp_status osp_stream_new(const osp_model *m, const osp_tokenizer *tok, const int32_t *prompt, int32_t n_prompt,
                          int32_t max_ctx, const osp_gen_params *p, osp_gen_cb cb, void *user, osp_stream **out) {
    *out = NULL;
    int32_t V = osp_model_get_info(m)->vocab;
    if (n_prompt <= 0) return osp_err(OSP_ERR_INVALID, "empty prompt");
    if (max_ctx <= 0) return osp_err(OSP_ERR_INVALID, "a stream needs a context");
    osp_stream *g = calloc(1, sizeof *g);
    if (!g) return osp_err(OSP_ERR_NOMEM, "out of memory");
    g->p = *p;
    g->cb = cb;
    g->user = user;
    g->V = V;
    g->ctx = max_ctx;
    osp_status rc = osp_sampler_new(&p->sampler, V, &g->sampler);
    if (rc == OSP_OK && tok) rc = osp_detok_new(tok, p->skip_special, &g->detok);
    if (rc == OSP_OK) rc = osp_stop_new(p->stop, p->n_stop, &g->stop);
    if (rc == OSP_OK && !(g->hist = malloc(sizeof(int32_t) * ((size_t)n_prompt + max_ctx + 1))))
        rc = osp_err(OSP_ERR_NOMEM, "out of memory");
    if (rc == OSP_OK && p->on_logprob) {
        if (p->top_logprobs < 0 || p->top_logprobs > 20 || p->top_logprobs > V)
            rc = osp_err(OSP_ERR_INVALID, "top_logprobs must be in [0, 20], got %d", p->top_logprobs);
        g->lp = malloc(sizeof(float) * V);
        g->top = malloc(sizeof(int32_t) * 21);
        g->top_lp = malloc(sizeof(float) * 21);
        g->top_scratch = malloc(sizeof(int32_t) * V);
        if (rc == OSP_OK && (!g->lp || !g->top || !g->top_lp || !g->top_scratch))
            rc = osp_err(OSP_ERR_NOMEM, "out of memory");
    }
    if (rc == OSP_OK && p->grammar && !(g->allowed = malloc(sizeof(uint32_t) * (((size_t)V + 31) / 32))))
        rc = osp_err(OSP_ERR_NOMEM, "out of memory");
    if (rc != OSP_OK) {
        osp_stream_free(g);
        return rc;
    }
    g->g_on = p->grammar && !(p->grammar_trigger && *p->grammar_trigger);
    memcpy(g->hist, prompt, sizeof(int32_t) * n_prompt);
    g->nh = n_prompt;
    g->st.n_prompt = n_prompt;
    g->st.finish = OSP_FINISH_LENGTH;
    g->t0 = osp_now_s();
    *out = g;
    return OSP_OK;
}

const osp_gen_stats *osp_stream_stats(const osp_stream *g) { return &g->st; }

void osp_stream_set_cached(osp_stream *g, int32_t n) { g->st.n_cached = n < 0 ? 0 : n > g->st.n_prompt ? g->st.n_prompt : n; }

const int32_t *osp_stream_tokens(const osp_stream *g, int32_t *n) {
    *n = g->nh;
    return g->hist;
}

/* Hand out what the detokenizer and the stop matcher still hold (the end
 * of a stream that was not cut by a stop string or cancelled). */
static void stream_flush(osp_stream *g) {
    const char *text, *emit = "";
    size_t len, emit_len = 0;
    int stopped = 0;
    if (g->detok && osp_detok_flush(g->detok, &text, &len) == OSP_OK && len) {
        stopped = osp_stop_feed(g->stop, text, len, &emit, &emit_len);
        if (g->cb && emit_len) g->cb(g->user, -1, emit, emit_len);
        if (stopped) g->st.finish = OSP_FINISH_STOP;
    }
    if (!stopped) {
        osp_stop_flush(g->stop, &emit, &emit_len);
        if (g->cb && emit_len) g->cb(g->user, -1, emit, emit_len);
    }
}

static void stream_end(osp_stream *g, int flush) {
    if (flush) stream_flush(g);
    g->over = 1;
    double t2 = osp_now_s();
    osp_gen_stats *st = &g->st;
    st->ttft_s = st->n_generated ? g->t_first - g->t0 : 0;
    st->decode_tok_s =
        st->n_generated > 1 ? (st->n_generated - 1) / (t2 - g->t_first > 1e-9 ? t2 - g->t_first : 1e-9) : 0;
}

/* A trigger's grammar begins where the text writes the trigger, with the bytes after it in the same piece. If
 * the grammar refuses them the text is not what it constrains: it waits for the trigger again. */
static void watch_trigger(osp_stream *g, const char *text, size_t len) {
    const char *t = g->p.grammar_trigger;
    size_t tl = strlen(t);
    for (size_t i = 0; i < len; i++) {
        size_t k = g->trig_have;
        for (;;) { /* the longest prefix of the trigger that ends here (as in Knuth-Morris-Pratt) */
            if (t[k] == text[i]) {
                k++;
                break;
            }
            if (k == 0) break;
            size_t j = k - 1;
            while (j > 0 && memcmp(t, t + k - j, j)) j--;
            k = j;
        }
        g->trig_have = k;
        if (k < tl) continue;
        g->trig_have = 0;
        g->g_n = 0;
        if (i + 1 < len && !osp_grammar_matcher_commit_bytes(g->p.grammar, text + i + 1, len - i - 1)) continue;
        g->g_n = i + 1 < len;
        g->g_on = 1;
        g->mask_ready = 0;
        return;
    }
}

/* A sampled token's way out: history, eos, logprobs (g->lp holds its
 * position's), text, stop strings, limits. Returns 1 with *next = the token
 * when the stream goes on. */
static int emit(osp_stream *g, int32_t tok_id, int32_t row_pos, int32_t *next, osp_status *rc, double tl) {
    osp_gen_stats *st = &g->st;
    st->n_generated++;
    g->hist[g->nh++] = tok_id;
    if (is_eos(&g->p, tok_id)) {
        st->finish = OSP_FINISH_STOP;
        stream_end(g, 1);
        st->loop_s += osp_now_s() - tl;
        return 0;
    }
    if (g->p.on_logprob) {
        int32_t k = g->p.top_logprobs;
        if (k > 0) osp_top_k_indices(g->lp, g->V, k, g->top, g->top_scratch);
        /* a grammar leaves tokens at -inf, which JSON cannot carry: OpenAI's floor instead */
        for (int32_t i = 0; i < k; i++) g->top_lp[i] = g->lp[g->top[i]] > -9999.0f ? g->lp[g->top[i]] : -9999.0f;
        g->p.on_logprob(g->p.logprob_user, tok_id, g->lp[tok_id] > -9999.0f ? g->lp[tok_id] : -9999.0f, g->top,
                        g->top_lp, k);
    }
    const char *text = "", *emit;
    size_t len = 0, emit_len;
    if (g->detok && (*rc = osp_detok_push(g->detok, tok_id, &text, &len)) != OSP_OK) {
        stream_end(g, 0);
        return 0;
    }
    if (g->p.grammar && !g->g_on && g->p.grammar_trigger) watch_trigger(g, text, len);
    int stopped = osp_stop_feed(g->stop, text, len, &emit, &emit_len), more = 0;
    if (g->cb && g->cb(g->user, tok_id, emit, emit_len)) {
        st->finish = OSP_FINISH_CANCELLED;
        stream_end(g, 0);
    } else if (stopped) {
        st->finish = OSP_FINISH_STOP;
        stream_end(g, 0);
    } else if ((g->p.max_tokens > 0 && st->n_generated >= g->p.max_tokens) || row_pos >= g->ctx) {
        st->finish = OSP_FINISH_LENGTH;
        stream_end(g, 1);
    } else {
        *next = tok_id;
        more = 1;
    }
    st->loop_s += osp_now_s() - tl;
    return more;
}

static void first_token_time(osp_stream *g, double tl) {
    osp_gen_stats *st = &g->st;
    if (st->n_generated == 0) {
        st->prefill_tok_s = (st->n_prompt - st->n_cached) / (tl - g->t0 > 1e-9 ? tl - g->t0 : 1e-9);
        g->t_first = tl;
    }
}

/* The grammar's allowed tokens now, into g->allowed (n_allowed of them): the eos tokens only where it accepts
 * (all of them: a model may end a turn with any). A trigger's grammar that is complete lets go instead (rolled
 * back to its start, it waits for the trigger again: g_on = 0). */
static void grammar_bits(osp_stream *g) {
    size_t words = ((size_t)g->V + 31) / 32;
    memset(g->allowed, 0, sizeof(uint32_t) * words);
    osp_grammar_matcher_mask(g->p.grammar, g->allowed);
    int accepting = osp_grammar_matcher_accepting(g->p.grammar);
    int64_t n_set = 0, n_eos = 0;
    for (int32_t i = 0; i < g->p.n_eos; i++) {
        int32_t e = g->p.eos[i];
        if (e < 0 || e >= g->V) continue;
        if (accepting) g->allowed[e >> 5] |= 1u << (e & 31);
        else g->allowed[e >> 5] &= ~(1u << (e & 31));
        n_eos += accepting;
    }
    for (size_t w = 0; w < words; w++) n_set += __builtin_popcount(g->allowed[w]);
    g->n_allowed = n_set;
    if (g->p.grammar_trigger && accepting && n_set <= n_eos) {
        osp_grammar_matcher_rollback(g->p.grammar, g->g_n);
        g->g_n = 0, g->g_on = 0;
    }
}

void osp_stream_mask_ahead(osp_stream *g) {
    if (g->over || !g->p.grammar || !g->g_on || g->mask_ready) return;
    grammar_bits(g);
    g->mask_ready = g->g_on; /* (a trigger's grammar that let go has no mask for the next token) */
}

/* The grammar's mask on the logits (computed ahead, or now): what it does not allow goes to -inf. 0 when it
 * allows nothing (a broken invariant: a live parse can always go on or end). */
static int grammar_mask(osp_stream *g, float *logits) {
    if (!g->mask_ready) grammar_bits(g);
    g->mask_ready = 0;
    if (!g->g_on) return 1; /* a trigger's grammar let go */
    size_t words = ((size_t)g->V + 31) / 32;
    for (size_t w = 0; w < words; w++) {
        uint32_t b = g->allowed[w];
        if (b == 0xffffffffu) continue;
        int32_t t0 = (int32_t)w * 32, n = g->V - t0 < 32 ? g->V - t0 : 32;
        for (int32_t k = 0; k < n; k++)
            if (!(b >> k & 1)) logits[t0 + k] = -INFINITY;
    }
    return g->n_allowed > 0;
}

/* The sampled token into the grammar (eos ends the stream: nothing to commit). 0 when it refuses it. */
static int grammar_commit(osp_stream *g, int32_t tok_id) {
    if (!g->p.grammar || !g->g_on || is_eos(&g->p, tok_id)) return 1;
    int ok = osp_grammar_matcher_commit(g->p.grammar, tok_id);
    g->g_n += ok;
    return ok;
}

int osp_stream_next(osp_stream *g, float *logits, int32_t row_pos, int32_t *next, osp_status *rc) {
    *rc = OSP_OK;
    if (g->over) return 0;
    double tl = osp_now_s();
    first_token_time(g, tl);
    if (g->p.grammar && g->g_on && !grammar_mask(g, logits)) {
        *rc = osp_err(OSP_ERR_INTERNAL, "structured output: the grammar allows no token here");
        stream_end(g, 0);
        return 0;
    }
    int held = g->p.grammar && g->g_on;
    unsigned csr = flush_subnormals(held);
    int32_t tok_id = osp_sampler_sample(g->sampler, logits, g->hist, g->nh, g->lp);
    restore_subnormals(held, csr);
    if (!grammar_commit(g, tok_id)) {
        *rc = osp_err(OSP_ERR_INTERNAL, "structured output: the grammar refused the sampled token %d", tok_id);
        stream_end(g, 0);
        return 0;
    }
    return emit(g, tok_id, row_pos, next, rc, tl);
}

int osp_stream_takes_id(const osp_stream *g) {
    return !g->p.on_logprob && !g->p.grammar && osp_sampler_is_argmax(&g->p.sampler);
}

int osp_stream_next_id(osp_stream *g, int32_t tok_id, int32_t row_pos, int32_t *next, osp_status *rc) {
    *rc = OSP_OK;
    if (g->over) return 0;
    double tl = osp_now_s();
    first_token_time(g, tl);
    if (!grammar_commit(g, tok_id)) { /* (a grammar's stream takes no ids: a caller's mistake) */
        *rc = osp_err(OSP_ERR_INVALID, "structured output: token %d is outside the grammar", tok_id);
        stream_end(g, 0);
        return 0;
    }
    return emit(g, tok_id, row_pos, next, rc, tl);
}

int osp_stream_greedy(const osp_stream *g) { return g->p.sampler.temperature == 0; }

const osp_gen_params *osp_stream_params(const osp_stream *g) { return &g->p; }

int osp_stream_can_speculate(const osp_stream *g) { return !(g->p.sampler.xtc_probability > 0) && !g->p.grammar; }

int osp_stream_verify(osp_stream *g, float *logits, const int32_t *draft, int32_t K, const float *q, int32_t row_pos0,
                      int32_t *n_keep, int32_t *next, osp_status *rc) {
    *rc = OSP_OK;
    *n_keep = 0;
    if (g->over) return 0;
    int32_t V = g->V;
    int greedy = g->p.sampler.temperature == 0;
    if (!greedy && (!g->pbuf || !g->rbuf)) {
        free(g->pbuf), free(g->rbuf);
        g->pbuf = malloc(sizeof(float) * V), g->rbuf = malloc(sizeof(float) * V);
        if (!g->pbuf || !g->rbuf) {
            *rc = osp_err(OSP_ERR_NOMEM, "out of memory");
            stream_end(g, 0);
            return 0;
        }
    }
    for (int32_t i = 0; i <= K; i++) {
        double tl = osp_now_s();
        first_token_time(g, tl);
        float *l = logits + (int64_t)i * V;
        int32_t x;
        int accepted = 0;
        if (greedy) { /* exactly the plain path's choice: the same logits, history and processors */
            x = osp_sampler_sample(g->sampler, l, g->hist, g->nh, g->lp);
            accepted = i < K && x == draft[i];
        } else if (osp_sampler_dist(g->sampler, l, g->hist, g->nh, g->pbuf, g->lp) != 0) {
            *rc = osp_err(OSP_ERR_INVALID, "speculative decoding cannot verify XTC sampling");
            stream_end(g, 0);
            return 0;
        } else if (i < K) { /* accept the draft with min(1, p/q), else draw from max(0, p - q) */
            int32_t d = draft[i];
            float qd = q ? q[(int64_t)i * V + d] : 1.0f, pd = g->pbuf[d];
            double u = osp_sampler_uniform(g->sampler);
            if (qd > 0 && u * qd < pd) {
                x = d, accepted = 1;
            } else {
                const float *qi = q ? q + (int64_t)i * V : NULL;
                double mass = 0;
                for (int32_t t = 0; t < V; t++) {
                    float r = g->pbuf[t] - (qi ? qi[t] : (t == d ? 1.0f : 0.0f));
                    mass += g->rbuf[t] = r > 0 ? r : 0;
                }
                x = mass > 0 ? osp_sampler_draw(g->sampler, g->rbuf) : osp_sampler_draw(g->sampler, g->pbuf);
            }
        } else {
            x = osp_sampler_draw(g->sampler, g->pbuf);
        }
        if (i < K) g->st.n_draft++, g->st.n_draft_accepted += accepted;
        int more = emit(g, x, row_pos0 + i + 1, next, rc, tl);
        *n_keep = i + 1;
        if (!more || !accepted) return more;
    }
    return 0; /* not reached: position K never accepts */
}

void osp_stream_cancel(osp_stream *g) {
    if (g->over) return;
    g->st.finish = OSP_FINISH_CANCELLED;
    stream_end(g, 0);
}

osp_status osp_generate(osp_session *s, const osp_tokenizer *tok, const int32_t *prompt, int32_t n_prompt,
                        const osp_gen_params *p, osp_gen_cb cb, void *user, osp_gen_stats *st) {
    int32_t V = osp_model_get_info(s->m)->vocab, ctx = s->kv->max_ctx, pos0 = osp_session_row_pos(s, 0);
    memset(st, 0, sizeof *st);
    if (s->kv->n_rows != 1) return osp_err(OSP_ERR_INVALID, "osp_generate needs a one-row session");
    if (n_prompt <= 0) return osp_err(OSP_ERR_INVALID, "empty prompt");
    if ((int64_t)pos0 + n_prompt >= ctx)
        return osp_err(OSP_ERR_RANGE, "the prompt (%d tokens) does not fit the context of %d tokens (%d in use)",
                       n_prompt, ctx, pos0);
    float *logits = malloc(sizeof(float) * V);
    if (!logits) return osp_err(OSP_ERR_NOMEM, "out of memory");
    osp_stream *g;
    osp_status rc = osp_stream_new(s->m, tok, prompt, n_prompt, ctx, p, cb, user, &g);
    if (rc != OSP_OK) {
        free(logits);
        return rc;
    }
    /* greedy without processors: the backend takes each token where the logits are (on a GPU, nothing else
     * comes back) */
    int by_id = osp_stream_takes_id(g);
    int32_t next, id = 0, row = 0;
    rc = by_id ? osp_forward_rows_ids(s, &row, 1, prompt, n_prompt, NULL, logits, &id)
               : osp_forward(s, prompt, n_prompt, 0, logits);
    double forward_s = 0;
    osp_status src = OSP_OK;
    if (by_id && osp_session_chain_queues(s)) {
        /* on a GPU, a chain: the step fed with a token is queued before that token reaches the host, so the GPU
         * does not wait for the stream's work (the step after the last token is undone) */
        int32_t pos = osp_session_row_pos(s, 0); /* the row's, without a step in flight */
        int chained = 0;
        while (rc == OSP_OK && osp_stream_next_id(g, id, pos, &next, &src)) {
            double tf = osp_now_s();
            if (!chained) {
                rc = osp_forward_rows_chain(s, &row, 1, &next, logits, NULL);
                chained = rc == OSP_OK;
            }
            if (rc == OSP_OK) rc = osp_forward_rows_chain(s, &row, 1, NULL, logits, &id);
            pos++;
            forward_s += osp_now_s() - tf;
        }
        osp_status e = osp_forward_chain_end(s, 0, NULL, NULL);
        if (rc == OSP_OK) rc = e;
    } else {
        while (rc == OSP_OK && (by_id ? osp_stream_next_id(g, id, osp_session_row_pos(s, 0), &next, &src)
                                      : osp_stream_next(g, logits, osp_session_row_pos(s, 0), &next, &src))) {
            double tf = osp_now_s();
            rc = by_id ? osp_forward_rows_ids(s, &row, 1, &next, 1, NULL, logits, &id)
                       : osp_forward(s, &next, 1, 0, logits);
            forward_s += osp_now_s() - tf;
        }
    }
    if (rc == OSP_OK) rc = src;
    *st = g->st;
    st->forward_s = forward_s;
    osp_stream_free(g);
    free(logits);
    return rc;
}
