/* Continuous batching through the library API, against the goldens: four
 * rows with different prompt lengths join a running batch at different
 * steps, decode together, take speculative rounds rolled back by a random
 * number of tokens per row, survive extract + merge round trips and a
 * filter, leave at different steps (one row rejoins as a new sequence):
 * every logit of every row must match its single-sequence golden. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include "golden.h"
#include "osprey.h"

#define R 4      /* rows */
#define GAMMA 3  /* speculative tokens per round */

typedef struct row_state {
    int active;
    int32_t pos;     /* golden positions done */
    int32_t join;    /* step it joins at */
    int32_t len;     /* prompt length */
    int32_t stop_at; /* leaves once pos reaches this */
} row_state;

static void check(const golden *g, const float *got, int32_t pos, const char *what, int32_t row) {
    double r = golden_pos_ratio(g->logits + (int64_t)pos * g->vocab, got, g->vocab);
    if (r > 1) fail_msg("%s: row %d position %d off by %.2fx the tolerance", what, row, pos, r);
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static int32_t rnd(int32_t n) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (int32_t)(rng % (uint64_t)n);
}

/* Replace the session by copies of its rows made one by one and merged
 * (and, every other time, drop and re-add nothing but reorder via filter). */
static osp_session *round_trip(osp_session *s) {
    osp_session *one[R];
    for (int32_t b = 0; b < R; b++) assert_int_equal(osp_session_extract_row(s, b, &one[b]), OSP_OK);
    for (int32_t b = 0; b < R; b++) assert_int_equal(osp_session_row_pos(one[b], 0), osp_session_row_pos(s, b));
    osp_session *m;
    assert_int_equal(osp_session_merge((const osp_session *const *)one, R, &m), OSP_OK);
    assert_int_equal(osp_session_rows(m), R);
    for (int32_t b = 0; b < R; b++) osp_session_free(one[b]);
    osp_session_free(s);
    return m;
}

/* A golden model and its reference data. */
static void load(const char *name, osp_model **m, golden *g) {
    char dir[256];
    snprintf(dir, sizeof dir, "data/goldens/%s", name);
    assert_int_equal(osp_model_load(dir, m), OSP_OK);
    assert_int_equal(golden_load(dir, g), 0);
}

