/* Gemma 4 (text): Gemma4ForCausalLM and the text part of
 * Gemma4ForConditionalGeneration, in the E-series (per-layer embeddings,
 * KV sharing), dense (K = V on full layers) and MoE variants.
 *
 * Differences from the Gemma 3 body in forward.c, after transformers'
 * modeling_gemma4.py:
 * - RMSNorm multiplies by w (not 1 + w); v gets a weightless RMSNorm and
 *   no RoPE; attention scale is 1.
 * - Head size and KV head count are per layer (full layers are wider);
 *   full layers use "proportional" RoPE (only the first pairs rotate).
 * - attention_k_eq_v: full layers have no v_proj; V is k_proj's raw output.
 * - The last num_kv_shared_layers layers compute only q and reuse the K/V
 *   of the last earlier layer of their type (the donor). A donor's chunk
 *   K/V stay in scratch until every layer has run, then go to the cache,
 *   so sharers see exactly what the donor saw.
 * - Per-layer embeddings: ple[l] = (norm(proj(h0) · H^-1/2) + E_ple[id] ·
 *   sqrt(P)) · 2^-1/2, fed through a gate after the MLP of layer l.
 * - MoE layers add routed experts next to the dense MLP.
 * - Every layer ends with h *= layer_scalar; logits are soft-capped.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "core/json_get.h"
#include "model.h"

/* ---- config ---- */

/* Flags and scales; per-layer geometry and KV sharing from per_layer_config
 * (as transformers >= 5.15 writes it) or global_head_dim /
 * num_global_key_value_heads (published checkpoints); MoE and PLE keys. */
static osp_status configure(const json_t *root, const json_t *tc, const char *path, osp_config *c) {
    (void)root;
    int n = c->n_layers;
    c->qk_norm = c->sandwich_norm = c->embed_scaled = c->v_norm = c->has_layer_scalar = 1;
    c->attn_scale = 1.0f;
    c->final_softcap = (float)osp_json_num(tc, "final_logit_softcapping", 0);
    c->k_eq_v = json_is_true(json_object_get(tc, "attention_k_eq_v"));
    json_t *plc = json_object_get(tc, "per_layer_config");
    if (json_is_object(plc)) {
        const char *key;
        json_t *v;
        json_object_foreach(plc, key, v) {
            char *end;
            long i = strtol(key, &end, 10);
            if (*end || i < 0 || i >= n || !json_is_object(v))
                return osp_err(OSP_ERR_FORMAT, "%s: per_layer_config entry '%s' is not a layer index", path, key);
            c->layer_head_dim[i] = osp_json_int(v, "head_dim", c->head_dim);
            c->layer_kv_heads[i] = osp_json_int(v, "num_key_value_heads", c->n_kv_heads);
        }
    } else {
        int ghd = osp_json_int(tc, "global_head_dim", 512);
        int gkv = osp_json_int(tc, "num_global_key_value_heads", -1);
        for (int i = 0; i < n; i++) {
            if (c->layer_sliding[i]) continue;
            if (ghd > 0) c->layer_head_dim[i] = ghd;
            if (c->k_eq_v && gkv > 0) c->layer_kv_heads[i] = gkv;
        }
    }
    /* KV sharing: layers from n - shared on reuse the last earlier layer of their type. */
    int shared = osp_json_int(tc, "num_kv_shared_layers", 0);
    if (shared < 0 || shared >= n) return osp_err(OSP_ERR_FORMAT, "%s: bad num_kv_shared_layers %d", path, shared);
    int first = n - shared;
    for (int i = first; i < n && shared > 0; i++) {
        int d = -1;
        for (int j = first - 1; j >= 0 && d < 0; j--)
            if (c->layer_sliding[j] == c->layer_sliding[i]) d = j;
        if (d < 0) return osp_err(OSP_ERR_FORMAT, "%s: KV-shared layer %d has no earlier layer of its type", path, i);
        c->layer_kv_donor[i] = d;
        if (c->layer_head_dim[d] != c->layer_head_dim[i] || c->layer_kv_heads[d] != c->layer_kv_heads[i])
            return osp_err(OSP_ERR_FORMAT, "%s: KV-shared layer %d and its donor %d differ in shape", path, i, d);
    }
    json_t *ple = json_object_get(tc, "hidden_size_per_layer_input");
    c->ple_dim = json_is_integer(ple) ? (int)json_integer_value(ple) : (ple ? 0 : 256);
    c->ple_vocab = osp_json_int(tc, "vocab_size_per_layer_input", c->vocab);
    c->double_wide = json_is_true(json_object_get(tc, "use_double_wide_mlp"));
    c->moe = json_is_true(json_object_get(tc, "enable_moe_block"));
    if (c->moe) {
        c->n_experts = osp_json_int(tc, "num_experts", 0);
        c->top_k_experts = osp_json_int(tc, "top_k_experts", 0);
        c->moe_intermediate = osp_json_int(tc, "moe_intermediate_size", 0);
        if (c->n_experts <= 0 || c->top_k_experts <= 0 || c->top_k_experts > c->n_experts || c->moe_intermediate <= 0)
            return osp_err(OSP_ERR_FORMAT, "%s: enable_moe_block needs num_experts, top_k_experts <= num_experts "
                           "and moe_intermediate_size", path);
    }
    if (json_is_true(json_object_get(tc, "use_bidirectional_attention")))
        return osp_err(OSP_ERR_UNSUPPORTED, "%s: bidirectional attention is not supported", path);
    return OSP_OK;
}

