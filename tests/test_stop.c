/* Stop strings over streamed pieces: never leaked, never cut early. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <string.h>
#include "text/stop.h"

/* Feed pieces; returns the concatenated output and whether a stop fired. */
static int run(const char *const *stops, int n, const char *const *pieces, int np, char *out) {
    osp_stop *s;
    assert_int_equal(osp_stop_new(stops, n, &s), OSP_OK);
    out[0] = 0;
    const char *e;
    size_t el;
    int stopped = 0;
    for (int i = 0; i < np && !stopped; i++) {
        stopped = osp_stop_feed(s, pieces[i], strlen(pieces[i]), &e, &el);
        strncat(out, e, el);
    }
    if (!stopped) {
        osp_stop_flush(s, &e, &el);
        strncat(out, e, el);
    }
    osp_stop_free(s);
    return stopped;
}

static void test_split_across_pieces(void **st) {
    (void)st;
    const char *stops[] = {"<end>"};
    const char *p[] = {"Hello <", "en", "d> world"};
    char out[256];
    assert_true(run(stops, 1, p, 3, out));
    assert_string_equal(out, "Hello ");
}

static void test_false_start_not_cut(void **st) {
    (void)st;
    const char *stops[] = {"<end>"};
    const char *p[] = {"a <e", "nx> b <", "en"};
    char out[256];
    assert_false(run(stops, 1, p, 3, out));
    assert_string_equal(out, "a <enx> b <en"); /* held back, then flushed at the end */
}

static void test_prefix_of_another(void **st) {
    (void)st;
    const char *stops[] = {"ab", "abc"};
    const char *p[] = {"xa", "bc"};
    char out[256];
    assert_true(run(stops, 2, p, 2, out));
    assert_string_equal(out, "x"); /* "ab" completes first */
    const char *stops2[] = {"abc", "b"};
    const char *p2[] = {"xa", "bc"};
    assert_true(run(stops2, 2, p2, 2, out));
    assert_string_equal(out, "x"); /* text "xabc": "abc" at 1 comes before "b" at 2 */
    const char *p3[] = {"xa", "bd"};
    assert_true(run(stops2, 2, p3, 2, out));
    assert_string_equal(out, "xa"); /* text "xabd": only "b" matches, at 2 */
}

static void test_hold_back_is_minimal(void **st) {
    (void)st;
    const char *stops[] = {"STOP"};
    osp_stop *s;
    assert_int_equal(osp_stop_new(stops, 1, &s), OSP_OK);
    const char *e;
    size_t el;
    assert_false(osp_stop_feed(s, "xyzST", 5, &e, &el));
    assert_int_equal(el, 3); /* "ST" held */
    assert_memory_equal(e, "xyz", 3);
    assert_false(osp_stop_feed(s, "X", 1, &e, &el));
    assert_int_equal(el, 3); /* "STX" cannot start STOP any more */
    assert_memory_equal(e, "STX", 3);
    osp_stop_free(s);
}

static void test_multibyte(void **st) {
    (void)st;
    const char *stops[] = {"\xe2\x82\xac!"}; /* "€!" */
    const char *p[] = {"price 5\xe2", "\x82", "\xac", "!"};
    char out[256];
    assert_true(run(stops, 1, p, 4, out));
    assert_string_equal(out, "price 5");
}

static void test_no_stops(void **st) {
    (void)st;
    const char *p[] = {"a", "b"};
    char out[64];
    assert_false(run(NULL, 0, p, 2, out));
    assert_string_equal(out, "ab");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_split_across_pieces), cmocka_unit_test(test_false_start_not_cut),
        cmocka_unit_test(test_prefix_of_another),   cmocka_unit_test(test_hold_back_is_minimal),
        cmocka_unit_test(test_multibyte),           cmocka_unit_test(test_no_stops),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
