/* speech/transcribe.c: decoding windows and long audio, as openai-whisper's
 * DecodingTask and transcribe() do (see transcribe.h). One osp_whisper_state
 * and one scratch are allocated per call; the token loop allocates nothing. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "audio/audio.h"
#include "transcribe.h"

#define N_FRAMES OSP_MEL_FRAMES
#define TIME_PRECISION 0.02 /* seconds per timestamp step */
#define INPUT_STRIDE 2      /* mel frames per encoder position */

void osp_transcribe_defaults(osp_transcribe_opts *o) {
    memset(o, 0, sizeof *o);
    o->timestamps = 1;
    o->best_of = 5;
    o->beam_size = 5;
    o->condition_on_previous_text = 1;
    o->seed = 0x5eed;
    o->fb.n_temps = 6;
    for (int i = 0; i < 6; i++) o->fb.temps[i] = 0.2f * i;
    o->fb.compression_ratio_threshold = 2.4;
    o->fb.logprob_threshold = -1.0;
    o->fb.no_speech_threshold = 0.6;
}

osp_status osp_whisper_fallback(const osp_fallback_opts *o, osp_wdecode_fn fn, void *ctx, osp_wresult *r) {
    if (o->n_temps < 1) return osp_err(OSP_ERR_INVALID, "transcribe: no temperature to decode at");
    for (int i = 0; i < o->n_temps; i++) {
        OSP_TRY(fn(ctx, o->temps[i], r));
        r->temperature = o->temps[i];
        int fallback = 0;
        if (o->compression_ratio_threshold > 0 && r->compression_ratio > o->compression_ratio_threshold) fallback = 1;
        if (!isnan(o->logprob_threshold) && r->avg_logprob < o->logprob_threshold) fallback = 1;
        if (!isnan(o->no_speech_threshold) && r->no_speech_prob > o->no_speech_threshold &&
            !isnan(o->logprob_threshold) && r->avg_logprob < o->logprob_threshold)
            fallback = 0; /* silence: no better transcript to find */
        if (!fallback) break;
    }
    return OSP_OK;
}

int32_t osp_whisper_split(const osp_wtokens *w, const int32_t *tokens, int32_t n, int32_t segment_frames,
                          int32_t *ranges, double *times, int32_t *n_seg) {
    const int32_t tb = w->ts_begin;
    *n_seg = 0;
    int single_end = n >= 2 && tokens[n - 2] < tb && tokens[n - 1] >= tb;
    if (n == 1 && tokens[0] >= tb) single_end = 0;
    int32_t last = 0, n_cons = 0;
    for (int32_t i = 1; i < n; i++) {
        if (!(tokens[i - 1] >= tb && tokens[i] >= tb)) continue;
        /* a segment ends between two consecutive timestamps */
        ranges[2 * *n_seg] = last;
        ranges[2 * *n_seg + 1] = i;
        times[2 * *n_seg] = (tokens[last] - tb) * TIME_PRECISION;
        times[2 * *n_seg + 1] = (tokens[i - 1] - tb) * TIME_PRECISION;
        (*n_seg)++;
        last = i;
        n_cons++;
    }
    if (n_cons) {
        if (single_end) {
            ranges[2 * *n_seg] = last;
            ranges[2 * *n_seg + 1] = n;
            times[2 * *n_seg] = (tokens[last] - tb) * TIME_PRECISION;
            times[2 * *n_seg + 1] = (tokens[n - 1] - tb) * TIME_PRECISION;
            (*n_seg)++;
            return segment_frames;
        }
        return (tokens[last - 1] - tb) * INPUT_STRIDE;
    }
    double duration = segment_frames * (double)OSP_MEL_HOP / OSP_AUDIO_RATE;
    int32_t last_ts = -1;
    for (int32_t i = 0; i < n; i++)
        if (tokens[i] >= tb) last_ts = tokens[i];
    if (last_ts >= 0 && last_ts != tb) duration = (last_ts - tb) * TIME_PRECISION;
    ranges[0] = 0;
    ranges[1] = n;
    times[0] = 0;
    times[1] = duration;
    *n_seg = 1;
    return segment_frames;
}

/* ---------------- one window ---------------- */

typedef struct wctx {
    const osp_whisper *m;
    const osp_tokenizer *tok;
    const osp_wtokens *w;
    osp_whisper_state *s;
    int timestamps, best_of;
    const int32_t *prefix; /* [<|startofprev|> prompt...] + sot sequence */
    int32_t n_prefix, n_prompt_part; /* tokens before <|startoftranscript|> */
    float *logits;   /* [vocab] */
    float *sot_logits; /* [n_sot, vocab] scratch for the first call */
    float *probs;      /* [vocab] sampling scratch */
    int32_t *seq;    /* [n_text_ctx] */
    uint64_t rng;
    int beam;          /* beam size at temperature 0 (<= 1: greedy) */
    int translate;
    float *blogits;    /* [beam, vocab] */
    struct beam *beams; /* [4 · beam + 1] */
    struct cand *cands; /* [beam · (beam + 1)] */
    int sample_len;    /* tokens a window at most */
} wctx;

