/* osprey logits: the parity tool. Reads input_ids (I32 [T]) from a
 * safetensors file and writes logits (F32 [T, vocab]) for every position,
 * computed in one of three ways that must agree. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli.h"
#include "core/core.h"
#include "model/safetensors.h"
#include "model/st_write.h"
#include "model/whisper.h"
#include "audio/audio.h"
#include "osprey.h"

static int usage(void) {
    fprintf(stderr, "usage: osprey logits --model MODEL --input IN.safetensors --output OUT.safetensors "
                    "[--mode prefill|decode|chunk:N] [-t THREADS] [--fast] [--device cpu|cuda|auto]\n"
                    "  Whisper models: --audio FILE too; IN holds decoder_ids I32 [T]; OUT gets mel, encoder_out\n"
                    "          and the teacher-forced logits\n"
                    "  --fast: the production path (int8 activations for 4/8-bit weights in decode) instead of\n"
                    "          reference precision\n");
    return 2;
}

static osp_status run(osp_model *m, const int32_t *ids, int32_t T, int chunk, int fast, float *out) {
    const osp_model_info *in = osp_model_get_info(m);
    osp_session *s;
    OSP_TRY(osp_session_new(m, 1, T, &s));
    osp_session_set_fast(s, fast);
    osp_status rc = OSP_OK;
    for (int32_t t0 = 0; t0 < T && rc == OSP_OK; t0 += chunk) {
        int32_t n = T - t0 < chunk ? T - t0 : chunk;
        rc = osp_forward(s, ids + t0, n, 1, out + (int64_t)t0 * in->vocab);
    }
    osp_session_free(s);
    return rc;
}

/* A Whisper model: mel of the audio's first window, encoder, then the
 * decoder over decoder_ids in chunks of `chunk` tokens. */
static int whisper_logits(const char *model, const char *audio, const char *input, const char *output, int chunk,
                          int device, int fast) {
    osp_st *st;
    if (osp_st_open_file(input, &st) != OSP_OK) return osp_cli_fail("logits");
    const osp_st_tensor *t = osp_st_find(st, "decoder_ids");
    if (!t || t->dtype != OSP_DT_I32 || t->ndim != 1 || t->numel < 1) {
        fprintf(stderr, "osprey logits: %s: needs a non-empty I32 [T] tensor 'decoder_ids'\n", input);
        osp_st_close(st);
        return 1;
    }
    int32_t T = (int32_t)t->numel;
    int32_t *ids = osp_malloc(OSP_POOL_MISC, sizeof(int32_t) * T);
    if (ids) memcpy(ids, t->data, sizeof(int32_t) * T);
    osp_st_close(st);
    osp_whisper *m = NULL;
    osp_whisper_state *s = NULL;
    osp_mel *mel = NULL;
    float *pcm = NULL, *spec = NULL, *logits = NULL;
    int64_t n = 0;
    int rc = 1;
    if (!ids || osp_whisper_load_on(model, device, &m) != OSP_OK) goto fail;
    const osp_whisper_config *c = osp_whisper_get_config(m);
    spec = osp_malloc(OSP_POOL_MISC, sizeof(float) * (size_t)c->n_mels * OSP_MEL_FRAMES);
    logits = osp_malloc(OSP_POOL_MISC, sizeof(float) * (size_t)T * c->vocab);
    if (!spec || !logits) {
        osp_err(OSP_ERR_NOMEM, "out of memory");
        goto fail;
    }
    if (osp_audio_load(audio, &pcm, &n) != OSP_OK || osp_mel_new(c->n_mels, &mel) != OSP_OK ||
        osp_mel_compute(mel, pcm, n, spec) != OSP_OK || osp_whisper_state_new(m, &s) != OSP_OK)
        goto fail;
    osp_whisper_state_set_fast(s, fast);
    if (osp_whisper_encode(s, spec) != OSP_OK) goto fail;
    for (int32_t t0 = 0; t0 < T; t0 += chunk) {
        int32_t k = T - t0 < chunk ? T - t0 : chunk;
        if (osp_whisper_decode(s, ids + t0, k, logits + (int64_t)t0 * c->vocab, NULL) != OSP_OK) goto fail;
    }
    osp_st_writer *w = osp_st_writer_new();
    int64_t ms[2] = {c->n_mels, OSP_MEL_FRAMES}, es[2] = {c->n_audio_ctx, c->d_model}, ls[2] = {T, c->vocab};
    if (!w || osp_st_writer_add(w, "mel", OSP_DT_F32, 2, ms, spec, sizeof(float) * ms[0] * ms[1]) != OSP_OK ||
        osp_st_writer_add(w, "encoder_out", OSP_DT_F32, 2, es, osp_whisper_encoder_out(s), sizeof(float) * es[0] * es[1]) != OSP_OK ||
        osp_st_writer_add(w, "logits", OSP_DT_F32, 2, ls, logits, sizeof(float) * ls[0] * ls[1]) != OSP_OK ||
        osp_st_writer_write(w, output, NULL, NULL) != OSP_OK) {
        osp_st_writer_free(w);
        goto fail;
    }
    osp_st_writer_free(w);
    rc = 0;
fail:
    if (rc) osp_cli_fail("logits");
    osp_free(ids);
    osp_free(pcm);
    osp_free(spec);
    osp_free(logits);
    osp_mel_free(mel);
    osp_whisper_state_free(s);
    osp_whisper_free(m);
    return rc;
}

