/* libFuzzer: the Lark compiler (grammar/lark.c). The input is a grammar;
 * when it compiles (as itself, then spelled as a JSON string's body), a
 * matcher on a small vocabulary takes masks and commits tokens chosen by
 * the input's own bytes: the fast mask must equal the plain walk, an
 * allowed token must commit, and EOS is allowed exactly where the grammar
 * accepts. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "core/core.h"
#include "grammar/grammar.h"
#include "fuzz_grammar_walk.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    walk_vocab_init();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 4096) return 0;
    osp_grammar *g;
    if (osp_grammar_from_lark((const char *)data, size, 0, &g) != OSP_OK) return 0;
    walk_grammar(g, data, size);
    osp_status st = osp_grammar_from_lark((const char *)data, size, OSP_GRAMMAR_JSON_STRING, &g);
    if (st == OSP_OK) walk_grammar(g, data, size);
    else if (st != OSP_ERR_UNSUPPORTED) abort(); /* what compiles plain compiles escaped, unless it grows too large */
    return 0;
}
