/* text/jinja evaluator: a tree-walking interpreter over the AST.
 *
 * Scopes follow jinja2: the render variables and top-level {% set %} share
 * the root scope; each for-loop iteration, macro call and {% with %} gets a
 * child scope (assignments there do not leak out; reads fall through to
 * the parents); {% if %} has none. A macro closes over the scope it was
 * defined in, so it sees later top-level definitions (other macros), as
 * Python closures do.
 *
 * Every node evaluated and every loop iteration is one step; jstep()
 * enforces the step budget and the C stack budget, and macro calls count
 * against max_depth, so no template can hang or overflow the stack.
 */
#include <stdlib.h>
#include <time.h>
#include "text/jinja_internal.h"

osp_status jstep(jstate *st) {
    if (++st->steps > st->max_steps)
        return jerr(st, OSP_ERR_RANGE, "rendering exceeded the limit of %llu evaluation steps",
                    (unsigned long long)st->max_steps);
    uintptr_t here = (uintptr_t)__builtin_frame_address(0);
    size_t used = st->stack_base > here ? st->stack_base - here : here - st->stack_base;
    if (used > st->max_stack) return jerr(st, OSP_ERR_RANGE, "template nested too deeply (stack limit reached)");
    return OSP_OK;
}

/* ------------------------------------------------------------------ scopes */

static osp_status scope_new(jstate *st, jscope *parent, jscope **out) {
    jscope *s;
    JALLOC(st, s, sizeof *s);
    s->parent = parent;
    *out = s;
    return OSP_OK;
}

static jv *scope_find(jscope *s, jstr name) {
    for (; s; s = s->parent)
        for (uint32_t i = s->n; i > 0; i--) {
            jvar *v = &s->vars[i - 1];
            if (v->name.n == name.n && !memcmp(v->name.s, name.s, name.n)) return &v->v;
        }
    return NULL;
}

static osp_status scope_set(jstate *st, jscope *s, jstr name, jv v) {
    for (uint32_t i = 0; i < s->n; i++)
        if (s->vars[i].name.n == name.n && !memcmp(s->vars[i].name.s, name.s, name.n)) {
            s->vars[i].v = v;
            return OSP_OK;
        }
    if (s->n == s->cap) {
        uint32_t nc = s->cap ? s->cap * 2 : 8;
        jvar *a;
        JALLOC(st, a, nc * sizeof *a);
        if (s->n) memcpy(a, s->vars, s->n * sizeof *a);
        s->vars = a;
        s->cap = nc;
    }
    s->vars[s->n].name = name;
    s->vars[s->n].v = v;
    s->n++;
    return OSP_OK;
}

static osp_status lookup(jstate *st, jstr name, jv *out) {
    jv *v = scope_find(st->scope, name);
    if (v) { *out = *v; return OSP_OK; }
    const jfunc *f = jglobal_find(name.s, name.n);
    if (f) {
        *out = jv_make(JK_FUNC);
        out->u.fn = f;
        return OSP_OK;
    }
    return jv_undef_name(st, name, out);
}

/* ------------------------------------------------------------------ expressions */

static osp_status eval(jstate *st, const jnode *n, jv *out);
static osp_status exec_body(jstate *st, const jnode *body);

static osp_status eval_args(jstate *st, const jnode *n, jargs *a) {
    jv *v = NULL, *kv = NULL;
    if (n->nv) JALLOC(st, v, n->nv * sizeof *v);
    if (n->nw) JALLOC(st, kv, n->nw * sizeof *kv);
    for (uint32_t i = 0; i < n->nv; i++) OSP_TRY(eval(st, n->v[i], &v[i]));
    for (uint32_t i = 0; i < n->nw; i++) OSP_TRY(eval(st, n->w[i], &kv[i]));
    a->n = n->nv;
    a->v = v;
    a->nkw = n->nw;
    a->kwn = n->names;
    a->kwv = kv;
    return OSP_OK;
}

