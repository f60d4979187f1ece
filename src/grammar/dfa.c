/* grammar/dfa: the product of two DFAs (intersection, difference).
 *
 * JSON Schema stacks constraints on one string: a pattern and a length, a
 * format and a length, a type minus a `not`. Each is a DFA over the same
 * encoding (a JSON string literal, escapes included), so the text meets
 * both exactly when the product accepts it. States are pairs reached from
 * (1, 1) breadth first; b's dead state 0 stays a component (for the
 * difference, a text b has rejected is still a's). Byte classes are the
 * common refinement of both. Pairs that cannot reach acceptance fold into
 * the dead state, as every DFA here keeps.
 */
#include <stdlib.h>
#include <string.h>
#include "grammar/grammar_internal.h"

osp_status gr_dfa_product(const gr_dfa *a, const gr_dfa *b, int op, gr_dfa *out) {
    memset(out, 0, sizeof *out);
    /* classes: pairs of (a's class, b's class) */
    int32_t map[256], nc = 0;
    uint8_t rep[256];
    for (int c = 0; c < 256; c++) {
        int32_t k = a->cls[c] * 256 + b->cls[c], f = -1;
        for (int32_t j = 0; j < nc && f < 0; j++)
            if (map[j] == k) f = j;
        if (f < 0) f = nc, map[nc] = k, rep[nc] = (uint8_t)c, nc++;
        out->cls[c] = (uint8_t)f;
    }
    out->ncls = nc;
    int32_t cap = 256, ns = 2;
    int32_t *pa = osp_malloc(OSP_POOL_MISC, sizeof(int32_t) * cap), *pb = osp_malloc(OSP_POOL_MISC, sizeof(int32_t) * cap);
    int32_t *next = osp_calloc(OSP_POOL_MISC, sizeof(int32_t) * (size_t)cap * nc);
    pa[0] = 0, pb[0] = 0, pa[1] = 1, pb[1] = 1;
    uint32_t hm = 4095;
    int32_t *hs = osp_malloc(OSP_POOL_MISC, sizeof(int32_t) * (hm + 1));
    memset(hs, -1, sizeof(int32_t) * (hm + 1));
    osp_status st = OSP_OK;
    for (int32_t s = 1; s < ns && !st; s++) {
        for (int32_t cc = 0; cc < nc; cc++) {
            int32_t x = gr_dfa_next(a, pa[s], rep[cc]), y = pb[s] ? gr_dfa_next(b, pb[s], rep[cc]) : 0;
            if (!x || (op == GR_DFA_AND && !y)) continue;
            uint32_t h = ((uint32_t)x * 2654435761u ^ (uint32_t)y * 40503u) & hm;
            int32_t t = -1;
            for (; hs[h] >= 0; h = (h + 1) & hm)
                if (pa[hs[h]] == x && pb[hs[h]] == y) { t = hs[h]; break; }
            if (t < 0) {
                if (ns >= GR_MAX_DFA_STATES) { st = osp_err(OSP_ERR_UNSUPPORTED, "regex: an intersection needs more than %d DFA states", GR_MAX_DFA_STATES); break; }
                if (ns == cap) {
                    int32_t *na = osp_malloc(OSP_POOL_MISC, sizeof(int32_t) * cap * 2), *nb = osp_malloc(OSP_POOL_MISC, sizeof(int32_t) * cap * 2);
                    int32_t *nx = osp_calloc(OSP_POOL_MISC, sizeof(int32_t) * (size_t)cap * 2 * nc);
                    memcpy(na, pa, sizeof(int32_t) * ns), memcpy(nb, pb, sizeof(int32_t) * ns);
                    memcpy(nx, next, sizeof(int32_t) * (size_t)cap * nc);
                    osp_free(pa), osp_free(pb), osp_free(next);
                    pa = na, pb = nb, next = nx, cap *= 2;
                }
                if ((uint32_t)ns * 2 > hm) { /* rehash */
                    hm = hm * 2 + 1;
                    osp_free(hs);
                    hs = osp_malloc(OSP_POOL_MISC, sizeof(int32_t) * (hm + 1));
                    memset(hs, -1, sizeof(int32_t) * (hm + 1));
                    for (int32_t i = 1; i < ns; i++) {
                        uint32_t g = ((uint32_t)pa[i] * 2654435761u ^ (uint32_t)pb[i] * 40503u) & hm;
                        while (hs[g] >= 0) g = (g + 1) & hm;
                        hs[g] = i;
                    }
                    for (h = ((uint32_t)x * 2654435761u ^ (uint32_t)y * 40503u) & hm; hs[h] >= 0; h = (h + 1) & hm) {}
                }
                t = ns++;
                pa[t] = x, pb[t] = y, hs[h] = t;
            }
            next[(size_t)s * nc + cc] = t;
        }
    }
    if (!st) {
        uint8_t *acc = osp_calloc(OSP_POOL_MISC, ns), *live = osp_calloc(OSP_POOL_MISC, ns);
        for (int32_t s = 1; s < ns; s++) {
            int ib = pb[s] && b->accept[pb[s]];
            acc[s] = a->accept[pa[s]] && (op == GR_DFA_AND ? ib : !ib);
            live[s] = acc[s];
        }
        for (int ch = 1; ch;) {
            ch = 0;
            for (int32_t s = ns - 1; s >= 1; s--)
                if (!live[s])
                    for (int32_t c = 0; c < nc; c++)
                        if (live[next[(size_t)s * nc + c]]) { live[s] = 1, ch = 1; break; }
        }
        /* renumber the live states (the start stays 1 even when dead: it then accepts nothing) */
        int32_t *ren = osp_calloc(OSP_POOL_MISC, sizeof(int32_t) * ns), m = 2;
        ren[1] = 1;
        for (int32_t s = 2; s < ns; s++)
            if (live[s]) ren[s] = m++;
        out->nstates = m;
        out->next = osp_calloc(OSP_POOL_MISC, sizeof(int32_t) * (size_t)m * nc);
        out->accept = osp_calloc(OSP_POOL_MISC, m);
        for (int32_t s = 1; s < ns; s++) {
            if (s > 1 && !live[s]) continue;
            out->accept[ren[s]] = acc[s];
            for (int32_t c = 0; c < nc; c++) {
                int32_t t = next[(size_t)s * nc + c];
                out->next[(size_t)ren[s] * nc + c] = live[t] ? ren[t] : 0;
            }
        }
        osp_free(ren), osp_free(acc), osp_free(live);
    }
    osp_free(pa), osp_free(pb), osp_free(next), osp_free(hs);
    return st;
}
