/* server/responses: see responses.h. Translation of a Responses body into a
 * chat body, the Responses shapes, and the routes. */
#include "server/responses.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define get srv_json_get

typedef srv_msgbuf rerr;
#define RFAIL SRV_FAIL

#define type_of srv_json_type

static int one_of(const char *s, const char *const *list) {
    for (; s && *list; list++)
        if (!strcmp(s, *list)) return 1;
    return 0;
}

/* ---- request → chat body ---- */

/* Text parts (or a string) appended to out. */
static int parts_text(const json_t *c, srv_buf *out, const char *where, size_t at, rerr *e) {
    static const char *const text_parts[] = {"input_text", "output_text", "text", "summary_text", "reasoning_text", NULL};
    if (json_is_string(c)) return srv_buf_add(out, json_string_value(c), json_string_length(c));
    if (!json_is_array(c)) RFAIL(e, "input[%zu]: '%s' must be a string or a list of content parts", at, where);
    size_t i;
    json_t *p;
    json_array_foreach(c, i, p) {
        const char *t = type_of(p);
        json_t *x = json_object_get(p, t && !strcmp(t, "refusal") ? "refusal" : "text");
        if (t && (one_of(t, text_parts) || !strcmp(t, "refusal")) && json_is_string(x)) {
            if (srv_buf_add(out, json_string_value(x), json_string_length(x))) RFAIL(e, "out of memory");
        } else if (t && (!strcmp(t, "input_image") || !strcmp(t, "input_file") || !strcmp(t, "input_audio"))) {
            RFAIL(e, "input[%zu].%s[%zu]: '%s' parts are not supported: this model takes text only", at, where, i, t);
        } else {
            RFAIL(e, "input[%zu].%s[%zu] must be a text part {\"type\": \"input_text\", \"text\": ...}", at, where, i);
        }
    }
    return 0;
}

/* The conversation being built: chat messages, and reasoning waiting for
 * the assistant turn it belongs to. */
typedef struct conv {
    json_t *msgs;
    srv_buf reasoning;
} conv;

/* The assistant message to add to: the last message when it is one and
 * fresh is 0 (a turn's calls follow its text), else a new one. */
static json_t *assistant_turn(conv *cv, int fresh) {
    json_t *last = json_array_get(cv->msgs, json_array_size(cv->msgs) - 1);
    const char *role = json_string_value(json_object_get(last, "role"));
    if (fresh || !role || strcmp(role, "assistant")) {
        last = json_pack("{s:s,s:n}", "role", "assistant", "content");
        json_array_append_new(cv->msgs, last);
    }
    if (cv->reasoning.len) {
        json_object_set_new(last, "reasoning_content", json_stringn(cv->reasoning.p, cv->reasoning.len));
        cv->reasoning.len = 0;
    }
    return last;
}

/* A call of the conversation: arguments as the object they hold, where they hold one. */
static void add_call(conv *cv, const json_t *call_id, const json_t *name, json_t *args) {
    json_t *m = assistant_turn(cv, 0), *calls = json_object_get(m, "tool_calls");
    if (!calls) json_object_set_new(m, "tool_calls", calls = json_array());
    if (json_is_string(args)) {
        json_t *o = json_loads(json_string_value(args), 0, NULL);
        if (json_is_object(o)) json_decref(args), args = o;
        else json_decref(o);
    }
    json_array_append_new(calls, json_pack("{s:O,s:s,s:{s:O,s:o}}", "id", call_id, "type", "function", "function",
                                           "name", name, "arguments", args));
}

static int message_item(conv *cv, const json_t *it, size_t at, rerr *e) {
    static const char *const roles[] = {"user", "assistant", "system", "developer", NULL};
    const char *role = json_string_value(json_object_get(it, "role"));
    if (!one_of(role, roles))
        RFAIL(e, "input[%zu]: 'role' must be \"user\", \"assistant\", \"system\" or \"developer\"", at);
    srv_buf t = {0};
    if (parts_text(json_object_get(it, "content"), &t, "content", at, e)) {
        srv_buf_free(&t);
        return -1;
    }
    json_t *text = json_stringn(t.p ? t.p : "", t.len);
    srv_buf_free(&t);
    if (!strcmp(role, "assistant")) { /* a turn's text comes before its calls */
        json_object_set_new(assistant_turn(cv, 1), "content", text);
        return 0;
    }
    json_array_append_new(cv->msgs, json_pack("{s:s,s:o}", "role", strcmp(role, "developer") ? role : "system",
                                              "content", text));
    return 0;
}

static int call_output(conv *cv, const json_t *it, size_t at, rerr *e) {
    json_t *id = json_object_get(it, "call_id");
    if (!json_is_string(id)) RFAIL(e, "input[%zu]: a call output needs a string 'call_id'", at);
    srv_buf t = {0};
    if (parts_text(json_object_get(it, "output"), &t, "output", at, e)) {
        srv_buf_free(&t);
        return -1;
    }
    json_array_append_new(cv->msgs, json_pack("{s:s,s:s%,s:O}", "role", "tool", "content", t.p ? t.p : "", t.len,
                                              "tool_call_id", id));
    srv_buf_free(&t);
    return 0;
}