static osp_status call_macro(jstate *st, const jmacro *m, const jargs *a, jv *out) {
    const jnode *d = m->def;
    int name_n = (int)d->name.n;
    if (st->depth >= st->max_depth)
        return jerr(st, OSP_ERR_RANGE, "macro calls nested deeper than %d (recursion limit)", st->max_depth);
    if (a->n > d->nv && !(d->flags & JNF_VARARGS))
        return jerr(st, OSP_ERR_INVALID, "TypeError: macro '%.*s' takes not more than %u argument(s)", name_n,
                    d->name.s, d->nv);
    jscope *sc;
    OSP_TRY(scope_new(st, m->closure, &sc));
    uint8_t bound[64] = {0};
    uint32_t npos = a->n < d->nv ? a->n : d->nv;
    for (uint32_t i = 0; i < npos; i++) {
        OSP_TRY(scope_set(st, sc, d->names[i], a->v[i]));
        bound[i] = 1;
    }
    jdict *kwargs = NULL;
    if (d->flags & JNF_KWARGS) OSP_TRY(jdict_new(st, 0, &kwargs));
    for (uint32_t k = 0; k < a->nkw; k++) {
        jstr kn = a->kwn[k];
        uint32_t i;
        for (i = 0; i < d->nv; i++)
            if (d->names[i].n == kn.n && !memcmp(d->names[i].s, kn.s, kn.n)) break;
        if (i < d->nv) {
            if (bound[i])
                return jerr(st, OSP_ERR_INVALID, "TypeError: macro '%.*s' got multiple values for argument '%.*s'",
                            name_n, d->name.s, (int)kn.n, kn.s);
            OSP_TRY(scope_set(st, sc, kn, a->kwv[k]));
            bound[i] = 1;
        } else if (kwargs) {
            OSP_TRY(jdict_set(st, kwargs, jv_strn(kn.s, kn.n), a->kwv[k]));
        } else {
            return jerr(st, OSP_ERR_INVALID, "TypeError: macro '%.*s' takes no keyword argument '%.*s'", name_n,
                        d->name.s, (int)kn.n, kn.s);
        }
    }
    jscope *saved = st->scope;
    st->scope = sc;
    osp_status rc = OSP_OK;
    for (uint32_t i = 0; i < d->nv && rc == OSP_OK; i++) {
        if (bound[i]) continue;
        jv v;
        if (d->v[i]) rc = eval(st, d->v[i], &v);
        else v = jv_undef(JUR_PARAM, d->names[i].s, d->names[i].n, 0);
        if (rc == OSP_OK) rc = scope_set(st, sc, d->names[i], v);
    }
    if (rc == OSP_OK && (d->flags & JNF_VARARGS)) {
        jlist *l;
        rc = jlist_new(st, a->n > d->nv ? a->n - d->nv : 0, &l);
        for (uint32_t i = d->nv; rc == OSP_OK && i < a->n; i++) l->v[l->n++] = a->v[i];
        if (rc == OSP_OK) rc = scope_set(st, sc, (jstr){"varargs", 7}, jv_list(l, 1));
    }
    if (rc == OSP_OK && kwargs) rc = scope_set(st, sc, (jstr){"kwargs", 6}, jv_dict(kwargs));
    if (rc == OSP_OK) {
        jbuf buf = {0};
        jbuf *saved_out = st->out;
        st->out = &buf;
        st->depth++;
        rc = exec_body(st, d->d);
        st->depth--;
        st->out = saved_out;
        if (rc == OSP_OK) rc = jbuf_take(st, &buf, out);
        else jbuf_free(st, &buf);
    }
    st->scope = saved;
    return rc;
}

osp_status jcall(jstate *st, jv callee, const jargs *a, jv *out) {
    switch (callee.k) {
    case JK_MACRO: return call_macro(st, callee.u.mac, a, out);
    case JK_FUNC: return callee.u.fn->fn(st, NULL, a, out);
    case JK_METHOD: return callee.u.meth->f->fn(st, &callee.u.meth->self, a, out);
    case JK_UNDEF: return jundef_fail(st, callee);
    case JK_LOOP: return jerr(st, OSP_ERR_INVALID, "recursive loops are not supported");
    default: return jerr(st, OSP_ERR_INVALID, "TypeError: '%s' object is not callable", jv_type_name(callee));
    }
}

