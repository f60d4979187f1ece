/* server/anthropic: see anthropic.h. Translation of a Messages body into a
 * chat body, the route's handler, and the Messages response shapes. */
#include "server/anthropic.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BILLING_HEADER "x-anthropic-billing-header:"

typedef srv_msgbuf merr;
#define MFAIL SRV_FAIL

#define get srv_json_get

#define block_type srv_json_type

/* Text blocks joined by a blank line (or a string as is) into out. */
static int join_text(const json_t *c, srv_buf *out, const char *where, int drop_billing, merr *e) {
    if (json_is_string(c)) return srv_buf_add(out, json_string_value(c), json_string_length(c));
    if (!json_is_array(c)) MFAIL(e, "%s must be a string or a list of text blocks", where);
    size_t i;
    json_t *b;
    json_array_foreach(c, i, b) {
        const char *t = block_type(b);
        json_t *x = json_object_get(b, "text");
        if (!t || strcmp(t, "text") || !json_is_string(x))
            MFAIL(e, "%s[%zu] must be a text block {\"type\": \"text\", \"text\": ...} (this model takes text only)",
                  where, i);
        const char *s = json_string_value(x);
        if (drop_billing && !strncmp(s, BILLING_HEADER, strlen(BILLING_HEADER))) continue;
        if (out->len && srv_buf_add(out, "\n\n", 2)) MFAIL(e, "out of memory");
        if (srv_buf_add(out, s, json_string_length(x))) MFAIL(e, "out of memory");
    }
    return 0;
}

static json_t *text_message(const char *role, const srv_buf *t) {
    json_t *m = json_object();
    json_object_set_new(m, "role", json_string(role));
    json_object_set_new(m, "content", json_stringn(t->p ? t->p : "", t->len));
    return m;
}

/* One tool_result block → a tool message. */
static int tool_result(const json_t *b, size_t at, json_t *out, merr *e) {
    json_t *id = json_object_get(b, "tool_use_id"), *c = get(b, "content"), *err = get(b, "is_error");
    if (!json_is_string(id)) MFAIL(e, "messages[%zu]: a tool_result block needs a string 'tool_use_id'", at);
    if (err && !json_is_boolean(err)) MFAIL(e, "messages[%zu]: a tool_result's 'is_error' must be a boolean", at);
    srv_buf t = {0};
    /* the model has no error flag of its own: it reads that the call failed */
    if (json_is_true(err) && srv_buf_add(&t, "Error: ", 7)) MFAIL(e, "out of memory");
    if (c && join_text(c, &t, "a tool_result's content", 0, e)) {
        srv_buf_free(&t);
        return -1;
    }
    json_t *m = text_message("tool", &t);
    srv_buf_free(&t);
    json_object_set(m, "tool_call_id", id);
    json_array_append_new(out, m);
    return 0;
}

/* One tool_use block → an OpenAI tool call (arguments as the object). */
static int tool_use(const json_t *b, size_t at, json_t *calls, merr *e) {
    json_t *id = json_object_get(b, "id"), *name = json_object_get(b, "name"), *in = get(b, "input");
    if (!json_is_string(id) || !json_is_string(name))
        MFAIL(e, "messages[%zu]: a tool_use block needs a string 'id' and 'name'", at);
    if (in && !json_is_object(in)) MFAIL(e, "messages[%zu]: a tool_use block's 'input' must be an object", at);
    json_t *f = json_object();
    json_object_set(f, "name", name);
    json_object_set_new(f, "arguments", in ? json_deep_copy(in) : json_object());
    json_t *tc = json_object();
    json_object_set(tc, "id", id);
    json_object_set_new(tc, "type", json_string("function"));
    json_object_set_new(tc, "function", f);
    json_array_append_new(calls, tc);
    return 0;
}

/* Append a user text message to out, joined to the last one when that is a
 * user text message too: the API combines consecutive user turns, and
 * templates that insist on alternating roles would refuse them apart. */