static int one_item(conv *cv, const json_t *it, size_t at, rerr *e) {
    static const char *const hosted_calls[] = {"web_search_call", "file_search_call", "computer_call",
                                               "code_interpreter_call", "image_generation_call", "mcp_call",
                                               "mcp_list_tools", NULL};
    const char *t = type_of(it);
    if (!t && json_is_object(it) && json_object_get(it, "role")) t = "message";
    if (!t) RFAIL(e, "input[%zu] must be an object with a 'type'", at);
    json_t *id = json_object_get(it, "call_id"), *name = json_object_get(it, "name");
    if (!strcmp(t, "message")) return message_item(cv, it, at, e);
    if (!strcmp(t, "function_call") || !strcmp(t, "custom_tool_call")) {
        int custom = t[0] == 'c';
        json_t *a = json_object_get(it, custom ? "input" : "arguments");
        if (!json_is_string(id) || !json_is_string(name) || !json_is_string(a))
            RFAIL(e, "input[%zu]: a %s needs string 'call_id', 'name' and '%s'", at, t, custom ? "input" : "arguments");
        add_call(cv, id, name, custom ? json_pack("{s:O}", "input", a) : json_copy(a));
        return 0;
    }
    if (!strcmp(t, "function_call_output") || !strcmp(t, "custom_tool_call_output")) return call_output(cv, it, at, e);
    if (!strcmp(t, "reasoning")) { /* its text, if any, to the next assistant turn; opaque content is dropped */
        json_t *c = get(it, "content"), *p;
        if (!json_array_size(c)) c = get(it, "summary");
        size_t i;
        json_array_foreach(c, i, p) { /* never an error: what is not text is left out */
            json_t *x = json_object_get(p, "text");
            if (json_is_string(x) && srv_buf_add(&cv->reasoning, json_string_value(x), json_string_length(x)))
                RFAIL(e, "out of memory");
        }
        return 0;
    }
    if (one_of(t, hosted_calls)) return 0; /* never made here: nothing the model could read */
    RFAIL(e, "input[%zu]: item type '%.40s' is not supported", at, t);
}

/* Tools osprey cannot run: left out of the prompt (refusing them would
 * refuse every request of a client that always offers them). */
static int hosted_tool(const char *t) {
    static const char *const hosted[] = {"file_search", "computer_use", "computer_use_preview", "code_interpreter",
                                         "namespace", "mcp", "image_generation", "local_shell", NULL};
    return one_of(t, hosted) || !strncmp(t, "web_search", 10);
}

static int tools_of(const json_t *tools, json_t *chat, srv_rsp_req *q, rerr *e) {
    if (!json_is_array(tools)) RFAIL(e, "'tools' must be a list");
    json_t *out = json_array();
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        const char *ty = type_of(t);
        json_t *n = json_object_get(t, "name"), *d = get(t, "description"), *p = get(t, "parameters");
        if (!ty) {
            json_decref(out);
            RFAIL(e, "tools[%zu] must be an object with a 'type'", i);
        }
        if (hosted_tool(ty)) {
            size_t l = strlen(q->dropped);
            snprintf(q->dropped + l, sizeof q->dropped - l, "%s%.40s", l ? "," : "", ty);
            q->n_dropped++;
            continue;
        }
        int custom = !strcmp(ty, "custom");
        const char *bad = strcmp(ty, "function") && !custom ? "is not supported"
                          : !json_is_string(n)                ? "needs a string 'name'"
                          : d && !json_is_string(d)           ? "has a 'description' that is not a string"
                          : p && (custom || !json_is_object(p)) ? "has 'parameters' that are not an object"
                                                                : NULL;
        if (bad) {
            json_decref(out);
            RFAIL(e, "tools[%zu] (type '%.40s') %s", i, ty, bad);
        }
        if (custom) { /* the chat request takes custom tools (their formats) in this flat shape too */
            json_array_append(q->custom, n);
            json_t *c = json_pack("{s:s,s:O}", "type", "custom", "name", n);
            if (d) json_object_set(c, "description", d);
            if (get(t, "format")) json_object_set(c, "format", get(t, "format"));
            json_array_append_new(out, c);
            continue;
        }
        json_t *params = p ? json_deep_copy(p) : json_pack("{s:s}", "type", "object");
        json_t *f = json_pack("{s:O,s:o}", "name", n, "parameters", params), *strict = get(t, "strict");
        if (d) json_object_set(f, "description", d);
        if (json_is_boolean(strict)) json_object_set(f, "strict", strict);
        json_array_append_new(out, json_pack("{s:s,s:o}", "type", "function", "function", f));
    }
    if (json_array_size(out)) json_object_set_new(chat, "tools", out);
    else json_decref(out);
    return 0;
}

