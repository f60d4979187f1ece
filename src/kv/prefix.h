/* kv/prefix: the prefix cache. KV rows of earlier prompts (and of their
 * replies), kept by their token ids, so that a new prompt that starts with
 * one of them prefills only the rest.
 *
 * An entry is a one-row snapshot (osp_kv_snapshot) of a row that held
 * exactly its tokens. A lookup finds the entry sharing the longest prefix
 * with the prompt (at most the prompt's length - 1: the last token is
 * always computed, for its logits), and copies positions [0, u) of it into
 * the request's row (osp_kv_load_row). Full-attention layers can resume at
 * any u <= the entry's length; a sliding layer's ring only holds the last
 * window + spare positions, so an entry of a model with sliding layers is
 * usable only where its rings still hold what position u needs
 * (osp_kv_resumable: u within the spare slots of the entry's end). Layers
 * sharing another's KV have nothing of their own; per-layer inputs (Gemma
 * 4 E) depend on the token alone and are computed again.
 *
 * Memory: an LRU bounded in bytes (the snapshots' blocks, in the backend's
 * memory). An entry that dominates another (its tokens extend the other's,
 * and it can resume there) replaces it.
 *
 * Persistence (a folder, optional): an entry leaves memory by being written
 * to DIR/kv/<namespace>/<hash of its tokens>.kvc (by a writer thread;
 * atomically: a temporary file renamed), and every resident one is written
 * at a clean shutdown. The namespace is the SHA-256 of the model's
 * artifact identity, the KV layout and the engine's numerics, so a file is
 * only ever found by a server computing the same numbers. At start the
 * folder's entries are indexed (their headers: tokens); a hit loads the
 * file and checks its SHA-256 trailer first. A truncated, corrupt or
 * foreign file is skipped (logged once) and removed. A disk budget deletes
 * the least recently used files of the whole folder (mtime = last use).
 * Several servers may share a folder: each writes whole files under new
 * names, and a file that disappears under a reader is a miss.
 *
 * Thread-safety: one thread (the scheduler) looks up, restores and
 * inserts; the writer thread and the stats readers take the cache's lock.
 */
#ifndef OSP_PREFIX_H
#define OSP_PREFIX_H

#include <stdint.h>
#include "kv/kv.h"

typedef struct osp_prefix osp_prefix;

typedef struct osp_prefix_opts {
    int64_t mem_bytes;        /* the in-memory LRU's bound (> 0) */
    const char *dir;          /* persistence folder, or NULL */
    int64_t disk_bytes;       /* the folder's bound (0 = no persistence) */
    const char *ns;           /* namespace: 64 hex digits (osp_prefix_namespace) */
    int32_t min_reuse;        /* shortest prefix worth reusing (0 = 16) */
    int32_t align;            /* reused lengths are multiples of this (0 or 1 = any): the prefill chunk
                                 size, where rows depend on how they were chunked (see the server) */
    void (*on_freed)(void *user); /* called (writer thread) after memory was given back */
    void *user;
} osp_prefix_opts;

typedef struct osp_prefix_stats {
    int64_t lookups, hits, misses, tokens_reused;
    int64_t entries, bytes;             /* resident (including those being written) */
    int64_t disk_entries, disk_bytes;   /* this namespace's files known here */
    int64_t inserts, evictions, disk_writes, disk_loads, disk_rejects, disk_deletes;
    double lookup_s, insert_s;          /* time in restore (lookups, disk loads, copies) and insert (snapshots) */
} osp_prefix_stats;

/* The namespace of a cache: sha256(identity, the layout of `like`, numerics). */
void osp_prefix_namespace(const char *identity, const osp_kv *like, const char *numerics, char out[65]);

/* `like`: the cache whose rows the entries come from and go to (its layout
 * and memory); it must outlive the prefix cache. */
osp_status osp_prefix_new(const osp_prefix_opts *o, const osp_kv *like, osp_prefix **out);
/* Writes every resident entry not yet on disk (when persisting), then frees. */
void osp_prefix_free(osp_prefix *pc);
/* The same within `seconds` (<= 0: no bound): the most recently used
 * entries are written first, and those still unwritten at the deadline are
 * dropped (a cache: a bounded shutdown matters more). */
void osp_prefix_free_within(osp_prefix *pc, double seconds);

/* The longest usable cached prefix of tokens[0, n): copied into `row` of
 * kv (emptied first) and its length returned; 0 = a miss (the row is
 * left empty). Never fails: a broken file is a miss. */
int32_t osp_prefix_restore(osp_prefix *pc, const int32_t *tokens, int32_t n, osp_kv *kv, int32_t row);
/* Keep row `row` of kv, which holds exactly tokens[0, n) (kv->pos[row] == n). */
osp_status osp_prefix_insert(osp_prefix *pc, const int32_t *tokens, int32_t n, const osp_kv *kv, int32_t row);
/* Bytes of memory the cache holds (resident entries and those being written). */
int64_t osp_prefix_bytes(osp_prefix *pc);
/* Make the cache hold at most `limit` bytes: least recently used entries
 * leave memory (to disk when persisting; their bytes count until written). */
void osp_prefix_shrink(osp_prefix *pc, int64_t limit);
/* Wait until the writer is idle (tests, shutdown). */
void osp_prefix_sync(osp_prefix *pc);
void osp_prefix_get_stats(osp_prefix *pc, osp_prefix_stats *st);

#endif
