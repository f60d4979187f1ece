/* Reply splitter: a small state machine over the unprocessed tail of the
 * stream (in.p[off .. in.len)).
 *
 *   START      waiting for the reasoning opener (only whitespace so far); for
 *              JSON_REPLY (LLAMA3) with tools, deciding whether the reply is
 *              a JSON call
 *   CONTENT    content; with tool markers, a trailing whitespace run is held
 *              (it is dropped if a tool block follows)
 *   REASONING  reasoning; a trailing whitespace run is held (dropped before
 *              the closer)
 *   TOOL       a tool block, kept raw in the buffer (from tool_ws bytes of
 *              whitespace before it) until its closer: parsed, or emitted as
 *              content verbatim if it does not parse
 *   HOLD       JSON_REPLY: the whole reply is held and decided at the end
 *   DONE       the reply is over (an end marker after a call: GEMMA4's
 *              <turn|>); the rest is dropped
 *
 * In every state, a tail that is a proper prefix of a marker the state
 * looks for is held back. Decisions depend only on the text, never on where
 * pieces were cut, which is what makes the output split-invariant.
 */
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "reply.h"

#define NOT_FOUND ((size_t)-1)
#define MAX_DEPTH 64 /* nesting of tool arguments (recursion bound) */
#define GEMMA_STR "<|\"|>" /* Gemma 4's string delimiter token */

/* ---- growable buffer (counting allocator); oom is sticky ---- */

typedef struct sbuf {
    char *p;
    size_t len, cap;
    int oom;
} sbuf;

static int sb_add(sbuf *b, const char *s, size_t n) {
    if (b->oom) return 0;
    if (b->len + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap : 64;
        while (nc < b->len + n + 1) nc *= 2;
        char *np = osp_malloc(OSP_POOL_MISC, nc);
        if (!np) {
            b->oom = 1;
            return 0;
        }
        if (b->len) memcpy(np, b->p, b->len);
        osp_free(b->p);
        b->p = np;
        b->cap = nc;
    }
    if (n) memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
    return 1;
}

static int sb_addc(sbuf *b, char c) { return sb_add(b, &c, 1); }
static void sb_free(sbuf *b) { osp_free(b->p); }

/* ---- small text helpers ---- */

static int is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
static int in_set(char c, const char *set) { return c && strchr(set, c); }

static size_t skip_ws(const char *s, size_t n, size_t i) {
    while (i < n && is_ws(s[i])) i++;
    return i;
}

/* Length of s[0..n) without its trailing whitespace. */
static size_t rtrim_len(const char *s, size_t n) {
    while (n && is_ws(s[n - 1])) n--;
    return n;
}

static int starts(const char *s, size_t n, const char *m) {
    size_t ml = strlen(m);
    return n >= ml && memcmp(s, m, ml) == 0;
}

/* s[0..n) is a proper prefix of m (the empty string is one). */
static int is_partial(const char *s, size_t n, const char *m) {
    return n < strlen(m) && memcmp(s, m, n) == 0;
}

static size_t find(const char *s, size_t n, const char *m) {
    size_t ml = strlen(m);
    for (size_t i = 0; i + ml <= n; i++)
        if (s[i] == m[0] && memcmp(s + i, m, ml) == 0) return i;
    return NOT_FOUND;
}

/* Earliest occurrence of any of ms[0..nm); *which = its index or -1. */
static size_t find_first(const char *s, size_t n, const char *const *ms, int nm, int *which) {
    size_t best = NOT_FOUND;
    *which = -1;
    for (int k = 0; k < nm; k++) {
        size_t p = find(s, n, ms[k]);
        if (p != NOT_FOUND && (best == NOT_FOUND || p < best)) {
            best = p;
            *which = k;
        }
    }
    return best;
}

/* Start of the earliest non-empty tail of s that is a proper prefix of one
 * of ms (text that might become a marker), or n. */
static size_t partial_tail(const char *s, size_t n, const char *const *ms, int nm) {
    size_t maxl = 0;
    for (int k = 0; k < nm; k++)
        if (strlen(ms[k]) > maxl) maxl = strlen(ms[k]);
    for (size_t q = n >= maxl ? n - maxl + 1 : 0; q < n; q++)
        for (int k = 0; k < nm; k++)
            if (is_partial(s + q, n - q, ms[k])) return q;
    return n;
}

/* ---- formats: one row each, in detection order (a template holding
 * markers of two rows is the earlier one's) ---- */

