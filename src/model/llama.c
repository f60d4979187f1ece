/* model/llama: the Llama body and the architectures that differ from it
 * only by flags: Llama 3, Qwen2 (q/k/v biases), Qwen3 (q/k norms) and
 * Gemma 3 (1 + w norms, sandwich norms, scaled embeddings, query scale
 * from query_pre_attn_scalar, soft-caps, sliding layers with their own
 * RoPE base). Each is a table (arch.h); the forward body is one, written as
 * backend operations over a chunk of rows. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "core/json_get.h"
#include "model.h"

/* ---- config ---- */

static osp_status configure_llama(const json_t *root, const json_t *tc, const char *path, osp_config *c) {
    (void)root, (void)path;
    c->qkv_bias = c->o_bias = json_is_true(json_object_get(tc, "attention_bias"));
    c->mlp_bias = json_is_true(json_object_get(tc, "mlp_bias"));
    return OSP_OK;
}

static osp_status configure_qwen2(const json_t *root, const json_t *tc, const char *path, osp_config *c) {
    (void)root, (void)tc, (void)path;
    c->qkv_bias = 1;
    return OSP_OK;
}

static osp_status configure_qwen3(const json_t *root, const json_t *tc, const char *path, osp_config *c) {
    (void)root, (void)path;
    c->qk_norm = 1;
    c->qkv_bias = c->o_bias = json_is_true(json_object_get(tc, "attention_bias"));
    return OSP_OK;
}

static osp_status configure_gemma3(const json_t *root, const json_t *tc, const char *path, osp_config *c) {
    (void)root, (void)path;
    c->qk_norm = c->norm_add_one = c->sandwich_norm = c->embed_scaled = 1;
    c->attn_scale = (float)pow(osp_json_num(tc, "query_pre_attn_scalar", c->head_dim), -0.5);
    c->final_softcap = (float)osp_json_num(tc, "final_logit_softcapping", 0);
    c->attn_softcap = (float)osp_json_num(tc, "attn_logit_softcapping", 0);
    /* EmbeddingGemma: no causal mask; a sliding layer sees |q - k| < sliding_window/2 + 1 (transformers turns
     * the window's width into that exclusive radius when it reads the config) */
    if (json_is_true(json_object_get(tc, "use_bidirectional_attention"))) {
        c->bidirectional = 1;
        c->bidir_radius = c->sliding_window > 0 ? c->sliding_window / 2 + 1 : 0;
    }
    return OSP_OK;
}

/* ---- weights ---- */

