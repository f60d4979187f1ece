/* model/whisper.c: the Whisper encoder-decoder (see whisper.h for the math).
 *
 * Layout: every linear weight stays as stored in the mmapped safetensors
 * (osp_weight: dense or MLX-quantized); vectors (biases, LayerNorm
 * parameters) and the position tables are converted to f32 at load, in the
 * weights pool. Activations are [tokens, features] row-major f32. Heads are
 * column ranges of d_model (head h: columns [h·hd, (h+1)·hd)).
 *
 * A state's buffers are sized at creation for the largest case (the
 * encoder's 3000 frames, the decoder's n_text_ctx tokens) and reused.
 */
#include "whisper.h"
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "backend/ops.h"
#include "core/fs.h"
#include "core/json_get.h"
#include "core/threadpool.h"
#include "model/safetensors.h"
#include "tensor/tensor.h"

#define N_FRAMES 3000 /* mel frames of a 30 s window */
#define LN_EPS 1e-5f
#define ATT_Q 16           /* queries per attention task */
#define ATT_MAX_KEYS 4096  /* keys one query attends over, at most (scores on the stack) */
#define ATT_MAX_HD 256     /* head size, at most (Whisper's is 64) */
#define ATT_FULL_KEYS 1500 /* keys of the full (non-causal) attentions: the window */

typedef struct ln {
    float *w, *b; /* [d] */
} ln;

typedef struct attn {
    osp_weight q, k, v, o; /* [d, d] */
    float *bq, *bv, *bo;   /* [d]; k has no bias */
} attn;

typedef struct layer {
    ln ln_self, ln_cross, ln_mlp;
    attn self, cross; /* cross: decoder only */
    osp_weight fc1;   /* [ffn, d] */
    osp_weight fc2;   /* [d, ffn] */
    float *b1, *b2;   /* [ffn], [d] */
} layer;

/* Tensor names of a layout: Hugging Face's (model.encoder.layers.N.self_attn.q_proj)
 * or the MLX community's / openai-whisper's (encoder.blocks.N.attn.query). */
typedef struct names {
    const char *enc_layer, *dec_layer; /* printf formats of a block's prefix */
    const char *self, *self_ln, *cross, *cross_ln, *mlp_ln, *fc1, *fc2;
    const char *proj[4]; /* q, k, v, out */
} names;

static const names HF_NAMES = {"model.encoder.layers.%d", "model.decoder.layers.%d", "self_attn",
                               "self_attn_layer_norm", "encoder_attn", "encoder_attn_layer_norm", "final_layer_norm",
                               "fc1", "fc2", {"q_proj", "k_proj", "v_proj", "out_proj"}};
static const names MLX_NAMES = {"encoder.blocks.%d", "decoder.blocks.%d", "attn", "attn_ln", "cross_attn",
                                "cross_attn_ln", "mlp_ln", "mlp1", "mlp2", {"query", "key", "value", "out"}};

struct osp_whisper {
    char dir[4096];
    int mlx;          /* the MLX layout: its names, conv weights [out, k, in], computed encoder positions */
    const names *nm;
    osp_whisper_config cfg;
    osp_st *st;
    const osp_ops *ops;
    osp_weight conv1; /* [d, n_mels·3] (PyTorch's [out, in, k] flattened) */
    osp_weight conv2; /* [d, d·3] */
    float *conv1_b, *conv2_b; /* [d] */
    float *enc_pos;           /* [n_audio_ctx, d] */
    layer *enc, *dec;
    ln enc_ln, dec_ln;
    osp_weight embed;   /* [vocab, d] tokens */
    osp_weight head;    /* [vocab, d]: proj_out, or embed when tied */
    float *dec_pos;     /* [n_text_ctx, d] */
    int32_t *align;     /* alignment heads, (layer, head) pairs: generation_config.json's, else every head of
                           the last half of the decoder layers (openai-whisper's default) */
    int32_t n_align;
};

struct osp_whisper_state {
    const osp_whisper *m;
    int32_t n_rows;     /* decoder sequences (beams) sharing the window */
    int32_t *pos;       /* [n_rows]: tokens in each row's self-attention cache */
    int32_t *tok_row, *tok_pos; /* [max rows of a step]: each token's row and position */
    int encoded;
    int serial;         /* run every task on the calling thread (not the process pool) */
    /* cross-attention capture (word timestamps): heads [n_qk] as (layer, head) pairs; q·k (scaled, before
     * the softmax) of each decoded token against every audio position, [n_qk][qk_max_tok][A] */
    const int32_t *qk_heads;
    int32_t n_qk, qk_max_tok;
    float *qk_out;
    float *enc_out;     /* [A, d] */
    float **ck, **cv;   /* per decoder layer: cross K [heads][A][hd] and V [heads][hd][A] of the window */
    float **sk, **sv;   /* per decoder layer [n_rows][n_text_ctx][d]: self K/V */
    /* scratch, sized for max(3000 frames, A, n_text_ctx) rows */
    float *col;         /* [3000, max(n_mels, d)·3]: im2col of a convolution */
    float *x, *h, *q, *k, *v, *a; /* [rows, d] */
    float *f;           /* [rows, max(ffn, d)] */
};

/* ---------------- loading ---------------- */

static osp_status tensor_of(osp_whisper *m, const char *name, int ndim, const int64_t *shape, int floats,
                            const osp_st_tensor **out) {
    const osp_st_tensor *t = osp_st_find(m->st, name);
    *out = t;
    if (!t) return osp_err(OSP_ERR_FORMAT, "%s: tensor '%s' is missing", m->dir, name);
    int ok = t->ndim == ndim;
    for (int i = 0; ok && i < ndim; i++) ok = t->shape[i] == shape[i];
    if (floats && t->dtype != OSP_DT_F32 && t->dtype != OSP_DT_F16 && t->dtype != OSP_DT_BF16) ok = 0;
    if (!ok) {
        char want[96];
        if (ndim == 1) snprintf(want, sizeof want, "[%lld]", (long long)shape[0]);
        else if (ndim == 2) snprintf(want, sizeof want, "[%lld, %lld]", (long long)shape[0], (long long)shape[1]);
        else snprintf(want, sizeof want, "[%lld, %lld, %lld]", (long long)shape[0], (long long)shape[1], (long long)shape[2]);
        return osp_err(OSP_ERR_FORMAT, "%s: tensor '%s' has dtype %s and %d dims; expected a float tensor %s", m->dir,
                       name, osp_dtype_name(t->dtype), t->ndim, want);
    }
    return OSP_OK;
}