static const osp_reply_spec FORMATS[] = {
    {.format = OSP_REPLY_GEMMA4,
     .name = "gemma4",
     .detect = {"<|tool_call>", "<|channel>"},
     .think_open = "<|channel>",
     .think_label = "thought",
     .think_close = "<channel|>",
     .calls = OSP_REPLY_CALLS_GEMMA_BLOCK,
     .tool_open = "<|tool_call>",
     .tool_close = "<tool_call|>",
     .tool_quote = GEMMA_STR,
     .end = {"<turn|>", "<|tool_response>"},
     .special_markers = 1,
     .force = {.close_think = "<channel|>", .open = "<|tool_call>call:", .any = "", .name_pre = "", .name_post = "{"}},
    {.format = OSP_REPLY_QWEN,
     .name = "qwen",
     .detect = {"<tool_call>", "<think>"},
     .think_open = "<think>",
     .think_close = "</think>",
     .calls = OSP_REPLY_CALLS_JSON_BLOCK,
     .tool_open = "<tool_call>",
     .tool_close = "</tool_call>",
     .force = {.close_think = "\n</think>\n\n",
               .open = "<tool_call>\n",
               .any = "",
               .name_pre = "{\"name\": \"",
               .name_post = "\", \"arguments\": "}},
    {.format = OSP_REPLY_LLAMA3,
     .name = "llama3",
     .detect = {"<|start_header_id|>", "<|python_tag|>"},
     .calls = OSP_REPLY_CALLS_JSON_REPLY,
     .call_tag = "<|python_tag|>",
     /* the opening commits the reply to being a call */
     .force = {.open = "", .any = "{\"name\": \"", .name_pre = "{\"name\": \"", .name_post = "\", \"parameters\": "}},
    {.format = OSP_REPLY_NONE, .name = "none"},
};

#define N_FORMATS (sizeof FORMATS / sizeof *FORMATS)

const osp_reply_spec *osp_reply_spec_of(osp_reply_format f) {
    for (size_t i = 0; i < N_FORMATS; i++)
        if (FORMATS[i].format == f) return &FORMATS[i];
    return NULL;
}

osp_reply_format osp_reply_format_detect(const char *src) {
    if (!src) return OSP_REPLY_NONE;
    for (size_t i = 0; i < N_FORMATS; i++)
        for (int k = 0; k < 2; k++)
            if (FORMATS[i].detect[k] && strstr(src, FORMATS[i].detect[k])) return FORMATS[i].format;
    return OSP_REPLY_NONE;
}

const char *osp_reply_format_name(osp_reply_format f) {
    const osp_reply_spec *sp = osp_reply_spec_of(f);
    return sp ? sp->name : "unknown";
}

static int ends_with(const char *s, size_t n, const char *m) {
    size_t ml = strlen(m);
    return n >= ml && memcmp(s + n - ml, m, ml) == 0;
}

int osp_reply_prompt_opens_reasoning(osp_reply_format f, const char *prompt, size_t len) {
    const osp_reply_spec *sp = osp_reply_spec_of(f);
    if (!prompt || !sp || !sp->think_open) return 0;
    len = rtrim_len(prompt, len);
    if (sp->think_label) {
        if (!ends_with(prompt, len, sp->think_label)) return 0;
        len -= strlen(sp->think_label);
    }
    return ends_with(prompt, len, sp->think_open);
}

/* ---- tool call ids: "call_" + 16 characters ---- */

static uint64_t splitmix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15u;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9u;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebu;
    return x ^ (x >> 31);
}

static _Atomic uint64_t id_seed, id_count;

/* The first 11 characters encode a bijection of (process seed + counter),
 * so ids never repeat within a process; the seed (clock, pid) makes them
 * differ between processes. */
static void make_id(char out[5 + 16 + 1]) {
    static const char digits[] = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
    uint64_t seed = atomic_load(&id_seed);
    if (!seed) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        uint64_t s = splitmix64(((uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec) ^
                                ((uint64_t)getpid() << 40) ^ (uint64_t)(uintptr_t)&ts) | 1;
        uint64_t expect = 0;
        seed = atomic_compare_exchange_strong(&id_seed, &expect, s) ? s : expect;
    }
    uint64_t x = splitmix64(seed + atomic_fetch_add(&id_count, 1) * 0x9e3779b97f4a7c15u);
    uint64_t y = splitmix64(x ^ seed);
    memcpy(out, "call_", 5);
    for (int i = 0; i < 11; i++, x /= 62) out[5 + i] = digits[x % 62];
    for (int i = 11; i < 16; i++, y /= 62) out[5 + i] = digits[y % 62];
    out[21] = 0;
}

