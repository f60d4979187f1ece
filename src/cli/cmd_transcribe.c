/* osprey transcribe FILE... --model WHISPER: speech to text as openai-whisper
 * decodes it (speech/transcribe.h), printed in one of its formats. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "audio/audio.h"
#include "cli.h"
#include "speech/transcribe.h"

static int usage(void) {
    fprintf(stderr,
            "usage: osprey transcribe FILE... --model WHISPER [--language L] [--task transcribe|translate]\n"
            "         [-f txt|text|json|verbose_json|srt|vtt] [--prompt TEXT] [--temperature T] [--no-fallback]\n"
            "         [--beam-size N] [--best-of N] [--no-timestamps] [--word-timestamps] [--no-context]\n"
            "         [--sample-len N] [--tokenizer PATH] [--seed S]\n"
            "         [-t THREADS] [-q] [--device cpu|cuda|auto] [--fast]\n"
            "  FILE: WAV, FLAC, OGG or MP3 (any rate and channels); --language: a code or name (detected when\n"
            "  omitted); without -f, each segment as it is decoded: [00:00:00.000 --> 00:00:02.000]  text;\n"
            "  -f txt: one segment a line; --beam-size 5 (default; 1 = greedy) at\n"
            "  temperature 0, --best-of 5 samples above; --sample-len: tokens a 30 s window at most (224);\n"
            "  at the end of each file its time and real-time factor on stderr; -q: neither progress nor that;\n"
            "  --device: where the model runs (auto: the GPU when one is present, else the CPU; cuda asks for\n"
            "  the GPU); --fast: the GPU's production precision (bf16 GEMMs)\n");
    return 2;
}

typedef struct prog {
    int quiet, live;
    const char *file;
} prog;

/* whisper.cpp's console lines, printed as each segment is decoded */
static void stamp(double t, char *out, size_t n) {
    long long ms = (long long)(t * 1000.0 + 0.5);
    snprintf(out, n, "%02lld:%02lld:%02lld.%03lld", ms / 3600000, ms / 60000 % 60, ms / 1000 % 60, ms % 1000);
}

static void on_segment(void *ctx, const osp_segment *sg) {
    const prog *p = ctx;
    if (!p->live) return;
    char a[32], b[32];
    stamp(sg->start, a, sizeof a);
    stamp(sg->end, b, sizeof b);
    printf("[%s --> %s]  %s\n", a, b, sg->text);
    fflush(stdout);
}

static void progress(void *ctx, double done, double total) {
    const prog *p = ctx;
    if (!p->quiet && total > 30) fprintf(stderr, "\r%s: %.0f%% (%.0f / %.0f s)%s", p->file, 100 * done / total, done,
                                         total, done >= total ? "\n" : "");
}

