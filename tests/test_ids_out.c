/* Ids out (osp_forward_rows_ids): the backend's greedy token of a row is
 * exactly the sampler's greedy choice on that row's logits.
 *
 * - Synthetic logits with ties, NaN, infinities and signed zeros: the
 *   sampler's greedy pick, the scalar argmax and the dispatched one agree
 *   with a plain reference (the first largest non-NaN value; 0 when all are
 *   NaN); which sampling parameters leave the choice to the argmax.
 * - Every golden model, reference and production precision: rows prefilled
 *   alone and decoded together, one session through plain logits, a twin
 *   through ids out with a mask that changes every step (some rows ids
 *   only, some with logits): ids == the sampler's choice on the plain
 *   logits, and the wanted rows' logits are the plain ones, bitwise.
 * - A stream fed ids (osp_generate takes that path when greedy) reports the
 *   same tokens, text, finish and counts as one fed logits.
 * - Chains of greedy steps (osp_forward_rows_chain), every golden model,
 *   both precisions, with and without a spare ring slot, fed ahead and from
 *   the host (OSP_CHAIN=0): the tokens of plain greedy steps, call for call,
 *   up to the context's end (where a chain stops queuing); a chain ended
 *   with its last step undone leaves the rows where plain decoding
 *   continues them, bitwise, and one ended with its last step kept gives that
 *   step's tokens; past the context's end a chain fails with a range error
 *   and ends; a forward call or other rows while a chain is in flight are
 *   refused. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include "backend/ops.h"
#include "core/options.h"
#include "engine/sampler.h"
#include "golden.h"
#include "osprey.h"
#include "text/tokenizer.h"

#define R 3 /* rows */

/* The greedy rule, written plainly: the first index of the largest non-NaN value, 0 when there is none. */
static int32_t ref_argmax(const float *x, int32_t n) {
    int32_t b = -1;
    for (int32_t i = 0; i < n; i++)
        if (!isnan(x[i]) && (b < 0 || x[i] > x[b])) b = i;
    return b < 0 ? 0 : b;
}

static int32_t sampler_greedy(const float *x, int32_t n) {
    osp_sampler_params p = osp_sampler_defaults();
    assert_true(osp_sampler_is_argmax(&p));
    osp_sampler *s;
    assert_int_equal(osp_sampler_new(&p, n, &s), OSP_OK);
    float *c = malloc(sizeof(float) * n);
    memcpy(c, x, sizeof(float) * n);
    int32_t h = 0, t = osp_sampler_sample(s, c, &h, 1, NULL);
    free(c);
    osp_sampler_free(s);
    return t;
}

static void check_rule(const float *x, int32_t n, int32_t want, const char *what) {
    int32_t r = ref_argmax(x, n), sm = sampler_greedy(x, n), sc = osp_ops_scalar()->argmax(x, n),
            d = osp_ops_get()->argmax(x, n);
    if (r != want || sm != want || sc != want || d != want)
        fail_msg("%s: want %d, reference %d, sampler %d, scalar %d, %s %d", what, want, r, sm, sc, osp_ops_get()->name, d);
}

static void test_argmax_edges(void **st) {
    (void)st;
    enum { N = 1000 }; /* past every vector width, with a tail */
    static float x[N];
    uint64_t rng = 12345;
    for (int i = 0; i < N; i++) {
        rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
        x[i] = (float)((int64_t)(rng % 20001) - 10000) / 1000.0f - 20.0f; /* in [-30, -10] */
    }
    int32_t r0 = ref_argmax(x, N);
    check_rule(x, N, r0, "random");
    x[5] = x[17] = x[900] = 3.0f;
    check_rule(x, N, 5, "ties");
    x[5] = NAN;
    check_rule(x, N, 17, "a NaN on the first maximum");
    x[0] = NAN, x[N - 1] = NAN, x[16] = NAN;
    check_rule(x, N, 17, "NaN around");
    x[999] = 3.0f;
    x[N - 1] = 3.5f;
    check_rule(x, N, N - 1, "the last");
    x[3] = INFINITY, x[7] = INFINITY;
    check_rule(x, N, 3, "infinities tie");
    for (int i = 0; i < N; i++) x[i] = NAN;
    check_rule(x, N, 0, "all NaN");
    for (int i = 0; i < N; i++) x[i] = -INFINITY;
    check_rule(x, N, 0, "all -inf");
    x[0] = NAN;
    check_rule(x, N, 1, "NaN then -inf");
    for (int i = 0; i < N; i++) x[i] = -1.0f;
    x[2] = -0.0f, x[700] = 0.0f;
    check_rule(x, N, 2, "-0 before +0");
    x[1] = 0.0f;
    check_rule(x, N, 1, "+0 before -0");
    for (int i = 0; i < N; i++) x[i] = 0.25f;
    check_rule(x, N, 0, "flat");
    for (int n = 1; n < 40; n++) { /* short rows: every tail length */
        for (int i = 0; i < n; i++) x[i] = (float)(i % 3);
        check_rule(x, n, n >= 3 ? 2 : n - 1, "short");
    }
}