/* A float tensor of n values converted to f32 (weights pool). */
static osp_status vec(osp_whisper *m, const char *name, int64_t rows, int64_t cols, float **out) {
    const osp_st_tensor *t;
    int64_t shape[2] = {rows, cols};
    OSP_TRY(tensor_of(m, name, rows ? 2 : 1, rows ? shape : shape + 1, 1, &t));
    int64_t n = (rows ? rows : 1) * cols;
    float *v = osp_malloc(OSP_POOL_WEIGHTS, sizeof(float) * (size_t)n);
    if (!v) return osp_err(OSP_ERR_NOMEM, "%s: out of memory for '%s'", m->dir, name);
    for (int64_t i = 0; i < n; i++) v[i] = osp_load_float(t->data, t->dtype, i);
    *out = v;
    return OSP_OK;
}

/* Linear module `path` (no ".weight") as W[rows, cols]: dense, or MLX
 * affine-quantized when `path.scales` exists. */
static osp_status linear(osp_whisper *m, const char *path, int64_t rows, int64_t cols, osp_weight *w) {
    char name[512], sn[512], bn[512];
    snprintf(name, sizeof name, "%s.weight", path);
    snprintf(sn, sizeof sn, "%s.scales", path);
    snprintf(bn, sizeof bn, "%s.biases", path);
    memset(w, 0, sizeof *w);
    w->rows = rows;
    w->cols = cols;
    const osp_st_tensor *s = osp_st_find(m->st, sn);
    if (!s) {
        const osp_st_tensor *t;
        int64_t shape[2] = {rows, cols};
        OSP_TRY(tensor_of(m, name, 2, shape, 1, &t));
        w->dtype = t->dtype;
        w->data = t->data;
        return OSP_OK;
    }
    int bits = m->cfg.qbits, group = m->cfg.qgroup;
    if (!bits) return osp_err(OSP_ERR_FORMAT, "%s: '%s' looks quantized but config.json declares no quantization", m->dir, sn);
    if (cols % group || (cols * bits) % 32)
        return osp_err(OSP_ERR_FORMAT, "%s: '%s': %lld columns do not fit %d-bit groups of %d", m->dir, path,
                       (long long)cols, bits, group);
    const osp_st_tensor *t = osp_st_find(m->st, name), *b = osp_st_find(m->st, bn);
    if (!t || t->dtype != OSP_DT_U32 || t->ndim != 2 || t->shape[0] != rows || t->shape[1] != cols * bits / 32)
        return osp_err(OSP_ERR_FORMAT, "%s: '%s' is not U32 [%lld, %lld] packed codes", m->dir, name, (long long)rows,
                       (long long)(cols * bits / 32));
    int64_t sshape[2] = {rows, cols / group};
    OSP_TRY(tensor_of(m, sn, 2, sshape, 1, &s));
    OSP_TRY(tensor_of(m, bn, 2, sshape, 1, &b));
    if (s->dtype != b->dtype) return osp_err(OSP_ERR_FORMAT, "%s: '%s': scales and biases differ in dtype", m->dir, path);
    w->dtype = OSP_DT_U32;
    w->data = t->data;
    w->qbits = bits;
    w->group = group;
    w->sdtype = s->dtype;
    w->scales = s->data;
    w->biases = b->data;
    return OSP_OK;
}

static osp_status bind_ln(osp_whisper *m, const char *path, int64_t d, ln *l) {
    char n[512];
    snprintf(n, sizeof n, "%s.weight", path);
    OSP_TRY(vec(m, n, 0, d, &l->w));
    snprintf(n, sizeof n, "%s.bias", path);
    return vec(m, n, 0, d, &l->b);
}

static osp_status bind_attn(osp_whisper *m, const char *path, int64_t d, attn *a) {
    char n[512];
    const char *const *P = m->nm->proj;
    osp_weight *W[] = {&a->q, &a->k, &a->v, &a->o};
    float **B[] = {&a->bq, NULL, &a->bv, &a->bo};
    for (int i = 0; i < 4; i++) {
        snprintf(n, sizeof n, "%s.%s", path, P[i]);
        OSP_TRY(linear(m, n, d, d, W[i]));
        if (!B[i]) continue;
        snprintf(n, sizeof n, "%s.%s.bias", path, P[i]);
        OSP_TRY(vec(m, n, 0, d, B[i]));
    }
    return OSP_OK;
}

static osp_status bind_layer(osp_whisper *m, const char *path, int64_t d, int64_t ffn, int cross, layer *l) {
    char n[512];
    const names *N = m->nm;
    snprintf(n, sizeof n, "%s.%s", path, N->self_ln);
    OSP_TRY(bind_ln(m, n, d, &l->ln_self));
    snprintf(n, sizeof n, "%s.%s", path, N->self);
    OSP_TRY(bind_attn(m, n, d, &l->self));
    if (cross) {
        snprintf(n, sizeof n, "%s.%s", path, N->cross_ln);
        OSP_TRY(bind_ln(m, n, d, &l->ln_cross));
        snprintf(n, sizeof n, "%s.%s", path, N->cross);
        OSP_TRY(bind_attn(m, n, d, &l->cross));
    }
    snprintf(n, sizeof n, "%s.%s", path, N->mlp_ln);
    OSP_TRY(bind_ln(m, n, d, &l->ln_mlp));
    snprintf(n, sizeof n, "%s.%s", path, N->fc1);
    OSP_TRY(linear(m, n, ffn, d, &l->fc1));
    snprintf(n, sizeof n, "%s.%s.bias", path, N->fc1);
    OSP_TRY(vec(m, n, 0, ffn, &l->b1));
    snprintf(n, sizeof n, "%s.%s", path, N->fc2);
    OSP_TRY(linear(m, n, d, ffn, &l->fc2));
    snprintf(n, sizeof n, "%s.%s.bias", path, N->fc2);
    return vec(m, n, 0, d, &l->b2);
}

/* A convolution weight as a dense [out, in·3] matrix: PyTorch's [out, in, 3]
 * (columns ci·3 + k), or MLX's [out, 3, in] (columns k·in + ci). */
static osp_status bind_conv(osp_whisper *m, const char *path, int64_t out, int64_t in, osp_weight *w, float **bias) {
    char n[512];
    const osp_st_tensor *t;
    int64_t shape[3] = {out, m->mlx ? 3 : in, m->mlx ? in : 3};
    snprintf(n, sizeof n, "%s.weight", path);
    OSP_TRY(tensor_of(m, n, 3, shape, 1, &t));
    memset(w, 0, sizeof *w);
    w->dtype = t->dtype;
    w->rows = out;
    w->cols = in * 3;
    w->data = t->data;
    snprintf(n, sizeof n, "%s.bias", path);
    return vec(m, n, 0, out, bias);
}

