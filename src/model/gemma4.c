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

/* ---- binding ---- */

static osp_status bad(osp_model *m, const char *name, const char *what) {
    return osp_err(OSP_ERR_FORMAT, "%s: tensor '%s': %s", m->dir, name, what);
}

/* Slice expert e of a stacked dense tensor [E, rows, cols] (rows starting at r0). */
static osp_weight dense_slice(const osp_st_tensor *t, int64_t e, int64_t r0, int64_t rows, int64_t cols) {
    size_t es = osp_dtype_size(t->dtype);
    osp_weight w = {.dtype = t->dtype, .rows = rows, .cols = cols};
    w.data = (const unsigned char *)t->data + ((e * t->shape[1] + r0) * cols) * (int64_t)es;
    return w;
}

/* Experts: HF fused (experts.gate_up_proj [E, 2I, H], experts.down_proj
 * [E, H, I]) or MLX switch_glu ({gate,up,down}_proj.{weight,scales,biases}
 * stacked on a leading E axis, quantized or not). */
static osp_status bind_experts(osp_model *m, const char *lp, osp_layer *L) {
    const osp_config *c = &m->cfg;
    int64_t E = c->n_experts, I = c->moe_intermediate, H = c->hidden;
    char n[512];
    L->ex_gate = calloc(E, sizeof(osp_weight));
    L->ex_up = calloc(E, sizeof(osp_weight));
    L->ex_down = calloc(E, sizeof(osp_weight));
    if (!L->ex_gate || !L->ex_up || !L->ex_down) return osp_err(OSP_ERR_NOMEM, "out of memory");
    snprintf(n, sizeof n, "%sexperts.gate_up_proj", lp);
    const osp_st_tensor *gu = osp_st_find(m->st, n);
    if (gu) {
        snprintf(n, sizeof n, "%sexperts.down_proj", lp);
        const osp_st_tensor *dn = osp_st_find(m->st, n);
        if (!dn) return osp_err(OSP_ERR_FORMAT, "%s: tensor '%s' is missing", m->dir, n);
        int fl = gu->dtype == OSP_DT_BF16 || gu->dtype == OSP_DT_F16 || gu->dtype == OSP_DT_F32;
        if (!fl || gu->ndim != 3 || gu->shape[0] != E || gu->shape[1] != 2 * I || gu->shape[2] != H)
            return bad(m, gu->name, "expected a float tensor [num_experts, 2 * moe_intermediate_size, hidden]");
        if (dn->dtype != gu->dtype || dn->ndim != 3 || dn->shape[0] != E || dn->shape[1] != H || dn->shape[2] != I)
            return bad(m, dn->name, "expected a float tensor [num_experts, hidden, moe_intermediate_size]");
        for (int64_t e = 0; e < E; e++) {
            L->ex_gate[e] = dense_slice(gu, e, 0, I, H); /* first half of the rows is gate */
            L->ex_up[e] = dense_slice(gu, e, I, I, H);
            L->ex_down[e] = dense_slice(dn, e, 0, H, I);
        }
        m->info.weight_bytes += (int64_t)(gu->nbytes + dn->nbytes);
        m->info.n_params += gu->numel + dn->numel;
        m->info.decode_bytes += (int64_t)(gu->nbytes + dn->nbytes) / E * c->top_k_experts;
        return OSP_OK;
    }
    /* MLX: bind [E*rows, cols] views through the 2-D binder, then slice */
    static const char *names[3] = {"gate_proj", "up_proj", "down_proj"};
    osp_weight *dst[3] = {L->ex_gate, L->ex_up, L->ex_down};
    for (int k = 0; k < 3; k++) {
        int64_t rows = k < 2 ? I : H, cols = k < 2 ? H : I;
        snprintf(n, sizeof n, "%sexperts.switch_glu.%s.weight", lp, names[k]);
        const osp_st_tensor *t = osp_st_find(m->st, n);
        if (!t) return osp_err(OSP_ERR_FORMAT, "%s: no experts found: tensor '%sexperts.gate_up_proj' or '%s' is missing",
                               m->dir, lp, n);
        if (t->ndim != 3 || t->shape[0] != E || t->shape[1] != rows)
            return bad(m, n, "expected a stacked expert tensor [num_experts, rows, ...]");
        /* Treat the stack as one [E*rows, cols] matrix: same bytes, same per-row layout. */
        snprintf(n, sizeof n, "%sexperts.switch_glu.%s", lp, names[k]);
        osp_st_tensor saved = *t;
        osp_st_tensor *tm = (osp_st_tensor *)t;
        tm->ndim = 2;
        tm->shape[0] = E * rows;
        tm->shape[1] = saved.shape[2];
        osp_st_tensor *ts[2] = {NULL, NULL}, sv[2];
        for (int j = 0; j < 2; j++) {
            char sn[560];
            snprintf(sn, sizeof sn, "%s.%s", n, j ? "biases" : "scales");
            ts[j] = (osp_st_tensor *)osp_st_find(m->st, sn);
            if (ts[j] && ts[j]->ndim == 3 && ts[j]->shape[0] == E && ts[j]->shape[1] == rows) {
                sv[j] = *ts[j];
                ts[j]->ndim = 2;
                ts[j]->shape[0] = E * rows;
                ts[j]->shape[1] = sv[j].shape[2];
            } else {
                ts[j] = NULL;
            }
        }
        osp_weight all;
        osp_status rc = osp_bind_linear(m, n, E * rows, cols, &all);
        *tm = saved;
        for (int j = 0; j < 2; j++)
            if (ts[j]) *ts[j] = sv[j];
        OSP_TRY(rc);
        int64_t rb = osp_weight_row_bytes(&all) - (all.qbits ? 2 * (cols / all.group) * (int64_t)osp_dtype_size(all.sdtype) : 0);
        for (int64_t e = 0; e < E; e++) {
            osp_weight w = all;
            w.rows = rows;
            w.data = (const unsigned char *)all.data + e * rows * rb;
            if (all.qbits) {
                int64_t sb = rows * (cols / all.group) * (int64_t)osp_dtype_size(all.sdtype);
                w.scales = (const unsigned char *)all.scales + e * sb;
                w.biases = (const unsigned char *)all.biases + e * sb;
            }
            dst[k][e] = w;
        }
        m->info.decode_bytes += all.rows * osp_weight_row_bytes(&all) / E * c->top_k_experts;
    }
    return OSP_OK;
}

