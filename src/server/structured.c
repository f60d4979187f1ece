/* server/structured: compiled grammars shared by requests (structured output).
 *
 * A request's grammar (a response_format's schema, or a forced tool call's
 * arguments in the model family's syntax) is compiled on its connection
 * thread and kept in a small LRU keyed by what it was compiled from (the
 * schema's JSON text, or the pieces around it), so clients that send the
 * same schema again skip the compile. Entries are refcounted: a job holds
 * one reference from parsing to its end, and an entry leaves the cache (and
 * is freed) only when no job holds it; the list may run over its capacity
 * while every entry is in use. Matchers are made and used on the worker
 * thread only (the vocab's mask cache has one user).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "server/server_internal.h"

#define GCACHE_CAP 32

struct srv_grammar {
    osp_grammar *g;
    srv_gcache *owner;
    char *key;
    size_t key_len;
    uint64_t hash;
    int refs;                        /* jobs holding it (under owner->mu) */
    struct srv_grammar *prev, *next; /* most recently used first */
};

struct srv_gcache {
    pthread_mutex_t mu;
    srv_grammar *head, *tail;
    int n;
    atomic_llong hits, misses;
};

static uint64_t fnv1a(const char *p, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)p[i]) * 1099511628211ull;
    return h;
}

srv_gcache *srv_gcache_new(void) {
    srv_gcache *c = calloc(1, sizeof *c);
    if (c) pthread_mutex_init(&c->mu, NULL);
    return c;
}

static void entry_free(srv_grammar *e) {
    osp_grammar_free(e->g);
    free(e->key);
    free(e);
}