/* ---- weights ---- */

static osp_status layout(const osp_config *c, osp_model *m, const osp_tnames *nm, osp_tvisit visit, void *ctx) {
    const int64_t H = c->hidden, L_ = c->n_layers, P = c->ple_dim, E = c->n_experts;
    const char *p = nm->prefix;
#define W(field) (L ? &L->field : NULL)
    OSP_TRY(osp_tlinear(visit, ctx, m ? &m->embed : NULL, c->vocab, H, OSP_TF_GATHERED, "%sembed_tokens", p));
    if (P) {
        OSP_TRY(osp_tlinear(visit, ctx, m ? &m->embed_ple : NULL, c->ple_vocab, L_ * P,
                            OSP_TF_GATHERED | OSP_TF_Q_IF_FITS, "%sembed_tokens_per_layer", p));
        OSP_TRY(osp_tlinear(visit, ctx, m ? &m->ple_model_proj : NULL, L_ * P, H, OSP_TF_Q_IF_FITS,
                            "%sper_layer_model_projection", p));
        OSP_TRY(osp_tvec(visit, ctx, m ? &m->ple_proj_norm : NULL, P, 0, "%sper_layer_projection_norm.weight", p));
    }
    for (int i = 0; i < c->n_layers; i++) {
        osp_layer *L = m ? &m->layers[i] : NULL;
        const int64_t D = c->layer_head_dim[i], Q = (int64_t)c->n_heads * D, KV = (int64_t)c->layer_kv_heads[i] * D;
        const int own_kv = c->layer_kv_donor[i] < 0, full = !c->layer_sliding[i];
        /* use_double_wide_mlp doubles the MLP of the KV-shared layers */
        const int64_t I = c->double_wide && !own_kv ? 2 * (int64_t)c->intermediate : c->intermediate;
        if (L) L->intermediate = (int32_t)I;
        OSP_TRY(osp_tvec(visit, ctx, W(attn_norm), H, 0, "%slayers.%d.input_layernorm.weight", p, i));
        OSP_TRY(osp_tlinear(visit, ctx, W(wq), Q, H, 0, "%slayers.%d.self_attn.q_proj", p, i));
        OSP_TRY(osp_tvec(visit, ctx, W(q_norm), D, 0, "%slayers.%d.self_attn.q_norm.weight", p, i));
        if (own_kv) {
            OSP_TRY(osp_tlinear(visit, ctx, W(wk), KV, H, 0, "%slayers.%d.self_attn.k_proj", p, i));
            OSP_TRY(osp_tvec(visit, ctx, W(k_norm), D, 0, "%slayers.%d.self_attn.k_norm.weight", p, i));
            if (!(c->k_eq_v && full)) /* K = V full layers have no v_proj */
                OSP_TRY(osp_tlinear(visit, ctx, W(wv), KV, H, 0, "%slayers.%d.self_attn.v_proj", p, i));
        }
        OSP_TRY(osp_tlinear(visit, ctx, W(wo), H, Q, 0, "%slayers.%d.self_attn.o_proj", p, i));
        OSP_TRY(osp_tvec(visit, ctx, W(post_attn_norm), H, 0, "%slayers.%d.post_attention_layernorm.weight", p, i));
        OSP_TRY(osp_tvec(visit, ctx, W(mlp_norm), H, 0, "%slayers.%d.pre_feedforward_layernorm.weight", p, i));
        OSP_TRY(osp_tlinear(visit, ctx, W(wg), I, H, 0, "%slayers.%d.mlp.gate_proj", p, i));
        OSP_TRY(osp_tlinear(visit, ctx, W(wu), I, H, 0, "%slayers.%d.mlp.up_proj", p, i));
        OSP_TRY(osp_tlinear(visit, ctx, W(wd), H, I, 0, "%slayers.%d.mlp.down_proj", p, i));
        OSP_TRY(osp_tvec(visit, ctx, W(post_mlp_norm), H, 0, "%slayers.%d.post_feedforward_layernorm.weight", p, i));
        if (c->moe) {
            OSP_TRY(osp_tvec(visit, ctx, W(mlp_norm2), H, 0, "%slayers.%d.pre_feedforward_layernorm_2.weight", p, i));
            OSP_TRY(osp_tvec(visit, ctx, W(post_mlp_norm1), H, 0, "%slayers.%d.post_feedforward_layernorm_1.weight", p, i));
            OSP_TRY(osp_tvec(visit, ctx, W(post_mlp_norm2), H, 0, "%slayers.%d.post_feedforward_layernorm_2.weight", p, i));
            OSP_TRY(osp_tvec(visit, ctx, W(router_scale), H, 0, "%slayers.%d.router.scale", p, i));
            OSP_TRY(osp_tvec(visit, ctx, W(per_expert_scale), E, 0, "%slayers.%d.router.per_expert_scale", p, i));
            OSP_TRY(osp_tlinear(visit, ctx, W(w_router), E, H, OSP_TF_Q8_ROUTER, "%slayers.%d.router.proj", p, i));
            OSP_TRY(osp_texperts(visit, ctx, W(ex_gate), W(ex_up), W(ex_down), E, c->top_k_experts,
                                 c->moe_intermediate, H, "%slayers.%d.", p, i));
        }
        if (P) {
            OSP_TRY(osp_tlinear(visit, ctx, W(w_ple_gate), P, H, OSP_TF_Q_IF_FITS, "%slayers.%d.per_layer_input_gate", p, i));
            OSP_TRY(osp_tlinear(visit, ctx, W(w_ple_proj), H, P, OSP_TF_Q_IF_FITS, "%slayers.%d.per_layer_projection", p, i));
            OSP_TRY(osp_tvec(visit, ctx, W(post_ple_norm), H, 0, "%slayers.%d.post_per_layer_input_norm.weight", p, i));
        }
        OSP_TRY(osp_tscalar(visit, ctx, W(layer_scalar), OSP_TF_OPTIONAL, "%slayers.%d.layer_scalar", p, i));
    }
#undef W
    OSP_TRY(osp_tvec(visit, ctx, m ? &m->final_norm : NULL, H, 0, "%snorm.weight", p));
    if (!c->tie_embeddings && !c->no_head)
        OSP_TRY(osp_tlinear(visit, ctx, m ? &m->head : NULL, c->vocab, H, 0, "%s", nm->head));
    return OSP_OK;
}

