/* Shapes the goldens do not have: each golden checkpoint with its sliding
 * window widened to 16 (so rings wrap at another size) run over 72
 * positions (past every window several times). There is no reference for
 * these, so the check is that every way of running the same sequence agrees
 * with the whole-sequence prefill at the goldens' reference-precision bound:
 * token-by-token decode (the rings), chunks of 5 and 16 (a chunk attending
 * across the ring's wrap), and two batched rows at different positions.
 * Decode reads the rings, a prefill chunk attends to its own rows and the
 * ring, so a bug in either store shows up as a disagreement; what the window
 * means (the mask itself, shared by every path) is pinned by the goldens. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <jansson.h>
#include <sys/stat.h>
#include "golden.h"
#include "osprey.h"

#define T 72
#define WINDOW 16

typedef struct shapes {
    char tmp[256];
} shapes;

static int setup(void **state) {
    shapes *s = calloc(1, sizeof *s);
    if (!s || test_tmpdir_make(s->tmp, sizeof s->tmp, "shapes") != 0) return -1;
    *state = s;
    return 0;
}

static int teardown(void **state) {
    shapes *s = *state;
    int rc = test_tmpdir_remove(s->tmp);
    free(s);
    return rc;
}

/* DIR/NAME: the golden's config with sliding_window = WINDOW (where it has
 * one) and its weights linked in. */
static void make_variant(const char *tmp, const char *name, char *dir, size_t n) {
    char src[512], p[1024], w[1024];
    snprintf(src, sizeof src, "data/goldens/%s", name);
    snprintf(dir, n, "%s/%s", tmp, name);
    assert_int_equal(mkdir(dir, 0755), 0);
    snprintf(p, sizeof p, "%s/config.json", src);
    json_error_t je;
    json_t *cfg = json_load_file(p, 0, &je);
    assert_non_null(cfg);
    json_t *tc = json_object_get(cfg, "text_config");
    if (!json_is_object(tc)) tc = cfg;
    if (json_is_integer(json_object_get(tc, "sliding_window")))
        json_object_set_new(tc, "sliding_window", json_integer(WINDOW));
    snprintf(p, sizeof p, "%s/config.json", dir);
    assert_int_equal(json_dump_file(cfg, p, JSON_INDENT(1)), 0);
    json_decref(cfg);
    char *abs = realpath(src, NULL);
    assert_non_null(abs);
    snprintf(w, sizeof w, "%s/model.safetensors", abs);
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    assert_int_equal(symlink(w, p), 0);
    free(abs);
}

static double worst_vs(const float *ref, const float *got, int32_t n, int32_t V) {
    double w = 0;
    for (int32_t t = 0; t < n; t++) {
        double r = golden_pos_ratio(ref + (int64_t)t * V, got + (int64_t)t * V, V);
        w = r > w || r != r ? r : w;
    }
    return w;
}

/* Run ids in chunks of `chunk`; logits of every position into out. */
static void run_chunked(const osp_model *m, const int32_t *ids, int32_t chunk, float *out, int32_t V) {
    osp_session *s;
    assert_int_equal(osp_session_new(m, 1, T, &s), OSP_OK);
    for (int32_t t0 = 0; t0 < T; t0 += chunk) {
        int32_t k = T - t0 < chunk ? T - t0 : chunk;
        assert_int_equal(osp_forward(s, ids + t0, k, 1, out + (int64_t)t0 * V), OSP_OK);
    }
    osp_session_free(s);
}

static void check_model(const char *tmp, const char *name) {
    char dir[512];
    make_variant(tmp, name, dir, sizeof dir);
    osp_model *m;
    if (osp_model_load(dir, &m) != OSP_OK) fail_msg("%s: %s", dir, osp_last_error());
    const osp_model_info *in = osp_model_get_info(m);
    int32_t V = in->vocab;
    int32_t ids[T];
    for (int32_t t = 0; t < T; t++) ids[t] = (t * 37 + 11) % V;
    float *ref = malloc(sizeof(float) * T * V), *got = malloc(sizeof(float) * 2 * T * V);
    run_chunked(m, ids, T, ref, V);
    const int32_t chunks[] = {1, 5, 16};
    double worst = 0;
    for (size_t i = 0; i < sizeof chunks / sizeof *chunks; i++) {
        run_chunked(m, ids, chunks[i], got, V);
        double w = worst_vs(ref, got, T, V);
        worst = fmax(worst, w);
        if (!(w <= 1)) fail_msg("%s, window %d: chunks of %d off by %.2fx the bound", name, WINDOW, chunks[i], w);
    }
    /* two rows: row 0 runs 23 positions ahead, then both advance by 3 */
    const int32_t lead = 23, step = 3;
    osp_session *s;
    assert_int_equal(osp_session_new(m, 2, T, &s), OSP_OK);
    int32_t b0 = 0;
    assert_int_equal(osp_forward_rows(s, &b0, 1, ids, lead, 1, got), OSP_OK);
    double w = worst_vs(ref, got, lead, V);
    int32_t in2[2 * step];
    for (int32_t p1 = 0; p1 + lead + step <= T; p1 += step) {
        for (int32_t t = 0; t < step; t++) in2[t] = ids[p1 + lead + t], in2[step + t] = ids[p1 + t];
        assert_int_equal(osp_forward(s, in2, step, 1, got), OSP_OK);
        double w0 = worst_vs(ref + (int64_t)(p1 + lead) * V, got, step, V);
        double w1 = worst_vs(ref + (int64_t)p1 * V, got + (int64_t)step * V, step, V);
        w = fmax(w, fmax(w0, w1));
    }
    if (!(w <= 1)) fail_msg("%s, window %d: batched rows off by %.2fx the bound", name, WINDOW, w);
    print_message("%-16s window %d, %d positions: every mode within %.4f of the bound\n", name, WINDOW, T, fmax(worst, w));
    osp_session_free(s);
    free(ref);
    free(got);
    osp_model_free(m);
}

static void test_shapes(void **state) {
    shapes *s = *state;
    for (size_t i = 0; i < N_GOLDEN_MODELS; i++) check_model(s->tmp, GOLDEN_MODELS[i]);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test_setup_teardown(test_shapes, setup, teardown)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