static osp_status read_config(osp_whisper *m) {
    char p[4200];
    snprintf(p, sizeof p, "%s/config.json", m->dir);
    json_error_t je;
    json_t *j = json_load_file(p, 0, &je);
    if (!j) return osp_err(OSP_ERR_FORMAT, "%s: %s (line %d)", p, je.text, je.line);
    osp_whisper_config *c = &m->cfg;
    const char *act = osp_json_str(j, "activation_function");
    if (json_object_get(j, "n_audio_state")) { /* the MLX community's / openai-whisper's ModelDimensions */
        m->mlx = 1;
        m->nm = &MLX_NAMES;
        int ts = osp_json_int(j, "n_text_state", 0);
        c->n_mels = osp_json_int(j, "n_mels", 80);
        c->d_model = osp_json_int(j, "n_audio_state", 0);
        c->enc_layers = osp_json_int(j, "n_audio_layer", 0);
        c->dec_layers = osp_json_int(j, "n_text_layer", 0);
        c->enc_heads = osp_json_int(j, "n_audio_head", 0);
        c->dec_heads = osp_json_int(j, "n_text_head", 0);
        c->enc_ffn = c->dec_ffn = 4 * c->d_model;
        c->n_audio_ctx = osp_json_int(j, "n_audio_ctx", 1500);
        c->n_text_ctx = osp_json_int(j, "n_text_ctx", 448);
        c->vocab = osp_json_int(j, "n_vocab", 0);
        c->decoder_start = c->vocab >= 51865 ? 50258 : 50257;
        c->eos = c->vocab >= 51865 ? 50257 : 50256;
        if (ts != c->d_model) {
            json_decref(j);
            return osp_err(OSP_ERR_UNSUPPORTED, "%s: n_text_state %d differs from n_audio_state %d", p, ts, c->d_model);
        }
    } else {
        m->nm = &HF_NAMES;
        c->n_mels = osp_json_int(j, "num_mel_bins", 80);
        c->d_model = osp_json_int(j, "d_model", 0);
        c->enc_layers = osp_json_int(j, "encoder_layers", 0);
        c->dec_layers = osp_json_int(j, "decoder_layers", 0);
        c->enc_heads = osp_json_int(j, "encoder_attention_heads", 0);
        c->dec_heads = osp_json_int(j, "decoder_attention_heads", 0);
        c->enc_ffn = osp_json_int(j, "encoder_ffn_dim", 0);
        c->dec_ffn = osp_json_int(j, "decoder_ffn_dim", 0);
        c->n_audio_ctx = osp_json_int(j, "max_source_positions", 1500);
        c->n_text_ctx = osp_json_int(j, "max_target_positions", 448);
        c->vocab = osp_json_int(j, "vocab_size", 0);
        c->decoder_start = osp_json_int(j, "decoder_start_token_id", 50257);
        c->eos = osp_json_int(j, "eos_token_id", 50256);
        c->scale_embedding = json_is_true(json_object_get(j, "scale_embedding"));
    }
    json_t *q = json_object_get(j, "quantization");
    if (!q) q = json_object_get(j, "quantization_config");
    if (json_is_object(q)) {
        c->qbits = osp_json_int(q, "bits", 0);
        c->qgroup = osp_json_int(q, "group_size", 64);
    }
    osp_status rc = OSP_OK;
    if (act && strcmp(act, "gelu") != 0)
        rc = osp_err(OSP_ERR_UNSUPPORTED, "%s: activation_function '%s' is not supported (gelu only)", p, act);
    else if (c->n_mels < 1 || c->n_mels > 512 || c->d_model < 1 || c->enc_layers < 1 || c->dec_layers < 1 ||
             c->enc_heads < 1 || c->dec_heads < 1 || c->d_model % c->enc_heads || c->d_model % c->dec_heads ||
             c->enc_ffn < 1 || c->dec_ffn < 1 || c->vocab < 1 || c->n_text_ctx < 1 || c->d_model > 65536 ||
             c->enc_layers > 256 || c->dec_layers > 256 || c->enc_ffn > 1 << 20 || c->dec_ffn > 1 << 20 ||
             c->vocab > 1 << 22 || c->n_text_ctx > ATT_MAX_KEYS)
        rc = osp_err(OSP_ERR_FORMAT, "%s: missing or inconsistent Whisper dimensions", p);
    else if (c->d_model / c->enc_heads > ATT_MAX_HD || c->d_model / c->dec_heads > ATT_MAX_HD)
        rc = osp_err(OSP_ERR_UNSUPPORTED, "%s: attention heads of more than %d dimensions", p, ATT_MAX_HD);
    else if (c->n_audio_ctx != N_FRAMES / 2)
        rc = osp_err(OSP_ERR_UNSUPPORTED, "%s: max_source_positions %d (30 s windows need 1500)", p, c->n_audio_ctx);
    else if (c->qbits && c->qbits != 2 && c->qbits != 3 && c->qbits != 4 && c->qbits != 5 && c->qbits != 6 &&
             c->qbits != 8)
        rc = osp_err(OSP_ERR_UNSUPPORTED, "%s: %d-bit quantization is not supported", p, c->qbits);
    else if (c->qbits && c->qgroup != 32 && c->qgroup != 64 && c->qgroup != 128)
        rc = osp_err(OSP_ERR_UNSUPPORTED, "%s: quantization group size %d is not supported", p, c->qgroup);
    json_decref(j);
    return rc;
}

int osp_whisper_detect(const char *dir) {
    char d[4096], p[4200];
    if (osp_resolve_model_dir(dir, d, sizeof d) != OSP_OK) {
        osp_err_clear();
        return 0;
    }
    snprintf(p, sizeof p, "%s/config.json", d);
    json_t *j = json_load_file(p, 0, NULL);
    if (!j) return 0;
    const char *mt = osp_json_str(j, "model_type");
    int yes = mt && !strcmp(mt, "whisper");
    json_t *a = json_array_get(json_object_get(j, "architectures"), 0);
    if (json_is_string(a) && !strcmp(json_string_value(a), "WhisperForConditionalGeneration")) yes = 1;
    json_decref(j);
    return yes;
}

/* Whisper's sinusoidal positions [len, ch]: sin then cos of t·e^(-k·ln(10000)/(ch/2-1)),
 * in f32 arithmetic as mlx_whisper computes them (HF checkpoints store them). */
void osp_whisper_sinusoids(int64_t len, int64_t ch, float *out) {
    const int64_t half = ch / 2;
    const float inc = (float)(log(10000.0) / (double)(half - 1));
    for (int64_t t = 0; t < len; t++)
        for (int64_t k = 0; k < half; k++) {
            float a = (float)t * expf(-inc * (float)k);
            out[t * ch + k] = sinf(a);
            out[t * ch + half + k] = cosf(a);
        }
}

