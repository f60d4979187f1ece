/* The affine-quantized KV cache (8 and 4 bits), and the 16-bit one, on the bundled model, a
 * trained Gemma 3 (head_dim 64; the tiny goldens' head_dim of 16 is below
 * MLX's smallest group of 32):
 *  - against the reference's golden logits (prompts fed token by token, so
 *    every step attends over quantized positions): KL per prompt;
 *  - along a 400-token sequence (past the 256-token sliding window, so the
 *    rings wrap; 300 on the CUDA emulator) against the full-precision cache:
 *    KL at every position;
 *  - KV bytes per token at 4 bits at least 3.5x below bf16;
 *  - row operations on quantized planes (extract + merge, rollback) change
 *    nothing: the logits after them are bitwise those without them.
 * The bounds are what we measured with a margin (README, Numerics). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include "golden.h"
#include "osprey.h"

#define MODEL "../models/fortune"
#ifdef OSP_CUDA_EMU
/* built on the CUDA emulator (scripts/test-cuemu.sh, one core for minutes): 300 positions, still past the window
 * of 256 (the rings wrap), under the same bounds; the CPU and a GPU run 400 */
#define LONG 300
#else
#define LONG 400
#endif

/* Bounds: the measured values (the same with the scalar, AVX2 and AVX-512
 * kernels) times 2, where a bound measured earlier no longer held. Measured
 * 2026-12-04, with the f32 RoPE frequencies and embedding scale (issue 15):
 * vs goldens 1.69e-4 (8-bit), 1.5e-2 (4-bit), 6.4e-6 (bf16); along 400
 * positions mean 5.4e-3 / 0.41 / 2.2e-4, max 0.339 / 4.0 / 2.4e-3. The 400
 * tokens are the f32 cache's own greedy continuation, so they changed with
 * the constants: the 8-bit max is one position (202) where the cache moves
 * the top logit by 1.3 and the top-1 token flips; the next worst is 0.09
 * (the earlier sequence measured 2.9e-2 at worst, mean 3.6e-3). This small
 * model's keys have wide ranges per head vector, so 4-bit keys hurt it badly
 * (README). */
static const int BITS[3] = {8, 4, 16}; /* 16: the unquantized bf16 cache, measured the same way */
static const double KL_GOLDEN_MAX[3] = {2.5e-4, 3.6e-2, 2e-5}; /* last prompt position */
static const double KL_SEQ_MEAN[3] = {7e-3, 1.0, 4e-4};        /* along the long sequence */
static const double KL_SEQ_MAX[3] = {0.7, 11.0, 1.2e-2};

static osp_session *session(osp_model *m, int bits, int32_t rows, int32_t ctx) {
    osp_session_opts o = {.n_rows = rows, .max_ctx = ctx, .kv_bits = bits, .kv_group = 64, .spare = 4};
    osp_session *s;
    assert_int_equal(osp_session_new_opts(m, &o, &s), OSP_OK);
    return s;
}

/* Feed ids one at a time; logits of every position into out [n, V]. */
static void feed(osp_session *s, const int32_t *ids, int32_t n, float *out, int32_t V) {
    for (int32_t t = 0; t < n; t++) assert_int_equal(osp_forward(s, ids + t, 1, 0, out + (int64_t)t * V), OSP_OK);
}

static void test_against_goldens(void **state) {
    (void)state;
    osp_model *m;
    assert_int_equal(osp_model_load(MODEL, &m), OSP_OK);
    int32_t V = osp_model_get_info(m)->vocab;
    osp_st *st;
    assert_int_equal(osp_st_open_file(MODEL "/golden.safetensors", &st), OSP_OK);
    float *lg = malloc(sizeof(float) * 64 * V);
    for (int bi = 0; bi < 3; bi++) {
        double worst = 0;
        for (int p = 0; p < 3; p++) {
            char name[64];
            int32_t n = 0;
            snprintf(name, sizeof name, "prompt%d_ids", p);
            int32_t *ids = golden_copy_i32(osp_st_find(st, name), &n);
            snprintf(name, sizeof name, "prompt%d_last_logits", p);
            const osp_st_tensor *ref = osp_st_find(st, name);
            float *r = malloc(ref->nbytes);
            memcpy(r, ref->data, ref->nbytes);
            osp_session *s = session(m, BITS[bi], 1, 128);
            feed(s, ids, n, lg, V);
            double k = golden_kl(r, lg + (int64_t)(n - 1) * V, V);
            worst = k > worst ? k : worst;
            osp_session_free(s);
            free(r);
            free(ids);
        }
        printf("KV %d-bit vs goldens: max KL %.3g (bound %.3g)\n", BITS[bi], worst, KL_GOLDEN_MAX[bi]);
        assert_true(worst < KL_GOLDEN_MAX[bi]);
    }
    free(lg);
    osp_st_close(st);
    osp_model_free(m);
}