static int64_t wbytes(const osp_weight *w) { return w->rows * osp_weight_row_bytes(w); }

static osp_status bind_layer(osp_model *m, const char *pre, int i) {
    osp_config *c = &m->cfg;
    osp_layer *L = &m->layers[i];
    char lp[256], p[512];
    snprintf(lp, sizeof lp, "%slayers.%d.", pre, i);
    int64_t H = c->hidden, D = c->layer_head_dim[i], Q = (int64_t)c->n_heads * D, KV = (int64_t)c->layer_kv_heads[i] * D;
    int own_kv = c->layer_kv_donor[i] < 0;
    osp_status rc = OSP_OK;
#define PATH(s) (snprintf(p, sizeof p, "%s%s", lp, s), p)
#define VEC(s, len, req) osp_bind_vec(m, PATH(s), len, req, &rc)
    OSP_TRY(osp_bind_linear(m, PATH("self_attn.q_proj"), Q, H, &L->wq));
    OSP_TRY(osp_bind_linear(m, PATH("self_attn.o_proj"), H, Q, &L->wo));
    if (own_kv) {
        OSP_TRY(osp_bind_linear(m, PATH("self_attn.k_proj"), KV, H, &L->wk));
        if (!(c->k_eq_v && !c->layer_sliding[i])) OSP_TRY(osp_bind_linear(m, PATH("self_attn.v_proj"), KV, H, &L->wv));
        L->k_norm = VEC("self_attn.k_norm.weight", D, 1);
    }
    L->q_norm = VEC("self_attn.q_norm.weight", D, 1);
    /* MLP width: trust the weights (use_double_wide_mlp doubles KV-shared layers) */
    snprintf(p, sizeof p, "%smlp.gate_proj.weight", lp);
    const osp_st_tensor *g = osp_st_find(m->st, p);
    L->intermediate = g && g->ndim == 2 ? (int32_t)g->shape[0] : c->intermediate;
    if (L->intermediate != c->intermediate && L->intermediate != 2 * c->intermediate)
        return bad(m, p, "MLP width is neither intermediate_size nor twice it");
    OSP_TRY(osp_bind_linear(m, PATH("mlp.gate_proj"), L->intermediate, H, &L->wg));
    OSP_TRY(osp_bind_linear(m, PATH("mlp.up_proj"), L->intermediate, H, &L->wu));
    OSP_TRY(osp_bind_linear(m, PATH("mlp.down_proj"), H, L->intermediate, &L->wd));
    L->attn_norm = VEC("input_layernorm.weight", H, 1);
    L->post_attn_norm = VEC("post_attention_layernorm.weight", H, 1);
    L->mlp_norm = VEC("pre_feedforward_layernorm.weight", H, 1);
    L->post_mlp_norm = VEC("post_feedforward_layernorm.weight", H, 1);
    L->layer_scalar = osp_bind_scalar(m, PATH("layer_scalar"), 1.0f, &rc);
    if (c->ple_dim) {
        OSP_TRY(osp_bind_linear(m, PATH("per_layer_input_gate"), c->ple_dim, H, &L->w_ple_gate));
        OSP_TRY(osp_bind_linear(m, PATH("per_layer_projection"), H, c->ple_dim, &L->w_ple_proj));
        L->post_ple_norm = VEC("post_per_layer_input_norm.weight", H, 1);
    }
    if (c->moe) {
        L->mlp_norm2 = VEC("pre_feedforward_layernorm_2.weight", H, 1);
        L->post_mlp_norm1 = VEC("post_feedforward_layernorm_1.weight", H, 1);
        L->post_mlp_norm2 = VEC("post_feedforward_layernorm_2.weight", H, 1);
        L->router_scale = VEC("router.scale", H, 1);
        L->per_expert_scale = VEC("router.per_expert_scale", c->n_experts, 1);
        OSP_TRY(rc);
        OSP_TRY(osp_bind_linear(m, PATH("router.proj"), c->n_experts, H, &L->w_router));
        OSP_TRY(bind_experts(m, lp, L));
    }
#undef PATH
#undef VEC
    OSP_TRY(rc);
    const osp_weight *ws[] = {&L->wq, &L->wo, &L->wk, &L->wv, &L->wg, &L->wu, &L->wd,
                              &L->w_ple_gate, &L->w_ple_proj, &L->w_router};
    for (size_t j = 0; j < sizeof ws / sizeof *ws; j++)
        if (ws[j]->data) m->info.decode_bytes += wbytes(ws[j]);
    return OSP_OK;
}