static double next_uniform(uint64_t *s) {
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return (double)((*s * 0x2545f4914f6cdd1dull) >> 11) / 9007199254740992.0;
}

/* log of the softmax's normalizer of l[0..V): mx + log(sum exp(l - mx)); *arg the first argmax. */
static double log_norm(const float *l, int32_t V, int32_t *arg) {
    int32_t best = 0;
    for (int32_t j = 1; j < V; j++)
        if (l[j] > l[best]) best = j;
    double z = 0;
    const float mx = l[best];
    for (int32_t j = 0; j < V; j++) z += expf(l[j] - mx);
    if (arg) *arg = best;
    return mx + log(z);
}

/* A token drawn from softmax(l / temperature); p is scratch [V]. */
static int32_t sample(const float *l, int32_t V, int32_t best, float temperature, float *p, uint64_t *rng) {
    double z = 0;
    for (int32_t j = 0; j < V; j++) z += p[j] = expf((l[j] - l[best]) / temperature);
    double u = next_uniform(rng) * z, acc = 0;
    for (int32_t j = 0; j < V; j++) {
        acc += p[j];
        if (p[j] > 0 && acc >= u) return j;
    }
    return best;
}

/* One sample (or the greedy sequence) of a window already encoded. */
/* The prompt and the start sequence on row 0: c->logits holds the next
 * token's logits; r->no_speech_prob is set. */
static osp_status prefill(wctx *c, osp_wresult *r) {
    const int32_t V = osp_whisper_get_config(c->m)->vocab;
    OSP_TRY(osp_whisper_truncate(c->s, 0));
    if (c->n_prompt_part) OSP_TRY(osp_whisper_decode(c->s, c->prefix, c->n_prompt_part, NULL, NULL));
    int32_t n_sot = c->n_prefix - c->n_prompt_part;
    OSP_TRY(osp_whisper_decode(c->s, c->prefix + c->n_prompt_part, n_sot, c->sot_logits, c->logits));
    /* no_speech_prob at <|startoftranscript|> */
    r->no_speech_prob = exp(c->sot_logits[c->w->no_speech] - log_norm(c->sot_logits, V, NULL));
    r->sum_logprob = 0;
    r->n_tokens = 0;
    return OSP_OK;
}

static osp_status finish(wctx *c, osp_wresult *r) {
    r->avg_logprob = r->sum_logprob / (r->n_tokens + 1);
    char *text;
    size_t len;
    int32_t nt = 0;
    for (int32_t i = 0; i < r->n_tokens; i++)
        if (r->tokens[i] < c->w->eot) c->seq[nt++] = r->tokens[i];
    OSP_TRY(osp_tokenizer_decode(c->tok, c->seq, nt, 0, &text, &len));
    const char *b = text; /* of the stripped text, as openai-whisper */
    while (*b == ' ' || *b == '\t' || *b == '\n' || *b == '\r') b++;
    size_t l = strlen(b);
    while (l && (b[l - 1] == ' ' || b[l - 1] == '\t' || b[l - 1] == '\n' || b[l - 1] == '\r')) l--;
    r->compression_ratio = osp_compression_ratio(b, l);
    osp_free(text);
    return OSP_OK;
}

static osp_status decode_once(wctx *c, float temperature, osp_wresult *r) {
    const osp_whisper_config *cfg = osp_whisper_get_config(c->m);
    const int32_t V = cfg->vocab;
    const osp_wtokens *w = c->w;
    OSP_TRY(prefill(c, r));
    memcpy(c->seq, c->prefix, sizeof(int32_t) * c->n_prefix);
    int32_t n = c->n_prefix;
    int ended = 0;
    for (int i = 0; i < c->sample_len; i++) {
        osp_whisper_filter_logits(w, c->timestamps, c->seq, n, c->n_prefix, c->logits);
        int32_t next;
        double lz = log_norm(c->logits, V, &next);
        if (temperature > 0) next = sample(c->logits, V, next, temperature, c->probs, &c->rng);
        r->sum_logprob += c->logits[next] - lz;
        if (next == w->eot) {
            ended = 1;
            break;
        }
        c->seq[n++] = next;
        r->tokens[r->n_tokens++] = next;
        if (n >= cfg->n_text_ctx) break;
        OSP_TRY(osp_whisper_decode(c->s, &next, 1, NULL, c->logits));
    }
    (void)ended;
    return finish(c, r);
}

/* ---------------- beam search (openai-whisper's BeamSearchDecoder, patience 1) ---------------- */

typedef struct beam {
    int32_t toks[OSP_WHISPER_SAMPLE_LEN + 1]; /* sampled tokens (a finished one ends with <|endoftext|>) */
    int32_t n, row, src;
    double lp;
} beam;

typedef struct cand {
    double lp;
    int32_t tok, src, order;
} cand;

