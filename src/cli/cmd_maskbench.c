/* osprey maskbench --tokenizer DIR FILE.jsonl[.xz]: MaskBench's runner.
 *
 * Per schema line {"id", "schema", "tests": [{"text", "valid"}]}: compile
 * (ttfm_us: compile + the first mask), then per test tokenize the text
 * (no special tokens) and for each token time the mask and the commit as
 * one figure. A valid test must be accepted to its end (and the grammar
 * must accept there); an invalid one must be rejected at some token or
 * not accept at the end. One JSON line a schema on stdout, a summary on
 * stderr. Single-threaded, as MaskBench runs each engine.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zlib.h>
#include "cli/cli.h"
#include "core/core.h"
#include "grammar/grammar.h"
#include "text/tokenizer.h"

/* --clock thread: this thread's CPU time, for a machine shared with other
 * jobs (wall time there counts the waits for a core) */
static int use_thread_clock;
static double now_s(void) {
    if (!use_thread_clock) return osp_now_s();
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}
static double pct(double *v, size_t n, double p) {
    if (!n) return 0;
    size_t i = (size_t)(p * (double)(n - 1) + 0.5);
    return v[i < n ? i : n - 1];
}

/* A tokenizer folder whose tokenizer.json is gzipped: inflate it. */
static osp_status load_tok(const char *dir, osp_tokenizer **out) {
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer.json.gz", dir);
    gzFile f = gzopen(path, "rb");
    if (!f) return osp_tokenizer_load(dir, out);
    size_t cap = 1 << 24, n = 0;
    char *buf = malloc(cap);
    int r;
    while ((r = gzread(f, buf + n, (unsigned)(cap - n))) > 0) {
        n += (size_t)r;
        if (n == cap) buf = realloc(buf, cap *= 2);
    }
    gzclose(f);
    char cpath[4096];
    snprintf(cpath, sizeof cpath, "%s/tokenizer_config.json", dir);
    char *cfg = NULL;
    size_t cn = 0;
    FILE *cf = fopen(cpath, "rb");
    if (cf) {
        fseek(cf, 0, SEEK_END);
        cn = (size_t)ftell(cf);
        fseek(cf, 0, SEEK_SET);
        cfg = malloc(cn + 1);
        cn = fread(cfg, 1, cn, cf);
        fclose(cf);
    }
    osp_status st = osp_tokenizer_load_json(buf, n, cfg, cn, path, out);
    free(buf), free(cfg);
    return st;
}