static osp_status bind(osp_model *m, const char *pre) {
    osp_config *c = &m->cfg;
    char n[512];
    if (c->ple_dim) {
        int64_t NP = (int64_t)c->n_layers * c->ple_dim;
        snprintf(n, sizeof n, "%sembed_tokens_per_layer", pre);
        OSP_TRY(osp_bind_linear(m, n, c->ple_vocab, NP, &m->embed_ple));
        snprintf(n, sizeof n, "%sper_layer_model_projection", pre);
        OSP_TRY(osp_bind_linear(m, n, NP, c->hidden, &m->ple_model_proj));
        m->info.decode_bytes += wbytes(&m->ple_model_proj);
        osp_status rc = OSP_OK;
        snprintf(n, sizeof n, "%sper_layer_projection_norm.weight", pre);
        m->ple_proj_norm = osp_bind_vec(m, n, c->ple_dim, 1, &rc);
        OSP_TRY(rc);
    }
    for (int i = 0; i < c->n_layers; i++) OSP_TRY(bind_layer(m, pre, i));
    return OSP_OK;
}

/* ---- forward ---- */

/* The combined per-layer inputs of this chunk: sc->ple [N, L*P] =
 * (norm(proj(h0) · H^-1/2) + E_ple[id] · sqrt(P)) · 2^-1/2. */
