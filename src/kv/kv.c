#include <stdlib.h>
#include <string.h>
#include "kv.h"
#include "backend/kvq.h"

static void *host_alloc(size_t n) { return osp_pages_alloc(OSP_POOL_KV, n); }
static void host_free(void *p, size_t n) { osp_pages_free(OSP_POOL_KV, p, n); }
static void host_copy(void *d, const void *s, size_t n) { memcpy(d, s, n); }
static const osp_kv_mem HOST = {host_alloc, host_free, host_copy, host_copy, host_copy};

static int64_t block_bytes(const osp_kv_layer *l, int32_t cap) { return 2 * (int64_t)l->n_kv_heads * cap * l->slot_bytes; }

/* The first m slots of every plane of a block of capacity sc into a block of
 * capacity dc: K then V, each 1 (f32, bf16) or 3 (codes, scales, biases)
 * planes [Hkv, cap, x]. */
static void copy_planes(const osp_kv_mem *mem, const osp_kv_layer *l, unsigned char *dst, int32_t dc,
                        const unsigned char *src, int32_t sc, int32_t m) {
    int64_t H = l->n_kv_heads, per[3] = {l->bits ? l->cb : l->slot_bytes, 2 * l->ng, 2 * l->ng};
    int n_planes = l->bits ? 3 : 1; /* bf16: scales and biases planes of 0 bytes */
    for (int which = 0; which < 2; which++)
        for (int p = 0; p < n_planes; p++) {
            if (sc == dc && m == sc) mem->copy(dst, src, (size_t)(H * sc * per[p]));
            else
                for (int64_t h = 0; h < H; h++) mem->copy(dst + h * dc * per[p], src + h * sc * per[p], (size_t)(m * per[p]));
            src += H * sc * per[p];
            dst += H * dc * per[p];
        }
}

static void free_row_mem(osp_kv *kv, int32_t row) {
    for (int i = 0; i < kv->n_layers; i++) {
        osp_kv_layer *l = &kv->layers[i];
        if (!l->mem || !l->mem[row]) continue;
        kv->bytes -= block_bytes(l, l->cap[row]);
        kv->mem->free(l->mem[row], (size_t)block_bytes(l, l->cap[row]));
        l->mem[row] = NULL;
        l->cap[row] = 0;
    }
}