static int user_text(json_t *out, const char *s, size_t n, merr *e) {
    json_t *last = json_array_get(out, json_array_size(out) - 1);
    json_t *lc = json_object_get(last, "content");
    const char *lr = json_string_value(json_object_get(last, "role"));
    if (lr && !strcmp(lr, "user") && json_is_string(lc)) {
        srv_buf t = {0};
        if (srv_buf_add(&t, json_string_value(lc), json_string_length(lc)) || (t.len && srv_buf_add(&t, "\n\n", 2)) ||
            srv_buf_add(&t, s, n)) {
            srv_buf_free(&t);
            MFAIL(e, "out of memory");
        }
        json_object_set_new(last, "content", json_stringn(t.p ? t.p : "", t.len));
        srv_buf_free(&t);
        return 0;
    }
    srv_buf t = {(char *)s, n, n};
    json_array_append_new(out, text_message("user", &t));
    return 0;
}

/* A system message inside 'messages' (Claude Code sends its environment as
 * one after the user's first message): user text where it stands, so the
 * template sees the roles alternate and the prefix before it stays put. */
static int system_message(const json_t *c, size_t at, json_t *out, merr *e) {
    char where[64];
    snprintf(where, sizeof where, "messages[%zu].content", at);
    srv_buf t = {0};
    int rc = join_text(c, &t, where, 1, e) || (t.len && user_text(out, t.p, t.len, e)); /* an empty one adds nothing */
    srv_buf_free(&t);
    return rc ? -1 : 0;
}

/* One Messages message → chat messages appended to out. */
static int one_message(const json_t *m, size_t at, json_t *out, merr *e) {
    json_t *r = json_is_object(m) ? json_object_get(m, "role") : NULL;
    const char *role = json_is_string(r) ? json_string_value(r) : "";
    int user = !strcmp(role, "user");
    json_t *c = json_object_get(m, "content");
    if (!strcmp(role, "system")) return system_message(c, at, out, e);
    if (!user && strcmp(role, "assistant"))
        MFAIL(e, "messages[%zu]: 'role' must be \"user\", \"assistant\" or \"system\"", at);
    if (json_is_string(c) && user) return user_text(out, json_string_value(c), json_string_length(c), e);
    if (json_is_string(c)) {
        json_t *nm = json_object();
        json_object_set_new(nm, "role", json_string(role));
        json_object_set(nm, "content", c);
        json_array_append_new(out, nm);
        return 0;
    }
    if (!json_is_array(c)) MFAIL(e, "messages[%zu]: 'content' must be a string or a list of content blocks", at);
    srv_buf text = {0}, thinking = {0};
    json_t *calls = json_array();
    size_t i, n_results = 0;
    json_t *b;
    int rc = 0;
    json_array_foreach(c, i, b) {
        const char *t = block_type(b);
        if (!t) {
            snprintf(e->msg, e->cap, "messages[%zu].content[%zu] must be an object with a 'type'", at, i);
            rc = -1;
        } else if (!strcmp(t, "text")) {
            json_t *x = json_object_get(b, "text");
            if (!json_is_string(x)) {
                snprintf(e->msg, e->cap, "messages[%zu].content[%zu]: a text block needs a string 'text'", at, i);
                rc = -1;
            } else if ((text.len && srv_buf_add(&text, "\n\n", 2)) ||
                       srv_buf_add(&text, json_string_value(x), json_string_length(x))) {
                snprintf(e->msg, e->cap, "out of memory");
                rc = -1;
            }
        } else if (!strcmp(t, "tool_result") && user) {
            rc = tool_result(b, at, out, e);
            n_results++;
        } else if (!strcmp(t, "tool_use") && !user) {
            rc = tool_use(b, at, calls, e);
        } else if (!strcmp(t, "thinking") && !user) {
            json_t *x = json_object_get(b, "thinking");
            if (!json_is_string(x)) {
                snprintf(e->msg, e->cap, "messages[%zu].content[%zu]: a thinking block needs a string 'thinking'", at, i);
                rc = -1;
            } else if (srv_buf_add(&thinking, json_string_value(x), json_string_length(x))) {
                snprintf(e->msg, e->cap, "out of memory");
                rc = -1;
            }
        } else if (!strcmp(t, "redacted_thinking") && !user) {
            /* opaque: nothing the model could read */
        } else if (!strcmp(t, "image") || !strcmp(t, "document")) {
            snprintf(e->msg, e->cap, "messages[%zu].content[%zu]: '%s' blocks are not supported: this model takes text only",
                     at, i, t);
            rc = -1;
        } else {
            snprintf(e->msg, e->cap, "messages[%zu].content[%zu]: block type '%.40s' is not supported in a%s %s message",
                     at, i, t, user ? "" : "n", role);
            rc = -1;
        }
        if (rc) break;
    }
    if (!rc && user && (text.len || !n_results)) rc = user_text(out, text.p ? text.p : "", text.len, e);
    if (!rc && !user) { /* one assistant message: its text, calls and thinking */
        json_t *nm = text_message(role, &text);
        if (!text.len && json_array_size(calls)) json_object_set_new(nm, "content", json_null());
        if (json_array_size(calls)) json_object_set(nm, "tool_calls", calls);
        if (thinking.len) json_object_set_new(nm, "reasoning_content", json_stringn(thinking.p, thinking.len));
        json_array_append_new(out, nm);
    }
    json_decref(calls);
    srv_buf_free(&text);
    srv_buf_free(&thinking);
    return rc;
}