static osp_status load_alignment_heads(osp_whisper *m) {
    const osp_whisper_config *c = &m->cfg;
    char p[4200];
    snprintf(p, sizeof p, "%s/generation_config.json", m->dir);
    json_t *g = osp_is_file(p) ? json_load_file(p, 0, NULL) : NULL;
    json_t *a = json_object_get(g, "alignment_heads");
    size_t n = json_is_array(a) ? json_array_size(a) : 0;
    m->align = osp_malloc(OSP_POOL_WEIGHTS, sizeof(int32_t) * 2 * (n ? n : (size_t)c->dec_layers * c->dec_heads));
    if (!m->align) {
        json_decref(g);
        return osp_err(OSP_ERR_NOMEM, "out of memory");
    }
    for (size_t i = 0; i < n; i++) {
        json_t *e = json_array_get(a, i);
        int l = (int)json_integer_value(json_array_get(e, 0)), h = (int)json_integer_value(json_array_get(e, 1));
        if (json_array_size(e) != 2 || l < 0 || l >= c->dec_layers || h < 0 || h >= c->dec_heads) {
            json_decref(g);
            return osp_err(OSP_ERR_FORMAT, "%s: alignment_heads[%zu] is not a (layer, head) of this model", p, i);
        }
        m->align[2 * m->n_align] = l;
        m->align[2 * m->n_align++ + 1] = h;
    }
    json_decref(g);
    for (int l = n ? c->dec_layers : c->dec_layers / 2; l < c->dec_layers; l++)
        for (int h = 0; h < c->dec_heads; h++) {
            m->align[2 * m->n_align] = l;
            m->align[2 * m->n_align++ + 1] = h;
        }
    return OSP_OK;
}

static osp_status load(osp_whisper *m) {
    OSP_TRY(read_config(m));
    char n[4200];
    snprintf(n, sizeof n, "%s/weights.npz", m->dir);
    if (osp_is_file(n)) {
        snprintf(n, sizeof n, "%s/model.safetensors", m->dir);
        char w2[4200];
        snprintf(w2, sizeof w2, "%s/weights.safetensors", m->dir);
        if (!osp_is_file(n) && !osp_is_file(w2))
            return osp_err(OSP_ERR_UNSUPPORTED, "%s: weights.npz is not read; save the weights as safetensors "
                                                "(mx.save_safetensors) as weights.safetensors", m->dir);
    }
    OSP_TRY(osp_st_open_dir(m->dir, &m->st));
    const osp_whisper_config *c = &m->cfg;
    const int64_t d = c->d_model;
    const int x = m->mlx;
    OSP_TRY(bind_conv(m, x ? "encoder.conv1" : "model.encoder.conv1", d, c->n_mels, &m->conv1, &m->conv1_b));
    OSP_TRY(bind_conv(m, x ? "encoder.conv2" : "model.encoder.conv2", d, d, &m->conv2, &m->conv2_b));
    if (x) {
        if (d % 2 || d < 4) return osp_err(OSP_ERR_FORMAT, "%s: n_audio_state %lld is not even", m->dir, (long long)d);
        m->enc_pos = osp_malloc(OSP_POOL_WEIGHTS, sizeof(float) * c->n_audio_ctx * d);
        if (!m->enc_pos) return osp_err(OSP_ERR_NOMEM, "%s: out of memory", m->dir);
        osp_whisper_sinusoids(c->n_audio_ctx, d, m->enc_pos);
    } else {
        OSP_TRY(vec(m, "model.encoder.embed_positions.weight", c->n_audio_ctx, d, &m->enc_pos));
    }
    m->enc = osp_calloc(OSP_POOL_WEIGHTS, sizeof(layer) * c->enc_layers);
    m->dec = osp_calloc(OSP_POOL_WEIGHTS, sizeof(layer) * c->dec_layers);
    if (!m->enc || !m->dec) return osp_err(OSP_ERR_NOMEM, "%s: out of memory", m->dir);
    for (int i = 0; i < c->enc_layers; i++) {
        snprintf(n, sizeof n, m->nm->enc_layer, i);
        OSP_TRY(bind_layer(m, n, d, c->enc_ffn, 0, &m->enc[i]));
    }
    OSP_TRY(bind_ln(m, x ? "encoder.ln_post" : "model.encoder.layer_norm", d, &m->enc_ln));
    OSP_TRY(linear(m, x ? "decoder.token_embedding" : "model.decoder.embed_tokens", c->vocab, d, &m->embed));
    OSP_TRY(vec(m, x ? "decoder.positional_embedding" : "model.decoder.embed_positions.weight", c->n_text_ctx, d,
                &m->dec_pos));
    for (int i = 0; i < c->dec_layers; i++) {
        snprintf(n, sizeof n, m->nm->dec_layer, i);
        OSP_TRY(bind_layer(m, n, d, c->dec_ffn, 1, &m->dec[i]));
    }
    OSP_TRY(bind_ln(m, x ? "decoder.ln" : "model.decoder.layer_norm", d, &m->dec_ln));
    OSP_TRY(load_alignment_heads(m));
    m->head = m->embed;
    if (!x && (osp_st_find(m->st, "proj_out.weight") || osp_st_find(m->st, "proj_out.scales")))
        OSP_TRY(linear(m, "proj_out", c->vocab, d, &m->head));
    return OSP_OK;
}

osp_status osp_whisper_load(const char *dir, osp_whisper **out) {
    *out = NULL;
    osp_whisper *m = osp_calloc(OSP_POOL_MISC, sizeof *m);
    if (!m) return osp_err(OSP_ERR_NOMEM, "out of memory");
    osp_status rc = osp_resolve_model_dir(dir, m->dir, sizeof m->dir);
    if (rc == OSP_OK) {
        m->ops = osp_ops_get();
        rc = load(m);
    }
    if (rc != OSP_OK) {
        osp_whisper_free(m);
        return rc;
    }
    *out = m;
    return OSP_OK;
}

static void free_ln(ln *l) {
    osp_free(l->w);
    osp_free(l->b);
}

static void free_layer(layer *l) {
    free_ln(&l->ln_self);
    free_ln(&l->ln_cross);
    free_ln(&l->ln_mlp);
    attn *A[] = {&l->self, &l->cross};
    for (int i = 0; i < 2; i++) {
        osp_free(A[i]->bq);
        osp_free(A[i]->bv);
        osp_free(A[i]->bo);
    }
    osp_free(l->b1);
    osp_free(l->b2);
}

