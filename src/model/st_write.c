/* Safetensors writer; layout and ownership are described in st_write.h. */
#include <errno.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "st_write.h"

typedef struct stw_tensor {
    char *name;
    osp_dtype dtype;
    int ndim;
    int64_t shape[OSP_ST_WRITER_MAX_DIMS];
    const void *data; /* borrowed; NULL = produced by the fill callback */
    size_t nbytes;
} stw_tensor;

struct osp_st_writer {
    stw_tensor *t; /* [n], capacity cap */
    int64_t n, cap;
    json_t *meta;  /* string -> string */
    json_t *names; /* name -> null, for the uniqueness check */
    uint64_t data_bytes;
    size_t chunk_bytes;
};

static char *stw_strdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = osp_malloc(OSP_POOL_MISC, n);
    if (d) memcpy(d, s, n);
    return d;
}

osp_st_writer *osp_st_writer_new(void) {
    osp_st_writer *w = osp_calloc(OSP_POOL_MISC, sizeof *w);
    if (!w) return NULL;
    w->meta = json_object();
    w->names = json_object();
    w->chunk_bytes = (size_t)64 << 20;
    if (!w->meta || !w->names) {
        osp_st_writer_free(w);
        return NULL;
    }
    return w;
}

void osp_st_writer_free(osp_st_writer *w) {
    if (!w) return;
    for (int64_t i = 0; i < w->n; i++) osp_free(w->t[i].name);
    osp_free(w->t);
    json_decref(w->meta);
    json_decref(w->names);
    osp_free(w);
}

osp_status osp_st_writer_set_meta(osp_st_writer *w, const char *key, const char *value) {
    if (!w || !key || !value)
        return osp_err(OSP_ERR_INVALID, "safetensors writer: NULL metadata key or value");
    if (json_object_set_new(w->meta, key, json_string(value)) != 0)
        return osp_err(OSP_ERR_INVALID,
                       "safetensors writer: metadata %s is not valid UTF-8 (or out of memory)",
                       key);
    return OSP_OK;
}

osp_status osp_st_writer_add(osp_st_writer *w, const char *name, osp_dtype dtype, int ndim,
                             const int64_t *shape, const void *data, size_t nbytes) {
    if (!w || !name || !*name)
        return osp_err(OSP_ERR_INVALID, "safetensors writer: missing tensor name");
    if (strcmp(name, "__metadata__") == 0)
        return osp_err(OSP_ERR_INVALID, "safetensors writer: \"__metadata__\" is reserved");
    if (json_object_get(w->names, name))
        return osp_err(OSP_ERR_INVALID, "safetensors writer: duplicate tensor %s", name);
    if ((unsigned)dtype >= OSP_DT_COUNT)
        return osp_err(OSP_ERR_INVALID, "safetensors writer: %s: bad dtype %d", name, (int)dtype);
    if (ndim < 0 || ndim > OSP_ST_WRITER_MAX_DIMS || (ndim > 0 && !shape))
        return osp_err(OSP_ERR_INVALID, "safetensors writer: %s: bad rank %d", name, ndim);
    uint64_t numel = 1;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] < 0 || (shape[d] > 0 && numel > (UINT64_MAX >> 4) / (uint64_t)shape[d]))
            return osp_err(OSP_ERR_INVALID, "safetensors writer: %s: bad dimension %lld", name,
                           (long long)shape[d]);
        numel *= (uint64_t)shape[d];
    }
    if (numel * osp_dtype_size(dtype) != nbytes)
        return osp_err(OSP_ERR_INVALID,
                       "safetensors writer: %s: %zu bytes given, shape and dtype need %llu", name,
                       nbytes, (unsigned long long)(numel * osp_dtype_size(dtype)));
    if (w->n == w->cap) {
        int64_t cap = w->cap ? 2 * w->cap : 64;
        stw_tensor *t = osp_malloc(OSP_POOL_MISC, (size_t)cap * sizeof *t);
        if (!t) return osp_err(OSP_ERR_NOMEM, "safetensors writer: out of memory");
        if (w->n) memcpy(t, w->t, (size_t)w->n * sizeof *t);
        osp_free(w->t);
        w->t = t;
        w->cap = cap;
    }
    stw_tensor *t = &w->t[w->n];
    memset(t, 0, sizeof *t);
    t->name = stw_strdup(name);
    if (!t->name || json_object_set_new(w->names, name, json_null()) != 0) {
        osp_free(t->name);
        return osp_err(OSP_ERR_INVALID,
                       "safetensors writer: tensor name is not valid UTF-8 (or out of memory)");
    }
    t->dtype = dtype;
    t->ndim = ndim;
    for (int d = 0; d < ndim; d++) t->shape[d] = shape[d];
    t->data = data;
    t->nbytes = nbytes;
    w->n++;
    w->data_bytes += nbytes;
    return OSP_OK;
}