static int tools_of(const json_t *tools, json_t *chat, merr *e) {
    if (!json_is_array(tools)) MFAIL(e, "'tools' must be a list");
    json_t *out = json_array();
    json_object_set_new(chat, "tools", out);
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        json_t *n = json_is_object(t) ? json_object_get(t, "name") : NULL, *d = get(t, "description");
        json_t *sch = get(t, "input_schema");
        const char *ty = block_type(t);
        if (ty && strcmp(ty, "custom"))
            MFAIL(e, "tools[%zu]: tool type '%.60s' is not supported (only client tools: name, description, "
                  "input_schema)", i, ty);
        if (!json_is_string(n)) MFAIL(e, "tools[%zu] needs a string 'name'", i);
        if (d && !json_is_string(d)) MFAIL(e, "tools[%zu]: 'description' must be a string", i);
        if (sch && !json_is_object(sch)) MFAIL(e, "tools[%zu]: 'input_schema' must be an object", i);
        json_t *dl = get(t, "defer_loading");
        if (dl && !json_is_boolean(dl)) MFAIL(e, "tools[%zu]: 'defer_loading' must be a boolean", i);
        if (json_is_true(dl)) continue; /* kept out of the context until a tool search loads it, as the API does */
        json_t *f = json_object();
        json_object_set(f, "name", n);
        if (d) json_object_set(f, "description", d);
        json_object_set_new(f, "parameters", sch ? json_deep_copy(sch) : json_pack("{s:s}", "type", "object"));
        json_array_append_new(out, json_pack("{s:s,s:o}", "type", "function", "function", f));
    }
    return 0;
}

static int tool_choice_of(const json_t *tc, json_t *chat, merr *e) {
    const char *t = block_type(tc);
    if (!t) MFAIL(e, "'tool_choice' must be an object with a 'type'");
    json_t *dp = get(tc, "disable_parallel_tool_use");
    if (dp && !json_is_boolean(dp)) MFAIL(e, "'tool_choice.disable_parallel_tool_use' must be a boolean");
    if (json_is_true(dp)) json_object_set_new(chat, "parallel_tool_calls", json_false());
    if (!strcmp(t, "auto") || !strcmp(t, "none")) {
        json_object_set_new(chat, "tool_choice", json_string(t));
    } else if (!strcmp(t, "any")) {
        json_object_set_new(chat, "tool_choice", json_string("required"));
    } else if (!strcmp(t, "tool")) {
        json_t *n = json_object_get(tc, "name");
        if (!json_is_string(n)) MFAIL(e, "'tool_choice' of type \"tool\" needs a string 'name'");
        json_object_set_new(chat, "tool_choice", json_pack("{s:s,s:{s:O}}", "type", "function", "function", "name", n));
    } else {
        MFAIL(e, "'tool_choice.type' must be \"auto\", \"any\", \"tool\" or \"none\"");
    }
    return 0;
}