static void test_takes_argmax(void **st) {
    (void)st;
    osp_sampler_params p = osp_sampler_defaults();
    assert_true(osp_sampler_is_argmax(&p));
    p.temperature = 0.7f;
    assert_false(osp_sampler_is_argmax(&p));
    p = osp_sampler_defaults();
    osp_bias b = {3, 1.0f};
    p.logit_bias = &b, p.n_logit_bias = 1;
    assert_false(osp_sampler_is_argmax(&p));
    p = osp_sampler_defaults();
    p.repetition_penalty = 1.0f;
    assert_true(osp_sampler_is_argmax(&p));
    p.repetition_penalty = 1.1f;
    assert_false(osp_sampler_is_argmax(&p));
    p.repetition_context = 0;
    assert_true(osp_sampler_is_argmax(&p));
    p = osp_sampler_defaults();
    p.presence_penalty = 0.5f;
    assert_false(osp_sampler_is_argmax(&p));
    p = osp_sampler_defaults();
    p.frequency_penalty = -0.5f;
    assert_false(osp_sampler_is_argmax(&p));
    p.frequency_context = 0;
    assert_true(osp_sampler_is_argmax(&p));
    p = osp_sampler_defaults();
    p.top_k = 5, p.top_p = 0.5f, p.min_p = 0.1f; /* filters do not move the maximum */
    assert_true(osp_sampler_is_argmax(&p));
}

/* One step's check: ids against the sampler on the plain logits; wanted rows' logits bitwise. */
static long n_checked;
static void check_step(const char *name, int fast, int32_t step, int32_t nb, const float *plain, const float *lb,
                       const int32_t *got, const uint8_t *need, int32_t V) {
    for (int32_t b = 0; b < nb; b++) {
        const float *l = plain + (int64_t)b * V;
        int32_t want = sampler_greedy(l, V);
        n_checked += 1 + (need && need[b]);
        if (got[b] != want)
            fail_msg("%s (%s): step %d row %d: ids out %d, the sampler %d", name, fast ? "fast" : "reference", step, b,
                     got[b], want);
        if (need && need[b] && memcmp(l, lb + (int64_t)b * V, sizeof(float) * V))
            fail_msg("%s (%s): step %d row %d: the wanted logits differ", name, fast ? "fast" : "reference", step, b);
    }
}

