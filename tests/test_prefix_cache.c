/* The prefix cache (kv/prefix.c, kv/prefix_file.c) and the artifact
 * identity (model/identity.c):
 *  - every golden: a prompt continued from a cached prefix gives the
 *    reference's logits (2e-5); a partial match resumes full-attention models
 *    and is refused where a sliding ring no longer holds what it needs;
 *  - cold == warm bitwise: 4-bit production path (chunk-invariant rows, a
 *    prefix fed token by token and continued in a chunk), and every KV form
 *    (f32, bf16, 8-bit, 4-bit, rings that wrapped) continued in the cold
 *    run's own chunks;
 *  - eviction by bytes (LRU); persistence (a restart finds entries; the disk
 *    budget); truncated, corrupt, foreign and junk files skipped;
 *  - the identity: stable, memoised, changed by a changed file. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <sys/stat.h>
#include "golden.h"
#include "kv/prefix.h"
#include "osprey.h"

#define FORTUNE "../models/fortune"
static char g_dir[256];

static int setup(void **state) {
    (void)state;
    return test_tmpdir_make(g_dir, sizeof g_dir, "prefix");
}

static int teardown(void **state) {
    (void)state;
    return test_tmpdir_remove(g_dir);
}

static osp_session *mk(osp_model *m, int32_t ctx, int bits, int fast) {
    osp_session_opts o = {.n_rows = 2, .max_ctx = ctx, .kv_bits = bits, .kv_group = 64};
    osp_session *s;
    assert_int_equal(osp_session_new_opts(m, &o, &s), OSP_OK);
    osp_session_set_fast(s, fast);
    return s;
}

static osp_prefix *mkpc(osp_session *s, int64_t mem, const char *dir, int64_t disk, int32_t align, const char *ns_tag) {
    char ns[65];
    osp_prefix_namespace(ns_tag, osp_session_kv(s), "test numerics", ns);
    osp_prefix_opts o = {.mem_bytes = mem, .dir = dir, .disk_bytes = disk, .ns = ns, .min_reuse = 4, .align = align};
    osp_prefix *pc;
    assert_int_equal(osp_prefix_new(&o, osp_session_kv(s), &pc), OSP_OK);
    return pc;
}

/* Positions [from, to) of row `row` in chunks of `chunk`; the last chunk's
 * logits (all positions when all != NULL: [to - from, V]). */
static void feed(osp_session *s, int32_t row, const int32_t *ids, int32_t from, int32_t to, int32_t chunk, float *last,
                 float *all, int32_t V) {
    for (int32_t p = from; p < to; p += chunk) {
        int32_t n = to - p < chunk ? to - p : chunk;
        float *out = all ? all + (int64_t)(p - from) * V : last;
        assert_int_equal(osp_forward_rows(s, &row, 1, ids + p, n, all != NULL, out), OSP_OK);
        if (all && last) memcpy(last, all + (int64_t)(to - 1 - from) * V, sizeof(float) * V);
    }
}

/* The last prompt logits, then `steps` greedy decode steps' logits: out [1 + steps, V]. */
static void continue_greedy(osp_session *s, int32_t row, const float *last, int steps, float *out, int32_t V) {
    memcpy(out, last, sizeof(float) * V);
    for (int k = 0; k < steps; k++) {
        int32_t t = argmax_f(out + (int64_t)k * V, V);
        assert_int_equal(osp_forward_rows(s, &row, 1, &t, 1, 0, out + (int64_t)(k + 1) * V), OSP_OK);
    }
}

/* ---- every golden: reuse gives the reference's numbers ---- */