static int cmp_cand(const void *a, const void *b) {
    const cand *x = a, *y = b;
    if (x->lp != y->lp) return x->lp > y->lp ? -1 : 1;
    return x->order - y->order; /* Python's stable sort: insertion order on ties */
}

static osp_status decode_beam(wctx *c, osp_wresult *r) {
    const osp_whisper_config *cfg = osp_whisper_get_config(c->m);
    const int32_t V = cfg->vocab, B = c->beam;
    const osp_wtokens *w = c->w;
    beam *cur = c->beams, *next = c->beams + B, *fin = c->beams + 2 * B;
    int32_t n_cur = 1, n_fin = 0;
    OSP_TRY(prefill(c, r));
    memcpy(c->blogits, c->logits, sizeof(float) * V);
    cur[0].n = 0;
    cur[0].row = 0;
    cur[0].lp = 0;
    for (int step = 0; step < c->sample_len; step++) {
        int32_t nc = 0;
        for (int32_t j = 0; j < n_cur; j++) {
            float *l = c->blogits + (int64_t)j * V;
            memcpy(c->seq, c->prefix, sizeof(int32_t) * c->n_prefix);
            memcpy(c->seq + c->n_prefix, cur[j].toks, sizeof(int32_t) * cur[j].n);
            osp_whisper_filter_logits(w, c->timestamps, c->seq, c->n_prefix + cur[j].n, c->n_prefix, l);
            double lz = log_norm(l, V, NULL);
            /* the beam_size + 1 likeliest tokens, best first */
            int32_t top[17], k = 0;
            for (int32_t t = 0; t < V; t++) {
                if (l[t] == -INFINITY || (k == B + 1 && l[t] <= l[top[k - 1]])) continue;
                int32_t at = k < B + 1 ? k++ : B;
                while (at > 0 && l[top[at - 1]] < l[t]) {
                    top[at] = top[at - 1];
                    at--;
                }
                top[at] = t;
            }
            for (int32_t i = 0; i < k; i++, nc++) c->cands[nc] = (cand){cur[j].lp + l[top[i]] - lz, top[i], j, nc};
        }
        qsort(c->cands, nc, sizeof *c->cands, cmp_cand);
        int32_t saved = 0, n_new_fin = 0;
        beam *newfin = c->beams + 3 * B; /* this step's finished, best first */
        for (int32_t i = 0; i < nc && saved < B; i++) {
            const cand *cd = &c->cands[i];
            beam *dst = cd->tok == w->eot ? (n_new_fin < B + 1 ? &newfin[n_new_fin++] : NULL) : &next[saved++];
            if (!dst) continue;
            memcpy(dst->toks, cur[cd->src].toks, sizeof(int32_t) * cur[cd->src].n);
            dst->n = cur[cd->src].n;
            dst->toks[dst->n++] = cd->tok;
            dst->lp = cd->lp;
            dst->src = cd->src;
        }
        for (int32_t i = 0; i < n_new_fin && n_fin < B; i++) fin[n_fin++] = newfin[i];
        if (n_fin >= B || saved == 0) break;
        /* rows: a beam continuing a source takes its row; further ones copy it into a free row */
        int32_t claimed[16] = {0}, free_rows[16], n_free = 0;
        for (int32_t i = 0; i < saved; i++) next[i].row = -1;
        for (int32_t i = 0; i < saved; i++)
            if (!claimed[next[i].src]) {
                claimed[next[i].src] = 1;
                next[i].row = cur[next[i].src].row;
            }
        int32_t used[64] = {0};
        for (int32_t i = 0; i < saved; i++)
            if (next[i].row >= 0) used[next[i].row] = 1;
        for (int32_t rr = 0; rr < B; rr++)
            if (!used[rr]) free_rows[n_free++] = rr;
        for (int32_t i = 0; i < saved; i++)
            if (next[i].row < 0) {
                next[i].row = free_rows[--n_free];
                OSP_TRY(osp_whisper_copy_row(c->s, next[i].row, cur[next[i].src].row));
            }
        if (c->n_prefix + next[0].n >= cfg->n_text_ctx) {
            memcpy(cur, next, sizeof *cur * saved);
            n_cur = saved;
            break;
        }
        int32_t rows[16], ids[16];
        for (int32_t i = 0; i < saved; i++) {
            rows[i] = next[i].row;
            ids[i] = next[i].toks[next[i].n - 1];
        }
        OSP_TRY(osp_whisper_decode_rows(c->s, rows, saved, ids, c->blogits));
        memcpy(cur, next, sizeof *cur * saved);
        n_cur = saved;
    }
    /* too few finished: the likeliest unfinished ones, as if ended */
    if (n_fin < B) {
        for (int32_t j = 0; j < n_cur; j++) c->cands[j] = (cand){cur[j].lp, 0, j, j};
        qsort(c->cands, n_cur, sizeof *c->cands, cmp_cand);
        for (int32_t j = 0; j < n_cur && n_fin < B; j++) fin[n_fin++] = cur[c->cands[j].src];
    }
    /* the best by sum logprob / length (text tokens, without <|endoftext|>) */
    int32_t best = -1;
    double best_score = -INFINITY;
    for (int32_t i = 0; i < n_fin; i++) {
        int32_t len = fin[i].n && fin[i].toks[fin[i].n - 1] == w->eot ? fin[i].n - 1 : fin[i].n;
        double sc = fin[i].lp / (len > 0 ? len : 1);
        if (best < 0 || sc > best_score) {
            best = i;
            best_score = sc;
        }
    }
    r->n_tokens = 0;
    for (int32_t i = 0; best >= 0 && i < fin[best].n && fin[best].toks[i] != w->eot; i++)
        r->tokens[r->n_tokens++] = fin[best].toks[i];
    r->sum_logprob = best >= 0 ? fin[best].lp : 0;
    return finish(c, r);
}

