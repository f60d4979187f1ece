/* Shared by the grammar tests (cmocka): a vocabulary of single bytes and a
 * walk of a text through a matcher that checks the mask against each commit.
 * Include after cmocka.h. */
#ifndef OSP_TEST_GRAMMAR_WALK_H
#define OSP_TEST_GRAMMAR_WALK_H
#include <stdint.h>
#include "core/core.h"
#include "grammar/grammar.h"

/* The vocabulary of every single byte (token b is byte b) and EOS 256. */
static inline osp_grammar_vocab *byte_vocab(void) {
    static char bytes[256][1];
    const char *p[257];
    uint32_t lens[257];
    for (int b = 0; b < 256; b++) bytes[b][0] = (char)b, p[b] = bytes[b], lens[b] = 1;
    p[256] = NULL, lens[256] = 0;
    osp_grammar_vocab *v;
    assert_int_equal(osp_grammar_vocab_new(257, p, lens, 256, &v), OSP_OK);
    return v;
}

/* Whether the grammar takes the whole text (byte by byte, each byte also
 * allowed by the mask), and accepts at its end (EOS allowed exactly there). */
static inline int takes_n(osp_grammar *g, osp_grammar_vocab *v, const char *s, size_t n) {
    osp_grammar_matcher *m;
    assert_int_equal(osp_grammar_matcher_new(g, v, &m), OSP_OK);
    uint32_t mask[(257 + 31) / 32];
    int ok = 1;
    for (size_t i = 0; i < n && ok; i++) {
        uint8_t b = (uint8_t)s[i];
        osp_grammar_matcher_mask(m, mask);
        int allowed = (mask[b / 32] >> (b % 32)) & 1;
        int committed = osp_grammar_matcher_commit(m, b);
        assert_int_equal(allowed, committed); /* the mask says what a commit does */
        ok = committed;
    }
    if (ok) {
        osp_grammar_matcher_mask(m, mask);
        int eos = (mask[256 / 32] >> (256 % 32)) & 1;
        ok = osp_grammar_matcher_accepting(m);
        assert_int_equal(eos, ok); /* EOS exactly where the grammar accepts */
    }
    osp_grammar_matcher_free(m);
    return ok;
}
#endif