static void test_goldens(void **state) {
    (void)state;
    for (size_t gi = 0; gi < N_GOLDEN_MODELS; gi++) {
        char dir[256];
        snprintf(dir, sizeof dir, "data/goldens/%s", GOLDEN_MODELS[gi]);
        golden g;
        assert_int_equal(golden_load(dir, &g), 0);
        osp_model *m;
        assert_int_equal(osp_model_load(dir, &m), OSP_OK);
        const osp_model_info *in = osp_model_get_info(m);
        int32_t V = g.vocab, T = g.T, P = 24;
        osp_session *s = mk(m, 64, 0, 0);
        osp_kv *kv = osp_session_kv(s);
        float *lg = malloc(sizeof(float) * T * V);

        /* a cached prompt of P tokens, continued by the rest */
        osp_prefix *pc = mkpc(s, 1 << 30, NULL, 0, 1, "goldens");
        feed(s, 0, g.ids, 0, P, P, lg, NULL, V);
        assert_int_equal(osp_prefix_insert(pc, g.ids, P, kv, 0), OSP_OK);
        osp_session_reset_row(s, 0);
        assert_int_equal(osp_prefix_restore(pc, g.ids, T, kv, 1), P);
        feed(s, 1, g.ids, P, T, T, NULL, lg, V);
        for (int32_t t = P; t < T; t++) {
            double r = golden_pos_ratio(g.logits + (int64_t)t * V, lg + (int64_t)(t - P) * V, V);
            if (r > 1) fail_msg("%s: position %d after reusing %d: %.2f of the bound", GOLDEN_MODELS[gi], t, P, r);
        }
        osp_session_reset_row(s, 1);
        osp_prefix_free(pc);

        /* an entry that goes on differently after P: full attention resumes at P, a ring does not */
        int32_t junk[32];
        memcpy(junk, g.ids, sizeof(int32_t) * P);
        for (int32_t i = P; i < 32; i++) junk[i] = (g.ids[i] + 1) % V;
        pc = mkpc(s, 1 << 30, NULL, 0, 1, "goldens");
        feed(s, 0, junk, 0, 32, 32, lg, NULL, V);
        assert_int_equal(osp_prefix_insert(pc, junk, 32, kv, 0), OSP_OK);
        osp_session_reset_row(s, 0);
        int32_t u = osp_prefix_restore(pc, g.ids, T, kv, 1);
        if (in->n_sliding_layers > 0) {
            assert_int_equal(u, 0); /* the ring (window 8) has moved on past what position 24 needs */
            assert_int_equal(osp_session_row_pos(s, 1), 0);
        } else {
            assert_int_equal(u, P);
            feed(s, 1, g.ids, P, T, 5, NULL, lg, V);
            for (int32_t t = P; t < T; t++) {
                double r = golden_pos_ratio(g.logits + (int64_t)t * V, lg + (int64_t)(t - P) * V, V);
                if (r > 1) fail_msg("%s: position %d after a partial match: %.2f of the bound", GOLDEN_MODELS[gi], t, r);
            }
        }
        osp_prefix_stats st;
        osp_prefix_get_stats(pc, &st);
        assert_int_equal(st.lookups, 1);
        osp_prefix_free(pc);
        free(lg);
        osp_session_free(s);
        osp_model_free(m);
        golden_free(&g);
    }
}

/* ---- cold == warm, bitwise, on the chunk-invariant production paths: 4-bit weights (int8), bf16 weights
 * on AMX tiles (where the CPU has them) ---- */