int osp_cmd_logits(int argc, char **argv) {
    const char *model = NULL, *input = NULL, *output = NULL, *mode = "prefill", *audio = NULL;
    int threads = 0, fast = 0, device = OSP_DEVICE_AUTO, dr;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--model") && i + 1 < argc) model = argv[++i];
        else if (!strcmp(argv[i], "--input") && i + 1 < argc) input = argv[++i];
        else if (!strcmp(argv[i], "--output") && i + 1 < argc) output = argv[++i];
        else if (!strcmp(argv[i], "--mode") && i + 1 < argc) mode = argv[++i];
        else if (!strcmp(argv[i], "--audio") && i + 1 < argc) audio = argv[++i];
        else if ((!strcmp(argv[i], "-t") || !strcmp(argv[i], "--threads")) && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--fast")) fast = 1;
        else if ((dr = osp_cli_device_flag("logits", argv[i], i + 1 < argc ? argv[i + 1] : NULL, &device)) != 0) {
            if (dr < 0) return 2;
            i++;
        } else return usage();
    }
    if (!model || !input || !output) return usage();
    int chunk = 0;
    if (!strcmp(mode, "decode")) chunk = 1;
    else if (!strncmp(mode, "chunk:", 6)) chunk = atoi(mode + 6);
    else if (strcmp(mode, "prefill") != 0) return usage();
    if (chunk < 0 || (chunk == 0 && strcmp(mode, "prefill") != 0)) return usage();
    osp_set_threads(threads);
    if (osp_whisper_detect(model)) {
        if (!audio) {
            fprintf(stderr, "osprey logits: %s is a Whisper model: --audio FILE is needed\n", model);
            return 2;
        }
        return whisper_logits(model, audio, input, output, chunk ? chunk : 1 << 30, device, fast);
    }
    if (audio) {
        fprintf(stderr, "osprey logits: --audio is for Whisper models\n");
        return 2;
    }

    osp_st *st;
    if (osp_st_open_file(input, &st) != OSP_OK) return osp_cli_fail("logits");
    const osp_st_tensor *t = osp_st_find(st, "input_ids");
    if (!t || t->dtype != OSP_DT_I32 || t->ndim != 1 || t->numel < 1) {
        fprintf(stderr, "osprey logits: %s: needs a non-empty I32 [T] tensor 'input_ids'\n", input);
        osp_st_close(st);
        return 1;
    }
    int32_t T = (int32_t)t->numel;
    int32_t *ids = malloc(sizeof(int32_t) * T);
    memcpy(ids, t->data, sizeof(int32_t) * T);
    osp_st_close(st);

    osp_model *m;
    osp_model_params mp = {.device = (osp_device)device, .place = 1};
    if (osp_model_load_params(model, &mp, &m) != OSP_OK) {
        free(ids);
        return osp_cli_fail("logits");
    }
    int32_t V = osp_model_get_info(m)->vocab;
    float *out = malloc(sizeof(float) * (size_t)T * V);
    int rc = 0;
    if (!out || run(m, ids, T, chunk ? chunk : T, fast, out) != OSP_OK) {
        rc = osp_cli_fail("logits");
    } else {
        osp_st_writer *w = osp_st_writer_new();
        int64_t shape[2] = {T, V};
        if (!w || osp_st_writer_add(w, "logits", OSP_DT_F32, 2, shape, out, sizeof(float) * (size_t)T * V) != OSP_OK ||
            osp_st_writer_write(w, output, NULL, NULL) != OSP_OK)
            rc = osp_cli_fail("logits");
        osp_st_writer_free(w);
    }
    free(out);
    free(ids);
    osp_model_free(m);
    return rc;
}