void osp_whisper_free(osp_whisper *m) {
    if (!m) return;
    for (int i = 0; m->enc && i < m->cfg.enc_layers; i++) free_layer(&m->enc[i]);
    for (int i = 0; m->dec && i < m->cfg.dec_layers; i++) free_layer(&m->dec[i]);
    osp_free(m->enc);
    osp_free(m->dec);
    free_ln(&m->enc_ln);
    free_ln(&m->dec_ln);
    osp_free(m->conv1_b);
    osp_free(m->conv2_b);
    osp_free(m->enc_pos);
    osp_free(m->dec_pos);
    osp_free(m->align);
    osp_st_close(m->st);
    osp_free(m);
}

const osp_whisper_config *osp_whisper_get_config(const osp_whisper *m) { return &m->cfg; }

/* ---------------- state ---------------- */

static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

osp_status osp_whisper_state_new(const osp_whisper *m, osp_whisper_state **out) {
    return osp_whisper_state_new_rows(m, 1, out);
}

osp_status osp_whisper_state_new_rows(const osp_whisper *m, int32_t n_rows, osp_whisper_state **out) {
    *out = NULL;
    if (n_rows < 1 || n_rows > 64) return osp_err(OSP_ERR_INVALID, "whisper: %d decoder rows (1..64)", n_rows);
    const osp_whisper_config *c = &m->cfg;
    const int64_t d = c->d_model, A = c->n_audio_ctx, L = c->dec_layers;
    const int64_t rows = max64(N_FRAMES, c->n_text_ctx);
    osp_whisper_state *s = osp_calloc(OSP_POOL_MISC, sizeof *s);
    if (!s) return osp_err(OSP_ERR_NOMEM, "out of memory");
    s->m = m;
    s->n_rows = n_rows;
    s->pos = osp_calloc(OSP_POOL_MISC, sizeof(int32_t) * n_rows);
    s->tok_row = osp_malloc(OSP_POOL_MISC, sizeof(int32_t) * rows);
    s->tok_pos = osp_malloc(OSP_POOL_MISC, sizeof(int32_t) * rows);
    s->ck = osp_calloc(OSP_POOL_KV, sizeof(float *) * L);
    s->cv = osp_calloc(OSP_POOL_KV, sizeof(float *) * L);
    s->sk = osp_calloc(OSP_POOL_KV, sizeof(float *) * L);
    s->sv = osp_calloc(OSP_POOL_KV, sizeof(float *) * L);
    int ok = s->ck && s->cv && s->sk && s->sv && s->pos && s->tok_row && s->tok_pos;
    for (int64_t l = 0; ok && l < L; l++) {
        s->ck[l] = osp_malloc(OSP_POOL_KV, sizeof(float) * A * d);
        s->cv[l] = osp_malloc(OSP_POOL_KV, sizeof(float) * A * d);
        s->sk[l] = osp_malloc(OSP_POOL_KV, sizeof(float) * n_rows * c->n_text_ctx * d);
        s->sv[l] = osp_malloc(OSP_POOL_KV, sizeof(float) * n_rows * c->n_text_ctx * d);
        ok = s->ck[l] && s->cv[l] && s->sk[l] && s->sv[l];
    }
    float **bufs[] = {&s->x, &s->h, &s->q, &s->k, &s->v, &s->a};
    for (int i = 0; ok && i < 6; i++) ok = (*bufs[i] = osp_malloc(OSP_POOL_SCRATCH, sizeof(float) * rows * d)) != NULL;
    if (ok) s->enc_out = osp_malloc(OSP_POOL_SCRATCH, sizeof(float) * A * d);
    if (ok) s->col = osp_malloc(OSP_POOL_SCRATCH, sizeof(float) * N_FRAMES * 3 * max64(c->n_mels, d));
    if (ok) s->f = osp_malloc(OSP_POOL_SCRATCH, sizeof(float) * rows * max64(max64(c->enc_ffn, c->dec_ffn), d));
    if (!ok || !s->enc_out || !s->col || !s->f) {
        osp_whisper_state_free(s);
        return osp_err(OSP_ERR_NOMEM, "out of memory for a Whisper state");
    }
    *out = s;
    return OSP_OK;
}

void osp_whisper_state_free(osp_whisper_state *s) {
    if (!s) return;
    for (int l = 0; l < s->m->cfg.dec_layers; l++) {
        if (s->ck) osp_free(s->ck[l]);
        if (s->cv) osp_free(s->cv[l]);
        if (s->sk) osp_free(s->sk[l]);
        if (s->sv) osp_free(s->sv[l]);
    }
    osp_free(s->ck);
    osp_free(s->cv);
    osp_free(s->sk);
    osp_free(s->sv);
    osp_free(s->pos);
    osp_free(s->tok_row);
    osp_free(s->tok_pos);
    float *bufs[] = {s->x, s->h, s->q, s->k, s->v, s->a, s->enc_out, s->col, s->f};
    for (int i = 0; i < 9; i++) osp_free(bufs[i]);
    osp_free(s);
}

/* ---------------- operations ---------------- */

/* y[n, w->rows] = x[n, w->cols] · Wᵀ (+ bias), split over the thread pool
 * in blocks of 64 rows of W × 64 tokens (a row's numbers never depend on
 * the split). */
typedef struct mm_ctx {
    const osp_ops *ops;
    const osp_weight *w;
    const float *x, *bias;
    float *y;
    int64_t n, rblocks;
} mm_ctx;

#define MM_ROWS 64
#define MM_TOKS 64

static void mm_task(void *p, int64_t t) {
    const mm_ctx *c = p;
    int64_t rb = t % c->rblocks, tb = t / c->rblocks;
    int64_t r0 = rb * MM_ROWS, r1 = r0 + MM_ROWS < c->w->rows ? r0 + MM_ROWS : c->w->rows;
    int64_t t0 = tb * MM_TOKS, nt = c->n - t0 < MM_TOKS ? c->n - t0 : MM_TOKS;
    float *y = c->y + t0 * c->w->rows + r0;
    c->ops->matmul(c->w, c->x + t0 * c->w->cols, nt, y, c->w->rows, r0, r1);
    if (c->bias)
        for (int64_t i = 0; i < nt; i++)
            for (int64_t r = r0; r < r1; r++) y[i * c->w->rows + r - r0] += c->bias[r];
}

static void par(const osp_whisper_state *s, int64_t n, osp_task_fn fn, void *ctx) {
    if (s->serial)
        for (int64_t t = 0; t < n; t++) fn(ctx, t);
    else
        osp_parallel_for(n, fn, ctx);
}

static void matmul(const osp_whisper_state *s, const osp_weight *w, const float *x, int64_t n, const float *bias,
                   float *y) {
    mm_ctx c = {s->m->ops, w, x, bias, y, n, (w->rows + MM_ROWS - 1) / MM_ROWS};
    par(s, c.rblocks * ((n + MM_TOKS - 1) / MM_TOKS), mm_task, &c);
}