osp_status osp_kv_new(int32_t n_rows, int32_t n_layers, const osp_kv_spec *specs, int32_t max_ctx, int32_t spare,
                      const osp_kv_mem *mem, osp_kv **out) {
    *out = NULL;
    if (n_rows <= 0 || max_ctx <= 0) return osp_err(OSP_ERR_INVALID, "KV cache needs rows > 0 and context > 0");
    if (spare < 0) return osp_err(OSP_ERR_INVALID, "spare ring slots must be >= 0");
    for (int i = 0; i < n_layers; i++) {
        const osp_kv_spec *s = &specs[i];
        if (s->bits == 0) continue;
        if (s->bits == 16 && !osp_kvq_supported(s->head_dim, 16, 0))
            return osp_err(OSP_ERR_INVALID, "layer %d: a 16-bit KV cache needs head_dim a multiple of 16 up to %d "
                           "(got %d)", i, OSP_KVQ_MAX_D, s->head_dim);
        if (s->bits == 16) continue;
        if ((s->bits != 4 && s->bits != 8) || (s->group != 32 && s->group != 64 && s->group != 128) ||
            s->head_dim % s->group != 0)
            return osp_err(OSP_ERR_INVALID, "layer %d: a quantized KV cache needs 4 or 8 bits and a group of 32, 64 "
                           "or 128 dividing head_dim %d (got %d bits, group %d)", i, s->head_dim, s->bits, s->group);
    }
    osp_kv *kv = calloc(1, sizeof *kv);
    if (!kv) return osp_err(OSP_ERR_NOMEM, "out of memory");
    kv->n_rows = n_rows;
    kv->n_layers = n_layers;
    kv->max_ctx = max_ctx;
    kv->spare = spare;
    kv->mem = mem ? mem : &HOST;
    kv->pos = calloc((size_t)n_rows, sizeof *kv->pos);
    kv->round = malloc((size_t)n_rows * sizeof *kv->round);
    kv->layers = calloc((size_t)n_layers, sizeof *kv->layers);
    kv->specs = malloc((size_t)n_layers * sizeof *kv->specs);
    if (!kv->pos || !kv->round || !kv->layers || !kv->specs) goto oom;
    memcpy(kv->specs, specs, (size_t)n_layers * sizeof *specs);
    for (int32_t b = 0; b < n_rows; b++) kv->round[b] = -1;
    for (int i = 0; i < n_layers; i++) {
        osp_kv_layer *l = &kv->layers[i];
        const osp_kv_spec *s = &specs[i];
        l->n_kv_heads = s->n_kv_heads;
        l->head_dim = s->head_dim;
        l->sliding = s->window > 0 && s->window < max_ctx;
        l->window = l->sliding ? s->window : 0;
        l->ring = l->sliding ? s->window + spare : 0;
        if (l->ring > max_ctx) l->ring = max_ctx;
        l->bits = s->bits;
        l->group = s->bits && s->bits != 16 ? s->group : 0;
        l->cb = s->bits ? (int64_t)s->head_dim * s->bits / 8 : 0;
        l->ng = l->group ? s->head_dim / s->group : 0; /* 16-bit: values only, no scales or biases */
        l->slot_bytes = s->bits ? l->cb + 4 * l->ng : (int64_t)s->head_dim * (int64_t)sizeof(float);
        l->donor = i;
        if (s->share_from >= 0 && s->share_from < i) {
            l->donor = s->share_from;
            continue;
        }
        l->cap = calloc((size_t)n_rows, sizeof *l->cap);
        l->mem = calloc((size_t)n_rows, sizeof *l->mem);
        if (!l->cap || !l->mem) goto oom;
    }
    *out = kv;
    return OSP_OK;
oom:
    osp_kv_free(kv);
    return osp_err(OSP_ERR_NOMEM, "out of memory creating a KV cache of %d rows", n_rows);
}

void osp_kv_free(osp_kv *kv) {
    if (!kv) return;
    if (kv->layers) {
        for (int32_t b = 0; b < kv->n_rows; b++) free_row_mem(kv, b);
        for (int i = 0; i < kv->n_layers; i++) {
            free(kv->layers[i].cap);
            free(kv->layers[i].mem);
        }
    }
    free(kv->layers);
    free(kv->specs);
    free(kv->pos);
    free(kv->round);
    free(kv);
}

void osp_kv_reset_row(osp_kv *kv, int32_t row) {
    if (row < 0 || row >= kv->n_rows) return;
    free_row_mem(kv, row);
    kv->pos[row] = 0;
    kv->round[row] = -1;
}

size_t osp_kv_bytes(const osp_kv *kv) { return (size_t)kv->bytes; }

static int32_t want_cap(const osp_kv *kv, const osp_kv_layer *l, int32_t n) {
    if (l->sliding) return l->ring;
    int64_t c = ((int64_t)n + OSP_KV_STEP - 1) / OSP_KV_STEP * OSP_KV_STEP;
    return c > kv->max_ctx ? kv->max_ctx : (int32_t)c;
}

int64_t osp_kv_row_bytes(const osp_kv *kv, int32_t n) {
    int64_t t = 0;
    for (int i = 0; i < kv->n_layers; i++) {
        const osp_kv_layer *l = &kv->layers[i];
        if (l->mem) t += block_bytes(l, want_cap(kv, l, n));
    }
    return t;
}

