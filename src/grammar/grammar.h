/* grammar/: structured output. A grammar (compiled from a JSON Schema or a
 * regular expression) constrains generation through a token mask over the
 * model's whole vocabulary.
 *
 * Three objects, as the rest of osprey splits model from request:
 *   osp_grammar_vocab   the tokens' byte strings as a trie; built once per
 *                       tokenizer, shared by every grammar; its mask cache
 *                       is safe to use from any thread.
 *   osp_grammar         a compiled grammar: lexemes as byte-level DFAs and a
 *                       context-free grammar over them; bound to one vocab
 *                       by its first matcher.
 *   osp_grammar_matcher one per constrained row: the parse so far (one
 *                       thread at a time; matchers of one grammar may run
 *                       on different threads).
 *
 * Masks are bitsets of uint32 words over [0, vocab size): bit i of word
 * i/32 is token i. The end-of-sequence token is allowed only where the
 * grammar accepts. Design and figures: docs/GRAMMAR.md.
 */
#ifndef OSP_GRAMMAR_H
#define OSP_GRAMMAR_H

#include <stddef.h>
#include <stdint.h>
#include "osprey.h"

struct osp_tokenizer;
typedef struct osp_grammar_vocab osp_grammar_vocab;
typedef struct osp_grammar osp_grammar;
typedef struct osp_grammar_matcher osp_grammar_matcher;

/* The vocabulary from a tokenizer: byte-level BPE (GPT-2 alphabet) or
 * SentencePiece style ("\xe2\x96\x81" as a space, <0xNN> byte tokens).
 * Special tokens have no bytes (never allowed) except the EOS id. */
osp_status osp_grammar_vocab_from_tokenizer(const struct osp_tokenizer *t, osp_grammar_vocab **out);
/* From explicit byte strings (tests): token i is bytes[i] of lens[i] bytes;
 * a NULL entry has no bytes. eos_id may be -1. */
osp_status osp_grammar_vocab_new(int32_t n, const char *const *bytes, const uint32_t *lens, int32_t eos_id,
                                 osp_grammar_vocab **out);
void osp_grammar_vocab_free(osp_grammar_vocab *v);
int32_t osp_grammar_vocab_size(const osp_grammar_vocab *v);
int32_t osp_grammar_vocab_eos(const osp_grammar_vocab *v);

/* Compile a JSON Schema (text). A keyword that cannot be honoured is
 * OSP_ERR_UNSUPPORTED naming it; bad JSON or a bad schema OSP_ERR_INVALID. */
osp_status osp_grammar_from_json_schema(const char *schema, size_t len, osp_grammar **out);
/* Compile a regular expression over the whole output (anchored at both
 * ends; bytes, ASCII classes, \d\w\s, groups, |, * + ? {n,m}). */
osp_status osp_grammar_from_regex(const char *re, size_t len, osp_grammar **out);
/* Compile a grammar in llama.cpp's GBNF (gbnf.c says what it takes);
 * `root` is the start, after the literal text prefix (NULL or "": none). A
 * malformed grammar is OSP_ERR_INVALID naming the line and column. */
osp_status osp_grammar_from_gbnf(const char *text, size_t len, const char *prefix, osp_grammar **out);
/* OSP_GRAMMAR_JSON_STRING: the grammar's language spelled as the body of a
 * JSON string (no quotes): '"' and '\\' escaped, control characters as
 * \n \r \t \b \f or else \u00XX, '/' as itself or \/, other bytes as
 * themselves. For a custom tool's input inside the JSON of a tool call. */
enum { OSP_GRAMMAR_JSON_STRING = 1 };
/* Compile a grammar in the Lark subset of OpenAI's custom tools (lark.c
 * says what it takes and refuses); `start` is the start. A malformed
 * grammar, or a construct it cannot honour, is an error naming it. */
osp_status osp_grammar_from_lark(const char *text, size_t len, int flags, osp_grammar **out);
/* A regular expression over the whole text, as osp_grammar_from_regex
 * but non-ASCII characters whole (classes, '.') and with the flags above. */
osp_status osp_grammar_from_regex_flags(const char *re, size_t len, int flags, osp_grammar **out);
void osp_grammar_free(osp_grammar *g);

osp_status osp_grammar_matcher_new(osp_grammar *g, const osp_grammar_vocab *v, osp_grammar_matcher **out);
void osp_grammar_matcher_free(osp_grammar_matcher *m);
/* The allowed tokens now. */
void osp_grammar_matcher_mask(osp_grammar_matcher *m, uint32_t *bits);
/* The same mask without the per-lexeme cache: every live trie node walked
 * (the reference twin of the fast path; tests compare them). */
void osp_grammar_matcher_mask_reference(osp_grammar_matcher *m, uint32_t *bits);
/* Advance by one token: 1 accepted, 0 rejected (the state is unchanged). */
int osp_grammar_matcher_commit(osp_grammar_matcher *m, int32_t token);
/* Advance by raw bytes (tests, forced text): 1 accepted, 0 rejected. */
int osp_grammar_matcher_commit_bytes(osp_grammar_matcher *m, const char *bytes, size_t n);
/* Undo the last n commits (tokens or byte runs). */
void osp_grammar_matcher_rollback(osp_grammar_matcher *m, int n);
/* 1 when the text so far is a complete sentence of the grammar. */
int osp_grammar_matcher_accepting(const osp_grammar_matcher *m);

/* compose.c: a choice of sequences, each literal text, a JSON Schema's
 * value, literal text (prefix / suffix may be NULL or "", schema NULL for
 * none): a tool call in a model family's syntax, the arguments constrained
 * by the tool's parameters. A schema's error names its alternative.
 * In place of the schema, a grammar's text (syntax OSP_GRAMMAR_LARK or
 * OSP_GRAMMAR_REGEX) compiled with OSP_GRAMMAR_JSON_STRING: a custom
 * tool's input inside a JSON string. */
enum { OSP_GRAMMAR_NONE = 0, OSP_GRAMMAR_LARK = 1, OSP_GRAMMAR_REGEX = 2 };
typedef struct osp_grammar_part {
    const char *prefix;
    const char *schema;
    size_t schema_len;
    const char *suffix;
    int syntax;          /* OSP_GRAMMAR_LARK / _REGEX: `grammar` instead of schema */
    const char *grammar;
    size_t grammar_len;
} osp_grammar_part;
osp_status osp_grammar_from_parts(const osp_grammar_part *alts, int n, osp_grammar **out);

#endif