/* ---- activations of its own ---- */

typedef struct g4_scratch {
    osp_dbuf *ple;                 /* [N, n_layers * P] combined per-layer inputs */
    osp_dbuf *ple_tmp;             /* [N, P] */
    osp_dbuf *ple_emb;             /* [N, n_layers * P] per-layer embeddings */
    osp_dbuf **donor_k, **donor_v; /* [n_layers] chunk K/V kept for KV-sharing layers, or NULL */
    osp_dbuf *router, *moe_normed; /* [N, E], [N, hidden] */
    osp_dbuf *moe_x, *moe_acc;     /* [N*k, hidden] */
    int32_t *top_idx, *moe_rows;   /* host [N, k] */
    float *top_w, *moe_w;          /* host [N, k] */
} g4_scratch;

static void scratch_free(const osp_model *m, void *extra) {
    g4_scratch *g = extra;
    const osp_backend *be = m->be;
    osp_dbuf *v[] = {g->ple, g->ple_tmp, g->ple_emb, g->router, g->moe_normed, g->moe_x, g->moe_acc};
    for (size_t i = 0; i < sizeof v / sizeof *v; i++)
        if (v[i]) be->free(v[i]);
    for (int i = 0; g->donor_k && i < m->cfg.n_layers; i++) {
        if (g->donor_k[i]) be->free(g->donor_k[i]);
        if (g->donor_v[i]) be->free(g->donor_v[i]);
    }
    free(g->donor_k), free(g->donor_v);
    free(g->top_idx), free(g->moe_rows), free(g->top_w), free(g->moe_w);
    free(g);
}