static int tool_choice_of(const json_t *tc, json_t *chat, rerr *e) {
    static const char *const modes[] = {"auto", "none", "required", NULL};
    const char *t = type_of(tc);
    int has_tools = json_object_get(chat, "tools") != NULL;
    if (json_is_string(tc) && one_of(json_string_value(tc), modes)) {
        if (!has_tools && !strcmp(json_string_value(tc), "required"))
            RFAIL(e, "'tool_choice' \"required\" needs a tool osprey can run (hosted tools are left out)");
        if (has_tools) json_object_set(chat, "tool_choice", (json_t *)tc); /* without tools there is nothing to choose */
        return 0;
    }
    json_t *n = json_object_get(tc, "name");
    if (t && (!strcmp(t, "function") || !strcmp(t, "custom")) && json_is_string(n)) {
        if (!has_tools) RFAIL(e, "'tool_choice' names '%.60s', which is not among 'tools'", json_string_value(n));
        json_object_set_new(chat, "tool_choice", json_pack("{s:s,s:{s:O}}", "type", "function", "function", "name", n));
        return 0;
    }
    RFAIL(e, "'tool_choice' must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", \"name\": ...} "
             "(hosted tools do not run here)");
}

/* reasoning, text, include and top_logprobs → the chat fields. */
static int options_of(const json_t *body, json_t *chat, srv_rsp_req *q, rerr *e) {
    json_t *v, *x;
    if ((v = get(body, "reasoning"))) {
        if (!json_is_object(v)) RFAIL(e, "'reasoning' must be an object");
        if ((x = get(v, "effort")) && !json_is_string(x)) RFAIL(e, "'reasoning.effort' must be a string");
        if (x) json_object_set(chat, "reasoning_effort", x);
        json_t *sm = get(v, "summary") ? get(v, "summary") : get(v, "generate_summary");
        if (sm && !json_is_string(sm)) RFAIL(e, "'reasoning.summary' must be a string");
        q->summary = sm && strcmp(json_string_value(sm), "none");
    }
    if ((v = get(body, "text"))) {
        if (!json_is_object(v)) RFAIL(e, "'text' must be an object");
        json_t *fm = get(v, "format");
        const char *f = fm ? type_of(fm) : "text";
        if (!f) RFAIL(e, "'text.format' must be an object with a 'type'");
        if (!strcmp(f, "json_object")) {
            json_object_set_new(chat, "response_format", json_pack("{s:s}", "type", "json_object"));
        } else if (!strcmp(f, "json_schema")) { /* flat here; nested in chat's response_format (request.c checks it) */
            json_t *js = json_object();
            for (const char *const *k = (const char *const[]){"name", "schema", "strict", "description", NULL}; *k; k++)
                if ((x = get(fm, *k))) json_object_set(js, *k, x);
            if (!get(fm, "schema")) {
                json_decref(js);
                RFAIL(e, "'text.format' of type json_schema needs a 'schema'");
            }
            json_object_set_new(chat, "response_format", json_pack("{s:s,s:o}", "type", "json_schema", "json_schema", js));
        } else if (strcmp(f, "text")) {
            RFAIL(e, "'text.format' must be of type text, json_object or json_schema, not '%.40s'", f);
        }
        if ((x = get(v, "verbosity")) && !json_is_string(x)) RFAIL(e, "'text.verbosity' must be a string");
    }
    if ((v = get(body, "include"))) {
        size_t i;
        if (!json_is_array(v)) RFAIL(e, "'include' must be a list of strings");
        json_array_foreach(v, i, x) {
            if (!json_is_string(x)) RFAIL(e, "'include' must be a list of strings");
            if (!strcmp(json_string_value(x), "message.output_text.logprobs"))
                json_object_set_new(chat, "logprobs", json_true());
        }
    }
    if ((v = get(body, "top_logprobs"))) json_object_set(chat, "top_logprobs", v); /* request.c checks it */
    return 0;
}

/* The leading system messages as one: instructions, then the input's own. */
static void fold_system(json_t *msgs) {
    json_t *first = json_array_get(msgs, 0), *next;
    while ((next = json_array_get(msgs, 1)) && !strcmp(json_string_value(json_object_get(first, "role")), "system") &&
           !strcmp(json_string_value(json_object_get(next, "role")), "system")) {
        json_t *j = json_pack("s++", json_string_value(json_object_get(first, "content")), "\n\n",
                              json_string_value(json_object_get(next, "content")));
        json_object_set_new(first, "content", j);
        json_array_remove(msgs, 1);
    }
}

