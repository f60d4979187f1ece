/* Whisper in `osprey synth` (--preset whisper-tiny|base|small|large-v3: a
 * random-weight WhisperForConditionalGeneration folder, bf16) and in
 * `osprey bench --model WHISPER` (the encoder per 30 s window and its GEMM
 * throughput, the decoder's tokens/s and weight bandwidth against the
 * host's read probe (bench_bw.h) run between its steps, and real-time factors of a transcription's
 * model time for 11 s and 5 min of audio). */
#include <errno.h>
#include <stdarg.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "audio/audio.h"
#include "backend/cpu/bf16t.h"
#include "backend/ops.h"
#include "bench_bw.h"
#include "cli.h"
#include "core/threadpool.h"
#include "model/st_write.h"
#include "model/whisper.h"
#include "tensor/tensor.h"

typedef struct wpreset {
    const char *name;
    int d, heads, layers, ffn, mels, vocab;
} wpreset;

static const wpreset PRESETS[] = {
    {"whisper-tiny", 384, 6, 4, 1536, 80, 51865},     {"whisper-base", 512, 8, 6, 2048, 80, 51865},
    {"whisper-small", 768, 12, 12, 3072, 80, 51865},  {"whisper-large-v3", 1280, 20, 32, 5120, 128, 51866},
};

int osp_whisper_preset_known(const char *name) {
    for (size_t i = 0; i < sizeof PRESETS / sizeof *PRESETS; i++)
        if (!strcmp(name, PRESETS[i].name)) return 1;
    return 0;
}

/* ---------------- synth ---------------- */

typedef struct wt {
    char name[128];
    int ndim;
    int64_t shape[3];
    int kind; /* 0 random, 1 ones (norm weights), 2 zeros (biases), 3 sinusoids */
} wt;

typedef struct wsynth {
    wt *t;
    int n, cap;
    uint64_t seed;
} wsynth;

static int add(wsynth *s, int kind, int ndim, int64_t a, int64_t b, int64_t c, const char *fmt, ...)
    __attribute__((format(printf, 7, 8)));
static int add(wsynth *s, int kind, int ndim, int64_t a, int64_t b, int64_t c, const char *fmt, ...) {
    if (s->n == s->cap) {
        int nc = s->cap ? s->cap * 2 : 256;
        wt *nt = realloc(s->t, sizeof *nt * nc);
        if (!nt) return -1;
        s->t = nt;
        s->cap = nc;
    }
    wt *t = &s->t[s->n++];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->name, sizeof t->name, fmt, ap);
    va_end(ap);
    t->ndim = ndim;
    t->shape[0] = a;
    t->shape[1] = b;
    t->shape[2] = c;
    t->kind = kind;
    return 0;
}

static void add_attn(wsynth *s, const char *p, int d) {
    static const char *P[] = {"q_proj", "k_proj", "v_proj", "out_proj"};
    for (int i = 0; i < 4; i++) {
        add(s, 0, 2, d, d, 0, "%s.%s.weight", p, P[i]);
        if (i != 1) add(s, 2, 1, d, 0, 0, "%s.%s.bias", p, P[i]);
    }
}

static void add_ln(wsynth *s, const char *p, int d) {
    add(s, 1, 1, d, 0, 0, "%s.weight", p);
    add(s, 2, 1, d, 0, 0, "%s.bias", p);
}

static void add_layer(wsynth *s, const char *p, const wpreset *w, int cross) {
    char n[96];
    snprintf(n, sizeof n, "%s.self_attn", p);
    add_attn(s, n, w->d);
    snprintf(n, sizeof n, "%s.self_attn_layer_norm", p);
    add_ln(s, n, w->d);
    if (cross) {
        snprintf(n, sizeof n, "%s.encoder_attn", p);
        add_attn(s, n, w->d);
        snprintf(n, sizeof n, "%s.encoder_attn_layer_norm", p);
        add_ln(s, n, w->d);
    }
    snprintf(n, sizeof n, "%s.final_layer_norm", p);
    add_ln(s, n, w->d);
    add(s, 0, 2, w->ffn, w->d, 0, "%s.fc1.weight", p);
    add(s, 2, 1, w->ffn, 0, 0, "%s.fc1.bias", p);
    add(s, 0, 2, w->d, w->ffn, 0, "%s.fc2.weight", p);
    add(s, 2, 1, w->d, 0, 0, "%s.fc2.bias", p);
}