/* thinking → enable_thinking; output_config.effort → reasoning_effort. */
static int reasoning_of(const json_t *body, json_t *chat, merr *e) {
    json_t *th = get(body, "thinking"), *oc = get(body, "output_config");
    if (th) {
        const char *t = block_type(th);
        if (!t || (strcmp(t, "enabled") && strcmp(t, "adaptive") && strcmp(t, "disabled")))
            MFAIL(e, "'thinking.type' must be \"enabled\", \"adaptive\" or \"disabled\"");
        json_t *bt = get(th, "budget_tokens");
        if (bt && !json_is_integer(bt)) MFAIL(e, "'thinking.budget_tokens' must be an integer");
        json_object_set_new(chat, "chat_template_kwargs",
                            json_pack("{s:b}", "enable_thinking", strcmp(t, "disabled") != 0));
    }
    if (oc) {
        if (!json_is_object(oc)) MFAIL(e, "'output_config' must be an object");
        json_t *ef = get(oc, "effort");
        if (ef && !json_is_string(ef)) MFAIL(e, "'output_config.effort' must be a string");
        if (ef) json_object_set(chat, "reasoning_effort", ef);
    }
    return 0;
}

static int translate(const json_t *body, int count_only, json_t *chat, int32_t *max_tokens, merr *e) {
    static const char *known[] = {"model", "max_tokens", "system", "messages", "tools", "tool_choice",
                                  "stop_sequences", "temperature", "top_p", "top_k", "stream", "thinking",
                                  "cache_control", "metadata", "context_management", "service_tier",
                                  "output_config"};
    if (!json_is_object(body)) MFAIL(e, "the body must be a JSON object");
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)body, key, v) {
        int ok = 0;
        for (size_t k = 0; k < sizeof known / sizeof *known && !ok; k++) ok = !strcmp(key, known[k]);
        if (!ok) MFAIL(e, "unknown field '%.60s'", key);
    }
    if ((v = get(body, "model")) && !json_is_string(v)) MFAIL(e, "'model' must be a string");
    *max_tokens = 0;
    v = get(body, "max_tokens");
    if (!v && !count_only) MFAIL(e, "'max_tokens' is required");
    if (v && (!json_is_integer(v) || json_integer_value(v) < 1)) MFAIL(e, "'max_tokens' must be a positive integer");
    if (v) *max_tokens = json_integer_value(v) > (1 << 30) ? (1 << 30) : (int32_t)json_integer_value(v);
    if ((v = get(body, "metadata")) && !json_is_object(v)) MFAIL(e, "'metadata' must be an object");
    if ((v = get(body, "service_tier")) && !json_is_string(v)) MFAIL(e, "'service_tier' must be a string");
    for (const char *const *k = (const char *const[]){"temperature", "top_p", "top_k", "stream", NULL}; *k; k++)
        if ((v = get(body, *k)) && !count_only) json_object_set(chat, *k, v); /* request.c checks them */
    json_t *msgs = json_array();
    json_object_set_new(chat, "messages", msgs);
    if ((v = get(body, "system"))) {
        srv_buf t = {0};
        if (join_text(v, &t, "'system'", 1, e)) {
            srv_buf_free(&t);
            return -1;
        }
        if (t.len) json_array_append_new(msgs, text_message("system", &t));
        srv_buf_free(&t);
    }
    v = get(body, "messages");
    if (!json_is_array(v) || !json_array_size(v)) MFAIL(e, "'messages' must be a non-empty list");
    size_t i;
    json_t *m;
    size_t before = json_array_size(msgs);
    json_array_foreach(v, i, m) if (one_message(m, i, msgs, e)) return -1;
    if (json_array_size(msgs) == before) MFAIL(e, "'messages' holds nothing but empty system messages");
    if ((v = get(body, "tools")) && tools_of(v, chat, e)) return -1;
    if ((v = get(body, "tool_choice")) && tool_choice_of(v, chat, e)) return -1;
    if ((v = get(body, "stop_sequences"))) {
        if (!json_is_array(v)) MFAIL(e, "'stop_sequences' must be a list of strings");
        json_array_foreach(v, i, m) if (!json_is_string(m)) MFAIL(e, "'stop_sequences' must be a list of strings");
        if (!count_only) json_object_set(chat, "stop", v);
    }
    return reasoning_of(body, chat, e);
}