int osp_cmd_transcribe(int argc, char **argv) {
    const char *model = NULL, *tokenizer = NULL, *format = NULL, *task = "transcribe";
    const char *files[256];
    int n_files = 0, threads = 0, device = OSP_DEVICE_AUTO, dr;
    osp_transcribe_opts o;
    osp_transcribe_defaults(&o);
    prog pg = {0, 0, NULL};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--model") && v) model = argv[++i];
        else if (!strcmp(a, "--tokenizer") && v) tokenizer = argv[++i];
        else if (!strcmp(a, "--language") && v) o.language = argv[++i];
        else if (!strcmp(a, "--task") && v) task = argv[++i];
        else if ((!strcmp(a, "-f") || !strcmp(a, "--format")) && v) format = argv[++i];
        else if (!strcmp(a, "--prompt") && v) o.prompt = argv[++i];
        else if (!strcmp(a, "--temperature") && v) o.temperature = (float)atof(argv[++i]);
        else if (!strcmp(a, "--no-fallback")) o.no_fallback = 1;
        else if (!strcmp(a, "--best-of") && v) o.best_of = atoi(argv[++i]);
        else if (!strcmp(a, "--beam-size") && v) o.beam_size = atoi(argv[++i]);
        else if (!strcmp(a, "--sample-len") && v) o.sample_len = atoi(argv[++i]);
        else if (!strcmp(a, "--no-timestamps")) o.timestamps = 0;
        else if (!strcmp(a, "--word-timestamps")) o.word_timestamps = 1;
        else if (!strcmp(a, "--no-context")) o.condition_on_previous_text = 0;
        else if (!strcmp(a, "--seed") && v) o.seed = strtoull(argv[++i], NULL, 10);
        else if ((!strcmp(a, "-t") || !strcmp(a, "--threads")) && v) threads = atoi(argv[++i]);
        else if (!strcmp(a, "-q") || !strcmp(a, "--quiet")) pg.quiet = 1;
        else if (!strcmp(a, "--fast")) o.fast = 1;
        else if ((dr = osp_cli_device_flag("transcribe", a, v, &device)) != 0) {
            if (dr < 0) return 2;
            i++;
        }
        else if (a[0] != '-' && n_files < 256) files[n_files++] = a;
        else return usage();
    }
    if (!model || !n_files) return usage();
    if (o.word_timestamps && !o.timestamps) {
        fprintf(stderr, "osprey transcribe: --word-timestamps needs the segment timestamps\n");
        return 2;
    }
    if (strcmp(task, "transcribe") && strcmp(task, "translate")) {
        fprintf(stderr, "osprey transcribe: --task is transcribe or translate\n");
        return 2;
    }
    o.translate = !strcmp(task, "translate");
    pg.live = !format; /* no -f: segments with their times as they come, as whisper.cpp prints them */
    if (format && !osp_transcript_format_known(format)) {
        fprintf(stderr, "osprey transcribe: -f is txt, text, json, verbose_json, srt or vtt\n");
        return 2;
    }
    if (o.temperature < 0 || o.temperature > 2 || o.best_of < 1 || o.best_of > 16 || o.beam_size < 1 ||
        o.beam_size > 16 || o.sample_len < 0 || o.sample_len > OSP_WHISPER_SAMPLE_LEN) {
        fprintf(stderr, "osprey transcribe: --temperature must be in [0, 2], --best-of and --beam-size in [1, 16], "
                        "--sample-len in [1, %d]\n", OSP_WHISPER_SAMPLE_LEN);
        return 2;
    }
    if (!osp_whisper_detect(model)) {
        fprintf(stderr, "osprey transcribe: %s is not a Whisper model folder\n", model);
        return 1;
    }
    osp_set_threads(threads);
    osp_whisper *m = NULL;
    osp_tokenizer *tok = NULL;
    if (osp_whisper_load_on(model, device, &m) != OSP_OK ||
        osp_whisper_tokenizer_load(model, tokenizer, osp_whisper_get_config(m)->vocab, &tok) != OSP_OK) {
        int rc = osp_cli_fail("transcribe");
        osp_whisper_free(m);
        return rc;
    }
    int rc = 0;
    o.progress = progress;
    o.on_segment = on_segment;
    o.ctx = &pg;
    for (int i = 0; i < n_files && !rc; i++) {
        float *pcm = NULL;
        int64_t n = 0;
        osp_transcript t;
        char *txt = NULL;
        size_t len;
        pg.file = files[i];
        double t0 = osp_now_s(), t1 = t0;
        if (osp_audio_load(files[i], &pcm, &n) != OSP_OK || (t1 = osp_now_s(),
                                                             osp_transcribe(m, tok, pcm, n, &o, &t) != OSP_OK)) {
            rc = osp_cli_fail("transcribe");
        } else {
            double t2 = osp_now_s();
            int64_t nt = 0;
            for (int32_t k = 0; k < t.n_segs; k++) nt += t.segs[k].n_tokens;
            if (!pg.quiet && t.duration > 0)
                fprintf(stderr, "%s: %.1f s of audio in %.2f s (decoding the file %.2f s): real-time factor %.4f; "
                        "%lld tokens in %d segments\n", files[i], t.duration, t2 - t0, t1 - t0, (t2 - t0) / t.duration,
                        (long long)nt, t.n_segs);
            if (!format) txt = NULL; /* printed already */
            else if (osp_transcript_format(&t, format, &txt, &len) != OSP_OK) rc = osp_cli_fail("transcribe");
            else fwrite(txt, 1, len, stdout);
            osp_free(txt);
            osp_transcript_free(&t);
        }
        osp_free(pcm);
    }
    fflush(stdout);
    osp_tokenizer_free(tok);
    osp_whisper_free(m);
    return rc;
}
