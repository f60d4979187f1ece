/* kv/prefix: the prefix cache (see prefix.h for what it keeps and why).
 *
 * Entries live in one array, each resident (kv != NULL), on disk (file
 * name set) or both; their recency is a tick. The scheduler thread does
 * every lookup, restore and insert; the writer thread only writes queued
 * entries and gives their memory back; `mu` guards the array, the queue
 * and the counters against it and the stats readers. */
#define _GNU_SOURCE
#include "kv/prefix.h"
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include "core/fs.h"
#include "core/hash.h"
#include "kv/prefix_file.h"

typedef struct pc_entry {
    int32_t *tokens;
    int32_t n;
    osp_kv *kv;          /* resident snapshot, or NULL */
    int64_t bytes;       /* kv's bytes while resident */
    int64_t file_bytes;  /* > 0: on disk as `name` */
    char name[OSP_PCF_NAME];
    uint64_t tick;
    int writing;         /* queued for / being written by the writer */
    int dead;            /* removed while being written: the writer frees it */
} pc_entry;

struct osp_prefix {
    osp_prefix_opts o;
    const osp_kv *like;
    char ns[65];
    char dir[3072];      /* root/kv/<ns>, when persisting */
    char root[2048];
    int persist;
    pthread_mutex_t mu;
    pthread_cond_t cv;   /* the writer's queue changed / went idle */
    pc_entry **e;
    int32_t n, cap;
    int64_t bytes;       /* resident, including entries being written */
    uint64_t tick;
    struct timespec dir_mtime;
    pthread_t writer;
    int writer_on, stop, busy;
    double stop_by;        /* stopping: entries not written by then are dropped (0: no bound) */
    osp_prefix_stats st;
};

static void entry_free(pc_entry *e) {
    if (!e) return;
    osp_kv_free(e->kv);
    free(e->tokens);
    free(e);
}

/* ---- the namespace ---- */

void osp_prefix_namespace(const char *identity, const osp_kv *like, const char *numerics, char out[65]) {
    char buf[256];
    osp_sha256 *h = osp_sha256_new();
    if (!h) {
        memset(out, '0', 64), out[64] = 0;
        return;
    }
    osp_sha256_add(h, "osprey prefix cache 1\n", 22);
    osp_sha256_add(h, identity, strlen(identity));
    for (int i = 0; i < like->n_layers; i++) {
        const osp_kv_layer *l = &like->layers[i];
        int k = snprintf(buf, sizeof buf, "\nlayer %d: sliding %d window %d ring %d heads %d dim %d donor %d bits %d group %d",
                         i, l->sliding, l->window, l->ring, l->n_kv_heads, l->head_dim, l->donor, l->bits, l->group);
        osp_sha256_add(h, buf, (size_t)k);
    }
    int k = snprintf(buf, sizeof buf, "\nspare %d\n", like->spare);
    osp_sha256_add(h, buf, (size_t)k);
    osp_sha256_add(h, numerics, strlen(numerics));
    unsigned char dg[32];
    osp_sha256_end(h, dg);
    osp_hex(dg, 32, out);
}

/* ---- the array (under mu) ---- */

/* A recency for an entry used now: above every file's mtime in seconds,
 * which is what entries found on disk start with. */
static uint64_t use_tick(osp_prefix *pc) { return ++pc->tick + ((uint64_t)1 << 40); }

static int add_entry(osp_prefix *pc, pc_entry *e) {
    if (pc->n == pc->cap) {
        int32_t nc = pc->cap ? 2 * pc->cap : 64;
        pc_entry **ne = realloc(pc->e, sizeof *ne * (size_t)nc);
        if (!ne) return -1;
        pc->e = ne, pc->cap = nc;
    }
    pc->e[pc->n++] = e;
    return 0;
}

static void drop_at(osp_prefix *pc, int32_t i) {
    pc_entry *e = pc->e[i];
    pc->e[i] = pc->e[--pc->n];
    if (e->kv) pc->bytes -= e->bytes;
    if (e->file_bytes) pc->st.disk_entries--, pc->st.disk_bytes -= e->file_bytes;
    if (e->writing) { /* the writer still reads it: it frees it when done */
        e->dead = 1;
        return;
    }
    if (e->kv) pc->st.entries--;
    entry_free(e);
}