osp_status osp_kv_reserve(osp_kv *kv, int32_t row, int32_t n) {
    if (row < 0 || row >= kv->n_rows) return osp_err(OSP_ERR_INVALID, "KV row %d out of range", row);
    if (n > kv->max_ctx) return osp_err(OSP_ERR_RANGE, "%d positions exceed the context of %d", n, kv->max_ctx);
    int64_t delta = 0;
    for (int i = 0; i < kv->n_layers; i++) {
        const osp_kv_layer *l = &kv->layers[i];
        if (!l->mem) continue;
        int32_t c = want_cap(kv, l, n);
        if (c > l->cap[row]) delta += block_bytes(l, c) - block_bytes(l, l->cap[row]);
    }
    if (!delta) return OSP_OK;
    if (kv->budget > 0 && kv->bytes + delta > kv->budget)
        return osp_err(OSP_ERR_NOMEM, "the KV budget of %lld bytes is used up (%lld in use, %lld more needed)",
                       (long long)kv->budget, (long long)kv->bytes, (long long)delta);
    for (int i = 0; i < kv->n_layers; i++) {
        osp_kv_layer *l = &kv->layers[i];
        if (!l->mem) continue;
        int32_t c = want_cap(kv, l, n), old = l->cap[row];
        if (c <= old) continue;
        unsigned char *nm = kv->mem->alloc((size_t)block_bytes(l, c));
        if (!nm) return osp_err(OSP_ERR_NOMEM, "out of memory growing the KV cache to %d positions", n);
        if (l->mem[row]) {
            copy_planes(kv->mem, l, nm, c, l->mem[row], old, old);
            kv->mem->free(l->mem[row], (size_t)block_bytes(l, old));
        }
        kv->bytes += block_bytes(l, c) - block_bytes(l, old);
        l->mem[row] = nm;
        l->cap[row] = c;
    }
    return OSP_OK;
}

int osp_kv_resumable(const osp_kv *kv, int32_t P, int32_t p) {
    if (p < 0 || p > P) return 0;
    for (int i = 0; i < kv->n_layers; i++) {
        const osp_kv_layer *l = &kv->layers[i];
        if (!l->sliding || !l->mem) continue;
        int32_t need = p - l->window + 1 > 0 ? p - l->window + 1 : 0;
        int32_t have = P - l->ring > 0 ? P - l->ring : 0;
        if (need < have) return 0;
    }
    return 1;
}

/* Can row `row`, now at pos[row], go back to position p? Sliding rings must
 * still hold every position a query at p would see. */
static osp_status check_back(const osp_kv *kv, int32_t row, int32_t p) {
    int32_t P = kv->pos[row];
    if (p < 0 || p > P) return osp_err(OSP_ERR_RANGE, "row %d: cannot move from position %d to %d", row, P, p);
    if (!osp_kv_resumable(kv, P, p)) {
        for (int i = 0; i < kv->n_layers; i++) {
            const osp_kv_layer *l = &kv->layers[i];
            if (l->sliding && l->mem)
                return osp_err(OSP_ERR_RANGE, "row %d: the sliding window ring (%d slots) no longer holds what "
                               "position %d needs; trimming %d tokens needs more spare slots", row, l->ring, p, P - p);
        }
    }
    return OSP_OK;
}

osp_status osp_kv_trim(osp_kv *kv, int32_t row, int32_t n) {
    if (row < 0 || row >= kv->n_rows) return osp_err(OSP_ERR_INVALID, "KV row %d out of range", row);
    OSP_TRY(check_back(kv, row, kv->pos[row] - n));
    kv->pos[row] -= n;
    return OSP_OK;
}

void osp_kv_round_begin(osp_kv *kv) {
    for (int32_t b = 0; b < kv->n_rows; b++) kv->round[b] = kv->pos[b];
}

osp_status osp_kv_rollback(osp_kv *kv, const int32_t *keep) {
    for (int32_t b = 0; b < kv->n_rows; b++) {
        if (kv->round[b] < 0) return osp_err(OSP_ERR_INVALID, "rollback without round_begin (row %d)", b);
        if (keep[b] < 0) return osp_err(OSP_ERR_INVALID, "row %d: keep must be >= 0", b);
        int64_t p = (int64_t)kv->round[b] + keep[b];
        if (p > kv->pos[b])
            return osp_err(OSP_ERR_RANGE, "row %d: keeping %d tokens, but only %d were added", b, keep[b],
                           kv->pos[b] - kv->round[b]);
        OSP_TRY(check_back(kv, b, (int32_t)p));
    }
    for (int32_t b = 0; b < kv->n_rows; b++) {
        kv->pos[b] = kv->round[b] + keep[b];
        kv->round[b] = -1;
    }
    return OSP_OK;
}

