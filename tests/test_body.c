/* server/body: request bodies decoded as they arrive: Content-Length with a
 * pipelined request behind it, chunked with extensions and trailers, the
 * same result whatever the split, and bodies refused at the right byte:
 * chunk sizes over the limit (413, before their data), malformed framing (400). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>
#include "server/body.h"

/* Feed in pieces of `step` bytes (0: all at once); returns the bytes used, the body in out. */
static size_t feed(srv_body *b, const char *in, size_t n, size_t step, char *out, size_t *out_len) {
    size_t used = 0;
    *out_len = 0;
    while (used < n && !b->done && !b->status) {
        size_t k = step && n - used > step ? step : n - used, got = 0;
        size_t u = srv_body_feed(b, in + used, k, out + *out_len, &got);
        *out_len += got;
        used += u;
        if (u < k) break;
    }
    return used;
}

static void test_content_length(void **state) {
    (void)state;
    const char in[] = "hello worldGET / HTTP/1.1\r\n";
    for (size_t step = 0; step < 4; step++) {
        srv_body b;
        srv_body_init(&b, 0, 11, 100);
        char out[64];
        size_t n;
        size_t used = feed(&b, in, sizeof in - 1, step, out, &n);
        assert_int_equal(used, 11); /* the next request is left where it is */
        assert_true(b.done);
        assert_int_equal(b.status, 0);
        assert_int_equal(n, 11);
        assert_memory_equal(out, "hello world", 11);
    }
    srv_body b;
    srv_body_init(&b, 0, 0, 100);
    assert_true(b.done);
}

static void test_chunked(void **state) {
    (void)state;
    const char in[] = "5\r\nhello\r\n1;name=\"v\"\r\n \r\nA \t; ext\r\n0123456789\n0\r\nX-Trailer: 1\r\n\r\nNEXT";
    for (size_t step = 0; step < 8; step++) {
        srv_body b;
        srv_body_init(&b, 1, 0, 1000);
        char out[128];
        size_t n;
        size_t used = feed(&b, in, sizeof in - 1, step, out, &n);
        assert_int_equal(b.status, 0);
        assert_true(b.done);
        assert_int_equal(used, sizeof in - 1 - 4);
        assert_int_equal(n, 16);
        assert_memory_equal(out, "hello 0123456789", 16);
        assert_int_equal(b.total, 16);
    }
}

static void refused(const char *in, size_t limit, int status, size_t at) {
    for (size_t step = 0; step < 3; step++) {
        srv_body b;
        srv_body_init(&b, 1, 0, limit);
        char out[256];
        size_t n;
        size_t used = feed(&b, in, strlen(in), step, out, &n);
        assert_int_equal(b.status, status);
        assert_false(b.done);
        assert_int_equal(used, at);
        assert_true(strlen(b.msg) > 0);
    }
}

static void test_refused(void **state) {
    (void)state;
    /* over the limit: at the size line, before any of the chunk's data */
    refused("800001\r\nabc", 8388608, 413, 7);
    refused("ffffffffffffffff\r\n", 8388608, 413, 17);
    refused("10000000000000000\r\n", 8388608, 413, 18);
    refused("4\r\nabcd\r\n5\r\n", 8, 413, 11); /* the second chunk takes the total past the limit */
}

static void test_exact_limit(void **state) {
    (void)state;
    srv_body b;
    srv_body_init(&b, 1, 0, 8);
    char out[64];
    size_t n;
    const char in[] = "8\r\nabcdefgh\r\n0\r\n\r\n";
    feed(&b, in, sizeof in - 1, 0, out, &n);
    assert_true(b.done);
    assert_int_equal(n, 8);
}

static void test_malformed(void **state) {
    (void)state;
    refused("xyz\r\n", 100, 400, 0);
    refused("\r\n", 100, 400, 1);
    refused(";a\r\n", 100, 400, 0);
    refused("3\r\nabcX", 100, 400, 6);   /* data not followed by CRLF */
    refused("3\rX", 100, 400, 2);        /* CR without LF */
    refused("3\r\nabc\r\n0\r\nbad\x01\r\n", 100, 400, 14);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_content_length), cmocka_unit_test(test_chunked), cmocka_unit_test(test_refused),
        cmocka_unit_test(test_exact_limit), cmocka_unit_test(test_malformed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