int osp_cmd_maskbench(int argc, char **argv) {
    const char *tokdir = NULL, *file = NULL;
    int limit = -1, skip = 0, every = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--tokenizer") && i + 1 < argc) tokdir = argv[++i];
        else if (!strcmp(argv[i], "--limit") && i + 1 < argc) limit = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--clock") && i + 1 < argc) use_thread_clock = !strcmp(argv[++i], "thread");
        else if (!strcmp(argv[i], "--shard") && i + 1 < argc) { /* K/N: lines K, K+N, ... */
            if (sscanf(argv[++i], "%d/%d", &skip, &every) != 2 || every < 1) skip = 0, every = 1;
        } else if (argv[i][0] != '-' && !file) file = argv[i];
        else {
            fprintf(stderr, "usage: osprey maskbench --tokenizer DIR FILE.jsonl[.xz] [--limit N] [--shard K/N] [--clock wall|thread]\n");
            return 2;
        }
    }
    if (!tokdir || !file) {
        fprintf(stderr, "usage: osprey maskbench --tokenizer DIR FILE.jsonl[.xz] [--limit N] [--shard K/N] [--clock wall|thread]\n");
        return 2;
    }
    osp_tokenizer *tok;
    if (load_tok(tokdir, &tok)) return osp_cli_fail("maskbench");
    osp_grammar_vocab *voc;
    double tv = osp_now_s();
    if (osp_grammar_vocab_from_tokenizer(tok, &voc)) return osp_cli_fail("maskbench");
    fprintf(stderr, "maskbench: vocab %d tokens, trie in %.0f ms\n", osp_grammar_vocab_size(voc), (osp_now_s() - tv) * 1e3);
    FILE *in;
    size_t fl = strlen(file);
    int piped = fl > 3 && !strcmp(file + fl - 3, ".xz");
    if (piped) {
        char cmd[4200];
        snprintf(cmd, sizeof cmd, "xz -dc '%s'", file);
        in = popen(cmd, "r");
    } else in = fopen(file, "r");
    if (!in) { fprintf(stderr, "osprey maskbench: cannot open %s\n", file); return 1; }

    int32_t V = osp_grammar_vocab_size(voc);
    uint32_t *bits = malloc(sizeof(uint32_t) * ((V + 31) / 32));
    size_t cap_all = 1 << 20, n_all = 0, cap_ttfm = 4096, n_ttfm = 0;
    double *all = malloc(sizeof(double) * cap_all), *ttfms = malloc(sizeof(double) * cap_ttfm);
    long n_schemas = 0, n_pass = 0, n_cerr = 0, n_inv_acc = 0, n_inv_acc_schemas = 0, n_valid_rej = 0;
    char *line = NULL;
    size_t lcap = 0;
    ssize_t ln;
    long lineno = -1;
    double *mine = malloc(sizeof(double) * 65536);
    size_t cap_mine = 65536;
    while ((ln = getline(&line, &lcap, in)) > 0) {
        lineno++;
        if (lineno % every != skip) continue;
        if (limit >= 0 && n_schemas >= limit) break;
        json_error_t je;
        json_t *j = json_loadb(line, (size_t)ln, JSON_ALLOW_NUL, &je);
        n_schemas++;
        if (!j) { /* counted as failing: a schema we could not even read */
            json_t *o = json_pack("{s:s,s:s}", "id", "?", "compile_error", je.text);
            char *s = json_dumps(o, JSON_COMPACT);
            puts(s);
            free(s);
            json_decref(o);
            n_cerr++;
            continue;
        }
        const char *id = json_string_value(json_object_get(j, "id"));
        json_t *tests = json_object_get(j, "tests");
        char *schema = json_dumps(json_object_get(j, "schema"), JSON_ENCODE_ANY | JSON_PRESERVE_ORDER | JSON_COMPACT);
        double t0 = now_s();
        osp_grammar *g = NULL;
        osp_status st = osp_grammar_from_json_schema(schema, strlen(schema), &g);
        osp_grammar_matcher *m = NULL;
        if (!st) st = osp_grammar_matcher_new(g, voc, &m);
        if (!st) osp_grammar_matcher_mask(m, bits);
        double ttfm = (now_s() - t0) * 1e6;
        free(schema);
        json_t *o = json_object();
        json_object_set_new(o, "id", json_string(id ? id : ""));
        json_object_set_new(o, "ttfm_us", json_real(ttfm));
        size_t nt = json_array_size(tests), nvalid = 0;
        for (size_t i = 0; i < nt; i++) nvalid += json_is_true(json_object_get(json_array_get(tests, i), "valid"));
        double masks_us = 0, max_us = 0;
        size_t n_mine = 0, ntok_total = 0;
        const char *verr = NULL;
        int inv_acc = 0;
        if (st) {
            json_object_set_new(o, "compile_error", json_string(osp_last_error()));
            n_cerr++;
        } else {
            if (n_ttfm == cap_ttfm) ttfms = realloc(ttfms, sizeof(double) * (cap_ttfm *= 2));
            ttfms[n_ttfm++] = ttfm;
            osp_grammar_matcher_free(m);
            m = NULL;
            for (size_t i = 0; i < nt; i++) {
                json_t *tj = json_array_get(tests, i);
                const char *text = json_string_value(json_object_get(tj, "text"));
                int valid = json_is_true(json_object_get(tj, "valid"));
                if (!text) continue;
                int32_t *ids = NULL;
                size_t nids = 0;
                if (osp_tokenizer_encode_alloc(tok, text, strlen(text), 0, &ids, &nids)) continue;
                osp_grammar_matcher_new(g, voc, &m);
                int ok = 1;
                for (size_t k = 0; k < nids; k++) {
                    double a = now_s();
                    osp_grammar_matcher_mask(m, bits);
                    int allowed = (bits[ids[k] >> 5] >> (ids[k] & 31)) & 1;
                    if (allowed) allowed = osp_grammar_matcher_commit(m, ids[k]);
                    double us = (now_s() - a) * 1e6;
                    if (n_mine == cap_mine) mine = realloc(mine, sizeof(double) * (cap_mine *= 2));
                    mine[n_mine++] = us;
                    masks_us += us;
                    if (us > max_us) max_us = us;
                    ntok_total++;
                    if (!allowed) { ok = 0; break; }
                }
                if (ok && !osp_grammar_matcher_accepting(m)) ok = 0;
                osp_grammar_matcher_free(m);
                m = NULL;
                osp_free(ids);
                if (valid && !ok && !verr) verr = "should accept but didn't", n_valid_rej++;
                if (!valid && ok) {
                    if (!verr) verr = "should reject but didn't";
                    inv_acc = 1, n_inv_acc++;
                }
            }
            if (!verr) n_pass++;
            if (inv_acc) n_inv_acc_schemas++;
        }
        osp_grammar_free(g);
        json_object_set_new(o, "masks_us", json_real(masks_us));
        json_object_set_new(o, "max_mask_us", json_real(max_us));
        json_object_set_new(o, "num_tokens", json_integer((json_int_t)ntok_total));
        json_object_set_new(o, "num_tests", json_integer((json_int_t)nt));
        json_object_set_new(o, "num_valid_tests", json_integer((json_int_t)nvalid));
        json_object_set_new(o, "num_invalid_tests", json_integer((json_int_t)(nt - nvalid)));
        json_t *arr = json_array();
        for (size_t k = 0; k < n_mine; k++) json_array_append_new(arr, json_real((double)(long long)(mine[k] * 10) / 10));
        json_object_set_new(o, "all_mask_us", arr);
        if (verr) json_object_set_new(o, "validation_error", json_string(verr));
        if (inv_acc) json_object_set_new(o, "invalid_accepted", json_true()); /* even when verr names another */
        char *s = json_dumps(o, JSON_PRESERVE_ORDER | JSON_COMPACT | JSON_REAL_PRECISION(8));
        puts(s);
        fflush(stdout);
        free(s);
        json_decref(o);
        json_decref(j);
        if (n_all + n_mine > cap_all) {
            while (n_all + n_mine > cap_all) cap_all *= 2;
            all = realloc(all, sizeof(double) * cap_all);
        }
        memcpy(all + n_all, mine, sizeof(double) * n_mine);
        n_all += n_mine;
    }
    if (piped) pclose(in);
    else fclose(in);
    qsort(all, n_all, sizeof(double), cmp_d);
    qsort(ttfms, n_ttfm, sizeof(double), cmp_d);
    fprintf(stderr,
            "maskbench: %ld schemas, passing %ld (%.1f%%), compile errors %ld, valid rejected %ld tests, "
            "invalid accepted %ld tests in %ld schemas\n"
            "maskbench: %zu masks: p50 %.1f us, p99 %.1f us, p99.9 %.1f us, max %.1f us; "
            "ttfm (compile + first mask) p50 %.1f us, p99 %.1f us\n",
            n_schemas, n_pass, n_schemas ? 100.0 * (double)n_pass / (double)n_schemas : 0.0, n_cerr, n_valid_rej,
            n_inv_acc, n_inv_acc_schemas, n_all, pct(all, n_all, 0.5), pct(all, n_all, 0.99), pct(all, n_all, 0.999),
            n_all ? all[n_all - 1] : 0.0, pct(ttfms, n_ttfm, 0.5), pct(ttfms, n_ttfm, 0.99));
    free(all), free(ttfms), free(mine), free(bits), free(line);
    osp_grammar_vocab_free(voc);
    osp_tokenizer_free(tok);
    return 0;
}
