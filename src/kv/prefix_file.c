#define _GNU_SOURCE
#include "kv/prefix_file.h"
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "core/hash.h"

static const unsigned char MAGIC[8] = {'O', 'S', 'P', 'K', 'V', 'C', 0, 1};
#define HEAD_BYTES (8 + 64 + 4 + 4 + 8)

static int64_t layer_block(const osp_kv_layer *l, int32_t cap) { return 2 * (int64_t)l->n_kv_heads * cap * l->slot_bytes; }

void osp_pcf_name(const int32_t *tokens, int32_t n, char out[OSP_PCF_NAME]) {
    unsigned char dg[32];
    char hex[65];
    osp_sha256 *h = osp_sha256_new();
    if (!h) { /* still a deterministic name: FNV-1a */
        uint64_t x = 1469598103934665603ull;
        for (int32_t i = 0; i < n; i++) x = (x ^ (uint32_t)tokens[i]) * 1099511628211ull;
        snprintf(out, OSP_PCF_NAME, "%016llx.kvc", (unsigned long long)x);
        return;
    }
    osp_sha256_add(h, tokens, sizeof(int32_t) * (size_t)n);
    osp_sha256_end(h, dg);
    osp_hex(dg, 32, hex);
    snprintf(out, OSP_PCF_NAME, "%.40s.kvc", hex);
}

static int write_all(int fd, const void *p, size_t n, osp_sha256 *h) {
    const unsigned char *c = p;
    if (h) osp_sha256_add(h, p, n);
    while (n) {
        ssize_t w = write(fd, c, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        c += w, n -= (size_t)w;
    }
    return 0;
}

static int read_all(int fd, void *p, size_t n, osp_sha256 *h) {
    unsigned char *c = p;
    size_t want = n;
    while (n) {
        ssize_t r = read(fd, c, n);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        c += r, n -= (size_t)r;
    }
    if (h) osp_sha256_add(h, p, want);
    return 0;
}

static int64_t file_size(const osp_kv *kv, int32_t n) {
    int64_t t = HEAD_BYTES + 4 * (int64_t)n + 32;
    for (int i = 0; i < kv->n_layers; i++) {
        const osp_kv_layer *l = &kv->layers[i];
        if (l->mem && l->mem[0]) t += 16 + layer_block(l, l->cap[0]);
    }
    return t;
}

osp_status osp_pcf_write(const char *dir, const char *ns, const int32_t *tokens, int32_t n, const osp_kv *kv,
                         const char *name, int64_t *size) {
    static atomic_uint serial;
    char path[PATH_MAX], tmp[PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    snprintf(tmp, sizeof tmp, "%s.%ld.%u.tmp", path, (long)getpid(), atomic_fetch_add(&serial, 1));
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) return osp_err(OSP_ERR_IO, "%s: %s", tmp, strerror(errno));
    osp_sha256 *h = osp_sha256_new();
    unsigned char *buf = NULL;
    osp_status rc = OSP_OK;
    if (!h) {
        rc = osp_err(OSP_ERR_NOMEM, "out of memory");
        goto done;
    }
    unsigned char head[HEAD_BYTES];
    uint32_t nt = (uint32_t)n, nl = (uint32_t)kv->n_layers;
    uint64_t total = (uint64_t)file_size(kv, n);
    memcpy(head, MAGIC, 8);
    memcpy(head + 8, ns, 64);
    memcpy(head + 72, &nt, 4);
    memcpy(head + 76, &nl, 4);
    memcpy(head + 80, &total, 8);
    if (write_all(fd, head, sizeof head, h) || write_all(fd, tokens, sizeof(int32_t) * (size_t)n, h)) goto io;
    for (int i = 0; i < kv->n_layers; i++) {
        const osp_kv_layer *l = &kv->layers[i];
        if (!l->mem || !l->mem[0]) continue;
        uint32_t li = (uint32_t)i, cap = (uint32_t)l->cap[0];
        uint64_t bytes = (uint64_t)layer_block(l, l->cap[0]);
        unsigned char *nb = realloc(buf, bytes ? bytes : 1);
        if (!nb) {
            rc = osp_err(OSP_ERR_NOMEM, "out of memory writing a prefix cache entry");
            goto done;
        }
        buf = nb;
        kv->mem->to_host(buf, l->mem[0], bytes);
        if (write_all(fd, &li, 4, h) || write_all(fd, &cap, 4, h) || write_all(fd, &bytes, 8, h) ||
            write_all(fd, buf, bytes, h))
            goto io;
    }
    unsigned char dg[32];
    osp_sha256_end(h, dg);
    h = NULL;
    if (write_all(fd, dg, 32, NULL)) goto io;
    if (close(fd) != 0) {
        fd = -1;
        goto io;
    }
    fd = -1;
    if (rename(tmp, path) != 0) goto io;
    if (size) *size = (int64_t)total;
    goto done;
io:
    rc = osp_err(OSP_ERR_IO, "writing %s: %s", path, strerror(errno ? errno : EIO));
done:
    if (h) osp_sha256_end(h, (unsigned char[32]){0});
    if (fd >= 0) close(fd);
    if (rc != OSP_OK) unlink(tmp);
    free(buf);
    return rc;
}

/* Opens and checks the header; fd on success. */
static osp_status open_head(const char *path, const char *ns, int *fd_out, int32_t *n, uint32_t *nl, int64_t *size,
                            osp_sha256 *h) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return osp_err(OSP_ERR_IO, "%s: %s", path, strerror(errno));
    struct stat st;
    unsigned char head[HEAD_BYTES];
    if (fstat(fd, &st) != 0 || read_all(fd, head, sizeof head, h)) {
        close(fd);
        return osp_err(OSP_ERR_FORMAT, "%s: truncated header", path);
    }
    uint32_t nt;
    uint64_t total;
    memcpy(&nt, head + 72, 4);
    memcpy(nl, head + 76, 4);
    memcpy(&total, head + 80, 8);
    const char *why = memcmp(head, MAGIC, 8) ? "not a prefix cache file of this version"
                      : memcmp(head + 8, ns, 64) ? "written for another model, KV layout or engine"
                      : nt == 0 || nt > (1u << 24) ? "an impossible token count"
                      : total != (uint64_t)st.st_size ? "truncated (its size is not the one its header records)"
                                                      : NULL;
    if (why) {
        close(fd);
        return osp_err(OSP_ERR_FORMAT, "%s: %s", path, why);
    }
    *fd_out = fd;
    *n = (int32_t)nt;
    *size = (int64_t)total;
    return OSP_OK;
}