static void layer_norm(const ln *l, const float *x, float *y, int64_t n, int64_t d) {
    for (int64_t t = 0; t < n; t++) {
        const float *xi = x + t * d;
        float *yi = y + t * d;
        double mean = 0, var = 0;
        for (int64_t i = 0; i < d; i++) mean += xi[i];
        mean /= d;
        for (int64_t i = 0; i < d; i++) var += (xi[i] - mean) * (xi[i] - mean);
        float inv = (float)(1.0 / sqrt(var / d + LN_EPS));
        for (int64_t i = 0; i < d; i++) yi[i] = (float)(xi[i] - mean) * inv * l->w[i] + l->b[i];
    }
}

static void gelu(float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] = 0.5f * x[i] * (1.0f + erff(x[i] * (float)M_SQRT1_2));
}

static void add(float *y, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] += x[i];
}

/* Attention over all S keys of a window (the encoder's self-attention, the
 * decoder's cross-attention), with K as [heads][S][hd] and V transposed,
 * [heads][hd][S], so that a block of 16 queries is two matrix products on
 * the ops table's GEMM: scores = Q_blk K_hᵀ, out = P V_h (as Vᵀ_h rows).
 * Fewer than 16 queries: one query at a time (scores, softmax, dots). */
typedef struct fatt_ctx {
    const osp_ops *ops;
    const float *q, *kh, *vt;
    float *out;
    int64_t n, S, d, hd, qblocks;
} fatt_ctx;

static void fatt_task(void *p, int64_t t) {
    const fatt_ctx *c = p;
    const int64_t hd = c->hd, S = c->S, h = t / c->qblocks, i0 = (t % c->qblocks) * ATT_Q;
    const int64_t ni = c->n - i0 < ATT_Q ? c->n - i0 : ATT_Q;
    const float *K = c->kh + h * S * hd, *Vt = c->vt + h * hd * S;
    float qb[ATT_Q * ATT_MAX_HD], ob[ATT_Q * ATT_MAX_HD], sc[ATT_Q * ATT_FULL_KEYS];
    for (int64_t i = 0; i < ni; i++) memcpy(qb + i * hd, c->q + (i0 + i) * c->d + h * hd, sizeof(float) * hd);
    if (ni == ATT_Q) {
        osp_weight kw = {.dtype = OSP_DT_F32, .rows = S, .cols = hd, .data = K};
        osp_weight vw = {.dtype = OSP_DT_F32, .rows = hd, .cols = S, .data = Vt};
        c->ops->matmul(&kw, qb, ni, sc, S, 0, S);
        for (int64_t i = 0; i < ni; i++) c->ops->softmax(sc + i * S, S);
        c->ops->matmul(&vw, sc, ni, ob, hd, 0, hd);
    } else {
        for (int64_t i = 0; i < ni; i++) {
            c->ops->scores(sc, qb + i * hd, K, S, hd, hd);
            c->ops->softmax(sc, S);
            for (int64_t j = 0; j < hd; j++) ob[i * hd + j] = c->ops->dot(sc, Vt + j * S, S);
        }
    }
    for (int64_t i = 0; i < ni; i++) memcpy(c->out + (i0 + i) * c->d + h * hd, ob + i * hd, sizeof(float) * hd);
}

/* The pre-LN MLP of a block, its residual added to x [n, d]: encoder and decoder alike. */
static void mlp_block(const osp_whisper_state *s, const layer *L, float *x, int64_t n, int64_t d, int64_t ffn) {
    layer_norm(&L->ln_mlp, x, s->h, n, d);
    matmul(s, &L->fc1, s->h, n, L->b1, s->f);
    gelu(s->f, n * ffn);
    matmul(s, &L->fc2, s->f, n, L->b2, s->h);
    add(x, s->h, n * d);
}

static void full_attention(const osp_whisper_state *s, const float *q, const float *kh, const float *vt, float *out,
                           int64_t n, int heads) {
    const int64_t d = s->m->cfg.d_model;
    fatt_ctx c = {s->m->ops, q, kh, vt, out, n, s->m->cfg.n_audio_ctx, d, d / heads, (n + ATT_Q - 1) / ATT_Q};
    par(s, heads * c.qblocks, fatt_task, &c);
}

/* k, v [S, d] (heads as column ranges) → kh [heads][S][hd], vt [heads][hd][S]. */
static void pack_kv(const float *k, const float *v, float *kh, float *vt, int64_t S, int64_t d, int heads) {
    const int64_t hd = d / heads;
    for (int64_t h = 0; h < heads; h++)
        for (int64_t j = 0; j < S; j++) {
            memcpy(kh + (h * S + j) * hd, k + j * d + h * hd, sizeof(float) * hd);
            for (int64_t c = 0; c < hd; c++) vt[(h * hd + c) * S + j] = v[j * d + h * hd + c];
        }
}

static void scale(float *x, int64_t n, float s) {
    for (int64_t i = 0; i < n; i++) x[i] *= s;
}

/* ---------------- encoder ---------------- */