static int check_fields(const json_t *body, rerr *e) {
    static const char *const known[] = {"model", "input", "instructions", "tools", "tool_choice", "parallel_tool_calls",
                                        "max_output_tokens", "temperature", "top_p", "reasoning", "text", "stream",
                                        "store", "previous_response_id", "include", "prompt_cache_key", "truncation",
                                        "metadata", "user", "client_metadata", "service_tier", "top_logprobs",
                                        "stream_options", "safety_identifier", "prompt_cache_retention", NULL};
    static const char *const strings[] = {"model", "instructions", "previous_response_id", "prompt_cache_key",
                                          "truncation", "user", "service_tier", "safety_identifier",
                                          "prompt_cache_retention", NULL};
    static const char *const objects[] = {"metadata", "client_metadata", "stream_options", NULL};
    if (!json_is_object(body)) RFAIL(e, "the body must be a JSON object");
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)body, key, v) {
        if (!one_of(key, known)) RFAIL(e, "unknown field '%.60s'", key);
        if (json_is_null(v)) continue;
        if (one_of(key, strings) && !json_is_string(v)) RFAIL(e, "'%s' must be a string", key);
        if (one_of(key, objects) && !json_is_object(v)) RFAIL(e, "'%s' must be an object", key);
        if ((!strcmp(key, "store") || !strcmp(key, "stream")) && !json_is_boolean(v)) RFAIL(e, "'%s' must be a boolean", key);
    }
    return 0;
}

static int translate(const json_t *body, const json_t *previous, json_t *chat, srv_rsp_req *q, rerr *e) {
    if (check_fields(body, e)) return -1;
    json_t *v = get(body, "max_output_tokens");
    if (v && (!json_is_integer(v) || json_integer_value(v) < 1)) RFAIL(e, "'max_output_tokens' must be a positive integer");
    if (v) q->max_tokens = json_integer_value(v) > (1 << 30) ? (1 << 30) : (int32_t)json_integer_value(v);
    q->store = !json_is_false(get(body, "store"));
    q->stream = json_is_true(get(body, "stream"));
    for (const char *const *k = (const char *const[]){"temperature", "top_p", "stream", "parallel_tool_calls", NULL}; *k; k++)
        if ((v = get(body, *k))) json_object_set(chat, *k, v); /* request.c checks them */
    conv cv = {.msgs = previous ? json_deep_copy(previous) : json_array()};
    q->conversation = cv.msgs;
    v = get(body, "input");
    if (json_is_string(v)) {
        json_array_append_new(cv.msgs, json_pack("{s:s,s:O}", "role", "user", "content", v));
    } else if (json_is_array(v) && json_array_size(v)) {
        size_t i;
        json_t *it;
        int rc = 0;
        json_array_foreach(v, i, it) if ((rc = one_item(&cv, it, i, e))) break;
        srv_buf_free(&cv.reasoning);
        if (rc) return -1;
    } else {
        RFAIL(e, "'input' must be a string or a non-empty list of items");
    }
    if (!json_array_size(cv.msgs)) RFAIL(e, "'input' holds no message");
    json_t *msgs = json_array();
    json_object_set_new(chat, "messages", msgs);
    if ((v = get(body, "instructions")) && json_string_length(v))
        json_array_append_new(msgs, json_pack("{s:s,s:O}", "role", "system", "content", v));
    json_array_extend(msgs, cv.msgs);
    fold_system(msgs);
    if ((v = get(body, "tools")) && tools_of(v, chat, q, e)) return -1;
    if ((v = get(body, "tool_choice")) && tool_choice_of(v, chat, e)) return -1;
    return options_of(body, chat, q, e);
}

int srv_rsp_translate(const json_t *body, const json_t *previous, json_t **chat, srv_rsp_req *q, char *msg, size_t cap) {
    rerr e = {msg, cap};
    memset(q, 0, sizeof *q);
    q->custom = json_array();
    json_t *c = json_object();
    if (translate(body, previous, c, q, &e)) {
        json_decref(c);
        srv_rsp_req_free(q);
        *chat = NULL;
        return 400;
    }
    *chat = c;
    return 0;
}

void srv_rsp_req_free(srv_rsp_req *q) {
    json_decref(q->custom);
    json_decref(q->conversation);
    q->custom = q->conversation = NULL;
}

/* ---- shapes ---- */

/* An item's id: its kind's prefix, the response's random part, its index. */
static json_t *item_id(const char *prefix, const char *resp_id, size_t index) {
    const char *u = strchr(resp_id, '_');
    char b[128];
    snprintf(b, sizeof b, "%s_%s_%zu", prefix, u ? u + 1 : resp_id, index);
    return json_string(b);
}

static json_t *lossy(const char *s, size_t n) { return srv_json_string_lossy(s ? s : "", n); }

static json_t *text_part(const char *text, size_t len, const json_t *logprobs) {
    json_t *p = json_pack("{s:s,s:o,s:[]}", "type", "output_text", "text", lossy(text, len), "annotations");
    if (logprobs) json_object_set(p, "logprobs", (json_t *)logprobs);
    return p;
}

static json_t *message_out(const char *resp_id, size_t index, const char *status, json_t *content) {
    return json_pack("{s:o,s:s,s:s,s:s,s:o}", "id", item_id("msg", resp_id, index), "type", "message", "status", status,
                     "role", "assistant", "content", content);
}