static void test_bitwise_q4(void **state) {
    (void)state;
    const char *models[] = {"data/goldens/llama3-q4", "data/goldens/gemma3-q4", "data/goldens/llama3",
                            "data/goldens/gemma3", "data/goldens/gemma4-e"};
    for (int mi = 0; mi < 5; mi++) {
        golden g;
        assert_int_equal(golden_load(models[mi], &g), 0);
        osp_model *m;
        assert_int_equal(osp_model_load(models[mi], &m), OSP_OK);
        osp_session *s = mk(m, 64, 0, 1);
        /* the faster prefill kernels whose numbers depend on the chunk (4-bit chunks on AMX tiles) give way
         * when the session asks for chunk-exact kernels, as the server's prefix cache does */
        const int inv_free = osp_session_chunk_invariant(s);
        osp_session_set_chunk_exact(s, 1);
        assert_true(osp_session_chunk_invariant(s) >= inv_free);
        if (strstr(models[mi], "-q4") && !strncmp(osp_model_get_info(m)->device, "cpu", 3))
            assert_int_equal(osp_session_chunk_invariant(s), 1); /* the CPU's int8 path (a GPU promises none) */
        if (!osp_session_chunk_invariant(s)) { /* bf16 weights without AMX on this CPU */
            osp_session_free(s);
            osp_model_free(m);
            golden_free(&g);
            continue;
        }
        /* with a quantized (or bf16) KV cache a chunk's own positions are attended in f32, later ones read back
         * as stored: not invariant, whatever the matmuls */
        {
            osp_session *sq = mk(m, 64, 16, 1); /* (the goldens' heads are too small for 64-wide KV groups) */
            assert_int_equal(osp_session_chunk_invariant(sq), 0);
            osp_session_free(sq);
        }
        int32_t V = g.vocab, T = g.T, P = 23, steps = 6;
        float *last = malloc(sizeof(float) * V), *cold = malloc(sizeof(float) * (steps + 1) * V),
              *warm = malloc(sizeof(float) * (steps + 1) * V);
        feed(s, 0, g.ids, 0, T, T, last, NULL, V); /* cold: one chunk */
        continue_greedy(s, 0, last, steps, cold, V);
        osp_session_reset_row(s, 0);
        osp_prefix *pc = mkpc(s, 1 << 30, NULL, 0, 1, "bitwise");
        feed(s, 0, g.ids, 0, P, 1, last, NULL, V); /* the prefix token by token */
        assert_int_equal(osp_prefix_insert(pc, g.ids, P, osp_session_kv(s), 0), OSP_OK);
        osp_session_reset_row(s, 0);
        assert_int_equal(osp_prefix_restore(pc, g.ids, T, osp_session_kv(s), 1), P);
        feed(s, 1, g.ids, P, T, T - P, last, NULL, V); /* the rest in one chunk */
        continue_greedy(s, 1, last, steps, warm, V);
        assert_memory_equal(cold, warm, sizeof(float) * (steps + 1) * V);
        osp_prefix_free(pc);
        free(last), free(cold), free(warm);
        osp_session_free(s);
        osp_model_free(m);
        golden_free(&g);
    }
}

/* ---- every KV form, rings that wrapped: continued in the cold run's chunks ---- */

static void test_kv_forms(void **state) {
    (void)state;
    osp_model *m;
    assert_int_equal(osp_model_load(FORTUNE, &m), OSP_OK);
    int32_t V = osp_model_get_info(m)->vocab, T = 400, P = 384, C = 64, steps = 4;
    assert_true(osp_model_get_info(m)->sliding_window < P); /* the rings wrap */
    int32_t *ids = malloc(sizeof(int32_t) * T), *other = malloc(sizeof(int32_t) * T);
    for (int32_t i = 0; i < T; i++) ids[i] = (i * 131 + 7) % V, other[i] = i < 300 ? ids[i] : (ids[i] + 3) % V;
    float *last = malloc(sizeof(float) * V), *cold = malloc(sizeof(float) * (steps + 1) * V),
          *warm = malloc(sizeof(float) * (steps + 1) * V);
    const int bits[4] = {0, 16, 8, 4};
    for (int b = 0; b < 4; b++) {
        osp_session *s = mk(m, 512, bits[b], 1);
        feed(s, 0, ids, 0, T, C, last, NULL, V);
        continue_greedy(s, 0, last, steps, cold, V);
        osp_session_reset_row(s, 0);
        osp_prefix *pc = mkpc(s, 1 << 30, NULL, 0, C, "forms");
        feed(s, 0, ids, 0, P, C, last, NULL, V);
        assert_int_equal(osp_prefix_insert(pc, ids, P, osp_session_kv(s), 0), OSP_OK);
        osp_session_reset_row(s, 0);
        /* sharing only 300 tokens: the rings hold positions from 128 on, position 256 needs earlier ones */
        assert_int_equal(osp_prefix_restore(pc, other, T, osp_session_kv(s), 1), 0);
        assert_int_equal(osp_prefix_restore(pc, ids, T, osp_session_kv(s), 1), P);
        feed(s, 1, ids, P, T, C, last, NULL, V);
        continue_greedy(s, 1, last, steps, warm, V);
        if (memcmp(cold, warm, sizeof(float) * (steps + 1) * V)) fail_msg("KV bits %d: warm != cold", bits[b]);
        osp_prefix_free(pc);
        osp_session_free(s);
    }
    free(ids), free(other), free(last), free(cold), free(warm);
    osp_model_free(m);
}

