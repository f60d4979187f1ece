/* The prefix cache's memory under churn (issue 35): the bytes it counts are
 * the memory it holds.
 *
 * Entries of many lengths are inserted until the cache has turned over
 * several times, between rows that grow and are reset as the server's are
 * (its snapshots, restores and reservations interleave the same way). The
 * process's resident memory may exceed its start by no more than what the
 * cache and the rows count plus a small bound, at every step; and emptying
 * the cache gives its memory back. KV blocks from a heap failed both: the
 * holes that churn leaves between live blocks stayed resident, and a hole
 * could not take a block of the size freed there (a header's bytes
 * larger). The contents of the rows do not matter here, so positions are
 * reserved rather than computed. Memory bounds are skipped under a
 * sanitizer (its allocator keeps freed memory in quarantine). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include "kv/prefix.h"
#include "osprey.h"

#define FORTUNE "../models/fortune"
#define MiB (1024.0 * 1024.0)

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SANITIZED 1
#else
#define SANITIZED 0
#endif

static int64_t rss_bytes(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    long long size = 0, res = 0;
    if (f) {
        if (fscanf(f, "%lld %lld", &size, &res) != 2) res = 0;
        fclose(f);
    }
    return (int64_t)res * 4096;
}

static uint32_t rng = 2463534242u;
static uint32_t next(void) {
    rng ^= rng << 13, rng ^= rng >> 17, rng ^= rng << 5;
    return rng;
}

static void test_churn(void **state) {
    (void)state;
    osp_model *m;
    assert_int_equal(osp_model_load(FORTUNE, &m), OSP_OK);
    const int32_t rows = 4, ctx = osp_model_get_info(m)->max_ctx;
    osp_session_opts so = {.n_rows = rows, .max_ctx = ctx};
    osp_session *s;
    assert_int_equal(osp_session_new_opts(m, &so, &s), OSP_OK);
    osp_kv *kv = osp_session_kv(s);
    char ns[65];
    osp_prefix_namespace("memory", kv, "test numerics", ns);
    const int64_t cap = 48 << 20;
    osp_prefix_opts o = {.mem_bytes = cap, .ns = ns, .min_reuse = 4};
    osp_prefix *pc;
    assert_int_equal(osp_prefix_new(&o, kv, &pc), OSP_OK);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)ctx);

    const int64_t rss0 = rss_bytes();
    int64_t worst = 0, inserted = 0;
    int32_t last_n = 0;
    int i = 0;
    for (; inserted < 6 * cap; i++) {
        int32_t row = i % rows, n = 16 + (int32_t)(next() % (uint32_t)(ctx - 16));
        /* mostly a prefix of its own; every fourth the last one's first half, extended (a chat's next turn) */
        int32_t keep = i % 4 == 1 ? last_n / 2 : 0;
        if (n < keep) n = keep + 16;
        for (int32_t t = keep; t < n; t++) ids[t] = (int32_t)(next() % 4000) + 5;
        last_n = n;
        osp_kv_reset_row(kv, row);
        for (int32_t step = 1; step <= 3; step++) /* grown as a request's prompt, then its reply, arrive */
            assert_int_equal(osp_kv_reserve(kv, row, n * step / 3), OSP_OK);
        kv->pos[row] = n;
        if (i % 3 == 0) { /* a lookup copies an entry into the next row, as a prefill that starts from one does */
            int32_t other = (row + 1) % rows;
            osp_prefix_restore(pc, ids, n, kv, other);
            osp_kv_reserve(kv, other, n);
        }
        assert_int_equal(osp_prefix_insert(pc, ids, n, kv, row), OSP_OK);
        inserted += (int64_t)osp_kv_row_bytes(kv, n);
        /* the KV budget's say: the rows' reservations leave the cache less room */
        osp_prefix_shrink(pc, cap - (int64_t)osp_kv_bytes(kv));
        int64_t counted = osp_prefix_bytes(pc) + (int64_t)osp_kv_bytes(kv);
        int64_t over = rss_bytes() - rss0 - counted;
        if (over > worst) worst = over;
    }
    osp_prefix_stats st;
    osp_prefix_get_stats(pc, &st);
    printf("%d inserts, %lld evictions, %lld entries of %.1f MiB at the end; resident memory at most %.1f MiB over "
           "what the cache and the rows count\n", i, (long long)st.evictions, (long long)st.entries, st.bytes / MiB,
           worst / MiB);
    assert_true(st.evictions > 3 * st.entries); /* it turned over */
    if (!SANITIZED) assert_true(worst < 4 << 20);

    /* emptied, the cache and the rows give their memory back */
    osp_prefix_shrink(pc, 0);
    for (int32_t r = 0; r < rows; r++) osp_kv_reset_row(kv, r);
    assert_int_equal(osp_prefix_bytes(pc), 0);
    assert_int_equal(osp_kv_bytes(kv), 0);
    int64_t left = rss_bytes() - rss0;
    printf("emptied: %.1f MiB over the start\n", left / MiB);
    if (!SANITIZED) assert_true(left < 4 << 20);

    free(ids);
    osp_prefix_free(pc);
    osp_session_free(s);
    osp_model_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_churn)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