int64_t osp_st_writer_count(const osp_st_writer *w) { return w ? w->n : 0; }
uint64_t osp_st_writer_data_bytes(const osp_st_writer *w) { return w ? w->data_bytes : 0; }

void osp_st_writer_set_chunk_bytes(osp_st_writer *w, size_t bytes) {
    if (w) w->chunk_bytes = bytes ? bytes : 1;
}

/* The JSON header, unpadded. Returns a jansson-allocated string. */
static char *stw_header(const osp_st_writer *w) {
    json_t *root = json_object();
    if (!root) return NULL;
    int bad = 0;
    if (json_object_size(w->meta) > 0) bad |= json_object_set(root, "__metadata__", w->meta);
    uint64_t off = 0;
    for (int64_t i = 0; i < w->n && !bad; i++) {
        const stw_tensor *t = &w->t[i];
        json_t *shape = json_array();
        for (int d = 0; d < t->ndim && shape; d++)
            bad |= json_array_append_new(shape, json_integer(t->shape[d]));
        json_t *e = json_pack("{s:s, s:o, s:[I,I]}", "dtype", osp_dtype_name(t->dtype), "shape",
                              shape, "data_offsets", (json_int_t)off,
                              (json_int_t)(off + t->nbytes));
        bad |= !e || json_object_set_new(root, t->name, e);
        off += t->nbytes;
    }
    char *s = bad ? NULL : json_dumps(root, JSON_COMPACT);
    json_decref(root);
    return s;
}

static osp_status stw_put(FILE *f, const char *path, const void *p, size_t n) {
    if (n && fwrite(p, 1, n, f) != n)
        return osp_err(OSP_ERR_IO, "%s: write failed: %s", path, strerror(errno));
    return OSP_OK;
}

/* A background thread writes one buffer while the caller fills the next
 * (synth is compute-bound for quantized files and disk-bound for dense
 * ones; overlapping the two roughly halves the time). One buffer is in
 * flight at most. The thread only does fwrite; errors become messages on
 * the caller's thread (osp_err is thread-local). */
typedef struct stw_io {
    FILE *f;
    pthread_t tid;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    const void *p; /* buffer being written; NULL when idle */
    size_t n;
    int quit, failed, err;
} stw_io;

static void *stw_io_main(void *arg) {
    stw_io *io = arg;
    pthread_mutex_lock(&io->mu);
    for (;;) {
        while (!io->p && !io->quit) pthread_cond_wait(&io->cv, &io->mu);
        if (!io->p) break;
        const void *p = io->p;
        size_t n = io->n;
        int skip = io->failed;
        pthread_mutex_unlock(&io->mu);
        int ok = skip || fwrite(p, 1, n, io->f) == n;
        int e = errno;
        pthread_mutex_lock(&io->mu);
        if (!ok) {
            io->failed = 1;
            io->err = e;
        }
        io->p = NULL;
        pthread_cond_broadcast(&io->cv);
    }
    pthread_mutex_unlock(&io->mu);
    return NULL;
}

/* Wait until the buffer in flight is written. */
static osp_status stw_io_wait(stw_io *io, const char *path) {
    pthread_mutex_lock(&io->mu);
    while (io->p) pthread_cond_wait(&io->cv, &io->mu);
    int failed = io->failed, e = io->err;
    pthread_mutex_unlock(&io->mu);
    if (failed) return osp_err(OSP_ERR_IO, "%s: write failed: %s", path, strerror(e));
    return OSP_OK;
}

/* Queue p[n]; it must stay untouched until the next wait or submit. */
static osp_status stw_io_submit(stw_io *io, const char *path, const void *p, size_t n) {
    OSP_TRY(stw_io_wait(io, path));
    if (n == 0) return OSP_OK;
    pthread_mutex_lock(&io->mu);
    io->p = p;
    io->n = n;
    pthread_cond_broadcast(&io->cv);
    pthread_mutex_unlock(&io->mu);
    return OSP_OK;
}

static osp_status stw_header_put(osp_st_writer *w, FILE *f, const char *path) {
    char *hdr = stw_header(w);
    if (!hdr) return osp_err(OSP_ERR_NOMEM, "%s: cannot build the safetensors header", path);
    size_t hlen = strlen(hdr), padded = (hlen + 7) & ~(size_t)7;
    unsigned char len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)padded >> (8 * i));
    static const char spaces[8] = "        ";
    osp_status st = stw_put(f, path, len8, 8);
    if (st == OSP_OK) st = stw_put(f, path, hdr, hlen);
    if (st == OSP_OK) st = stw_put(f, path, spaces, padded - hlen);
    free(hdr); /* jansson's allocator */
    return st;
}