/* ---- eviction by bytes ---- */

static void fill_entry(osp_session *s, osp_prefix *pc, const int32_t *ids, int32_t n, int32_t V) {
    float *last = malloc(sizeof(float) * V);
    feed(s, 0, ids, 0, n, n, last, NULL, V);
    assert_int_equal(osp_prefix_insert(pc, ids, n, osp_session_kv(s), 0), OSP_OK);
    osp_session_reset_row(s, 0);
    free(last);
}

static void test_eviction(void **state) {
    (void)state;
    osp_model *m;
    assert_int_equal(osp_model_load(FORTUNE, &m), OSP_OK);
    int32_t V = osp_model_get_info(m)->vocab, n = 40;
    osp_session *s = mk(m, 256, 0, 1);
    int32_t ids[3][41];
    for (int e = 0; e < 3; e++)
        for (int32_t i = 0; i < 41; i++) ids[e][i] = (i * 17 + e * 1000 + 3) % V;
    /* measure one entry */
    osp_prefix *pc = mkpc(s, 1 << 30, NULL, 0, 1, "evict");
    fill_entry(s, pc, ids[0], n, V);
    int64_t one = osp_prefix_bytes(pc);
    assert_true(one > 0);
    osp_prefix_free(pc);
    pc = mkpc(s, 2 * one, NULL, 0, 1, "evict"); /* room for two */
    fill_entry(s, pc, ids[0], n, V);
    fill_entry(s, pc, ids[1], n, V);
    assert_int_equal(osp_prefix_restore(pc, ids[0], 41, osp_session_kv(s), 1), n); /* 0 is used: 1 is the LRU */
    osp_session_reset_row(s, 1);
    fill_entry(s, pc, ids[2], n, V);
    osp_prefix_stats st;
    osp_prefix_get_stats(pc, &st);
    assert_int_equal(st.evictions, 1);
    assert_int_equal(st.entries, 2);
    assert_true(st.bytes <= 2 * one);
    assert_int_equal(osp_prefix_restore(pc, ids[1], 41, osp_session_kv(s), 1), 0);
    assert_int_equal(osp_prefix_restore(pc, ids[0], 41, osp_session_kv(s), 1), n);
    assert_int_equal(osp_prefix_restore(pc, ids[2], 41, osp_session_kv(s), 1), n);
    /* the KV budget's say: shrink to one entry */
    osp_prefix_shrink(pc, one);
    assert_true(osp_prefix_bytes(pc) <= one);
    /* an entry covering another replaces it */
    int32_t longer[41];
    memcpy(longer, ids[2], sizeof longer);
    fill_entry(s, pc, longer, 41, V);
    osp_prefix_get_stats(pc, &st);
    assert_int_equal(st.entries, 1);
    osp_prefix_free(pc);
    osp_session_free(s);
    osp_model_free(m);
}

/* ---- persistence ---- */

static int count_files(const char *root) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "find '%s' -name '*.kvc' | wc -l", root);
    FILE *f = popen(cmd, "r");
    int n = -1;
    if (f) {
        if (fscanf(f, "%d", &n) != 1) n = -1;
        pclose(f);
    }
    return n;
}

/* The first .kvc file (sorted) under root, into out; 0 when there is one. */
static int nth_file(const char *root, int k, char *out, size_t cap) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "find '%s' -name '*.kvc' | sort | sed -n %dp", root, k + 1);
    FILE *f = popen(cmd, "r");
    if (!f) return -1;
    int ok = fgets(out, (int)cap, f) != NULL;
    pclose(f);
    if (!ok) return -1;
    out[strcspn(out, "\n")] = 0;
    return 0;
}

