/* model/whisper.c: the Whisper encoder-decoder (see whisper.h for the math),
 * written as osp_backend operations (backend/backend.h), so that it runs on
 * any backend: the model code never touches activation memory.
 *
 * Layout: every linear weight stays as stored in the mmapped safetensors
 * (osp_weight: dense or MLX-quantized), placed with the backend's `place`
 * where the device cannot read the mapping (the GPU); vectors (biases,
 * LayerNorm parameters) and the encoder positions are converted to f32 at
 * load and handed to the backend (adopt_vec); the decoder positions stay on
 * the host, where a step's input rows (embedding + position) are made and
 * written. Activations are [tokens, features] row-major f32 osp_dbufs.
 * Heads are column ranges of d_model (head h: columns [h·hd, (h+1)·hd)).
 *
 * A state's buffers are sized at creation for the largest case (the
 * encoder's 3000 frames, the decoder's n_text_ctx tokens) and reused; the
 * decoder's logits buffer grows to the largest teacher-forced chunk.
 */
#include "whisper.h"
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "backend/backend.h"
#include "core/fs.h"
#include "core/json_get.h"
#include "model/safetensors.h"
#include "tensor/tensor.h"

#define N_FRAMES 3000 /* mel frames of a 30 s window */
#define LN_EPS 1e-5f
#define ATT_MAX_KEYS 4096  /* decoder positions, at most (the backends' bound) */
#define ATT_MAX_HD 256     /* head size, at most (Whisper's is 64) */

typedef struct ln {
    osp_dbuf *w, *b; /* [d] */
} ln;

typedef struct attn {
    osp_weight q, k, v, o;  /* [d, d] */
    osp_dbuf *bq, *bv, *bo; /* [d]; k has no bias */
} attn;

typedef struct layer {
    ln ln_self, ln_cross, ln_mlp;
    attn self, cross; /* cross: decoder only */
    osp_weight fc1;   /* [ffn, d] */
    osp_weight fc2;   /* [d, ffn] */
    osp_dbuf *b1, *b2; /* [ffn], [d] */
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
    const osp_backend *be;
    void *placed;     /* the backend's placement of the linear weights, or NULL */
    osp_weight conv1; /* [d, n_mels·3] (PyTorch's [out, in, k] flattened) */
    osp_weight conv2; /* [d, d·3] */
    osp_dbuf *conv1_b, *conv2_b; /* [d] */
    osp_dbuf *enc_pos;           /* [n_audio_ctx, d] */
    layer *enc, *dec;
    ln enc_ln, dec_ln;
    osp_weight embed;   /* [vocab, d] tokens (rows gathered on the host) */
    osp_weight head;    /* [vocab, d]: proj_out, or embed when tied */
    float *dec_pos;     /* host [n_text_ctx, d] */
    int32_t *align;     /* alignment heads, (layer, head) pairs: generation_config.json's, else every head of
                           the last half of the decoder layers (openai-whisper's default) */
    int32_t n_align;
};

/* Per-row capture of the alignment heads' cross-attention scores (word timestamps). */
typedef struct row_capture {
    const int32_t *heads; /* [n] (layer, head) pairs */
    int32_t n, max_tok;
    float *out;           /* host [n][max_tok][A] */
} row_capture;

/* A state holds n_slots windows (cross K/V of each) and n_rows decoder rows,
 * rows_per_slot of them over each window (row r reads slot r / rows_per_slot).
 * One window and its beams is the plain state; a batch (speech/batch.c) is one
 * state of many slots whose steps mix rows of several requests.
 *
 * A view (osp_whisper_state_view) is a request's part of such a state: its rows
 * are [row0, row0 + n_rows) of the base, positions and captures are the base's,
 * and its encodes and decoder steps are handed to the owner of the base
 * (`submit`), which runs them among other views' in one call. */
