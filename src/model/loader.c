/* Model loading: resolve the folder, parse config.json, bind every tensor
 * the architecture needs (checking names, dtypes and shapes), and fill
 * osp_model_info. Quantization per module follows mlx-lm: an explicit
 * entry in config "quantization" wins (false = dense), otherwise a module
 * is quantized with the defaults iff <path>.scales exists. */
#include <dirent.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "core/fs.h"
#include "model.h"

/* Weight-name prefix of the text model ("model." for text checkpoints; none for a bare model saved without its
 * head, as sentence-transformers embedders are: Qwen3-Embedding). */
static const char *PREFIXES[] = {"model.", "model.language_model.", "language_model.model.", ""};
static const char *HEADS[] = {"lm_head", "lm_head", "language_model.lm_head", "lm_head"};
#define N_PREFIXES ((int)(sizeof PREFIXES / sizeof *PREFIXES))

/* The checkpoint's names with prefix pi: the architecture's own prefixes (an encoder's "bert.", "roberta.", none)
 * or the decoders' */
static osp_tnames names_of(const osp_config *c, int pi) {
    if (c->arch->prefixes) return (osp_tnames){c->arch->prefixes[pi], "lm_head"};
    return (osp_tnames){PREFIXES[pi], HEADS[pi]};
}

static osp_status bind_all(osp_model *m) {
    const osp_config *c = &m->cfg;
    const char *const *prefixes = c->arch->prefixes ? c->arch->prefixes : PREFIXES;
    const char *probe = c->arch->prefixes ? c->arch->probe : "embed_tokens.weight";
    char n[512];
    int pi = -1;
    for (int i = 0; (c->arch->prefixes ? prefixes[i] != NULL : i < N_PREFIXES) && pi < 0; i++) {
        snprintf(n, sizeof n, "%s%s", prefixes[i], probe);
        if (osp_st_find(m->st, n)) pi = i;
    }
    if (pi < 0) return osp_err(OSP_ERR_FORMAT, "%s: tensor '%s%s' is missing", m->dir, prefixes[0], probe);
    m->layers = calloc((size_t)c->n_layers, sizeof *m->layers);
    if (!m->layers) return osp_err(OSP_ERR_NOMEM, "out of memory");
    for (int i = 0; i < c->n_layers; i++) m->layers[i].layer_scalar = 1.0f;
    m->prefix = pi;
    osp_tnames names = names_of(c, pi);
    /* no head: a bare model's weights (no prefix), or an untied config whose head is absent (Qwen3-Embedding-8B
     * says tie_word_embeddings false and has no lm_head); such a model embeds, it does not generate. An encoder
     * never has one. */
    snprintf(n, sizeof n, "%s.weight", names.head);
    m->cfg.no_head = c->arch->encoder || !*names.prefix || (!c->tie_embeddings && !osp_st_find(m->st, n));
    OSP_TRY(c->arch->layout(c, m, &names, osp_bind_visit, m));
    if (c->tie_embeddings && !c->no_head) { /* the head reads the embedding's weights, streamed every step */
        m->head = m->embed;
        m->info.decode_bytes += m->head.rows * osp_weight_row_bytes(&m->head);
    }
    return OSP_OK;
}

static void fill_info(osp_model *m) {
    const osp_config *c = &m->cfg;
    osp_model_info *in = &m->info;
    in->architecture = c->architecture;
    in->model_type = c->model_type;
    in->n_layers = c->n_layers;
    in->hidden = c->hidden;
    in->n_heads = c->n_heads;
    in->n_kv_heads = c->n_kv_heads;
    in->head_dim = c->head_dim;
    in->intermediate = c->intermediate;
    in->vocab = c->vocab;
    in->max_ctx = c->max_pos;
    in->sliding_window = c->sliding_window;
    in->dir = m->dir;
    in->device = m->be->name;
    in->eos_ids = c->eos_ids;
    in->n_eos = c->n_eos;
    in->bos_id = c->bos_id;
    in->has_head = !c->no_head;
    for (int i = 0; i < c->n_layers && !c->arch->encoder; i++) { /* (an encoder keeps no KV cache) */
        in->n_sliding_layers += c->layer_sliding[i];
        if (c->layer_kv_donor[i] >= 0) { /* shares its donor's cache */
            in->n_kv_shared_layers++;
            continue;
        }
        int64_t per_layer = 2LL * c->layer_kv_heads[i] * c->layer_head_dim[i] * (int64_t)sizeof(float);
        if (c->layer_sliding[i]) {
            in->kv_bytes_sliding += per_layer * c->sliding_window;
        } else {
            in->kv_bytes_per_token += per_layer;
        }
    }
    const osp_weight *probe = &m->layers[0].wq;
    in->quant_bits = probe->qbits;
    in->quant_group = probe->group;
    snprintf(m->dtype_name, sizeof m->dtype_name, "%s",
             osp_dtype_name(probe->qbits ? probe->sdtype : probe->dtype));
    in->dtype = m->dtype_name;
}

