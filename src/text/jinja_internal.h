/* text/jinja internals shared by the jinja_*.c modules (see jinja.h).
 *
 * Memory: everything a parse builds (tokens, AST, literal strings) lives in
 * the template's arena; everything a render builds (values, scopes) lives
 * in the render's arena, whose byte count is capped by max_memory. Values
 * are small PODs (jv) that point into arenas or into the caller's JSON;
 * nothing is reference counted and nothing is freed before the arena.
 *
 * Strings are valid UTF-8 (template sources are checked, jansson checks
 * JSON), so Python's code-point semantics can be recovered by decoding.
 */
#ifndef OSP_JINJA_INTERNAL_H
#define OSP_JINJA_INTERNAL_H

#include <stdarg.h>
#include <stdint.h>
#include <string.h>
#include "text/jinja.h"

/* ------------------------------------------------------------------ memory */

typedef struct jchunk jchunk;
typedef struct jarena {
    jchunk *head;
    size_t used;  /* bytes charged: chunks and growable buffers */
    size_t limit; /* SIZE_MAX for parse arenas */
    int over;     /* last failure was the limit (not malloc) */
} jarena;

void ja_init(jarena *a, size_t limit);
void *ja_alloc(jarena *a, size_t n); /* 16-byte aligned, zeroed; NULL on limit/OOM */
void ja_free(jarena *a);

typedef struct jstr {
    const char *s;
    uint32_t n;
} jstr;

/* ------------------------------------------------------------------ values */

typedef enum jkind {
    JK_UNDEF = 0,
    JK_NONE,
    JK_BOOL,
    JK_INT,
    JK_FLOAT,
    JK_STR,
    JK_LIST,
    JK_TUPLE,
    JK_DICT,
    JK_NS,     /* namespace(): a dict whose attributes may be assigned */
    JK_MACRO,
    JK_FUNC,   /* global function (range, namespace, raise_exception...) */
    JK_METHOD, /* bound method of a str/dict/list/loop */
    JK_LOOP,   /* the `loop` object of a for loop */
    JK_ABSENT  /* internal: argument not passed */
} jkind;

typedef struct jlist jlist;
typedef struct jdict jdict;
typedef struct jmacro jmacro;
typedef struct jfunc jfunc;
typedef struct jmethod jmethod;
typedef struct jloop jloop;

typedef struct jv {
    uint8_t k;    /* jkind */
    uint8_t safe; /* JK_STR: Markup (escape() leaves it alone, + escapes the other side) */
    uint16_t pad_;
    uint32_t n;   /* JK_STR: bytes */
    union {
        int64_t i; /* JK_BOOL, JK_INT */
        double d;
        const char *s;
        jlist *l; /* JK_LIST, JK_TUPLE */
        jdict *m; /* JK_DICT, JK_NS */
        jmacro *mac;
        const jfunc *fn;
        jmethod *meth;
        jloop *loop;
    } u;
} jv;

struct jlist {
    uint32_t n, cap;
    jv *v;
};
struct jdict { /* insertion ordered */
    uint32_t n, cap;
    jv *k, *v;
};
/* An undefined value says why it is undefined without allocating: pad_ is
 * the reason, u.s/n a name (or a message), safe the kind of the object
 * that lacked an attribute, n the line for JUR_COND. */
enum { JUR_PLAIN = 0, JUR_NAME, JUR_ATTR, JUR_PARAM, JUR_COND, JUR_TEXT, JUR_SECURITY };

static inline jv jv_make(jkind k) { jv v; memset(&v, 0, sizeof v); v.k = (uint8_t)k; return v; }
static inline jv jv_none(void) { return jv_make(JK_NONE); }
static inline jv jv_bool(int b) { jv v = jv_make(JK_BOOL); v.u.i = b != 0; return v; }
static inline jv jv_int(int64_t i) { jv v = jv_make(JK_INT); v.u.i = i; return v; }
static inline jv jv_float(double d) { jv v = jv_make(JK_FLOAT); v.u.d = d; return v; }
static inline jv jv_strn(const char *s, size_t n) { jv v = jv_make(JK_STR); v.u.s = s; v.n = (uint32_t)n; return v; }
static inline jv jv_cstr(const char *s) { return jv_strn(s, strlen(s)); }
static inline int jv_is_str(jv v, const char *s) { return v.k == JK_STR && v.n == strlen(s) && !memcmp(v.u.s, s, v.n); }
static inline int jv_is_seq(jv v) { return v.k == JK_LIST || v.k == JK_TUPLE; }
static inline int jv_is_num(jv v) { return v.k == JK_INT || v.k == JK_FLOAT || v.k == JK_BOOL; }