struct osp_whisper_state {
    const osp_whisper *m;
    const osp_backend *be;
    osp_be_session *bs; /* NULL in a view */
    int32_t n_rows;     /* decoder sequences (beams) */
    int32_t n_slots, rows_per_slot, enc_windows; /* windows held; rows over each; windows an encode takes at most */
    int32_t *pos;       /* [n_rows]: tokens in each row's self-attention cache (a view: its base's, from row0) */
    row_capture *cap;   /* [n_rows] (a view: its base's, from row0) */
    uint8_t *encoded;   /* [n_slots] */
    int64_t rows_cap;   /* tokens (rows of activations) a call holds at most */
    int32_t *tok_row, *tok_pos, *tok_id; /* [rows_cap]: each token's row, position and id */
    float *xin;         /* host [rows_cap, d]: a step's input rows */
    float *enc_host;    /* host [A, d]: the encoder output, read back (one-slot states) */
    osp_dbuf *enc_out;  /* [enc_windows · A, d] */
    osp_dbuf **ck, **cv; /* per decoder layer [n_slots]: cross K [heads][A][hd] and V [heads][hd][A] of a window */
    osp_dbuf **sk, **sv; /* per decoder layer [n_rows][n_text_ctx][d]: self K/V */
    /* scratch */
    osp_dbuf *mel;      /* [enc_windows][n_mels, 3000] */
    osp_dbuf *col;      /* [3000, max(n_mels, d)·3]: im2col of a convolution (one window at a time) */
    osp_dbuf *x, *h, *q, *k, *v, *a; /* [rows_cap, d] */
    osp_dbuf *f;        /* [rows_cap, max(ffn, 2d, A)]: MLP rows, conv1's output, captured scores */
    osp_dbuf *logits;   /* [logits_cap / vocab, vocab] */
    int64_t logits_cap;
    float *logits_h;    /* host [logits_cap]: a step's logits read back at once when several runs want some */
    /* a view */
    osp_whisper_state *base;
    int32_t slot, row0;
    osp_whisper_submit_fn submit;
    void *submit_ctx;
    int32_t *copies;    /* [3 · n_rows]: (dst, src, n) of the base, queued for the next step */
    int32_t n_copies;
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

/* The same, handed to the backend. */
static osp_status bvec(osp_whisper *m, const char *name, int64_t rows, int64_t cols, osp_dbuf **out) {
    float *v;
    OSP_TRY(vec(m, name, rows, cols, &v));
    *out = m->be->adopt_vec(v, (rows ? rows : 1) * cols);
    if (!*out) return osp_err(OSP_ERR_NOMEM, "%s: out of device memory for '%s'", m->dir, name);
    return OSP_OK;
}

static osp_status bind_ln(osp_whisper *m, const char *path, int64_t d, ln *l) {
    char n[512];
    snprintf(n, sizeof n, "%s.weight", path);
    OSP_TRY(bvec(m, n, 0, d, &l->w));
    snprintf(n, sizeof n, "%s.bias", path);
    return bvec(m, n, 0, d, &l->b);
}

static osp_status bind_attn(osp_whisper *m, const char *path, int64_t d, attn *a) {
    char n[512];
    const char *const *P = m->nm->proj;
    osp_weight *W[] = {&a->q, &a->k, &a->v, &a->o};
    osp_dbuf **B[] = {&a->bq, NULL, &a->bv, &a->bo};
    for (int i = 0; i < 4; i++) {
        snprintf(n, sizeof n, "%s.%s", path, P[i]);
        OSP_TRY(linear(m, n, d, d, W[i]));
        if (!B[i]) continue;
        snprintf(n, sizeof n, "%s.%s.bias", path, P[i]);
        OSP_TRY(bvec(m, n, 0, d, B[i]));
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
    OSP_TRY(bvec(m, n, 0, ffn, &l->b1));
    snprintf(n, sizeof n, "%s.%s", path, N->fc2);
    OSP_TRY(linear(m, n, d, ffn, &l->fc2));
    snprintf(n, sizeof n, "%s.%s.bias", path, N->fc2);
    return bvec(m, n, 0, d, &l->b2);
}

/* A convolution weight as a dense [out, in·3] matrix: PyTorch's [out, in, 3]
 * (columns ci·3 + k), or MLX's [out, 3, in] (columns k·in + ci). */
static osp_status bind_conv(osp_whisper *m, const char *path, int64_t out, int64_t in, osp_weight *w, osp_dbuf **bias) {
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
    return bvec(m, n, 0, out, bias);
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

/* The linear weights into the backend's memory (the GPU cannot read the
 * mapping); the token embedding's rows are still gathered from the mapping
 * on the host (a tied head is its struct copy, placed as the head). */
static osp_status place(osp_whisper *m) {
    const osp_whisper_config *c = &m->cfg;
    int n = 0, cap = 3 + 6 * c->enc_layers + 10 * c->dec_layers;
    osp_weight **ws = osp_malloc(OSP_POOL_MISC, sizeof *ws * (size_t)cap);
    if (!ws) return osp_err(OSP_ERR_NOMEM, "out of memory");
    ws[n++] = &m->conv1, ws[n++] = &m->conv2, ws[n++] = &m->head;
    for (int i = 0; i < c->enc_layers + c->dec_layers; i++) {
        int dec = i >= c->enc_layers;
        layer *L = dec ? &m->dec[i - c->enc_layers] : &m->enc[i];
        attn *A[] = {&L->self, &L->cross};
        for (int k = 0; k < 1 + dec; k++) ws[n++] = &A[k]->q, ws[n++] = &A[k]->k, ws[n++] = &A[k]->v, ws[n++] = &A[k]->o;
        ws[n++] = &L->fc1, ws[n++] = &L->fc2;
    }
    const void *keep[] = {m->embed.data};
    osp_status rc = m->be->place(ws, n, keep, 1, NULL, 0, &m->placed);
    osp_free(ws);
    return rc;
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
        float *pos = osp_malloc(OSP_POOL_WEIGHTS, sizeof(float) * c->n_audio_ctx * d);
        if (!pos) return osp_err(OSP_ERR_NOMEM, "%s: out of memory", m->dir);
        osp_whisper_sinusoids(c->n_audio_ctx, d, pos);
        if (!(m->enc_pos = m->be->adopt_vec(pos, c->n_audio_ctx * d)))
            return osp_err(OSP_ERR_NOMEM, "%s: out of device memory", m->dir);
    } else {
        OSP_TRY(bvec(m, "model.encoder.embed_positions.weight", c->n_audio_ctx, d, &m->enc_pos));
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
    return m->be->needs_place ? place(m) : OSP_OK;
}

osp_status osp_whisper_load(const char *dir, osp_whisper **out) { return osp_whisper_load_on(dir, 0, out); }

osp_status osp_whisper_load_on(const char *dir, int device, osp_whisper **out) {
    *out = NULL;
    const osp_backend *be = osp_backend_get((osp_device)device);
    if (!be) return OSP_ERR_UNSUPPORTED;
    osp_whisper *m = osp_calloc(OSP_POOL_MISC, sizeof *m);
    if (!m) return osp_err(OSP_ERR_NOMEM, "out of memory");
    m->be = be;
    osp_status rc = osp_resolve_model_dir(dir, m->dir, sizeof m->dir);
    if (rc == OSP_OK) rc = load(m);
    if (rc != OSP_OK) {
        osp_whisper_free(m);
        return rc;
    }
    *out = m;
    return OSP_OK;
}

static void free_vec(const osp_whisper *m, osp_dbuf *v) {
    if (v) m->be->free_vec(v);
}

static void free_ln(const osp_whisper *m, ln *l) {
    free_vec(m, l->w);
    free_vec(m, l->b);
}

static void free_layer(const osp_whisper *m, layer *l) {
    free_ln(m, &l->ln_self);
    free_ln(m, &l->ln_cross);
    free_ln(m, &l->ln_mlp);
    attn *A[] = {&l->self, &l->cross};
    for (int i = 0; i < 2; i++) {
        free_vec(m, A[i]->bq);
        free_vec(m, A[i]->bv);
        free_vec(m, A[i]->bo);
    }
    free_vec(m, l->b1);
    free_vec(m, l->b2);
}

void osp_whisper_free(osp_whisper *m) {
    if (!m) return;
    if (m->placed) m->be->unplace(m->placed);
    for (int i = 0; m->enc && i < m->cfg.enc_layers; i++) free_layer(m, &m->enc[i]);
    for (int i = 0; m->dec && i < m->cfg.dec_layers; i++) free_layer(m, &m->dec[i]);
    osp_free(m->enc);
    osp_free(m->dec);
    free_ln(m, &m->enc_ln);
    free_ln(m, &m->dec_ln);
    free_vec(m, m->conv1_b);
    free_vec(m, m->conv2_b);
    free_vec(m, m->enc_pos);
    osp_free(m->dec_pos);
    osp_free(m->align);
    osp_st_close(m->st);
    osp_free(m);
}

const osp_whisper_config *osp_whisper_get_config(const osp_whisper *m) { return &m->cfg; }

/* ---------------- state ---------------- */

static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

osp_status osp_whisper_state_new(const osp_whisper *m, osp_whisper_state **out) {
    return osp_whisper_state_new_slots(m, 1, 1, 1, out);
}

osp_status osp_whisper_state_new_rows(const osp_whisper *m, int32_t n_rows, osp_whisper_state **out) {
    return osp_whisper_state_new_slots(m, 1, n_rows, 1, out);
}

osp_status osp_whisper_state_new_slots(const osp_whisper *m, int32_t n_slots, int32_t rows_per_slot,
                                       int32_t enc_windows, osp_whisper_state **out) {
    *out = NULL;
    if (n_slots < 1 || n_slots > 64 || rows_per_slot < 1 || rows_per_slot > 64 || enc_windows < 1 ||
        enc_windows > n_slots)
        return osp_err(OSP_ERR_INVALID, "whisper: %d windows of %d decoder rows, encoded %d at a time (1..64 each)",
                       n_slots, rows_per_slot, enc_windows);
    const osp_whisper_config *c = &m->cfg;
    const osp_backend *be = m->be;
    const int64_t d = c->d_model, A = c->n_audio_ctx, L = c->dec_layers, n_rows = (int64_t)n_slots * rows_per_slot;
    /* a call's tokens: a window's 3000 frames, enc_windows windows' positions, or a decoder step of every
     * slot (a teacher-forced chunk of n_text_ctx or a token of each of its rows) */
    const int64_t rows = max64(max64(N_FRAMES, enc_windows * A), n_slots * max64(c->n_text_ctx, rows_per_slot));
    osp_whisper_state *s = osp_calloc(OSP_POOL_MISC, sizeof *s);
    if (!s) return osp_err(OSP_ERR_NOMEM, "out of memory");
    s->m = m;
    s->be = be;
    s->n_rows = (int32_t)n_rows;
    s->n_slots = n_slots;
    s->rows_per_slot = rows_per_slot;
    s->enc_windows = enc_windows;
    s->rows_cap = rows;
    /* chunks of 64 tokens of any linear's input (the CPU's production path packs them for its AMX tiles) */
    const int64_t cols = max64(max64(max64(d, c->enc_ffn), max64(c->dec_ffn, 3 * d)), 3 * (int64_t)c->n_mels);
    osp_status rc = be->session_new(64, cols, &s->bs);
    if (rc != OSP_OK) {
        osp_free(s);
        return rc;
    }
    s->pos = osp_calloc(OSP_POOL_MISC, sizeof(int32_t) * n_rows);
    s->cap = osp_calloc(OSP_POOL_MISC, sizeof(row_capture) * n_rows);
    s->encoded = osp_calloc(OSP_POOL_MISC, (size_t)n_slots);
    s->tok_row = osp_malloc(OSP_POOL_MISC, sizeof(int32_t) * rows);
    s->tok_pos = osp_malloc(OSP_POOL_MISC, sizeof(int32_t) * rows);
    s->tok_id = osp_malloc(OSP_POOL_MISC, sizeof(int32_t) * 2 * rows); /* ids, then the rows whose logits are wanted */
    s->xin = osp_malloc(OSP_POOL_SCRATCH, sizeof(float) * rows * d);
    s->enc_host = n_slots == 1 ? osp_malloc(OSP_POOL_SCRATCH, sizeof(float) * A * d) : NULL;
    s->ck = osp_calloc(OSP_POOL_KV, sizeof(osp_dbuf *) * L);
    s->cv = osp_calloc(OSP_POOL_KV, sizeof(osp_dbuf *) * L);
    s->sk = osp_calloc(OSP_POOL_KV, sizeof(osp_dbuf *) * L);
    s->sv = osp_calloc(OSP_POOL_KV, sizeof(osp_dbuf *) * L);
    int ok = s->ck && s->cv && s->sk && s->sv && s->pos && s->cap && s->encoded && s->tok_row && s->tok_pos &&
             s->tok_id && s->xin && (n_slots > 1 || s->enc_host);
    const osp_kv_mem *km = be->kv_mem;
    for (int64_t l = 0; ok && l < L; l++) {
        s->ck[l] = km->alloc(sizeof(float) * n_slots * A * d);
        s->cv[l] = km->alloc(sizeof(float) * n_slots * A * d);
        s->sk[l] = km->alloc(sizeof(float) * n_rows * c->n_text_ctx * d);
        s->sv[l] = km->alloc(sizeof(float) * n_rows * c->n_text_ctx * d);
        ok = s->ck[l] && s->cv[l] && s->sk[l] && s->sv[l];
    }
    osp_dbuf **bufs[] = {&s->x, &s->h, &s->q, &s->k, &s->v, &s->a};
    for (int i = 0; ok && i < 6; i++) ok = (*bufs[i] = be->alloc((size_t)(rows * d))) != NULL;
    if (ok) ok = (s->enc_out = be->alloc((size_t)(enc_windows * A * d))) != NULL;
    if (ok) ok = (s->mel = be->alloc((size_t)enc_windows * c->n_mels * N_FRAMES)) != NULL;
    if (ok) ok = (s->col = be->alloc((size_t)(N_FRAMES * 3 * max64(c->n_mels, d)))) != NULL;
    /* f: the MLPs' hidden rows, conv1's output (3000 frames a window) and capture_qk's scores (A per token) */
    if (ok)
        ok = (s->f = be->alloc((size_t)(rows * max64(max64(max64(c->enc_ffn, c->dec_ffn), 2 * d), A)))) != NULL;
    if (!ok) {
        osp_whisper_state_free(s);
        return osp_err(OSP_ERR_NOMEM, "out of memory for a Whisper state");
    }
    for (int64_t r = 0; r < n_rows; r++) s->cap[r].out = NULL;
    *out = s;
    return OSP_OK;
}

osp_status osp_whisper_state_view(osp_whisper_state *base, int32_t slot, int32_t n_rows, osp_whisper_submit_fn submit,
                                  void *ctx, osp_whisper_state **out) {
    *out = NULL;
    if (base->base || slot < 0 || slot >= base->n_slots || n_rows < 1 || n_rows > base->rows_per_slot || !submit)
        return osp_err(OSP_ERR_INVALID, "whisper: no view of %d rows over window %d", n_rows, slot);
    osp_whisper_state *v = osp_calloc(OSP_POOL_MISC, sizeof *v);
    if (!v) return osp_err(OSP_ERR_NOMEM, "out of memory");
    v->m = base->m;
    v->be = base->be;
    v->base = base;
    v->slot = slot;
    v->row0 = slot * base->rows_per_slot;
    v->n_rows = n_rows;
    v->n_slots = 1;
    v->rows_per_slot = n_rows;
    v->pos = base->pos + v->row0;
    v->cap = base->cap + v->row0;
    v->encoded = base->encoded + slot;
    v->submit = submit;
    v->submit_ctx = ctx;
    v->copies = osp_malloc(OSP_POOL_MISC, sizeof(int32_t) * 3 * n_rows);
    if (!v->copies) {
        osp_free(v);
        return osp_err(OSP_ERR_NOMEM, "out of memory");
    }
    for (int32_t r = 0; r < n_rows; r++) {
        v->pos[r] = 0;
        v->cap[r] = (row_capture){0};
    }
    *out = v;
    return OSP_OK;
}

void osp_whisper_state_free(osp_whisper_state *s) {
    if (!s) return;
    if (s->base) {
        for (int32_t r = 0; r < s->n_rows; r++) s->cap[r] = (row_capture){0};
        osp_free(s->copies);
        osp_free(s);
        return;
    }
    const osp_backend *be = s->be;
    const osp_kv_mem *km = be->kv_mem;
    const osp_whisper_config *c = &s->m->cfg;
    osp_dbuf **planes[] = {s->ck, s->cv, s->sk, s->sv};
    const size_t cross = sizeof(float) * (size_t)s->n_slots * (size_t)c->n_audio_ctx * (size_t)c->d_model;
    const size_t self = sizeof(float) * (size_t)s->n_rows * (size_t)c->n_text_ctx * (size_t)c->d_model;
    for (int i = 0; i < 4; i++) {
        for (int l = 0; planes[i] && l < c->dec_layers; l++)
            if (planes[i][l]) km->free(planes[i][l], i < 2 ? cross : self);
        osp_free(planes[i]);
    }
    osp_free(s->pos);
    osp_free(s->cap);
    osp_free(s->encoded);
    osp_free(s->tok_row);
    osp_free(s->tok_pos);
    osp_free(s->tok_id);
    osp_free(s->xin);
    osp_free(s->logits_h);
    osp_free(s->enc_host);
    osp_dbuf *bufs[] = {s->x, s->h, s->q, s->k, s->v, s->a, s->enc_out, s->mel, s->col, s->f, s->logits};
    for (int i = 0; i < 11; i++)
        if (bufs[i]) be->free(bufs[i]);
    be->session_free(s->bs);
    osp_free(s);
}

void osp_whisper_state_set_serial(osp_whisper_state *s, int serial) {
    if (s->bs && s->be->set_serial) s->be->set_serial(s->bs, serial);
}

void osp_whisper_state_set_fast(osp_whisper_state *s, int fast) {
    if (s->bs) s->be->set_fast(s->bs, fast);
}

const char *osp_whisper_device_name(const osp_whisper *m) { return m->be->name; }

osp_status osp_whisper_bw_trial(const osp_whisper *m, int release, double *gbps) {
    return osp_backend_bw_trial(m->be, release, gbps);
}

/* ---------------- blocks ---------------- */

/* y = x · Wᵀ + b for `wins` windows of n rows each, one call per window: a window's matmuls are the calls it
 * gets alone (its numbers do not depend on the batch), and a window's GEMM is long enough to fill the device. */
static void linear_w(const osp_whisper_state *s, const osp_weight *w, const osp_dbuf *x, int64_t wins, int64_t n,
                     const osp_dbuf *b, osp_dbuf *y) {
    for (int64_t i = 0; i < wins; i++)
        s->be->linear(s->bs, w, osp_dbuf_at(x, i * n * w->cols), n, b, osp_dbuf_at(y, i * n * w->rows));
}

/* The pre-LN MLP of a block, its residual added to x [wins · n, d]: encoder and decoder alike. */
static void mlp_block(const osp_whisper_state *s, const layer *L, int64_t wins, int64_t n, int64_t d, int64_t ffn) {
    const osp_backend *be = s->be;
    osp_be_session *bs = s->bs;
    be->layernorm(bs, s->h, s->x, L->ln_mlp.w, L->ln_mlp.b, wins * n, d, LN_EPS);
    linear_w(s, &L->fc1, s->h, wins, n, L->b1, s->f);
    be->gelu(bs, s->f, wins * n * ffn);
    linear_w(s, &L->fc2, s->f, wins, n, L->b2, s->h);
    be->add(bs, s->x, s->h, wins * n * d);
}

/* Attention of n queries (rows `first` on of q) over one window's packed K/V, into the same rows of a. */
static osp_full_attn_args attn_args(const osp_whisper_state *s, const osp_dbuf *kh, const osp_dbuf *vt, int64_t first,
                                     int64_t n, int heads, int whole) {
    const int64_t d = s->m->cfg.d_model;
    return (osp_full_attn_args){.q = osp_dbuf_at(s->q, first * d), .kh = kh, .vt = vt,
                                .out = osp_dbuf_at(s->a, first * d), .n = n, .S = s->m->cfg.n_audio_ctx, .ld = d,
                                .heads = heads, .hd = (int32_t)(d / heads), .whole = whole};
}

static void full_attention(const osp_whisper_state *s, const osp_dbuf *kh, const osp_dbuf *vt, int64_t first,
                           int64_t n, int heads, int whole) {
    osp_full_attn_args a = attn_args(s, kh, vt, first, n, heads, whole);
    s->be->full_attention(s->bs, &a);
}

/* ---------------- encoder ---------------- */

static osp_status submit(osp_whisper_state *v, osp_whisper_job *job) {
    job->copies = v->copies;
    job->n_copies = v->n_copies;
    osp_status rc = v->submit(v->submit_ctx, job);
    v->n_copies = 0;
    return rc;
}

osp_status osp_whisper_encode(osp_whisper_state *s, const float *mel) {
    if (!mel) return osp_err(OSP_ERR_INVALID, "whisper encode: no mel spectrogram");
    if (s->base) {
        osp_whisper_job job = {.mel = mel, .slot = s->slot};
        return submit(s, &job);
    }
    int32_t slot = 0;
    return osp_whisper_encode_batch(s, &mel, &slot, 1);
}

osp_status osp_whisper_encode_batch(osp_whisper_state *s, const float *const *mels, const int32_t *slots,
                                    int32_t nw) {
    const osp_whisper *m = s->m;
    const osp_whisper_config *c = &m->cfg;
    const osp_backend *be = s->be;
    osp_be_session *bs = s->bs;
    const int64_t d = c->d_model, A = c->n_audio_ctx, C = c->n_mels, hd = d / c->enc_heads;
    if (s->base || nw < 1 || nw > s->enc_windows)
        return osp_err(OSP_ERR_INVALID, "whisper encode: %d windows (this state encodes 1..%d)", nw, s->enc_windows);
    for (int32_t w = 0; w < nw; w++) {
        if (!mels[w]) return osp_err(OSP_ERR_INVALID, "whisper encode: no mel spectrogram");
        if (slots[w] < 0 || slots[w] >= s->n_slots) return osp_err(OSP_ERR_RANGE, "whisper encode: no window %d", slots[w]);
        for (int32_t j = 0; j < w; j++)
            if (slots[j] == slots[w]) return osp_err(OSP_ERR_INVALID, "whisper encode: window %d twice", slots[w]);
    }
    for (int32_t w = 0; w < nw; w++) {
        s->encoded[slots[w]] = 0;
        memset(s->pos + (int64_t)slots[w] * s->rows_per_slot, 0, sizeof(int32_t) * s->rows_per_slot);
    }
    if (be->set_exact_tokens) be->set_exact_tokens(bs, 0);
    be->begin_chunk(bs, 1, N_FRAMES); /* each window's matmuls are the one-row chunk they are alone */
    for (int32_t w = 0; w < nw; w++) be->write(osp_dbuf_at(s->mel, w * C * N_FRAMES), mels[w], C * N_FRAMES);
    for (int32_t w = 0; w < nw; w++) {
        /* conv1 (k 3, padding 1): col[t, ci·3 + j] (MLX: [t, j·C + ci]) = mel[ci, t + j - 1] */
        osp_im2col_args i1 = {.col = s->col, .x = osp_dbuf_at(s->mel, w * C * N_FRAMES), .C = C, .t_in = N_FRAMES,
                              .t_out = N_FRAMES, .ld_c = N_FRAMES, .ld_f = 1, .k = 3, .stride = 1, .pad = 1,
                              .k_major = m->mlx};
        osp_dbuf *h1 = osp_dbuf_at(s->f, w * N_FRAMES * d);
        be->im2col(bs, &i1);
        be->linear(bs, &m->conv1, s->col, N_FRAMES, m->conv1_b, h1); /* [3000, d] */
        be->gelu(bs, h1, N_FRAMES * d);
        /* conv2 (k 3, stride 2, padding 1): col[t, ci·3 + j] (MLX: [t, j·d + ci]) = h1[2t + j - 1, ci] */
        osp_im2col_args i2 = {.col = s->col, .x = h1, .C = d, .t_in = N_FRAMES, .t_out = A,
                              .ld_c = 1, .ld_f = d, .k = 3, .stride = 2, .pad = 1, .k_major = m->mlx};
        be->im2col(bs, &i2);
        be->linear(bs, &m->conv2, s->col, A, m->conv2_b, osp_dbuf_at(s->x, w * A * d));
    }
    be->gelu(bs, s->x, nw * A * d);
    for (int32_t w = 0; w < nw; w++) be->add(bs, osp_dbuf_at(s->x, w * A * d), m->enc_pos, A * d);
    const float qs = 1.0f / sqrtf((float)hd);
    osp_dbuf *kh = s->col, *vt = osp_dbuf_at(s->col, A * d);
    for (int l = 0; l < c->enc_layers; l++) {
        const layer *L = &m->enc[l];
        be->layernorm(bs, s->h, s->x, L->ln_self.w, L->ln_self.b, nw * A, d, LN_EPS);
        linear_w(s, &L->self.q, s->h, nw, A, L->self.bq, s->q);
        linear_w(s, &L->self.k, s->h, nw, A, NULL, s->k);
        linear_w(s, &L->self.v, s->h, nw, A, L->self.bv, s->v);
        be->scale(bs, s->q, qs, nw * A * d);
        for (int32_t w = 0; w < nw; w++) {
            const osp_dbuf *k = osp_dbuf_at(s->k, w * A * d), *v = osp_dbuf_at(s->v, w * A * d);
            osp_full_attn_args ra = attn_args(s, k, v, w * A, A, c->enc_heads, 1);
            if (be->full_attention_rows && be->full_attention_rows(bs, &ra)) continue; /* no packed copy */
            be->pack_kv(bs, kh, vt, k, v, A, d, c->enc_heads, (int32_t)hd);
            full_attention(s, kh, vt, w * A, A, c->enc_heads, 1);
        }
        linear_w(s, &L->self.o, s->a, nw, A, L->self.bo, s->h);
        be->add(bs, s->x, s->h, nw * A * d);
        mlp_block(s, L, nw, A, d, c->enc_ffn);
    }
    be->layernorm(bs, s->enc_out, s->x, m->enc_ln.w, m->enc_ln.b, nw * A, d, LN_EPS);
    for (int32_t w = 0; w < nw; w++) {
        const osp_dbuf *eo = osp_dbuf_at(s->enc_out, w * A * d);
        for (int l = 0; l < c->dec_layers; l++) { /* packed for full_attention */
            be->linear(bs, &m->dec[l].cross.k, eo, A, NULL, s->k);
            be->linear(bs, &m->dec[l].cross.v, eo, A, m->dec[l].cross.bv, s->v);
            be->pack_kv(bs, osp_dbuf_at(s->ck[l], slots[w] * A * d), osp_dbuf_at(s->cv[l], slots[w] * A * d), s->k,
                        s->v, A, d, c->dec_heads, (int32_t)(d / c->dec_heads));
        }
    }
    OSP_TRY(be->status(bs));
    if (s->enc_host) be->read(s->enc_host, s->enc_out, A * d);
    for (int32_t w = 0; w < nw; w++) s->encoded[slots[w]] = 1;
    return OSP_OK;
}

osp_status osp_whisper_capture_qk(osp_whisper_state *s, const int32_t *heads, int32_t n_heads, float *out,
                                  int32_t max_tok) {
    const osp_whisper_config *c = &s->m->cfg;
    for (int32_t k = 0; out && k < n_heads; k++)
        if (heads[2 * k] < 0 || heads[2 * k] >= c->dec_layers || heads[2 * k + 1] < 0 ||
            heads[2 * k + 1] >= c->dec_heads)
            return osp_err(OSP_ERR_RANGE, "whisper: no decoder head (%d, %d)", heads[2 * k], heads[2 * k + 1]);
    s->cap[0] = out && n_heads ? (row_capture){heads, n_heads, max_tok, out} : (row_capture){0};
    return OSP_OK;
}

const int32_t *osp_whisper_alignment_heads(const osp_whisper *m, int32_t *n) {
    *n = m->n_align;
    return m->align;
}

const float *osp_whisper_encoder_out(const osp_whisper_state *s) {
    return s->enc_host && s->encoded[0] ? s->enc_host : NULL;
}

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

osp_status osp_whisper_copy_rows(osp_whisper_state *s, const int32_t *copies, int32_t n) {
    const osp_whisper_config *c = &s->m->cfg;
    const int64_t row = (int64_t)c->n_text_ctx * c->d_model;
    for (int32_t i = 0; i < n; i++) {
        const int32_t dst = copies[3 * i], src = copies[3 * i + 1], k = copies[3 * i + 2];
        if (dst < 0 || dst >= s->n_rows || src < 0 || src >= s->n_rows || k < 0 || k > c->n_text_ctx)
            return osp_err(OSP_ERR_RANGE, "whisper: no decoder row %d or %d", dst, src);
        if (dst == src || !k) continue;
        for (int l = 0; l < c->dec_layers; l++) {
            s->be->copy(s->bs, osp_dbuf_at(s->sk[l], dst * row), osp_dbuf_at(s->sk[l], src * row), k * c->d_model);
            s->be->copy(s->bs, osp_dbuf_at(s->sv[l], dst * row), osp_dbuf_at(s->sv[l], src * row), k * c->d_model);
        }
    }
    return s->be->status(s->bs);
}

osp_status osp_whisper_copy_row(osp_whisper_state *s, int32_t dst, int32_t src) {
    if (dst < 0 || dst >= s->n_rows || src < 0 || src >= s->n_rows)
        return osp_err(OSP_ERR_RANGE, "whisper: no decoder row %d or %d", dst, src);
    if (dst == src) return OSP_OK;
    if (s->base) { /* with the next step, where the batch's owner runs it */
        s->copies[3 * s->n_copies] = s->row0 + dst;
        s->copies[3 * s->n_copies + 1] = s->row0 + src;
        s->copies[3 * s->n_copies + 2] = s->pos[src];
        s->n_copies++;
    } else {
        int32_t cp[3] = {dst, src, s->pos[src]};
        OSP_TRY(osp_whisper_copy_rows(s, cp, 1));
    }
    s->pos[dst] = s->pos[src];
    return OSP_OK;
}

/* The alignment heads' cross-attention scores of layer l for the step's tokens whose rows capture, to the host
 * (positions past a capture's max_tok are not kept). s->f is free here. */
static osp_status capture_qk(const osp_whisper_state *s, int l, int32_t n) {
    const osp_whisper_config *c = &s->m->cfg;
    const int64_t d = c->d_model, hd = d / c->dec_heads, A = c->n_audio_ctx;
    for (int32_t i0 = 0, i1; i0 < n; i0 = i1) {
        const row_capture *cp = &s->cap[s->tok_row[i0]];
        for (i1 = i0 + 1; i1 < n && s->tok_row[i1] == s->tok_row[i0];) i1++;
        const osp_dbuf *ck = osp_dbuf_at(s->ck[l], (int64_t)(s->tok_row[i0] / s->rows_per_slot) * A * d);
        for (int32_t k = 0; cp->out && k < cp->n; k++) {
            if (cp->heads[2 * k] != l) continue;
            s->be->full_scores(s->bs, s->f, osp_dbuf_at(s->q, i0 * d), ck, i1 - i0, A, d, cp->heads[2 * k + 1],
                               (int32_t)hd);
            OSP_TRY(s->be->status(s->bs));
            for (int32_t i = i0; i < i1; i++)
                if (s->tok_pos[i] < cp->max_tok)
                    s->be->read(cp->out + ((int64_t)k * cp->max_tok + s->tok_pos[i]) * A,
                                osp_dbuf_at(s->f, (i - i0) * A), A);
        }
    }
    return OSP_OK;
}

static int capturing(const osp_whisper_state *s, int32_t n) {
    for (int32_t i = 0; i < n; i++)
        if (s->cap[s->tok_row[i]].out) return 1;
    return 0;
}

/* The decoder over n tokens whose rows, positions and ids are in s->tok_row / s->tok_pos / s->tok_id; the final
 * hidden states (before layer_norm) stay in s->x. Cross-attention runs once per stretch of tokens over one
 * window, as the caller grouped them: a request's tokens get the call they get alone. */
static osp_status decoder_body(osp_whisper_state *s, int32_t n) {
    const osp_whisper *m = s->m;
    const osp_whisper_config *c = &m->cfg;
    const osp_backend *be = s->be;
    osp_be_session *bs = s->bs;
    const int64_t d = c->d_model, hd = d / c->dec_heads, ctx = c->n_text_ctx, A = c->n_audio_ctx;
    const float es = c->scale_embedding ? sqrtf((float)d) : 1.0f;
    for (int32_t i = 0; i < n; i++) {
        float *xi = s->xin + (int64_t)i * d;
        osp_weight_row_f32(&m->embed, s->tok_id[i], xi);
        for (int64_t j = 0; j < d; j++) xi[j] = xi[j] * es + m->dec_pos[(int64_t)s->tok_pos[i] * d + j];
    }
    be->upload(bs, s->x, s->xin, n * d);
    const float qs = 1.0f / sqrtf((float)hd);
    const int cap = capturing(s, n);
    for (int l = 0; l < c->dec_layers; l++) {
        const layer *L = &m->dec[l];
        be->layernorm(bs, s->h, s->x, L->ln_self.w, L->ln_self.b, n, d, LN_EPS);
        be->linear(bs, &L->self.q, s->h, n, L->self.bq, s->q);
        be->linear(bs, &L->self.k, s->h, n, NULL, s->k);
        be->linear(bs, &L->self.v, s->h, n, L->self.bv, s->v);
        be->rows_store(bs, s->sk[l], s->sv[l], s->k, s->v, s->tok_row, s->tok_pos, n, ctx, d);
        be->scale(bs, s->q, qs, n * d);
        osp_rows_attn_args ra = {.q = s->q, .k = s->sk[l], .v = s->sv[l], .out = s->a, .row = s->tok_row,
                                 .pos = s->tok_pos, .n = n, .ctx = ctx, .ld = d, .heads = c->dec_heads,
                                 .hd = (int32_t)hd};
        be->rows_attention(bs, &ra);
        be->linear(bs, &L->self.o, s->a, n, L->self.bo, s->h);
        be->add(bs, s->x, s->h, n * d);
        be->layernorm(bs, s->h, s->x, L->ln_cross.w, L->ln_cross.b, n, d, LN_EPS);
        be->linear(bs, &L->cross.q, s->h, n, L->cross.bq, s->q);
        be->scale(bs, s->q, qs, n * d);
        if (cap) OSP_TRY(capture_qk(s, l, n));
        for (int32_t i0 = 0, i1; i0 < n; i0 = i1) {
            const int32_t w = s->tok_row[i0] / s->rows_per_slot;
            for (i1 = i0 + 1; i1 < n && s->tok_row[i1] / s->rows_per_slot == w;) i1++;
            full_attention(s, osp_dbuf_at(s->ck[l], w * A * d), osp_dbuf_at(s->cv[l], w * A * d), i0, i1 - i0,
                           c->dec_heads, 0);
        }
        be->linear(bs, &L->cross.o, s->a, n, L->cross.bo, s->h);
        be->add(bs, s->x, s->h, n * d);
        mlp_block(s, L, 1, n, d, c->dec_ffn);
    }
    return OSP_OK;
}

/* layer_norm and the vocabulary projection of the m rows of x listed in sel (in order), into s->logits
 * [m, vocab] (on the backend). */
static osp_status head(osp_whisper_state *s, const int32_t *sel, int32_t m_rows) {
    const osp_whisper *m = s->m;
    const int64_t d = m->cfg.d_model, V = m->cfg.vocab;
    const osp_backend *be = s->be;
    if (m_rows * V > s->logits_cap) {
        if (s->logits) be->free(s->logits);
        osp_free(s->logits_h);
        s->logits_cap = 0;
        s->logits_h = osp_malloc(OSP_POOL_SCRATCH, sizeof(float) * (size_t)(m_rows * V));
        if (!(s->logits = be->alloc((size_t)(m_rows * V))) || !s->logits_h)
            return osp_err(OSP_ERR_NOMEM, "out of memory for logits");
        s->logits_cap = m_rows * V;
    }
    /* the selected rows gathered into k (free after the body), stretches at a time */
    for (int32_t j0 = 0, j1; j0 < m_rows; j0 = j1) {
        for (j1 = j0 + 1; j1 < m_rows && sel[j1] == sel[j1 - 1] + 1;) j1++;
        be->copy(s->bs, osp_dbuf_at(s->k, j0 * d), osp_dbuf_at(s->x, (int64_t)sel[j0] * d), (j1 - j0) * d);
    }
    be->layernorm(s->bs, s->h, s->k, m->dec_ln.w, m->dec_ln.b, m_rows, d, LN_EPS);
    be->linear(s->bs, &m->head, s->h, m_rows, NULL, s->logits);
    if (be->end_chunk) be->end_chunk(s->bs); /* (on a GPU, a decode step may run as one graph) */
    return be->status(s->bs);
}

static osp_status check_ids(const osp_whisper_config *c, const int32_t *ids, int32_t n) {
    for (int32_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= c->vocab)
            return osp_err(OSP_ERR_RANGE, "whisper decode: token id %d is outside the vocabulary (%d)", ids[i], c->vocab);
    return OSP_OK;
}

osp_status osp_whisper_step(osp_whisper_state *s, const osp_whisper_run *runs, int32_t n_runs) {
    const osp_whisper_config *c = &s->m->cfg;
    const int64_t V = c->vocab;
    if (s->base) return osp_err(OSP_ERR_INVALID, "whisper step: a view's steps go through its batch");
    int64_t n = 0;
    for (int32_t r = 0; r < n_runs; r++) {
        const osp_whisper_run *u = &runs[r];
        if (u->row < 0 || u->row >= s->n_rows) return osp_err(OSP_ERR_RANGE, "whisper decode: no row %d", u->row);
        if (u->n < 1 || !u->ids) return osp_err(OSP_ERR_INVALID, "whisper decode: no tokens");
        if (!s->encoded[u->row / s->rows_per_slot])
            return osp_err(OSP_ERR_INVALID, "whisper decode: no audio window encoded yet");
        if ((int64_t)s->pos[u->row] + u->n > c->n_text_ctx)
            return osp_err(OSP_ERR_RANGE, "whisper decode: %lld tokens exceed the decoder's %d positions",
                           (long long)s->pos[u->row] + u->n, c->n_text_ctx);
        for (int32_t j = 0; j < r; j++)
            if (runs[j].row == u->row) return osp_err(OSP_ERR_INVALID, "whisper decode: row %d twice in a step", u->row);
        OSP_TRY(check_ids(c, u->ids, u->n));
        n += u->n;
    }
    if (n < 1 || n > s->rows_cap) return osp_err(OSP_ERR_INVALID, "whisper decode: %lld tokens in a step", (long long)n);
    int32_t *sel = s->tok_id + n, m_rows = 0; /* the rows whose logits are wanted: tok_id's room past the ids */
    int64_t i = 0;
    for (int32_t r = 0; r < n_runs; r++)
        for (int32_t t = 0; t < runs[r].n; t++, i++) {
            s->tok_row[i] = runs[r].row;
            s->tok_pos[i] = s->pos[runs[r].row] + t;
            s->tok_id[i] = runs[r].ids[t];
        }
    /* every token computed as it is alone, whatever the step holds (batch invariance) */
    if (s->be->set_exact_tokens) s->be->set_exact_tokens(s->bs, 1);
    s->be->begin_chunk(s->bs, (int32_t)n, 1);
    OSP_TRY(decoder_body(s, (int32_t)n));
    i = 0;
    int32_t *first = s->tok_pos; /* tok_pos is free now: each run's first selected row */
    for (int32_t r = 0; r < n_runs; r++) {
        first[r] = m_rows;
        if (runs[r].logits)
            for (int32_t t = 0; t < runs[r].n; t++) sel[m_rows++] = (int32_t)(i + t);
        else if (runs[r].last)
            sel[m_rows++] = (int32_t)(i + runs[r].n - 1);
        i += runs[r].n;
    }
    if (m_rows) {
        OSP_TRY(head(s, sel, m_rows));
        /* one read of every wanted row when several runs want some (a device's reads are a round trip each) */
        const int once = n_runs > 1;
        if (once) s->be->read(s->logits_h, s->logits, (int64_t)m_rows * V);
        for (int32_t r = 0; r < n_runs; r++) {
            const osp_whisper_run *u = &runs[r];
            const int64_t at = (int64_t)first[r] * V;
            if (u->logits) {
                if (once) memcpy(u->logits, s->logits_h + at, sizeof(float) * (size_t)(u->n * V));
                else s->be->read(u->logits, osp_dbuf_at(s->logits, at), (int64_t)u->n * V);
                if (u->last) memcpy(u->last, u->logits + (int64_t)(u->n - 1) * V, sizeof(float) * V);
            } else if (u->last) {
                if (once) memcpy(u->last, s->logits_h + at, sizeof(float) * V);
                else s->be->read(u->last, osp_dbuf_at(s->logits, at), V);
            }
        }
    } else {
        OSP_TRY(s->be->status(s->bs));
    }
    for (int32_t r = 0; r < n_runs; r++) s->pos[runs[r].row] += runs[r].n;
    return OSP_OK;
}

/* A view's runs (its own rows) handed to its batch as the base's rows. */
static osp_status view_step(osp_whisper_state *v, osp_whisper_run *runs, int32_t n_runs) {
    for (int32_t r = 0; r < n_runs; r++) {
        if (runs[r].row < 0 || runs[r].row >= v->n_rows)
            return osp_err(OSP_ERR_RANGE, "whisper decode: no row %d", runs[r].row);
        runs[r].row += v->row0;
    }
    osp_whisper_job job = {.slot = v->slot, .runs = runs, .n_runs = n_runs};
    return submit(v, &job);
}

osp_status osp_whisper_decode(osp_whisper_state *s, const int32_t *ids, int32_t n, float *logits, float *last) {
    if (n < 1 || !ids) return osp_err(OSP_ERR_INVALID, "whisper decode: no tokens");
    osp_whisper_run run = {0, n, ids, logits, last};
    return s->base ? view_step(s, &run, 1) : osp_whisper_step(s, &run, 1);
}

osp_status osp_whisper_decode_rows(osp_whisper_state *s, const int32_t *rows, int32_t nr, const int32_t *ids,
                                   float *logits) {
    const int64_t V = s->m->cfg.vocab;
    if (nr < 1 || nr > s->n_rows || nr > 64 || !ids || !rows || !logits)
        return osp_err(OSP_ERR_INVALID, "whisper decode: %d rows of %d", nr, s->n_rows);
    osp_whisper_run runs[64];
    for (int32_t i = 0; i < nr; i++) runs[i] = (osp_whisper_run){rows[i], 1, ids + i, logits + i * V, NULL};
    return s->base ? view_step(s, runs, nr) : osp_whisper_step(s, runs, nr);
}