/* Gemma's embedding scale: the f32 value of sqrt(dim), as the reference's
 * scale buffer holds it (torch.tensor(dim ** 0.5)); not rounded to the
 * embedding's dtype (docs/NOTES.md, "Reference numerics"). */
static float embed_scale(float dim) { return (float)sqrt((double)dim); }

/* What a layout walk of the loaded model collects: its matmul weights (to
 * place) or its vectors (to free). */
typedef struct collect_ctx {
    osp_model *m;
    int vectors;          /* 0: matmul weights; 1: vectors */
    void **out;           /* NULL: count only */
    int n;
    const void **keep;    /* matmul walk: data of gathered tables (they stay where they are) */
    int n_keep;
} collect_ctx;

static void put(collect_ctx *c, void *p) {
    if (c->out) c->out[c->n] = p;
    c->n++;
}

static osp_status collect(void *ctx, const osp_tdesc *d) {
    collect_ctx *c = ctx;
    if (c->vectors) {
        if (d->kind == OSP_T_VEC && d->vec && *d->vec) put(c, (void *)*d->vec);
        return OSP_OK;
    }
    if (d->kind == OSP_T_LINEAR && (d->flags & OSP_TF_GATHERED)) {
        if (c->keep) c->keep[c->n_keep] = d->w->data;
        c->n_keep++;
    } else if (d->kind == OSP_T_LINEAR && d->w->data) {
        put(c, d->w);
    } else if (d->kind == OSP_T_EXPERTS) {
        for (int64_t e = 0; e < d->n_exp; e++) put(c, &(*d->gate)[e]), put(c, &(*d->up)[e]), put(c, &(*d->down)[e]);
    }
    return OSP_OK;
}

/* Walk the model's layout with the collector (twice: count, then fill). */
static osp_status walk(osp_model *m, collect_ctx *c) {
    osp_tnames names = names_of(&m->cfg, m->prefix);
    OSP_TRY(m->cfg.arch->layout(&m->cfg, m, &names, collect, c));
    if (!c->vectors && m->cfg.tie_embeddings && !m->cfg.no_head) put(c, &m->head); /* the embedding's weights, streamed as the head */
    return OSP_OK;
}

/* The backend places the matmul weights now, once: the embedding tables
 * are gathered from the mapping and stay there. */
static osp_status place(osp_model *m) {
    collect_ctx c = {.m = m};
    OSP_TRY(walk(m, &c));
    osp_weight **ws = malloc(sizeof *ws * (size_t)(c.n ? c.n : 1));
    const void **keep = malloc(sizeof *keep * (size_t)(c.n_keep ? c.n_keep : 1));
    osp_region *maps = malloc(sizeof *maps * (size_t)(m->st->n_files ? m->st->n_files : 1));
    if (!ws || !keep || !maps) {
        free(ws), free(keep), free(maps);
        return osp_err(OSP_ERR_NOMEM, "out of memory");
    }
    c = (collect_ctx){.m = m, .out = (void **)ws, .keep = keep};
    walk(m, &c);
    for (int i = 0; i < m->st->n_files; i++) maps[i] = (osp_region){m->st->files[i].map, m->st->files[i].size};
    osp_status rc = m->be->place(ws, c.n, keep, c.n_keep, maps, m->st->n_files, &m->placed);
    for (int f = 0; f < 2 && rc == OSP_OK; f++)
    {
        for (int e = 0; e < 2; e++)
            m->chunk_invariant[f][e] =
                m->be->chunk_invariant ? m->be->chunk_invariant((const osp_weight *const *)ws, c.n, f, e) : 0;
        m->pass_tokens[f] = m->be->pass_tokens ? m->be->pass_tokens((const osp_weight *const *)ws, c.n, f) : 8;
    }
    if (rc != OSP_OK) {
        char why[256];
        snprintf(why, sizeof why, "%s", osp_last_error());
        rc = osp_err(rc, "%s: %s", m->dir, why);
    }
    free(ws);
    free(keep);
    free(maps);
    return rc;
}

