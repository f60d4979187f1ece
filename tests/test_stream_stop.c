/* Streaming text through the detokenizer and the stop matcher, as the
 * generation loop does, with Gemma 3's tokenizer: characters outside its
 * vocabulary arrive as byte-fallback tokens (<0xF0><0x9D>...), one byte
 * per token. Stop strings must never leak and never cut early, and no
 * piece may carry a broken UTF-8 sequence. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "golden.h"
#include "text/detok.h"
#include "text/stop.h"
#include "text/tokenizer.h"

static char tmp[256];
static osp_tokenizer *tok;

static int valid_utf8(const char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        size_t k = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        if (!k || i + k > n) return 0;
        for (size_t j = 1; j < k; j++)
            if (((unsigned char)s[i + j] >> 6) != 2) return 0;
        i += k;
    }
    return 1;
}

/* Stream the encoding of `text` one id at a time; returns 1 if a stop fired. */
static int stream(const char *text, const char *const *stops, int n_stops, char *out, int *n_pieces_bytes_fallback) {
    int32_t *ids;
    size_t n;
    assert_int_equal(osp_tokenizer_encode_alloc(tok, text, strlen(text), 0, &ids, &n), OSP_OK);
    osp_detok *d;
    osp_stop *st;
    assert_int_equal(osp_detok_new(tok, 1, &d), OSP_OK);
    assert_int_equal(osp_stop_new(stops, n_stops, &st), OSP_OK);
    out[0] = 0;
    int stopped = 0;
    *n_pieces_bytes_fallback = 0;
    for (size_t i = 0; i < n && !stopped; i++) {
        size_t tl;
        const char *name = osp_tokenizer_token_text(tok, ids[i], &tl);
        if (name && tl == 6 && !memcmp(name, "<0x", 3)) (*n_pieces_bytes_fallback)++;
        const char *t, *e;
        size_t len, el;
        assert_int_equal(osp_detok_push(d, ids[i], &t, &len), OSP_OK);
        assert_true(valid_utf8(t, len));
        stopped = osp_stop_feed(st, t, len, &e, &el);
        assert_true(valid_utf8(e, el));
        strncat(out, e, el);
    }
    if (!stopped) {
        const char *t, *e;
        size_t len, el;
        assert_int_equal(osp_detok_flush(d, &t, &len), OSP_OK);
        stopped = osp_stop_feed(st, t, len, &e, &el);
        strncat(out, e, el);
        if (!stopped) {
            osp_stop_flush(st, &e, &el);
            strncat(out, e, el);
        }
    }
    osp_stop_free(st);
    osp_detok_free(d);
    osp_free(ids);
    return stopped;
}

/* U+1D518 MATHEMATICAL FRAKTUR CAPITAL U: four UTF-8 bytes, not in the vocabulary */
#define FRAK "\xf0\x9d\x94\x98"

static void test_byte_fallback_stop(void **st) {
    (void)st;
    char out[512];
    int nb;
    /* the stop string is the multi-byte character itself, split over 4 tokens */
    const char *s1[] = {FRAK};
    assert_true(stream("price " FRAK " and more", s1, 1, out, &nb));
    assert_true(nb >= 4);
    assert_string_equal(out, "price ");
    /* a stop string that starts like the character but differs in its last byte: no stop, nothing lost */
    const char *s2[] = {"\xf0\x9d\x94\x99"};
    assert_false(stream("price " FRAK " and more", s2, 1, out, &nb));
    assert_string_equal(out, "price " FRAK " and more");
    /* stop right after the character */
    const char *s3[] = {FRAK "!"};
    assert_true(stream("a" FRAK "b " FRAK "! c", s3, 1, out, &nb));
    assert_string_equal(out, "a" FRAK "b ");
    /* a stop string that is a prefix of another: the earliest match ends the text */
    const char *s4[] = {"<end", "<end_of"};
    assert_true(stream("x " FRAK " <end_of> y", s4, 2, out, &nb));
    assert_string_equal(out, "x " FRAK " ");
}

static int setup(void **st) {
    (void)st;
    if (test_tmpdir_make(tmp, sizeof tmp, "stream") != 0) return -1;
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "gzip -dc data/tokenizers/gemma3/tokenizer.json.gz > %s/tokenizer.json && "
             "cp data/tokenizers/gemma3/tokenizer_config.json %s/", tmp, tmp);
    if (system(cmd) != 0) return -1;
    return osp_tokenizer_load(tmp, &tok) == OSP_OK ? 0 : -1;
}

static int teardown(void **st) {
    (void)st;
    osp_tokenizer_free(tok);
    return test_tmpdir_remove(tmp);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_byte_fallback_stop)};
    return cmocka_run_group_tests(tests, setup, teardown);
}
