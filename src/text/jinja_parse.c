/* text/jinja parser: tokens -> AST, a recursive-descent mirror of
 * jinja2's parser.py (same precedence, same statement grammar).
 *
 * Node fields by kind (see jnode in jinja_internal.h):
 *   BODY v[nv] statements          DATA name = text
 *   OUTPUT a                       IF a cond, b body, c else (elif = IF in c)
 *   FOR a target, b iter, c filter, d body, e else
 *   SET a target (NAME, TUPLE, NSREF), b value
 *   SET_BLOCK a target, b filter chain (innermost a = NULL) or NULL, d body
 *   MACRO name, names[nv] params, v[nv] defaults (NULL = none), d body
 *   FILTER_BLOCK b filter chain, d body     WITH v targets, w values, d body
 *   CONST val     NAME name     NSREF name.attr     LIST/TUPLE v     DICT v keys, w values
 *   GETATTR a, name     GETITEM a, b (b may be SLICE a:b:c)     CALL a, v args, names/w kwargs
 *   FILTER a input (NULL: block body), name, def, v args, names/w kwargs
 *   TEST same with a jtest_def     NOT/NEG/POS a     BINOP op a b     AND/OR a b
 *   CONCAT v     COMPARE a first, v operands, ops     COND a test, b then, c else (NULL)
 *
 * Filters and tests are resolved here. As in jinja2's compiler, an unknown
 * name is an error once the whole template has parsed, except inside an
 * {% if %} (its test and branches, not nested loops/macros/blocks) or an
 * inline "x if c else y": there it fails only if it runs. Nesting is
 * bounded so a hostile template cannot exhaust the C stack.
 */
#include <stdlib.h>
#include "text/jinja_internal.h"

#define MAX_NEST 200

typedef struct parser {
    jarena *a;
    jtok *t;
    size_t i, n;
    int depth;
    int loops; /* enclosing for loops (break/continue allowed) */
    int soft;  /* inside an if / inline if: unknown filters and tests fail at run time */
    jnode **unknown; /* filter/test nodes with unknown names, in source order */
    uint8_t *unknown_soft;
    size_t n_unknown, cap_unknown;
} parser;

typedef struct nvec {
    jnode **v;
    uint32_t n, cap;
} nvec;