static size_t nz(size_t n) { return n ? n : 1; }

static osp_status scratch_new(const osp_model *m, int32_t max_tok, void **extra, int64_t *inter, int64_t *cols) {
    const osp_config *c = &m->cfg;
    const osp_backend *be = m->be;
    g4_scratch *g = calloc(1, sizeof *g);
    if (!g) return osp_err(OSP_ERR_NOMEM, "out of memory");
    size_t N = (size_t)max_tok, H = c->hidden, NP = (size_t)c->n_layers * c->ple_dim, E = c->n_experts,
           K = c->top_k_experts;
    int ok = 1;
#define D(field, count) (ok &= (g->field = be->alloc(nz(count))) != NULL)
#define HOST(field, count) (ok &= (g->field = malloc(nz(count) * sizeof *g->field)) != NULL)
    if (c->ple_dim) D(ple, N * NP), D(ple_tmp, N * c->ple_dim), D(ple_emb, N * NP);
    if (c->moe) {
        D(router, N * E), D(moe_normed, N * H), D(moe_x, N * K * H), D(moe_acc, N * K * H);
        HOST(top_idx, N * K), HOST(top_w, N * K), HOST(moe_rows, N * K), HOST(moe_w, N * K);
    }
    g->donor_k = calloc((size_t)c->n_layers, sizeof *g->donor_k);
    g->donor_v = calloc((size_t)c->n_layers, sizeof *g->donor_v);
    ok &= g->donor_k && g->donor_v;
    for (int i = 0; ok && i < c->n_layers; i++) { /* layers whose KV others reuse keep their chunk K/V */
        int d = c->layer_kv_donor[i];
        if (d < 0 || g->donor_k[d]) continue;
        size_t kv = N * c->layer_kv_heads[d] * c->layer_head_dim[d];
        D(donor_k[d], kv), D(donor_v[d], kv);
    }
#undef D
#undef HOST
    if (!ok) {
        scratch_free(m, g);
        return osp_err(OSP_ERR_NOMEM, "out of memory allocating activations");
    }
    *inter = c->moe ? c->moe_intermediate : 0; /* the experts run in the shared g/u buffers */
    *cols = c->ple_dim;
    *extra = g;
    return OSP_OK;
}

/* ---- forward ---- */

/* The combined per-layer inputs of this chunk: g->ple [N, L*P] =
 * (norm(proj(h0) · H^-1/2) + E_ple[id] · sqrt(P)) · 2^-1/2. */
static void ple_inputs(osp_session *s, const int32_t *ids, int64_t N) {
    g4_scratch *g = s->sc.extra;
    const osp_model *m = s->m;
    const osp_backend *be = s->be;
    osp_be_session *bs = s->bs;
    const osp_config *c = &m->cfg;
    osp_scratch *sc = &s->sc;
    int64_t NP = (int64_t)c->n_layers * c->ple_dim, P = c->ple_dim;
    const float hs = (float)pow((double)c->hidden, -0.5), r2 = (float)pow(2.0, -0.5); /* as the reference: Python floats */
    be->matmul(bs, &(const osp_weight *){&m->ple_model_proj}, 1, sc->x, N, &g->ple);
    be->scale(bs, g->ple, hs, N * NP);
    be->rmsnorm(bs, g->ple, g->ple, m->ple_proj_norm, N * c->n_layers, P, c->eps, 0);
    be->embed(bs, &m->embed_ple, m->embed_ple_scale, ids, N, g->ple_emb);
    be->add(bs, g->ple, g->ple_emb, N * NP);
    be->scale(bs, g->ple, r2, N * NP);
}

/* res: what the previous layer left to add into x (its output, added with this layer's first norm), or NULL.
 * Returns what this layer leaves so (sc->tmp), or NULL when its x is complete. */