int srv_msg_translate(const json_t *body, int count_only, json_t **chat, int32_t *max_tokens, char *msg, size_t cap) {
    merr e = {msg, cap};
    json_t *c = json_object();
    int32_t mt = 0;
    if (translate(body, count_only, c, &mt, &e)) {
        json_decref(c);
        *chat = NULL;
        return 400;
    }
    *chat = c;
    *max_tokens = mt;
    return 0;
}

/* ---- errors ---- */

const char *srv_msg_error_type(int status) {
    switch (status) {
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503: return "overloaded_error";
    default: return status >= 500 ? "api_error" : "invalid_request_error";
    }
}

json_t *srv_msg_error_json(int status, const char *message) {
    json_t *o = json_object();
    json_object_set_new(o, "type", json_string("error"));
    json_object_set_new(o, "error", json_pack("{s:s,s:o}", "type", srv_msg_error_type(status), "message",
                                              srv_json_string_lossy(message, strlen(message))));
    return o;
}

const char *srv_msg_error_message(const char *m, const srv_reject *why, char *buf, size_t cap) {
    if (why && why->reason == SRV_REJECT_OVER_CONTEXT && why->ctx > 0) {
        /* one is left to generate */
        snprintf(buf, cap, "prompt is too long: %d tokens > %d maximum", why->n_prompt, why->ctx - 1);
        return buf;
    }
    return m;
}

/* ---- results ---- */

const char *srv_msg_matched_stop(const char *const *stops, int n, const char *raw, size_t raw_len, size_t emitted) {
    if (emitted > raw_len) return NULL;
    const char *best = NULL;
    for (int i = 0; i < n; i++) { /* the shortest that starts at the cut completed first */
        size_t l = strlen(stops[i]);
        if (l && l <= raw_len - emitted && !memcmp(raw + emitted, stops[i], l) && (!best || l < strlen(best)))
            best = stops[i];
    }
    return best;
}

const char *srv_msg_stop_reason(osp_finish finish, int has_calls, const char *stop_seq) {
    if (has_calls) return "tool_use";
    if (finish == OSP_FINISH_LENGTH) return "max_tokens";
    return stop_seq ? "stop_sequence" : "end_turn";
}

/* The message-level fields both shapes share: everything but content. */
static json_t *message_head(const char *id, const char *model) {
    json_t *o = json_object();
    json_object_set_new(o, "id", json_string(id));
    json_object_set_new(o, "type", json_string("message"));
    json_object_set_new(o, "role", json_string("assistant"));
    json_object_set_new(o, "model", json_string(model));
    return o;
}

/* Anthropic's input_tokens leaves out what the cache read. */
static json_t *usage_of(int32_t input, int32_t cached, int32_t output) {
    return json_pack("{s:i,s:i,s:i,s:i}", "input_tokens", input - cached, "cache_creation_input_tokens", 0,
                     "cache_read_input_tokens", cached, "output_tokens", output);
}

/* The thinking blocks' signature: the API requires one; locally nothing
 * verifies it, and replayed blocks are taken as they come. */