static osp_status pfail(parser *p, uint32_t line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static osp_status pfail(parser *p, uint32_t line, const char *fmt, ...) {
    (void)p;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return osp_err(OSP_ERR_FORMAT, "template syntax error (line %u): %s", line, msg);
}

static jtok *cur(parser *p) { return &p->t[p->i]; }
static jtok *look(parser *p) { return &p->t[p->i + 1 < p->n ? p->i + 1 : p->n - 1]; }
static void next(parser *p) { if (p->i + 1 < p->n) p->i++; }

static int is_name(const jtok *t, const char *s) {
    return t->kind == JT_NAME && t->s.n == strlen(s) && !memcmp(t->s.s, s, t->s.n);
}

static void describe(const jtok *t, char *buf, size_t n) {
    const char *d = jtok_describe(t);
    if (d) snprintf(buf, n, "%s", d);
    else snprintf(buf, n, "%.*s", (int)(t->s.n > 60 ? 60 : t->s.n), t->s.s);
}

static const char *kind_desc(jtok_kind k) {
    switch (k) {
    case JT_NAME: return "name";
    case JT_VAR_END: return "end of print statement";
    case JT_BLOCK_END: return "end of statement block";
    case JT_RPAREN: return ")";
    case JT_RBRACKET: return "]";
    case JT_RBRACE: return "}";
    case JT_LPAREN: return "(";
    case JT_COLON: return ":";
    case JT_COMMA: return ",";
    case JT_ASSIGN: return "=";
    default: return "token";
    }
}

static osp_status expect(parser *p, jtok_kind k, jtok **out) {
    jtok *t = cur(p);
    if (t->kind != k) {
        char d[80];
        describe(t, d, sizeof d);
        if (t->kind == JT_EOF)
            return pfail(p, t->line, "unexpected end of template, expected '%s'", kind_desc(k));
        return pfail(p, t->line, "expected token '%s', got '%s'", kind_desc(k), d);
    }
    if (out) *out = t;
    next(p);
    return OSP_OK;
}

static osp_status expect_name(parser *p, const char *name) {
    jtok *t = cur(p);
    if (!is_name(t, name)) {
        char d[80];
        describe(t, d, sizeof d);
        return pfail(p, t->line, "expected token '%s', got '%s'", name, d);
    }
    next(p);
    return OSP_OK;
}

static osp_status mk(parser *p, jnode_kind k, uint32_t line, jnode **out) {
    jnode *n = ja_alloc(p->a, sizeof *n);
    if (!n) return osp_err(OSP_ERR_NOMEM, "out of memory parsing the template");
    n->kind = (uint8_t)k;
    n->line = line;
    *out = n;
    return OSP_OK;
}

static osp_status push(parser *p, nvec *v, jnode *n) {
    if (v->n == v->cap) {
        uint32_t nc = v->cap ? v->cap * 2 : 4;
        jnode **a = ja_alloc(p->a, nc * sizeof *a);
        if (!a) return osp_err(OSP_ERR_NOMEM, "out of memory parsing the template");
        if (v->n) memcpy(a, v->v, v->n * sizeof *a);
        v->v = a;
        v->cap = nc;
    }
    v->v[v->n++] = n;
    return OSP_OK;
}

static osp_status enter(parser *p) {
    if (++p->depth > MAX_NEST) return pfail(p, cur(p)->line, "template nested too deeply (more than %d levels)", MAX_NEST);
    return OSP_OK;
}

static osp_status note_unknown(parser *p, jnode *n) {
    if (p->n_unknown == p->cap_unknown) {
        size_t nc = p->cap_unknown ? p->cap_unknown * 2 : 8;
        jnode **a = ja_alloc(p->a, nc * sizeof *a);
        uint8_t *b = ja_alloc(p->a, nc);
        if (!a || !b) return osp_err(OSP_ERR_NOMEM, "out of memory parsing the template");
        if (p->n_unknown) {
            memcpy(a, p->unknown, p->n_unknown * sizeof *a);
            memcpy(b, p->unknown_soft, p->n_unknown);
        }
        p->unknown = a;
        p->unknown_soft = b;
        p->cap_unknown = nc;
    }
    p->unknown[p->n_unknown] = n;
    p->unknown_soft[p->n_unknown++] = p->soft > 0;
    return OSP_OK;
}

static osp_status parse_expression(parser *p, int with_condexpr, jnode **out);
static osp_status parse_unary(parser *p, int with_filter, jnode **out);
static osp_status parse_primary(parser *p, jnode **out);
static osp_status parse_postfix(parser *p, jnode *node, jnode **out);
static osp_status parse_filter_expr(parser *p, jnode *node, jnode **out);
static osp_status parse_filter(parser *p, jnode *node, int start_inline, jnode **out);
static osp_status parse_or(parser *p, jnode **out);

enum { TUP_FULL = 0, TUP_SIMPLE = 1, TUP_NOCOND = 2 };

static int is_tuple_end(parser *p, const char *extra) {
    jtok *t = cur(p);
    if (t->kind == JT_VAR_END || t->kind == JT_BLOCK_END || t->kind == JT_RPAREN) return 1;
    return extra && is_name(t, extra);
}

static osp_status parse_tuple(parser *p, int mode, const char *extra_end, int explicit_paren, jnode **out) {
    uint32_t line = cur(p)->line;
    nvec items = {0};
    int is_tuple = 0;
    for (;;) {
        if (items.n) OSP_TRY(expect(p, JT_COMMA, NULL));
        if (is_tuple_end(p, extra_end)) break;
        jnode *e;
        if (mode == TUP_SIMPLE) OSP_TRY(parse_primary(p, &e));
        else OSP_TRY(parse_expression(p, mode == TUP_FULL, &e));
        OSP_TRY(push(p, &items, e));
        if (cur(p)->kind == JT_COMMA) is_tuple = 1;
        else break;
    }
    if (!is_tuple) {
        if (items.n) { *out = items.v[0]; return OSP_OK; }
        if (!explicit_paren) {
            char d[80];
            describe(cur(p), d, sizeof d);
            return pfail(p, cur(p)->line, "expected an expression, got '%s'", d);
        }
    }
    jnode *n;
    OSP_TRY(mk(p, JN_TUPLE, line, &n));
    n->v = items.v;
    n->nv = items.n;
    *out = n;
    return OSP_OK;
}

static osp_status parse_call_args(parser *p, jnode *n) {
    jtok *open;
    OSP_TRY(expect(p, JT_LPAREN, &open));
    nvec args = {0}, kwv = {0};
    jstr *kwn = NULL;
    uint32_t kcap = 0;
    int require_comma = 0;
    while (cur(p)->kind != JT_RPAREN) {
        if (require_comma) {
            OSP_TRY(expect(p, JT_COMMA, NULL));
            if (cur(p)->kind == JT_RPAREN) break;
        }
        if (cur(p)->kind == JT_MUL || cur(p)->kind == JT_POW)
            return pfail(p, cur(p)->line, "*args and **kwargs in calls are not supported");
        jnode *e;
        if (cur(p)->kind == JT_NAME && look(p)->kind == JT_ASSIGN) {
            jstr key = cur(p)->s;
            next(p);
            next(p);
            OSP_TRY(parse_expression(p, 1, &e));
            if (kwv.n == kcap) {
                uint32_t nc = kcap ? kcap * 2 : 4;
                jstr *k2 = ja_alloc(p->a, nc * sizeof *k2);
                if (!k2) return osp_err(OSP_ERR_NOMEM, "out of memory parsing the template");
                if (kwv.n) memcpy(k2, kwn, kwv.n * sizeof *k2);
                kwn = k2;
                kcap = nc;
            }
            kwn[kwv.n] = key;
            OSP_TRY(push(p, &kwv, e));
        } else {
            if (kwv.n) return pfail(p, open->line, "invalid syntax for function call expression");
            OSP_TRY(parse_expression(p, 1, &e));
            OSP_TRY(push(p, &args, e));
        }
        require_comma = 1;
    }
    OSP_TRY(expect(p, JT_RPAREN, NULL));
    n->v = args.v;
    n->nv = args.n;
    n->w = kwv.v;
    n->nw = kwv.n;
    n->names = kwn;
    return OSP_OK;
}

/* A dotted name after "|" or "is". */
static osp_status dotted_name(parser *p, jstr *out) {
    jtok *t;
    OSP_TRY(expect(p, JT_NAME, &t));
    const char *s = t->s.s;
    size_t n = t->s.n;
    while (cur(p)->kind == JT_DOT) {
        next(p);
        jtok *u;
        OSP_TRY(expect(p, JT_NAME, &u));
        n = (size_t)(u->s.s + u->s.n - s); /* contiguous in the source only without spaces */
    }
    out->s = s;
    out->n = (uint32_t)n;
    return OSP_OK;
}

static osp_status parse_filter(parser *p, jnode *node, int start_inline, jnode **out) {
    while (cur(p)->kind == JT_PIPE || start_inline) {
        if (!start_inline) next(p);
        uint32_t line = cur(p)->line;
        jnode *f;
        OSP_TRY(mk(p, JN_FILTER, line, &f));
        OSP_TRY(dotted_name(p, &f->name));
        f->def = jfilter_find(f->name.s, f->name.n);
        if (!f->def) OSP_TRY(note_unknown(p, f));
        if (cur(p)->kind == JT_LPAREN) OSP_TRY(parse_call_args(p, f));
        f->a = node;
        node = f;
        start_inline = 0;
    }
    *out = node;
    return OSP_OK;
}

static osp_status parse_test(parser *p, jnode *node, jnode **out) {
    uint32_t line = cur(p)->line;
    next(p); /* is */
    int negated = 0;
    if (is_name(cur(p), "not")) { next(p); negated = 1; }
    jnode *t;
    OSP_TRY(mk(p, JN_TEST, line, &t));
    OSP_TRY(dotted_name(p, &t->name));
    t->def = jtest_find(t->name.s, t->name.n);
    if (!t->def) OSP_TRY(note_unknown(p, t));
    jtok *c = cur(p);
    if (c->kind == JT_LPAREN) {
        OSP_TRY(parse_call_args(p, t));
    } else if ((c->kind == JT_NAME || c->kind == JT_STRING || c->kind == JT_INT || c->kind == JT_FLOAT ||
                c->kind == JT_LPAREN || c->kind == JT_LBRACKET || c->kind == JT_LBRACE) &&
               !is_name(c, "else") && !is_name(c, "or") && !is_name(c, "and")) {
        if (is_name(c, "is")) return pfail(p, c->line, "You cannot chain multiple tests with is");
        jnode *arg;
        OSP_TRY(parse_primary(p, &arg));
        OSP_TRY(parse_postfix(p, arg, &arg));
        jnode **v = ja_alloc(p->a, sizeof *v);
        if (!v) return osp_err(OSP_ERR_NOMEM, "out of memory parsing the template");
        v[0] = arg;
        t->v = v;
        t->nv = 1;
    }
    t->a = node;
    if (negated) {
        jnode *n;
        OSP_TRY(mk(p, JN_NOT, line, &n));
        n->a = t;
        t = n;
    }
    *out = t;
    return OSP_OK;
}

static osp_status parse_subscribed(parser *p, jnode **out) {
    uint32_t line = cur(p)->line;
    jnode *args[3] = {0};
    if (cur(p)->kind == JT_COLON) {
        next(p);
    } else {
        jnode *e;
        OSP_TRY(parse_expression(p, 1, &e));
        if (cur(p)->kind != JT_COLON) { *out = e; return OSP_OK; }
        next(p);
        args[0] = e;
    }
    if (cur(p)->kind != JT_COLON && cur(p)->kind != JT_RBRACKET && cur(p)->kind != JT_COMMA)
        OSP_TRY(parse_expression(p, 1, &args[1]));
    if (cur(p)->kind == JT_COLON) {
        next(p);
        if (cur(p)->kind != JT_RBRACKET && cur(p)->kind != JT_COMMA) OSP_TRY(parse_expression(p, 1, &args[2]));
    }
    jnode *s;
    OSP_TRY(mk(p, JN_SLICE, line, &s));
    s->a = args[0];
    s->b = args[1];
    s->c = args[2];
    *out = s;
    return OSP_OK;
}

static osp_status parse_subscript(parser *p, jnode *node, jnode **out) {
    jtok *t = cur(p);
    next(p);
    jnode *n;
    if (t->kind == JT_DOT) {
        jtok *a = cur(p);
        next(p);
        if (a->kind == JT_NAME) {
            OSP_TRY(mk(p, JN_GETATTR, t->line, &n));
            n->a = node;
            n->name = a->s;
            *out = n;
            return OSP_OK;
        }
        if (a->kind != JT_INT) return pfail(p, a->line, "expected name or number");
        jnode *k;
        OSP_TRY(mk(p, JN_CONST, a->line, &k));
        k->val = jv_int(a->i);
        OSP_TRY(mk(p, JN_GETITEM, t->line, &n));
        n->a = node;
        n->b = k;
        *out = n;
        return OSP_OK;
    }
    /* "[" */
    nvec args = {0};
    while (cur(p)->kind != JT_RBRACKET) {
        if (args.n) OSP_TRY(expect(p, JT_COMMA, NULL));
        jnode *e;
        OSP_TRY(parse_subscribed(p, &e));
        OSP_TRY(push(p, &args, e));
    }
    OSP_TRY(expect(p, JT_RBRACKET, NULL));
    OSP_TRY(mk(p, JN_GETITEM, t->line, &n));
    n->a = node;
    if (args.n == 1) {
        n->b = args.v[0];
    } else {
        for (uint32_t i = 0; i < args.n; i++)
            if (args.v[i]->kind == JN_SLICE) return pfail(p, t->line, "multi-dimensional slices are not supported");
        jnode *tup;
        OSP_TRY(mk(p, JN_TUPLE, t->line, &tup));
        tup->v = args.v;
        tup->nv = args.n;
        n->b = tup;
    }
    *out = n;
    return OSP_OK;
}

static osp_status parse_postfix(parser *p, jnode *node, jnode **out) {
    for (;;) {
        jtok_kind k = (jtok_kind)cur(p)->kind;
        if (k == JT_DOT || k == JT_LBRACKET) {
            OSP_TRY(parse_subscript(p, node, &node));
        } else if (k == JT_LPAREN) {
            jnode *c;
            OSP_TRY(mk(p, JN_CALL, cur(p)->line, &c));
            OSP_TRY(parse_call_args(p, c));
            c->a = node;
            node = c;
        } else {
            break;
        }
    }
    *out = node;
    return OSP_OK;
}

static osp_status parse_filter_expr(parser *p, jnode *node, jnode **out) {
    for (;;) {
        jtok *t = cur(p);
        if (t->kind == JT_PIPE) {
            OSP_TRY(parse_filter(p, node, 0, &node));
        } else if (is_name(t, "is")) {
            OSP_TRY(parse_test(p, node, &node));
        } else if (t->kind == JT_LPAREN) {
            jnode *c;
            OSP_TRY(mk(p, JN_CALL, t->line, &c));
            OSP_TRY(parse_call_args(p, c));
            c->a = node;
            node = c;
        } else {
            break;
        }
    }
    *out = node;
    return OSP_OK;
}

static osp_status parse_list_or_dict(parser *p, int dict, jnode **out) {
    jtok *open = cur(p);
    next(p);
    jtok_kind close = dict ? JT_RBRACE : JT_RBRACKET;
    nvec keys = {0}, vals = {0};
    while (cur(p)->kind != close) {
        if (keys.n) OSP_TRY(expect(p, JT_COMMA, NULL));
        if (cur(p)->kind == close) break;
        jnode *k, *v;
        OSP_TRY(parse_expression(p, 1, &k));
        OSP_TRY(push(p, &keys, k));
        if (dict) {
            OSP_TRY(expect(p, JT_COLON, NULL));
            OSP_TRY(parse_expression(p, 1, &v));
            OSP_TRY(push(p, &vals, v));
        }
    }
    OSP_TRY(expect(p, close, NULL));
    jnode *n;
    OSP_TRY(mk(p, dict ? JN_DICT : JN_LIST, open->line, &n));
    n->v = keys.v;
    n->nv = keys.n;
    n->w = vals.v;
    n->nw = vals.n;
    *out = n;
    return OSP_OK;
}

static osp_status parse_primary(parser *p, jnode **out) {
    jtok *t = cur(p);
    jnode *n;
    OSP_TRY(enter(p));
    switch (t->kind) {
    case JT_NAME:
        OSP_TRY(mk(p, JN_CONST, t->line, &n));
        if (is_name(t, "true") || is_name(t, "True")) n->val = jv_bool(1);
        else if (is_name(t, "false") || is_name(t, "False")) n->val = jv_bool(0);
        else if (is_name(t, "none") || is_name(t, "None")) n->val = jv_none();
        else { n->kind = JN_NAME; n->name = t->s; }
        next(p);
        break;
    case JT_STRING: {
        OSP_TRY(mk(p, JN_CONST, t->line, &n));
        size_t total = 0, k = p->i;
        while (p->t[k].kind == JT_STRING) total += p->t[k++].s.n;
        if (k == p->i + 1) {
            n->val = jv_strn(t->s.s, t->s.n);
            next(p);
        } else {
            char *buf = ja_alloc(p->a, total + 1);
            if (!buf) return osp_err(OSP_ERR_NOMEM, "out of memory parsing the template");
            size_t o = 0;
            while (cur(p)->kind == JT_STRING) {
                memcpy(buf + o, cur(p)->s.s, cur(p)->s.n);
                o += cur(p)->s.n;
                next(p);
            }
            n->val = jv_strn(buf, o);
        }
        break;
    }
    case JT_INT:
    case JT_FLOAT:
        OSP_TRY(mk(p, JN_CONST, t->line, &n));
        n->val = t->kind == JT_INT ? jv_int(t->i) : jv_float(t->d);
        next(p);
        break;
    case JT_LPAREN:
        next(p);
        OSP_TRY(parse_tuple(p, TUP_FULL, NULL, 1, &n));
        OSP_TRY(expect(p, JT_RPAREN, NULL));
        break;
    case JT_LBRACKET:
        OSP_TRY(parse_list_or_dict(p, 0, &n));
        break;
    case JT_LBRACE:
        OSP_TRY(parse_list_or_dict(p, 1, &n));
        break;
    default: {
        char d[80];
        describe(t, d, sizeof d);
        return pfail(p, t->line, "unexpected '%s'", d);
    }
    }
    p->depth--;
    *out = n;
    return OSP_OK;
}

static osp_status parse_unary(parser *p, int with_filter, jnode **out) {
    jtok *t = cur(p);
    jnode *n;
    OSP_TRY(enter(p));
    if (t->kind == JT_SUB || t->kind == JT_ADD) {
        next(p);
        OSP_TRY(mk(p, t->kind == JT_SUB ? JN_NEG : JN_POS, t->line, &n));
        OSP_TRY(parse_unary(p, 0, &n->a));
    } else {
        OSP_TRY(parse_primary(p, &n));
    }
    OSP_TRY(parse_postfix(p, n, &n));
    if (with_filter) OSP_TRY(parse_filter_expr(p, n, &n));
    p->depth--;
    *out = n;
    return OSP_OK;
}

static osp_status binop(parser *p, jnode_kind k, int op, uint32_t line, jnode *a, jnode *b, jnode **out) {
    jnode *n;
    OSP_TRY(mk(p, k, line, &n));
    n->op = (uint8_t)op;
    n->a = a;
    n->b = b;
    *out = n;
    return OSP_OK;
}

static osp_status parse_pow(parser *p, jnode **out) {
    jnode *left, *right;
    OSP_TRY(parse_unary(p, 1, &left));
    while (cur(p)->kind == JT_POW) {
        uint32_t line = cur(p)->line;
        next(p);
        OSP_TRY(parse_unary(p, 1, &right));
        OSP_TRY(binop(p, JN_BINOP, JO_POW, line, left, right, &left));
    }
    *out = left;
    return OSP_OK;
}

static osp_status parse_math2(parser *p, jnode **out) {
    jnode *left, *right;
    OSP_TRY(parse_pow(p, &left));
    for (;;) {
        jtok_kind k = (jtok_kind)cur(p)->kind;
        int op = k == JT_MUL ? JO_MUL : k == JT_DIV ? JO_DIV : k == JT_FLOORDIV ? JO_FLOORDIV : k == JT_MOD ? JO_MOD : -1;
        if (op < 0) break;
        uint32_t line = cur(p)->line;
        next(p);
        OSP_TRY(parse_pow(p, &right));
        OSP_TRY(binop(p, JN_BINOP, op, line, left, right, &left));
    }
    *out = left;
    return OSP_OK;
}

static osp_status parse_concat(parser *p, jnode **out) {
    uint32_t line = cur(p)->line;
    jnode *first;
    OSP_TRY(parse_math2(p, &first));
    if (cur(p)->kind != JT_TILDE) { *out = first; return OSP_OK; }
    nvec args = {0};
    OSP_TRY(push(p, &args, first));
    while (cur(p)->kind == JT_TILDE) {
        next(p);
        jnode *e;
        OSP_TRY(parse_math2(p, &e));
        OSP_TRY(push(p, &args, e));
    }
    jnode *n;
    OSP_TRY(mk(p, JN_CONCAT, line, &n));
    n->v = args.v;
    n->nv = args.n;
    *out = n;
    return OSP_OK;
}

static osp_status parse_math1(parser *p, jnode **out) {
    jnode *left, *right;
    OSP_TRY(parse_concat(p, &left));
    while (cur(p)->kind == JT_ADD || cur(p)->kind == JT_SUB) {
        int op = cur(p)->kind == JT_ADD ? JO_ADD : JO_SUB;
        uint32_t line = cur(p)->line;
        next(p);
        OSP_TRY(parse_concat(p, &right));
        OSP_TRY(binop(p, JN_BINOP, op, line, left, right, &left));
    }
    *out = left;
    return OSP_OK;
}

static osp_status parse_compare(parser *p, jnode **out) {
    uint32_t line = cur(p)->line;
    jnode *expr;
    OSP_TRY(parse_math1(p, &expr));
    nvec ops = {0};
    uint8_t opcodes[64];
    for (;;) {
        jtok *t = cur(p);
        int op = -1;
        switch (t->kind) {
        case JT_EQ: op = JO_EQ; break;
        case JT_NE: op = JO_NE; break;
        case JT_LT: op = JO_LT; break;
        case JT_LTEQ: op = JO_LE; break;
        case JT_GT: op = JO_GT; break;
        case JT_GTEQ: op = JO_GE; break;
        default: break;
        }
        if (op >= 0) next(p);
        else if (is_name(t, "in")) { next(p); op = JO_IN; }
        else if (is_name(t, "not") && is_name(look(p), "in")) { next(p); next(p); op = JO_NOTIN; }
        else break;
        if (ops.n == sizeof opcodes) return pfail(p, t->line, "comparison chain too long");
        jnode *e;
        OSP_TRY(parse_math1(p, &e));
        opcodes[ops.n] = (uint8_t)op;
        OSP_TRY(push(p, &ops, e));
    }
    if (!ops.n) { *out = expr; return OSP_OK; }
    jnode *n;
    OSP_TRY(mk(p, JN_COMPARE, line, &n));
    n->a = expr;
    n->v = ops.v;
    n->nv = ops.n;
    n->ops = ja_alloc(p->a, ops.n);
    if (!n->ops) return osp_err(OSP_ERR_NOMEM, "out of memory parsing the template");
    memcpy(n->ops, opcodes, ops.n);
    *out = n;
    return OSP_OK;
}

static osp_status parse_not(parser *p, jnode **out) {
    if (is_name(cur(p), "not")) {
        jnode *n;
        OSP_TRY(enter(p));
        OSP_TRY(mk(p, JN_NOT, cur(p)->line, &n));
        next(p);
        OSP_TRY(parse_not(p, &n->a));
        p->depth--;
        *out = n;
        return OSP_OK;
    }
    return parse_compare(p, out);
}

static osp_status parse_and(parser *p, jnode **out) {
    jnode *left, *right;
    OSP_TRY(parse_not(p, &left));
    while (is_name(cur(p), "and")) {
        uint32_t line = cur(p)->line;
        next(p);
        OSP_TRY(parse_not(p, &right));
        OSP_TRY(binop(p, JN_AND, 0, line, left, right, &left));
    }
    *out = left;
    return OSP_OK;
}

static osp_status parse_or(parser *p, jnode **out) {
    jnode *left, *right;
    OSP_TRY(parse_and(p, &left));
    while (is_name(cur(p), "or")) {
        uint32_t line = cur(p)->line;
        next(p);
        OSP_TRY(parse_and(p, &right));
        OSP_TRY(binop(p, JN_OR, 0, line, left, right, &left));
    }
    *out = left;
    return OSP_OK;
}

static osp_status parse_condexpr(parser *p, jnode **out) {
    uint32_t line = cur(p)->line;
    jnode *e1;
    size_t mark = p->n_unknown;
    OSP_TRY(enter(p));
    OSP_TRY(parse_or(p, &e1));
    if (is_name(cur(p), "if")) p->soft++;
    int cond = 0;
    while (is_name(cur(p), "if")) {
        cond = 1;
        next(p);
        jnode *n;
        OSP_TRY(mk(p, JN_COND, line, &n));
        OSP_TRY(parse_or(p, &n->a));
        if (is_name(cur(p), "else")) {
            next(p);
            OSP_TRY(parse_condexpr(p, &n->c));
        }
        n->b = e1;
        e1 = n;
        line = cur(p)->line;
    }
    if (cond) {
        p->soft--;
        for (size_t i = mark; i < p->n_unknown; i++) p->unknown_soft[i] = 1;
    }
    p->depth--;
    *out = e1;
    return OSP_OK;
}

static osp_status parse_expression(parser *p, int with_condexpr, jnode **out) {
    return with_condexpr ? parse_condexpr(p, out) : parse_or(p, out);
}

/* ------------------------------------------------------------------ statements */

static osp_status subparse(parser *p, const char *const *ends, jnode **out);

static int can_assign(const jnode *n) {
    if (n->kind == JN_NAME) return 1;
    if (n->kind != JN_TUPLE) return 0;
    for (uint32_t i = 0; i < n->nv; i++)
        if (!can_assign(n->v[i])) return 0;
    return 1;
}

static osp_status parse_assign_target(parser *p, int with_namespace, const char *extra_end, jnode **out) {
    jtok *t = cur(p);
    jnode *n;
    if (with_namespace && t->kind == JT_NAME && look(p)->kind == JT_DOT) {
        OSP_TRY(mk(p, JN_NSREF, t->line, &n));
        n->name = t->s;
        next(p);
        next(p);
        jtok *a;
        OSP_TRY(expect(p, JT_NAME, &a));
        n->attr = a->s;
    } else {
        OSP_TRY(parse_tuple(p, TUP_SIMPLE, extra_end, 0, &n));
        if (!can_assign(n)) return pfail(p, t->line, "can't assign to '%s'", n->kind == JN_CONST ? "const" : "expression");
    }
    *out = n;
    return OSP_OK;
}

static osp_status name_only(parser *p, jstr *out) {
    jtok *t = cur(p);
    if (t->kind != JT_NAME) {
        char d[80];
        describe(t, d, sizeof d);
        return pfail(p, t->line, "expected token 'name', got '%s'", d);
    }
    if (is_name(t, "true") || is_name(t, "false") || is_name(t, "none") || is_name(t, "True") ||
        is_name(t, "False") || is_name(t, "None"))
        return pfail(p, t->line, "can't assign to 'const'");
    *out = t->s;
    next(p);
    return OSP_OK;
}

/* After a tag's arguments: "%}", then the body up to one of `ends`. */
static osp_status parse_statements(parser *p, const char *const *ends, int drop_needle, const char *tag,
                                   uint32_t tag_line, jnode **out) {
    if (cur(p)->kind == JT_COLON) next(p);
    OSP_TRY(expect(p, JT_BLOCK_END, NULL));
    OSP_TRY(subparse(p, ends, out));
    if (cur(p)->kind == JT_EOF) {
        char want[128] = "";
        for (int i = 0; ends[i]; i++) {
            size_t l = strlen(want);
            snprintf(want + l, sizeof want - l, "%s'%s'", i ? " or " : "", ends[i]);
        }
        return pfail(p, cur(p)->line, "unexpected end of template: looking for %s to close the '%s' on line %u",
                     want, tag, tag_line);
    }
    if (drop_needle) next(p);
    return OSP_OK;
}

static osp_status parse_for(parser *p, jnode **out) {
    uint32_t line = cur(p)->line;
    next(p);
    jnode *n;
    OSP_TRY(mk(p, JN_FOR, line, &n));
    OSP_TRY(parse_assign_target(p, 0, "in", &n->a));
    OSP_TRY(expect_name(p, "in"));
    OSP_TRY(parse_tuple(p, TUP_NOCOND, "recursive", 0, &n->b));
    int soft = p->soft;
    p->soft = 0; /* the loop's own frame */
    if (is_name(cur(p), "if")) {
        next(p);
        OSP_TRY(parse_expression(p, 1, &n->c));
    }
    if (is_name(cur(p), "recursive")) return pfail(p, cur(p)->line, "recursive for loops are not supported");
    static const char *const ends1[] = {"endfor", "else", NULL};
    static const char *const ends2[] = {"endfor", NULL};
    p->loops++;
    OSP_TRY(parse_statements(p, ends1, 0, "for", line, &n->d));
    p->loops--;
    int has_else = is_name(cur(p), "else");
    next(p);
    if (has_else) OSP_TRY(parse_statements(p, ends2, 1, "for", line, &n->e));
    p->soft = soft;
    *out = n;
    return OSP_OK;
}

static osp_status parse_if(parser *p, jnode **out) {
    uint32_t line = cur(p)->line;
    next(p);
    static const char *const ends1[] = {"elif", "else", "endif", NULL};
    static const char *const ends2[] = {"endif", NULL};
    jnode *result = NULL, *node = NULL;
    p->soft++;
    for (;;) {
        jnode *n;
        OSP_TRY(mk(p, JN_IF, cur(p)->line, &n));
        OSP_TRY(parse_tuple(p, TUP_NOCOND, NULL, 0, &n->a));
        OSP_TRY(parse_statements(p, ends1, 0, "if", line, &n->b));
        if (!result) result = n;
        else node->c = n;
        node = n;
        jtok *t = cur(p);
        next(p);
        if (is_name(t, "elif")) continue;
        if (is_name(t, "else")) OSP_TRY(parse_statements(p, ends2, 1, "if", line, &node->c));
        break;
    }
    p->soft--;
    *out = result;
    return OSP_OK;
}

static osp_status parse_set(parser *p, jnode **out) {
    uint32_t line = cur(p)->line;
    next(p);
    jnode *target;
    OSP_TRY(parse_assign_target(p, 1, NULL, &target));
    jnode *n;
    if (cur(p)->kind == JT_ASSIGN) {
        next(p);
        OSP_TRY(mk(p, JN_SET, line, &n));
        n->a = target;
        OSP_TRY(parse_tuple(p, TUP_FULL, NULL, 0, &n->b));
        *out = n;
        return OSP_OK;
    }
    static const char *const ends[] = {"endset", NULL};
    OSP_TRY(mk(p, JN_SET_BLOCK, line, &n));
    n->a = target;
    int soft = p->soft;
    p->soft = 0;
    if (cur(p)->kind == JT_PIPE) OSP_TRY(parse_filter(p, NULL, 0, &n->b));
    OSP_TRY(parse_statements(p, ends, 1, "set", line, &n->d));
    p->soft = soft;
    *out = n;
    return OSP_OK;
}

static int reads_name(const jnode *n, const char *name) {
    if (!n) return 0;
    if (n->kind == JN_NAME && n->name.n == strlen(name) && !memcmp(n->name.s, name, n->name.n)) return 1;
    if (reads_name(n->a, name) || reads_name(n->b, name) || reads_name(n->c, name) || reads_name(n->d, name) ||
        reads_name(n->e, name))
        return 1;
    for (uint32_t i = 0; i < n->nv; i++)
        if (reads_name(n->v[i], name)) return 1;
    for (uint32_t i = 0; i < n->nw; i++)
        if (reads_name(n->w[i], name)) return 1;
    return 0;
}

static osp_status parse_macro(parser *p, jnode **out) {
    uint32_t line = cur(p)->line;
    next(p);
    jnode *n;
    OSP_TRY(mk(p, JN_MACRO, line, &n));
    int soft = p->soft;
    p->soft = 0;
    OSP_TRY(name_only(p, &n->name));
    OSP_TRY(expect(p, JT_LPAREN, NULL));
    nvec defs = {0};
    jstr params[64];
    int have_default = 0;
    while (cur(p)->kind != JT_RPAREN) {
        if (defs.n) OSP_TRY(expect(p, JT_COMMA, NULL));
        if (defs.n == 64) return pfail(p, cur(p)->line, "too many macro parameters");
        OSP_TRY(name_only(p, &params[defs.n]));
        jnode *d = NULL;
        if (cur(p)->kind == JT_ASSIGN) {
            next(p);
            OSP_TRY(parse_expression(p, 1, &d));
            have_default = 1;
        } else if (have_default) {
            return pfail(p, cur(p)->line, "non-default argument follows default argument");
        }
        OSP_TRY(push(p, &defs, d));
    }
    OSP_TRY(expect(p, JT_RPAREN, NULL));
    n->v = defs.v;
    n->nv = defs.n;
    n->names = ja_alloc(p->a, (defs.n + 1) * sizeof *n->names);
    if (!n->names) return osp_err(OSP_ERR_NOMEM, "out of memory parsing the template");
    memcpy(n->names, params, defs.n * sizeof *params);
    static const char *const ends[] = {"endmacro", NULL};
    int loops = p->loops;
    p->loops = 0;
    OSP_TRY(parse_statements(p, ends, 1, "macro", line, &n->d));
    p->loops = loops;
    if (reads_name(n->d, "varargs")) n->flags |= JNF_VARARGS;
    if (reads_name(n->d, "kwargs")) n->flags |= JNF_KWARGS;
    if (reads_name(n->d, "caller")) return pfail(p, line, "macros using 'caller' (call blocks) are not supported");
    p->soft = soft;
    *out = n;
    return OSP_OK;
}

static osp_status parse_with(parser *p, jnode **out) {
    uint32_t line = cur(p)->line;
    next(p);
    jnode *n;
    OSP_TRY(mk(p, JN_WITH, line, &n));
    nvec targets = {0}, values = {0};
    while (cur(p)->kind != JT_BLOCK_END) {
        if (targets.n) OSP_TRY(expect(p, JT_COMMA, NULL));
        jnode *t, *v;
        OSP_TRY(parse_assign_target(p, 0, NULL, &t));
        OSP_TRY(expect(p, JT_ASSIGN, NULL));
        OSP_TRY(parse_expression(p, 1, &v));
        OSP_TRY(push(p, &targets, t));
        OSP_TRY(push(p, &values, v));
    }
    n->v = targets.v;
    n->nv = targets.n;
    n->w = values.v;
    n->nw = values.n;
    static const char *const ends[] = {"endwith", NULL};
    int soft = p->soft;
    p->soft = 0;
    OSP_TRY(parse_statements(p, ends, 1, "with", line, &n->d));
    p->soft = soft;
    *out = n;
    return OSP_OK;
}

/* {% print a, b %}: a body of outputs. */
static osp_status parse_print(parser *p, jnode **out) {
    uint32_t line = cur(p)->line;
    next(p);
    nvec items = {0};
    while (cur(p)->kind != JT_BLOCK_END) {
        if (items.n) OSP_TRY(expect(p, JT_COMMA, NULL));
        jnode *o;
        OSP_TRY(mk(p, JN_OUTPUT, cur(p)->line, &o));
        OSP_TRY(parse_expression(p, 1, &o->a));
        OSP_TRY(push(p, &items, o));
    }
    jnode *n;
    OSP_TRY(mk(p, JN_BODY, line, &n));
    n->v = items.v;
    n->nv = items.n;
    *out = n;
    return OSP_OK;
}

static osp_status parse_statement(parser *p, jnode **out) {
    jtok *t = cur(p);
    if (t->kind != JT_NAME) return pfail(p, t->line, "tag name expected");
    OSP_TRY(enter(p));
    if (is_name(t, "for")) OSP_TRY(parse_for(p, out));
    else if (is_name(t, "if")) OSP_TRY(parse_if(p, out));
    else if (is_name(t, "set")) OSP_TRY(parse_set(p, out));
    else if (is_name(t, "macro")) OSP_TRY(parse_macro(p, out));
    else if (is_name(t, "with")) OSP_TRY(parse_with(p, out));
    else if (is_name(t, "print")) OSP_TRY(parse_print(p, out));
    else if (is_name(t, "filter")) {
        uint32_t line = t->line;
        next(p);
        jnode *n;
        OSP_TRY(mk(p, JN_FILTER_BLOCK, line, &n));
        int soft = p->soft;
        p->soft = 0;
        OSP_TRY(parse_filter(p, NULL, 1, &n->b));
        static const char *const ends[] = {"endfilter", NULL};
        OSP_TRY(parse_statements(p, ends, 1, "filter", line, &n->d));
        p->soft = soft;
        *out = n;
    } else if (is_name(t, "generation")) {
        /* Hugging Face's AssistantTracker: the body, in its own scope. */
        uint32_t line = t->line;
        next(p);
        jnode *n;
        OSP_TRY(mk(p, JN_WITH, line, &n));
        static const char *const ends[] = {"endgeneration", NULL};
        int soft = p->soft;
        p->soft = 0;
        OSP_TRY(parse_statements(p, ends, 1, "generation", line, &n->d));
        p->soft = soft;
        *out = n;
    } else if (is_name(t, "break") || is_name(t, "continue")) {
        if (!p->loops)
            return pfail(p, t->line, "'%.*s' outside of a for loop", (int)t->s.n, t->s.s);
        OSP_TRY(mk(p, is_name(t, "break") ? JN_BREAK : JN_CONTINUE, t->line, out));
        next(p);
    } else if (is_name(t, "include") || is_name(t, "import") || is_name(t, "from") || is_name(t, "extends")) {
        return pfail(p, t->line, "the '%.*s' tag is not allowed: templates cannot load other templates",
                     (int)t->s.n, t->s.s);
    } else if (is_name(t, "block") || is_name(t, "call") || is_name(t, "autoescape")) {
        return pfail(p, t->line, "the '%.*s' tag is not supported", (int)t->s.n, t->s.s);
    } else {
        return pfail(p, t->line, "Encountered unknown tag '%.*s'.", (int)t->s.n, t->s.s);
    }
    p->depth--;
    return OSP_OK;
}

static osp_status subparse(parser *p, const char *const *ends, jnode **out) {
    nvec body = {0};
    uint32_t line = cur(p)->line;
    while (cur(p)->kind != JT_EOF) {
        jtok *t = cur(p);
        jnode *n;
        if (t->kind == JT_DATA) {
            OSP_TRY(mk(p, JN_DATA, t->line, &n));
            n->name = t->s;
            next(p);
        } else if (t->kind == JT_VAR_BEGIN) {
            next(p);
            OSP_TRY(mk(p, JN_OUTPUT, t->line, &n));
            OSP_TRY(parse_tuple(p, TUP_FULL, NULL, 0, &n->a));
            OSP_TRY(expect(p, JT_VAR_END, NULL));
        } else if (t->kind == JT_BLOCK_BEGIN) {
            next(p);
            if (ends)
                for (int i = 0; ends[i]; i++)
                    if (is_name(cur(p), ends[i])) goto done;
            OSP_TRY(parse_statement(p, &n));
            OSP_TRY(expect(p, JT_BLOCK_END, NULL));
        } else {
            char d[80];
            describe(t, d, sizeof d);
            return pfail(p, t->line, "unexpected '%s'", d);
        }
        OSP_TRY(push(p, &body, n));
    }
done:;
    jnode *b;
    OSP_TRY(mk(p, JN_BODY, line, &b));
    b->v = body.v;
    b->nv = body.n;
    *out = b;
    return OSP_OK;
}

/* jinja2 3.x: split on \r\n, \r, \n; drop one trailing newline; join with \n. */
static size_t normalize(const char *src, size_t len, char *dst) {
    size_t k = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            dst[k++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n') i++;
        } else {
            dst[k++] = src[i];
        }
    }
    if (k && dst[k - 1] == '\n') k--;
    dst[k] = 0;
    return k;
}