void osp_kv_commit(osp_kv *kv) {
    for (int32_t b = 0; b < kv->n_rows; b++) kv->round[b] = -1;
}

/* Copy row sr of src into the empty row dr of dst (same specs). */
static osp_status copy_row(osp_kv *dst, int32_t dr, const osp_kv *src, int32_t sr) {
    for (int i = 0; i < src->n_layers; i++) {
        const osp_kv_layer *s = &src->layers[i];
        osp_kv_layer *d = &dst->layers[i];
        if (!s->mem || !s->mem[sr]) continue;
        size_t n = (size_t)block_bytes(s, s->cap[sr]);
        d->mem[dr] = dst->mem->alloc(n);
        if (!d->mem[dr]) return osp_err(OSP_ERR_NOMEM, "out of memory copying a KV row");
        dst->mem->copy(d->mem[dr], s->mem[sr], n);
        d->cap[dr] = s->cap[sr];
        dst->bytes += (int64_t)n;
    }
    dst->pos[dr] = src->pos[sr];
    return OSP_OK;
}

int osp_kv_same_layout(const osp_kv *a, const osp_kv *b) {
    if (a->n_layers != b->n_layers || a->spare != b->spare) return 0;
    for (int i = 0; i < a->n_layers; i++) {
        const osp_kv_layer *x = &a->layers[i], *y = &b->layers[i];
        if (x->sliding != y->sliding || x->ring != y->ring || x->window != y->window || x->n_kv_heads != y->n_kv_heads ||
            x->head_dim != y->head_dim || x->donor != y->donor || x->bits != y->bits || x->group != y->group)
            return 0;
    }
    return 1;
}

/* Positions [0, n) of row sr of src into the empty row dr of dst (the same
 * layout): full layers get the capacity n needs and their first n slots,
 * sliding layers their whole ring (valid for n when osp_kv_resumable says
 * so). Blocks keep K then V, each 1 or 3 planes [Hkv, cap, x]. */
static osp_status copy_slots(osp_kv *dst, int32_t dr, const osp_kv *src, int32_t sr, int32_t n) {
    for (int i = 0; i < src->n_layers; i++) {
        const osp_kv_layer *s = &src->layers[i];
        osp_kv_layer *d = &dst->layers[i];
        if (!s->mem || !s->mem[sr]) continue;
        int32_t sc = s->cap[sr], dc = want_cap(dst, d, n), m = s->sliding ? sc : (n < sc ? n : sc);
        if (m > dc) m = dc;
        unsigned char *nm = dst->mem->alloc((size_t)block_bytes(d, dc));
        if (!nm) return osp_err(OSP_ERR_NOMEM, "out of memory copying a KV row");
        copy_planes(dst->mem, s, nm, dc, s->mem[sr], sc, m);
        d->mem[dr] = nm;
        d->cap[dr] = dc;
        dst->bytes += block_bytes(d, dc);
    }
    dst->pos[dr] = n;
    return OSP_OK;
}

osp_status osp_kv_snapshot(const osp_kv *kv, int32_t row, osp_kv **out) {
    *out = NULL;
    if (row < 0 || row >= kv->n_rows) return osp_err(OSP_ERR_INVALID, "KV row %d out of range", row);
    osp_kv *r;
    OSP_TRY(osp_kv_new(1, kv->n_layers, kv->specs, kv->max_ctx, kv->spare, kv->mem, &r));
    osp_status rc = copy_slots(r, 0, kv, row, kv->pos[row]);
    if (rc != OSP_OK) {
        osp_kv_free(r);
        return rc;
    }
    *out = r;
    return OSP_OK;
}

osp_status osp_kv_load_row(osp_kv *kv, int32_t row, const osp_kv *src, int32_t sr, int32_t n) {
    if (row < 0 || row >= kv->n_rows || sr < 0 || sr >= src->n_rows)
        return osp_err(OSP_ERR_INVALID, "KV row %d / %d out of range", row, sr);
    if (!osp_kv_same_layout(kv, src)) return osp_err(OSP_ERR_INVALID, "the KV rows have different layouts");
    if (n > kv->max_ctx || !osp_kv_resumable(src, src->pos[sr], n))
        return osp_err(OSP_ERR_RANGE, "a KV row of %d positions cannot resume at %d", src->pos[sr], n);
    osp_kv_reset_row(kv, row);
    osp_status rc = copy_slots(kv, row, src, sr, n);
    if (rc != OSP_OK) osp_kv_reset_row(kv, row);
    return rc;
}

