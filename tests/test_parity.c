/* Parity with the reference logits (tests/data/goldens): every model in
 * prefill, token-by-token decode and several chunkings; rows of a batch
 * at different positions; and the reference's greedy continuation. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include "golden.h"
#include "osprey.h"


typedef struct fixture {
    osp_model *m;
    golden g;
    char dir[256];
} fixture;

/* *state comes in as the model's folder name and goes out as its fixture. */
static int setup(void **state) {
    const char *name = *state;
    fixture *f = calloc(1, sizeof *f);
    snprintf(f->dir, sizeof f->dir, "data/goldens/%s", name);
    if (osp_model_load(f->dir, &f->m) != OSP_OK) {
        fprintf(stderr, "load %s: %s\n", f->dir, osp_last_error());
        return -1;
    }
    if (golden_load(f->dir, &f->g) != 0) return -1;
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fixture *f = *state;
    golden_free(&f->g);
    osp_model_free(f->m);
    free(f);
    return 0;
}

/* Run the golden input in chunks of `chunk` tokens; check every position. */
static void check_chunked(fixture *f, int32_t chunk) {
    golden *g = &f->g;
    assert_int_equal(osp_model_get_info(f->m)->vocab, g->vocab);
    osp_session *s;
    assert_int_equal(osp_session_new(f->m, 1, g->T, &s), OSP_OK);
    float *out = malloc(sizeof(float) * g->T * g->vocab);
    for (int32_t t0 = 0; t0 < g->T; t0 += chunk) {
        int32_t n = g->T - t0 < chunk ? g->T - t0 : chunk;
        assert_int_equal(osp_forward(s, g->ids + t0, n, 1, out + (int64_t)t0 * g->vocab), OSP_OK);
    }
    for (int32_t t = 0; t < g->T; t++) {
        double r = golden_pos_ratio(g->logits + (int64_t)t * g->vocab, out + (int64_t)t * g->vocab, g->vocab);
        if (r > 1) fail_msg("%s chunk %d: position %d off by %.2fx the tolerance", f->dir, chunk, t, r);
    }
    free(out);
    osp_session_free(s);
}

/* Two rows at different positions in one batch: row 0 runs ahead by `lead`
 * tokens (row 1 is reset after the first call), then both advance together. */
static void check_batched(fixture *f, int32_t lead, int32_t step) {
    golden *g = &f->g;
    int32_t V = g->vocab;
    osp_session *s;
    assert_int_equal(osp_session_new(f->m, 2, g->T, &s), OSP_OK);
    int32_t *ids = malloc(sizeof(int32_t) * 2 * (lead > step ? lead : step));
    float *out = malloc(sizeof(float) * 2 * (lead > step ? lead : step) * V);
    for (int32_t t = 0; t < lead; t++) ids[t] = ids[lead + t] = g->ids[t];
    assert_int_equal(osp_forward(s, ids, lead, 1, out), OSP_OK);
    osp_session_reset_row(s, 1);
    assert_int_equal(osp_session_row_pos(s, 1), 0);
    for (int32_t p1 = 0; p1 + lead + step <= g->T; p1 += step) {
        int32_t p0 = p1 + lead;
        for (int32_t t = 0; t < step; t++) {
            ids[t] = g->ids[p0 + t];
            ids[step + t] = g->ids[p1 + t];
        }
        assert_int_equal(osp_forward(s, ids, step, 1, out), OSP_OK);
        for (int32_t t = 0; t < step; t++) {
            double r0 = golden_pos_ratio(g->logits + (int64_t)(p0 + t) * V, out + (int64_t)t * V, V);
            double r1 = golden_pos_ratio(g->logits + (int64_t)(p1 + t) * V, out + (int64_t)(step + t) * V, V);
            if (r0 > 1 || r1 > 1)
                fail_msg("%s batched: rows at %d/%d off by %.2f/%.2fx", f->dir, p0 + t, p1 + t, r0, r1);
        }
    }
    free(ids);
    free(out);
    osp_session_free(s);
}