static json_t *reasoning_out(const char *resp_id, size_t index, const char *text, size_t len, int summary) {
    json_t *sm = json_array(), *c = json_array();
    if (len) {
        json_array_append_new(c, json_pack("{s:s,s:o}", "type", "reasoning_text", "text", lossy(text, len)));
        if (summary) json_array_append_new(sm, json_pack("{s:s,s:o}", "type", "summary_text", "text", lossy(text, len)));
    }
    return json_pack("{s:o,s:s,s:o,s:o}", "id", item_id("rs", resp_id, index), "type", "reasoning", "summary", sm,
                     "content", c);
}

static int is_custom(const srv_rsp_req *q, const char *name) {
    size_t i;
    json_t *n;
    json_array_foreach(q->custom, i, n) if (name && !strcmp(json_string_value(n), name)) return 1;
    return 0;
}

/* A call of the reply parser as a function_call (or custom_tool_call) item. */
static json_t *call_out(const char *resp_id, size_t index, const json_t *call, const srv_rsp_req *q, const char *status) {
    json_t *f = json_object_get(call, "function"), *a = json_object_get(f, "arguments");
    const char *name = json_string_value(json_object_get(f, "name")), *args = json_is_string(a) ? json_string_value(a) : "{}";
    json_t *id = json_object_get(call, "id");
    if (is_custom(q, name)) {
        json_t *o = json_loads(args, 0, NULL), *in = json_object_get(o, "input");
        json_t *item = json_pack("{s:o,s:s,s:s,s:O,s:s,s:s}", "id", item_id("ctc", resp_id, index), "type",
                                 "custom_tool_call", "status", status, "call_id", id, "name", name, "input",
                                 json_is_string(in) ? json_string_value(in) : args);
        json_decref(o);
        return item;
    }
    return json_pack("{s:o,s:s,s:s,s:O,s:s,s:s}", "id", item_id("fc", resp_id, index), "type", "function_call", "status",
                     status, "call_id", id, "name", name ? name : "", "arguments", args);
}

/* A message cut short (max_output_tokens, a failure) is incomplete, as its response. */
static const char *message_status(const srv_rsp_result *r) {
    return r->status != 200 || (r->finish == OSP_FINISH_LENGTH && !json_array_size(r->tool_calls)) ? "incomplete"
                                                                                                    : "completed";
}

json_t *srv_rsp_output(const char *id, const srv_rsp_req *q, const srv_rsp_result *r) {
    json_t *out = json_array();
    if (r->reasoning_len)
        json_array_append_new(out, reasoning_out(id, 0, r->reasoning, r->reasoning_len, q->summary));
    if (r->content_len || !json_array_size(r->tool_calls)) {
        json_t *c = json_array();
        json_array_append_new(c, text_part(r->content, r->content_len, r->logprobs));
        json_array_append_new(out, message_out(id, json_array_size(out), message_status(r), c));
    }
    size_t i;
    json_t *call;
    json_array_foreach(r->tool_calls, i, call) json_array_append_new(out, call_out(id, json_array_size(out), call, q, "completed"));
    return out;
}

json_t *srv_rsp_reply_message(const srv_rsp_result *r) {
    json_t *m = json_pack("{s:s,s:o}", "role", "assistant", "content",
                          r->content_len || !json_array_size(r->tool_calls) ? lossy(r->content, r->content_len)
                                                                           : json_null());
    if (json_array_size(r->tool_calls)) json_object_set_new(m, "tool_calls", json_deep_copy(r->tool_calls));
    if (r->reasoning_len) json_object_set_new(m, "reasoning_content", lossy(r->reasoning, r->reasoning_len));
    return m;
}

static const char *status_of(const json_t *output, const srv_rsp_result *r) {
    if (!output) return "in_progress";
    if (r->status != 200) return "failed";
    return r->finish == OSP_FINISH_LENGTH && !json_array_size(r->tool_calls) ? "incomplete" : "completed";
}

static json_t *echo(const json_t *body, const char *k, json_t *dflt) {
    json_t *v = get(body, k);
    if (!v) return dflt;
    json_decref(dflt);
    return json_deep_copy(v);
}

