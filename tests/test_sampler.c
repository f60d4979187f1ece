/* The sampler: greedy, reproducibility, exact support of each filter, the
 * sampled frequencies against the renormalised distribution (chi-square),
 * and the penalties' exact effect on the logits. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "engine/sampler.h"

static uint64_t rs = 88172645463325252ull;
static double urand(void) {
    rs ^= rs << 13, rs ^= rs >> 7, rs ^= rs << 17;
    return (double)(rs >> 11) / 9007199254740992.0;
}

static osp_sampler *mk(osp_sampler_params p, int32_t V) {
    osp_sampler *s;
    assert_int_equal(osp_sampler_new(&p, V, &s), OSP_OK);
    return s;
}

/* logits = log(p) for a given distribution */
static void set_logits(float *l, const double *p, int32_t V) {
    for (int32_t i = 0; i < V; i++) l[i] = p[i] > 0 ? (float)log(p[i]) : -INFINITY;
}

/* Draw n samples; counts[V]. */
static void draw(osp_sampler *s, const double *p, int32_t V, int n, int *counts) {
    float *l = malloc(sizeof(float) * V);
    memset(counts, 0, sizeof(int) * V);
    for (int i = 0; i < n; i++) {
        set_logits(l, p, V);
        counts[osp_sampler_sample(s, l, NULL, 0, NULL)]++;
    }
    free(l);
}

static void test_greedy(void **st) {
    (void)st;
    int32_t V = 1000;
    float *l = malloc(sizeof(float) * V);
    osp_sampler *s = mk(osp_sampler_defaults(), V);
    for (int r = 0; r < 50; r++) {
        int32_t best = 0;
        for (int32_t i = 0; i < V; i++) {
            l[i] = (float)(urand() * 20 - 10);
            if (l[i] > l[best]) best = i;
        }
        assert_int_equal(osp_sampler_sample(s, l, NULL, 0, NULL), best);
    }
    osp_sampler_free(s);
    free(l);
}

static void test_seed(void **st) {
    (void)st;
    int32_t V = 500;
    double p[500];
    for (int i = 0; i < V; i++) p[i] = 1.0 / V;
    osp_sampler_params sp = osp_sampler_defaults();
    sp.temperature = 1;
    sp.seed = 42;
    int32_t a[64], b[64], c[64];
    float l[500];
    osp_sampler *s1 = mk(sp, V), *s2 = mk(sp, V);
    sp.seed = 43;
    osp_sampler *s3 = mk(sp, V);
    int same13 = 1;
    for (int i = 0; i < 64; i++) {
        set_logits(l, p, V), a[i] = osp_sampler_sample(s1, l, NULL, 0, NULL);
        set_logits(l, p, V), b[i] = osp_sampler_sample(s2, l, NULL, 0, NULL);
        set_logits(l, p, V), c[i] = osp_sampler_sample(s3, l, NULL, 0, NULL);
        same13 &= a[i] == c[i];
    }
    assert_memory_equal(a, b, sizeof a);
    assert_false(same13);
    osp_sampler_free(s1), osp_sampler_free(s2), osp_sampler_free(s3);
}

/* chi-square of counts against expected probabilities q (zero where excluded) */
static double chi2(const int *counts, const double *q, int32_t V, int n, int *support_bad) {
    double x = 0;
    *support_bad = 0;
    for (int32_t i = 0; i < V; i++) {
        if (q[i] == 0) {
            *support_bad += counts[i] != 0;
            continue;
        }
        double e = q[i] * n;
        x += (counts[i] - e) * (counts[i] - e) / e;
    }
    return x;
}

static void normalise(double *q, int32_t V) {
    double s = 0;
    for (int32_t i = 0; i < V; i++) s += q[i];
    for (int32_t i = 0; i < V; i++) q[i] /= s;
}

