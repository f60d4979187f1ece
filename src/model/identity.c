/* model/identity: a model's artifact identity, the SHA-256 over the files
 * that determine its numbers (weights, config, tokenizer, chat template),
 * so that anything computed from the model (the prefix cache's entries)
 * can be keyed by it and found again after a restart.
 *
 * identity = sha256 over "name\0sha256(file)\n" for each such file of the
 * folder, sorted by name. Hashing a 20 GB model takes a while, so each
 * file's hash is memoised in MEMO_DIR/identity-memo.json, keyed by its real
 * path, size, mtime (ns), inode and device: an unchanged file is not read
 * again, and a changed one (any of those) is. The memo is rewritten
 * atomically (a temporary file renamed over it); a memo that cannot be
 * read or written costs time, never correctness. A file modified in the
 * last 2 s is hashed but not memoised (a change within the timestamps'
 * granularity would not change its key). */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include "core/hash.h"
#include "model/model.h"

static int counts(const char *name) {
    static const char *exact[] = {"config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
                                  "chat_template.json", "tokenizer.model", "special_tokens_map.json"};
    for (size_t i = 0; i < sizeof exact / sizeof *exact; i++)
        if (!strcmp(name, exact[i])) return 1;
    size_t n = strlen(name);
    return n > 12 && !strcmp(name + n - 12, ".safetensors");
}

static int by_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static void memo_key(const struct stat *st, char *out, size_t cap) {
    snprintf(out, cap, "%lld:%lld.%09ld:%llu:%llu", (long long)st->st_size, (long long)st->st_mtim.tv_sec,
             st->st_mtim.tv_nsec, (unsigned long long)st->st_ino, (unsigned long long)st->st_dev);
}

static void memo_save(const char *memo_dir, json_t *memo) {
    char path[PATH_MAX], tmp[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/identity-memo.json", memo_dir);
    snprintf(tmp, sizeof tmp, "%s.%ld.tmp", path, (long)getpid());
    if (json_dump_file(memo, tmp, JSON_COMPACT) != 0 || rename(tmp, path) != 0) {
        unlink(tmp);
        OSP_LOG(2, "osprey: could not write the identity memo %s (the hashes are computed again next time)", path);
    }
}

osp_status osp_identity_dir(const char *dir, const char *memo_dir, char out[65]) {
    DIR *d = opendir(dir);
    if (!d) return osp_err(OSP_ERR_IO, "%s: %s", dir, strerror(errno));
    char **names = NULL;
    size_t n = 0, cap = 0;
    struct dirent *e;
    osp_status rc = OSP_OK;
    while ((e = readdir(d))) {
        if (!counts(e->d_name)) continue;
        if (n == cap) {
            char **nn = realloc(names, sizeof *names * (cap = cap ? 2 * cap : 16));
            if (!nn) { rc = osp_err(OSP_ERR_NOMEM, "out of memory"); break; }
            names = nn;
        }
        if (!(names[n] = strdup(e->d_name))) { rc = osp_err(OSP_ERR_NOMEM, "out of memory"); break; }
        n++;
    }
    closedir(d);
    if (rc == OSP_OK && n == 0) rc = osp_err(OSP_ERR_IO, "%s: no model files to identify", dir);
    json_t *memo = NULL, *files = NULL;
    int memo_dirty = 0;
    if (rc == OSP_OK && memo_dir) {
        char mp[PATH_MAX];
        snprintf(mp, sizeof mp, "%s/identity-memo.json", memo_dir);
        memo = json_load_file(mp, 0, NULL);
        if (!json_is_object(memo) || !json_is_object(json_object_get(memo, "files"))) {
            json_decref(memo);
            memo = json_object();
            if (memo) json_object_set_new(memo, "version", json_integer(1)), json_object_set_new(memo, "files", json_object());
        }
        files = memo ? json_object_get(memo, "files") : NULL;
    }
    qsort(names, n, sizeof *names, by_name);
    osp_sha256 *h = rc == OSP_OK ? osp_sha256_new() : NULL;
    if (rc == OSP_OK && !h) rc = osp_err(OSP_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < n && rc == OSP_OK; i++) {
        char path[PATH_MAX], real[PATH_MAX], key[128], hex[65];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        struct stat st;
        if (!realpath(path, real) || stat(real, &st) != 0) {
            rc = osp_err(OSP_ERR_IO, "%s: %s", path, strerror(errno));
            break;
        }
        memo_key(&st, key, sizeof key);
        json_t *m = files ? json_object_get(files, real) : NULL;
        const char *mk = json_string_value(json_object_get(m, "key")), *ms = json_string_value(json_object_get(m, "sha256"));
        if (mk && ms && !strcmp(mk, key) && strlen(ms) == 64) {
            memcpy(hex, ms, 65);
        } else {
            double t0 = osp_now_s();
            if ((rc = osp_sha256_file(real, hex, NULL)) != OSP_OK) break;
            if (st.st_size > (1 << 28))
                OSP_LOG(1, "osprey: hashed %s (%.1f GB) in %.1f s", names[i], st.st_size / 1e9, osp_now_s() - t0);
            /* a file changed in the last seconds may change again within the file system's timestamp
             * granularity, unseen by the key: such a hash is not memoised (git's "racily clean") */
            if (files && time(NULL) - st.st_mtim.tv_sec > 2) {
                json_t *rec = json_object();
                json_object_set_new(rec, "key", json_string(key));
                json_object_set_new(rec, "sha256", json_string(hex));
                json_object_set_new(files, real, rec);
                memo_dirty = 1;
            }
        }
        osp_sha256_add(h, names[i], strlen(names[i]) + 1);
        osp_sha256_add(h, hex, 64);
        osp_sha256_add(h, "\n", 1);
    }
    if (h) {
        unsigned char dg[32];
        osp_sha256_end(h, dg);
        if (rc == OSP_OK) osp_hex(dg, 32, out);
    }
    if (rc == OSP_OK && memo_dirty) memo_save(memo_dir, memo);
    json_decref(memo);
    for (size_t i = 0; i < n; i++) free(names[i]);
    free(names);
    return rc;
}

osp_status osp_model_identity(const osp_model *m, const char *memo_dir, char out[65]) {
    return osp_identity_dir(osp_model_get_info(m)->dir, memo_dir, out);
}