json_t *srv_rsp_object(const json_t *body, const char *id, long long created, const char *model, const json_t *output,
                       const srv_rsp_result *r) {
    const char *status = status_of(output, r);
    json_t *rs = get(body, "reasoning");
    json_t *o = json_pack("{s:s,s:s,s:I,s:s,s:s}", "id", id, "object", "response", "created_at", (json_int_t)created,
                          "status", status, "model", model);
    json_object_set_new(o, "error", !strcmp(status, "failed")
                                        ? json_pack("{s:s,s:o}", "code",
                                                    r->status == 400 && r->error && strstr(r->error, "context")
                                                        ? "context_length_exceeded"
                                                        : "server_error",
                                                    "message", lossy(r->error, r->error ? strlen(r->error) : 0))
                                        : json_null());
    json_object_set_new(o, "incomplete_details", !strcmp(status, "incomplete")
                                                     ? json_pack("{s:s}", "reason", "max_output_tokens")
                                                     : json_null());
    json_object_set_new(o, "instructions", echo(body, "instructions", json_null()));
    json_object_set_new(o, "max_output_tokens", echo(body, "max_output_tokens", json_null()));
    json_object_set_new(o, "metadata", echo(body, "metadata", json_object()));
    json_object_set_new(o, "output", output ? json_deep_copy(output) : json_array());
    json_object_set_new(o, "parallel_tool_calls", echo(body, "parallel_tool_calls", json_true()));
    json_object_set_new(o, "previous_response_id", echo(body, "previous_response_id", json_null()));
    json_object_set_new(o, "reasoning", json_pack("{s:o,s:o}", "effort", echo(rs, "effort", json_null()), "summary",
                                                  echo(rs, "summary", json_null())));
    json_object_set_new(o, "store", echo(body, "store", json_true()));
    json_object_set_new(o, "temperature", echo(body, "temperature", json_null()));
    json_t *tx = get(body, "text");
    json_object_set_new(o, "text", get(tx, "format") ? json_pack("{s:O}", "format", get(tx, "format"))
                                                     : json_pack("{s:{s:s}}", "format", "type", "text"));
    json_object_set_new(o, "tool_choice", echo(body, "tool_choice", json_string("auto")));
    json_object_set_new(o, "tools", echo(body, "tools", json_array()));
    json_object_set_new(o, "top_p", echo(body, "top_p", json_null()));
    json_object_set_new(o, "truncation", echo(body, "truncation", json_string("disabled")));
    json_object_set_new(o, "user", echo(body, "user", json_null()));
    json_object_set_new(o, "usage", output ? json_pack("{s:i,s:{s:i},s:i,s:{s:i},s:i}", "input_tokens", r->input_tokens,
                                                       "input_tokens_details", "cached_tokens", r->cached_tokens,
                                                       "output_tokens", r->output_tokens, "output_tokens_details",
                                                       "reasoning_tokens", 0, "total_tokens",
                                                       r->input_tokens + r->output_tokens)
                                           : json_null());
    return o;
}

/* ---- streaming ---- */

/* One event: o (stolen) gets its type and sequence number. */
static int ev(srv_rsp_sse *st, srv_buf *b, const char *type, json_t *o) {
    if (!o) return -1;
    json_object_set_new(o, "type", json_string(type));
    json_object_set_new(o, "sequence_number", json_integer(st->seq++));
    return srv_sse_event(b, type, o);
}

static int lifecycle(srv_rsp_sse *st, srv_buf *b, const char *type, const json_t *output, const srv_rsp_result *r) {
    return ev(st, b, type, json_pack("{s:o}", "response", srv_rsp_object(st->body, st->id, st->created, st->model,
                                                                         output, r)));
}

int srv_rsp_sse_start(srv_rsp_sse *st, srv_buf *b) {
    srv_rsp_result none = {.status = 200};
    st->seq = 0;
    st->open = -1;
    st->text.len = 0;
    if (!st->items) st->items = json_array();
    return lifecycle(st, b, "response.created", NULL, &none) || lifecycle(st, b, "response.in_progress", NULL, &none)
               ? -1
               : 0;
}

/* Where an event of the open item points: item_id, output_index (+ a part's index). */
static json_t *at(srv_rsp_sse *st, const char *index_key) {
    size_t i = json_array_size(st->items);
    json_t *o = json_pack("{s:o,s:I}", "item_id", item_id(st->open == OSP_REPLY_REASONING ? "rs" : "msg", st->id, i),
                          "output_index", (json_int_t)i);
    if (index_key) json_object_set_new(o, index_key, json_integer(0));
    return o;
}

static json_t *with(json_t *o, const char *k, json_t *v) {
    json_object_set_new(o, k, v);
    return o;
}

static int item_open(srv_rsp_sse *st, srv_buf *b, int kind) {
    size_t i = json_array_size(st->items);
    st->open = kind;
    st->text.len = 0;
    if (kind == OSP_REPLY_REASONING) {
        json_t *it = reasoning_out(st->id, i, NULL, 0, 0);
        return ev(st, b, "response.output_item.added", json_pack("{s:I,s:o}", "output_index", (json_int_t)i, "item", it)) ||
               (st->q->summary &&
                ev(st, b, "response.reasoning_summary_part.added",
                   with(at(st, "summary_index"), "part", json_pack("{s:s,s:s}", "type", "summary_text", "text", "")))) ||
               ev(st, b, "response.content_part.added",
                  with(at(st, "content_index"), "part", json_pack("{s:s,s:s}", "type", "reasoning_text", "text", "")));
    }
    return ev(st, b, "response.output_item.added",
              json_pack("{s:I,s:o}", "output_index", (json_int_t)i, "item", message_out(st->id, i, "in_progress", json_array()))) ||
           ev(st, b, "response.content_part.added", with(at(st, "content_index"), "part", text_part("", 0, NULL)));
}