/* Append {"id", "type": "function", "function": {name, arguments}}.
 * OSP_ERR_FORMAT when the arguments are not a JSON object or the text is
 * not valid UTF-8 (the block then stays content). */
static osp_status add_call(json_t *arr, const char *name, size_t nl, const char *args, size_t al) {
    if (!nl) return OSP_ERR_FORMAT;
    json_error_t err;
    json_t *check = json_loadb(args, al, JSON_REJECT_DUPLICATES, &err);
    int is_obj = json_is_object(check);
    json_decref(check);
    if (!is_obj) return OSP_ERR_FORMAT;
    json_t *jn = json_stringn(name, nl), *ja = json_stringn(args, al);
    if (!jn || !ja) {
        json_decref(jn);
        json_decref(ja);
        return OSP_ERR_FORMAT;
    }
    char id[5 + 16 + 1];
    make_id(id);
    json_t *fn = json_object(), *call = json_object();
    if (!fn || !call) {
        json_decref(jn);
        json_decref(ja);
        json_decref(fn);
        json_decref(call);
        return osp_err(OSP_ERR_NOMEM, "reply: out of memory");
    }
    /* each _new steals its value, failing or not */
    int bad = json_object_set_new(fn, "name", jn);
    bad |= json_object_set_new(fn, "arguments", ja);
    bad |= json_object_set_new(call, "id", json_string(id));
    bad |= json_object_set_new(call, "type", json_string("function"));
    bad |= json_object_set_new(call, "function", fn);
    if (bad) json_decref(call);
    if (bad || json_array_append_new(arr, call)) return osp_err(OSP_ERR_NOMEM, "reply: out of memory");
    return OSP_OK;
}

/* ---- JSON calls (QWEN, LLAMA3) ---- */

/* Skip one JSON value at *pi (leading whitespace allowed). Loose: it only
 * finds the value's end; jansson validates. */
static int js_skip(const char *s, size_t n, size_t *pi, int depth) {
    size_t i = skip_ws(s, n, *pi);
    if (i >= n || depth > MAX_DEPTH) return 0;
    char c = s[i];
    if (c == '"') {
        for (i++; i < n; i++) {
            if (s[i] == '\\') i++;
            else if (s[i] == '"') {
                *pi = i + 1;
                return 1;
            }
        }
        return 0;
    }
    if (c == '{' || c == '[') {
        char close = c == '{' ? '}' : ']';
        i = skip_ws(s, n, i + 1);
        if (i < n && s[i] == close) {
            *pi = i + 1;
            return 1;
        }
        for (;;) {
            if (c == '{') {
                if (!js_skip(s, n, &i, depth + 1)) return 0;
                i = skip_ws(s, n, i);
                if (i >= n || s[i] != ':') return 0;
                i++;
            }
            if (!js_skip(s, n, &i, depth + 1)) return 0;
            i = skip_ws(s, n, i);
            if (i >= n) return 0;
            if (s[i] == ',') {
                i++;
                continue;
            }
            if (s[i] != close) return 0;
            *pi = i + 1;
            return 1;
        }
    }
    size_t j = i;
    while (j < n && (in_set(s[j], "+-.") || (s[j] >= '0' && s[j] <= '9') || (s[j] >= 'a' && s[j] <= 'z') ||
                     (s[j] >= 'A' && s[j] <= 'Z')))
        j++;
    if (j == i) return 0;
    *pi = j;
    return 1;
}

/* Raw span of member `key` of the object s[0..n). */
static int find_member(const char *s, size_t n, const char *key, size_t *vs, size_t *ve) {
    size_t kl = strlen(key), i = skip_ws(s, n, 0);
    if (i >= n || s[i] != '{') return 0;
    i++;
    for (;;) {
        i = skip_ws(s, n, i);
        size_t ks = i;
        if (!js_skip(s, n, &i, 0)) return 0;
        size_t ke = i;
        i = skip_ws(s, n, i);
        if (i >= n || s[i] != ':') return 0;
        size_t v0 = skip_ws(s, n, i + 1);
        i = v0;
        if (!js_skip(s, n, &i, 0)) return 0;
        if (ke - ks == kl + 2 && s[ks] == '"' && memcmp(s + ks + 1, key, kl) == 0) {
            *vs = v0;
            *ve = i;
            return 1;
        }
        i = skip_ws(s, n, i);
        if (i >= n || s[i] != ',') return 0;
        i++;
    }
}

