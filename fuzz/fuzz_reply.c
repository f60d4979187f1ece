/* libFuzzer: a model's reply → reasoning, content and tool calls
 * (server/reply), for every format of the table. The first byte picks the
 * format (bits 0-1) and parse_reasoning, parse_tools and start_in_reasoning
 * (bits 2-4); the second seeds the cuts; the rest is the reply. It is parsed
 * whole and again fed in pieces cut between UTF-8 characters: what is
 * emitted, and the calls (ids aside), must not depend on the cuts, and each
 * call must be OpenAI's shape with its arguments a serialized JSON object. */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "server/reply.h"

typedef struct out {
    char *text[2]; /* [OSP_REPLY_CONTENT], [OSP_REPLY_REASONING] */
    size_t len[2];
} out;

static int collect(void *user, osp_reply_kind kind, const char *s, size_t n) {
    out *o = user;
    if (!n) __builtin_trap(); /* pieces are never empty */
    char *p = realloc(o->text[kind], o->len[kind] + n);
    if (!p) abort();
    memcpy(p + o->len[kind], s, n);
    o->text[kind] = p;
    o->len[kind] += n;
    return 0;
}

/* The calls with their ids checked and dropped (ids differ per run). */
static json_t *without_ids(json_t *calls) {
    if (!json_is_array(calls)) __builtin_trap();
    size_t i;
    json_t *c;
    json_array_foreach(calls, i, c) {
        const char *id = json_string_value(json_object_get(c, "id"));
        json_t *fn = json_object_get(c, "function");
        const char *args = json_string_value(json_object_get(fn, "arguments"));
        if (!id || strncmp(id, "call_", 5) || !json_is_string(json_object_get(fn, "name")) || !args) __builtin_trap();
        json_t *a = json_loads(args, 0, NULL);
        if (!json_is_object(a)) __builtin_trap();
        json_decref(a);
        json_object_del(c, "id");
    }
    return calls;
}

/* Feed text[0..n) whole (seed 0) or cut at pseudo-random character starts,
 * then finish; the calls, ids dropped. */
static json_t *run(osp_reply_format f, int reasoning, int tools, int start_in, const char *text, size_t n,
                   uint32_t seed, out *o) {
    osp_reply *r;
    if (osp_reply_new(f, reasoning, tools, start_in, &r) != OSP_OK) __builtin_trap();
    size_t at = 0;
    for (size_t i = 1; seed && i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        if ((seed >> 16) % 4 || ((unsigned char)text[i] & 0xC0) == 0x80) continue; /* cut between characters */
        if (osp_reply_feed(r, text + at, i - at, collect, o) != OSP_OK) __builtin_trap();
        at = i;
    }
    if (osp_reply_feed(r, text + at, n - at, collect, o) != OSP_OK) __builtin_trap();
    json_t *calls = NULL;
    if (osp_reply_finish(r, collect, o, &calls) != OSP_OK) __builtin_trap();
    osp_reply_free(r);
    return without_ids(calls);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2) return 0;
    osp_reply_format f = (osp_reply_format)(data[0] & 3);
    int reasoning = data[0] >> 2 & 1, tools = data[0] >> 3 & 1, start_in = data[0] >> 4 & 1;
    const char *text = (const char *)data + 2;
    size_t n = size - 2;
    out whole = {0}, cut = {0};
    json_t *a = run(f, reasoning, tools, start_in, text, n, 0, &whole);
    json_t *b = run(f, reasoning, tools, start_in, text, n, data[1] | 1u, &cut);
    for (int k = 0; k < 2; k++)
        if (whole.len[k] != cut.len[k] || (whole.len[k] && memcmp(whole.text[k], cut.text[k], whole.len[k])))
            __builtin_trap();
    if (!json_equal(a, b)) __builtin_trap();
    json_decref(a);
    json_decref(b);
    for (int k = 0; k < 2; k++) free(whole.text[k]), free(cut.text[k]);
    return 0;
}