static osp_status fill(void *ctx, int64_t index, int64_t row0, int64_t nrows, void *buf, size_t nbytes) {
    const wsynth *s = ctx;
    const wt *t = &s->t[index];
    uint16_t *o = buf;
    int64_t per_row = nbytes / 2 / nrows;
    for (int64_t r = 0; r < nrows; r++) {
        uint64_t st = s->seed ^ ((uint64_t)index << 40) ^ (uint64_t)(row0 + r) * 0x9e3779b97f4a7c15ull;
        for (int64_t i = 0; i < per_row; i++) {
            float v;
            if (t->kind == 1) v = 1;
            else if (t->kind == 2) v = 0;
            else if (t->kind == 3) { /* sinusoids as Whisper's encoder positions */
                int64_t half = per_row / 2, k = i % half;
                double inc = log(10000.0) / (half - 1), ang = (row0 + r) * exp(-inc * k);
                v = (float)(i < half ? sin(ang) : cos(ang));
            } else {
                st ^= st >> 12;
                st ^= st << 25;
                st ^= st >> 27;
                v = (float)((double)((st * 0x2545f4914f6cdd1dull) >> 40) / 16777216.0 - 0.5) * 0.08f;
            }
            o[r * per_row + i] = osp_f32_to_bf16(v);
        }
    }
    return OSP_OK;
}

int osp_whisper_synth(const char *preset, const char *dtype, const char *out, uint64_t seed) {
    const wpreset *w = NULL;
    for (size_t i = 0; i < sizeof PRESETS / sizeof *PRESETS; i++)
        if (!strcmp(preset, PRESETS[i].name)) w = &PRESETS[i];
    if (!w) return 2;
    if (dtype && strcmp(dtype, "bf16")) {
        fprintf(stderr, "osprey synth: the Whisper presets are bf16 only\n");
        return 1;
    }
    wsynth s = {.seed = seed ? seed : 0x5eed};
    char n[96];
    add(&s, 0, 3, w->d, w->mels, 3, "model.encoder.conv1.weight");
    add(&s, 2, 1, w->d, 0, 0, "model.encoder.conv1.bias");
    add(&s, 0, 3, w->d, w->d, 3, "model.encoder.conv2.weight");
    add(&s, 2, 1, w->d, 0, 0, "model.encoder.conv2.bias");
    add(&s, 3, 2, 1500, w->d, 0, "model.encoder.embed_positions.weight");
    for (int l = 0; l < w->layers; l++) {
        snprintf(n, sizeof n, "model.encoder.layers.%d", l);
        add_layer(&s, n, w, 0);
    }
    add_ln(&s, "model.encoder.layer_norm", w->d);
    add(&s, 0, 2, w->vocab, w->d, 0, "model.decoder.embed_tokens.weight");
    add(&s, 0, 2, 448, w->d, 0, "model.decoder.embed_positions.weight");
    for (int l = 0; l < w->layers; l++) {
        snprintf(n, sizeof n, "model.decoder.layers.%d", l);
        add_layer(&s, n, w, 1);
    }
    add_ln(&s, "model.decoder.layer_norm", w->d);
    if (mkdir(out, 0755) && errno != EEXIST) {
        fprintf(stderr, "osprey synth: cannot create %s\n", out);
        free(s.t);
        return 1;
    }
    json_t *c = json_object();
    json_object_set_new(c, "architectures", json_pack("[s]", "WhisperForConditionalGeneration"));
    json_object_set_new(c, "model_type", json_string("whisper"));
    json_object_set_new(c, "activation_function", json_string("gelu"));
    json_object_set_new(c, "d_model", json_integer(w->d));
    json_object_set_new(c, "encoder_layers", json_integer(w->layers));
    json_object_set_new(c, "decoder_layers", json_integer(w->layers));
    json_object_set_new(c, "encoder_attention_heads", json_integer(w->heads));
    json_object_set_new(c, "decoder_attention_heads", json_integer(w->heads));
    json_object_set_new(c, "encoder_ffn_dim", json_integer(w->ffn));
    json_object_set_new(c, "decoder_ffn_dim", json_integer(w->ffn));
    json_object_set_new(c, "num_mel_bins", json_integer(w->mels));
    json_object_set_new(c, "vocab_size", json_integer(w->vocab));
    json_object_set_new(c, "max_source_positions", json_integer(1500));
    json_object_set_new(c, "max_target_positions", json_integer(448));
    json_object_set_new(c, "decoder_start_token_id", json_integer(50258));
    json_object_set_new(c, "eos_token_id", json_integer(50257));
    json_object_set_new(c, "scale_embedding", json_false());
    json_object_set_new(c, "tie_word_embeddings", json_true());
    json_object_set_new(c, "torch_dtype", json_string("bfloat16"));
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", out);
    int rc = json_dump_file(c, path, JSON_INDENT(2)) ? 1 : 0;
    json_decref(c);
    osp_st_writer *wr = osp_st_writer_new();
    osp_status st = wr && !rc ? OSP_OK : OSP_ERR_IO;
    for (int i = 0; i < s.n && st == OSP_OK; i++) {
        int64_t numel = 1;
        for (int k = 0; k < s.t[i].ndim; k++) numel *= s.t[i].shape[k];
        st = osp_st_writer_add(wr, s.t[i].name, OSP_DT_BF16, s.t[i].ndim, s.t[i].shape, NULL, (size_t)numel * 2);
    }
    snprintf(path, sizeof path, "%s/model.safetensors", out);
    if (st == OSP_OK) st = osp_st_writer_write(wr, path, fill, &s);
    if (st != OSP_OK) rc = osp_cli_fail("synth");
    else printf("osprey synth: %s (bf16, %d tensors, %.1f MB) in %s\n", preset, s.n, osp_st_writer_data_bytes(wr) / 1e6, out);
    osp_st_writer_free(wr);
    free(s.t);
    return rc;
}

