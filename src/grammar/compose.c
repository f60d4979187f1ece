/* grammar/compose: grammars made of pieces, for text around a JSON value.
 *
 * A tool call in a model family's syntax is literal text (the call's
 * opening, the function's name), the arguments (a JSON value under the
 * tool's parameter schema), then literal text (the closing). Each schema is
 * compiled on its own (schema.c) and its productions and lexemes are copied
 * into one builder, nonterminals and terminals renumbered; the literals are
 * terminals of their own. The alternatives are a choice from the start.
 * A custom tool's input is a Lark grammar or a regex in place of the
 * schema, its lexemes spelled as a JSON string's body (the quotes are the
 * literals around it). The copied DFAs are equal in content to the
 * originals, so they share the vocab's mask cache (lexemes are interned by
 * content).
 */
#include <stdio.h>
#include <string.h>
#include "grammar/grammar_internal.h"

static gr_dfa *dfa_dup(const gr_dfa *d);

static void dfa_copy_into(gr_dfa *to, const gr_dfa *from) {
    *to = *from;
    size_t cells = (size_t)from->nstates * from->ncls;
    to->next = osp_malloc(OSP_POOL_MISC, sizeof(int32_t) * (cells ? cells : 1));
    memcpy(to->next, from->next, sizeof(int32_t) * cells);
    to->accept = osp_malloc(OSP_POOL_MISC, (size_t)from->nstates + 1);
    memcpy(to->accept, from->accept, (size_t)from->nstates);
    to->base = NULL, to->base_st = NULL, to->on_trie = NULL;
    if (from->base) { /* a DFA minus words keeps its base (grammar_internal.h) */
        to->base = dfa_dup(from->base);
        to->base_st = osp_malloc(OSP_POOL_MISC, sizeof(int32_t) * ((size_t)from->nstates + 1));
        memcpy(to->base_st, from->base_st, sizeof(int32_t) * (size_t)from->nstates);
        to->on_trie = osp_malloc(OSP_POOL_MISC, (size_t)from->nstates + 1);
        memcpy(to->on_trie, from->on_trie, (size_t)from->nstates);
    }
}

static gr_dfa *dfa_dup(const gr_dfa *d) {
    gr_dfa *x = osp_malloc(OSP_POOL_MISC, sizeof *x);
    dfa_copy_into(x, d);
    return x;
}

/* g's productions into b; *start: the nonterminal deriving g's language. */
static osp_status splice(gr_builder *b, const osp_grammar *g, int32_t *start) {
    int32_t *ntmap = osp_malloc(OSP_POOL_MISC, sizeof(int32_t) * ((size_t)g->n_nt + 1));
    int32_t *tmap = osp_malloc(OSP_POOL_MISC, sizeof(int32_t) * ((size_t)g->n_terms + 1));
    uint32_t cap = 16;
    int32_t *rhs = osp_malloc(OSP_POOL_MISC, sizeof(int32_t) * cap);
    osp_status st = OSP_OK;
    for (int32_t a = 0; a < g->n_nt; a++) ntmap[a] = gr_b_nt(b);
    for (int32_t t = 0; t < g->n_terms && !st; t++) {
        gr_dfa d;
        dfa_copy_into(&d, &g->terms[t]);
        st = gr_b_dfa(b, &d, &tmap[t]);
    }
    for (int32_t i = 0; i < g->n_prods && !st; i++) {
        const gr_prod *p = &g->prods[i];
        if (p->len > cap) {
            osp_free(rhs);
            cap = p->len;
            rhs = osp_malloc(OSP_POOL_MISC, sizeof(int32_t) * cap);
        }
        for (uint32_t k = 0; k < p->len; k++) {
            int32_t y = g->syms[p->off + k];
            rhs[k] = y >= 0 ? ntmap[y] : tmap[-y - 1];
        }
        st = gr_b_prod(b, ntmap[p->lhs], rhs, p->len);
    }
    *start = ntmap[g->prods[g->start].lhs];
    osp_free(ntmap), osp_free(tmap), osp_free(rhs);
    return st;
}

osp_status osp_grammar_from_parts(const osp_grammar_part *alts, int n, osp_grammar **out) {
    *out = NULL;
    if (n <= 0) return osp_err(OSP_ERR_INVALID, "grammar: no alternatives");
    gr_builder b;
    gr_b_init(&b);
    int32_t top = gr_b_nt(&b);
    osp_status st = OSP_OK;
    for (int i = 0; i < n && !st; i++) {
        int32_t seq[3];
        uint32_t len = 0;
        if (alts[i].prefix && *alts[i].prefix) st = gr_b_lit(&b, alts[i].prefix, strlen(alts[i].prefix), &seq[len++]);
        if (!st && (alts[i].schema || alts[i].syntax)) {
            osp_grammar *sub = NULL;
            const osp_grammar_part *p = &alts[i];
            st = p->syntax == OSP_GRAMMAR_LARK ? osp_grammar_from_lark(p->grammar, p->grammar_len, OSP_GRAMMAR_JSON_STRING, &sub)
                 : p->syntax == OSP_GRAMMAR_REGEX
                     ? osp_grammar_from_regex_flags(p->grammar, p->grammar_len, OSP_GRAMMAR_JSON_STRING, &sub)
                 : p->syntax ? osp_err(OSP_ERR_INVALID, "grammar: an unknown syntax")
                             : osp_grammar_from_json_schema(p->schema, p->schema_len, &sub);
            if (st) {
                if (n > 1) {
                    char why[400];
                    snprintf(why, sizeof why, "%s", osp_last_error());
                    osp_err(st, "alternative %d: %s", i, why);
                }
                break;
            }
            st = splice(&b, sub, &seq[len++]);
            osp_grammar_free(sub);
        }
        if (!st && alts[i].suffix && *alts[i].suffix)
            st = gr_b_lit(&b, alts[i].suffix, strlen(alts[i].suffix), &seq[len++]);
        if (!st) st = gr_b_prod(&b, top, seq, len);
    }
    if (!st) st = gr_b_finish(&b, top, out);
    gr_b_free(&b);
    return st;
}
