/* grammar/rules: the tree of rules that the grammar front ends (GBNF in
 * gbnf.c, Lark in lark.c) parse into, and its compilation (gbnf.c says
 * how): regular rules become lexemes, the others nonterminals. */
#ifndef OSP_GRAMMAR_RULES_H
#define OSP_GRAMMAR_RULES_H

#include "grammar/grammar_internal.h"

#define GB_MAX_TEXT (1 << 20)
#define GB_MAX_DEPTH 64     /* nested groups */
#define GB_MAX_NODES 100000
#define GB_MAX_COUNT 1000   /* {m,n} bounds */
#define GB_MAX_RE (1 << 20) /* bytes of one lexeme's regex */
#define GB_MAX_RULES 4096

/* G_RE: a regular expression's text (regex.c's syntax) in data, a byte a
 * word. Kinds before G_REF are regular by themselves. */
enum { G_LIT, G_CLASS, G_ANY, G_RE, G_REF, G_SEQ, G_ALT, G_REP };
enum { GB_ICASE = 1, GB_DOTALL = 2 }; /* gnode.flags: G_LIT, G_RE */

typedef struct gnode {
    int kind;
    int32_t first, next; /* children (SEQ, ALT, REP: first), siblings */
    int32_t ref;         /* G_REF: the rule */
    int32_t min, max;    /* G_REP; max -1 unbounded */
    int neg;             /* G_CLASS */
    int flags;           /* G_LIT, G_RE: GB_ICASE, GB_DOTALL */
    uint32_t off, len;   /* G_LIT, G_RE: bytes; G_CLASS: pairs of code points, in data */
} gnode;

typedef struct grule {
    char *name;
    int32_t body;  /* an ALT node (of SEQ nodes), -1 while only referred to */
    int regular;   /* 1: not recursive, and refers only to regular rules */
    int32_t nt;    /* its nonterminal, for the others */
    int32_t index, low, on_stack, cyclic; /* Tarjan's */
    int32_t *adj, n_adj; /* the rules it refers to */
} grule;

typedef struct gb {
    const char *s;
    size_t n, i;
    int depth;
    int json;        /* lexemes match the JSON string spelling of their text */
    gnode *nodes;
    int32_t n_nodes, cap_nodes;
    uint32_t *data;  /* literal bytes and class ranges */
    uint32_t n_data, cap_data;
    grule *rules;
    int32_t n_rules, cap_rules;
    osp_status st;
    /* compile */
    gr_builder b;
    char **lex_key;   /* lexemes made so far: regex text -> the symbol that stands for it */
    int32_t *lex_sym;
    int32_t n_lex, cap_lex;
    char *re;         /* the regex being written */
    size_t re_n, re_cap;
} gb;

/* g->st set (once) to OSP_ERR_INVALID naming what and the line and column
 * of g->i. */
osp_status gb_fail(gb *g, const char *what);
/* A new node (its index), -1 on an error (in g->st). */
int32_t gb_node(gb *g, int kind);
int gb_push_data(gb *g, uint32_t v);
/* The UTF-8 bytes of code point cp pushed as data, one a value; 0 on an error (in g->st). */
int gb_push_utf8(gb *g, uint32_t cp);
/* The rule of this name, made (without a body) when new; -1 on an error. */
int32_t gb_rule_of(gb *g, const char *name, size_t len);
/* One UTF-8 character of the text at g->i as a code point (-1: malformed). */
int32_t gb_utf8_char(gb *g);
/* Compile the parsed rules: rule `start` is the start, after the literal
 * text prefix (NULL or "": none). */
osp_status gb_compile(gb *g, const char *start, const char *prefix, osp_grammar **out);
void gb_free(gb *g);

#endif