/* ------------------------------------------------------------------ AST */

typedef enum jnode_kind {
    /* statements */
    JN_BODY, JN_DATA, JN_OUTPUT, JN_IF, JN_FOR, JN_SET, JN_SET_BLOCK, JN_MACRO,
    JN_BREAK, JN_CONTINUE, JN_FILTER_BLOCK, JN_WITH,
    /* expressions */
    JN_CONST, JN_NAME, JN_NSREF, JN_LIST, JN_TUPLE, JN_DICT, JN_GETATTR, JN_GETITEM,
    JN_SLICE, JN_CALL, JN_FILTER, JN_TEST, JN_NOT, JN_NEG, JN_POS, JN_BINOP, JN_AND,
    JN_OR, JN_CONCAT, JN_COMPARE, JN_COND
} jnode_kind;

typedef enum jop {
    JO_ADD, JO_SUB, JO_MUL, JO_DIV, JO_FLOORDIV, JO_MOD, JO_POW, /* JN_BINOP */
    JO_EQ, JO_NE, JO_LT, JO_LE, JO_GT, JO_GE, JO_IN, JO_NOTIN   /* JN_COMPARE */
} jop;

enum { JNF_VARARGS = 1, JNF_KWARGS = 2 }; /* JN_MACRO flags: body reads varargs/kwargs */

typedef struct jfilter_def jfilter_def;
typedef struct jtest_def jtest_def;

typedef struct jnode jnode;
struct jnode {
    uint8_t kind, op;
    uint16_t flags;
    uint32_t line;
    jnode *a, *b, *c, *d, *e; /* meaning per kind, see jinja_parse.c */
    jnode **v;                /* items, args, body statements, dict keys */
    jnode **w;                /* keyword values, dict values */
    jstr *names;              /* keyword names (nw) / macro parameters (nv) */
    uint8_t *ops;             /* JN_COMPARE: one per operand */
    uint32_t nv, nw;
    jstr name;                /* identifier, attribute, filter/test name, data */
    jstr attr;                /* JN_NSREF attribute */
    jv val;                   /* JN_CONST */
    const void *def;          /* JN_FILTER: jfilter_def, JN_TEST: jtest_def */
};

struct osp_jinja_template {
    jarena arena;
    char *src; /* normalized source; JN_DATA points into it */
    jnode *root;
};

/* ------------------------------------------------------------------ lexer */

typedef enum jtok_kind {
    JT_EOF, JT_DATA, JT_VAR_BEGIN, JT_VAR_END, JT_BLOCK_BEGIN, JT_BLOCK_END,
    JT_NAME, JT_STRING, JT_INT, JT_FLOAT,
    JT_ADD, JT_SUB, JT_DIV, JT_FLOORDIV, JT_MUL, JT_MOD, JT_POW, JT_TILDE,
    JT_LBRACKET, JT_RBRACKET, JT_LPAREN, JT_RPAREN, JT_LBRACE, JT_RBRACE,
    JT_EQ, JT_NE, JT_GT, JT_GTEQ, JT_LT, JT_LTEQ, JT_ASSIGN, JT_DOT, JT_COLON,
    JT_PIPE, JT_COMMA, JT_SEMICOLON
} jtok_kind;

typedef struct jtok {
    uint8_t kind;
    uint32_t line;
    jstr s;    /* name, unescaped string, data text, operator text */
    int64_t i; /* JT_INT */
    double d;  /* JT_FLOAT */
} jtok;

/* Tokenize the normalized source into an arena array ending with JT_EOF. */
osp_status jlex(jarena *a, const char *src, size_t n, jtok **out, size_t *ntok);
const char *jtok_describe(const jtok *t); /* for "unexpected ..." messages */

/* ------------------------------------------------------------------ render state */

typedef struct jbuf {
    char *p;
    size_t n, cap;
} jbuf;

typedef struct jvar {
    jstr name;
    jv v;
} jvar;

typedef struct jscope {
    struct jscope *parent;
    jvar *vars;
    uint32_t n, cap;
    int captured; /* a macro closes over it: do not recycle */
} jscope;

enum { JCTL_NONE = 0, JCTL_BREAK, JCTL_CONTINUE };

typedef struct jstate {
    jarena a;
    jbuf *out;        /* where output goes: the result or a capture */
    jscope *scope;    /* innermost scope */
    size_t max_output;
    uint64_t steps, max_steps;
    int32_t depth, max_depth;
    uintptr_t stack_base;
    size_t max_stack;
    uint32_t line; /* line of the node being evaluated, for errors */
    int ctl;       /* pending break/continue */
    struct tm now; /* strftime_now's clock */
} jstate;