static void run_model(const char *name, int fast) {
    char dir[256];
    snprintf(dir, sizeof dir, "data/goldens/%s", name);
    osp_model *m;
    golden g;
    assert_int_equal(osp_model_load(dir, &m), OSP_OK);
    assert_int_equal(golden_load(dir, &g), 0);
    const int32_t T = g.T, V = g.vocab;
    osp_session *sa, *sb;
    assert_int_equal(osp_session_new(m, R, T, &sa), OSP_OK);
    assert_int_equal(osp_session_new(m, R, T, &sb), OSP_OK);
    osp_session_set_fast(sa, fast);
    osp_session_set_fast(sb, fast);
    float *la = malloc(sizeof(float) * R * V), *lb = malloc(sizeof(float) * R * V);
    int32_t got[R], rows[R], ids[R], len[R] = {1, 4, 7};
    uint8_t need[R];
    for (int32_t b = 0; b < R; b++) { /* prefills, alone: ids only, then with logits */
        assert_int_equal(osp_forward_rows(sa, &b, 1, g.ids, len[b], 0, la), OSP_OK);
        need[0] = b % 2;
        assert_int_equal(osp_forward_rows_ids(sb, &b, 1, g.ids, len[b], need, lb, got), OSP_OK);
        check_step(name, fast, -1, 1, la, lb, got, need, V);
    }
    /* decode together, teacher-forced (each row at its own position), the mask changing every step */
    for (int32_t step = 0; step + len[R - 1] < T; step++) {
        for (int32_t b = 0; b < R; b++) {
            rows[b] = b;
            ids[b] = g.ids[len[b] + step];
            need[b] = (step + b) % 3 == 0;
        }
        assert_int_equal(osp_forward_rows(sa, rows, R, ids, 1, 0, la), OSP_OK);
        assert_int_equal(osp_forward_rows_ids(sb, rows, R, ids, 1, step % 4 == 3 ? NULL : need, lb, got), OSP_OK);
        check_step(name, fast, step, R, la, lb, got, step % 4 == 3 ? NULL : need, V);
    }
    free(la), free(lb);
    osp_session_free(sa), osp_session_free(sb);
    golden_free(&g);
    osp_model_free(m);
}

static void test_goldens(void **st) {
    (void)st;
    for (size_t i = 0; i < N_GOLDEN_MODELS; i++)
        for (int fast = 0; fast < 2; fast++) run_model(GOLDEN_MODELS[i], fast);
    print_message("%ld ids and logit rows checked\n", n_checked);
}

/* ---- chains of greedy steps against plain ids out ---- */

#define CHAIN_CTX 20 /* past the sliding goldens' window of 8 */
#define CHAIN_STEPS (CHAIN_CTX - 7)

static long n_chained;

static osp_session *chain_session(osp_model *m, int fast, int spare) {
    osp_session_opts o = {.n_rows = R, .max_ctx = CHAIN_CTX, .spare = spare};
    osp_session *s;
    assert_int_equal(osp_session_new_opts(m, &o, &s), OSP_OK);
    osp_session_set_fast(s, fast);
    return s;
}

/* rows prefilled alone (1, 4 and 7 prompt tokens), their first greedy tokens into first */
static void chain_prefill(osp_session *s, const golden *g, float *lg, int32_t *first) {
    static const int32_t len[R] = {1, 4, 7};
    for (int32_t b = 0; b < R; b++) assert_int_equal(osp_forward_rows_ids(s, &b, 1, g->ids, len[b], NULL, lg, first + b), OSP_OK);
}