osp_status osp_whisper_encode(osp_whisper_state *s, const float *mel) {
    const osp_whisper *m = s->m;
    const osp_whisper_config *c = &m->cfg;
    const int64_t d = c->d_model, A = c->n_audio_ctx, C = c->n_mels, hd = d / c->enc_heads;
    if (!mel) return osp_err(OSP_ERR_INVALID, "whisper encode: no mel spectrogram");
    s->encoded = 0;
    memset(s->pos, 0, sizeof(int32_t) * s->n_rows);
    /* conv1 (k 3, padding 1): col[t, ci·3 + j] (MLX: [t, j·C + ci]) = mel[ci, t + j - 1] */
    for (int64_t t = 0; t < N_FRAMES; t++)
        for (int64_t ci = 0; ci < C; ci++)
            for (int j = 0; j < 3; j++) {
                int64_t src = t + j - 1;
                s->col[m->mlx ? t * C * 3 + j * C + ci : (t * C + ci) * 3 + j] =
                    src >= 0 && src < N_FRAMES ? mel[ci * N_FRAMES + src] : 0.0f;
            }
    matmul(s, &m->conv1, s->col, N_FRAMES, m->conv1_b, s->f); /* [3000, d] */
    gelu(s->f, N_FRAMES * d);
    /* conv2 (k 3, stride 2, padding 1): col[t, ci·3 + j] (MLX: [t, j·d + ci]) = h1[2t + j - 1, ci] */
    for (int64_t t = 0; t < A; t++)
        for (int64_t ci = 0; ci < d; ci++)
            for (int j = 0; j < 3; j++) {
                int64_t src = 2 * t + j - 1;
                s->col[m->mlx ? t * d * 3 + j * d + ci : (t * d + ci) * 3 + j] =
                    src >= 0 && src < N_FRAMES ? s->f[src * d + ci] : 0.0f;
            }
    float *x = s->x;
    matmul(s, &m->conv2, s->col, A, m->conv2_b, x);
    gelu(x, A * d);
    add(x, m->enc_pos, A * d);
    const float qs = 1.0f / sqrtf((float)hd);
    for (int l = 0; l < c->enc_layers; l++) {
        const layer *L = &m->enc[l];
        layer_norm(&L->ln_self, x, s->h, A, d);
        matmul(s, &L->self.q, s->h, A, L->self.bq, s->q);
        matmul(s, &L->self.k, s->h, A, NULL, s->k);
        matmul(s, &L->self.v, s->h, A, L->self.bv, s->v);
        scale(s->q, A * d, qs);
        float *kh = s->col, *vt = s->col + A * d;
        pack_kv(s->k, s->v, kh, vt, A, d, c->enc_heads);
        full_attention(s, s->q, kh, vt, s->a, A, c->enc_heads);
        matmul(s, &L->self.o, s->a, A, L->self.bo, s->h);
        add(x, s->h, A * d);
        mlp_block(s, L, x, A, d, c->enc_ffn);
    }
    layer_norm(&m->enc_ln, x, s->enc_out, A, d);
    for (int l = 0; l < c->dec_layers; l++) { /* packed for full_attention */
        matmul(s, &m->dec[l].cross.k, s->enc_out, A, NULL, s->k);
        matmul(s, &m->dec[l].cross.v, s->enc_out, A, m->dec[l].cross.bv, s->v);
        pack_kv(s->k, s->v, s->ck[l], s->cv[l], A, d, c->dec_heads);
    }
    s->encoded = 1;
    return OSP_OK;
}

void osp_whisper_state_set_serial(osp_whisper_state *s, int serial) { s->serial = serial; }

osp_status osp_whisper_capture_qk(osp_whisper_state *s, const int32_t *heads, int32_t n_heads, float *out,
                                  int32_t max_tok) {
    const osp_whisper_config *c = &s->m->cfg;
    for (int32_t k = 0; k < n_heads; k++)
        if (heads[2 * k] < 0 || heads[2 * k] >= c->dec_layers || heads[2 * k + 1] < 0 ||
            heads[2 * k + 1] >= c->dec_heads)
            return osp_err(OSP_ERR_RANGE, "whisper: no decoder head (%d, %d)", heads[2 * k], heads[2 * k + 1]);
    s->qk_heads = heads;
    s->n_qk = out ? n_heads : 0;
    s->qk_out = n_heads ? out : NULL;
    s->qk_max_tok = max_tok;
    return OSP_OK;
}

const int32_t *osp_whisper_alignment_heads(const osp_whisper *m, int32_t *n) {
    *n = m->n_align;
    return m->align;
}

const float *osp_whisper_encoder_out(const osp_whisper_state *s) { return s->encoded ? s->enc_out : NULL; }

/* ---------------- decoder ---------------- */

int32_t osp_whisper_pos(const osp_whisper_state *s) { return s->pos[0]; }
int32_t osp_whisper_row_pos(const osp_whisper_state *s, int32_t row) {
    return row >= 0 && row < s->n_rows ? s->pos[row] : -1;
}
int32_t osp_whisper_rows(const osp_whisper_state *s) { return s->n_rows; }

osp_status osp_whisper_truncate(osp_whisper_state *s, int32_t n) { return osp_whisper_truncate_row(s, 0, n); }

osp_status osp_whisper_truncate_row(osp_whisper_state *s, int32_t row, int32_t n) {
    if (row < 0 || row >= s->n_rows) return osp_err(OSP_ERR_RANGE, "whisper: no decoder row %d", row);
    if (n < 0 || n > s->pos[row])
        return osp_err(OSP_ERR_RANGE, "whisper: cannot keep %d of %d cached tokens", n, s->pos[row]);
    s->pos[row] = n;
    return OSP_OK;
}

osp_status osp_whisper_copy_row(osp_whisper_state *s, int32_t dst, int32_t src) {
    if (dst < 0 || dst >= s->n_rows || src < 0 || src >= s->n_rows)
        return osp_err(OSP_ERR_RANGE, "whisper: no decoder row %d or %d", dst, src);
    if (dst == src) return OSP_OK;
    const osp_whisper_config *c = &s->m->cfg;
    const int64_t row = (int64_t)c->n_text_ctx * c->d_model, n = (int64_t)s->pos[src] * c->d_model;
    for (int l = 0; l < c->dec_layers; l++) {
        memcpy(s->sk[l] + dst * row, s->sk[l] + src * row, sizeof(float) * n);
        memcpy(s->sv[l] + dst * row, s->sv[l] + src * row, sizeof(float) * n);
    }
    s->pos[dst] = s->pos[src];
    return OSP_OK;
}

/* Causal self-attention of n tokens, token i in row tok_row[i] at position
 * tok_pos[i] over its row's cache [0, tok_pos[i]]. One task per (head,
 * block of 16 tokens). */
typedef struct datt_ctx {
    const osp_ops *ops;
    const float *q, *K, *V; /* K, V: the layer's [n_rows][ctx][d] */
    float *out;
    const int32_t *row, *pos;
    int64_t n, d, hd, ctx, qblocks;
} datt_ctx;

static void datt_task(void *p, int64_t t) {
    const datt_ctx *c = p;
    int64_t h = t / c->qblocks, i0 = (t % c->qblocks) * ATT_Q, i1 = i0 + ATT_Q < c->n ? i0 + ATT_Q : c->n;
    float sc[ATT_MAX_KEYS];
    for (int64_t i = i0; i < i1; i++) {
        const int64_t keys = c->pos[i] + 1, base = (int64_t)c->row[i] * c->ctx * c->d + h * c->hd;
        float *o = c->out + i * c->d + h * c->hd;
        c->ops->scores(sc, c->q + i * c->d + h * c->hd, c->K + base, keys, c->d, c->hd);
        c->ops->softmax(sc, keys);
        memset(o, 0, sizeof(float) * c->hd);
        c->ops->wsum(o, sc, c->V + base, keys, c->d, c->hd);
    }
}