/* Copy JSON text without the whitespace between tokens. */
static void compact(sbuf *o, const char *s, size_t n) {
    int in_str = 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (in_str) {
            if (c == '\\' && i + 1 < n) {
                sb_add(o, s + i, 2);
                i++;
                continue;
            }
            if (c == '"') in_str = 0;
        } else if (is_ws(c)) {
            continue;
        } else if (c == '"') {
            in_str = 1;
        }
        sb_addc(o, c);
    }
}

/* One {"name": N, "arguments"|"parameters": {...}} object, exactly s[0..n). */
static osp_status json_call(const char *s, size_t n, json_t *arr) {
    json_error_t err;
    json_t *o = json_loadb(s, n, JSON_REJECT_DUPLICATES, &err);
    if (!json_is_object(o)) {
        json_decref(o);
        return OSP_ERR_FORMAT;
    }
    const char *akey = json_object_get(o, "arguments") ? "arguments" : "parameters";
    json_t *name = json_object_get(o, "name"), *a = json_object_get(o, akey);
    osp_status st = OSP_ERR_FORMAT;
    if (!json_is_string(name)) {
        /* not a call */
    } else if (!a || json_is_null(a)) {
        st = add_call(arr, json_string_value(name), json_string_length(name), "{}", 2);
    } else if (json_is_string(a)) { /* arguments already serialized */
        st = add_call(arr, json_string_value(name), json_string_length(name), json_string_value(a),
                      json_string_length(a));
    } else if (json_is_object(a)) {
        sbuf args = {0};
        size_t vs, ve;
        if (find_member(s, n, akey, &vs, &ve)) {
            compact(&args, s + vs, ve - vs);
        } else { /* key spelled with escapes: re-serialize instead */
            char *d = json_dumps(a, JSON_COMPACT);
            if (d) sb_add(&args, d, strlen(d));
            else args.oom = 1;
            free(d);
        }
        st = args.oom ? osp_err(OSP_ERR_NOMEM, "reply: out of memory")
                      : add_call(arr, json_string_value(name), json_string_length(name), args.p, args.len);
        sb_free(&args);
    }
    json_decref(o);
    return st;
}

/* JSON_REPLY (LLAMA3): the whole reply, after an optional tag, as calls
 * separated by ';' or whitespace; all or nothing. */
static osp_status json_reply_calls(json_t *calls, const char *s, size_t n, const char *tag) {
    size_t i = skip_ws(s, n, 0);
    if (starts(s + i, n - i, tag)) i += strlen(tag);
    json_t *tmp = json_array();
    if (!tmp) return osp_err(OSP_ERR_NOMEM, "reply: out of memory");
    osp_status st = OSP_OK;
    for (;;) {
        while (i < n && (is_ws(s[i]) || s[i] == ';')) i++;
        if (i >= n) break;
        size_t b = i;
        if (s[i] != '{' || !js_skip(s, n, &i, 0)) {
            st = OSP_ERR_FORMAT;
            break;
        }
        if ((st = json_call(s + b, i - b, tmp)) != OSP_OK) break;
    }
    if (st == OSP_OK && json_array_size(tmp) == 0) st = OSP_ERR_FORMAT;
    if (st == OSP_OK && json_array_extend(calls, tmp)) st = osp_err(OSP_ERR_NOMEM, "reply: out of memory");
    json_decref(tmp);
    return st;
}

/* ---- Gemma 4 arguments -> JSON ---- */

static void json_escape(sbuf *o, const char *s, size_t n) {
    sb_addc(o, '"');
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        const char *e = NULL;
        switch (c) {
        case '"': e = "\\\""; break;
        case '\\': e = "\\\\"; break;
        case '\n': e = "\\n"; break;
        case '\r': e = "\\r"; break;
        case '\t': e = "\\t"; break;
        case '\b': e = "\\b"; break;
        case '\f': e = "\\f"; break;
        }
        if (e) {
            sb_add(o, e, strlen(e));
        } else if (c < 0x20) {
            char u[8];
            snprintf(u, sizeof u, "\\u%04x", c);
            sb_add(o, u, 6);
        } else {
            sb_addc(o, (char)c);
        }
    }
    sb_addc(o, '"');
}