/* Greedy at 0; the best of best_of samples (sum logprob / length) above. */
static osp_status decode_at(void *p, float temperature, osp_wresult *r) {
    wctx *c = p;
    if (temperature <= 0 && c->beam > 1) return decode_beam(c, r);
    if (temperature <= 0 || c->best_of <= 1) return decode_once(c, temperature, r);
    osp_wresult *cand = osp_malloc(OSP_POOL_SCRATCH, sizeof *cand);
    if (!cand) return osp_err(OSP_ERR_NOMEM, "out of memory");
    double best = -INFINITY;
    osp_status rc = OSP_OK;
    for (int k = 0; k < c->best_of && rc == OSP_OK; k++) {
        rc = decode_once(c, temperature, cand);
        double score = cand->sum_logprob / (cand->n_tokens ? cand->n_tokens : 1);
        if (rc == OSP_OK && (k == 0 || score > best)) {
            best = score;
            *r = *cand;
        }
    }
    osp_free(cand);
    return rc;
}

/* ---------------- long audio ---------------- */

static void free_words(osp_word *wd, int32_t n) {
    for (int32_t i = 0; i < n; i++) osp_free(wd[i].text);
    osp_free(wd);
}

/* Add a segment (words, when given, become its own); an instantaneous one or
 * one without text is dropped, as openai-whisper clears them. */
static osp_status add_segment(osp_transcript *t, int32_t *cap, const osp_tokenizer *tok, const osp_wtokens *w,
                              const int32_t *toks, int32_t n, double start, double end, int32_t seek,
                              const osp_wresult *r, osp_word *words, int32_t n_words) {
    if (t->n_segs == *cap) {
        int32_t nc = *cap ? *cap * 2 : 16;
        osp_segment *ns = osp_calloc(OSP_POOL_MISC, sizeof *ns * nc);
        if (!ns) {
            free_words(words, n_words);
            return osp_err(OSP_ERR_NOMEM, "out of memory");
        }
        if (t->n_segs) memcpy(ns, t->segs, sizeof *ns * t->n_segs);
        osp_free(t->segs);
        t->segs = ns;
        *cap = nc;
    }
    osp_segment *s = &t->segs[t->n_segs];
    memset(s, 0, sizeof *s);
    int32_t *text_ids = osp_malloc(OSP_POOL_MISC, sizeof(int32_t) * (n + 1));
    s->tokens = osp_malloc(OSP_POOL_MISC, sizeof(int32_t) * (n + 1));
    if (!text_ids || !s->tokens) {
        osp_free(text_ids);
        osp_free(s->tokens);
        free_words(words, n_words);
        return osp_err(OSP_ERR_NOMEM, "out of memory");
    }
    int32_t nt = 0;
    for (int32_t i = 0; i < n; i++)
        if (toks[i] < w->eot) text_ids[nt++] = toks[i];
    size_t len;
    osp_status rc = osp_tokenizer_decode(tok, text_ids, nt, 0, &s->text, &len);
    osp_free(text_ids);
    if (rc != OSP_OK) {
        osp_free(s->tokens);
        free_words(words, n_words);
        return rc;
    }
    memcpy(s->tokens, toks, sizeof(int32_t) * n);
    s->words = words;
    s->n_words = n_words;
    s->n_tokens = n;
    s->id = t->n_segs;
    s->seek = seek;
    s->start = start;
    s->end = end;
    s->temperature = r->temperature;
    s->avg_logprob = r->avg_logprob;
    s->compression_ratio = r->compression_ratio;
    s->no_speech_prob = r->no_speech_prob;
    /* an instantaneous segment or one without text is dropped */
    int blank = 1;
    for (const char *p = s->text; *p; p++)
        if (*p != ' ' && *p != '\t' && *p != '\n') blank = 0;
    if (start == end || blank) {
        osp_free(s->text);
        osp_free(s->tokens);
        free_words(words, n_words);
        return OSP_OK;
    }
    t->n_segs++;
    return OSP_OK;
}

/* Word timestamps of one window (openai-whisper's add_word_timestamps):
 * the words of all its segments aligned at once, each segment's share (by
 * token count) given to it, segment times adjusted to their words.
 * seg_start/seg_end (absolute) are updated; seg_words[i] / seg_nw[i] receive
 * each segment's words (osp_malloc'd). */
