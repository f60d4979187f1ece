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
#include "attention.h"
#include "core/threadpool.h"
#include "model.h"

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
    float *ls = VEC("layer_scalar", 1, 0);
    L->layer_scalar = ls ? ls[0] : 1.0f;
    osp_free(ls);
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

osp_status osp_gemma4_bind(osp_model *m, const char *pre) {
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

static void head_norm(const osp_ops *ops, float *x, const float *w, int64_t rows, int64_t heads, int64_t D, float eps) {
    for (int64_t r = 0; r < rows * heads; r++) ops->rmsnorm(x + r * D, x + r * D, w, D, eps, 0);
}

static void head_rope(float *x, int64_t T, int32_t B, int64_t heads, int32_t D, const float *inv, const int32_t *pos) {
    for (int32_t b = 0; b < B; b++)
        for (int64_t t = 0; t < T; t++)
            for (int64_t h = 0; h < heads; h++)
                osp_rope_apply(x + (((int64_t)b * T + t) * heads + h) * D, D, inv, pos[b] + (int32_t)t);
}

/* The combined per-layer inputs of this chunk: sc->ple [N, L*P]. */
static void ple_inputs(osp_session *s, const int32_t *ids, int64_t N) {
    const osp_model *m = s->m;
    const osp_config *c = &m->cfg;
    osp_scratch *sc = &s->sc;
    int64_t NP = (int64_t)c->n_layers * c->ple_dim, P = c->ple_dim;
    osp_matmul(s, &m->ple_model_proj, sc->x, N, sc->ple);
    const float hs = (float)pow((double)c->hidden, -0.5), r2 = (float)pow(2.0, -0.5); /* as the reference: Python floats */
    for (int64_t i = 0; i < N; i++) {
        float *row = sc->ple + i * NP;
        for (int64_t j = 0; j < NP; j++) row[j] *= hs;
        for (int32_t l = 0; l < c->n_layers; l++) m->ops->rmsnorm(row + l * P, row + l * P, m->ple_proj_norm, P, c->eps, 0);
        float *e = sc->ple_emb;
        osp_weight_row_f32(&m->embed_ple, ids[i], e);
        for (int64_t j = 0; j < NP; j++) row[j] = (row[j] + e[j] * m->embed_ple_scale) * r2;
    }
}

/* Routed experts for all N tokens, added into out (zeroed first). */
static void moe_block(osp_session *s, const osp_layer *L, const float *xr, const float *x2, int64_t N, float *out) {
    const osp_model *m = s->m;
    const osp_config *c = &m->cfg;
    const osp_ops *ops = m->ops;
    osp_scratch *sc = &s->sc;
    int64_t H = c->hidden, E = c->n_experts, K = c->top_k_experts, I = c->moe_intermediate;
    const float hs = (float)pow((double)H, -0.5); /* hidden**-0.5 */
    /* router on the un-normed residual */
    for (int64_t i = 0; i < N; i++) {
        float *n = sc->moe_out + i * H;
        ops->rmsnorm(n, xr + i * H, NULL, H, c->eps, 0);
        for (int64_t j = 0; j < H; j++) n[j] = n[j] * L->router_scale[j] * hs;
    }
    osp_matmul(s, &L->w_router, sc->moe_out, N, sc->router);
    for (int64_t i = 0; i < N; i++) {
        float *p = sc->router + i * E;
        ops->softmax(p, E);
        int32_t *idx = sc->top_idx + i * K;
        float *w = sc->top_w + i * K, sum = 0;
        for (int64_t k = 0; k < K; k++) { /* top-k, ties to the lower index */
            int64_t best = -1;
            for (int64_t e = 0; e < E; e++) {
                int taken = 0;
                for (int64_t j = 0; j < k; j++) taken |= idx[j] == e;
                if (!taken && (best < 0 || p[e] > p[best])) best = e;
            }
            idx[k] = (int32_t)best;
            w[k] = p[best];
            sum += p[best];
        }
        for (int64_t k = 0; k < K; k++) w[k] = w[k] / sum * L->per_expert_scale[idx[k]];
    }
    memset(out, 0, sizeof(float) * N * H);
    for (int64_t e = 0; e < E; e++) { /* gather the tokens routed to e, run it once for all */
        int64_t n = 0;
        for (int64_t i = 0; i < N; i++)
            for (int64_t k = 0; k < K; k++)
                if (sc->top_idx[i * K + k] == e) {
                    sc->moe_rows[n] = (int32_t)i;
                    sc->moe_w[n] = sc->top_w[i * K + k];
                    memcpy(sc->moe_x + n * H, x2 + i * H, sizeof(float) * H);
                    n++;
                }
        if (!n) continue;
        const osp_weight *ws[] = {&L->ex_gate[e], &L->ex_up[e]};
        float *ys[] = {sc->g, sc->u};
        osp_matmul_shared(s, ws, 2, sc->moe_x, n, ys);
        ops->gelu_tanh_mul(sc->g, sc->g, sc->u, n * I);
        osp_matmul(s, &L->ex_down[e], sc->g, n, sc->moe_acc);
        for (int64_t r = 0; r < n; r++) ops->axpy(out + (int64_t)sc->moe_rows[r] * H, sc->moe_w[r], sc->moe_acc + r * H, H);
    }
}

static void layer(osp_session *s, int li, int32_t B, int32_t T) {
    const osp_model *m = s->m;
    const osp_config *c = &m->cfg;
    const osp_layer *L = &m->layers[li];
    const osp_ops *ops = m->ops;
    osp_scratch *sc = &s->sc;
    int64_t N = (int64_t)B * T, H = c->hidden, D = c->layer_head_dim[li], Hq = c->n_heads, Hkv = c->layer_kv_heads[li];
    int sliding = c->layer_sliding[li];
    const float *inv = sliding ? m->inv_freq_sliding : m->inv_freq_full;
    int32_t donor = c->layer_kv_donor[li];

    /* attention */
    osp_norm_rows(ops, sc->xn, sc->x, L->attn_norm, N, H, c->eps, 0);
    float *kd = donor < 0 && sc->donor_k[li] ? sc->donor_k[li] : sc->k;
    float *vd = donor < 0 && sc->donor_v[li] ? sc->donor_v[li] : sc->v;
    {
        const osp_weight *ws[] = {&L->wq, &L->wk, &L->wv};
        float *ys[] = {sc->q, kd, vd};
        /* q alone when the layer reads its donor's K/V; no v_proj when K = V */
        osp_matmul_shared(s, ws, donor >= 0 ? 1 : L->wv.data ? 3 : 2, sc->xn, N, ys);
    }
    head_norm(ops, sc->q, L->q_norm, N, Hq, D, c->eps);
    head_rope(sc->q, T, B, Hq, (int32_t)D, inv, sc->bpos);
    const float *k = sc->k, *v = sc->v;
    if (donor < 0) {
        if (!L->wv.data) memcpy(vd, kd, sizeof(float) * N * Hkv * D); /* K = V: raw k_proj output */
        head_norm(ops, kd, L->k_norm, N, Hkv, D, c->eps);
        head_rope(kd, T, B, Hkv, (int32_t)D, inv, sc->bpos);
        for (int64_t r = 0; r < N * Hkv; r++) ops->rmsnorm(vd + r * D, vd + r * D, NULL, D, c->eps, 0);
        k = kd;
        v = vd;
    } else {
        k = sc->donor_k[donor];
        v = sc->donor_v[donor];
    }
    const osp_kv_layer *KL = &s->kv->layers[li];
    osp_attn_args a = {.ops = ops, .kv = s->kv, .layer = KL->donor, .rows = s->rows, .nb = B, .T = T,
                       .n_heads = (int32_t)Hq, .n_kv_heads = (int32_t)Hkv, .head_dim = (int32_t)D, .scale = 1.0f,
                       .window = KL->window, .q = sc->q, .k = k, .v = v, .out = sc->att,
                       .scores = sc->scores, .score_stride = (int64_t)s->kv->max_ctx + sc->max_tok};
    osp_attention(&a);
    if (donor < 0 && !sc->donor_k[li]) osp_kv_write(s->kv, li, s->rows, B, k, v, T); /* donors store after all layers */
    osp_matmul(s, &L->wo, sc->att, N, sc->tmp);
    osp_norm_rows(ops, sc->tmp, sc->tmp, L->post_attn_norm, N, H, c->eps, 0);
    for (int64_t i = 0; i < N * H; i++) sc->x[i] += sc->tmp[i];

    /* MLP (+ experts) */
    int64_t I = L->intermediate;
    osp_norm_rows(ops, sc->xn, sc->x, L->mlp_norm, N, H, c->eps, 0);
    {
        const osp_weight *ws[] = {&L->wg, &L->wu};
        float *ys[] = {sc->g, sc->u};
        osp_matmul_shared(s, ws, 2, sc->xn, N, ys);
    }
    ops->gelu_tanh_mul(sc->g, sc->g, sc->u, N * I);
    osp_matmul(s, &L->wd, sc->g, N, sc->tmp);
    if (c->moe) {
        osp_norm_rows(ops, sc->tmp, sc->tmp, L->post_mlp_norm1, N, H, c->eps, 0);
        osp_norm_rows(ops, sc->xn, sc->x, L->mlp_norm2, N, H, c->eps, 0);
        float *e = sc->att; /* free after o_proj; sized [N, max(hidden, Hq*D)] */
        moe_block(s, L, sc->x, sc->xn, N, e);
        osp_norm_rows(ops, e, e, L->post_mlp_norm2, N, H, c->eps, 0);
        for (int64_t i = 0; i < N * H; i++) sc->tmp[i] += e[i];
    }
    osp_norm_rows(ops, sc->tmp, sc->tmp, L->post_mlp_norm, N, H, c->eps, 0);
    for (int64_t i = 0; i < N * H; i++) sc->x[i] += sc->tmp[i];

    /* per-layer input */
    if (c->ple_dim) {
        int64_t P = c->ple_dim, NP = (int64_t)c->n_layers * P;
        osp_matmul(s, &L->w_ple_gate, sc->x, N, sc->ple_tmp);
        for (int64_t i = 0; i < N; i++)
            ops->gelu_tanh_mul(sc->ple_tmp + i * P, sc->ple_tmp + i * P, sc->ple + i * NP + li * P, P);
        osp_matmul(s, &L->w_ple_proj, sc->ple_tmp, N, sc->tmp);
        osp_norm_rows(ops, sc->tmp, sc->tmp, L->post_ple_norm, N, H, c->eps, 0);
        for (int64_t i = 0; i < N * H; i++) sc->x[i] += sc->tmp[i];
    }
    if (L->layer_scalar != 1.0f)
        for (int64_t i = 0; i < N * H; i++) sc->x[i] *= L->layer_scalar;
}

osp_status osp_gemma4_forward_chunk(osp_session *s, const int32_t *ids, int32_t T, float *logits, int all_logits,
                                    int64_t ld_rows) {
    const osp_model *m = s->m;
    const osp_config *c = &m->cfg;
    osp_scratch *sc = &s->sc;
    int32_t B = s->nb;
    int64_t N = (int64_t)B * T;
    osp_embed_rows(m, &m->embed, m->embed_scale, ids, N, sc->x);
    if (c->ple_dim) ple_inputs(s, ids, N);
    for (int li = 0; li < c->n_layers; li++) layer(s, li, B, T);
    for (int li = 0; li < c->n_layers; li++)
        if (sc->donor_k[li]) osp_kv_write(s->kv, li, s->rows, B, sc->donor_k[li], sc->donor_v[li], T);
    for (int32_t b = 0; b < B; b++) s->kv->pos[s->rows[b]] += T;
    if (logits) osp_head(s, sc->x, B, T, all_logits, logits, ld_rows);
    return OSP_OK;
}