static void run_model(const char *name) {
    osp_model *m;
    golden g;
    load(name, &m, &g);
    const int32_t T = g.T, V = g.vocab;
    osp_session_opts o = {.n_rows = R, .max_ctx = T, .spare = GAMMA};
    osp_session *s;
    assert_int_equal(osp_session_new_opts(m, &o, &s), OSP_OK);
    row_state rs[R] = {
        {0, 0, 0, 5, T},      /* joins first, runs to the end */
        {0, 0, 2, 1, 17},     /* leaves early, rejoins later as a new sequence */
        {0, 0, 3, 11, T - 4}, /* a long prompt */
        {0, 0, 6, 3, 30},
    };
    int32_t rejoined = 0;
    float *lg = malloc(sizeof(float) * (size_t)R * (GAMMA + 1) * T * V);
    int32_t ids[R * (GAMMA + 1)], rows[R], keep[R];
    for (int32_t step = 0; step < 200; step++) {
        for (int32_t b = 0; b < R; b++) /* joiners prefill alone */
            if (!rs[b].active && rs[b].join == step) {
                assert_int_equal(osp_session_row_pos(s, b), 0);
                assert_int_equal(osp_forward_rows(s, &b, 1, g.ids, rs[b].len, 1, lg), OSP_OK);
                for (int32_t t = 0; t < rs[b].len; t++) check(&g, lg + (int64_t)t * V, t, "prefill", b);
                rs[b].active = 1;
                rs[b].pos = rs[b].len;
            }
        if (step == 9 || step == 21) s = round_trip(s);
        int32_t nb = 0, room = GAMMA + 1;
        for (int32_t b = 0; b < R; b++)
            if (rs[b].active) {
                rows[nb++] = b;
                if (rs[b].stop_at - rs[b].pos < room) room = rs[b].stop_at - rs[b].pos;
            }
        if (!nb) {
            if (rejoined && step > 40) break;
            continue;
        }
        int32_t n = step % 3 == 2 && room >= GAMMA ? GAMMA : 1; /* a speculative round, or one token */
        for (int32_t i = 0; i < nb; i++)
            for (int32_t t = 0; t < n; t++) ids[i * n + t] = g.ids[rs[rows[i]].pos + t];
        if (n > 1) osp_session_round_begin(s);
        assert_int_equal(osp_forward_rows(s, rows, nb, ids, n, 1, lg), OSP_OK);
        for (int32_t i = 0; i < nb; i++)
            for (int32_t t = 0; t < n; t++)
                check(&g, lg + ((int64_t)i * n + t) * V, rs[rows[i]].pos + t, n > 1 ? "speculative" : "decode", rows[i]);
        if (n > 1) { /* keep a random number of each row's tokens */
            for (int32_t b = 0; b < R; b++) keep[b] = 0;
            for (int32_t i = 0; i < nb; i++) keep[rows[i]] = rnd(n + 1);
            assert_int_equal(osp_session_rollback(s, keep), OSP_OK);
            for (int32_t i = 0; i < nb; i++) {
                rs[rows[i]].pos += keep[rows[i]];
                assert_int_equal(osp_session_row_pos(s, rows[i]), rs[rows[i]].pos);
            }
        } else {
            for (int32_t i = 0; i < nb; i++) rs[rows[i]].pos++;
        }
        for (int32_t b = 0; b < R; b++) /* leavers */
            if (rs[b].active && rs[b].pos >= rs[b].stop_at) {
                osp_session_reset_row(s, b);
                rs[b].active = 0;
                if (b == 1 && !rejoined) {
                    rs[b] = (row_state){0, 0, step + 4, 7, T};
                    rejoined = 1;
                }
            }
    }
    assert_true(rejoined);
    for (int32_t b = 0; b < R; b++) assert_false(rs[b].active);
    assert_int_equal(osp_session_kv_bytes(s), 0); /* every row left: nothing held */

    /* filter: rows 3 and 1 of a fresh batch, in that order */
    for (int32_t b = 0; b < R; b++) {
        int32_t len = 4 + 3 * b;
        assert_int_equal(osp_forward_rows(s, &b, 1, g.ids, len, 0, lg), OSP_OK);
    }
    int32_t kp[2] = {3, 1};
    assert_int_equal(osp_session_filter(s, kp, 2), OSP_OK);
    assert_int_equal(osp_session_rows(s), 2);
    assert_int_equal(osp_session_row_pos(s, 0), 13);
    assert_int_equal(osp_session_row_pos(s, 1), 7);
    int32_t two[2] = {g.ids[13], g.ids[7]};
    assert_int_equal(osp_forward(s, two, 1, 0, lg), OSP_OK);
    check(&g, lg, 13, "after filter", 0);
    check(&g, lg + V, 7, "after filter", 1);
    free(lg);
    osp_session_free(s);
    golden_free(&g);
    osp_model_free(m);
}

/* Rolling back further than the sliding rings' spare slots allow is refused
 * and loses nothing. */
