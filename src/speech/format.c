/* speech/format.c: a transcript as openai-whisper's writers and the OpenAI
 * audio API print it (txt, text, json, verbose_json, srt, vtt). */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "transcribe.h"

typedef struct sbuf {
    char *p;
    size_t n, cap;
    int oom;
} sbuf;

static void put(sbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t nc = (b->n + n + 1) * 2;
        char *np = osp_malloc(OSP_POOL_MISC, nc);
        if (!np) {
            b->oom = 1;
            return;
        }
        if (b->n) memcpy(np, b->p, b->n);
        osp_free(b->p);
        b->p = np;
        b->cap = nc;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}
static void puts_(sbuf *b, const char *s) { put(b, s, strlen(s)); }

/* text stripped of surrounding whitespace; "-->" written "->" (subtitles) */
static void put_text(sbuf *b, const char *s, int arrows) {
    while (*s == ' ' || *s == '\t' || *s == '\n' || *s == '\r') s++;
    size_t n = strlen(s);
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\n' || s[n - 1] == '\r')) n--;
    for (size_t i = 0; i < n; i++) {
        if (arrows && i + 3 <= n && !strncmp(s + i, "-->", 3)) {
            put(b, "->", 2);
            i += 2;
        } else {
            put(b, s + i, 1);
        }
    }
}

static void put_time(sbuf *b, double sec, int hours_always, char mark) {
    if (sec < 0) sec = 0;
    long long ms = llround(sec * 1000.0);
    long long h = ms / 3600000;
    ms -= h * 3600000;
    long long m = ms / 60000;
    ms -= m * 60000;
    long long s = ms / 1000;
    ms -= s * 1000;
    char t[64];
    if (hours_always || h > 0) snprintf(t, sizeof t, "%02lld:%02lld:%02lld%c%03lld", h, m, s, mark, ms);
    else snprintf(t, sizeof t, "%02lld:%02lld%c%03lld", m, s, mark, ms);
    puts_(b, t);
}

int osp_transcript_format_known(const char *f) {
    static const char *const K[] = {"txt", "text", "json", "verbose_json", "srt", "vtt"};
    for (size_t i = 0; f && i < sizeof K / sizeof *K; i++)
        if (!strcmp(f, K[i])) return 1;
    return 0;
}

static json_t *word_json(const osp_word *w, int prob) {
    json_t *j = json_object();
    json_object_set_new(j, "word", json_string(w->text));
    json_object_set_new(j, "start", json_real(w->start));
    json_object_set_new(j, "end", json_real(w->end));
    if (prob) json_object_set_new(j, "probability", json_real(w->prob));
    return j;
}

static json_t *verbose(const osp_transcript *t) {
    json_t *o = json_object(), *segs = json_array(), *words = NULL;
    int li = osp_whisper_lang_index(t->language);
    json_object_set_new(o, "task", json_string(t->translate ? "translate" : "transcribe"));
    json_object_set_new(o, "language", json_string(li >= 0 ? osp_whisper_lang_name(li) : t->language));
    json_object_set_new(o, "duration", json_real(t->duration));
    json_object_set_new(o, "text", json_string(t->text ? t->text : ""));
    for (int32_t i = 0; i < t->n_segs; i++) {
        const osp_segment *s = &t->segs[i];
        json_t *j = json_object(), *toks = json_array();
        for (int32_t k = 0; k < s->n_tokens; k++) json_array_append_new(toks, json_integer(s->tokens[k]));
        json_object_set_new(j, "id", json_integer(i));
        json_object_set_new(j, "seek", json_integer(s->seek));
        json_object_set_new(j, "start", json_real(s->start));
        json_object_set_new(j, "end", json_real(s->end));
        json_object_set_new(j, "text", json_string(s->text));
        json_object_set_new(j, "tokens", toks);
        json_object_set_new(j, "temperature", json_real(s->temperature));
        json_object_set_new(j, "avg_logprob", json_real(s->avg_logprob));
        json_object_set_new(j, "compression_ratio", json_real(s->compression_ratio));
        json_object_set_new(j, "no_speech_prob", json_real(s->no_speech_prob));
        if (s->words) { /* openai-whisper's segment words, and OpenAI's top-level "words" */
            json_t *ws = json_array();
            if (!words) words = json_array();
            for (int32_t k = 0; k < s->n_words; k++) {
                json_array_append_new(ws, word_json(&s->words[k], 1));
                json_array_append_new(words, word_json(&s->words[k], 0));
            }
            json_object_set_new(j, "words", ws);
        }
        json_array_append_new(segs, j);
    }
    json_object_set_new(o, "segments", segs);
    if (words) json_object_set_new(o, "words", words);
    return o;
}

osp_status osp_transcript_format(const osp_transcript *t, const char *f, char **out, size_t *len) {
    *out = NULL;
    if (!osp_transcript_format_known(f))
        return osp_err(OSP_ERR_INVALID, "unknown format '%s' (txt, text, json, verbose_json, srt, vtt)", f ? f : "");
    sbuf b = {0};
    if (!strcmp(f, "txt")) {
        for (int32_t i = 0; i < t->n_segs; i++) {
            put_text(&b, t->segs[i].text, 0);
            puts_(&b, "\n");
        }
    } else if (!strcmp(f, "text")) {
        put_text(&b, t->text ? t->text : "", 0);
        puts_(&b, "\n");
    } else if (!strcmp(f, "srt") || !strcmp(f, "vtt")) {
        int srt = !strcmp(f, "srt");
        if (!srt) puts_(&b, "WEBVTT\n\n");
        for (int32_t i = 0; i < t->n_segs; i++) {
            char num[32];
            if (srt) {
                snprintf(num, sizeof num, "%d\n", i + 1);
                puts_(&b, num);
            }
            put_time(&b, t->segs[i].start, srt, srt ? ',' : '.');
            puts_(&b, " --> ");
            put_time(&b, t->segs[i].end, srt, srt ? ',' : '.');
            puts_(&b, "\n");
            put_text(&b, t->segs[i].text, 1);
            puts_(&b, "\n\n");
        }
    } else {
        json_t *o;
        if (!strcmp(f, "json")) {
            o = json_object();
            json_object_set_new(o, "text", json_string(t->text ? t->text : ""));
        } else {
            o = verbose(t);
        }
        char *s = json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(6));
        json_decref(o);
        if (!s) return osp_err(OSP_ERR_NOMEM, "out of memory formatting the transcript");
        puts_(&b, s);
        puts_(&b, "\n");
        free(s);
    }
    if (!b.p && !b.oom) puts_(&b, "");
    if (b.oom) {
        osp_free(b.p);
        return osp_err(OSP_ERR_NOMEM, "out of memory formatting the transcript");
    }
    *out = b.p;
    if (len) *len = b.n;
    return OSP_OK;
}
