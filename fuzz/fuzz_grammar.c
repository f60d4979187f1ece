/* libFuzzer: the JSON Schema compiler and the regex parser (grammar/).
 * Input byte 0 picks the job:
 *   0 mod 3: the rest is a JSON Schema; when it compiles, a matcher on a
 *            small vocabulary takes masks and commits tokens chosen by the
 *            schema's own bytes, and the fast mask must equal the plain walk;
 *   1 mod 3: the rest is a regex over bytes (the whole-output grammar);
 *   2 mod 3: the rest is a JSON Schema "pattern" (a JSON string's regex); when
 *            it compiles, its products with a length (and, minus, the
 *            other way) must agree with both DFAs on the pattern's bytes. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "core/core.h"
#include "grammar/grammar_internal.h"

static osp_grammar_vocab *voc;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    static const char *const toks[] = {"{", "}", "[", "]", "\"", ",", ":", " ", "a", "b", "1", "0", "-", ".", "e",
                                       "true", "false", "null", "\"a", "\":", "\": ", ", \"", "\"}", "\\", "\\\"",
                                       "n", "u", "12", "\xc3\xa9", "\n", "A", "z", "E", "+"};
    int32_t n = (int32_t)(sizeof toks / sizeof *toks);
    uint32_t lens[64];
    for (int32_t i = 0; i < n; i++) lens[i] = (uint32_t)strlen(toks[i]);
    if (osp_grammar_vocab_new(n, toks, lens, -1, &voc)) abort();
    return 0;
}

static void drive(osp_grammar *g, const uint8_t *data, size_t size) {
    osp_grammar_matcher *m;
    if (osp_grammar_matcher_new(g, voc, &m)) return;
    int32_t n = osp_grammar_vocab_size(voc);
    uint32_t a[2], b[2];
    for (size_t k = 0; k < 16; k++) {
        osp_grammar_matcher_mask(m, a);
        osp_grammar_matcher_mask_reference(m, b);
        if (memcmp(a, b, sizeof a)) abort(); /* the fast path differs from its twin */
        int32_t pick = size ? data[k % size] % n : 0, t = -1;
        for (int32_t j = 0; j < n && t < 0; j++) {
            int32_t c = (pick + j) % n;
            if ((a[c >> 5] >> (c & 31)) & 1) t = c;
        }
        if (t < 0) break;
        if (!osp_grammar_matcher_commit(m, t)) abort(); /* an allowed token must commit */
    }
    osp_grammar_matcher_free(m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!size || size > 4096) return 0;
    const char *s = (const char *)data + 1;
    size_t n = size - 1;
    osp_grammar *g = NULL;
    switch (data[0] % 3) {
    case 0:
        if (osp_grammar_from_json_schema(s, n, &g) == OSP_OK) drive(g, data, size);
        break;
    case 1:
        if (osp_grammar_from_regex(s, n, &g) == OSP_OK) drive(g, data, size);
        break;
    default: {
        gr_dfa d, l, x;
        if (gr_regex_dfa(s, n, GR_RE_JSONSTR, &d) != OSP_OK) break;
        if (gr_regex_dfa("^[\\s\\S]{0,6}$", 14, GR_RE_JSONSTR | GR_RE_ALLESC, &l) == OSP_OK) {
            for (int op = GR_DFA_AND; op <= GR_DFA_MINUS; op++) {
                if (gr_dfa_product(&d, &l, op, &x) != OSP_OK) continue;
                /* the product judges a text as the two DFAs do: the input's bytes as a JSON string */
                int32_t a = 1, b = 1, c = 1;
                const char *t = s, *e = s + n;
                for (int q = 0; q < 2; q++, t = s) {
                    a = b = c = 1;
                    a = gr_dfa_next(&d, a, '"'), b = gr_dfa_next(&l, b, '"'), c = gr_dfa_next(&x, c, '"');
                    for (; t < e && q == 1; t++) {
                        a = a ? gr_dfa_next(&d, a, (uint8_t)*t) : 0, b = b ? gr_dfa_next(&l, b, (uint8_t)*t) : 0;
                        c = c ? gr_dfa_next(&x, c, (uint8_t)*t) : 0;
                    }
                    a = a ? gr_dfa_next(&d, a, '"') : 0, b = b ? gr_dfa_next(&l, b, '"') : 0, c = c ? gr_dfa_next(&x, c, '"') : 0;
                    int ia = a && d.accept[a], ib = b && l.accept[b], ic = c && x.accept[c];
                    if (ic != (op == GR_DFA_AND ? ia && ib : ia && !ib)) abort();
                }
                gr_dfa_free(&x);
            }
            gr_dfa_free(&l);
        }
        gr_dfa_free(&d);
    }
    }
    osp_grammar_free(g);
    return 0;
}
