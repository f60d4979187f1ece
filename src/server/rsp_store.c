/* server/rsp_store: stored Responses (responses.h), so that GET
 * /v1/responses/{id} and previous_response_id find them.
 *
 * An entry is the response object and the conversation it ends, kept as
 * compact JSON text (its size is what the bound counts), in a list ordered
 * by use: a hit moves it to the front, a put past the bound drops entries
 * from the back. An entry older than the TTL is dropped when met. Lookups
 * walk the list: the bound keeps it to thousands of entries, and a lookup
 * costs far less than the generation it precedes.
 *
 * With a folder, each entry is also a file <id>.json there ({"response",
 * "conversation"}, written to a temporary name and renamed), removed when
 * the entry goes; opening reads the folder back (newest first, so the bound
 * keeps the newest), which is how previous_response_id survives a restart.
 * Ids are checked to be [A-Za-z0-9_-] before they name a file. */
#define _GNU_SOURCE
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include "server/responses.h"

typedef struct entry {
    struct entry *prev, *next;
    char id[96];
    char *text; /* {"response":...,"conversation":...} */
    size_t size;
    double born;
} entry;

struct srv_rsp_store {
    pthread_mutex_t mu;
    entry *head, *tail; /* most recently used first */
    size_t bytes, limit;
    double ttl;
    char dir[4096];
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int id_ok(const char *id) {
    size_t n = strlen(id);
    if (!n || n >= sizeof((entry *)0)->id) return 0;
    for (const char *p = id; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '_' || *p == '-'))
            return 0;
    return 1;
}

static void path_of(const srv_rsp_store *st, const char *id, char *out, size_t cap, const char *ext) {
    snprintf(out, cap, "%s/%s%s", st->dir, id, ext);
}

static void unlink_list(srv_rsp_store *st, entry *e) {
    if (e->prev) e->prev->next = e->next;
    else st->head = e->next;
    if (e->next) e->next->prev = e->prev;
    else st->tail = e->prev;
    e->prev = e->next = NULL;
}

static void push_front(srv_rsp_store *st, entry *e) {
    e->next = st->head;
    e->prev = NULL;
    if (st->head) st->head->prev = e;
    st->head = e;
    if (!st->tail) st->tail = e;
}

static void drop(srv_rsp_store *st, entry *e, int remove_file) {
    unlink_list(st, e);
    st->bytes -= e->size;
    if (remove_file && st->dir[0]) {
        char p[4300];
        path_of(st, e->id, p, sizeof p, ".json");
        unlink(p);
    }
    free(e->text);
    free(e);
}

static entry *find(srv_rsp_store *st, const char *id) {
    for (entry *e = st->head; e; e = e->next)
        if (!strcmp(e->id, id)) return e;
    return NULL;
}

static int write_file(srv_rsp_store *st, const entry *e) {
    char tmp[4300], p[4300];
    path_of(st, e->id, tmp, sizeof tmp, ".json.tmp");
    path_of(st, e->id, p, sizeof p, ".json");
    FILE *f = fopen(tmp, "wb");
    if (!f) return -1;
    int bad = fwrite(e->text, 1, e->size, f) != e->size;
    bad |= fclose(f) != 0;
    if (bad || rename(tmp, p)) {
        unlink(tmp);
        return -1;
    }
    return 0;
}

/* Insert text (taken) under id; past the bound, the least recently used go. */
static int insert(srv_rsp_store *st, const char *id, char *text, double born, int to_disk) {
    size_t n = strlen(text);
    if (n > st->limit) {
        free(text);
        return -1;
    }
    entry *old = find(st, id), *e = calloc(1, sizeof *e);
    if (old) drop(st, old, 0);
    if (!e) {
        free(text);
        return -1;
    }
    snprintf(e->id, sizeof e->id, "%s", id);
    e->text = text, e->size = n, e->born = born;
    while (st->tail && st->bytes + n > st->limit) drop(st, st->tail, 1);
    push_front(st, e);
    st->bytes += n;
    if (to_disk && st->dir[0] && write_file(st, e)) OSP_LOG(1, "osprey serve: cannot write %s/%s.json", st->dir, id);
    return 0;
}

typedef struct found {
    char name[96];
    double mtime;
} found;

static int by_age(const void *a, const void *b) { /* oldest first: each insert puts the newer in front */
    double x = ((const found *)a)->mtime, y = ((const found *)b)->mtime;
    return x < y ? -1 : x > y;
}