static osp_status window_words(wctx *c, const osp_wresult *r, const int32_t *ranges, int32_t n_seg, int lang,
                               int32_t num_frames, double time_offset, double *seg_start, double *seg_end,
                               osp_word **seg_words, int32_t *seg_nw, double *last_speech) {
    const osp_wtokens *w = c->w;
    int32_t text[OSP_WHISPER_SAMPLE_LEN + 1], n_text = 0, per_seg[OSP_WHISPER_SAMPLE_LEN + 2];
    for (int32_t i = 0; i < n_seg; i++) {
        per_seg[i] = 0;
        seg_words[i] = NULL;
        seg_nw[i] = 0;
        for (int32_t k = ranges[2 * i]; k < ranges[2 * i + 1]; k++)
            if (r->tokens[k] < w->eot) {
                text[n_text++] = r->tokens[k];
                per_seg[i]++;
            }
    }
    if (!n_seg || !n_text) return OSP_OK;
    int32_t sot[3], n_sot = 0;
    sot[n_sot++] = w->sot;
    if (w->n_langs) {
        sot[n_sot++] = w->lang0 + lang;
        sot[n_sot++] = c->translate ? w->translate : w->transcribe;
    }
    const char *code = osp_whisper_lang_code(lang);
    int no_spaces = !strcmp(code, "zh") || !strcmp(code, "ja") || !strcmp(code, "th") || !strcmp(code, "lo") ||
                    !strcmp(code, "my") || !strcmp(code, "yue");
    osp_word *al = osp_calloc(OSP_POOL_SCRATCH, sizeof(osp_word) * (n_text + 2));
    if (!al) return osp_err(OSP_ERR_NOMEM, "out of memory");
    int32_t na = 0;
    osp_status rc = osp_whisper_align(c->s, c->m, c->tok, w, sot, n_sot, text, n_text, num_frames, no_spaces, al, &na);
    double maxd = 0, median = rc == OSP_OK ? osp_whisper_word_heuristics(al, na, &maxd) : 0;
    int32_t wi = 0;
    for (int32_t i = 0; i < n_seg && rc == OSP_OK; i++) {
        osp_word *ws = osp_calloc(OSP_POOL_MISC, sizeof(osp_word) * (na + 1));
        if (!ws) {
            rc = osp_err(OSP_ERR_NOMEM, "out of memory");
            break;
        }
        int32_t nw = 0, saved = 0;
        while (wi < na && saved < per_seg[i]) {
            osp_word *a = &al[wi];
            if (a->text && a->text[0]) {
                ws[nw] = *a;
                ws[nw].start = round((time_offset + a->start) * 100) / 100;
                ws[nw].end = round((time_offset + a->end) * 100) / 100;
                a->text = NULL;
                nw++;
            }
            saved += a->n_tok;
            wi++;
        }
        if (nw) {
            /* the first word after a pause no longer than twice the median */
            if (ws[0].end - *last_speech > median * 4 &&
                (ws[0].end - ws[0].start > maxd || (nw > 1 && ws[1].end - ws[0].start > maxd * 2))) {
                if (nw > 1 && ws[1].end - ws[1].start > maxd) {
                    double bd = ws[1].end / 2 > ws[1].end - maxd ? ws[1].end / 2 : ws[1].end - maxd;
                    ws[0].end = ws[1].start = bd;
                }
                ws[0].start = ws[0].end - maxd > 0 ? ws[0].end - maxd : 0;
            }
            if (seg_start[i] < ws[0].end && seg_start[i] - 0.5 > ws[0].start) {
                double v = ws[0].end - median < seg_start[i] ? ws[0].end - median : seg_start[i];
                ws[0].start = v > 0 ? v : 0;
            } else {
                seg_start[i] = ws[0].start;
            }
            if (seg_end[i] > ws[nw - 1].start && seg_end[i] + 0.5 < ws[nw - 1].end) {
                double v = ws[nw - 1].start + median;
                ws[nw - 1].end = v > seg_end[i] ? v : seg_end[i];
            } else {
                seg_end[i] = ws[nw - 1].end;
            }
            *last_speech = seg_end[i];
        }
        seg_words[i] = ws;
        seg_nw[i] = nw;
    }
    for (int32_t k = 0; k < na; k++) osp_free(al[k].text);
    osp_free(al);
    if (rc != OSP_OK)
        for (int32_t i = 0; i < n_seg; i++) {
            free_words(seg_words[i], seg_nw[i]);
            seg_words[i] = NULL;
            seg_nw[i] = 0;
        }
    return rc;
}

/* The language of the encoded window: the likeliest language token after
 * <|startoftranscript|>. */
static osp_status detect_language(osp_whisper_state *s, const osp_wtokens *w, float *logits, int *lang) {
    OSP_TRY(osp_whisper_truncate(s, 0));
    OSP_TRY(osp_whisper_decode(s, &w->sot, 1, NULL, logits));
    int best = 0;
    for (int i = 1; i < w->n_langs; i++)
        if (logits[w->lang0 + i] > logits[w->lang0 + best]) best = i;
    *lang = best;
    return OSP_OK;
}