/* 10 tokens, p ∝ (10 - i)^2, permuted so the order is not the index order. */
static const int PERM[10] = {3, 7, 0, 9, 5, 1, 8, 2, 6, 4};
static void base_dist(double *p) {
    for (int i = 0; i < 10; i++) p[PERM[i]] = (double)(10 - i) * (10 - i);
    normalise(p, 10);
}

/* chi-square, 9 dof at most: 40 is far beyond p = 1e-5; a wrong support,
 * a missing renormalisation or a wrong temperature gives thousands. */
#define N_DRAW 200000
#define CHI2_MAX 40.0

static void check(osp_sampler_params sp, const double *q) {
    double p[10];
    base_dist(p);
    osp_sampler *s = mk(sp, 10);
    int counts[10], bad;
    draw(s, p, 10, N_DRAW, counts);
    double x = chi2(counts, q, 10, N_DRAW, &bad);
    osp_sampler_free(s);
    if (bad || x > CHI2_MAX) fail_msg("support violations %d, chi2 %.1f", bad, x);
}

static void test_temperature(void **st) {
    (void)st;
    double p[10], q[10];
    base_dist(p);
    osp_sampler_params sp = osp_sampler_defaults();
    sp.seed = 7;
    sp.temperature = 1;
    check(sp, p);
    sp.temperature = 0.5f; /* q ∝ p^2 */
    for (int i = 0; i < 10; i++) q[i] = p[i] * p[i];
    normalise(q, 10);
    check(sp, q);
}

static void test_top_k(void **st) {
    (void)st;
    double p[10], q[10];
    base_dist(p);
    osp_sampler_params sp = osp_sampler_defaults();
    sp.seed = 11;
    sp.temperature = 1;
    sp.top_k = 4;
    for (int i = 0; i < 10; i++) q[i] = 0;
    for (int i = 0; i < 4; i++) q[PERM[i]] = p[PERM[i]];
    normalise(q, 10);
    check(sp, q);
}

static void test_top_p(void **st) {
    (void)st;
    double p[10], q[10];
    base_dist(p); /* sorted masses: 100,81,64,49,... /385 */
    osp_sampler_params sp = osp_sampler_defaults();
    sp.seed = 12;
    sp.temperature = 1;
    /* mass above rank 3 is (100+81+64)/385 = 0.636; top_p 0.6 keeps ranks 0..3 (mass above rank 3 < 0.6? no:
       0.636 >= 0.6, so rank 3 is dropped): keep ranks with mass above < 0.6 → ranks 0,1,2 */
    sp.top_p = 0.6f;
    for (int i = 0; i < 10; i++) q[i] = 0;
    for (int i = 0; i < 3; i++) q[PERM[i]] = p[PERM[i]];
    normalise(q, 10);
    check(sp, q);
    sp.top_p = 0.64f; /* 0.636 < 0.64: rank 3 kept too */
    q[PERM[3]] = p[PERM[3]];
    for (int i = 0; i < 3; i++) q[PERM[i]] = p[PERM[i]];
    normalise(q, 10);
    check(sp, q);
}

static void test_min_p(void **st) {
    (void)st;
    double p[10], q[10];
    base_dist(p);
    osp_sampler_params sp = osp_sampler_defaults();
    sp.seed = 13;
    sp.temperature = 1;
    sp.min_p = 0.3f; /* keep p >= 0.3 * max: 100,81,64,49,36 (>=30) */
    for (int i = 0; i < 10; i++) q[i] = i < 5 ? p[PERM[i]] : 0;
    double qq[10] = {0};
    for (int i = 0; i < 5; i++) qq[PERM[i]] = q[i];
    normalise(qq, 10);
    check(sp, qq);
    sp.min_p = 0.99f;
    sp.min_tokens_to_keep = 2; /* only the top passes min_p; two are kept */
    memset(qq, 0, sizeof qq);
    qq[PERM[0]] = p[PERM[0]], qq[PERM[1]] = p[PERM[1]];
    normalise(qq, 10);
    check(sp, qq);
}