/* r: the reply's end, or NULL when the next item opens. */
static int item_close(srv_rsp_sse *st, srv_buf *b, const srv_rsp_result *r) {
    const json_t *logprobs = r ? r->logprobs : NULL;
    size_t i = json_array_size(st->items);
    const char *t = st->text.p;
    size_t n = st->text.len;
    json_t *item;
    int rc;
    if (st->open == OSP_REPLY_REASONING) {
        item = reasoning_out(st->id, i, t, n, st->q->summary);
        rc = ev(st, b, "response.reasoning_text.done", with(at(st, "content_index"), "text", lossy(t, n))) ||
             ev(st, b, "response.content_part.done",
                with(at(st, "content_index"), "part", json_pack("{s:s,s:o}", "type", "reasoning_text", "text", lossy(t, n))));
        if (!rc && st->q->summary)
            rc = ev(st, b, "response.reasoning_summary_text.done", with(at(st, "summary_index"), "text", lossy(t, n))) ||
                 ev(st, b, "response.reasoning_summary_part.done",
                    with(at(st, "summary_index"), "part", json_pack("{s:s,s:o}", "type", "summary_text", "text", lossy(t, n))));
    } else {
        json_t *c = json_array();
        json_array_append_new(c, text_part(t, n, logprobs));
        item = message_out(st->id, i, r ? message_status(r) : "completed", c);
        rc = ev(st, b, "response.output_text.done",
                with(with(at(st, "content_index"), "text", lossy(t, n)), "logprobs", json_array())) ||
             ev(st, b, "response.content_part.done", with(at(st, "content_index"), "part", text_part(t, n, logprobs)));
    }
    if (!rc)
        rc = ev(st, b, "response.output_item.done", json_pack("{s:I,s:O}", "output_index", (json_int_t)i, "item", item));
    json_array_append_new(st->items, item);
    st->open = -1;
    return rc ? -1 : 0;
}

int srv_rsp_sse_piece(srv_rsp_sse *st, srv_buf *b, osp_reply_kind kind, const char *text, size_t len) {
    if (!len) return 0;
    if (st->open != (int)kind && ((st->open >= 0 && item_close(st, b, NULL)) || item_open(st, b, kind))) return -1;
    if (srv_buf_add(&st->text, text, len)) return -1;
    if (kind == OSP_REPLY_REASONING)
        return ev(st, b, "response.reasoning_text.delta", with(at(st, "content_index"), "delta", lossy(text, len))) ||
                       (st->q->summary && ev(st, b, "response.reasoning_summary_text.delta",
                                             with(at(st, "summary_index"), "delta", lossy(text, len))))
                   ? -1
                   : 0;
    return ev(st, b, "response.output_text.delta",
              with(with(at(st, "content_index"), "delta", lossy(text, len)), "logprobs", json_array()));
}

static int call_events(srv_rsp_sse *st, srv_buf *b, const json_t *call) {
    size_t i = json_array_size(st->items);
    json_t *done = call_out(st->id, i, call, st->q, "completed"), *added = json_deep_copy(done);
    json_object_set_new(added, "status", json_string("in_progress"));
    int custom = !strcmp(type_of(done), "custom_tool_call");
    const char *field = custom ? "input" : "arguments";
    json_object_set_new(added, field, json_string(""));
    json_t *val = json_object_get(done, field), *id = json_object_get(done, "id");
    char dt[80], dn[80];
    snprintf(dt, sizeof dt, "response.%s.delta", custom ? "custom_tool_call_input" : "function_call_arguments");
    snprintf(dn, sizeof dn, "response.%s.done", custom ? "custom_tool_call_input" : "function_call_arguments");
    int rc = ev(st, b, "response.output_item.added", json_pack("{s:I,s:o}", "output_index", (json_int_t)i, "item", added)) ||
             ev(st, b, dt, json_pack("{s:O,s:I,s:O}", "item_id", id, "output_index", (json_int_t)i, "delta", val)) ||
             ev(st, b, dn, json_pack("{s:O,s:I,s:O,s:O}", "item_id", id, "output_index", (json_int_t)i, field, val, "name",
                                    json_object_get(done, "name"))) ||
             ev(st, b, "response.output_item.done", json_pack("{s:I,s:O}", "output_index", (json_int_t)i, "item", done));
    json_array_append_new(st->items, done);
    return rc;
}

int srv_rsp_sse_end(srv_rsp_sse *st, srv_buf *b, const srv_rsp_result *r, json_t **out) {
    int rc = 0;
    *out = NULL;
    if (st->open >= 0) rc = item_close(st, b, r);
    else if (r->status == 200 && !json_array_size(r->tool_calls) && !json_array_size(st->items))
        rc = item_open(st, b, OSP_REPLY_CONTENT) || item_close(st, b, r); /* an empty reply has its message */
    size_t i;
    json_t *c;
    if (r->status == 200) json_array_foreach(r->tool_calls, i, c) if (!rc) rc = call_events(st, b, c);
    if (rc) return -1;
    json_t *o = srv_rsp_object(st->body, st->id, st->created, st->model, st->items, r);
    const char *s = json_string_value(json_object_get(o, "status"));
    char type[40];
    snprintf(type, sizeof type, "response.%s", s);
    rc = ev(st, b, type, json_pack("{s:O}", "response", o));
    *out = o;
    return rc;
}