static void chain_model(const char *name, int fast, int spare, int ahead) {
    char dir[256], what[160];
    snprintf(dir, sizeof dir, "data/goldens/%s", name);
    snprintf(what, sizeof what, "%s (%s, spare %d, %s)", name, fast ? "fast" : "reference", spare,
             ahead ? "ahead" : "from the host");
    osp_options_set("OSP_CHAIN", ahead ? "1" : "0"); /* (read by each session's first chain) */
    osp_model *m;
    golden g;
    assert_int_equal(osp_model_load(dir, &m), OSP_OK);
    assert_int_equal(golden_load(dir, &g), 0);
    const int32_t V = osp_model_get_info(m)->vocab;
    float *lg = malloc(sizeof(float) * R * V);
    int32_t rows[R] = {0, 1, 2}, first[R], f2[R], cur[R], tok[CHAIN_STEPS][R], got[R];
    /* plain greedy steps until the longest row fills the context */
    osp_session *sa = chain_session(m, fast, spare);
    chain_prefill(sa, &g, lg, first);
    memcpy(cur, first, sizeof cur);
    for (int32_t k = 0; k < CHAIN_STEPS; k++) {
        assert_int_equal(osp_forward_rows_ids(sa, rows, R, cur, 1, NULL, lg, tok[k]), OSP_OK);
        memcpy(cur, tok[k], sizeof cur);
    }
    assert_int_equal(osp_session_row_pos(sa, 2), CHAIN_CTX);
    /* the whole way as a chain: step k's tokens come back with call k + 1, the last with the end */
    osp_session *sb = chain_session(m, fast, spare);
    chain_prefill(sb, &g, lg, f2);
    assert_memory_equal(first, f2, sizeof first);
    assert_int_equal(osp_forward_rows_chain(sb, rows, R, first, lg, NULL), OSP_OK);
    assert_int_equal(osp_forward_rows(sb, rows, R, first, 1, 0, lg), OSP_ERR_INVALID); /* in flight: refused */
    assert_int_equal(osp_forward_rows_ids(sb, rows, R, first, 1, NULL, lg, got), OSP_ERR_INVALID);
    int32_t other[R] = {2, 1, 0};
    assert_int_equal(osp_forward_rows_chain(sb, other, R, NULL, lg, got), OSP_ERR_INVALID);
    assert_int_equal(osp_forward_rows_chain(sb, rows, R, first, lg, NULL), OSP_ERR_INVALID); /* one chain at a time */
    for (int32_t k = 1; k < CHAIN_STEPS; k++) {
        assert_int_equal(osp_forward_rows_chain(sb, rows, R, NULL, lg, got), OSP_OK);
        if (memcmp(got, tok[k - 1], sizeof got))
            fail_msg("%s: chained step %d: %d %d %d, plain %d %d %d", what, k - 1, got[0], got[1], got[2], tok[k - 1][0],
                     tok[k - 1][1], tok[k - 1][2]);
        n_chained += R;
    }
    assert_int_equal(osp_forward_rows_chain(sb, rows, R, NULL, lg, got), OSP_OK); /* the last step's tokens */
    assert_memory_equal(got, tok[CHAIN_STEPS - 1], sizeof got);
    assert_int_equal(osp_forward_chain_queued(sb), 0); /* (the longest row is at the context's end) */
    assert_int_equal(osp_forward_rows_chain(sb, rows, R, NULL, lg, got), OSP_ERR_RANGE); /* no room: it ends */
    for (int32_t b = 0; b < R; b++) assert_int_equal(osp_session_row_pos(sb, b), osp_session_row_pos(sa, b));
    assert_int_equal(osp_forward_rows_chain(sb, rows, R, NULL, lg, got), OSP_ERR_INVALID); /* ended */
    assert_int_equal(osp_forward_chain_end(sb, 1, lg, got), OSP_OK);                     /* (none: nothing) */
    /* stopped early: the step fed with the last tokens given back is undone, and plain steps go on from there */
    for (int32_t stop = 2; stop < CHAIN_STEPS - 1; stop += 8) { /* (before the window, and past it) */
        osp_session *sc = chain_session(m, fast, spare);
        chain_prefill(sc, &g, lg, f2);
        assert_int_equal(osp_forward_rows_chain(sc, rows, R, first, lg, NULL), OSP_OK);
        for (int32_t k = 1; k <= stop; k++) {
            assert_int_equal(osp_forward_rows_chain(sc, rows, R, NULL, lg, got), OSP_OK);
            assert_memory_equal(got, tok[k - 1], sizeof got);
        }
        int keep = stop < 8; /* the first stop point finishes the step fed with the last tokens, the second undoes it */
        assert_int_equal(osp_forward_chain_end(sc, keep, lg, keep ? got : NULL), OSP_OK);
        if (keep) assert_memory_equal(got, tok[stop], sizeof got);
        assert_int_equal(osp_session_row_pos(sc, 2), 7 + stop + keep);
        memcpy(cur, got, sizeof cur);
        for (int32_t k = stop + keep; k < CHAIN_STEPS; k++) {
            assert_int_equal(osp_forward_rows_ids(sc, rows, R, cur, 1, NULL, lg, got), OSP_OK);
            if (memcmp(got, tok[k], sizeof got)) fail_msg("%s: stopped after %d, plain step %d differs", what, stop, k);
            memcpy(cur, got, sizeof cur);
        }
        osp_session_free(sc);
    }
    free(lg);
    osp_session_free(sa), osp_session_free(sb);
    golden_free(&g);
    osp_model_free(m);
    osp_options_set("OSP_CHAIN", NULL);
}

static void test_chain(void **st) {
    (void)st;
    for (size_t i = 0; i < N_GOLDEN_MODELS; i++)
        for (int fast = 0; fast < 2; fast++) {
            int sliding = !strncmp(GOLDEN_MODELS[i], "gemma", 5);
            chain_model(GOLDEN_MODELS[i], fast, 0, 1);
            if (sliding) chain_model(GOLDEN_MODELS[i], fast, 1, fast); /* (a spare slot: queued past the window) */
        }
    print_message("%ld chained tokens checked\n", n_chained);
}