static int is_digit(char c) { return c >= '0' && c <= '9'; }

/* JSON's number grammar, exactly s[0..n). */
static int json_number_ok(const char *s, size_t n) {
    size_t i = 0;
    if (i < n && s[i] == '-') i++;
    if (i < n && s[i] == '0') i++;
    else if (i < n && is_digit(s[i])) while (i < n && is_digit(s[i])) i++;
    else return 0;
    if (i < n && s[i] == '.') {
        if (++i >= n || !is_digit(s[i])) return 0;
        while (i < n && is_digit(s[i])) i++;
    }
    if (i < n && (s[i] == 'e' || s[i] == 'E')) {
        i++;
        if (i < n && (s[i] == '+' || s[i] == '-')) i++;
        if (i >= n || !is_digit(s[i])) return 0;
        while (i < n && is_digit(s[i])) i++;
    }
    return i == n;
}

/* A number as the model wrote it when that is JSON; else ("+1", ".5", "1.")
 * the shortest decimal that reads back to the same double. */
static int g_number(const char *s, size_t n, sbuf *o) {
    if (json_number_ok(s, n)) return sb_add(o, s, n), 1;
    char tmp[64], out[32];
    if (n >= sizeof tmp) return 0;
    memcpy(tmp, s, n);
    tmp[n] = 0;
    char *end;
    double v = strtod(tmp, &end);
    if (end != tmp + n || !isfinite(v)) return 0;
    for (int prec = 15; prec <= 17; prec++) {
        snprintf(out, sizeof out, "%.*g", prec, v);
        if (strtod(out, NULL) == v) break;
    }
    sb_add(o, out, strlen(out));
    return 1;
}

/* <|"|>...<|"|> at *pi: the text between, verbatim, as a JSON string. */
static int g_string(const char *s, size_t n, size_t *pi, sbuf *o) {
    size_t b = *pi + strlen(GEMMA_STR);
    size_t e = find(s + b, n - b, GEMMA_STR);
    if (e == NOT_FOUND) return 0;
    json_escape(o, s + b, e);
    *pi = b + e + strlen(GEMMA_STR);
    return 1;
}