#define SIGNATURE "osprey-local"

/* A tool call of the reply parser as a tool_use block (input: {} for
 * arguments that are not an object). */
static json_t *tool_use_block(const json_t *call, int with_input) {
    json_t *f = json_object_get(call, "function");
    const char *cid = json_string_value(json_object_get(call, "id"));
    char id[96];
    snprintf(id, sizeof id, "toolu_%s", cid && !strncmp(cid, "call_", 5) ? cid + 5 : cid ? cid : "0");
    json_t *in = NULL;
    if (with_input) {
        json_t *a = json_object_get(f, "arguments");
        in = json_is_string(a) ? json_loads(json_string_value(a), 0, NULL) : NULL;
        if (!json_is_object(in)) json_decref(in), in = NULL;
    }
    return json_pack("{s:s,s:s,s:O,s:o}", "type", "tool_use", "id", id, "name", json_object_get(f, "name"), "input",
                     in ? in : json_object());
}

json_t *srv_msg_body(const srv_msg_result *m) {
    json_t *o = message_head(m->id, m->model), *content = json_array();
    if (m->reasoning_len)
        json_array_append_new(content, json_pack("{s:s,s:o,s:s}", "type", "thinking", "thinking",
                                                 srv_json_string_lossy(m->reasoning, m->reasoning_len), "signature",
                                                 SIGNATURE));
    if (m->content_len || !json_array_size(m->tool_calls))
        json_array_append_new(content, json_pack("{s:s,s:o}", "type", "text", "text",
                                                 srv_json_string_lossy(m->content ? m->content : "", m->content_len)));
    size_t i;
    json_t *c;
    json_array_foreach(m->tool_calls, i, c) json_array_append_new(content, tool_use_block(c, 1));
    json_object_set_new(o, "content", content);
    json_object_set_new(o, "stop_reason", json_string(m->stop_reason));
    json_object_set_new(o, "stop_sequence", m->stop_sequence ? json_string(m->stop_sequence) : json_null());
    json_object_set_new(o, "usage", usage_of(m->input_tokens, m->cached_tokens, m->output_tokens));
    return o;
}

/* ---- streaming ---- */

#define sse srv_sse_event

int srv_msg_sse_start(srv_msg_sse *st, srv_buf *b, const char *id, const char *model, int32_t input_tokens) {
    st->open = -1;
    st->index = 0;
    json_t *m = message_head(id, model);
    json_object_set_new(m, "content", json_array());
    json_object_set_new(m, "stop_reason", json_null());
    json_object_set_new(m, "stop_sequence", json_null());
    json_object_set_new(m, "usage", usage_of(input_tokens, 0, 0));
    return sse(b, "message_start", json_pack("{s:s,s:o}", "type", "message_start", "message", m));
}

static int block_start(srv_msg_sse *st, srv_buf *b, json_t *block) {
    return sse(b, "content_block_start",
               json_pack("{s:s,s:i,s:o}", "type", "content_block_start", "index", st->index, "content_block", block));
}

static int delta(srv_msg_sse *st, srv_buf *b, const char *type, const char *field, json_t *value) {
    return sse(b, "content_block_delta", json_pack("{s:s,s:i,s:{s:s,s:o}}", "type", "content_block_delta", "index",
                                                   st->index, "delta", "type", type, field, value));
}

static int block_stop(srv_msg_sse *st, srv_buf *b) {
    int rc = 0;
    if (st->open == OSP_REPLY_REASONING) rc = delta(st, b, "signature_delta", "signature", json_string(SIGNATURE));
    if (!rc) rc = sse(b, "content_block_stop", json_pack("{s:s,s:i}", "type", "content_block_stop", "index", st->index));
    st->open = -1;
    st->index++;
    return rc;
}