static osp_status eval_compare(jstate *st, int op, jv l, jv r, int *res) {
    int c;
    switch (op) {
    case JO_EQ: *res = jv_eq(l, r); return OSP_OK;
    case JO_NE: *res = !jv_eq(l, r); return OSP_OK;
    case JO_IN: return jv_contains(st, r, l, res);
    case JO_NOTIN: OSP_TRY(jv_contains(st, r, l, res)); *res = !*res; return OSP_OK;
    default: break;
    }
    static const char *names[] = {[JO_LT] = "<", [JO_LE] = "<=", [JO_GT] = ">", [JO_GE] = ">="};
    if (jv_is_num(l) && jv_is_num(r) && (l.k == JK_FLOAT || r.k == JK_FLOAT)) {
        double x = l.k == JK_FLOAT ? l.u.d : (double)l.u.i, y = r.k == JK_FLOAT ? r.u.d : (double)r.u.i;
        *res = op == JO_LT ? x < y : op == JO_LE ? x <= y : op == JO_GT ? x > y : x >= y;
        return OSP_OK;
    }
    OSP_TRY(jv_cmp(st, l, r, names[op], &c));
    *res = op == JO_LT ? c < 0 : op == JO_LE ? c <= 0 : op == JO_GT ? c > 0 : c >= 0;
    return OSP_OK;
}

static osp_status eval_unary(jstate *st, const jnode *n, jv v, jv *out) {
    int neg = n->kind == JN_NEG;
    if (v.k == JK_UNDEF) return jundef_fail(st, v);
    if (v.k == JK_INT || v.k == JK_BOOL) {
        if (neg && v.u.i == INT64_MIN) return jerr(st, OSP_ERR_RANGE, "integer overflow");
        *out = jv_int(neg ? -v.u.i : v.u.i);
        return OSP_OK;
    }
    if (v.k == JK_FLOAT) { *out = jv_float(neg ? -v.u.d : v.u.d); return OSP_OK; }
    return jerr(st, OSP_ERR_INVALID, "TypeError: bad operand type for unary %c: '%s'", neg ? '-' : '+', jv_type_name(v));
}

static osp_status eval_filter(jstate *st, const jnode *n, const jv *input, jv *out) {
    jv base;
    if (n->a) {
        if (n->a->kind == JN_FILTER && !input) OSP_TRY(eval(st, n->a, &base));
        else if (n->a->kind == JN_FILTER) OSP_TRY(eval_filter(st, n->a, input, &base));
        else OSP_TRY(eval(st, n->a, &base));
    } else if (input) {
        base = *input;
    } else {
        return jerr(st, OSP_ERR_INTERNAL, "filter without input");
    }
    jargs a;
    OSP_TRY(eval_args(st, n, &a));
    st->line = n->line;
    if (!n->def) return jerr(st, OSP_ERR_INVALID, "No filter named '%.*s' found.", (int)n->name.n, n->name.s);
    return ((const jfilter_def *)n->def)->fn(st, base, &a, out);
}