static void ple_inputs(osp_session *s, const int32_t *ids, int64_t N) {
    const osp_model *m = s->m;
    const osp_backend *be = s->be;
    osp_be_session *bs = s->bs;
    const osp_config *c = &m->cfg;
    osp_scratch *sc = &s->sc;
    int64_t NP = (int64_t)c->n_layers * c->ple_dim, P = c->ple_dim;
    const float hs = (float)pow((double)c->hidden, -0.5), r2 = (float)pow(2.0, -0.5); /* as the reference: Python floats */
    be->matmul(bs, &(const osp_weight *){&m->ple_model_proj}, 1, sc->x, N, &sc->ple);
    be->scale(bs, sc->ple, hs, N * NP);
    be->rmsnorm(bs, sc->ple, sc->ple, m->ple_proj_norm, N * c->n_layers, P, c->eps, 0);
    be->embed(bs, &m->embed_ple, m->embed_ple_scale, ids, N, sc->ple_emb);
    be->add(bs, sc->ple, sc->ple_emb, N * NP);
    be->scale(bs, sc->ple, r2, N * NP);
}

static void layer(osp_session *s, int li, int32_t B, int32_t T) {
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
    be->rmsnorm(bs, sc->xn, sc->x, L->attn_norm, N, H, c->eps, 0);
    osp_dbuf *kd = donor < 0 && sc->donor_k[li] ? sc->donor_k[li] : sc->k;
    osp_dbuf *vd = donor < 0 && sc->donor_v[li] ? sc->donor_v[li] : sc->v;
    {
        const osp_weight *ws[] = {&L->wq, &L->wk, &L->wv};
        osp_dbuf *ys[] = {sc->q, kd, vd};
        /* q alone when the layer reads its donor's K/V; no v_proj when K = V */
        be->matmul(bs, ws, donor >= 0 ? 1 : L->wv.data ? 3 : 2, sc->xn, N, ys);
    }
    be->rmsnorm(bs, sc->q, sc->q, L->q_norm, N * Hq, D, c->eps, 0);
    be->rope(bs, sc->q, B, T, Hq, (int32_t)D, inv, sc->bpos);
    const osp_dbuf *k, *v;
    if (donor < 0) {
        if (!L->wv.data) be->copy(bs, vd, kd, N * Hkv * D); /* K = V: raw k_proj output */
        be->rmsnorm(bs, kd, kd, L->k_norm, N * Hkv, D, c->eps, 0);
        be->rope(bs, kd, B, T, Hkv, (int32_t)D, inv, sc->bpos);
        be->rmsnorm(bs, vd, vd, NULL, N * Hkv, D, c->eps, 0);
        k = kd;
        v = vd;
    } else {
        k = sc->donor_k[donor];
        v = sc->donor_v[donor];
    }
    const osp_kv_layer *KL = &s->kv->layers[li];
    osp_attn_args a = {.kv = s->kv, .layer = KL->donor, .rows = s->rows, .nb = B, .T = T, .n_heads = (int32_t)Hq,
                       .n_kv_heads = (int32_t)Hkv, .head_dim = (int32_t)D, .scale = 1.0f, .window = KL->window,
                       .q = sc->q, .k = k, .v = v, .out = sc->att, .scores = sc->scores,
                       .score_stride = (int64_t)s->kv->max_ctx + sc->max_tok};
    be->attention(bs, &a);
    if (donor < 0 && !sc->donor_k[li]) be->kv_write(bs, s->kv, li, s->rows, B, k, v, T); /* donors store after all layers */
    be->matmul(bs, &(const osp_weight *){&L->wo}, 1, sc->att, N, &sc->tmp);
    be->rmsnorm(bs, sc->tmp, sc->tmp, L->post_attn_norm, N, H, c->eps, 0);
    be->add(bs, sc->x, sc->tmp, N * H);

    /* MLP (+ experts) */
    int64_t I = L->intermediate;
    be->rmsnorm(bs, sc->xn, sc->x, L->mlp_norm, N, H, c->eps, 0);
    {
        const osp_weight *ws[] = {&L->wg, &L->wu};
        osp_dbuf *ys[] = {sc->g, sc->u};
        be->matmul(bs, ws, 2, sc->xn, N, ys);
    }
    be->act_mul(bs, OSP_ACT_GELU_TANH, sc->g, sc->g, sc->u, N, I, I);
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
                           .act = OSP_ACT_GELU_TANH, .normed = sc->moe_normed, .probs = sc->router,
                           .moe_x = sc->moe_x, .moe_acc = sc->moe_acc, .g = sc->g, .u = sc->u,
                           .top_idx = sc->top_idx, .rows = sc->moe_rows, .top_w = sc->top_w, .row_w = sc->moe_w};
        be->moe(bs, &ma);
        be->rmsnorm(bs, e, e, L->post_mlp_norm2, N, H, c->eps, 0);
        be->add(bs, sc->tmp, e, N * H);
    }
    be->rmsnorm(bs, sc->tmp, sc->tmp, L->post_mlp_norm, N, H, c->eps, 0);
    be->add(bs, sc->x, sc->tmp, N * H);

    /* per-layer input */
    if (c->ple_dim) {
        int64_t P = c->ple_dim, NP = (int64_t)c->n_layers * P;
        be->matmul(bs, &(const osp_weight *){&L->w_ple_gate}, 1, sc->x, N, &sc->ple_tmp);
        be->act_mul(bs, OSP_ACT_GELU_TANH, sc->ple_tmp, sc->ple_tmp, osp_dbuf_at(sc->ple, li * P), N, P, NP);
        be->matmul(bs, &(const osp_weight *){&L->w_ple_proj}, 1, sc->ple_tmp, N, &sc->tmp);
        be->rmsnorm(bs, sc->tmp, sc->tmp, L->post_ple_norm, N, H, c->eps, 0);
        be->add(bs, sc->x, sc->tmp, N * H);
    }
    if (L->layer_scalar != 1.0f) be->scale(bs, sc->x, L->layer_scalar, N * H);
}