osp_status osp_kv_extract(const osp_kv *kv, int32_t row, osp_kv **out) {
    *out = NULL;
    if (row < 0 || row >= kv->n_rows) return osp_err(OSP_ERR_INVALID, "KV row %d out of range", row);
    osp_kv *r;
    OSP_TRY(osp_kv_new(1, kv->n_layers, kv->specs, kv->max_ctx, kv->spare, kv->mem, &r));
    osp_status rc = copy_row(r, 0, kv, row);
    if (rc != OSP_OK) {
        osp_kv_free(r);
        return rc;
    }
    *out = r;
    return OSP_OK;
}

osp_status osp_kv_merge(const osp_kv *const *parts, int32_t n, osp_kv **out) {
    *out = NULL;
    if (n <= 0) return osp_err(OSP_ERR_INVALID, "merge needs at least one cache");
    int32_t rows = 0;
    for (int32_t i = 0; i < n; i++) {
        const osp_kv *p = parts[i];
        if (p->n_layers != parts[0]->n_layers || p->max_ctx != parts[0]->max_ctx || p->spare != parts[0]->spare ||
            memcmp(p->specs, parts[0]->specs, sizeof *p->specs * (size_t)p->n_layers) != 0)
            return osp_err(OSP_ERR_INVALID, "merge: cache %d has another layout than cache 0", i);
        rows += p->n_rows;
    }
    osp_kv *r;
    OSP_TRY(osp_kv_new(rows, parts[0]->n_layers, parts[0]->specs, parts[0]->max_ctx, parts[0]->spare, parts[0]->mem, &r));
    int32_t d = 0;
    for (int32_t i = 0; i < n; i++)
        for (int32_t b = 0; b < parts[i]->n_rows; b++, d++) {
            osp_status rc = copy_row(r, d, parts[i], b);
            if (rc != OSP_OK) {
                osp_kv_free(r);
                return rc;
            }
        }
    *out = r;
    return OSP_OK;
}

osp_status osp_kv_filter(osp_kv *kv, const int32_t *keep, int32_t n) {
    if (n < 0 || n > kv->n_rows) return osp_err(OSP_ERR_INVALID, "filter: %d rows of %d", n, kv->n_rows);
    char *used = calloc((size_t)kv->n_rows, 1);
    if (!used) return osp_err(OSP_ERR_NOMEM, "out of memory");
    for (int32_t i = 0; i < n; i++) {
        if (keep[i] < 0 || keep[i] >= kv->n_rows || used[keep[i]]) {
            free(used);
            return osp_err(OSP_ERR_INVALID, "filter: row %d is out of range or listed twice", keep[i]);
        }
        used[keep[i]] = 1;
    }
    for (int32_t b = 0; b < kv->n_rows; b++)
        if (!used[b]) free_row_mem(kv, b);
    free(used);
    /* keep[] is distinct: move entries forward through a temporary copy */
    for (int l = 0; l < kv->n_layers; l++) {
        osp_kv_layer *L = &kv->layers[l];
        if (!L->mem) continue;
        unsigned char *mem[n > 0 ? n : 1];
        int32_t cap[n > 0 ? n : 1];
        for (int32_t i = 0; i < n; i++) mem[i] = L->mem[keep[i]], cap[i] = L->cap[keep[i]];
        for (int32_t i = 0; i < kv->n_rows; i++) L->mem[i] = i < n ? mem[i] : NULL, L->cap[i] = i < n ? cap[i] : 0;
    }
    int32_t pos[n > 0 ? n : 1], round[n > 0 ? n : 1];
    for (int32_t i = 0; i < n; i++) pos[i] = kv->pos[keep[i]], round[i] = kv->round[keep[i]];
    for (int32_t i = 0; i < n; i++) kv->pos[i] = pos[i], kv->round[i] = round[i];
    kv->n_rows = n;
    return OSP_OK;
}