typedef struct tctx {
    osp_whisper_state *s;
    osp_mel *mel;
    float *spec;
    int32_t *prefix, *all;
    float *logits, *sot_logits, *probs, *blogits;
    void *beams, *cands;
    int32_t *seq;
    osp_wresult *res;
    int32_t *ranges;
    double *times;
} tctx;

static void tctx_free(tctx *x, int own_state) {
    if (own_state) osp_whisper_state_free(x->s);
    osp_mel_free(x->mel);
    void *p[] = {x->spec, x->prefix, x->all, x->logits, x->sot_logits, x->probs, x->seq, x->res, x->ranges, x->times,
                 x->blogits, x->beams, x->cands};
    for (size_t i = 0; i < sizeof p / sizeof *p; i++) osp_free(p[i]);
}

static osp_status concat_text(osp_transcript *t) {
    size_t len = 0;
    for (int32_t i = 0; i < t->n_segs; i++) len += strlen(t->segs[i].text);
    t->text = osp_malloc(OSP_POOL_MISC, len + 1);
    if (!t->text) return osp_err(OSP_ERR_NOMEM, "out of memory");
    size_t k = 0;
    for (int32_t i = 0; i < t->n_segs; i++) {
        size_t l = strlen(t->segs[i].text);
        memcpy(t->text + k, t->segs[i].text, l);
        k += l;
    }
    t->text[k] = 0;
    return OSP_OK;
}

