/* server/anthropic: the Anthropic Messages API (POST /v1/messages,
 * /v1/messages/count_tokens) over the chat route's machinery.
 *
 * A Messages body is translated into an OpenAI chat body (a new JSON
 * object) that request.c turns into a job exactly as it does a chat
 * request: the same template, tokenizer, scheduler and prefix cache, so a
 * conversation gets the same prompt tokens, and the same greedy reply, on
 * either route. The translation is pure (no server state), so it is unit
 * tested and fuzzed alone.
 *
 *   system (string | text blocks)       → a leading system message; Claude
 *                                          Code's billing-header block is
 *                                          dropped (it changes per request and
 *                                          would defeat the prefix cache)
 *   user text / tool_result blocks      → user message / one tool message each
 *   a system message among 'messages'   → user text where it stands
 *                                          (consecutive user turns joined)
 *   assistant text / tool_use / thinking → content / tool_calls / reasoning_content
 *   tools {name, description, input_schema} → function tools
 *   tool_choice auto|any|tool|none      → auto|required|function|none
 *   stop_sequences                      → stop
 *   thinking enabled|adaptive|disabled  → chat_template_kwargs.enable_thinking
 *   output_config.effort                → reasoning_effort
 * max_tokens is kept apart: the route cuts it to what the context leaves
 * after the prompt is known, where the chat route refuses it.
 *
 * The response side formats what respond.c gathered: one message body, or
 * the SSE events (message_start, content blocks with their deltas,
 * message_delta, message_stop). A stream's open block is tracked in a
 * srv_msg_sse; blocks are numbered in the order they open.
 */
#ifndef OSP_SERVER_ANTHROPIC_H
#define OSP_SERVER_ANTHROPIC_H

#include "server/server_internal.h"

/* Body → chat body. 0 with *chat (new) and *max_tokens (required unless
 * count_only; 0 when absent); else the HTTP status (400) with msg. */
int srv_msg_translate(const json_t *body, int count_only, json_t **chat, int32_t *max_tokens, char *msg, size_t cap);

/* An error message m of the chat machinery in Anthropic's words where a
 * client looks for them: a prompt over the context (why) is "prompt is too
 * long: N tokens > M maximum", which Claude Code parses (it reports "Prompt
 * is too long" with both sizes). Returns buf when rewritten, else m. */
const char *srv_msg_error_message(const char *m, const srv_reject *why, char *buf, size_t cap);

/* {"type":"error","error":{"type","message"}} */
json_t *srv_msg_error_json(int status, const char *message);
const char *srv_msg_error_type(int status);

/* The stop string that cut a reply: raw is the whole generated text (the
 * tokens decoded), emitted the length handed out before the cut. NULL when
 * none of stops begins there (the reply ended on its end-of-sequence token). */
const char *srv_msg_matched_stop(const char *const *stops, int n, const char *raw, size_t raw_len, size_t emitted);

/* end_turn / max_tokens / stop_sequence / tool_use */
const char *srv_msg_stop_reason(osp_finish finish, int has_calls, const char *stop_seq);

/* The whole reply as a message object (tool_calls: the reply parser's
 * OpenAI array, or NULL). */
typedef struct srv_msg_result {
    const char *id, *model;
    const char *reasoning, *content; /* may be NULL */
    size_t reasoning_len, content_len;
    const json_t *tool_calls;
    const char *stop_reason, *stop_sequence;
    int32_t input_tokens, cached_tokens, output_tokens;
} srv_msg_result;
json_t *srv_msg_body(const srv_msg_result *m);

/* A stream's state: which content block is open. */
typedef struct srv_msg_sse {
    int open;  /* -1 none, else the open block's kind (osp_reply_kind) */
    int index; /* the next block's index */
} srv_msg_sse;
/* Each appends whole SSE events to b; 0 ok, -1 out of memory. */
int srv_msg_sse_start(srv_msg_sse *st, srv_buf *b, const char *id, const char *model, int32_t input_tokens);
int srv_msg_sse_piece(srv_msg_sse *st, srv_buf *b, osp_reply_kind kind, const char *text, size_t len);
int srv_msg_sse_end(srv_msg_sse *st, srv_buf *b, const srv_msg_result *m);
int srv_msg_sse_error(srv_buf *b, int status, const char *message);
int srv_msg_sse_ping(srv_buf *b);

/* http.c: answer a parsed body on either route (count_only: count_tokens). */
void srv_messages(srv *s, srv_req *c, const json_t *body, int count_only);

#endif