static void test_persistence(void **state) {
    (void)state;
    osp_model *m;
    assert_int_equal(osp_model_load(FORTUNE, &m), OSP_OK);
    int32_t V = osp_model_get_info(m)->vocab, n = 40;
    osp_session *s = mk(m, 256, 8, 1);
    char root[300];
    snprintf(root, sizeof root, "%s/persist", g_dir);
    int32_t ids[4][41];
    for (int e = 0; e < 4; e++)
        for (int32_t i = 0; i < 41; i++) ids[e][i] = (i * 29 + e * 777 + 5) % V;
    /* reference: what a prefix continues with, from memory */
    osp_prefix *pc = mkpc(s, 1 << 30, root, 1 << 30, 1, "persist");
    for (int e = 0; e < 3; e++) fill_entry(s, pc, ids[e], n, V);
    float *a = malloc(sizeof(float) * V), *b = malloc(sizeof(float) * V);
    assert_int_equal(osp_prefix_restore(pc, ids[1], 41, osp_session_kv(s), 1), n);
    feed(s, 1, ids[1], n, 41, 1, a, NULL, V);
    osp_session_reset_row(s, 1);
    osp_prefix_free(pc); /* a clean shutdown writes them */
    assert_int_equal(count_files(root), 3);

    /* a restart finds them: the same numbers from the file */
    pc = mkpc(s, 1 << 30, root, 1 << 30, 1, "persist");
    osp_prefix_stats st;
    osp_prefix_get_stats(pc, &st);
    assert_int_equal(st.disk_entries, 3);
    assert_int_equal(st.entries, 0);
    assert_int_equal(osp_prefix_restore(pc, ids[1], 41, osp_session_kv(s), 1), n);
    feed(s, 1, ids[1], n, 41, 1, b, NULL, V);
    osp_session_reset_row(s, 1);
    assert_memory_equal(a, b, sizeof(float) * V);
    osp_prefix_get_stats(pc, &st);
    assert_int_equal(st.disk_loads, 1);
    /* another namespace (another model, layout or engine) sees none of them */
    osp_prefix *other = mkpc(s, 1 << 30, root, 1 << 30, 1, "another model");
    osp_prefix_get_stats(other, &st);
    assert_int_equal(st.disk_entries, 0);
    assert_int_equal(osp_prefix_restore(other, ids[1], 41, osp_session_kv(s), 1), 0);
    osp_prefix_free(other);
    /* memory pressure writes an entry out and keeps finding it */
    osp_prefix_shrink(pc, 0);
    osp_prefix_sync(pc);
    assert_int_equal(osp_prefix_bytes(pc), 0);
    assert_int_equal(osp_prefix_restore(pc, ids[1], 41, osp_session_kv(s), 1), n);
    osp_session_reset_row(s, 1);
    osp_prefix_free(pc);

    /* broken files: a flipped byte, a truncated file, a foreign file, junk */
    char f0[600], f1[600], cmd[2000];
    assert_int_equal(nth_file(root, 0, f0, sizeof f0), 0);
    assert_int_equal(nth_file(root, 1, f1, sizeof f1), 0);
    FILE *f = fopen(f0, "r+b");
    assert_non_null(f);
    fseek(f, -100, SEEK_END);
    int c = fgetc(f);
    fseek(f, -100, SEEK_END);
    fputc(c ^ 0x55, f);
    fclose(f);
    struct stat sb;
    assert_int_equal(stat(f1, &sb), 0);
    assert_int_equal(truncate(f1, sb.st_size - 7), 0);
    char nsdir[600];
    snprintf(nsdir, sizeof nsdir, "%s", f0);
    *strrchr(nsdir, '/') = 0;
    snprintf(cmd, sizeof cmd, "printf 'not a cache file' > '%s/junk.kvc'", nsdir);
    assert_int_equal(system(cmd), 0);
    pc = mkpc(s, 1 << 30, root, 1 << 30, 1, "persist");
    osp_prefix_get_stats(pc, &st);
    assert_int_equal(st.disk_entries, 2); /* the truncated one and the junk are skipped at once */
    assert_int_equal(st.disk_rejects, 2);
    int hits = 0;
    for (int e = 0; e < 3; e++) {
        int32_t u = osp_prefix_restore(pc, ids[e], 41, osp_session_kv(s), 1);
        assert_true(u == 0 || u == n);
        hits += u == n;
        osp_session_reset_row(s, 1);
    }
    assert_int_equal(hits, 1); /* the intact one */
    osp_prefix_get_stats(pc, &st);
    assert_int_equal(st.disk_rejects, 3); /* the flipped byte, found by the checksum */
    assert_int_equal(count_files(root), 1);
    osp_prefix_free(pc);

    /* the disk budget: room for about one file, the least recently used go */
    pc = mkpc(s, 1 << 30, root, (int64_t)sb.st_size + sb.st_size / 2, 1, "persist");
    fill_entry(s, pc, ids[3], n, V);
    osp_prefix_shrink(pc, 0);
    osp_prefix_sync(pc);
    osp_prefix_free(pc);
    assert_int_equal(count_files(root), 1);
    pc = mkpc(s, 1 << 30, root, 1 << 30, 1, "persist");
    assert_int_equal(osp_prefix_restore(pc, ids[3], 41, osp_session_kv(s), 1), n); /* the newest stayed */
    osp_prefix_free(pc);
    free(a), free(b);
    osp_session_free(s);
    osp_model_free(m);
}