void srv_gcache_free(srv_gcache *c) {
    if (!c) return;
    for (srv_grammar *e = c->head, *n; e; e = n) n = e->next, entry_free(e);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

static void unlink_entry(srv_gcache *c, srv_grammar *e) {
    if (e->prev) e->prev->next = e->next;
    else c->head = e->next;
    if (e->next) e->next->prev = e->prev;
    else c->tail = e->prev;
    e->prev = e->next = NULL;
    c->n--;
}

static void push_front(srv_gcache *c, srv_grammar *e) {
    e->prev = NULL;
    e->next = c->head;
    if (c->head) c->head->prev = e;
    else c->tail = e;
    c->head = e;
    c->n++;
}

/* Under mu: the least recently used entries nobody holds leave while over capacity. */
static void trim(srv_gcache *c) {
    for (srv_grammar *e = c->tail, *p; e && c->n > GCACHE_CAP; e = p) {
        p = e->prev;
        if (e->refs) continue;
        unlink_entry(c, e);
        entry_free(e);
    }
}

static srv_grammar *lookup(srv_gcache *c, const char *key, size_t n, uint64_t h) {
    for (srv_grammar *e = c->head; e; e = e->next)
        if (e->hash == h && e->key_len == n && !memcmp(e->key, key, n)) return e;
    return NULL;
}

typedef struct gsrc {
    const char *schema; /* a JSON Schema's text (or a GBNF grammar's) ... */
    size_t len;
    const osp_grammar_part *alts; /* ... or pieces */
    int n;
    int gbnf;           /* schema is GBNF, after the literal prefix */
    const char *prefix;
} gsrc;

/* The cached grammar for key, compiled from src on a miss (outside the
 * lock: a compile may take milliseconds). NULL with the compiler's message
 * in err. */
static srv_grammar *get(srv_gcache *c, char *key, size_t kn, const gsrc *src, char *err, size_t cap) {
    uint64_t h = fnv1a(key, kn);
    pthread_mutex_lock(&c->mu);
    srv_grammar *e = lookup(c, key, kn, h);
    if (e) {
        e->refs++;
        unlink_entry(c, e);
        push_front(c, e);
        pthread_mutex_unlock(&c->mu);
        atomic_fetch_add(&c->hits, 1);
        free(key);
        return e;
    }
    pthread_mutex_unlock(&c->mu);
    atomic_fetch_add(&c->misses, 1);
    osp_grammar *g = NULL;
    osp_status st = src->alts ? osp_grammar_from_parts(src->alts, src->n, &g)
                    : src->gbnf ? osp_grammar_from_gbnf(src->schema, src->len, src->prefix, &g)
                                : osp_grammar_from_json_schema(src->schema, src->len, &g);
    if (st != OSP_OK) {
        snprintf(err, cap, "%s", osp_last_error());
        free(key);
        return NULL;
    }
    e = calloc(1, sizeof *e);
    if (!e) {
        snprintf(err, cap, "out of memory");
        osp_grammar_free(g);
        free(key);
        return NULL;
    }
    e->g = g, e->owner = c, e->key = key, e->key_len = kn, e->hash = h, e->refs = 1;
    pthread_mutex_lock(&c->mu);
    srv_grammar *twin = lookup(c, key, kn, h); /* another request compiled it meanwhile */
    if (twin) {
        twin->refs++;
        pthread_mutex_unlock(&c->mu);
        entry_free(e);
        return twin;
    }
    push_front(c, e);
    trim(c);
    pthread_mutex_unlock(&c->mu);
    return e;
}

srv_grammar *srv_grammar_schema(srv_gcache *c, const char *schema, size_t len, char *err, size_t cap) {
    char *key = malloc(len + 2);
    if (!key) {
        snprintf(err, cap, "out of memory");
        return NULL;
    }
    key[0] = 'S';
    memcpy(key + 1, schema, len);
    gsrc src = {.schema = schema, .len = len};
    return get(c, key, len + 1, &src, err, cap);
}

/* a piece of the key: its length, then its bytes (so no two lists of pieces share a key) */
static void key_piece(srv_buf *k, const char *p, size_t n) {
    srv_buf_addf(k, "%zu:", p ? n : (size_t)-1);
    if (p) srv_buf_add(k, p, n);
}

srv_grammar *srv_grammar_parts(srv_gcache *c, const osp_grammar_part *alts, int n, char *err, size_t cap) {
    srv_buf k = {0};
    srv_buf_add(&k, "P", 1);
    for (int i = 0; i < n; i++) {
        key_piece(&k, alts[i].prefix, alts[i].prefix ? strlen(alts[i].prefix) : 0);
        key_piece(&k, alts[i].schema, alts[i].schema_len);
        key_piece(&k, alts[i].suffix, alts[i].suffix ? strlen(alts[i].suffix) : 0);
        srv_buf_addf(&k, "%d", alts[i].syntax);
        key_piece(&k, alts[i].grammar, alts[i].grammar_len);
    }
    if (!k.p) {
        snprintf(err, cap, "out of memory");
        return NULL;
    }
    gsrc src = {.alts = alts, .n = n};
    return get(c, k.p, k.len, &src, err, cap);
}

srv_grammar *srv_grammar_gbnf(srv_gcache *c, const char *text, size_t len, const char *prefix, char *err, size_t cap) {
    srv_buf k = {0};
    srv_buf_add(&k, "G", 1);
    key_piece(&k, prefix, prefix ? strlen(prefix) : 0);
    key_piece(&k, text, len);
    if (!k.p) {
        snprintf(err, cap, "out of memory");
        return NULL;
    }
    gsrc src = {.schema = text, .len = len, .gbnf = 1, .prefix = prefix};
    return get(c, k.p, k.len, &src, err, cap);
}

osp_grammar *srv_grammar_of(srv_grammar *g) { return g->g; }

void srv_grammar_release(srv_grammar *g) {
    if (!g) return;
    srv_gcache *c = g->owner;
    pthread_mutex_lock(&c->mu);
    g->refs--;
    trim(c);
    pthread_mutex_unlock(&c->mu);
}

void srv_gcache_counts(srv_gcache *c, long long *hits, long long *misses, int *entries) {
    *hits = atomic_load(&c->hits);
    *misses = atomic_load(&c->misses);
    pthread_mutex_lock(&c->mu);
    *entries = c->n;
    pthread_mutex_unlock(&c->mu);
}