/* ---- a stream fed ids against one fed logits ---- */

static const int32_t PROMPT[] = {2, 3, 3428, 204, 791, 352, 264, 860, 19, 4, 204, 3, 82, 339, 342, 204};
#define NP ((int32_t)(sizeof PROMPT / sizeof *PROMPT))

typedef struct out {
    char text[4096];
    size_t len;
    int32_t tokens[512];
    int n, calls;
} out;

static int collect(void *user, int32_t token, const char *text, size_t len) {
    out *o = user;
    o->calls++;
    if (token >= 0 && o->n < 512) o->tokens[o->n++] = token;
    assert_true(o->len + len < sizeof o->text);
    memcpy(o->text + o->len, text, len);
    o->len += len;
    o->text[o->len] = 0;
    return 0;
}

/* The loop osp_generate ran before ids out: logits to the stream. */
static osp_gen_stats by_logits(osp_model *m, const osp_tokenizer *tok, const osp_gen_params *p, out *o) {
    osp_session *s;
    assert_int_equal(osp_session_new(m, 1, 256, &s), OSP_OK);
    osp_session_set_fast(s, 1);
    float *lg = malloc(sizeof(float) * osp_model_get_info(m)->vocab);
    osp_stream *g;
    assert_int_equal(osp_stream_new(m, tok, PROMPT, NP, 256, p, collect, o, &g), OSP_OK);
    assert_int_equal(osp_forward(s, PROMPT, NP, 0, lg), OSP_OK);
    int32_t next;
    osp_status rc;
    while (osp_stream_next(g, lg, osp_session_row_pos(s, 0), &next, &rc))
        assert_int_equal(osp_forward(s, &next, 1, 0, lg), OSP_OK);
    assert_int_equal(rc, OSP_OK);
    osp_gen_stats st = *osp_stream_stats(g);
    osp_stream_free(g);
    free(lg);
    osp_session_free(s);
    return st;
}

static void test_stream(void **st) {
    (void)st;
    osp_model *m;
    osp_tokenizer *tok;
    assert_int_equal(osp_model_load("../models/fortune", &m), OSP_OK);
    assert_int_equal(osp_tokenizer_load("../models/fortune", &tok), OSP_OK);
    const char *stops[] = {" plants"};
    for (int variant = 0; variant < 3; variant++) {
        int32_t eos[32];
        osp_gen_params p;
        assert_int_equal(osp_gen_defaults(m, tok, &p, eos), OSP_OK);
        p.sampler = osp_sampler_defaults();
        p.max_tokens = variant == 2 ? 9 : 64;
        if (variant == 1) p.stop = stops, p.n_stop = 1;
        out a, b;
        memset(&a, 0, sizeof a), memset(&b, 0, sizeof b);
        osp_gen_stats sa = by_logits(m, tok, &p, &a), sb;
        osp_session *s;
        assert_int_equal(osp_session_new(m, 1, 256, &s), OSP_OK);
        osp_session_set_fast(s, 1);
        assert_int_equal(osp_generate(s, tok, PROMPT, NP, &p, collect, &b, &sb), OSP_OK); /* ids out */
        osp_session_free(s);
        assert_true(a.n > 0);
        assert_int_equal(a.n, b.n);
        assert_int_equal(a.calls, b.calls);
        assert_memory_equal(a.tokens, b.tokens, sizeof(int32_t) * a.n);
        assert_string_equal(a.text, b.text);
        assert_int_equal(sa.finish, sb.finish);
        assert_int_equal(sa.n_generated, sb.n_generated);
        assert_int_equal(sa.n_prompt, sb.n_prompt);
        assert_int_equal(sa.finish, variant == 2 ? OSP_FINISH_LENGTH : OSP_FINISH_STOP);
    }
    osp_tokenizer_free(tok);
    osp_model_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_argmax_edges),
        cmocka_unit_test(test_takes_argmax),
        cmocka_unit_test(test_goldens),
        cmocka_unit_test(test_chain),
        cmocka_unit_test(test_stream),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