static osp_status run(const osp_whisper *m, const osp_tokenizer *tok, const osp_wtokens *w, const float *pcm,
                      int64_t n, const osp_transcribe_opts *o, tctx *x, osp_transcript *out) {
    const osp_whisper_config *cfg = osp_whisper_get_config(m);
    const int32_t V = cfg->vocab, ctx = cfg->n_text_ctx;
    const int beam = o->beam_size > 1 ? o->beam_size : 1;
    if (o->beam_size < 0 || o->beam_size > 16) return osp_err(OSP_ERR_INVALID, "beam size %d (1..16)", o->beam_size);
    if (!x->s) OSP_TRY(osp_whisper_state_new_rows(m, beam, &x->s));
    if (osp_whisper_rows(x->s) < beam)
        return osp_err(OSP_ERR_INVALID, "beam size %d: the decoder state has %d rows", beam, osp_whisper_rows(x->s));
    x->blogits = osp_malloc(OSP_POOL_SCRATCH, sizeof(float) * V * beam);
    x->beams = osp_malloc(OSP_POOL_SCRATCH, sizeof(struct beam) * (4 * beam + 1));
    x->cands = osp_malloc(OSP_POOL_SCRATCH, sizeof(struct cand) * beam * (beam + 1));
    if (!x->blogits || !x->beams || !x->cands) return osp_err(OSP_ERR_NOMEM, "out of memory for beam search");
    OSP_TRY(osp_mel_new(cfg->n_mels, &x->mel));
    osp_whisper_state_set_serial(x->s, o->serial);
    osp_whisper_state_set_fast(x->s, o->fast);
    osp_mel_set_serial(x->mel, o->serial);
    x->spec = osp_malloc(OSP_POOL_SCRATCH, sizeof(float) * cfg->n_mels * N_FRAMES);
    x->prefix = osp_malloc(OSP_POOL_SCRATCH, sizeof(int32_t) * ctx);
    x->seq = osp_malloc(OSP_POOL_SCRATCH, sizeof(int32_t) * (ctx + OSP_WHISPER_SAMPLE_LEN + 8));
    x->logits = osp_malloc(OSP_POOL_SCRATCH, sizeof(float) * V);
    x->sot_logits = osp_malloc(OSP_POOL_SCRATCH, sizeof(float) * V * 4);
    x->probs = osp_malloc(OSP_POOL_SCRATCH, sizeof(float) * V);
    x->res = osp_malloc(OSP_POOL_SCRATCH, sizeof *x->res);
    x->ranges = osp_malloc(OSP_POOL_SCRATCH, sizeof(int32_t) * 2 * (OSP_WHISPER_SAMPLE_LEN + 2));
    x->times = osp_malloc(OSP_POOL_SCRATCH, sizeof(double) * 2 * (OSP_WHISPER_SAMPLE_LEN + 2));
    if (!x->spec || !x->prefix || !x->seq || !x->logits || !x->sot_logits || !x->probs || !x->res || !x->ranges ||
        !x->times)
        return osp_err(OSP_ERR_NOMEM, "out of memory for transcription");

    int lang = 0;
    if (o->language && *o->language) {
        lang = osp_whisper_lang_index(o->language);
        if (lang < 0) return osp_err(OSP_ERR_INVALID, "unknown language '%s'", o->language);
        if (w->n_langs == 0 && lang != 0)
            return osp_err(OSP_ERR_INVALID, "this is an English-only model: language '%s' is not available", o->language);
        if (w->n_langs && lang >= w->n_langs)
            return osp_err(OSP_ERR_INVALID, "language '%s' is not in this model's vocabulary", o->language);
    }
    if (o->translate && !w->n_langs) return osp_err(OSP_ERR_INVALID, "an English-only model cannot translate");

    /* the prompt's tokens: " " + prompt, stripped */
    int32_t n_all = 0, cap_all = 0, reset_since = 0;
    if (o->prompt && *o->prompt) {
        const char *p = o->prompt;
        while (*p == ' ' || *p == '\n' || *p == '\t') p++;
        size_t pl = strlen(p);
        while (pl && (p[pl - 1] == ' ' || p[pl - 1] == '\n' || p[pl - 1] == '\t')) pl--;
        char *sp = osp_malloc(OSP_POOL_MISC, pl + 2);
        if (!sp) return osp_err(OSP_ERR_NOMEM, "out of memory");
        sp[0] = ' ';
        memcpy(sp + 1, p, pl);
        size_t k;
        osp_status rc = osp_tokenizer_encode_alloc(tok, sp, pl + 1, 0, &x->all, &k);
        osp_free(sp);
        OSP_TRY(rc);
        n_all = cap_all = (int32_t)k;
    }

    const int64_t content_frames = n / OSP_MEL_HOP;
    const double total = (double)n / OSP_AUDIO_RATE;
    int32_t seg_cap = 0;
    int detected = !(w->n_langs && !(o->language && *o->language));
    double last_speech = 0; /* word timestamps: the end of the last speech */
    uint64_t rng = o->seed ? o->seed : 0x5eed;
    for (int64_t seek = 0; seek < content_frames;) {
        int32_t segment_frames = content_frames - seek < N_FRAMES ? (int32_t)(content_frames - seek) : N_FRAMES;
        double time_offset = (double)seek * OSP_MEL_HOP / OSP_AUDIO_RATE;
        OSP_TRY(osp_mel_compute(x->mel, pcm + seek * OSP_MEL_HOP, (int64_t)segment_frames * OSP_MEL_HOP, x->spec));
        OSP_TRY(osp_whisper_encode(x->s, x->spec));
        if (!detected) {
            OSP_TRY(detect_language(x->s, w, x->logits, &lang));
            detected = 1;
        }
        /* [<|startofprev|> previous text] <|startoftranscript|> [lang task] [<|notimestamps|>] */
        int32_t np = 0;
        { /* the text since the last reset (the initial prompt until the first reset) */
            int32_t from = reset_since, k = n_all - reset_since;
            int32_t keep = ctx / 2 - 1;
            if (k > keep) {
                from += k - keep;
                k = keep;
            }
            if (k > 0) {
                x->prefix[np++] = w->sot_prev;
                memcpy(x->prefix + np, x->all + from, sizeof(int32_t) * k);
                np += k;
            }
        }
        int32_t n_prompt_part = np;
        x->prefix[np++] = w->sot;
        if (w->n_langs) {
            x->prefix[np++] = w->lang0 + lang;
            x->prefix[np++] = o->translate ? w->translate : w->transcribe;
        }
        if (!o->timestamps) x->prefix[np++] = w->no_timestamps;
        wctx c = {m, tok, w, x->s, o->timestamps, o->best_of, x->prefix, np, n_prompt_part,
                  x->logits, x->sot_logits, x->probs, x->seq, rng, beam, o->translate, x->blogits, x->beams, x->cands,
                  o->sample_len > 0 && o->sample_len < OSP_WHISPER_SAMPLE_LEN ? o->sample_len : OSP_WHISPER_SAMPLE_LEN};
        osp_fallback_opts fb = o->fb;
        if (o->no_fallback) {
            fb.n_temps = 1;
            fb.temps[0] = o->temperature;
        } else if (o->temperature > 0) {
            /* the schedule from the given temperature on */
            int k = 0;
            for (int i = 0; i < fb.n_temps; i++)
                if (fb.temps[i] >= o->temperature - 1e-6f) fb.temps[k++] = fb.temps[i];
            if (!k) fb.temps[k++] = o->temperature;
            fb.n_temps = k;
        }
        osp_wresult *r = x->res;
        OSP_TRY(osp_whisper_fallback(&fb, decode_at, &c, r));
        rng = c.rng;
        if (!isnan(o->fb.no_speech_threshold) && r->no_speech_prob > o->fb.no_speech_threshold &&
            !(!isnan(o->fb.logprob_threshold) && r->avg_logprob > o->fb.logprob_threshold)) {
            seek += segment_frames; /* silence */
        } else {
            int32_t n_seg;
            int32_t adv = osp_whisper_split(w, r->tokens, r->n_tokens, segment_frames, x->ranges, x->times, &n_seg);
            int32_t first_new = out->n_segs;
            const int single_end = r->n_tokens >= 2 && r->tokens[r->n_tokens - 2] < w->ts_begin &&
                                   r->tokens[r->n_tokens - 1] >= w->ts_begin;
            double seg_start[OSP_WHISPER_SAMPLE_LEN + 2], seg_end[OSP_WHISPER_SAMPLE_LEN + 2];
            osp_word *seg_words[OSP_WHISPER_SAMPLE_LEN + 2];
            int32_t seg_nw[OSP_WHISPER_SAMPLE_LEN + 2];
            for (int32_t i = 0; i < n_seg; i++) {
                seg_start[i] = time_offset + x->times[2 * i];
                seg_end[i] = time_offset + x->times[2 * i + 1];
                seg_words[i] = NULL;
                seg_nw[i] = 0;
            }
            if (o->word_timestamps) {
                OSP_TRY(window_words(&c, r, x->ranges, n_seg, lang, segment_frames, time_offset, seg_start, seg_end,
                                     seg_words, seg_nw, &last_speech));
                double last_word_end = -1;
                for (int32_t i = n_seg - 1; i >= 0 && last_word_end < 0; i--)
                    if (seg_nw[i]) last_word_end = seg_words[i][seg_nw[i] - 1].end;
                if (last_word_end < 0 && n_seg) last_word_end = seg_end[n_seg - 1];
                if (!single_end && last_word_end > time_offset) adv = (int32_t)(llround(last_word_end * 100) - seek);
                if (last_word_end >= 0) last_speech = last_word_end;
            }
            for (int32_t i = 0; i < n_seg; i++) {
                int32_t b = x->ranges[2 * i], e = x->ranges[2 * i + 1];
                int32_t before = out->n_segs;
                osp_status ar = add_segment(out, &seg_cap, tok, w, r->tokens + b, e - b, seg_start[i], seg_end[i],
                                            (int32_t)seek, r, seg_words[i], seg_nw[i]);
                seg_words[i] = NULL;
                if (ar != OSP_OK) {
                    for (int32_t k = i + 1; k < n_seg; k++) free_words(seg_words[k], seg_nw[k]);
                    return ar;
                }
                if (out->n_segs == before) continue;
                /* the kept segments' tokens condition the next window */
                osp_segment *sg = &out->segs[out->n_segs - 1];
                if (n_all + sg->n_tokens > cap_all) {
                    int32_t nc = (n_all + sg->n_tokens) * 2;
                    int32_t *na = osp_malloc(OSP_POOL_MISC, sizeof(int32_t) * nc);
                    if (!na) return osp_err(OSP_ERR_NOMEM, "out of memory");
                    if (n_all) memcpy(na, x->all, sizeof(int32_t) * n_all);
                    osp_free(x->all);
                    x->all = na;
                    cap_all = nc;
                }
                memcpy(x->all + n_all, sg->tokens, sizeof(int32_t) * sg->n_tokens);
                n_all += sg->n_tokens;
            }
            if (o->on_segment)
                for (int32_t i = first_new; i < out->n_segs; i++) o->on_segment(o->ctx, &out->segs[i]);
            seek += adv > 0 ? adv : segment_frames;
            if (!o->condition_on_previous_text || r->temperature > 0.5f) reset_since = n_all;
        }
        if (o->progress) o->progress(o->ctx, seek * (double)OSP_MEL_HOP / OSP_AUDIO_RATE < total ? seek * (double)OSP_MEL_HOP / OSP_AUDIO_RATE : total, total);
    }
    snprintf(out->language, sizeof out->language, "%s", osp_whisper_lang_code(lang));
    out->translate = o->translate;
    out->duration = total;
    return concat_text(out);
}