osp_status osp_pcf_read_head(const char *path, const char *ns, int32_t **tokens, int32_t *n, int64_t *size) {
    int fd;
    uint32_t nl;
    *tokens = NULL;
    OSP_TRY(open_head(path, ns, &fd, n, &nl, size, NULL));
    int32_t *t = malloc(sizeof(int32_t) * (size_t)*n);
    if (!t) {
        close(fd);
        return osp_err(OSP_ERR_NOMEM, "out of memory");
    }
    if (read_all(fd, t, sizeof(int32_t) * (size_t)*n, NULL)) {
        free(t);
        close(fd);
        return osp_err(OSP_ERR_FORMAT, "%s: truncated", path);
    }
    close(fd);
    *tokens = t;
    return OSP_OK;
}

osp_status osp_pcf_load(const char *path, const char *ns, const int32_t *tokens, int32_t n, const osp_kv *like,
                        osp_kv **out) {
    *out = NULL;
    osp_sha256 *h = osp_sha256_new();
    if (!h) return osp_err(OSP_ERR_NOMEM, "out of memory");
    int fd = -1;
    int32_t fn;
    uint32_t nl;
    int64_t size;
    osp_kv *kv = NULL;
    unsigned char *buf = NULL;
    osp_status rc = open_head(path, ns, &fd, &fn, &nl, &size, h);
    if (rc != OSP_OK) {
        osp_sha256_end(h, (unsigned char[32]){0});
        return rc;
    }
    const char *why = NULL;
    int32_t *ft = malloc(sizeof(int32_t) * (size_t)fn);
    if (!ft) {
        rc = osp_err(OSP_ERR_NOMEM, "out of memory");
        goto done;
    }
    if (fn != n || (int64_t)nl != like->n_layers || read_all(fd, ft, sizeof(int32_t) * (size_t)n, h) ||
        memcmp(ft, tokens, sizeof(int32_t) * (size_t)n)) {
        why = "its tokens or layers are not the ones indexed";
        goto bad;
    }
    if ((rc = osp_kv_new(1, like->n_layers, like->specs, like->max_ctx, like->spare, like->mem, &kv)) != OSP_OK) goto done;
    for (int i = 0; i < kv->n_layers; i++) {
        osp_kv_layer *l = &kv->layers[i];
        if (!l->mem) continue;
        uint32_t li, cap;
        uint64_t bytes;
        if (read_all(fd, &li, 4, h) || read_all(fd, &cap, 4, h) || read_all(fd, &bytes, 8, h)) {
            why = "truncated";
            goto bad;
        }
        /* full layers: the slots a snapshot of n positions has (n rounded up
         * to the growth step, or the context it was made with) */
        if (li != (uint32_t)i || (l->sliding ? (int64_t)cap != l->ring : cap < (uint32_t)n || cap >= (uint32_t)n + OSP_KV_STEP) ||
            (int64_t)bytes != layer_block(l, (int32_t)cap) || (int64_t)bytes > size) {
            why = "a layer's size is not what the KV layout makes it";
            goto bad;
        }
        unsigned char *nb = realloc(buf, bytes ? bytes : 1);
        if (!nb) {
            rc = osp_err(OSP_ERR_NOMEM, "out of memory loading a prefix cache entry");
            goto done;
        }
        buf = nb;
        if (read_all(fd, buf, bytes, h)) {
            why = "truncated";
            goto bad;
        }
        l->mem[0] = kv->mem->alloc(bytes);
        if (!l->mem[0]) {
            rc = osp_err(OSP_ERR_NOMEM, "out of memory loading a prefix cache entry");
            goto done;
        }
        kv->mem->from_host(l->mem[0], buf, bytes);
        l->cap[0] = (int32_t)cap;
        kv->bytes += (int64_t)bytes;
    }
    unsigned char want[32], got[32];
    osp_sha256_end(h, want);
    h = NULL;
    if (read_all(fd, got, 32, NULL) || memcmp(want, got, 32)) {
        why = "its checksum does not match its contents";
        goto bad;
    }
    kv->pos[0] = n;
    *out = kv;
    kv = NULL;
    goto done;
bad:
    rc = osp_err(OSP_ERR_FORMAT, "%s: %s", path, why);
done:
    if (h) osp_sha256_end(h, (unsigned char[32]){0});
    if (fd >= 0) close(fd);
    free(ft);
    free(buf);
    osp_kv_free(kv);
    return rc;
}