static void path_of(const osp_prefix *pc, const pc_entry *e, char *out, size_t cap) {
    snprintf(out, cap, "%s/%s", pc->dir, e->name);
}

/* ---- the writer ---- */

static void *writer_main(void *arg) {
    osp_prefix *pc = arg;
    pthread_mutex_lock(&pc->mu);
    for (;;) {
        pc_entry *w = NULL; /* at shutdown the most recently used first, else any */
        for (int32_t i = 0; i < pc->n && (!w || pc->stop); i++)
            if (pc->e[i]->writing && pc->e[i]->kv && (!w || pc->e[i]->tick > w->tick)) w = pc->e[i];
        if (w && pc->stop && pc->stop_by > 0 && osp_now_s() > pc->stop_by) w = NULL; /* out of time */
        if (!w) { /* entries removed while queued are in no array: look for none */
            if (pc->stop) break;
            pc->busy = 0;
            pthread_cond_broadcast(&pc->cv);
            pthread_cond_wait(&pc->cv, &pc->mu);
            continue;
        }
        pc->busy = 1;
        char name[OSP_PCF_NAME];
        osp_pcf_name(w->tokens, w->n, name);
        pthread_mutex_unlock(&pc->mu);
        int64_t size = 0;
        osp_status rc = osp_pcf_write(pc->dir, pc->ns, w->tokens, w->n, w->kv, name, &size);
        if (rc != OSP_OK) OSP_LOG(1, "osprey: prefix cache: %s (the entry is dropped)", osp_last_error());
        int deleted = rc == OSP_OK ? osp_pcf_enforce(pc->root, pc->o.disk_bytes) : 0;
        pthread_mutex_lock(&pc->mu);
        w->writing = 0;
        if (!w->dead) {
            if (rc == OSP_OK) {
                memcpy(w->name, name, sizeof name);
                w->file_bytes = size;
                pc->st.disk_entries++, pc->st.disk_bytes += size, pc->st.disk_writes++;
            }
            pc->bytes -= w->bytes;
            pc->st.entries--;
            osp_kv_free(w->kv);
            w->kv = NULL;
            w->bytes = 0;
            if (rc != OSP_OK) /* neither in memory nor on disk */
                for (int32_t i = 0; i < pc->n; i++)
                    if (pc->e[i] == w) {
                        drop_at(pc, i);
                        break;
                    }
        } else {
            pc->st.entries--;
            entry_free(w);
        }
        pc->st.disk_deletes += deleted;
        pthread_mutex_unlock(&pc->mu);
        if (pc->o.on_freed) pc->o.on_freed(pc->o.user);
        pthread_mutex_lock(&pc->mu);
    }
    pc->busy = 0;
    pthread_cond_broadcast(&pc->cv);
    pthread_mutex_unlock(&pc->mu);
    return NULL;
}

/* ---- the folder's index ---- */

/* Bring the disk side of the array up to date with the folder (new files
 * of another server, files deleted by a disk budget). Under mu. */
static void rescan(osp_prefix *pc) {
    struct stat st;
    if (stat(pc->dir, &st) != 0) return;
    if (st.st_mtim.tv_sec == pc->dir_mtime.tv_sec && st.st_mtim.tv_nsec == pc->dir_mtime.tv_nsec) return;
    pc->dir_mtime = st.st_mtim;
    DIR *d = opendir(pc->dir);
    if (!d) return;
    for (int32_t i = 0; i < pc->n; i++) pc->e[i]->dead = pc->e[i]->file_bytes ? 2 : 0; /* 2: not seen yet */
    struct dirent *f;
    while ((f = readdir(d))) {
        size_t len = strlen(f->d_name);
        if (len >= OSP_PCF_NAME || len < 5 || strcmp(f->d_name + len - 4, ".kvc")) continue;
        int known = 0;
        for (int32_t i = 0; i < pc->n && !known; i++)
            if (pc->e[i]->file_bytes && !strcmp(pc->e[i]->name, f->d_name)) pc->e[i]->dead = 0, known = 1;
        if (known) continue;
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/%s", pc->dir, f->d_name);
        pc_entry *e = calloc(1, sizeof *e);
        if (!e) break;
        if (osp_pcf_read_head(path, pc->ns, &e->tokens, &e->n, &e->file_bytes) != OSP_OK) {
            OSP_LOG(1, "osprey: prefix cache: skipping %s", osp_last_error());
            pc->st.disk_rejects++;
            unlink(path);
            entry_free(e);
            continue;
        }
        snprintf(e->name, sizeof e->name, "%s", f->d_name);
        struct stat fs;
        e->tick = stat(path, &fs) == 0 ? (uint64_t)fs.st_mtim.tv_sec : 0; /* older than anything used here */
        if (add_entry(pc, e)) {
            entry_free(e);
            break;
        }
        pc->st.disk_entries++, pc->st.disk_bytes += e->file_bytes;
    }
    closedir(d);
    for (int32_t i = pc->n - 1; i >= 0; i--) {
        pc_entry *e = pc->e[i];
        if (e->dead != 2) continue;
        e->dead = 0; /* its file is gone */
        pc->st.disk_entries--, pc->st.disk_bytes -= e->file_bytes;
        e->file_bytes = 0;
        e->name[0] = 0;
        if (!e->kv) {
            pc->e[i] = pc->e[--pc->n];
            entry_free(e);
        }
    }
}