static void test_filter_order(void **st) {
    (void)st;
    double p[10], q[10] = {0};
    base_dist(p);
    osp_sampler_params sp = osp_sampler_defaults();
    sp.seed = 14;
    sp.temperature = 1;
    sp.top_p = 0.9f; /* masses above: 0,.26,.47,.64,.76,.85,.92 → ranks 0..5 kept */
    sp.top_k = 2;    /* then top 2 */
    q[PERM[0]] = p[PERM[0]], q[PERM[1]] = p[PERM[1]];
    normalise(q, 10);
    check(sp, q);
}

/* top_p + top_k over a large vocabulary (the candidate pre-filter path):
 * p ∝ exp(-rank / 6) on 1000 shuffled tokens. */
static void test_top_p_top_k_large(void **st) {
    (void)st;
    enum { V = 1000 };
    static double p[V], q[V];
    static int perm[V], counts[V];
    for (int i = 0; i < V; i++) perm[i] = i;
    for (int i = V - 1; i > 0; i--) {
        int j = (int)(urand() * (i + 1)), t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    for (int r = 0; r < V; r++) p[perm[r]] = exp(-r / 6.0);
    normalise(p, V);
    const float tps[] = {0.5f, 0.9f, 0.99f};
    const int tks[] = {8, 40, 500};
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < 3; b++) {
            double above = 0;
            int keep = 0;
            while (keep < V && above < tps[a]) above += p[perm[keep++]];
            if (keep > tks[b]) keep = tks[b];
            memset(q, 0, sizeof q);
            for (int r = 0; r < keep; r++) q[perm[r]] = p[perm[r]];
            normalise(q, V);
            osp_sampler_params sp = osp_sampler_defaults();
            sp.seed = 21 + a * 3 + b;
            sp.temperature = 1;
            sp.top_p = tps[a];
            sp.top_k = tks[b];
            osp_sampler *s = mk(sp, V);
            static float l0[V], l[V];
            set_logits(l0, p, V);
            const int nd = 40000;
            memset(counts, 0, sizeof counts);
            for (int d = 0; d < nd; d++) {
                memcpy(l, l0, sizeof l);
                counts[osp_sampler_sample(s, l, NULL, 0, NULL)]++;
            }
            osp_sampler_free(s);
            /* chi-square with the cells expected below 5 pooled into one */
            int bad = 0;
            double x = 0, pool_e = 0, pool_c = 0;
            for (int i = 0; i < V; i++) {
                double e = q[i] * nd;
                if (q[i] == 0) bad += counts[i] != 0;
                else if (e < 5) pool_e += e, pool_c += counts[i];
                else x += (counts[i] - e) * (counts[i] - e) / e;
            }
            if (pool_e > 0) x += (pool_c - pool_e) * (pool_c - pool_e) / (pool_e > 1 ? pool_e : 1);
            /* at most ~60 cells: 150 is far in the tail; a wrong support or weighting gives thousands */
            if (bad || x > 150) fail_msg("top_p %.2f top_k %d: support violations %d, chi2 %.1f", tps[a], tks[b], bad, x);
        }
}

static void test_xtc(void **st) {
    (void)st;
    double p[4] = {0.5, 0.3, 0.15, 0.05};
    osp_sampler_params sp = osp_sampler_defaults();
    sp.seed = 15;
    sp.temperature = 1;
    sp.xtc_probability = 1;
    sp.xtc_threshold = 0.1f; /* above: .5 .3 .15 → all but the least (.15) removed */
    osp_sampler *s = mk(sp, 4);
    int c[4];
    draw(s, p, 4, 20000, c);
    assert_int_equal(c[0], 0);
    assert_int_equal(c[1], 0);
    assert_true(c[2] > 0 && c[3] > 0);
    osp_sampler_free(s);
    int32_t ex = 0;
    sp.xtc_exempt = &ex;
    sp.n_xtc_exempt = 1;
    s = mk(sp, 4);
    draw(s, p, 4, 20000, c);
    assert_true(c[0] > 0 && c[2] > 0);
    assert_int_equal(c[1], 0);
    osp_sampler_free(s);
}