/* ---- the artifact identity ---- */

static void test_identity(void **state) {
    (void)state;
    char mdir[300], memo[300], cmd[1600], id1[65], id2[65], id3[65];
    snprintf(mdir, sizeof mdir, "%s/model", g_dir);
    snprintf(memo, sizeof memo, "%s/memo", g_dir);
    snprintf(cmd, sizeof cmd, "mkdir -p '%s' '%s' && cp data/goldens/llama3/config.json data/goldens/llama3/model.safetensors '%s/' && "
             "touch -d '2026-01-01 00:00' '%s'/*", mdir, memo, mdir, mdir); /* files just written are not memoised */
    assert_int_equal(system(cmd), 0);
    assert_int_equal(osp_identity_dir(mdir, memo, id1), OSP_OK);
    assert_int_equal(strlen(id1), 64);
    assert_int_equal(osp_identity_dir(mdir, memo, id2), OSP_OK);
    assert_string_equal(id1, id2);
    char mp[400];
    snprintf(mp, sizeof mp, "%s/identity-memo.json", memo);
    struct stat sb;
    assert_int_equal(stat(mp, &sb), 0);
    /* the memo is what is used for an unchanged file: a planted hash shows through */
    snprintf(cmd, sizeof cmd, "sed -i 's/\"sha256\":\"[0-9a-f]*\"/\"sha256\":\"%064d\"/g' '%s'", 0, mp);
    assert_int_equal(system(cmd), 0);
    assert_int_equal(osp_identity_dir(mdir, memo, id3), OSP_OK);
    assert_string_not_equal(id3, id1);
    assert_int_equal(osp_identity_dir(mdir, NULL, id3), OSP_OK); /* without the memo: the real one */
    assert_string_equal(id3, id1);
    /* a changed weights file (same size) changes it, memo or not */
    snprintf(cmd, sizeof cmd, "rm '%s/identity-memo.json'", memo);
    assert_int_equal(system(cmd), 0);
    assert_int_equal(osp_identity_dir(mdir, memo, id2), OSP_OK); /* memoised again, truly */
    assert_string_equal(id2, id1);
    snprintf(mp, sizeof mp, "%s/model.safetensors", mdir);
    FILE *f = fopen(mp, "r+b");
    assert_non_null(f);
    fseek(f, -1, SEEK_END);
    int c = fgetc(f);
    fseek(f, -1, SEEK_END);
    fputc(c ^ 1, f);
    fclose(f);
    assert_int_equal(osp_identity_dir(mdir, memo, id2), OSP_OK);
    assert_string_not_equal(id2, id1);
    assert_int_equal(osp_identity_dir(mdir, NULL, id3), OSP_OK);
    assert_string_equal(id2, id3);
    assert_int_not_equal(osp_identity_dir("/nonexistent/osp", memo, id3), OSP_OK);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_goldens),     cmocka_unit_test(test_bitwise_q4),  cmocka_unit_test(test_kv_forms),
        cmocka_unit_test(test_eviction),    cmocka_unit_test(test_persistence), cmocka_unit_test(test_identity),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