/* ---------------- bench ---------------- */

/* The ops table's GEMM at its best in this run: W f32 [1024, 1024] times
 * 256 tokens, split over the pool as the encoder's matmuls are (blocks of 64
 * rows x 64 tokens), best of 5. The peak the encoder is measured against. */
typedef struct peak_ctx {
    const osp_ops *ops;
    osp_weight w;
    const float *x;
    float *y;
} peak_ctx;

static void peak_task(void *p, int64_t t) {
    const peak_ctx *c = p;
    int64_t rb = t % 16, tb = t / 16;
    c->ops->matmul(&c->w, c->x + tb * 64 * 1024, 64, c->y + tb * 64 * 1024 + rb * 64, 1024, rb * 64, rb * 64 + 64);
}

static double gemm_peak_gflops(void) {
    float *w = osp_malloc(OSP_POOL_SCRATCH, sizeof(float) * 1024 * 1024);
    float *x = osp_malloc(OSP_POOL_SCRATCH, sizeof(float) * 256 * 1024);
    float *y = osp_malloc(OSP_POOL_SCRATCH, sizeof(float) * 256 * 1024);
    double best = 0;
    if (w && x && y) {
        for (int64_t i = 0; i < 1024 * 1024; i++) w[i] = (float)((i * 7919) % 1000) * 1e-3f - 0.5f;
        for (int64_t i = 0; i < 256 * 1024; i++) x[i] = (float)((i * 104729) % 1000) * 1e-3f - 0.5f;
        peak_ctx c = {osp_ops_get(), {.dtype = OSP_DT_F32, .rows = 1024, .cols = 1024, .data = w}, x, y};
        for (int k = 0; k < 6; k++) {
            double t0 = osp_now_s();
            osp_parallel_for(16 * 4, peak_task, &c);
            double dt = osp_now_s() - t0;
            if (k) best = fmax(best, 2.0 * 1024 * 1024 * 256 / dt / 1e9);
        }
    }
    osp_free(w);
    osp_free(x);
    osp_free(y);
    return best;
}

