/* Shared by the grammar parsers' harnesses (fuzz_gbnf, fuzz_lark): a small
 * vocabulary (multi-byte tokens, split UTF-8, EOS last) and a walk that
 * takes masks and commits tokens chosen by the input's own bytes: the fast
 * mask must equal the plain walk, an allowed token must commit, and EOS is
 * allowed exactly where the grammar accepts. The walk frees the grammar. */
#ifndef OSP_FUZZ_GRAMMAR_WALK_H
#define OSP_FUZZ_GRAMMAR_WALK_H
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "core/core.h"
#include "grammar/grammar.h"

static osp_grammar_vocab *walk_voc;

static inline void walk_vocab_init(void) {
    static const char *const toks[] = {"a", "b", "ab", "(", ")", "()", " ", "\n", "\"", "{", "}", "[", "]", ",",
                                       "0", "12", "x", "yes", "no", "\xc3\xa9", "\xce\xb1", "\xe2\x82\xac", "\xc3",
                                       "\xa9", "\xff", "-", ":", "\\", "true", "null", NULL};
    int32_t n = (int32_t)(sizeof toks / sizeof *toks);
    uint32_t lens[64];
    for (int32_t i = 0; i < n; i++) lens[i] = toks[i] ? (uint32_t)strlen(toks[i]) : 0;
    if (osp_grammar_vocab_new(n, toks, lens, n - 1, &walk_voc)) abort();
}

static inline void walk_grammar(osp_grammar *g, const uint8_t *data, size_t size) {
    osp_grammar_matcher *m;
    if (osp_grammar_matcher_new(g, walk_voc, &m) == OSP_OK) {
        const int32_t n = osp_grammar_vocab_size(walk_voc), eos = osp_grammar_vocab_eos(walk_voc);
        uint32_t a[2] = {0}, b[2] = {0}; /* (the vocabulary's 31 tokens fill the first word) */
        for (size_t k = 0; k < 24; k++) {
            osp_grammar_matcher_mask(m, a);
            osp_grammar_matcher_mask_reference(m, b);
            if (memcmp(a, b, sizeof a)) abort(); /* the fast path differs from its twin */
            if (((a[eos >> 5] >> (eos & 31)) & 1) != (osp_grammar_matcher_accepting(m) != 0)) abort();
            int32_t pick = size ? data[(k * 7) % size] % n : 0, t = -1;
            for (int32_t j = 0; j < n && t < 0; j++) {
                int32_t c = (pick + j) % n;
                if (c != eos && ((a[c >> 5] >> (c & 31)) & 1)) t = c;
            }
            if (t < 0) break;
            if (!osp_grammar_matcher_commit(m, t)) abort(); /* an allowed token must commit */
        }
        osp_grammar_matcher_free(m);
    }
    osp_grammar_free(g);
}
#endif