static const osp_dbuf *layer(osp_session *s, int li, int32_t B, int32_t T, const osp_dbuf *res) {
    g4_scratch *g = s->sc.extra;
    const osp_model *m = s->m;
    const osp_backend *be = s->be;
    osp_be_session *bs = s->bs;
    const osp_config *c = &m->cfg;
    const osp_layer *L = &m->layers[li];
    osp_scratch *sc = &s->sc;
    int64_t N = (int64_t)B * T, H = c->hidden, D = c->layer_head_dim[li], Hq = c->n_heads, Hkv = c->layer_kv_heads[li];
    osp_vec inv = c->layer_sliding[li] ? m->inv_freq_sliding : m->inv_freq_full;
    int32_t donor = c->layer_kv_donor[li];

    /* attention */
    if (res) osp_be_add_rmsnorm(be, bs, sc->xn, sc->x, res, L->attn_norm, N, H, c->eps, 0);
    else be->rmsnorm(bs, sc->xn, sc->x, L->attn_norm, N, H, c->eps, 0);
    osp_dbuf *kd = donor < 0 && g->donor_k[li] ? g->donor_k[li] : sc->k;
    osp_dbuf *vd = donor < 0 && g->donor_v[li] ? g->donor_v[li] : sc->v;
    {
        const osp_weight *ws[] = {&L->wq, &L->wk, &L->wv};
        osp_dbuf *ys[] = {sc->q, kd, vd};
        /* q alone when the layer reads its donor's K/V; no v_proj when K = V */
        be->matmul(bs, ws, donor >= 0 ? 1 : L->wv.data ? 3 : 2, sc->xn, N, ys);
    }
    if (donor < 0 && !L->wv.data) be->copy(bs, vd, kd, N * Hkv * D); /* K = V: raw k_proj output */
    osp_rope_qk_args r = {.q = sc->q, .k = donor < 0 ? kd : NULL, .q_heads = Hq, .k_heads = Hkv, .B = B, .T = T,
                          .D = (int32_t)D, .inv_freq = inv, .pos = sc->bpos, .q_norm = L->q_norm,
                          .k_norm = donor < 0 ? L->k_norm : NULL, .eps = c->eps};
    osp_be_rope_qk(be, bs, &r);
    const osp_dbuf *k, *v;
    if (donor < 0) {
        be->rmsnorm(bs, vd, vd, NULL, N * Hkv, D, c->eps, 0);
        k = kd;
        v = vd;
    } else {
        k = g->donor_k[donor];
        v = g->donor_v[donor];
    }
    const osp_kv_layer *KL = &s->kv->layers[li];
    osp_attn_args a = {.kv = s->kv, .layer = KL->donor, .rows = s->rows, .nb = B, .T = T, .n_heads = (int32_t)Hq,
                       .n_kv_heads = (int32_t)Hkv, .head_dim = (int32_t)D, .scale = 1.0f, .window = KL->window,
                       .q = sc->q, .k = k, .v = v, .out = sc->att, .scores = sc->scores,
                       .score_stride = (int64_t)s->kv->max_ctx + sc->max_tok, .chunk_stored = s->exact};
    if (s->exact) { /* each token sees the earlier ones as stored, as in decode steps: donors store now too */
        if (donor < 0) be->kv_write(bs, s->kv, li, s->rows, B, k, v, T);
        be->attention(bs, &a);
    } else {
        be->attention(bs, &a);
        if (donor < 0 && !g->donor_k[li]) be->kv_write(bs, s->kv, li, s->rows, B, k, v, T); /* donors store after all layers */
    }
    be->matmul(bs, &(const osp_weight *){&L->wo}, 1, sc->att, N, &sc->tmp);
    be->rmsnorm(bs, sc->tmp, sc->tmp, L->post_attn_norm, N, H, c->eps, 0);

    /* MLP (+ experts) */
    osp_be_add_rmsnorm(be, bs, sc->xn, sc->x, sc->tmp, L->mlp_norm, N, H, c->eps, 0);
    osp_be_gate_up_act(be, bs, OSP_ACT_GELU_TANH, &L->wg, &L->wu, sc->xn, N, sc->g, sc->u);
    be->matmul(bs, &(const osp_weight *){&L->wd}, 1, sc->g, N, &sc->tmp);
    if (c->moe) {
        be->rmsnorm(bs, sc->tmp, sc->tmp, L->post_mlp_norm1, N, H, c->eps, 0);
        be->rmsnorm(bs, sc->xn, sc->x, L->mlp_norm2, N, H, c->eps, 0);
        osp_dbuf *e = sc->att; /* free after o_proj; sized [N, max(hidden, Hq*D)] */
        osp_moe_args ma = {.x = sc->x, .x2 = sc->xn, .out = e, .n = N, .hidden = H, .n_experts = c->n_experts,
                           .top_k = c->top_k_experts, .inter = c->moe_intermediate, .eps = c->eps,
                           .scale = (float)pow((double)H, -0.5), /* hidden**-0.5 */
                           .router_scale = L->router_scale, .per_expert_scale = L->per_expert_scale,
                           .router = &L->w_router, .gate = L->ex_gate, .up = L->ex_up, .down = L->ex_down,
                           .act = OSP_ACT_GELU_TANH, .normed = g->moe_normed, .probs = g->router,
                           .moe_x = g->moe_x, .moe_acc = g->moe_acc, .g = sc->g, .u = sc->u,
                           .top_idx = g->top_idx, .rows = g->moe_rows, .top_w = g->top_w, .row_w = g->moe_w};
        be->moe(bs, &ma);
        be->rmsnorm(bs, e, e, L->post_mlp_norm2, N, H, c->eps, 0);
        osp_be_add_rmsnorm(be, bs, sc->tmp, sc->tmp, e, L->post_mlp_norm, N, H, c->eps, 0);
    } else {
        be->rmsnorm(bs, sc->tmp, sc->tmp, L->post_mlp_norm, N, H, c->eps, 0);
    }

    /* per-layer input */
    if (c->ple_dim) {
        be->add(bs, sc->x, sc->tmp, N * H);
        int64_t P = c->ple_dim, NP = (int64_t)c->n_layers * P;
        be->matmul(bs, &(const osp_weight *){&L->w_ple_gate}, 1, sc->x, N, &g->ple_tmp);
        be->act_mul(bs, OSP_ACT_GELU_TANH, g->ple_tmp, g->ple_tmp, osp_dbuf_at(g->ple, li * P), N, P, NP);
        be->matmul(bs, &(const osp_weight *){&L->w_ple_proj}, 1, g->ple_tmp, N, &sc->tmp);
        be->rmsnorm(bs, sc->tmp, sc->tmp, L->post_ple_norm, N, H, c->eps, 0);
    }
    if (L->layer_scalar == 1.0f) return sc->tmp; /* x += tmp with the next norm */
    be->add(bs, sc->x, sc->tmp, N * H);
    be->scale(bs, sc->x, L->layer_scalar, N * H);
    return NULL;
}