static osp_status eval(jstate *st, const jnode *n, jv *out) {
    OSP_TRY(jstep(st));
    st->line = n->line;
    switch (n->kind) {
    case JN_CONST:
        *out = n->val;
        return OSP_OK;
    case JN_NAME:
        return lookup(st, n->name, out);
    case JN_LIST:
    case JN_TUPLE: {
        jlist *l;
        OSP_TRY(jlist_new(st, n->nv, &l));
        for (uint32_t i = 0; i < n->nv; i++) {
            OSP_TRY(eval(st, n->v[i], &l->v[i]));
            l->n++;
        }
        *out = jv_list(l, n->kind == JN_TUPLE);
        return OSP_OK;
    }
    case JN_DICT: {
        jdict *d;
        OSP_TRY(jdict_new(st, n->nv, &d));
        for (uint32_t i = 0; i < n->nv; i++) {
            jv k, v;
            OSP_TRY(eval(st, n->v[i], &k));
            OSP_TRY(eval(st, n->w[i], &v));
            if (k.k == JK_LIST || k.k == JK_DICT || k.k == JK_NS || k.k == JK_UNDEF)
                return jerr(st, OSP_ERR_INVALID, "TypeError: unhashable type: '%s'", jv_type_name(k));
            OSP_TRY(jdict_set(st, d, k, v));
        }
        *out = jv_dict(d);
        return OSP_OK;
    }
    case JN_GETATTR: {
        jv obj;
        OSP_TRY(eval(st, n->a, &obj));
        st->line = n->line;
        return jv_getattr(st, obj, n->name, out);
    }
    case JN_GETITEM: {
        jv obj, key;
        OSP_TRY(eval(st, n->a, &obj));
        const jnode *k = n->b;
        if (k->kind == JN_SLICE) {
            jv parts[3];
            const jnode *pn[3] = {k->a, k->b, k->c};
            for (int i = 0; i < 3; i++) {
                if (pn[i]) OSP_TRY(eval(st, pn[i], &parts[i]));
                else parts[i] = jv_make(JK_ABSENT);
            }
            st->line = n->line;
            return jv_slice(st, obj, parts[0], parts[1], parts[2], out);
        }
        OSP_TRY(eval(st, k, &key));
        st->line = n->line;
        return jv_getitem(st, obj, key, out);
    }
    case JN_CALL: {
        jv callee;
        jargs a;
        OSP_TRY(eval(st, n->a, &callee));
        OSP_TRY(eval_args(st, n, &a));
        st->line = n->line;
        return jcall(st, callee, &a, out);
    }
    case JN_FILTER:
        return eval_filter(st, n, NULL, out);
    case JN_TEST: {
        jv v;
        jargs a;
        OSP_TRY(eval(st, n->a, &v));
        OSP_TRY(eval_args(st, n, &a));
        st->line = n->line;
        int r = 0;
        if (!n->def) return jerr(st, OSP_ERR_INVALID, "No test named '%.*s' found.", (int)n->name.n, n->name.s);
        OSP_TRY(((const jtest_def *)n->def)->fn(st, v, &a, &r));
        *out = jv_bool(r);
        return OSP_OK;
    }
    case JN_NOT: {
        jv v;
        OSP_TRY(eval(st, n->a, &v));
        *out = jv_bool(!jv_truthy(v));
        return OSP_OK;
    }
    case JN_NEG:
    case JN_POS: {
        jv v;
        OSP_TRY(eval(st, n->a, &v));
        st->line = n->line;
        return eval_unary(st, n, v, out);
    }
    case JN_BINOP: {
        jv a, b;
        OSP_TRY(eval(st, n->a, &a));
        OSP_TRY(eval(st, n->b, &b));
        st->line = n->line;
        return jv_binop(st, n->op, a, b, out);
    }
    case JN_AND:
    case JN_OR: {
        jv a;
        OSP_TRY(eval(st, n->a, &a));
        if ((n->kind == JN_AND) != jv_truthy(a)) { *out = a; return OSP_OK; }
        return eval(st, n->b, out);
    }
    case JN_CONCAT: {
        jbuf b = {0};
        osp_status rc = OSP_OK;
        for (uint32_t i = 0; i < n->nv && rc == OSP_OK; i++) {
            jv v;
            rc = eval(st, n->v[i], &v);
            if (rc == OSP_OK) rc = jv_write_str(st, &b, v);
        }
        if (rc != OSP_OK) { jbuf_free(st, &b); return rc; }
        return jbuf_take(st, &b, out);
    }
    case JN_COMPARE: {
        jv l, r;
        OSP_TRY(eval(st, n->a, &l));
        for (uint32_t i = 0; i < n->nv; i++) {
            OSP_TRY(eval(st, n->v[i], &r));
            st->line = n->line;
            int res;
            OSP_TRY(eval_compare(st, n->ops[i], l, r, &res));
            if (!res) { *out = jv_bool(0); return OSP_OK; }
            l = r;
        }
        *out = jv_bool(1);
        return OSP_OK;
    }
    case JN_COND: {
        jv c;
        OSP_TRY(eval(st, n->a, &c));
        if (jv_truthy(c)) return eval(st, n->b, out);
        if (n->c) return eval(st, n->c, out);
        *out = jv_undef(JUR_COND, NULL, n->line, 0);
        return OSP_OK;
    }
    default:
        return jerr(st, OSP_ERR_INTERNAL, "unexpected node %d in an expression", n->kind);
    }
}

/* ------------------------------------------------------------------ statements */

static osp_status assign(jstate *st, const jnode *t, jv v) {
    if (t->kind == JN_NAME) return scope_set(st, st->scope, t->name, v);
    if (t->kind == JN_NSREF) {
        jv *ns = scope_find(st->scope, t->name);
        if (!ns || ns->k != JK_NS)
            return jerr(st, OSP_ERR_INVALID, "cannot assign attribute on non-namespace object");
        return jdict_set(st, ns->u.m, jv_strn(t->attr.s, t->attr.n), v);
    }
    /* tuple unpacking */
    if (!(v.k == JK_LIST || v.k == JK_TUPLE || v.k == JK_DICT || v.k == JK_STR))
        return jerr(st, OSP_ERR_INVALID, "TypeError: cannot unpack non-iterable %s object", jv_type_name(v));
    const jv *items;
    uint32_t n;
    OSP_TRY(jv_iter(st, v, &items, &n));
    if (n < t->nv)
        return jerr(st, OSP_ERR_INVALID, "ValueError: not enough values to unpack (expected %u, got %u)", t->nv, n);
    if (n > t->nv)
        return jerr(st, OSP_ERR_INVALID, "ValueError: too many values to unpack (expected %u)", t->nv);
    for (uint32_t i = 0; i < n; i++) OSP_TRY(assign(st, t->v[i], items[i]));
    return OSP_OK;
}