osp_status osp_transcribe(const osp_whisper *m, const osp_tokenizer *tok, const float *pcm, int64_t n,
                          const osp_transcribe_opts *o, osp_transcript *out) {
    return osp_transcribe_on(m, NULL, tok, pcm, n, o, out);
}

osp_status osp_transcribe_on(const osp_whisper *m, osp_whisper_state *s, const osp_tokenizer *tok, const float *pcm,
                             int64_t n, const osp_transcribe_opts *o, osp_transcript *out) {
    memset(out, 0, sizeof *out);
    if (n < 0 || (n > 0 && !pcm)) return osp_err(OSP_ERR_INVALID, "transcribe: bad audio");
    osp_wtokens w;
    OSP_TRY(osp_wtokens_init(tok, osp_whisper_get_config(m)->vocab, &w));
    tctx x;
    memset(&x, 0, sizeof x);
    x.s = s;
    osp_status rc = run(m, tok, &w, pcm, n, o, &x, out);
    tctx_free(&x, !s);
    osp_wtokens_free(&w);
    if (rc != OSP_OK) osp_transcript_free(out);
    return rc;
}

void osp_transcript_free(osp_transcript *t) {
    for (int32_t i = 0; i < t->n_segs; i++) {
        osp_free(t->segs[i].text);
        osp_free(t->segs[i].tokens);
        free_words(t->segs[i].words, t->segs[i].n_words);
    }
    osp_free(t->segs);
    osp_free(t->text);
    memset(t, 0, sizeof *t);
}