/* Tensor data in declaration order; streamed tensors in chunks of whole
 * dim-0 slices, at most chunk_bytes unless one slice is larger. */
static osp_status stw_data(osp_st_writer *w, stw_io *io, const char *path, osp_st_fill_fn fill,
                           void *ctx, unsigned char *bufs[2]) {
    osp_status st = OSP_OK;
    int cur = 0;
    for (int64_t i = 0; i < w->n && st == OSP_OK; i++) {
        const stw_tensor *t = &w->t[i];
        if (t->data || t->nbytes == 0) {
            st = stw_io_submit(io, path, t->data, t->nbytes);
            continue;
        }
        int64_t rows = t->ndim ? t->shape[0] : 1;
        size_t row_bytes = t->nbytes / (size_t)rows;
        int64_t per = (int64_t)(w->chunk_bytes / row_bytes);
        if (per < 1) per = 1;
        for (int64_t r = 0; r < rows && st == OSP_OK; r += per) {
            int64_t nr = rows - r < per ? rows - r : per;
            size_t nb = (size_t)nr * row_bytes;
            /* bufs[cur] was last queued two submits ago: written by now. */
            st = fill(ctx, i, r, nr, bufs[cur], nb);
            if (st == OSP_OK) st = stw_io_submit(io, path, bufs[cur], nb);
            cur ^= 1;
        }
    }
    osp_status st2 = stw_io_wait(io, path);
    return st != OSP_OK ? st : st2;
}

static osp_status stw_body(osp_st_writer *w, FILE *f, const char *path, osp_st_fill_fn fill,
                           void *ctx) {
    size_t buf_bytes = 0; /* the largest chunk of any streamed tensor */
    for (int64_t i = 0; i < w->n; i++) {
        const stw_tensor *t = &w->t[i];
        if (t->data || t->nbytes == 0) continue;
        if (!fill)
            return osp_err(OSP_ERR_INVALID, "%s: tensor %s has no data and no fill callback",
                           path, t->name);
        int64_t rows = t->ndim ? t->shape[0] : 1;
        size_t row_bytes = t->nbytes / (size_t)rows;
        size_t per = w->chunk_bytes / row_bytes ? w->chunk_bytes / row_bytes : 1;
        size_t c = (size_t)((int64_t)per < rows ? (int64_t)per : rows) * row_bytes;
        if (c > buf_bytes) buf_bytes = c;
    }
    OSP_TRY(stw_header_put(w, f, path));
    unsigned char *bufs[2] = {NULL, NULL};
    if (buf_bytes) {
        bufs[0] = osp_malloc(OSP_POOL_SCRATCH, buf_bytes);
        bufs[1] = osp_malloc(OSP_POOL_SCRATCH, buf_bytes);
        if (!bufs[0] || !bufs[1]) {
            osp_free(bufs[0]);
            osp_free(bufs[1]);
            return osp_err(OSP_ERR_NOMEM, "%s: cannot allocate 2 write buffers of %zu bytes",
                           path, buf_bytes);
        }
    }
    stw_io io = {.f = f, .mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
    osp_status st;
    if (pthread_create(&io.tid, NULL, stw_io_main, &io) != 0) {
        st = osp_err(OSP_ERR_INTERNAL, "%s: cannot start the writer thread", path);
    } else {
        st = stw_data(w, &io, path, fill, ctx, bufs);
        pthread_mutex_lock(&io.mu);
        io.quit = 1;
        pthread_cond_broadcast(&io.cv);
        pthread_mutex_unlock(&io.mu);
        pthread_join(io.tid, NULL);
    }
    osp_free(bufs[0]);
    osp_free(bufs[1]);
    return st;
}

osp_status osp_st_writer_write(osp_st_writer *w, const char *path, osp_st_fill_fn fill,
                               void *ctx) {
    if (!w || !path) return osp_err(OSP_ERR_INVALID, "safetensors writer: NULL argument");
    FILE *f = fopen(path, "wb");
    if (!f) return osp_err(OSP_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    osp_status st = stw_body(w, f, path, fill, ctx);
    if (fclose(f) != 0 && st == OSP_OK)
        st = osp_err(OSP_ERR_IO, "%s: write failed: %s", path, strerror(errno));
    if (st != OSP_OK) remove(path);
    return st;
}