static osp_status capture(jstate *st, const jnode *body, jv *out) {
    jbuf buf = {0};
    jbuf *saved = st->out;
    st->out = &buf;
    osp_status rc = exec_body(st, body);
    st->out = saved;
    if (rc != OSP_OK) { jbuf_free(st, &buf); return rc; }
    return jbuf_take(st, &buf, out);
}

static osp_status exec_for(jstate *st, const jnode *n) {
    jv seq;
    OSP_TRY(eval(st, n->b, &seq));
    st->line = n->line;
    const jv *items;
    uint32_t cnt;
    OSP_TRY(jv_iter(st, seq, &items, &cnt));
    jscope *outer = st->scope, *sc = NULL;
    osp_status rc = OSP_OK;
    if (n->c && cnt) { /* loop filter: decided before iterating, so loop.length counts kept items */
        jv *kept;
        JALLOC(st, kept, cnt * sizeof *kept);
        uint32_t k = 0;
        OSP_TRY(scope_new(st, outer, &sc));
        st->scope = sc;
        for (uint32_t i = 0; i < cnt && rc == OSP_OK; i++) {
            sc->n = 0;
            jv c;
            rc = assign(st, n->a, items[i]);
            if (rc == OSP_OK) rc = eval(st, n->c, &c);
            if (rc == OSP_OK && jv_truthy(c)) kept[k++] = items[i];
        }
        st->scope = outer;
        OSP_TRY(rc);
        items = kept;
        cnt = k;
        sc = NULL;
    }
    jloop *lp;
    JALLOC(st, lp, sizeof *lp);
    lp->items = items;
    lp->n = cnt;
    jv loopv = jv_make(JK_LOOP);
    loopv.u.loop = lp;
    for (uint32_t i = 0; i < cnt; i++) {
        if ((rc = jstep(st)) != OSP_OK) break;
        if (!sc || sc->captured) {
            if ((rc = scope_new(st, outer, &sc)) != OSP_OK) break;
        } else {
            sc->n = 0;
        }
        st->scope = sc;
        lp->i = i;
        rc = scope_set(st, sc, (jstr){"loop", 4}, loopv);
        if (rc == OSP_OK) rc = assign(st, n->a, items[i]);
        if (rc == OSP_OK) rc = exec_body(st, n->d);
        st->scope = outer;
        if (rc != OSP_OK) break;
        if (st->ctl == JCTL_BREAK) { st->ctl = JCTL_NONE; break; }
        st->ctl = JCTL_NONE;
    }
    st->scope = outer;
    OSP_TRY(rc);
    if (!cnt && n->e) {
        OSP_TRY(scope_new(st, outer, &sc));
        st->scope = sc;
        rc = exec_body(st, n->e);
        st->scope = outer;
    }
    return rc;
}