/* Encoder FLOPs of one window: the convolutions, projections, attention
 * products and MLPs (2 per multiply-add). */
static double encoder_flops(const osp_whisper_config *c) {
    const double A = c->n_audio_ctx, d = c->d_model, f = c->enc_ffn;
    double conv = 2.0 * 3000 * d * c->n_mels * 3 + 2.0 * A * d * d * 3;
    double layer = 2.0 * A * d * d * 4 + 2.0 * A * A * d * 2 + 2.0 * A * d * f * 2;
    return conv + layer * c->enc_layers;
}

/* Bytes the decoder reads per token: its weights (bf16/f16 2 bytes, f32 4)
 * and the window's cross-attention K/V (f32), the two streams of a step. */
static double decoder_bytes(const osp_whisper_config *c, int elt) {
    const double d = c->d_model, f = c->dec_ffn;
    return elt * (c->dec_layers * (d * d * 6 + d * f * 2) + (double)c->vocab * d) +
           4.0 * c->dec_layers * 2 * c->n_audio_ctx * d;
}

int osp_whisper_bench(const char *model, int device, int fast, int n_tokens, int as_json) {
    osp_whisper *m;
    if (osp_whisper_load_on(model, device, &m) != OSP_OK) return osp_cli_fail("bench");
    const osp_whisper_config *c = osp_whisper_get_config(m);
    osp_whisper_state *s = NULL;
    float *mel = osp_malloc(OSP_POOL_MISC, sizeof(float) * c->n_mels * 3000);
    float *logits = osp_malloc(OSP_POOL_MISC, sizeof(float) * c->vocab);
    float *pcm = osp_malloc(OSP_POOL_MISC, sizeof(float) * 16000 * 30);
    osp_bw_probe rd = {0}; /* the host's read probe (bench_bw.h), for a decoder on the CPU */
    osp_mel *mf = NULL;
    int rc = 1;
    if (!mel || !logits || !pcm || osp_whisper_state_new(m, &s) != OSP_OK ||
        osp_mel_new(c->n_mels, &mf) != OSP_OK) {
        osp_cli_fail("bench");
        goto done;
    }
    osp_whisper_state_set_fast(s, fast);
    for (int64_t i = 0; i < 16000 * 30; i++) pcm[i] = (float)(0.1 * sin(i * 0.05) + 0.05 * sin(i * 0.31));
    /* front end and encoder: best of 3 windows after a warm-up */
    double t_mel = 1e30, t_enc = 1e30;
    for (int k = 0; k < 4; k++) {
        double t0 = osp_now_s();
        if (osp_mel_compute(mf, pcm, 16000 * 30, mel) != OSP_OK) goto fail;
        double t1 = osp_now_s();
        if (osp_whisper_encode(s, mel) != OSP_OK) goto fail;
        double t2 = osp_now_s();
        if (k) {
            t_mel = fmin(t_mel, t1 - t0);
            t_enc = fmin(t_enc, t2 - t1);
        }
    }
    /* decoder: n_tokens single-token steps after the 4-token prompt, a read trial every 8 steps */
    int32_t ids[4] = {c->decoder_start, c->decoder_start + 1, c->decoder_start + 101, c->decoder_start + 105};
    for (int i = 0; i < 4; i++)
        if (ids[i] >= c->vocab) ids[i] = c->vocab - 1;
    if (n_tokens > c->n_text_ctx - 4) n_tokens = c->n_text_ctx - 4;
    if (osp_whisper_decode(s, ids, 4, NULL, logits) != OSP_OK) goto fail;
    /* a GPU's decoder is measured against its own read probe (the host's reads host memory) */
    double g0 = 0;
    const int on_dev = osp_whisper_bw_trial(m, 0, &g0) == OSP_OK;
    if (!on_dev && !osp_bw_open_read(&rd, (size_t)decoder_bytes(c, 2))) {
        osp_cli_fail("bench");
        goto done;
    }
    double t_dec = 0, bw = on_dev ? g0 : 0;
    for (int i = 0; i < n_tokens; i++) {
        int32_t next = 0;
        for (int32_t j = 1; j < c->vocab; j++)
            if (logits[j] > logits[next]) next = j;
        double t0 = osp_now_s();
        if (osp_whisper_decode(s, &next, 1, NULL, logits) != OSP_OK) goto fail;
        t_dec += osp_now_s() - t0;
        if (i % 8 == 7) {
            double g = 0;
            if (on_dev) {
                if (osp_whisper_bw_trial(m, 0, &g) != OSP_OK) goto fail;
            } else {
                osp_bw_trial(&rd);
                g = rd.best;
            }
            bw = fmax(bw, g);
        }
    }
    if (on_dev) osp_whisper_bw_trial(m, 1, NULL);
    {
        /* the CPU's production path for Whisper is its bf16 engine (bf16 weights on AMX or AVX512-BF16);
         * without one it computes in reference precision either way */
        const char *prec =
            fast && (strncmp(osp_whisper_device_name(m), "cpu", 3) || osp_bf16t_engine() != OSP_BF16T_NONE) ? "fast"
                                                                                                             : "precise";
        /* the encoder's peak is the CPU's f32 GEMM measured here; a GPU has no such probe, so no ratio there */
        double peak = on_dev ? 0 : gemm_peak_gflops();
        double flops = encoder_flops(c), gflops = flops / t_enc / 1e9;
        double tok_s = n_tokens / t_dec, dec_gbps = decoder_bytes(c, 2) * tok_s / 1e9;
        /* model time of a transcription: a window per 30 s (the last one partial), ~3 tokens/s of speech */
        double rtf11 = (t_mel + t_enc + 11.0 * 3 / tok_s) / 11.0;
        double rtf300 = (10 * (t_mel + t_enc) + 300.0 * 3 / tok_s) / 300.0;
        char peak_s[32] = "null", eff_s[32] = "null";
        if (peak > 0) {
            snprintf(peak_s, sizeof peak_s, "%.2f", peak);
            snprintf(eff_s, sizeof eff_s, "%.3f", gflops / peak);
        }
        const char *probe = on_dev ? "device read" : "host read";
        if (as_json)
            printf("{\"model\":\"%s\",\"device\":\"%s\",\"precision\":\"%s\",\"threads\":%d,\"mel_s\":%.4f,\"encoder_s\":%.4f,\"encoder_gflops\":%.2f,"
                   "\"gemm_peak_gflops\":%s,\"encoder_efficiency\":%s,"
                   "\"decode_tok_s\":%.2f,\"decode_gbps\":%.2f,\"mem_bw_probe\":\"%s\",\"mem_bw_gbps\":%.2f,\"bw_ratio\":%.3f,"
                   "\"rtf_11s\":%.4f,\"rtf_5min\":%.4f}\n",
                   model, osp_whisper_device_name(m), prec, osp_threads_count(), t_mel, t_enc, gflops, peak_s, eff_s, tok_s,
                   dec_gbps, probe, bw, bw > 0 ? dec_gbps / bw : 0, rtf11, rtf300);
        else {
            printf("%s: %s, %s, %d threads\n  mel %.1f ms/window, encoder %.3f s/window (%.1f GFLOP/s", model,
                   osp_whisper_device_name(m), prec, osp_threads_count(), t_mel * 1e3, t_enc, gflops);
            if (peak > 0) printf(", %.2f of the %.1f GFLOP/s of this run's best f32 GEMM", gflops / peak, peak);
            printf(")\n  decoder %.1f tok/s, %.2f GB/s of weights and cross K/V vs %.2f GB/s %s (ratio %.3f)\n"
                   "  real-time factor (model time, 3 tokens per s of speech): %.4f for 11 s, %.4f for 5 min\n",
                   tok_s, dec_gbps, bw, probe, bw > 0 ? dec_gbps / bw : 0, rtf11, rtf300);
        }
    }
    rc = 0;
    goto done;
fail:
    osp_cli_fail("bench");
done:
    osp_bw_close(&rd);
    osp_free(mel);
    osp_free(logits);
    osp_free(pcm);
    osp_mel_free(mf);
    osp_whisper_state_free(s);
    osp_whisper_free(m);
    return rc;
}