/* Record an error "template error (line N): ..." and return `st`. */
osp_status jerr(jstate *st, osp_status code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
osp_status jerr_alloc(jstate *st); /* the arena refused: limit or OOM */
void *jalloc(jstate *st, size_t n);
#define JALLOC(st, p, n) do { if (!((p) = jalloc((st), (n)))) return jerr_alloc(st); } while (0)

/* Growable buffers, charged to the render's memory and capped at max_output. */
osp_status jbuf_put(jstate *st, jbuf *b, const char *s, size_t n);
static inline osp_status jbuf_puts(jstate *st, jbuf *b, const char *s) { return jbuf_put(st, b, s, strlen(s)); }
osp_status jbuf_putc(jstate *st, jbuf *b, char c);
osp_status jbuf_printf(jstate *st, jbuf *b, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void jbuf_free(jstate *st, jbuf *b);
/* Copy the buffer into the arena as a string value and free the buffer. */
osp_status jbuf_take(jstate *st, jbuf *b, jv *out);

/* ------------------------------------------------------------------ values (jinja_value.c) */

osp_status jv_str_copy(jstate *st, const char *s, size_t n, jv *out);
osp_status jv_concat2(jstate *st, jv a, jv b, jv *out); /* both strings */
osp_status jlist_new(jstate *st, uint32_t cap, jlist **out);
osp_status jlist_push(jstate *st, jlist *l, jv v);
static inline jv jv_list(jlist *l, int tuple) { jv v = jv_make(tuple ? JK_TUPLE : JK_LIST); v.u.l = l; return v; }
osp_status jdict_new(jstate *st, uint32_t cap, jdict **out);
osp_status jdict_set(jstate *st, jdict *d, jv k, jv v);
int jdict_get(const jdict *d, jv k, jv *out);
int jdict_find_str(const jdict *d, const char *s, size_t n, jv *out);
static inline jv jv_dict(jdict *m) { jv v = jv_make(JK_DICT); v.u.m = m; return v; }

osp_status jv_from_json(jstate *st, const json_t *j, jv *out);

/* Undefined values: plain name lookups, missing attributes/items, hints. */
static inline jv jv_undef(int reason, const char *s, size_t n, int objkind) {
    jv v = jv_make(JK_UNDEF);
    v.pad_ = (uint16_t)reason;
    v.u.s = s;
    v.n = (uint32_t)n;
    v.safe = (uint8_t)objkind;
    return v;
}
osp_status jv_undef_msg(jstate *st, jv *out, int security, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
osp_status jv_undef_name(jstate *st, jstr name, jv *out);
osp_status jv_undef_attr(jstate *st, jv obj, jstr name, jv *out);
osp_status jv_undef_item(jstate *st, jv obj, jv key, jv *out);
osp_status jundef_fail(jstate *st, jv v); /* using an undefined value: the error */
void jundef_describe(jv v, char *buf, size_t n); /* the message jinja2 would give */

const char *jv_type_name(jv v); /* Python type name: str, int, list, dict, NoneType... */
int jv_truthy(jv v);
int jv_eq(jv a, jv b);                                 /* Python == */
/* Python ordering as -1/0/1 (numbers, str, list, tuple); TypeError naming `op` otherwise. */
osp_status jv_cmp(jstate *st, jv a, jv b, const char *op, int *res);
osp_status jv_len(jstate *st, jv v, int64_t *n);
/* Items of an iterable (list/tuple: elements, dict: keys, str: characters,
 * undefined: none). */
osp_status jv_iter(jstate *st, jv v, const jv **items, uint32_t *n);
osp_status jv_contains(jstate *st, jv container, jv item, int *res);

/* Python str() and repr(). */
osp_status jv_write_str(jstate *st, jbuf *b, jv v);
osp_status jv_write_repr(jstate *st, jbuf *b, jv v);
osp_status jv_to_str(jstate *st, jv v, jv *out);
/* json.dumps(v, ensure_ascii, indent (NULL = none), separators, sort_keys). */
typedef struct jjson_opts {
    const char *indent; /* NULL: single line */
    size_t indent_n;
    const char *item_sep, *key_sep;
    int sort_keys, ensure_ascii;
} jjson_opts;
osp_status jv_write_json(jstate *st, jbuf *b, jv v, const jjson_opts *o, int level);
void jfmt_float(double d, char out[40]); /* Python float repr */

/* Attribute and item access with the sandbox's rules. */
osp_status jv_getattr(jstate *st, jv obj, jstr name, jv *out);
osp_status jv_getitem(jstate *st, jv obj, jv key, jv *out);
osp_status jv_slice(jstate *st, jv obj, jv start, jv stop, jv step, jv *out);

/* Arithmetic with Python's rules. */
osp_status jv_binop(jstate *st, int op, jv a, jv b, jv *out);
/* markupsafe.escape(): a Markup string (safe = 1). */
osp_status jv_html_escape(jstate *st, jv s, jv *out);
/* Python's printf-style str % args (jinja_builtins.c). */
osp_status jfmt_percent(jstate *st, jv fmt, jv args, jv *out);

/* ------------------------------------------------------------------ unicode (jinja_unicode.c) */

int ju_isspace(int32_t cp);                               /* Python str.isspace() */
int32_t ju_next(const char *s, size_t n, size_t *i);      /* decode at *i, advance */
int ju_put(char *out, int32_t cp);                        /* encode, returns bytes */
size_t ju_count(const char *s, size_t n);                 /* code points */
size_t ju_offset(const char *s, size_t n, size_t cpi);    /* byte offset of code point cpi */
int ju_is_ascii(const char *s, size_t n);
int ju_valid(const char *s, size_t n);
int ju_is_printable(int32_t cp);                           /* Python str.isprintable() */
int ju_is_alnum(int32_t cp);
int ju_is_alpha(int32_t cp);
int ju_is_digit(int32_t cp);
int ju_is_cased(int32_t cp);
int ju_is_upper(int32_t cp);
int ju_is_lower(int32_t cp);
typedef enum { JU_UPPER, JU_LOWER, JU_TITLE, JU_CAPITALIZE, JU_SWAPCASE } ju_case;
osp_status ju_case_map(jstate *st, jv s, ju_case mode, jv *out);
/* strip: which 1 = left, 2 = right, 3 = both; chars NULL = whitespace. */
jv ju_strip(jv s, const jv *chars, int which);
osp_status ju_split(jstate *st, jv s, const jv *sep, int64_t maxsplit, int right, jv *out);
osp_status ju_splitlines(jstate *st, const char *s, size_t n, int keepends, jlist **out);
osp_status ju_replace(jstate *st, jv s, jv old, jv new_, int64_t count, jv *out);
int64_t ju_find(jv hay, jv needle, int reverse);          /* code point index or -1 */
int64_t ju_count_sub(jv hay, jv needle);

/* ------------------------------------------------------------------ calls */

typedef struct jargs {
    uint32_t n, nkw;
    const jv *v;
    const jstr *kwn;
    const jv *kwv;
} jargs;

/* Bind like a Python signature: names[0..nnames), the first nreq required.
 * Missing optional ones are JK_ABSENT. fname is used in messages. */
osp_status jargs_bind(jstate *st, const char *fname, const jargs *a, const char *const *names,
                      int nnames, int nreq, jv *out);

typedef osp_status (*jfunc_fn)(jstate *st, const jv *self, const jargs *a, jv *out);
struct jfunc {
    const char *name;
    jfunc_fn fn;
};
struct jmethod {
    jv self;
    const jfunc *f;
};
struct jmacro {
    const jnode *def;
    jscope *closure;
};
struct jloop {
    const jv *items;
    int64_t n, i;
    jv changed_last;
    int changed_any;
};

typedef osp_status (*jfilter_fn)(jstate *st, jv val, const jargs *a, jv *out);
typedef osp_status (*jtest_fn)(jstate *st, jv val, const jargs *a, int *res);
struct jfilter_def {
    const char *name;
    jfilter_fn fn;
};
struct jtest_def {
    const char *name;
    jtest_fn fn;
};
const jfilter_def *jfilter_find(const char *name, size_t n);
const jtest_def *jtest_find(const char *name, size_t n);

const jfunc *jglobal_find(const char *name, size_t n);
/* Python attribute of a str/dict/list/loop that is a method: 1 and *out
 * bound (or an unsafe-undefined for mutators), 0 when there is none. */
int jmethod_find(jstate *st, jv obj, jstr name, jv *out, osp_status *err);
osp_status jloop_attr(jstate *st, jloop *l, jstr name, jv *out);

/* jinja_eval.c */
osp_status jcall(jstate *st, jv callee, const jargs *a, jv *out);
osp_status jstep(jstate *st); /* count one step, check the stack */

#endif