void srv_rsp_sse_free(srv_rsp_sse *st) {
    json_decref(st->items);
    st->items = NULL;
    srv_buf_free(&st->text);
}

/* ---- the routes ---- */

static void send_rsp_error(srv *s, srv_req *c, int status, const char *msg, const char *param, const char *code) {
    json_t *e = srv_error_json(status, msg, param);
    if (code) json_object_set_new(json_object_get(e, "error"), "code", json_string(code));
    srv_send_json(s, c, status, e);
}

int srv_rsp_finish(srv *s, srv_job *j, srv_buf *out, int sse, const srv_rsp_result *r) {
    srv_rsp_job *rj = j->rsp;
    json_t *o = NULL;
    int rc = 0;
    if (sse) {
        rc = srv_rsp_sse_end(&rj->sse, out, r, &o);
    } else {
        json_t *output = srv_rsp_output(j->id, &rj->q, r);
        o = srv_rsp_object(rj->body, j->id, j->created, s->model_name, output, r);
        json_decref(output);
        rc = !o || srv_buf_add_json(out, o) || srv_buf_add(out, "\n", 1) ? -1 : 0;
    }
    if (!rc && o && r->status == 200 && rj->q.store && s->rsp_store) {
        json_t *conv = json_deep_copy(rj->q.conversation);
        json_array_append_new(conv, srv_rsp_reply_message(r));
        if (srv_rsp_store_put(s->rsp_store, j->id, o, conv))
            OSP_LOG(1, "osprey serve: %s could not be stored", j->id);
        json_decref(conv);
    }
    json_decref(o);
    return rc;
}

void srv_responses(srv *s, srv_req *c, const json_t *body) {
    char msg[512];
    json_t *prev_conv = NULL, *chat = NULL, *pid = get(body, "previous_response_id");
    if (json_is_string(pid)) {
        json_t *prev = NULL;
        if (!s->rsp_store || srv_rsp_store_get(s->rsp_store, json_string_value(pid), &prev, &prev_conv)) {
            snprintf(msg, sizeof msg, "Previous response with id '%.100s' not found.", json_string_value(pid));
            send_rsp_error(s, c, 404, msg, "previous_response_id", "previous_response_not_found");
            return;
        }
        json_decref(prev);
    }
    srv_rsp_job rj = {.body = body};
    int st = srv_rsp_translate(body, prev_conv, &chat, &rj.q, msg, sizeof msg);
    json_decref(prev_conv);
    if (st) {
        send_rsp_error(s, c, st, msg, NULL, NULL);
        return;
    }
    if (rj.q.n_dropped) {
        atomic_fetch_add(&s->c_tools_dropped, rj.q.n_dropped);
        OSP_LOG(2, "osprey serve: /v1/responses: tools left out (osprey does not run them): %s", rj.q.dropped);
    }
    int status = 400;
    json_t *err = NULL;
    srv_reject why = {0};
    /* no max_output_tokens: --max-tokens when given, else what the context leaves, as OpenAI's only bound is the
     * model's (Codex never sends one, and takes a reply cut at the chat route's 512 for a failed turn) */
    int32_t max_tokens = rj.q.max_tokens > 0 ? rj.q.max_tokens : s->cfg.max_tokens > 0 ? s->cfg.max_tokens : 1 << 30;
    srv_job *j = srv_parse_translated(s, chat, max_tokens, &status, &err, &why);
    if (!j) {
        if (why.reason == SRV_REJECT_OVER_CONTEXT)
            json_object_set_new(json_object_get(err, "error"), "code", json_string("context_length_exceeded"));
        srv_send_json(s, c, status, err);
        srv_rsp_req_free(&rj.q);
        return;
    }
    j->api = SRV_API_RESPONSES;
    j->rsp = &rj;
    srv_make_id(j->id, sizeof j->id, "resp");
    j->id[4] = '_';
    rj.sse = (srv_rsp_sse){.body = body, .q = &rj.q, .id = j->id, .model = s->model_name, .created = j->created};
    if (srv_submit(s, c, j)) send_rsp_error(s, c, 400, SRV_KV_BUDGET_MSG, "max_output_tokens", NULL);
    srv_rsp_sse_free(&rj.sse);
    srv_rsp_req_free(&rj.q);
}

void srv_responses_get(srv *s, srv_req *c, const char *id, int del) {
    char msg[256];
    json_t *o = NULL, *conv = NULL;
    int missing = !s->rsp_store || (del ? srv_rsp_store_delete(s->rsp_store, id)
                                        : srv_rsp_store_get(s->rsp_store, id, &o, &conv));
    json_decref(conv);
    if (missing) {
        snprintf(msg, sizeof msg, "Response with id '%.100s' not found.", id);
        send_rsp_error(s, c, 404, msg, NULL, NULL);
        return;
    }
    if (del) o = json_pack("{s:s,s:s,s:b}", "id", id, "object", "response.deleted", "deleted", 1);
    srv_send_json(s, c, 200, o);
}