osp_status osp_model_load_params(const char *path, const osp_model_params *p, osp_model **out) {
    *out = NULL;
    osp_err_clear();
    char dir[4096], cfgp[4200];
    OSP_TRY(osp_resolve_model_dir(path, dir, sizeof dir));
    osp_model *m = calloc(1, sizeof *m);
    if (!m) return osp_err(OSP_ERR_NOMEM, "out of memory");
    m->dir = strdup(dir);
    m->be = osp_backend_get((osp_device)(p ? p->device : OSP_DEVICE_AUTO));
    if (!m->be) { /* its message is set */
        free(m->dir);
        free(m);
        return OSP_ERR_UNSUPPORTED;
    }
    snprintf(cfgp, sizeof cfgp, "%s/config.json", dir);
    osp_status rc = osp_config_load(cfgp, &m->cfg);
    if (rc == OSP_OK) rc = osp_st_open_dir(dir, &m->st);
    if (rc == OSP_OK) rc = bind_all(m);
    if (rc == OSP_OK) {
        const osp_config *c = &m->cfg;
        m->embed_scale = c->embed_scaled ? embed_scale((float)c->hidden) : 1.0f;
        if (c->ple_dim) m->embed_ple_scale = embed_scale((float)c->ple_dim);
        /* RoPE tables per layer type, sized by that type's head_dim */
        int32_t d_full = c->head_dim, d_slide = c->head_dim;
        for (int i = c->n_layers - 1; i >= 0; i--) {
            if (c->layer_sliding[i]) d_slide = c->layer_head_dim[i];
            else d_full = c->layer_head_dim[i];
        }
        for (int i = 0; i < c->n_layers && rc == OSP_OK; i++)
            if (c->layer_head_dim[i] != (c->layer_sliding[i] ? d_slide : d_full))
                rc = osp_err(OSP_ERR_UNSUPPORTED, "%s: layers of one attention type with different head_dim", m->dir);
        float *fi = osp_malloc(OSP_POOL_WEIGHTS, sizeof(float) * (size_t)d_full / 2);
        float *si = osp_malloc(OSP_POOL_WEIGHTS, sizeof(float) * (size_t)d_slide / 2);
        if (rc == OSP_OK && (!fi || !si)) rc = osp_err(OSP_ERR_NOMEM, "out of memory");
        if (rc == OSP_OK) {
            osp_rope_inv_freq(&c->rope_full, d_full, fi);
            osp_rope_inv_freq(&c->rope_sliding, d_slide, si);
            m->inv_freq_full = m->be->adopt_vec(fi, d_full / 2);
            m->inv_freq_sliding = m->be->adopt_vec(si, d_slide / 2);
            fi = si = NULL;
            fill_info(m);
        }
        osp_free(fi);
        osp_free(si);
    }
    if (rc == OSP_OK && (!p || p->place)) rc = place(m);
    if (rc != OSP_OK) {
        osp_model_free(m);
        return rc;
    }
    *out = m;
    return OSP_OK;
}

osp_status osp_model_load(const char *path, osp_model **out) {
    osp_model_params p = {.device = OSP_DEVICE_AUTO, .place = 1};
    return osp_model_load_params(path, &p, out);
}

void osp_model_free(osp_model *m) {
    if (!m) return;
    if (m->layers) { /* the vectors the layout bound, in the backend's memory */
        collect_ctx c = {.m = m, .vectors = 1};
        walk(m, &c);
        void **v = malloc(sizeof *v * (size_t)(c.n ? c.n : 1));
        if (v) {
            c = (collect_ctx){.m = m, .vectors = 1, .out = v};
            walk(m, &c);
            for (int i = 0; i < c.n; i++) m->be->free_vec(v[i]);
            free(v);
        }
        for (int i = 0; i < m->cfg.n_layers; i++) {
            free(m->layers[i].ex_gate);
            free(m->layers[i].ex_up);
            free(m->layers[i].ex_down);
        }
        free(m->layers);
    }
    osp_vec v[] = {m->inv_freq_full, m->inv_freq_sliding};
    for (size_t j = 0; j < sizeof v / sizeof *v; j++)
        if (v[j]) m->be->free_vec((osp_dbuf *)v[j]);
    if (m->placed) m->be->unplace(m->placed);
    osp_st_close(m->st);
    osp_config_free(&m->cfg);
    free(m->dir);
    free(m);
}

const osp_model_info *osp_model_get_info(const osp_model *m) { return &m->info; }

osp_status osp_model_bw_trial(const osp_model *m, int release, double *gbps) {
    return osp_backend_bw_trial(m->be, release, gbps);
}
