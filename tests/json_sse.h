/* Helpers of the API shape tests (test_anthropic, test_responses): a JSON
 * value against its expected text, and an SSE text split into its events.
 * Include after cmocka.h. */
#ifndef OSP_TEST_JSON_SSE_H
#define OSP_TEST_JSON_SSE_H

#include <jansson.h>
#include <string.h>
#include "server/server_internal.h"

static void assert_json(const json_t *v, const char *want) {
    json_t *w = json_loads(want, JSON_DECODE_ANY, NULL);
    assert_non_null(w);
    if (!json_equal(v, w)) {
        char *got = json_dumps(v, JSON_COMPACT | JSON_SORT_KEYS | JSON_ENCODE_ANY);
        fail_msg("got %s\nwant %s", got, want);
    }
    json_decref(w);
}

/* The events of an SSE text, one "event: NAME\ndata: JSON\n\n" each, whose
 * NAME must be the data's "type". */
static json_t *sse_events(const srv_buf *b) {
    json_t *out = json_array();
    const char *p = b->p, *end = b->p + b->len;
    while (p < end) {
        assert_true(!strncmp(p, "event: ", 7));
        const char *nl = strchr(p, '\n');
        assert_true(!strncmp(nl + 1, "data: ", 6));
        const char *stop = strstr(nl + 1, "\n\n");
        assert_non_null(stop);
        json_t *d = json_loadb(nl + 7, (size_t)(stop - nl - 7), 0, NULL);
        assert_non_null(d);
        assert_true(strlen(json_string_value(json_object_get(d, "type"))) == (size_t)(nl - p - 7));
        assert_true(!strncmp(json_string_value(json_object_get(d, "type")), p + 7, (size_t)(nl - p - 7)));
        json_array_append_new(out, d);
        p = stop + 2;
    }
    return out;
}

#endif