static void test_rollback_limit(void **state) {
    (void)state;
    osp_model *m;
    golden g;
    load("gemma3", &m, &g);
    osp_session_opts o = {.n_rows = 1, .max_ctx = g.T, .spare = 2};
    osp_session *s;
    assert_int_equal(osp_session_new_opts(m, &o, &s), OSP_OK);
    float *lg = malloc(sizeof(float) * 8 * g.vocab);
    assert_int_equal(osp_forward(s, g.ids, 20, 0, lg), OSP_OK);
    osp_session_round_begin(s);
    assert_int_equal(osp_forward(s, g.ids + 20, 6, 0, lg), OSP_OK);
    int32_t keep = 0;
    assert_int_equal(osp_session_rollback(s, &keep), OSP_ERR_RANGE); /* 6 > spare: the ring lost it */
    assert_int_equal(osp_session_row_pos(s, 0), 26);
    keep = 5;
    assert_int_equal(osp_session_rollback(s, &keep), OSP_OK);
    assert_int_equal(osp_session_row_pos(s, 0), 25);
    assert_int_equal(osp_forward(s, g.ids + 25, 1, 0, lg), OSP_OK);
    check(&g, lg, 25, "after rollback", 0);
    assert_int_equal(osp_session_trim_row(s, 0, 1), OSP_OK);
    assert_int_equal(osp_session_trim_row(s, 0, 5), OSP_ERR_RANGE);
    free(lg);
    osp_session_free(s);
    golden_free(&g);
    osp_model_free(m);
}

/* Production precision: a row decoded in a batch gets bitwise the logits it
 * gets decoded alone (and in another batch), for every kind of weights. */
static void check_invariance(const char *name) {
    osp_model *m;
    golden g;
    load(name, &m, &g);
    enum { NR = 5, STEPS = 6 };
    const int32_t V = g.vocab, lens[NR] = {3, 9, 1, 14, 6};
    osp_session *all, *one;
    osp_session_opts o = {.n_rows = NR, .max_ctx = g.T};
    assert_int_equal(osp_session_new_opts(m, &o, &all), OSP_OK);
    assert_int_equal(osp_session_new(m, 1, g.T, &one), OSP_OK);
    osp_session_set_fast(all, 1);
    osp_session_set_fast(one, 1);
    float *lb = malloc(sizeof(float) * NR * V), *l1 = malloc(sizeof(float) * V), *ls = malloc(sizeof(float) * NR * V);
    int32_t ids[NR];
    for (int32_t b = 0; b < NR; b++) {
        assert_int_equal(osp_forward_rows(all, &b, 1, g.ids + b, lens[b], 0, lb), OSP_OK);
    }
    int32_t done[NR] = {0}; /* decode tokens each row has taken */
    for (int32_t step = 0; step < STEPS; step++) {
        int32_t nb = step % 2 ? 2 : NR, sub[NR]; /* odd steps: a batch of rows 3 and 1 only */
        for (int32_t i = 0; i < nb; i++) sub[i] = nb == NR ? i : (i ? 1 : 3);
        for (int32_t i = 0; i < nb; i++) ids[i] = g.ids[sub[i] + lens[sub[i]] + done[sub[i]]];
        assert_int_equal(osp_forward_rows(all, sub, nb, ids, 1, 0, lb), OSP_OK);
        for (int32_t i = 0; i < nb; i++) {
            int32_t b = sub[i];
            done[b]++;
            osp_session_reset_row(one, 0); /* the same row alone: its prompt, then its tokens one by one */
            assert_int_equal(osp_forward(one, g.ids + b, lens[b], 0, l1), OSP_OK);
            for (int32_t t = 0; t < done[b]; t++)
                assert_int_equal(osp_forward(one, &g.ids[b + lens[b] + t], 1, 0, l1), OSP_OK);
            if (memcmp(l1, lb + (int64_t)i * V, sizeof(float) * V) != 0)
                fail_msg("%s: row %d at step %d differs in a batch of %d from alone", name, b, step, nb);
        }
    }
    free(lb), free(l1), free(ls);
    osp_session_free(all);
    osp_session_free(one);
    golden_free(&g);
    osp_model_free(m);
}

static void test_invariance(void **state) {
    (void)state;
    for (size_t i = 0; i < N_GOLDEN_MODELS; i++) check_invariance(GOLDEN_MODELS[i]);
}

static void test_models(void **state) {
    (void)state;
    for (size_t i = 0; i < N_GOLDEN_MODELS; i++) run_model(GOLDEN_MODELS[i]);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_models),
        cmocka_unit_test(test_rollback_limit),
        cmocka_unit_test(test_invariance),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