static int is_key_char(char c) {
    return is_digit(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == '-' || c == '.';
}

static int g_key(const char *s, size_t n, size_t *pi, sbuf *o) {
    size_t i = skip_ws(s, n, *pi);
    if (starts(s + i, n - i, GEMMA_STR)) {
        *pi = i;
        return g_string(s, n, pi, o);
    }
    size_t j = i;
    while (j < n && is_key_char(s[j])) j++;
    if (j == i) return 0;
    json_escape(o, s + i, j - i);
    *pi = j;
    return 1;
}

static int g_value(const char *s, size_t n, size_t *pi, sbuf *o, int depth);

/* {k:v,...} or [v,...] at *pi. */
static int g_container(const char *s, size_t n, size_t *pi, sbuf *o, int depth) {
    char open = s[*pi], close = open == '{' ? '}' : ']';
    if (depth > MAX_DEPTH) return 0;
    sb_addc(o, open);
    size_t i = skip_ws(s, n, *pi + 1);
    if (i < n && s[i] == close) {
        sb_addc(o, close);
        *pi = i + 1;
        return 1;
    }
    for (;;) {
        if (open == '{') {
            if (!g_key(s, n, &i, o)) return 0;
            i = skip_ws(s, n, i);
            if (i >= n || s[i] != ':') return 0;
            sb_addc(o, ':');
            i++;
        }
        if (!g_value(s, n, &i, o, depth + 1)) return 0;
        i = skip_ws(s, n, i);
        if (i < n && s[i] == ',') {
            sb_addc(o, ',');
            i++;
            continue;
        }
        if (i >= n || s[i] != close) return 0;
        sb_addc(o, close);
        *pi = i + 1;
        return 1;
    }
}

static int g_value(const char *s, size_t n, size_t *pi, sbuf *o, int depth) {
    size_t i = skip_ws(s, n, *pi);
    if (i >= n) return 0;
    *pi = i;
    if (starts(s + i, n - i, GEMMA_STR)) return g_string(s, n, pi, o);
    if (s[i] == '{' || s[i] == '[') return g_container(s, n, pi, o, depth);
    static const char *const lits[] = {"true", "false", "null"};
    for (int k = 0; k < 3; k++) {
        size_t l = strlen(lits[k]);
        if (starts(s + i, n - i, lits[k]) && (i + l == n || in_set(s[i + l], ",}] \t\r\n"))) {
            sb_add(o, lits[k], l);
            *pi = i + l;
            return 1;
        }
    }
    size_t j = i;
    while (j < n && (is_digit(s[j]) || in_set(s[j], "+-.eE"))) j++;
    if (j == i || !g_number(s + i, j - i, o)) return 0;
    *pi = j;
    return 1;
}

/* call:NAME{ARGS}, exactly s[0..n) up to whitespace. */
static osp_status gemma_call(const char *s, size_t n, json_t *arr) {
    size_t i = skip_ws(s, n, 0);
    if (!starts(s + i, n - i, "call:")) return OSP_ERR_FORMAT;
    size_t ns = i + 5, ne = ns;
    while (ne < n && s[ne] != '{' && !is_ws(s[ne])) ne++;
    i = skip_ws(s, n, ne);
    if (ne == ns || i >= n || s[i] != '{') return OSP_ERR_FORMAT;
    sbuf args = {0};
    int ok = g_container(s, n, &i, &args, 0) && skip_ws(s, n, i) == n;
    osp_status st = args.oom ? osp_err(OSP_ERR_NOMEM, "reply: out of memory")
                    : ok     ? add_call(arr, s + ns, ne - ns, args.p, args.len)
                             : OSP_ERR_FORMAT;
    sb_free(&args);
    return st;
}

/* ---- the stream ---- */

enum { ST_START, ST_CONTENT, ST_REASONING, ST_TOOL, ST_HOLD, ST_DONE };

struct osp_reply {
    const osp_reply_spec *mk; /* the format's row */
    int tools;        /* tool calls are parsed */
    int state;
    int skip_ws;      /* drop whitespace at the head (after a marker) */
    int strip_label;  /* drop think_label after think_open (GEMMA4's "thought") */
    size_t tool_ws;   /* TOOL: whitespace before the block, kept in case it fails */
    size_t tool_scan; /* TOOL: body bytes searched for the closer so far */
    int tool_in_str;  /* TOOL: the scan is inside a tool_quote string (GEMMA4) */
    sbuf in;          /* unprocessed text: in.p[off .. in.len) */
    size_t off;
    json_t *calls;
    int cancelled, finished;
};

osp_status osp_reply_new(osp_reply_format f, int parse_reasoning, int parse_tools, int start_in_reasoning,
                         osp_reply **out) {
    if (!out) return osp_err(OSP_ERR_INVALID, "reply: out is NULL");
    *out = NULL;
    const osp_reply_spec *mk = osp_reply_spec_of(f);
    if (!mk) return osp_err(OSP_ERR_INVALID, "reply: unknown format %d", (int)f);
    osp_reply *r = osp_calloc(OSP_POOL_MISC, sizeof *r);
    if (!r || !(r->calls = json_array())) {
        osp_free(r);
        return osp_err(OSP_ERR_NOMEM, "reply: out of memory");
    }
    r->mk = mk;
    r->tools = parse_tools && mk->calls != OSP_REPLY_CALLS_NONE;
    r->state = ST_CONTENT;
    if (r->tools && mk->calls == OSP_REPLY_CALLS_JSON_REPLY) {
        r->state = ST_START; /* is the reply a call? */
    } else if (parse_reasoning && mk->think_open) {
        r->state = start_in_reasoning ? ST_REASONING : ST_START;
        r->skip_ws = start_in_reasoning != 0;
    }
    *out = r;
    return OSP_OK;
}

void osp_reply_free(osp_reply *r) {
    if (!r) return;
    sb_free(&r->in);
    json_decref(r->calls);
    osp_free(r);
}

static osp_status put(osp_reply *r, osp_reply_emit emit, void *user, osp_reply_kind k, const char *s, size_t n) {
    if (!n || !emit) return OSP_OK;
    if (emit(user, k, s, n)) {
        r->cancelled = 1;
        return osp_err(OSP_REPLY_CANCELLED, "reply: stopped by the emit callback");
    }
    return OSP_OK;
}

static osp_status step_start(osp_reply *r, const char *s, size_t n, int eos) {
    size_t w = skip_ws(s, n, 0);
    const char *p = s + w;
    size_t m = n - w;
    if (r->mk->calls == OSP_REPLY_CALLS_JSON_REPLY) { /* is the reply a JSON call? */
        const char *tag = r->mk->call_tag;
        if (starts(p, m, tag)) {
            size_t t = strlen(tag), w2 = skip_ws(p + t, m - t, 0);
            p += t + w2;
            m -= t + w2;
            if (!m && !eos) return OSP_OK;
        } else if (is_partial(p, m, tag) && !eos) {
            return OSP_OK;
        }
        r->state = m && p[0] == '{' ? ST_HOLD : ST_CONTENT;
        return OSP_OK;
    }
    const char *open = r->mk->think_open;
    if (starts(p, m, open)) {
        r->off += w + strlen(open);
        r->state = ST_REASONING;
        r->skip_ws = 1;
        r->strip_label = r->mk->think_label != NULL;
    } else if (!is_partial(p, m, open) || eos) {
        r->state = ST_CONTENT;
    }
    return OSP_OK;
}

static osp_status step_content(osp_reply *r, const char *s, size_t n, int eos, osp_reply_emit emit, void *user) {
    const char *ms[3];
    int nm = 0;
    if (r->tools && r->mk->tool_open) ms[nm++] = r->mk->tool_open;
    if (r->tools && json_array_size(r->calls))
        for (int k = 0; k < 2; k++)
            if (r->mk->end[k]) ms[nm++] = r->mk->end[k];
    int which;
    size_t p = find_first(s, n, ms, nm, &which);
    if (p != NOT_FOUND) {
        size_t keep = rtrim_len(s, p);
        OSP_TRY(put(r, emit, user, OSP_REPLY_CONTENT, s, keep));
        r->off += keep;
        if (ms[which] == r->mk->tool_open) {
            r->tool_ws = p - keep;
            r->tool_scan = 0;
            r->tool_in_str = 0;
            r->state = ST_TOOL;
        } else {
            r->state = ST_DONE;
        }
        return OSP_OK;
    }
    size_t q = eos ? n : partial_tail(s, n, ms, nm);
    size_t e = nm && !eos ? rtrim_len(s, q) : q;
    OSP_TRY(put(r, emit, user, OSP_REPLY_CONTENT, s, e));
    r->off += e;
    return OSP_OK;
}

static osp_status step_reasoning(osp_reply *r, const char *s, size_t n, int eos, osp_reply_emit emit,
                                 void *user) {
    const char *close = r->mk->think_close;
    size_t p = find(s, n, close);
    if (p != NOT_FOUND) {
        OSP_TRY(put(r, emit, user, OSP_REPLY_REASONING, s, rtrim_len(s, p)));
        r->off += p + strlen(close);
        r->state = ST_CONTENT;
        r->skip_ws = 1;
        return OSP_OK;
    }
    size_t q = eos ? n : partial_tail(s, n, &close, 1);
    size_t e = rtrim_len(s, q);
    OSP_TRY(put(r, emit, user, OSP_REPLY_REASONING, s, e));
    r->off += eos ? n : e;
    return OSP_OK;
}

/* End of the tool block body (relative to body), or NOT_FOUND. Strings
 * between tool_quote delimiters (GEMMA4's) may hold anything, the closer
 * included: skip them. The scan
 * resumes where the last call stopped (before a possible partial marker),
 * so a long block costs linear time however it is fed. */
static size_t tool_end(osp_reply *r, const char *b, size_t n) {
    const char *close = r->mk->tool_close;
    const char *str = r->mk->tool_quote;
    size_t i = r->tool_scan;
    while (i < n) {
        if (is_partial(b + i, n - i, close) || (str && is_partial(b + i, n - i, str))) break;
        if (str && starts(b + i, n - i, str)) {
            r->tool_in_str = !r->tool_in_str;
            i += strlen(str);
        } else if (!r->tool_in_str && starts(b + i, n - i, close)) {
            return i;
        } else {
            i++;
        }
    }
    r->tool_scan = i;
    return NOT_FOUND;
}

static osp_status step_tool(osp_reply *r, const char *s, size_t n, int eos, osp_reply_emit emit, void *user) {
    size_t ol = strlen(r->mk->tool_open), cl = strlen(r->mk->tool_close);
    const char *body = s + r->tool_ws + ol;
    size_t bn = n - r->tool_ws - ol;
    size_t e = tool_end(r, body, bn);
    if (e == NOT_FOUND) {
        if (!eos) return OSP_OK;
        OSP_TRY(put(r, emit, user, OSP_REPLY_CONTENT, s, n)); /* never closed */
        r->off += n;
        r->state = ST_CONTENT;
        return OSP_OK;
    }
    size_t whole = r->tool_ws + ol + e + cl;
    size_t lead = skip_ws(body, e, 0), tail = rtrim_len(body, e);
    osp_status st = r->mk->calls == OSP_REPLY_CALLS_GEMMA_BLOCK ? gemma_call(body, e, r->calls)
                                               : json_call(body + lead, tail > lead ? tail - lead : 0, r->calls);
    if (st == OSP_OK) {
        r->skip_ws = 1;
    } else if (st == OSP_ERR_FORMAT) {
        OSP_TRY(put(r, emit, user, OSP_REPLY_CONTENT, s, whole));
    } else {
        return st;
    }
    r->off += whole;
    r->state = ST_CONTENT;
    return OSP_OK;
}

/* Process as much of the pending text as is certain (all of it at eos). */
static osp_status step(osp_reply *r, osp_reply_emit emit, void *user, int eos) {
    for (;;) {
        const char *s = r->in.p ? r->in.p + r->off : "";
        size_t n = r->in.len - r->off;
        int before = r->state;
        size_t before_off = r->off;
        if (r->skip_ws && (r->state == ST_CONTENT || r->state == ST_REASONING) && !r->strip_label) {
            size_t w = skip_ws(s, n, 0);
            r->off += w;
            s += w;
            n -= w;
            if (!n) return OSP_OK;
            r->skip_ws = 0;
        }
        switch (r->state) {
        case ST_START: OSP_TRY(step_start(r, s, n, eos)); break;
        case ST_CONTENT: OSP_TRY(step_content(r, s, n, eos, emit, user)); break;
        case ST_REASONING:
            if (r->strip_label) {
                const char *l = r->mk->think_label;
                if (starts(s, n, l)) r->off += strlen(l);
                else if (is_partial(s, n, l) && !eos) return OSP_OK;
                r->strip_label = 0;
                continue;
            }
            OSP_TRY(step_reasoning(r, s, n, eos, emit, user));
            break;
        case ST_TOOL: OSP_TRY(step_tool(r, s, n, eos, emit, user)); break;
        case ST_HOLD: {
            if (!eos) return OSP_OK;
            osp_status st = json_reply_calls(r->calls, s, n, r->mk->call_tag);
            if (st == OSP_ERR_FORMAT) OSP_TRY(put(r, emit, user, OSP_REPLY_CONTENT, s, n));
            else if (st != OSP_OK) return st;
            r->off += n;
            r->state = ST_DONE;
            break;
        }
        case ST_DONE: r->off = r->in.len; return OSP_OK;
        }
        if (r->state == before && r->off == before_off) return OSP_OK; /* needs more text */
    }
}

osp_status osp_reply_feed(osp_reply *r, const char *text, size_t len, osp_reply_emit emit, void *user) {
    if (!r || (len && !text)) return osp_err(OSP_ERR_INVALID, "reply: NULL argument");
    if (r->cancelled) return osp_err(OSP_REPLY_CANCELLED, "reply: stopped by the emit callback");
    if (r->finished) return osp_err(OSP_ERR_INVALID, "reply: feed after finish");
    if (r->off) { /* drop what was processed */
        memmove(r->in.p, r->in.p + r->off, r->in.len - r->off);
        r->in.len -= r->off;
        r->in.p[r->in.len] = 0;
        r->off = 0;
    }
    if (!sb_add(&r->in, text, len)) return osp_err(OSP_ERR_NOMEM, "reply: out of memory");
    return step(r, emit, user, 0);
}

osp_status osp_reply_finish(osp_reply *r, osp_reply_emit emit, void *user, json_t **tool_calls) {
    if (tool_calls) *tool_calls = NULL;
    if (!r) return osp_err(OSP_ERR_INVALID, "reply: NULL argument");
    if (r->cancelled) return osp_err(OSP_REPLY_CANCELLED, "reply: stopped by the emit callback");
    if (r->finished) return osp_err(OSP_ERR_INVALID, "reply: finished twice");
    r->finished = 1;
    OSP_TRY(step(r, emit, user, 1));
    if (tool_calls) {
        *tool_calls = r->calls;
        r->calls = NULL;
    }
    return OSP_OK;
}
