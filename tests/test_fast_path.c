/* The production path (int8 activations for MLX 4/8-bit weights, see
 * backend/q8act.h) against the goldens, with the goldens' second-tier
 * bounds: per-position KL(ref || ours) of the softmaxed logits <= 1e-3 on
 * average and <= 1e-2 at worst, and the same top-1 token wherever the
 * reference's top-2 margin exceeds 0.05. Decode mode (one token per step),
 * chunks of 4 and the whole prompt in one prefill: the fast path serves
 * every shape. The same bounds hold for the 16-bit (bf16) KV cache. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <string.h>
#include "golden.h"
#include "osprey.h"

static void check_model(const char *name, int32_t chunk, int fast, int kv_bits) {
    char dir[256];
    snprintf(dir, sizeof dir, "data/goldens/%s", name);
    osp_model *m;
    golden g;
    if (osp_model_load(dir, &m) != OSP_OK) fail_msg("%s", osp_last_error());
    assert_int_equal(golden_load(dir, &g), 0);
    int32_t V = g.vocab;
    osp_session *s;
    osp_session_opts so = {.n_rows = 1, .max_ctx = g.T, .kv_bits = kv_bits};
    assert_int_equal(osp_session_new_opts(m, &so, &s), OSP_OK);
    osp_session_set_fast(s, fast);
    float *out = malloc(sizeof(float) * g.T * V);
    for (int32_t t0 = 0; t0 < g.T; t0 += chunk) {
        int32_t n = g.T - t0 < chunk ? g.T - t0 : chunk;
        assert_int_equal(osp_forward(s, g.ids + t0, n, 1, out + (int64_t)t0 * V), OSP_OK);
    }
    double sum = 0, worst = 0, maxerr = 0;
    int top1_bad = 0;
    for (int32_t t = 0; t < g.T; t++) {
        const float *r = g.logits + (int64_t)t * V, *o = out + (int64_t)t * V;
        double k = golden_kl(r, o, V);
        sum += k;
        worst = fmax(worst, k);
        int a = argmax_f(r, V), b = argmax_f(o, V);
        float second = -INFINITY;
        for (int32_t i = 0; i < V; i++)
            if (i != a) second = fmaxf(second, r[i]);
        if (a != b && r[a] - second > 0.05f) top1_bad++;
        for (int32_t i = 0; i < V; i++) maxerr = fmax(maxerr, fabs((double)r[i] - o[i]));
    }
    printf("  %-16s %s, KV %s, chunk %d: KL mean %.2e, max %.2e; max |dlogit| %.3g; top-1 mismatches %d\n", name,
           fast ? "fast" : "precise", kv_bits == 16 ? "bf16" : "f32", chunk, sum / g.T,
           worst, maxerr, top1_bad);
    if (sum / g.T > 1e-3 || worst > 1e-2 || top1_bad)
        fail_msg("%s: KL mean %.3g max %.3g, top-1 mismatches %d", name, sum / g.T, worst, top1_bad);
    free(out);
    osp_session_free(s);
    golden_free(&g);
    osp_model_free(m);
}

static void test_fast(void **st) {
    (void)st;
    const char *models[] = {"llama3-q4", "qwen3-q8", "gemma3-q4", "gemma4-e-q4", "gemma4-e-q8", "gemma4-dense-q4"};
    for (size_t i = 0; i < sizeof models / sizeof *models; i++) {
        check_model(models[i], 1, 1, 0);
        check_model(models[i], 4, 1, 0);
        check_model(models[i], 1 << 20, 1, 0);
    }
}

/* bf16 weights in production precision: on a CPU with a bf16 engine (AMX
 * or AVX512-BF16) their activations are rounded to bf16 (backend/cpu/bf16t.h);
 * elsewhere the same f32 kernels as reference precision. Every bf16 golden,
 * each shape. */
static void test_fast_bf16(void **st) {
    (void)st;
    for (size_t i = 0; i < N_GOLDEN_MODELS; i++) {
        if (strstr(GOLDEN_MODELS[i], "-q")) continue;
        check_model(GOLDEN_MODELS[i], 1, 1, 0);
        check_model(GOLDEN_MODELS[i], 4, 1, 0);
        check_model(GOLDEN_MODELS[i], 1 << 20, 1, 0);
    }
}

/* The 16-bit (bf16) KV cache, alone (reference-precision matmuls) and with
 * the fast path, on every golden of the parity suite: token by token (every
 * step attends over stored bf16 positions) and in chunks of 4. */
static void test_kv16(void **st) {
    (void)st;
    for (size_t i = 0; i < N_GOLDEN_MODELS; i++) {
        check_model(GOLDEN_MODELS[i], 1, 0, 16);
        check_model(GOLDEN_MODELS[i], 4, 0, 16);
    }
    check_model("llama3-q4", 1, 1, 16);
    check_model("gemma4-e-q4", 4, 1, 16);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_fast), cmocka_unit_test(test_fast_bf16),
                                       cmocka_unit_test(test_kv16)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