static osp_status layout(const osp_config *c, osp_model *m, const osp_tnames *nm, osp_tvisit visit, void *ctx) {
    const int64_t H = c->hidden, D = c->head_dim, Q = (int64_t)c->n_heads * D, KV = (int64_t)c->n_kv_heads * D,
                  I = c->intermediate;
    const char *p = nm->prefix;
    const int norm = c->norm_add_one ? OSP_TF_ZERO_MEAN : 0, bias = OSP_TF_ZERO_MEAN;
#define W(field) (L ? &L->field : NULL)
    OSP_TRY(osp_tlinear(visit, ctx, m ? &m->embed : NULL, c->vocab, H, OSP_TF_GATHERED, "%sembed_tokens", p));
    for (int i = 0; i < c->n_layers; i++) {
        osp_layer *L = m ? &m->layers[i] : NULL;
        if (L) L->intermediate = (int32_t)I, L->layer_scalar = 1.0f;
        OSP_TRY(osp_tlinear(visit, ctx, W(wq), Q, H, 0, "%slayers.%d.self_attn.q_proj", p, i));
        OSP_TRY(osp_tlinear(visit, ctx, W(wk), KV, H, 0, "%slayers.%d.self_attn.k_proj", p, i));
        OSP_TRY(osp_tlinear(visit, ctx, W(wv), KV, H, 0, "%slayers.%d.self_attn.v_proj", p, i));
        OSP_TRY(osp_tlinear(visit, ctx, W(wo), H, Q, 0, "%slayers.%d.self_attn.o_proj", p, i));
        OSP_TRY(osp_tlinear(visit, ctx, W(wg), I, H, 0, "%slayers.%d.mlp.gate_proj", p, i));
        OSP_TRY(osp_tlinear(visit, ctx, W(wu), I, H, 0, "%slayers.%d.mlp.up_proj", p, i));
        OSP_TRY(osp_tlinear(visit, ctx, W(wd), H, I, 0, "%slayers.%d.mlp.down_proj", p, i));
        OSP_TRY(osp_tvec(visit, ctx, W(attn_norm), H, norm, "%slayers.%d.input_layernorm.weight", p, i));
        if (c->sandwich_norm) {
            OSP_TRY(osp_tvec(visit, ctx, W(post_attn_norm), H, norm, "%slayers.%d.post_attention_layernorm.weight", p, i));
            OSP_TRY(osp_tvec(visit, ctx, W(mlp_norm), H, norm, "%slayers.%d.pre_feedforward_layernorm.weight", p, i));
            OSP_TRY(osp_tvec(visit, ctx, W(post_mlp_norm), H, norm, "%slayers.%d.post_feedforward_layernorm.weight", p, i));
        } else {
            OSP_TRY(osp_tvec(visit, ctx, W(mlp_norm), H, norm, "%slayers.%d.post_attention_layernorm.weight", p, i));
        }
        if (c->qk_norm) {
            OSP_TRY(osp_tvec(visit, ctx, W(q_norm), D, norm, "%slayers.%d.self_attn.q_norm.weight", p, i));
            OSP_TRY(osp_tvec(visit, ctx, W(k_norm), D, norm, "%slayers.%d.self_attn.k_norm.weight", p, i));
        }
        if (c->qkv_bias) {
            OSP_TRY(osp_tvec(visit, ctx, W(bq), Q, bias, "%slayers.%d.self_attn.q_proj.bias", p, i));
            OSP_TRY(osp_tvec(visit, ctx, W(bk), KV, bias, "%slayers.%d.self_attn.k_proj.bias", p, i));
            OSP_TRY(osp_tvec(visit, ctx, W(bv), KV, bias, "%slayers.%d.self_attn.v_proj.bias", p, i));
        }
        if (c->o_bias) OSP_TRY(osp_tvec(visit, ctx, W(bo), H, bias, "%slayers.%d.self_attn.o_proj.bias", p, i));
        if (c->mlp_bias) {
            OSP_TRY(osp_tvec(visit, ctx, W(bg), I, bias, "%slayers.%d.mlp.gate_proj.bias", p, i));
            OSP_TRY(osp_tvec(visit, ctx, W(bu), I, bias, "%slayers.%d.mlp.up_proj.bias", p, i));
            OSP_TRY(osp_tvec(visit, ctx, W(bd), H, bias, "%slayers.%d.mlp.down_proj.bias", p, i));
        }
    }
#undef W
    OSP_TRY(osp_tvec(visit, ctx, m ? &m->final_norm : NULL, H, norm, "%snorm.weight", p));
    if (!c->tie_embeddings && !c->no_head) OSP_TRY(osp_tlinear(visit, ctx, m ? &m->head : NULL, c->vocab, H, 0, "%s", nm->head));
    return OSP_OK;
}

/* ---- forward ---- */

/* res: the previous layer's output, added into x with the norm that reads the sum, or NULL (the first layer).
 * Leaves the block's output in sc->tmp, for the next norm to add (res). */