osp_status osp_jinja_parse(const char *src, size_t len, osp_jinja_template **out) {
    *out = NULL;
    if (!src) return osp_err(OSP_ERR_INVALID, "template source is NULL");
    if (len > ((size_t)1 << 30)) return osp_err(OSP_ERR_RANGE, "template is too large (%zu bytes)", len);
    if (!ju_valid(src, len)) return osp_err(OSP_ERR_FORMAT, "template is not valid UTF-8");
    osp_jinja_template *t = osp_calloc(OSP_POOL_MISC, sizeof *t);
    if (!t) return osp_err(OSP_ERR_NOMEM, "out of memory");
    ja_init(&t->arena, SIZE_MAX);
    osp_status st = OSP_ERR_NOMEM;
    t->src = ja_alloc(&t->arena, len + 1);
    if (!t->src) { osp_err(st, "out of memory"); goto fail; }
    size_t n = normalize(src, len, t->src);
    jtok *toks;
    size_t ntok;
    st = jlex(&t->arena, t->src, n, &toks, &ntok);
    if (st != OSP_OK) goto fail;
    parser p = {.a = &t->arena, .t = toks, .n = ntok};
    st = subparse(&p, NULL, &t->root);
    if (st != OSP_OK) goto fail;
    for (size_t i = 0; i < p.n_unknown; i++) {
        if (p.unknown_soft[i]) continue;
        const jnode *u = p.unknown[i];
        st = pfail(&p, u->line, "No %s named '%.*s'.", u->kind == JN_FILTER ? "filter" : "test", (int)u->name.n,
                   u->name.s);
        goto fail;
    }
    *out = t;
    return OSP_OK;
fail:
    osp_jinja_free(t);
    return st;
}

void osp_jinja_free(osp_jinja_template *t) {
    if (!t) return;
    ja_free(&t->arena);
    osp_free(t);
}