typedef struct pcf_item {
    char path[PATH_MAX];
    int64_t size;
    struct timespec mtime;
} pcf_item;

static int older(const void *a, const void *b) {
    const pcf_item *x = a, *y = b;
    if (x->mtime.tv_sec != y->mtime.tv_sec) return x->mtime.tv_sec < y->mtime.tv_sec ? -1 : 1;
    if (x->mtime.tv_nsec != y->mtime.tv_nsec) return x->mtime.tv_nsec < y->mtime.tv_nsec ? -1 : 1;
    return strcmp(x->path, y->path);
}

int osp_pcf_enforce(const char *root, int64_t budget) {
    char kvdir[3072];
    snprintf(kvdir, sizeof kvdir, "%.3000s/kv", root);
    DIR *d = opendir(kvdir);
    if (!d) return 0;
    pcf_item *items = NULL;
    size_t n = 0, cap = 0;
    int64_t total = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char sub[3584];
        snprintf(sub, sizeof sub, "%s/%s", kvdir, e->d_name);
        DIR *s = opendir(sub);
        if (!s) continue;
        struct dirent *f;
        while ((f = readdir(s))) {
            size_t len = strlen(f->d_name);
            if (len < 5 || strcmp(f->d_name + len - 4, ".kvc")) continue;
            if (n == cap) {
                pcf_item *ni = realloc(items, sizeof *items * (cap = cap ? 2 * cap : 64));
                if (!ni) break;
                items = ni;
            }
            pcf_item *it = &items[n];
            snprintf(it->path, sizeof it->path, "%s/%s", sub, f->d_name);
            struct stat st;
            if (stat(it->path, &st) != 0) continue;
            it->size = st.st_size;
            it->mtime = st.st_mtim;
            total += st.st_size;
            n++;
        }
        closedir(s);
    }
    closedir(d);
    int deleted = 0;
    if (total > budget) {
        qsort(items, n, sizeof *items, older);
        for (size_t i = 0; i < n && total > budget; i++)
            if (unlink(items[i].path) == 0 || errno == ENOENT) total -= items[i].size, deleted++;
    }
    free(items);
    return deleted;
}