/* ---- life ---- */

osp_status osp_prefix_new(const osp_prefix_opts *o, const osp_kv *like, osp_prefix **out) {
    *out = NULL;
    if (o->mem_bytes <= 0) return osp_err(OSP_ERR_INVALID, "a prefix cache needs a memory bound > 0");
    if (!o->ns || strlen(o->ns) != 64) return osp_err(OSP_ERR_INVALID, "a prefix cache needs a 64-digit namespace");
    osp_prefix *pc = calloc(1, sizeof *pc);
    if (!pc) return osp_err(OSP_ERR_NOMEM, "out of memory");
    pc->o = *o;
    if (pc->o.min_reuse <= 0) pc->o.min_reuse = 16;
    pc->like = like;
    memcpy(pc->ns, o->ns, 65);
    pthread_mutex_init(&pc->mu, NULL);
    pthread_cond_init(&pc->cv, NULL);
    pc->persist = o->dir && *o->dir && o->disk_bytes > 0;
    if (pc->persist) {
        snprintf(pc->root, sizeof pc->root, "%s", o->dir);
        snprintf(pc->dir, sizeof pc->dir, "%s/kv/%s", o->dir, pc->ns);
        if (osp_mkdirs(pc->dir) != 0) {
            OSP_LOG(1, "osprey: prefix cache: cannot create %s (%s): entries stay in memory only", pc->dir,
                    strerror(errno));
            pc->persist = 0;
        }
    }
    if (pc->persist) {
        rescan(pc);
        if (pthread_create(&pc->writer, NULL, writer_main, pc) == 0) pc->writer_on = 1;
        else pc->persist = 0;
    }
    pc->o.dir = NULL; /* not owned */
    *out = pc;
    return OSP_OK;
}

void osp_prefix_sync(osp_prefix *pc) {
    pthread_mutex_lock(&pc->mu);
    for (;;) {
        int queued = 0;
        for (int32_t i = 0; i < pc->n && !queued; i++) queued = pc->e[i]->writing;
        if (!queued && !pc->busy) break;
        pthread_cond_broadcast(&pc->cv);
        pthread_cond_wait(&pc->cv, &pc->mu);
    }
    pthread_mutex_unlock(&pc->mu);
}

void osp_prefix_free(osp_prefix *pc) { osp_prefix_free_within(pc, 0); }

void osp_prefix_free_within(osp_prefix *pc, double seconds) {
    if (!pc) return;
    if (pc->writer_on) {
        pthread_mutex_lock(&pc->mu); /* every resident entry not on disk goes there */
        int n = 0;
        for (int32_t i = 0; i < pc->n; i++)
            if (pc->e[i]->kv && !pc->e[i]->file_bytes && !pc->e[i]->writing) pc->e[i]->writing = 1, n++;
        double t0 = osp_now_s();
        pc->stop = 1;
        pc->stop_by = seconds > 0 ? t0 + seconds : 0;
        pthread_cond_broadcast(&pc->cv);
        pthread_mutex_unlock(&pc->mu);
        pthread_join(pc->writer, NULL);
        int left = 0; /* queued and not written: out of time */
        for (int32_t i = 0; i < pc->n; i++) left += pc->e[i]->writing && pc->e[i]->kv;
        if (n) OSP_LOG(1, "osprey: prefix cache: wrote %d entries to %s in %.2f s%s", n > left ? n - left : 0, pc->dir, osp_now_s() - t0,
                       left ? " (the rest, the least recently used, did not fit the shutdown's time and were dropped)" : "");
    }
    for (int32_t i = 0; i < pc->n; i++) entry_free(pc->e[i]);
    free(pc->e);
    pthread_mutex_destroy(&pc->mu);
    pthread_cond_destroy(&pc->cv);
    free(pc);
}