/* The reference's greedy continuation: at every step our top token must be
 * the reference token, unless the two are a near-tie: within GOLDEN_MARGIN
 * plus our error bound on both logits. Feeds the reference tokens. */
static void check_greedy(fixture *f) {
    golden *g = &f->g;
    if (!g->prompt || !g->gen) return;
    int32_t V = g->vocab;
    osp_session *s;
    assert_int_equal(osp_session_new(f->m, 1, g->n_prompt + g->n_gen, &s), OSP_OK);
    float *lg = malloc(sizeof(float) * V);
    assert_int_equal(osp_forward(s, g->prompt, g->n_prompt, 0, lg), OSP_OK);
    for (int32_t i = 0; i < g->n_gen; i++) {
        int best = argmax_f(lg, V);
        double mx = 0;
        for (int32_t j = 0; j < V; j++) mx = fabs(lg[j]) > mx ? fabs(lg[j]) : mx;
        double tol = GOLDEN_MARGIN + 2 * GOLDEN_TOL * (mx > 1 ? mx : 1);
        if (best != g->gen[i] && lg[best] - lg[g->gen[i]] > tol)
            fail_msg("%s greedy step %d: ours %d (%.5f), reference %d (%.5f)", f->dir, i, best, lg[best], g->gen[i],
                     lg[g->gen[i]]);
        if (i + 1 < g->n_gen) assert_int_equal(osp_forward(s, &g->gen[i], 1, 0, lg), OSP_OK);
    }
    free(lg);
    osp_session_free(s);
}

/* What inspect reports (per-token bytes of full layers, fixed bytes of
 * sliding rings, nothing for KV-shared layers) is what a session allocates
 * once its rows hold `ctx` positions (rows grow on demand; nothing before). */
static void check_kv_bytes(fixture *f) {
    const osp_model_info *in = osp_model_get_info(f->m);
    for (int32_t rows = 1; rows <= 3; rows += 2) {
        int32_t ctx = 100; /* longer than every window here, one growth step */
        osp_session *s;
        assert_int_equal(osp_session_new(f->m, rows, ctx, &s), OSP_OK);
        assert_int_equal(osp_session_kv_bytes(s), 0);
        int32_t *ids = calloc((size_t)rows * ctx, sizeof *ids);
        float *lg = malloc(sizeof(float) * rows * in->vocab);
        assert_int_equal(osp_forward(s, ids, ctx, 0, lg), OSP_OK);
        size_t want = (size_t)rows * ((size_t)in->kv_bytes_per_token * ctx + (size_t)in->kv_bytes_sliding);
        assert_int_equal(osp_session_kv_bytes(s), want);
        assert_int_equal(osp_session_kv_row_bytes(s, ctx) * rows, (int64_t)want);
        osp_session_reset_row(s, 0);
        assert_int_equal(osp_session_kv_bytes(s), want / rows * (rows - 1));
        free(ids);
        free(lg);
        osp_session_free(s);
    }
}

static void test_model(void **state) {
    fixture *f = *state;
    check_kv_bytes(f);
    int32_t chunks[] = {f->g.T, 1, 3, 7, 16};
    for (size_t i = 0; i < sizeof chunks / sizeof *chunks; i++) check_chunked(f, chunks[i]);
    check_batched(f, 5, 1);
    check_batched(f, 9, 4);
    check_greedy(f);
}

int main(void) {
    struct CMUnitTest tests[N_GOLDEN_MODELS];
    for (size_t i = 0; i < N_GOLDEN_MODELS; i++) {
        struct CMUnitTest t = cmocka_unit_test_prestate_setup_teardown(test_model, setup, teardown, (void *)GOLDEN_MODELS[i]);
        t.name = GOLDEN_MODELS[i];
        tests[i] = t;
    }
    return _cmocka_run_group_tests("test_parity", tests, N_GOLDEN_MODELS, NULL, NULL);
}
