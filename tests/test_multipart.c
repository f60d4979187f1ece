/* server/multipart: the form an OpenAI client uploads, quoting, preambles,
 * binary parts holding CRLFs, and malformed bodies refused with a message. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>
#include "server/multipart.h"

static srv_form F;

static void test_form(void **state) {
    (void)state;
    const char body[] = "--b0undary\r\n"
                        "Content-Disposition: form-data; name=\"file\"; filename=\"a b.wav\"\r\n"
                        "Content-Type: audio/wav\r\n\r\n"
                        "RI\r\nFF\0\r\n--b0und\r\n"
                        "--b0undary\r\n"
                        "content-disposition: form-data; name=model\r\n\r\n"
                        "whisper-1\r\n"
                        "--b0undary\r\n"
                        "Content-Disposition: form-data; name=\"timestamp_granularities[]\"\r\n\r\n"
                        "segment\r\n"
                        "--b0undary--\r\n";
    const char *err = NULL;
    assert_int_equal(srv_multipart_parse("multipart/form-data; boundary=b0undary", body, sizeof body - 1, &F, &err), 0);
    assert_int_equal(F.n, 3);
    const srv_part *f = srv_form_get(&F, "file");
    assert_non_null(f);
    assert_string_equal(f->filename, "a b.wav");
    /* the CRLF before the next delimiter is the delimiter's */
    assert_int_equal(f->len, 16);
    assert_memory_equal(f->data, "RI\r\nFF\0\r\n--b0und", 16);
    const srv_part *m = srv_form_get(&F, "model");
    assert_int_equal(m->len, 9);
    assert_null(m->filename);
    assert_non_null(srv_form_get(&F, "timestamp_granularities[]"));
    assert_null(srv_form_get(&F, "language"));
    /* a quoted boundary and a preamble */
    const char b2[] = "preamble\r\n--a b\r\nContent-Disposition: form-data; name=\"x\"\r\n\r\n1\r\n--a b--";
    assert_int_equal(srv_multipart_parse("multipart/form-data; boundary=\"a b\"", b2, sizeof b2 - 1, &F, &err), 0);
    assert_int_equal(F.n, 1);
    assert_int_equal(F.parts[0].len, 1);
}

static void test_malformed(void **state) {
    (void)state;
    const char *err = NULL;
    const char ok[] = "--b\r\nContent-Disposition: form-data; name=\"x\"\r\n\r\n1\r\n--b--";
    assert_int_equal(srv_multipart_parse("application/json", ok, sizeof ok - 1, &F, &err), -1);
    assert_non_null(strstr(err, "multipart/form-data"));
    assert_int_equal(srv_multipart_parse(NULL, ok, sizeof ok - 1, &F, &err), -1);
    /* every truncation of a valid body is refused, never read past */
    for (size_t n = 0; n + 2 < sizeof ok - 1; n++) {
        char *cut = malloc(n ? n : 1);
        memcpy(cut, ok, n);
        err = NULL;
        assert_int_equal(srv_multipart_parse("multipart/form-data; boundary=b", cut, n, &F, &err), -1);
        assert_non_null(err);
        free(cut);
    }
    const char noname[] = "--b\r\nContent-Type: text/plain\r\n\r\n1\r\n--b--";
    assert_int_equal(srv_multipart_parse("multipart/form-data; boundary=b", noname, sizeof noname - 1, &F, &err), -1);
    assert_non_null(strstr(err, "name"));
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_form), cmocka_unit_test(test_malformed)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
