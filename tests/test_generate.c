/* The generation loop on the bundled model: greedy output equals the
 * reference continuation's text, stops at the model's end-of-turn, stop
 * strings cut the text exactly (never leaked, never early), max_tokens
 * ends with "length", and a fixed seed reproduces a sampled reply. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>
#include "osprey.h"
#include "text/tokenizer.h"

static osp_model *m;
static osp_tokenizer *tok;
/* "<bos><start_of_turn>user\nTell me a fortune.<end_of_turn>\n<start_of_turn>model\n" */
static const int32_t PROMPT[] = {2, 3, 3428, 204, 791, 352, 264, 860, 19, 4, 204, 3, 82, 339, 342, 204};
#define NP ((int32_t)(sizeof PROMPT / sizeof *PROMPT))
static const char *REPLY = "\"I'd love to go out with you, but I'm having all my plants neutered.\"";

typedef struct out {
    char text[4096];
    size_t len;
    int32_t tokens[512];
    int n;
} out;

static int collect(void *user, int32_t token, const char *text, size_t len) {
    out *o = user;
    if (token >= 0 && o->n < 512) o->tokens[o->n++] = token;
    assert_true(o->len + len < sizeof o->text);
    memcpy(o->text + o->len, text, len);
    o->len += len;
    o->text[o->len] = 0;
    return 0;
}

static osp_gen_stats run(osp_gen_params *p, out *o) {
    osp_session *s;
    assert_int_equal(osp_session_new(m, 1, 256, &s), OSP_OK);
    osp_session_set_fast(s, 1);
    memset(o, 0, sizeof *o);
    osp_gen_stats st;
    assert_int_equal(osp_generate(s, tok, PROMPT, NP, p, collect, o, &st), OSP_OK);
    osp_session_free(s);
    return st;
}

static osp_gen_params greedy(int32_t *eos) {
    osp_gen_params p;
    assert_int_equal(osp_gen_defaults(m, tok, &p, eos), OSP_OK);
    p.sampler.temperature = 0;
    p.max_tokens = 64;
    return p;
}

static void test_greedy_reply(void **st) {
    (void)st;
    int32_t eos[32];
    osp_gen_params p = greedy(eos);
    out o;
    osp_gen_stats s = run(&p, &o);
    assert_string_equal(o.text, REPLY);
    assert_int_equal(s.finish, OSP_FINISH_STOP); /* <end_of_turn> */
    assert_int_equal(s.n_prompt, NP);
}

static void test_stop_string(void **st) {
    (void)st;
    int32_t eos[32];
    osp_gen_params p = greedy(eos);
    const char *stops[] = {" plants", "zzz"};
    p.stop = stops;
    p.n_stop = 2;
    out o;
    osp_gen_stats s = run(&p, &o);
    assert_string_equal(o.text, "\"I'd love to go out with you, but I'm having all my");
    assert_int_equal(s.finish, OSP_FINISH_STOP);
    /* a stop string that never completes costs nothing */
    const char *never[] = {"plants!"};
    p.stop = never;
    p.n_stop = 1;
    run(&p, &o);
    assert_string_equal(o.text, REPLY);
}

static void test_max_tokens(void **st) {
    (void)st;
    int32_t eos[32];
    osp_gen_params p = greedy(eos);
    p.max_tokens = 5;
    out o;
    osp_gen_stats s = run(&p, &o);
    assert_int_equal(s.finish, OSP_FINISH_LENGTH);
    assert_int_equal(s.n_generated, 5);
    assert_true(strncmp(o.text, REPLY, o.len) == 0); /* a prefix of the full reply */
}

static void test_seeded(void **st) {
    (void)st;
    int32_t eos[32];
    osp_gen_params p = greedy(eos);
    p.sampler.temperature = 1.0f;
    p.sampler.seed = 1234;
    out a, b;
    run(&p, &a);
    run(&p, &b);
    assert_int_equal(a.n, b.n);
    assert_memory_equal(a.tokens, b.tokens, sizeof(int32_t) * a.n);
    assert_string_equal(a.text, b.text);
}

static void test_context_overflow(void **st) {
    (void)st;
    osp_session *s;
    assert_int_equal(osp_session_new(m, 1, 8, &s), OSP_OK);
    int32_t eos[32];
    osp_gen_params p = greedy(eos);
    out o;
    osp_gen_stats gs;
    assert_int_equal(osp_generate(s, tok, PROMPT, NP, &p, collect, &o, &gs), OSP_ERR_RANGE);
    osp_session_free(s);
}

static int setup(void **st) {
    (void)st;
    if (osp_model_load("../models/fortune", &m) != OSP_OK) return -1;
    return osp_tokenizer_load("../models/fortune", &tok) == OSP_OK ? 0 : -1;
}

static int teardown(void **st) {
    (void)st;
    osp_tokenizer_free(tok);
    osp_model_free(m);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy_reply), cmocka_unit_test(test_stop_string), cmocka_unit_test(test_max_tokens),
        cmocka_unit_test(test_seeded),       cmocka_unit_test(test_context_overflow),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