static osp_status forward_chunk(osp_session *s, const int32_t *ids, int32_t T, int all_logits, float *logits,
                                int64_t ld_rows) {
    g4_scratch *g = s->sc.extra;
    const osp_model *m = s->m;
    const osp_config *c = &m->cfg;
    osp_scratch *sc = &s->sc;
    int32_t B = s->nb;
    int64_t N = (int64_t)B * T;
    s->be->embed(s->bs, &m->embed, m->embed_scale, ids, N, sc->x);
    if (c->ple_dim) ple_inputs(s, ids, N);
    const osp_dbuf *res = NULL;
    for (int li = 0; li < c->n_layers; li++) res = layer(s, li, B, T, res);
    if (res && !logits) s->be->add(s->bs, sc->x, res, N * c->hidden); /* else with the head's norm */
    for (int li = 0; li < c->n_layers && !s->exact; li++)
        if (g->donor_k[li]) s->be->kv_write(s->bs, s->kv, li, s->rows, B, g->donor_k[li], g->donor_v[li], T);
    for (int32_t b = 0; b < B; b++) s->kv->pos[s->rows[b]] += T;
    if (logits) {
        osp_head_args h = {.x = sc->x, .norm = m->final_norm, .w = &m->head, .B = B, .T = T,
                           .all_logits = all_logits, .hidden = c->hidden, .vocab = c->vocab, .ld_rows = ld_rows,
                           .eps = c->eps, .softcap = c->final_softcap, .add_one = 0, .logits = logits, .res = res,
                           .ids = s->head_ids, .need = s->head_need, .defer_ids = s->head_defer, .xn = sc->xn,
                           .hlast = sc->hlast};
        s->be->head(s->bs, &h);
    }
    return OSP_OK;
}

const osp_arch_ops osp_arch_gemma4 = {
    .name = "gemma4",
    .hf_names = (const char *const[]){"Gemma4ForCausalLM", "Gemma4ForConditionalGeneration",
                                      "Gemma4ForConditionalGeneration", NULL},
    .model_types = (const char *const[]){"gemma4_text", "gemma4", "gemma4_unified", NULL},
    .act_default = "gelu_pytorch_tanh",
    .sliding_pattern = 1,
    .last_layer_full = 1,
    .configure = configure,
    .layout = layout,
    .scratch_new = scratch_new,
    .scratch_free = scratch_free,
    .forward_chunk = forward_chunk,
};
