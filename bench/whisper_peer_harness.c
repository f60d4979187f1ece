// Copied from ../shared/peers/whisper/whisper_harness.c (whisper.cpp peer); built by bench/whisper_peer.sh
// against whisper.cpp's own libwhisper.so (not a node addon).
// Drives whisper.cpp's C API inside a prebuilt whisper.cpp library (e.g. the @fugood/node-whisper-linux-x64
// index.node, which exports the whole whisper_* API), to get whisper.cpp's own per-stage timers
// (whisper_print_timings) for each run, which the node binding does not expose.
//
// build: see build_harness.sh (links the .node file directly; its napi_* imports are satisfied by stubs)
//
// usage:
//   whisper_harness full  MODEL WAV [--runs R] [--threads T] [--fa 0|1] [--no-fallback] [--max-ctx N]
//       R x whisper_full(greedy, language en, no_context, n_max_text_ctx N (default 0)), after 1 warm-up run
//       (reported as run 0; --warmup 0 skips it).
//       One TSV line per run: wall ms of whisper_full, then whisper.cpp's timers (totals and call counts).
//   whisper_harness bench MODEL [--runs R] [--threads T] [--fa 0|1] [--ntok K]
//   (--gated: before each timed run print "#ready" and wait for a stdin line; see guard.py)
//       like whisper.cpp's bench: zero mel, encoder of one full 30 s window (n_audio_ctx 1500),
//       then K single-token decoder calls at KV positions 0..K-1 (after 1 untimed warm-up of each).
#include "whisper.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <time.h>

static char g_log[1 << 20];
static size_t g_log_len = 0;
static int g_echo = 1;