static void attention_block(osp_session *s, int li, int32_t B, int32_t T, const osp_dbuf *res) {
    const osp_model *m = s->m;
    const osp_backend *be = s->be;
    osp_be_session *bs = s->bs;
    const osp_config *c = &m->cfg;
    const osp_layer *L = &m->layers[li];
    osp_scratch *sc = &s->sc;
    osp_kv_layer *KL = &s->kv->layers[li];
    int64_t N = (int64_t)B * T, H = c->hidden, D = c->head_dim, Hq = c->n_heads, Hkv = c->n_kv_heads;
    osp_vec inv = c->layer_sliding[li] ? m->inv_freq_sliding : m->inv_freq_full;

    if (res) osp_be_add_rmsnorm(be, bs, sc->xn, sc->x, res, L->attn_norm, N, H, c->eps, c->norm_add_one);
    else be->rmsnorm(bs, sc->xn, sc->x, L->attn_norm, N, H, c->eps, c->norm_add_one);
    {
        const osp_weight *ws[] = {&L->wq, &L->wk, &L->wv};
        osp_dbuf *ys[] = {sc->q, sc->k, sc->v};
        be->matmul(bs, ws, 3, sc->xn, N, ys);
    }
    be->add_bias(bs, sc->q, L->bq, N, Hq * D);
    be->add_bias(bs, sc->k, L->bk, N, Hkv * D);
    be->add_bias(bs, sc->v, L->bv, N, Hkv * D);
    osp_attn_args a = {.kv = s->kv, .layer = li, .rows = s->rows, .nb = B, .T = T, .n_heads = (int32_t)Hq,
                       .n_kv_heads = (int32_t)Hkv, .head_dim = (int32_t)D, .scale = c->attn_scale,
                       .softcap = c->attn_softcap, .window = KL->window, .q = sc->q, .k = sc->k, .v = sc->v,
                       .out = sc->att, .scores = sc->scores, .score_stride = (int64_t)s->kv->max_ctx + sc->max_tok,
                       .chunk_stored = s->exact};
    osp_rope_qk_args r = {.q = sc->q, .k = sc->k, .q_heads = Hq, .k_heads = Hkv, .B = B, .T = T, .D = (int32_t)D,
                          .inv_freq = inv, .pos = sc->bpos, .q_norm = L->q_norm, .k_norm = L->k_norm,
                          .eps = c->eps, .add_one = c->norm_add_one};
    /* exact tokens: each token sees the earlier ones as stored, as in decode steps. One token: storing it
     * first changes nothing its attention reads (its own K/V come from k/v; a ring slot it overwrites is
     * out of its window). */
    if (c->bidirectional) { /* no cache: the whole input is this chunk (forward_chunk checks) */
        osp_be_rope_qk(be, bs, &r);
        osp_bidir_attn_args ba = {.q = sc->q, .k = sc->k, .v = sc->v, .out = sc->att, .len = s->lens, .nb = B,
                                  .T = T, .n_heads = (int32_t)Hq, .n_kv_heads = (int32_t)Hkv, .head_dim = (int32_t)D,
                                  .radius = c->layer_sliding[li] ? c->bidir_radius : 0, .scale = c->attn_scale,
                                  .softcap = c->attn_softcap};
        be->bidir_attention(bs, &ba);
    } else if (s->exact || T == 1) {
        r.kv = s->kv, r.layer = li, r.rows = s->rows, r.v = sc->v, r.attn = &a;
        osp_be_rope_qk(be, bs, &r);
    } else {
        osp_be_rope_qk(be, bs, &r);
        be->attention(bs, &a);
        be->kv_write(bs, s->kv, li, s->rows, B, sc->k, sc->v, T);
    }

    be->matmul(bs, &(const osp_weight *){&L->wo}, 1, sc->att, N, &sc->tmp);
    be->add_bias(bs, sc->tmp, L->bo, N, H);
    if (L->post_attn_norm) be->rmsnorm(bs, sc->tmp, sc->tmp, L->post_attn_norm, N, H, c->eps, c->norm_add_one);
}

/* x += the attention block's output (sc->tmp) with the MLP's norm; leaves the MLP's output in sc->tmp */
static void mlp_block(osp_session *s, int li, int32_t B, int32_t T) {
    const osp_model *m = s->m;
    const osp_backend *be = s->be;
    osp_be_session *bs = s->bs;
    const osp_config *c = &m->cfg;
    const osp_layer *L = &m->layers[li];
    osp_scratch *sc = &s->sc;
    int64_t N = (int64_t)B * T, H = c->hidden, I = c->intermediate;

    osp_be_add_rmsnorm(be, bs, sc->xn, sc->x, sc->tmp, L->mlp_norm, N, H, c->eps, c->norm_add_one);
    if (L->bg || L->bu) { /* biases between the products and the activation */
        const osp_weight *ws[] = {&L->wg, &L->wu};
        osp_dbuf *ys[] = {sc->g, sc->u};
        be->matmul(bs, ws, 2, sc->xn, N, ys);
        be->add_bias(bs, sc->g, L->bg, N, I);
        be->add_bias(bs, sc->u, L->bu, N, I);
        be->act_mul(bs, c->act, sc->g, sc->g, sc->u, N, I, I);
    } else {
        osp_be_gate_up_act(be, bs, c->act, &L->wg, &L->wu, sc->xn, N, sc->g, sc->u);
    }
    be->matmul(bs, &(const osp_weight *){&L->wd}, 1, sc->g, N, &sc->tmp);
    be->add_bias(bs, sc->tmp, L->bd, N, H);
    if (L->post_mlp_norm) be->rmsnorm(bs, sc->tmp, sc->tmp, L->post_mlp_norm, N, H, c->eps, c->norm_add_one);
}