static osp_status exec(jstate *st, const jnode *n) {
    OSP_TRY(jstep(st));
    st->line = n->line;
    switch (n->kind) {
    case JN_BODY:
        return exec_body(st, n);
    case JN_DATA:
        return jbuf_put(st, st->out, n->name.s, n->name.n);
    case JN_OUTPUT: {
        jv v;
        OSP_TRY(eval(st, n->a, &v));
        return jv_write_str(st, st->out, v);
    }
    case JN_IF: {
        jv c;
        OSP_TRY(eval(st, n->a, &c));
        if (jv_truthy(c)) return exec_body(st, n->b);
        if (n->c) return exec(st, n->c);
        return OSP_OK;
    }
    case JN_FOR:
        return exec_for(st, n);
    case JN_SET: {
        jv v;
        OSP_TRY(eval(st, n->b, &v));
        st->line = n->line;
        return assign(st, n->a, v);
    }
    case JN_SET_BLOCK: {
        jv v;
        OSP_TRY(capture(st, n->d, &v));
        if (n->b) OSP_TRY(eval_filter(st, n->b, &v, &v));
        st->line = n->line;
        return assign(st, n->a, v);
    }
    case JN_MACRO: {
        jmacro *m;
        JALLOC(st, m, sizeof *m);
        m->def = n;
        m->closure = st->scope;
        st->scope->captured = 1;
        jv v = jv_make(JK_MACRO);
        v.u.mac = m;
        return scope_set(st, st->scope, n->name, v);
    }
    case JN_BREAK:
        st->ctl = JCTL_BREAK;
        return OSP_OK;
    case JN_CONTINUE:
        st->ctl = JCTL_CONTINUE;
        return OSP_OK;
    case JN_FILTER_BLOCK: {
        jv v;
        OSP_TRY(capture(st, n->d, &v));
        OSP_TRY(eval_filter(st, n->b, &v, &v));
        return jv_write_str(st, st->out, v);
    }
    case JN_WITH: {
        jv *vals = NULL;
        if (n->nw) JALLOC(st, vals, n->nw * sizeof *vals);
        for (uint32_t i = 0; i < n->nw; i++) OSP_TRY(eval(st, n->w[i], &vals[i]));
        jscope *outer = st->scope, *sc;
        OSP_TRY(scope_new(st, outer, &sc));
        st->scope = sc;
        osp_status rc = OSP_OK;
        for (uint32_t i = 0; i < n->nv && rc == OSP_OK; i++) rc = assign(st, n->v[i], vals[i]);
        if (rc == OSP_OK) rc = exec_body(st, n->d);
        st->scope = outer;
        return rc;
    }
    default:
        return jerr(st, OSP_ERR_INTERNAL, "unexpected node %d in a statement", n->kind);
    }
}

static osp_status exec_body(jstate *st, const jnode *body) {
    for (uint32_t i = 0; i < body->nv; i++) {
        OSP_TRY(exec(st, body->v[i]));
        if (st->ctl) return OSP_OK;
    }
    return OSP_OK;
}

/* ------------------------------------------------------------------ entry */

osp_status osp_jinja_render(const osp_jinja_template *t, const json_t *vars, const osp_jinja_options *opt,
                            char **out, size_t *out_len) {
    *out = NULL;
    if (out_len) *out_len = 0;
    if (!t) return osp_err(OSP_ERR_INVALID, "template is NULL");
    if (vars && !json_is_object(vars)) return osp_err(OSP_ERR_INVALID, "template variables must be a JSON object");
    osp_jinja_options o = {0};
    if (opt) o = *opt;
    jstate st;
    memset(&st, 0, sizeof st);
    st.max_output = o.max_output ? o.max_output : OSP_JINJA_DEFAULT_MAX_OUTPUT;
    st.max_steps = o.max_steps ? o.max_steps : OSP_JINJA_DEFAULT_MAX_STEPS;
    st.max_depth = o.max_depth ? o.max_depth : OSP_JINJA_DEFAULT_MAX_DEPTH;
    st.max_stack = o.max_stack ? o.max_stack : OSP_JINJA_DEFAULT_MAX_STACK;
    ja_init(&st.a, o.max_memory ? o.max_memory : OSP_JINJA_DEFAULT_MAX_MEMORY);
    st.stack_base = (uintptr_t)__builtin_frame_address(0);
    st.line = 1;
    if (o.now) {
        st.now = *o.now;
    } else {
        time_t now = time(NULL);
        localtime_r(&now, &st.now);
    }
    jbuf result = {0};
    st.out = &result;
    osp_status rc = scope_new(&st, NULL, &st.scope);
    if (rc == OSP_OK && vars) {
        const char *key;
        json_t *val;
        json_object_foreach((json_t *)vars, key, val) {
            jv v;
            rc = jv_from_json(&st, val, &v);
            if (rc == OSP_OK) rc = scope_set(&st, st.scope, (jstr){key, (uint32_t)strlen(key)}, v);
            if (rc != OSP_OK) break;
        }
    }
    if (rc == OSP_OK) rc = exec_body(&st, t->root);
    if (rc == OSP_OK && !result.p) rc = jbuf_put(&st, &result, "", 0);
    if (rc == OSP_OK) {
        *out = result.p; /* osp_malloc'd and NUL-terminated */
        if (out_len) *out_len = result.n;
        result.p = NULL;
    } else {
        osp_free(result.p);
    }
    ja_free(&st.a);
    return rc;
}