static void test_long_sequence(void **state) {
    (void)state;
    osp_model *m;
    assert_int_equal(osp_model_load(MODEL, &m), OSP_OK);
    int32_t V = osp_model_get_info(m)->vocab;
    float *ref = malloc(sizeof(float) * LONG * V), *got = malloc(sizeof(float) * LONG * V);
    int32_t ids[LONG];
    /* the sequence: greedy continuation of a prompt, by the full-precision cache */
    osp_session *s = session(m, 0, 1, LONG + 1);
    ids[0] = 2;
    for (int32_t t = 0; t < LONG; t++) {
        assert_int_equal(osp_forward(s, ids + t, 1, 0, ref + (int64_t)t * V), OSP_OK);
        if (t + 1 < LONG) {
            int32_t best = 0;
            for (int32_t j = 1; j < V; j++) best = ref[(int64_t)t * V + j] > ref[(int64_t)t * V + best] ? j : best;
            ids[t + 1] = best == 1 || best == 4 ? 10 + t % 50 : best; /* no eos: keep going */
        }
    }
    int64_t f32_bytes = osp_session_kv_row_bytes(s, LONG);
    osp_session_free(s);
    for (int bi = 0; bi < 3; bi++) {
        int bits = BITS[bi];
        s = session(m, bits, 1, LONG + 1);
        feed(s, ids, LONG, got, V);
        double sum = 0, worst = 0;
        for (int32_t t = 0; t < LONG; t++) {
            double k = golden_kl(ref + (int64_t)t * V, got + (int64_t)t * V, V);
            sum += k;
            worst = k > worst ? k : worst;
        }
        int64_t qb = osp_session_kv_row_bytes(s, LONG);
        double shrink = (double)f32_bytes / 2 / (double)qb; /* vs a bf16 cache */
        printf("KV %d-bit over %d positions: mean KL %.3g (bound %.3g), max %.3g (bound %.3g); %.2fx smaller than "
               "bf16\n", bits, LONG, sum / LONG, KL_SEQ_MEAN[bi], worst, KL_SEQ_MAX[bi], shrink);
        assert_true(sum / LONG < KL_SEQ_MEAN[bi]);
        assert_true(worst < KL_SEQ_MAX[bi]);
        if (bits == 4) assert_true(shrink >= 3.5);
        if (bits == 16) assert_true(shrink == 1.0);
        assert_int_equal(osp_session_kv_bytes(s), qb);
        osp_session_free(s);
    }
    free(ref);
    free(got);
    osp_model_free(m);
}

/* Row operations work on the planes as stored: after extract + merge and a
 * rolled-back speculative round, the logits are bitwise the plain ones. */
static void test_row_ops(void **state) {
    (void)state;
    osp_model *m;
    assert_int_equal(osp_model_load(MODEL, &m), OSP_OK);
    int32_t V = osp_model_get_info(m)->vocab;
    enum { N = 300 };
    int32_t ids[N + 4];
    for (int32_t i = 0; i < N + 4; i++) ids[i] = 5 + (i * 37) % 400;
    float *a = malloc(sizeof(float) * 4 * V), *b = malloc(sizeof(float) * 4 * V);
    for (int bi = 0; bi < 3; bi++) {
        int bits = BITS[bi];
        osp_session *plain = session(m, bits, 1, N + 8), *two = session(m, bits, 2, N + 8);
        osp_session_set_fast(plain, 1); /* batched decode bitwise as alone */
        osp_session_set_fast(two, 1);
        assert_int_equal(osp_forward(plain, ids, N, 0, a), OSP_OK);
        int32_t r1 = 1;
        assert_int_equal(osp_forward_rows(two, &r1, 1, ids, N, 0, b), OSP_OK);
        osp_session *x, *merged;
        assert_int_equal(osp_session_extract_row(two, 1, &x), OSP_OK);
        const osp_session *parts[2] = {x, x};
        assert_int_equal(osp_session_merge(parts, 2, &merged), OSP_OK);
        osp_session_round_begin(merged);
        int32_t spec[6] = {ids[N], 7, 9, ids[N], 11, 13};
        assert_int_equal(osp_forward(merged, spec, 3, 0, b), OSP_OK);
        int32_t keep[2] = {0, 0};
        assert_int_equal(osp_session_rollback(merged, keep), OSP_OK);
        int32_t nx[2] = {ids[N], ids[N]};
        assert_int_equal(osp_forward(merged, nx, 1, 0, b), OSP_OK);
        assert_int_equal(osp_forward(plain, &ids[N], 1, 0, a), OSP_OK);
        assert_memory_equal(a, b, sizeof(float) * V);
        assert_memory_equal(a, b + V, sizeof(float) * V);
        osp_session_free(x);
        osp_session_free(merged);
        osp_session_free(plain);
        osp_session_free(two);
    }
    free(a);
    free(b);
    osp_model_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_against_goldens),
        cmocka_unit_test(test_long_sequence),
        cmocka_unit_test(test_row_ops),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
