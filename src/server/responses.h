/* server/responses: the OpenAI Responses API (POST /v1/responses, GET and
 * DELETE /v1/responses/{id}) over the chat route's machinery, as
 * anthropic.c does for the Messages API.
 *
 * A Responses body is translated into a chat body that srv_parse_chat turns
 * into a job: the same template, tokenizer, scheduler and prefix cache.
 *
 *   instructions                         → a leading system message (not stored:
 *                                           OpenAI does not carry it to the next turn)
 *   input: a string                      → a user message
 *   message items (user, assistant,
 *     system, developer → system)        → messages; input_text / output_text parts joined
 *   function_call / custom_tool_call     → the assistant message's tool_calls
 *   *_call_output                        → tool messages
 *   reasoning items                      → the next assistant message's reasoning_content
 *   function tools                       → chat function tools; custom tools → chat
 *                                           custom tools (functions taking {"input": string},
 *                                           a forced call held to its grammar format)
 *   hosted tools (web_search, namespace, ...) → left out (the caller counts them)
 *   max_output_tokens                    → kept apart: cut to what the context leaves
 *   reasoning.effort, tool_choice, temperature, top_p, parallel_tool_calls,
 *   include "message.output_text.logprobs" + top_logprobs → the chat fields
 *
 * The conversation a turn leaves (its messages without instructions, then
 * the reply as an assistant message) is what the store keeps, so that a
 * previous_response_id renders as the earlier prompt plus its reply, the
 * prefix the prefix cache holds.
 *
 * The response side: one response object (srv_rsp_object), or the SSE event
 * family with a sequence number on each (srv_rsp_sse_*). Output items are
 * numbered in the order they open; their ids derive from the response's. */
#ifndef OSP_SERVER_RESPONSES_H
#define OSP_SERVER_RESPONSES_H

#include "server/server_internal.h"

/* What the translation settles beside the chat body. */
typedef struct srv_rsp_req {
    int32_t max_tokens;      /* max_output_tokens, 0 when absent */
    int store, stream;       /* store defaults to 1 */
    int summary;             /* reasoning.summary asked for */
    int n_dropped;           /* hosted tools left out */
    char dropped[256];       /* their types, comma-separated (for the log) */
    json_t *custom;          /* names of custom tools (an array; owned) */
    json_t *conversation;    /* the chat messages without instructions (owned) */
} srv_rsp_req;

/* Body (+ the stored conversation a previous_response_id names, or NULL) →
 * chat body. 0 with *chat (new) and q filled (free with srv_rsp_req_free);
 * else 400 with msg. */
int srv_rsp_translate(const json_t *body, const json_t *previous, json_t **chat, srv_rsp_req *q, char *msg, size_t cap);
void srv_rsp_req_free(srv_rsp_req *q);

/* What a finished reply holds. */
typedef struct srv_rsp_result {
    const char *reasoning, *content; /* may be NULL */
    size_t reasoning_len, content_len;
    const json_t *tool_calls;        /* the reply parser's OpenAI array, or NULL */
    const json_t *logprobs;          /* the chat route's logprobs entries, or NULL */
    osp_finish finish;
    int32_t input_tokens, cached_tokens, output_tokens;
    int status;                      /* 200, else the failure's (error set) */
    const char *error;
} srv_rsp_result;

/* The response object: the request's settings echoed from body, status
 * "in_progress" while output is NULL. */
json_t *srv_rsp_object(const json_t *body, const char *id, long long created, const char *model, const json_t *output,
                       const srv_rsp_result *r);
/* The output items of a whole reply (non-streamed). */
json_t *srv_rsp_output(const char *id, const srv_rsp_req *q, const srv_rsp_result *r);
/* The assistant message a reply adds to the conversation. */
json_t *srv_rsp_reply_message(const srv_rsp_result *r);

/* A stream's state. */
typedef struct srv_rsp_sse {
    const json_t *body;
    const srv_rsp_req *q;
    const char *id, *model;
    long long created;
    long long seq;         /* the next event's sequence_number */
    int open;              /* -1 none, else the open item's kind (osp_reply_kind) */
    size_t open_at;        /* where its text starts in the text so far */
    srv_buf text;          /* the open item's text */
    json_t *items;         /* the items done */
} srv_rsp_sse;
/* Each appends whole events to b; 0 ok, -1 out of memory. */
int srv_rsp_sse_start(srv_rsp_sse *st, srv_buf *b);
int srv_rsp_sse_piece(srv_rsp_sse *st, srv_buf *b, osp_reply_kind kind, const char *text, size_t len);
/* Closes the open item, adds the calls, ends with response.completed,
 * .incomplete or .failed; *out (new, may be NULL) = the final object. */
int srv_rsp_sse_end(srv_rsp_sse *st, srv_buf *b, const srv_rsp_result *r, json_t **out);
void srv_rsp_sse_free(srv_rsp_sse *st);

/* ---- the store (rsp_store.c) ---- */
typedef struct srv_rsp_store srv_rsp_store;
/* bytes: the memory bound; ttl_s: an entry's life; dir: a folder to write
 * each entry to (NULL or "": memory only). NULL when out of memory. */
srv_rsp_store *srv_rsp_store_open(size_t bytes, double ttl_s, const char *dir);
void srv_rsp_store_close(srv_rsp_store *st);
/* Keeps (a copy of) the response object and the conversation under id. */
int srv_rsp_store_put(srv_rsp_store *st, const char *id, const json_t *response, const json_t *conversation);
/* New references, or 0 when unknown, expired or evicted (-1). */
int srv_rsp_store_get(srv_rsp_store *st, const char *id, json_t **response, json_t **conversation);
int srv_rsp_store_delete(srv_rsp_store *st, const char *id); /* 0 deleted, -1 unknown */
size_t srv_rsp_store_bytes(srv_rsp_store *st);

/* The job's side of a Responses request (j->rsp), alive while the
 * connection answers it. */
typedef struct srv_rsp_job {
    const json_t *body;
    srv_rsp_req q;
    srv_rsp_sse sse;
} srv_rsp_job;

/* respond.c: the end of a Responses job: its events or body in out; the
 * result stored when asked. */
int srv_rsp_finish(srv *s, srv_job *j, srv_buf *out, int sse, const srv_rsp_result *r);

/* http.c's routes */
void srv_responses(srv *s, srv_req *c, const json_t *body);
void srv_responses_get(srv *s, srv_req *c, const char *id, int del);

#endif