static osp_status forward_chunk(osp_session *s, const int32_t *ids, int32_t T, int all_logits, float *logits,
                                int64_t ld_rows) {
    const osp_model *m = s->m;
    const osp_config *c = &m->cfg;
    osp_scratch *sc = &s->sc;
    int32_t B = s->nb;
    if (c->bidirectional) { /* every position sees the ones after it: forward.c runs it as an encoder (arch.h) */
        if (!s->be->bidir_attention)
            return osp_err(OSP_ERR_UNSUPPORTED, "%s: bidirectional attention is not on the %s backend yet", m->dir,
                           s->be->name);
        if (logits || T != ld_rows || T > OSP_BIDIR_MAX_T)
            return osp_err(OSP_ERR_UNSUPPORTED, "%s has bidirectional attention: it embeds inputs of at most %d "
                           "tokens whole (no logits, no chunks)", m->dir, OSP_BIDIR_MAX_T);
    }
    if (ids) s->be->embed(s->bs, &m->embed, m->embed_scale, ids, (int64_t)B * T, sc->x);
    else s->be->embed_prev(s->bs, osp_model_embed_rows(m), m->embed_scale, (int64_t)B * T, sc->x);
    for (int li = 0; li < c->n_layers; li++) {
        attention_block(s, li, B, T, li ? sc->tmp : NULL);
        mlp_block(s, li, B, T);
    }
    /* the last layer's output: added with the head's norm, or here for an intermediate chunk */
    const osp_dbuf *res = c->n_layers ? sc->tmp : NULL;
    if (res && !logits) s->be->add(s->bs, sc->x, res, (int64_t)B * T * c->hidden);
    for (int32_t b = 0; b < B && !c->bidirectional; b++) s->kv->pos[s->rows[b]] += T; /* (no cache: no position) */
    if (logits) { /* NULL: an intermediate prefill chunk */
        osp_head_args h = {.x = sc->x, .norm = m->final_norm, .w = &m->head, .B = B, .T = T,
                           .all_logits = all_logits, .hidden = c->hidden, .vocab = c->vocab, .ld_rows = ld_rows,
                           .eps = c->eps, .softcap = c->final_softcap, .add_one = c->norm_add_one,
                           .logits = logits, .res = res, .ids = s->head_ids, .need = s->head_need,
                           .defer_ids = s->head_defer, .xn = sc->xn, .hlast = sc->hlast};
        s->be->head(s->bs, &h);
    } else if (s->hidden) {
        s->be->rmsnorm(s->bs, sc->xn, sc->x, m->final_norm, (int64_t)B * T, c->hidden, c->eps, c->norm_add_one);
        if (s->be->end_chunk) s->be->end_chunk(s->bs); /* no head ends this chunk (a GPU may run it as a graph) */
    }
    return OSP_OK;
}

/* ---- the tables ---- */

#define LLAMA_BODY .layout = layout, .forward_chunk = forward_chunk, .prev_ids = 1, .hidden = 1

const osp_arch_ops osp_arch_llama = {
    .name = "llama", .hf_names = (const char *const[]){"LlamaForCausalLM", NULL},
    .model_types = (const char *const[]){"llama", NULL}, .act_default = "silu", .configure = configure_llama,
    LLAMA_BODY};
const osp_arch_ops osp_arch_qwen2 = {
    .name = "qwen2", .hf_names = (const char *const[]){"Qwen2ForCausalLM", NULL},
    .model_types = (const char *const[]){"qwen2", NULL}, .act_default = "silu", .configure = configure_qwen2,
    LLAMA_BODY};
const osp_arch_ops osp_arch_qwen3 = {
    .name = "qwen3", .hf_names = (const char *const[]){"Qwen3ForCausalLM", NULL},
    .model_types = (const char *const[]){"qwen3", NULL}, .act_default = "silu", .configure = configure_qwen3,
    .matryoshka = 1, LLAMA_BODY};
const osp_arch_ops osp_arch_gemma3 = {
    .name = "gemma3",
    .hf_names = (const char *const[]){"Gemma3ForCausalLM", "Gemma3ForConditionalGeneration", "Gemma3TextModel", NULL},
    .model_types = (const char *const[]){"gemma3_text", "gemma3", NULL}, .tie_default = 1,
    .act_default = "gelu_pytorch_tanh", .sliding_pattern = 1, .local_rope_base = 1, .configure = configure_gemma3,
    LLAMA_BODY};