static void log_cb(enum ggml_log_level level, const char * text, void * ud) {
    (void) level; (void) ud;
    size_t n = strlen(text);
    if (g_log_len + n < sizeof(g_log) - 1) {
        memcpy(g_log + g_log_len, text, n);
        g_log_len += n;
        g_log[g_log_len] = 0;
    }
    if (g_echo) fputs(text, stderr);
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static float * read_wav(const char * path, int * n_out) {
    FILE * f = fopen(path, "rb");
    if (!f) { perror(path); exit(1); }
    fseek(f, 0, SEEK_END); long sz = ftell(f); fseek(f, 0, SEEK_SET);
    uint8_t * b = malloc(sz);
    if (fread(b, 1, sz, f) != (size_t) sz) { fprintf(stderr, "short read\n"); exit(1); }
    fclose(f);
    if (memcmp(b, "RIFF", 4) || memcmp(b + 8, "WAVE", 4)) { fprintf(stderr, "not a wav\n"); exit(1); }
    long p = 12; int ch = 0, rate = 0, bits = 0, fmt = 0;
    while (p + 8 <= sz) {
        uint32_t len; memcpy(&len, b + p + 4, 4);
        if (!memcmp(b + p, "fmt ", 4)) {
            uint16_t v; memcpy(&v, b + p + 8, 2); fmt = v; memcpy(&v, b + p + 10, 2); ch = v;
            uint32_t r; memcpy(&r, b + p + 12, 4); rate = r; memcpy(&v, b + p + 22, 2); bits = v;
        } else if (!memcmp(b + p, "data", 4)) {
            if (fmt != 1 || ch != 1 || rate != 16000 || bits != 16) { fprintf(stderr, "need PCM16 mono 16 kHz\n"); exit(1); }
            int n = len / 2;
            float * out = malloc(sizeof(float) * n);
            for (int i = 0; i < n; i++) { int16_t s; memcpy(&s, b + p + 8 + 2 * i, 2); out[i] = s / 32768.0f; }
            free(b); *n_out = n; return out;
        }
        p += 8 + len + (len & 1);
    }
    fprintf(stderr, "no data chunk\n"); exit(1);
}

// parse "...<key> = <total> ms / <n> runs" from the captured whisper_print_timings output
static void timing(const char * key, double * total, int * n) {
    *total = 0; *n = 0;
    const char * s = strstr(g_log, key);
    if (!s) return;
    s = strchr(s, '=');
    if (!s) return;
    double t = 0; int k = 0;
    if (sscanf(s + 1, " %lf ms / %d runs", &t, &k) >= 1) { *total = t; *n = k; }
}

// with --gated (run under guard.py): announce the run and wait for "go" on stdin
static void gate(int gated, int r) {
    if (!gated) return;
    char buf[64];
    printf("#ready %d\n", r);
    fflush(stdout);
    if (!fgets(buf, sizeof(buf), stdin)) exit(1);
}

int main(int argc, char ** argv) {
    if (argc < 3) { fprintf(stderr, "usage: see source\n"); return 1; }
    const char * mode = argv[1], * model = argv[2], * wav = NULL;
    int ai = 3;
    if (!strcmp(mode, "full")) { if (argc < 4) return 1; wav = argv[3]; ai = 4; }
    int runs = 3, threads = 2, fa = 0, no_fallback = 0, max_ctx = 0, ntok = 256, gated = 0, warmup = 1;
    for (; ai < argc; ai++) {
        if (!strcmp(argv[ai], "--runs")) runs = atoi(argv[++ai]);
        else if (!strcmp(argv[ai], "--threads")) threads = atoi(argv[++ai]);
        else if (!strcmp(argv[ai], "--fa")) fa = atoi(argv[++ai]);
        else if (!strcmp(argv[ai], "--no-fallback")) no_fallback = 1;
        else if (!strcmp(argv[ai], "--max-ctx")) max_ctx = atoi(argv[++ai]);
        else if (!strcmp(argv[ai], "--ntok")) ntok = atoi(argv[++ai]);
        else if (!strcmp(argv[ai], "--gated")) gated = 1;
        else if (!strcmp(argv[ai], "--warmup")) warmup = atoi(argv[++ai]);
        else { fprintf(stderr, "bad arg %s\n", argv[ai]); return 1; }
    }
    whisper_log_set(log_cb, NULL);

    struct whisper_context_params cp = whisper_context_default_params();
    cp.use_gpu = false;
    cp.flash_attn = fa;
    double t0 = now_ms();
    struct whisper_context * ctx = whisper_init_from_file_with_params(model, cp);
    if (!ctx) { fprintf(stderr, "load failed\n"); return 1; }
    double t_load = now_ms() - t0;
    fprintf(stderr, "system_info: %s\n", whisper_print_system_info());
    printf("#load_ms\t%.1f\tfa\t%d\tthreads\t%d\n", t_load, fa, threads);
    g_echo = 0;

    if (!strcmp(mode, "full")) {
        int n = 0;
        float * pcm = read_wav(wav, &n);
        struct whisper_full_params p = whisper_full_default_params(WHISPER_SAMPLING_GREEDY);
        p.n_threads = threads;
        p.print_progress = false; p.print_realtime = false; p.print_timestamps = false; p.print_special = false;
        p.language = "en";
        p.no_context = true;
        p.n_max_text_ctx = max_ctx;
        if (no_fallback) p.temperature_inc = 0.0f;
        printf("#audio_s\t%.2f\n", n / 16000.0);
        printf("run\twall_ms\tmel_ms\tenc_ms\tn_enc\tdec_ms\tn_dec\tbatchd_ms\tn_batchd_tok\tprompt_ms\tn_prompt_tok\tsample_ms\tn_sample\tfallbacks\tn_seg\tn_tok_out\ttext\n");
        for (int r = warmup ? 0 : 1; r <= runs; r++) {  // run 0 = warm-up, reported as run 0 (not gated)
            if (r > 0) gate(gated, r);
            whisper_reset_timings(ctx);
            double a = now_ms();
            if (whisper_full(ctx, p, pcm, n) != 0) { fprintf(stderr, "whisper_full failed\n"); return 1; }
            double wall = now_ms() - a;
            g_log_len = 0; g_log[0] = 0;
            whisper_print_timings(ctx);
            double mel, enc, dec, bat, pro, sam; int ne, nd, nb, np, ns, dummy;
            timing("mel time", &mel, &dummy);
            timing("encode time", &enc, &ne);
            timing("decode time", &dec, &nd);
            timing("batchd time", &bat, &nb);
            timing("prompt time", &pro, &np);
            timing("sample time", &sam, &ns);
            int fp = 0, fh = 0;
            const char * fs = strstr(g_log, "fallbacks =");
            if (fs) sscanf(fs, "fallbacks = %d p / %d h", &fp, &fh);
            int nseg = whisper_full_n_segments(ctx), ntoks = 0;
            char text[256] = {0};
            for (int i = 0; i < nseg; i++) {
                ntoks += whisper_full_n_tokens(ctx, i);
                if (i == 0) snprintf(text, sizeof(text), "%s", whisper_full_get_segment_text(ctx, 0));
            }
            printf("%d\t%.1f\t%.1f\t%.1f\t%d\t%.1f\t%d\t%.1f\t%d\t%.1f\t%d\t%.1f\t%d\t%d\t%d\t%d\t%.60s\n",
                   r, wall, mel, enc, ne, dec, nd, bat, nb, pro, np, sam, ns, fp + fh, nseg, ntoks, text);
            fflush(stdout);
        }
    } else if (!strcmp(mode, "bench")) {
        const int n_mels = whisper_model_n_mels(ctx);
        if (whisper_set_mel(ctx, NULL, 0, n_mels)) { fprintf(stderr, "set_mel failed\n"); return 1; }
        whisper_token tok[512] = {0};
        // warm-up
        if (whisper_encode(ctx, 0, threads)) return 1;
        if (whisper_decode(ctx, tok, 1, 0, threads)) return 1;
        printf("run\tenc_ms\tdec_ms_per_tok\tntok\n");
        for (int r = 1; r <= runs; r++) {
            gate(gated, r);
            whisper_reset_timings(ctx);
            double a = now_ms();
            if (whisper_encode(ctx, 0, threads)) return 1;
            double enc = now_ms() - a;
            a = now_ms();
            for (int i = 0; i < ntok; i++) if (whisper_decode(ctx, tok, 1, i, threads)) return 1;
            double dec = (now_ms() - a) / ntok;
            printf("%d\t%.1f\t%.2f\t%d\n", r, enc, dec, ntok);
            fflush(stdout);
        }
    }
    whisper_free(ctx);
    return 0;
}