/* Processors: the logprobs output is log-softmax of exactly the processed logits. */
static void test_penalties(void **st) {
    (void)st;
    int32_t V = 8;
    float l[8] = {1, -1, 2, -2, 0.5f, 3, -0.5f, 0}, want[8], lp[8];
    int32_t hist[] = {5, 0, 1, 1, 2, 7, 1}; /* last 4 with context 4: 1, 2, 7, 1 */
    osp_bias bias[2] = {{3, 1.5f}, {0, -0.25f}};
    osp_sampler_params sp = osp_sampler_defaults();
    sp.logit_bias = bias;
    sp.n_logit_bias = 2;
    sp.repetition_penalty = 2;
    sp.repetition_context = 4;
    sp.presence_penalty = 0.5f;
    sp.presence_context = 4;
    sp.frequency_penalty = 0.25f;
    sp.frequency_context = 4;
    memcpy(want, l, sizeof l);
    want[3] += 1.5f, want[0] -= 0.25f;               /* bias */
    want[1] *= 2, want[2] /= 2, want[7] /= 2;         /* repetition, once per token: -1*2, 2/2, 0/2 */
    want[1] -= 0.5f, want[2] -= 0.5f, want[7] -= 0.5f; /* presence */
    want[1] -= 0.5f, want[2] -= 0.25f, want[7] -= 0.25f; /* frequency: token 1 twice */
    osp_sampler *s = mk(sp, V);
    osp_sampler_sample(s, l, hist, 7, lp);
    double mx = -1e30, sum = 0;
    for (int i = 0; i < V; i++) mx = want[i] > mx ? want[i] : mx;
    for (int i = 0; i < V; i++) sum += exp(want[i] - mx);
    for (int i = 0; i < V; i++) assert_float_equal(lp[i], want[i] - mx - log(sum), 1e-5);
    osp_sampler_free(s);
}

static void test_top_k_indices(void **st) {
    (void)st;
    int32_t n = 3000, idx[3000], scratch[3000];
    float *x = malloc(sizeof(float) * n);
    for (int r = 0; r < 20; r++) {
        for (int i = 0; i < n; i++) x[i] = (float)(int)(urand() * 50); /* many ties */
        int32_t k = 1 + (int32_t)(urand() * 200);
        osp_top_k_indices(x, n, k, idx, scratch);
        /* reference: selection by repeated max in (value desc, index asc) */
        char *used = calloc(n, 1);
        for (int32_t j = 0; j < k; j++) {
            int32_t b = -1;
            for (int32_t i = 0; i < n; i++)
                if (!used[i] && (b < 0 || x[i] > x[b])) b = i;
            used[b] = 1;
            assert_int_equal(idx[j], b);
        }
        free(used);
    }
    free(x);
}

static void test_bad_params(void **st) {
    (void)st;
    osp_sampler *s;
    osp_sampler_params sp = osp_sampler_defaults();
    sp.top_p = 1.5f;
    assert_int_equal(osp_sampler_new(&sp, 10, &s), OSP_ERR_INVALID);
    sp = osp_sampler_defaults();
    sp.temperature = -1;
    assert_int_equal(osp_sampler_new(&sp, 10, &s), OSP_ERR_INVALID);
    sp = osp_sampler_defaults();
    osp_bias b = {10, 1};
    sp.logit_bias = &b;
    sp.n_logit_bias = 1;
    assert_int_equal(osp_sampler_new(&sp, 10, &s), OSP_ERR_INVALID);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy),      cmocka_unit_test(test_seed),         cmocka_unit_test(test_temperature),
        cmocka_unit_test(test_top_k),       cmocka_unit_test(test_top_p),        cmocka_unit_test(test_min_p),
        cmocka_unit_test(test_filter_order), cmocka_unit_test(test_xtc),
        cmocka_unit_test(test_top_p_top_k_large),         cmocka_unit_test(test_penalties),
        cmocka_unit_test(test_top_k_indices), cmocka_unit_test(test_bad_params),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