/* The folder's entries back in memory; expired and unreadable ones removed. */
static void load_dir(srv_rsp_store *st) {
    DIR *d = opendir(st->dir);
    if (!d) return;
    found *f = NULL;
    size_t n = 0, cap = 0;
    struct dirent *de;
    double now = now_s();
    while ((de = readdir(d))) {
        size_t l = strlen(de->d_name);
        char p[4300];
        struct stat sb;
        if (l < 6 || l - 5 >= sizeof f->name || strcmp(de->d_name + l - 5, ".json")) continue;
        path_of(st, de->d_name, p, sizeof p, "");
        if (stat(p, &sb)) continue;
        if (now - (double)sb.st_mtime > st->ttl) {
            unlink(p);
            continue;
        }
        if (n == cap) {
            found *g = realloc(f, (cap = cap ? cap * 2 : 64) * sizeof *f);
            if (!g) break;
            f = g;
        }
        snprintf(f[n].name, sizeof f[n].name, "%.*s", (int)(l - 5), de->d_name);
        f[n++].mtime = (double)sb.st_mtime;
    }
    closedir(d);
    if (n) qsort(f, n, sizeof *f, by_age);
    for (size_t i = 0; i < n; i++) {
        char p[4300];
        path_of(st, f[i].name, p, sizeof p, ".json");
        json_t *o = id_ok(f[i].name) ? json_load_file(p, 0, NULL) : NULL;
        char *text = json_is_object(o) ? json_dumps(o, JSON_COMPACT) : NULL;
        json_decref(o);
        if (!text || insert(st, f[i].name, text, f[i].mtime, 0)) unlink(p);
    }
    free(f);
}

srv_rsp_store *srv_rsp_store_open(size_t bytes, double ttl_s, const char *dir) {
    srv_rsp_store *st = calloc(1, sizeof *st);
    if (!st) return NULL;
    pthread_mutex_init(&st->mu, NULL);
    st->limit = bytes;
    st->ttl = ttl_s;
    if (dir && *dir) {
        snprintf(st->dir, sizeof st->dir, "%s", dir);
        if (mkdir(st->dir, 0755) && access(st->dir, W_OK)) {
            OSP_LOG(1, "osprey serve: cannot create %s: stored responses stay in memory", st->dir);
            st->dir[0] = 0;
        }
    }
    if (st->dir[0]) load_dir(st);
    return st;
}

void srv_rsp_store_close(srv_rsp_store *st) {
    if (!st) return;
    while (st->head) drop(st, st->head, 0);
    pthread_mutex_destroy(&st->mu);
    free(st);
}

int srv_rsp_store_put(srv_rsp_store *st, const char *id, const json_t *response, const json_t *conversation) {
    if (!id_ok(id)) return -1;
    json_t *o = json_pack("{s:O,s:O}", "response", response, "conversation", conversation);
    char *text = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (!text) return -1;
    pthread_mutex_lock(&st->mu);
    int rc = insert(st, id, text, now_s(), 1);
    pthread_mutex_unlock(&st->mu);
    return rc;
}

int srv_rsp_store_get(srv_rsp_store *st, const char *id, json_t **response, json_t **conversation) {
    *response = *conversation = NULL;
    if (!id_ok(id)) return -1;
    pthread_mutex_lock(&st->mu);
    entry *e = find(st, id);
    if (e && now_s() - e->born > st->ttl) drop(st, e, 1), e = NULL;
    json_t *o = NULL;
    if (e) {
        unlink_list(st, e);
        push_front(st, e);
        o = json_loads(e->text, 0, NULL);
    }
    pthread_mutex_unlock(&st->mu);
    if (!o) return -1;
    *response = json_incref(json_object_get(o, "response"));
    *conversation = json_incref(json_object_get(o, "conversation"));
    json_decref(o);
    return 0;
}

int srv_rsp_store_delete(srv_rsp_store *st, const char *id) {
    if (!id_ok(id)) return -1;
    pthread_mutex_lock(&st->mu);
    entry *e = find(st, id);
    if (e) drop(st, e, 1);
    pthread_mutex_unlock(&st->mu);
    return e ? 0 : -1;
}

size_t srv_rsp_store_bytes(srv_rsp_store *st) {
    pthread_mutex_lock(&st->mu);
    size_t n = st->bytes;
    pthread_mutex_unlock(&st->mu);
    return n;
}