static void capture_qk(const osp_whisper_state *s, int l, int32_t n) {
    const osp_whisper_config *c = &s->m->cfg;
    const int64_t d = c->d_model, hd = d / c->dec_heads, A = c->n_audio_ctx;
    for (int32_t k = 0; k < s->n_qk; k++) {
        if (s->qk_heads[2 * k] != l) continue;
        const int64_t h = s->qk_heads[2 * k + 1];
        for (int32_t i = 0; i < n && s->tok_pos[i] < s->qk_max_tok; i++)
            s->m->ops->scores(s->qk_out + ((int64_t)k * s->qk_max_tok + s->tok_pos[i]) * A, s->q + i * d + h * hd,
                              s->ck[l] + h * A * hd, A, hd, hd);
    }
}

/* The decoder over n tokens whose rows and positions are in s->tok_row /
 * s->tok_pos; the final hidden states (after layer_norm) go to s->h. */
static void decoder_body(osp_whisper_state *s, const int32_t *ids, int32_t n) {
    const osp_whisper *m = s->m;
    const osp_whisper_config *c = &m->cfg;
    const int64_t d = c->d_model, hd = d / c->dec_heads, ctx = c->n_text_ctx;
    float *x = s->x;
    const float es = c->scale_embedding ? sqrtf((float)d) : 1.0f;
    for (int32_t i = 0; i < n; i++) {
        osp_weight_row_f32(&m->embed, ids[i], x + i * d);
        for (int64_t j = 0; j < d; j++) x[i * d + j] = x[i * d + j] * es + m->dec_pos[(int64_t)s->tok_pos[i] * d + j];
    }
    const float qs = 1.0f / sqrtf((float)hd);
    for (int l = 0; l < c->dec_layers; l++) {
        const layer *L = &m->dec[l];
        float *K = s->sk[l], *V = s->sv[l];
        layer_norm(&L->ln_self, x, s->h, n, d);
        matmul(s, &L->self.q, s->h, n, L->self.bq, s->q);
        matmul(s, &L->self.k, s->h, n, NULL, s->k);
        matmul(s, &L->self.v, s->h, n, L->self.bv, s->v);
        for (int32_t i = 0; i < n; i++) {
            int64_t at = ((int64_t)s->tok_row[i] * ctx + s->tok_pos[i]) * d;
            memcpy(K + at, s->k + i * d, sizeof(float) * d);
            memcpy(V + at, s->v + i * d, sizeof(float) * d);
        }
        scale(s->q, n * d, qs);
        datt_ctx ac = {m->ops, s->q, K, V, s->a, s->tok_row, s->tok_pos, n, d, hd, ctx, (n + ATT_Q - 1) / ATT_Q};
        par(s, c->dec_heads * ac.qblocks, datt_task, &ac);
        matmul(s, &L->self.o, s->a, n, L->self.bo, s->h);
        add(x, s->h, n * d);
        layer_norm(&L->ln_cross, x, s->h, n, d);
        matmul(s, &L->cross.q, s->h, n, L->cross.bq, s->q);
        scale(s->q, n * d, qs);
        if (s->qk_out) capture_qk(s, l, n);
        full_attention(s, s->q, s->ck[l], s->cv[l], s->a, n, c->dec_heads);
        matmul(s, &L->cross.o, s->a, n, L->cross.bo, s->h);
        add(x, s->h, n * d);
        mlp_block(s, L, x, n, d, c->dec_ffn);
    }
}

static osp_status check_ids(const osp_whisper_config *c, const int32_t *ids, int32_t n) {
    for (int32_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= c->vocab)
            return osp_err(OSP_ERR_RANGE, "whisper decode: token id %d is outside the vocabulary (%d)", ids[i], c->vocab);
    return OSP_OK;
}

osp_status osp_whisper_decode(osp_whisper_state *s, const int32_t *ids, int32_t n, float *logits, float *last) {
    const osp_whisper *m = s->m;
    const osp_whisper_config *c = &m->cfg;
    const int64_t d = c->d_model, p = s->pos[0];
    if (!s->encoded) return osp_err(OSP_ERR_INVALID, "whisper decode: no audio window encoded yet");
    if (n < 1 || !ids) return osp_err(OSP_ERR_INVALID, "whisper decode: no tokens");
    if (p + n > c->n_text_ctx)
        return osp_err(OSP_ERR_RANGE, "whisper decode: %lld tokens exceed the decoder's %d positions", (long long)(p + n),
                       c->n_text_ctx);
    OSP_TRY(check_ids(c, ids, n));
    for (int32_t i = 0; i < n; i++) {
        s->tok_row[i] = 0;
        s->tok_pos[i] = (int32_t)p + i;
    }
    decoder_body(s, ids, n);
    s->pos[0] += n;
    float *x = s->x;
    if (logits) {
        layer_norm(&m->dec_ln, x, s->h, n, d);
        matmul(s, &m->head, s->h, n, NULL, logits);
        if (last) memcpy(last, logits + (int64_t)(n - 1) * c->vocab, sizeof(float) * c->vocab);
    } else if (last) {
        layer_norm(&m->dec_ln, x + (int64_t)(n - 1) * d, s->h, 1, d);
        matmul(s, &m->head, s->h, 1, NULL, last);
    }
    return OSP_OK;
}

osp_status osp_whisper_decode_rows(osp_whisper_state *s, const int32_t *rows, int32_t nr, const int32_t *ids,
                                   float *logits) {
    const osp_whisper *m = s->m;
    const osp_whisper_config *c = &m->cfg;
    if (!s->encoded) return osp_err(OSP_ERR_INVALID, "whisper decode: no audio window encoded yet");
    if (nr < 1 || nr > s->n_rows || !ids || !rows || !logits)
        return osp_err(OSP_ERR_INVALID, "whisper decode: %d rows of %d", nr, s->n_rows);
    OSP_TRY(check_ids(c, ids, nr));
    for (int32_t i = 0; i < nr; i++) {
        if (rows[i] < 0 || rows[i] >= s->n_rows) return osp_err(OSP_ERR_RANGE, "whisper decode: no row %d", rows[i]);
        for (int32_t j = 0; j < i; j++)
            if (rows[j] == rows[i]) return osp_err(OSP_ERR_INVALID, "whisper decode: row %d twice in a step", rows[i]);
        if (s->pos[rows[i]] + 1 > c->n_text_ctx)
            return osp_err(OSP_ERR_RANGE, "whisper decode: row %d is full (%d positions)", rows[i], c->n_text_ctx);
        s->tok_row[i] = rows[i];
        s->tok_pos[i] = s->pos[rows[i]];
    }
    decoder_body(s, ids, nr);
    for (int32_t i = 0; i < nr; i++) s->pos[rows[i]]++;
    layer_norm(&m->dec_ln, s->x, s->h, nr, c->d_model);
    matmul(s, &m->head, s->h, nr, NULL, logits);
    return OSP_OK;
}