/* ---- lookup ---- */

static int32_t common(const int32_t *a, int32_t na, const int32_t *b, int32_t nb) {
    int32_t n = na < nb ? na : nb, i = 0;
    while (i < n && a[i] == b[i]) i++;
    return i;
}

int32_t osp_prefix_restore(osp_prefix *pc, const int32_t *tokens, int32_t n, osp_kv *kv, int32_t row) {
    double t0 = osp_now_s();
    osp_kv_reset_row(kv, row);
    pthread_mutex_lock(&pc->mu);
    pc->st.lookups++;
    if (pc->persist) rescan(pc);
    int32_t limit = n - 1 < kv->max_ctx ? n - 1 : kv->max_ctx, got = 0;
    for (int attempt = 0; attempt < 4; attempt++) { /* a broken file: try the next best */
        pc_entry *best = NULL;
        int32_t best_u = 0;
        for (int32_t i = 0; i < pc->n; i++) {
            pc_entry *e = pc->e[i];
            if (!e->kv && !e->file_bytes) continue;
            int32_t u = common(tokens, limit, e->tokens, e->n);
            if (pc->o.align > 1) u -= u % pc->o.align;
            if (u < pc->o.min_reuse || !osp_kv_resumable(pc->like, e->n, u)) continue;
            if (u > best_u || (u == best_u && best && ((e->kv && !best->kv) || (!e->kv == !best->kv && e->tick > best->tick))))
                best = e, best_u = u;
        }
        if (!best) break;
        if (!best->kv) { /* load it from disk (checked against its checksum) */
            char path[PATH_MAX];
            path_of(pc, best, path, sizeof path);
            osp_kv *loaded = NULL;
            osp_status rc = osp_pcf_load(path, pc->ns, best->tokens, best->n, pc->like, &loaded);
            if (rc != OSP_OK) {
                OSP_LOG(1, "osprey: prefix cache: skipping %s", osp_last_error());
                if (rc == OSP_ERR_FORMAT) pc->st.disk_rejects++, unlink(path);
                for (int32_t i = 0; i < pc->n; i++)
                    if (pc->e[i] == best) {
                        drop_at(pc, i);
                        break;
                    }
                continue;
            }
            utimensat(AT_FDCWD, path, NULL, 0); /* the disk budget's LRU */
            best->kv = loaded;
            best->bytes = (int64_t)osp_kv_bytes(loaded);
            pc->bytes += best->bytes;
            pc->st.entries++;
            pc->st.disk_loads++;
        }
        if (osp_kv_load_row(kv, row, best->kv, 0, best_u) != OSP_OK) {
            OSP_LOG(1, "osprey: prefix cache: %s", osp_last_error());
            break;
        }
        best->tick = use_tick(pc);
        got = best_u;
        break;
    }
    if (got) pc->st.hits++, pc->st.tokens_reused += got;
    else pc->st.misses++;
    pc->st.lookup_s += osp_now_s() - t0;
    pthread_mutex_unlock(&pc->mu);
    return got;
}

/* ---- insert and eviction ---- */

