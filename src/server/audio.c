/* server/audio: POST /v1/audio/transcriptions and /v1/audio/translations
 * (OpenAI's audio API) with the --audio-model Whisper model.
 *
 * The form (multipart/form-data): file (required; WAV, FLAC, OGG or MP3),
 * model (not checked: one audio model is served), language, prompt,
 * response_format (json, text, srt, vtt, verbose_json; default json),
 * temperature (0..1; 0 = openai-whisper's fallback schedule, else that
 * temperature alone), timestamp_granularities[] (segment, word: word
 * timestamps, in verbose_json's "words").
 *
 * Concurrent transcriptions share the model's steps (speech/batch.h: up to
 * 8 at once, their windows encoded together and their beams and samples rows
 * of one decoder step; more wait for a slot): each runs its decoding rules on
 * the connection's thread, and the batch's thread computes on the process
 * thread pool when the server has no chat model, else without it (serial):
 * the pool belongs to the chat batch thread, so chat requests keep their
 * cores. It computes in the device's production precision, as chat does
 * (`osprey transcribe --fast`: bf16 tensor cores on a GPU, the bf16 engine on
 * an AMX or AVX512-BF16 CPU). A request's text is the same alone or among others. Bad audio
 * (not audio, truncated, empty) is a 400 naming the problem. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "audio/audio.h"
#include "server/multipart.h"
#include "server/server_internal.h"
#include "speech/batch.h"
#include "speech/transcribe.h"

int srv_audio_setup(srv *s) {
    if (!s->cfg.audio_model) return 0;
    if (!osp_whisper_detect(s->cfg.audio_model)) {
        osp_err(OSP_ERR_INVALID, "%s: --audio-model is not a Whisper model folder", s->cfg.audio_model);
        return -1;
    }
    if (osp_whisper_load_on(s->cfg.audio_model, s->cfg.device, &s->audio) != OSP_OK) return -1;
    if (osp_whisper_tokenizer_load(s->cfg.audio_model, s->cfg.audio_tokenizer,
                                   osp_whisper_get_config(s->audio)->vocab, &s->audio_tok) != OSP_OK)
        return -1;
    osp_wbatch_opts bo;
    osp_wbatch_defaults(&bo);
    bo.serial = s->model != NULL; /* an audio-only server's thread pool has no other user */
    bo.fast = 1; /* the device's production precision, as the chat model's (server/setup.c) */
    return osp_wbatch_new(s->audio, &bo, &s->audio_batch) == OSP_OK ? 0 : -1;
}

void srv_audio_teardown(srv *s) {
    osp_wbatch_free(s->audio_batch);
    osp_tokenizer_free(s->audio_tok);
    osp_whisper_free(s->audio);
    s->audio_batch = NULL;
    s->audio_tok = NULL;
    s->audio = NULL;
}

static int send_err(srv *s, srv_req *c, int status, const char *msg, const char *param) {
    return srv_send_json(s, c, status, srv_error_json(status, msg, param));
}

/* A form field as a NUL-terminated string in buf (cap), or NULL when absent. */
static const char *field(const srv_form *f, const char *name, char *buf, size_t cap, int *too_long) {
    const srv_part *p = srv_form_get(f, name);
    if (!p) return NULL;
    if (p->len + 1 > cap) {
        *too_long = 1;
        return NULL;
    }
    memcpy(buf, p->data, p->len);
    buf[p->len] = 0;
    return buf;
}

int srv_audio_respond(srv *s, srv_req *c, const char *body, size_t len, int translate) {
    if (!s->audio)
        return send_err(s, c, 404, "no audio model is served (start osprey serve with --audio-model)", "model");
    const char *ct = srv_req_header(c, "Content-Type"), *err = NULL;
    srv_form *f = malloc(sizeof *f);
    if (!f) return send_err(s, c, 500, "out of memory", NULL);
    if (srv_multipart_parse(ct, body ? body : "", len, f, &err)) {
        free(f);
        return send_err(s, c, 400, err, NULL);
    }
    char lang[64], fmt[32], temp[32], prompt[8192];
    int too_long = 0;
    const char *language = translate ? NULL : field(f, "language", lang, sizeof lang, &too_long);
    const char *format = field(f, "response_format", fmt, sizeof fmt, &too_long);
    const char *tstr = field(f, "temperature", temp, sizeof temp, &too_long);
    const char *pr = field(f, "prompt", prompt, sizeof prompt, &too_long);
    int words = 0, bad_gran = 0; /* every timestamp_granularities[] part: segment and/or word */
    for (int i = 0; i < f->n; i++) {
        const srv_part *p = &f->parts[i];
        if (!p->name || (strcmp(p->name, "timestamp_granularities[]") && strcmp(p->name, "timestamp_granularities")))
            continue;
        if (p->len == 4 && !memcmp(p->data, "word", 4)) words = 1;
        else if (!(p->len == 7 && !memcmp(p->data, "segment", 7))) bad_gran = 1;
    }
    const srv_part *file = srv_form_get(f, "file");
    int rc;
    osp_transcribe_opts o;
    osp_transcribe_defaults(&o);
    if (too_long) {
        rc = send_err(s, c, 400, "a form field is too long", NULL);
        goto done;
    }
    if (!file) {
        rc = send_err(s, c, 400, "the form has no 'file' part", "file");
        goto done;
    }
    if (!format || !*format) format = "json";
    if (!osp_transcript_format_known(format) || !strcmp(format, "txt")) {
        rc = send_err(s, c, 400, "response_format must be json, text, srt, vtt or verbose_json", "response_format");
        goto done;
    }
    if (language && *language && osp_whisper_lang_index(language) < 0) {
        rc = send_err(s, c, 400, "unknown language", "language");
        goto done;
    }
    if (bad_gran) {
        rc = send_err(s, c, 400, "timestamp_granularities: 'segment' or 'word'", "timestamp_granularities");
        goto done;
    }
    if (tstr) {
        char *e;
        double t = strtod(tstr, &e);
        if (e == tstr || *e || !(t >= 0 && t <= 1)) {
            rc = send_err(s, c, 400, "temperature must be a number in [0, 1]", "temperature");
            goto done;
        }
        if (t > 0) {
            o.temperature = (float)t;
            o.no_fallback = 1;
        }
    }
    o.language = language;
    o.translate = translate;
    o.prompt = pr;
    o.serial = 1;
    o.word_timestamps = words;
    float *pcm = NULL;
    int64_t n = 0;
    if (osp_audio_decode(file->data, file->len, file->filename ? file->filename : "file", &pcm, &n) != OSP_OK) {
        rc = send_err(s, c, 400, osp_last_error(), "file");
        goto done;
    }
    osp_transcript t;
    osp_status st = osp_wbatch_transcribe(s->audio_batch, s->audio_tok, pcm, n, &o, &t);
    osp_free(pcm);
    if (st != OSP_OK) {
        rc = send_err(s, c, st == OSP_ERR_INVALID ? 400 : 500, osp_last_error(), NULL);
        goto done;
    }
    char *out = NULL;
    size_t olen = 0;
    st = osp_transcript_format(&t, format, &out, &olen);
    osp_transcript_free(&t);
    if (st != OSP_OK) {
        rc = send_err(s, c, 500, osp_last_error(), NULL);
        goto done;
    }
    int is_json = !strcmp(format, "json") || !strcmp(format, "verbose_json");
    rc = srv_req_reply(c, 200, is_json ? "application/json" : "text/plain; charset=utf-8", out, olen, NULL);
    osp_free(out);
done:
    free(f);
    return rc;
}