static osp_status forward_chunk(osp_session *s, const int32_t *ids, int32_t T, int all_logits, float *logits,
                                int64_t ld_rows) {
    const osp_model *m = s->m;
    const osp_config *c = &m->cfg;
    osp_scratch *sc = &s->sc;
    int32_t B = s->nb;
    int64_t N = (int64_t)B * T;
    s->be->embed(s->bs, &m->embed, m->embed_scale, ids, N, sc->x);
    if (c->ple_dim) ple_inputs(s, ids, N);
    for (int li = 0; li < c->n_layers; li++) layer(s, li, B, T);
    for (int li = 0; li < c->n_layers; li++)
        if (sc->donor_k[li]) s->be->kv_write(s->bs, s->kv, li, s->rows, B, sc->donor_k[li], sc->donor_v[li], T);
    for (int32_t b = 0; b < B; b++) s->kv->pos[s->rows[b]] += T;
    if (logits) {
        osp_head_args h = {.x = sc->x, .norm = m->final_norm, .w = &m->head, .B = B, .T = T,
                           .all_logits = all_logits, .hidden = c->hidden, .vocab = c->vocab, .ld_rows = ld_rows,
                           .eps = c->eps, .softcap = c->final_softcap, .add_one = 0, .logits = logits,
                           .xn = sc->xn, .hlast = sc->hlast};
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
    .bind = bind,
    .forward_chunk = forward_chunk,
};