int srv_msg_sse_piece(srv_msg_sse *st, srv_buf *b, osp_reply_kind kind, const char *text, size_t len) {
    int thinking = kind == OSP_REPLY_REASONING;
    if (!len) return 0;
    if (st->open != (int)kind) {
        if (st->open >= 0 && block_stop(st, b)) return -1;
        json_t *blk = thinking ? json_pack("{s:s,s:s,s:s}", "type", "thinking", "thinking", "", "signature", "")
                               : json_pack("{s:s,s:s}", "type", "text", "text", "");
        if (block_start(st, b, blk)) return -1;
        st->open = (int)kind;
    }
    return delta(st, b, thinking ? "thinking_delta" : "text_delta", thinking ? "thinking" : "text",
                 srv_json_string_lossy(text, len));
}

int srv_msg_sse_end(srv_msg_sse *st, srv_buf *b, const srv_msg_result *m) {
    int rc = 0;
    if (st->open >= 0) rc = block_stop(st, b);
    else if (!json_array_size(m->tool_calls)) { /* an empty reply still has its text block */
        rc = block_start(st, b, json_pack("{s:s,s:s}", "type", "text", "text", "")) || block_stop(st, b);
    }
    size_t i;
    json_t *c;
    json_array_foreach(m->tool_calls, i, c) {
        if (rc) break;
        json_t *a = json_object_get(json_object_get(c, "function"), "arguments");
        rc = block_start(st, b, tool_use_block(c, 0)) ||
             delta(st, b, "input_json_delta", "partial_json", json_string(json_is_string(a) ? json_string_value(a) : "{}")) ||
             block_stop(st, b);
    }
    if (!rc)
        rc = sse(b, "message_delta",
                 json_pack("{s:s,s:{s:s,s:o},s:o}", "type", "message_delta", "delta", "stop_reason", m->stop_reason,
                           "stop_sequence", m->stop_sequence ? json_string(m->stop_sequence) : json_null(), "usage",
                           usage_of(m->input_tokens, m->cached_tokens, m->output_tokens)));
    if (!rc) rc = sse(b, "message_stop", json_pack("{s:s}", "type", "message_stop"));
    return rc ? -1 : 0;
}

int srv_msg_sse_error(srv_buf *b, int status, const char *message) {
    return sse(b, "error", srv_msg_error_json(status, message));
}

int srv_msg_sse_ping(srv_buf *b) { return sse(b, "ping", json_pack("{s:s}", "type", "ping")); }

/* ---- the route ---- */

static void send_msg_error(srv *s, srv_req *c, int status, const char *msg) {
    srv_send_json(s, c, status, srv_msg_error_json(status, msg));
}

void srv_messages(srv *s, srv_req *c, const json_t *body, int count_only) {
    char msg[512];
    json_t *chat = NULL;
    int32_t max_tokens = 0;
    int st = srv_msg_translate(body, count_only, &chat, &max_tokens, msg, sizeof msg);
    if (st) {
        send_msg_error(s, c, st, msg);
        return;
    }
    int status = 400;
    json_t *err = NULL;
    srv_reject why = {0};
    srv_job *j = count_only ? srv_parse_count(s, chat, &status, &err)
                            : srv_parse_translated(s, chat, max_tokens, &status, &err, &why);
    if (!j) {
        char buf[128];
        const char *m = srv_msg_error_message(
            json_string_value(json_object_get(json_object_get(err, "error"), "message")), &why, buf, sizeof buf);
        send_msg_error(s, c, status, m ? m : "invalid request");
        json_decref(err);
        return;
    }
    if (count_only) {
        json_t *o = json_pack("{s:i}", "input_tokens", j->n_prompt);
        srv_job_release(j);
        srv_send_json(s, c, 200, o);
        return;
    }
    j->api = SRV_API_MESSAGES;
    char id[64];
    srv_make_id(id, sizeof id, "msg");
    id[3] = '_';
    snprintf(j->id, sizeof j->id, "%s", id);
    if ((st = srv_submit(s, c, j))) send_msg_error(s, c, st, SRV_KV_BUDGET_MSG);
}
