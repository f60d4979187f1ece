/* The bundled default model (models/fortune, a trained Gemma 3): the
 * reference's last-position logits for three chat prompts and its 24
 * greedy steps, through the KV cache. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include "golden.h"
#include "osprey.h"

static void test_fortune(void **state) {
    (void)state;
    osp_model *m;
    if (osp_model_load("../models/fortune", &m) != OSP_OK) fail_msg("%s", osp_last_error());
    osp_st *g;
    assert_int_equal(osp_st_open_file("../models/fortune/golden.safetensors", &g), OSP_OK);
    int32_t V = osp_model_get_info(m)->vocab;
    float *lg = malloc(sizeof(float) * V), *ref = malloc(sizeof(float) * V);
    for (int i = 0; i < 3; i++) {
        char k[64];
        int32_t np = 0, ng = 0;
        snprintf(k, sizeof k, "prompt%d_ids", i);
        int32_t *prompt = golden_copy_i32(osp_st_find(g, k), &np);
        snprintf(k, sizeof k, "gen%d_ids", i);
        int32_t *gen = golden_copy_i32(osp_st_find(g, k), &ng);
        snprintf(k, sizeof k, "prompt%d_last_logits", i);
        const osp_st_tensor *t = osp_st_find(g, k);
        assert_non_null(prompt);
        assert_non_null(gen);
        assert_non_null(t);
        assert_int_equal(t->numel, V);
        memcpy(ref, t->data, t->nbytes);
        osp_session *s;
        assert_int_equal(osp_session_new(m, 1, np + ng, &s), OSP_OK);
        assert_int_equal(osp_forward(s, prompt, np, 0, lg), OSP_OK);
        double r = golden_pos_ratio(ref, lg, V);
        print_message("prompt %d: last logits at %.4f of the tolerance\n", i, r);
        if (r > 1) fail_msg("prompt %d: last logits off by %.2fx the tolerance", i, r);
        for (int32_t j = 0; j < ng; j++) {
            int best = argmax_f(lg, V);
            double mx = 0;
            for (int32_t v = 0; v < V; v++) mx = fabs(lg[v]) > mx ? fabs(lg[v]) : mx;
            if (best != gen[j] && lg[best] - lg[gen[j]] > GOLDEN_MARGIN + 2 * GOLDEN_TOL * (mx > 1 ? mx : 1))
                fail_msg("prompt %d step %d: ours %d, reference %d", i, j, best, gen[j]);
            assert_int_equal(osp_forward(s, &gen[j], 1, 0, lg), OSP_OK);
        }
        osp_session_free(s);
        free(prompt);
        free(gen);
    }
    free(lg);
    free(ref);
    osp_st_close(g);
    osp_model_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_fortune)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