static void shrink_locked(osp_prefix *pc, int64_t limit) {
    while (pc->bytes > limit) {
        pc_entry *lru = NULL;
        int32_t at = -1;
        for (int32_t i = 0; i < pc->n; i++) {
            pc_entry *e = pc->e[i];
            if (e->kv && !e->writing && (!lru || e->tick < lru->tick)) lru = e, at = i;
        }
        if (!lru) break; /* only entries being written: their bytes go when they are */
        pc->st.evictions++;
        if (pc->persist && !lru->file_bytes) {
            lru->writing = 1;
            pthread_cond_broadcast(&pc->cv);
            /* counted until written; go on only if what is left can still get under the limit */
            int64_t pending = 0;
            for (int32_t i = 0; i < pc->n; i++)
                if (pc->e[i]->writing && pc->e[i]->kv) pending += pc->e[i]->bytes;
            if (pc->bytes - pending <= limit) break;
            continue;
        }
        if (lru->file_bytes) { /* on disk already: only memory goes */
            pc->bytes -= lru->bytes;
            pc->st.entries--;
            osp_kv_free(lru->kv);
            lru->kv = NULL;
            lru->bytes = 0;
        } else {
            drop_at(pc, at);
        }
    }
}

void osp_prefix_shrink(osp_prefix *pc, int64_t limit) {
    pthread_mutex_lock(&pc->mu);
    shrink_locked(pc, limit < 0 ? 0 : limit);
    pthread_mutex_unlock(&pc->mu);
}

int64_t osp_prefix_bytes(osp_prefix *pc) {
    pthread_mutex_lock(&pc->mu);
    int64_t b = pc->bytes;
    pthread_mutex_unlock(&pc->mu);
    return b;
}

osp_status osp_prefix_insert(osp_prefix *pc, const int32_t *tokens, int32_t n, const osp_kv *kv, int32_t row) {
    if (n < pc->o.min_reuse) return OSP_OK;
    double t0 = osp_now_s();
    if (kv->pos[row] != n) return osp_err(OSP_ERR_INVALID, "prefix cache: row %d holds %d positions, not %d", row,
                                          kv->pos[row], n);
    pthread_mutex_lock(&pc->mu);
    for (int32_t i = 0; i < pc->n; i++) { /* one already covering it: used again, nothing new */
        pc_entry *e = pc->e[i];
        if (e->n >= n && common(tokens, n, e->tokens, e->n) == n && osp_kv_resumable(pc->like, e->n, n)) {
            e->tick = use_tick(pc);
            pc->st.insert_s += osp_now_s() - t0;
            pthread_mutex_unlock(&pc->mu);
            return OSP_OK;
        }
    }
    pthread_mutex_unlock(&pc->mu);
    pc_entry *ne = calloc(1, sizeof *ne);
    osp_status rc = OSP_OK;
    if (!ne || !(ne->tokens = malloc(sizeof(int32_t) * (size_t)n))) rc = osp_err(OSP_ERR_NOMEM, "out of memory");
    if (rc == OSP_OK) rc = osp_kv_snapshot(kv, row, &ne->kv);
    if (rc != OSP_OK) {
        entry_free(ne);
        return rc;
    }
    memcpy(ne->tokens, tokens, sizeof(int32_t) * (size_t)n);
    ne->n = n;
    ne->bytes = (int64_t)osp_kv_bytes(ne->kv);
    pthread_mutex_lock(&pc->mu);
    for (int32_t i = pc->n - 1; i >= 0; i--) { /* the ones it covers go (files too: it replaces them) */
        pc_entry *e = pc->e[i];
        if (e->n <= n && common(tokens, n, e->tokens, e->n) == e->n && osp_kv_resumable(pc->like, n, e->n)) {
            if (e->file_bytes) {
                char path[PATH_MAX];
                path_of(pc, e, path, sizeof path);
                unlink(path);
            }
            drop_at(pc, i);
        }
    }
    ne->tick = use_tick(pc);
    if (add_entry(pc, ne)) {
        pthread_mutex_unlock(&pc->mu);
        entry_free(ne);
        return osp_err(OSP_ERR_NOMEM, "out of memory");
    }
    pc->bytes += ne->bytes;
    pc->st.entries++, pc->st.inserts++;
    shrink_locked(pc, pc->o.mem_bytes);
    pc->st.insert_s += osp_now_s() - t0;
    pthread_mutex_unlock(&pc->mu);
    return OSP_OK;
}

void osp_prefix_get_stats(osp_prefix *pc, osp_prefix_stats *st) {
    pthread_mutex_lock(&pc->mu);
    *st = pc->st;
    st->bytes = pc->bytes;
    pthread_mutex_unlock(&pc->mu);
}
