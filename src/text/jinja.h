/* text/jinja: a sandboxed Jinja2 engine, enough of it for chat templates.
 *
 * Semantics are those of Python jinja2 3.1 as Hugging Face configures it
 * for apply_chat_template: ImmutableSandboxedEnvironment(trim_blocks=True,
 * lstrip_blocks=True, extensions=[loopcontrols]), keep_trailing_newline
 * off, plus HF's tojson (json.dumps with ensure_ascii=False), the globals
 * raise_exception(msg) and strftime_now(fmt), and {% generation %} blocks
 * rendered as their body. Values behave as their Python counterparts:
 * str()/repr() output, truthiness, comparisons, slicing by code point,
 * jinja2's default Undefined.
 *
 * Layout: jinja_lex.c (source -> tokens, whitespace control), jinja_parse.c
 * (tokens -> AST, filters and tests resolved by name), jinja_eval.c (tree
 * walking interpreter), jinja_value.c (values, arena, str/repr/tojson,
 * comparisons), jinja_filters.c (filters and tests), jinja_builtins.c
 * (globals, str/dict/list methods), jinja_unicode.c (Python str helpers).
 *
 * Ownership: a parsed template is immutable and may be rendered by several
 * threads at once. Each render owns an arena that holds every value it
 * builds and is freed when the render returns; strings taken from the
 * caller's JSON are referenced, not copied.
 *
 * Safety: templates cannot read files (include/import/extends/from are
 * refused), mutate their inputs (list.append, dict.update... raise the
 * sandbox's SecurityError) or run away: output bytes, arena bytes,
 * evaluation steps, macro nesting and C stack use are all bounded, and
 * each limit is reported as an error, never a crash.
 *
 * Left out on purpose (refused with an error naming them, unless noted):
 * {% block %}, {% call %}/caller, recursive for loops, *args and **kwargs at
 * call sites, \N{...} escapes and lone surrogates in literals, str.format
 * specs; integers are 64-bit (overflow is an error, not a bignum); the
 * filters groupby, slice, truncate, wordwrap, urlize, striptags, xmlattr,
 * urlencode, filesizeformat, random and the globals lipsum, cycler, joiner
 * do not exist (unknown name). Not errors: map/select/reject/selectattr/
 * rejectattr/reverse/items give lists where jinja2 gives generators (so
 * printing one shows the list), range() gives a list, and jinja2's
 * compile-time folding of literal-only expressions (e.g. none[1:] printing
 * "") is not reproduced.
 */
#ifndef OSP_JINJA_H
#define OSP_JINJA_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>
#include "core/core.h"

typedef struct osp_jinja_template osp_jinja_template;

/* Render limits and clock. Zero fields take the defaults. */
typedef struct osp_jinja_options {
    size_t max_output;    /* bytes of output, and of any captured block: 8 MiB */
    size_t max_memory;    /* bytes of values built while rendering: 256 MiB */
    uint64_t max_steps;   /* evaluation steps (nodes, loop iterations): 10,000,000 */
    int32_t max_depth;    /* nested macro calls: 100 */
    size_t max_stack;     /* C stack the interpreter may use: 1 MiB (keep below the thread's stack) */
    const struct tm *now; /* strftime_now's local time; NULL = the current time */
} osp_jinja_options;

#define OSP_JINJA_DEFAULT_MAX_OUTPUT ((size_t)8 << 20)
#define OSP_JINJA_DEFAULT_MAX_MEMORY ((size_t)256 << 20)
#define OSP_JINJA_DEFAULT_MAX_STEPS  10000000ull
#define OSP_JINJA_DEFAULT_MAX_DEPTH  100
#define OSP_JINJA_DEFAULT_MAX_STACK  ((size_t)1 << 20)

/* Parse a template (UTF-8, `len` bytes). Syntax errors, unknown filters or
 * tests, and refused tags (include, import, from, extends, block, call)
 * fail with OSP_ERR_FORMAT and a message naming the line. */
osp_status osp_jinja_parse(const char *src, size_t len, osp_jinja_template **out);
void osp_jinja_free(osp_jinja_template *t);

/* Render with the members of the JSON object `vars` as variables (NULL =
 * none). On success *out is a NUL-terminated string of *out_len bytes
 * allocated with osp_malloc (free with osp_free). Errors: OSP_ERR_INVALID
 * for template runtime errors (undefined calls, type errors; a
 * raise_exception message is passed through verbatim), OSP_ERR_RANGE when a
 * limit is hit, OSP_ERR_NOMEM. `opt` may be NULL. */
osp_status osp_jinja_render(const osp_jinja_template *t, const json_t *vars,
                            const osp_jinja_options *opt, char **out, size_t *out_len);

#endif
