/* server/reply: split a streamed assistant reply into reasoning, content and
 * tool calls, the way an OpenAI-compatible server returns them
 * (reasoning_content, content, tool_calls).
 *
 * Formats (the model family's markers; each is one row of the table in
 * reply.c, osp_reply_spec below):
 *   QWEN    reasoning <think> ... </think>; tool calls
 *           <tool_call>{"name": N, "arguments": {...}}</tool_call>, any number.
 *   LLAMA3  no reasoning; with tools, a reply that is (after whitespace and an
 *           optional <|python_tag|>) one or more {"name": N, "parameters": {...}}
 *           objects separated by ';' or whitespace is a list of tool calls.
 *           Such a reply is held back to the end, then decided as a whole:
 *           anything that does not parse is content, verbatim.
 *   GEMMA4  reasoning <|channel>thought\n ... <channel|>; tool calls
 *           <|tool_call>call:N{k:v,...}<tool_call|>, arguments in Gemma 4's
 *           notation (bare keys, strings between <|"|> tokens) converted to
 *           JSON. After a tool call, <turn|> or <|tool_response> ends the reply
 *           (the model stops there; the rest is dropped).
 *   NONE    everything is content.
 *
 * Streaming: text is fed in pieces split anywhere between UTF-8 characters.
 * Content and reasoning go to the emit callback as soon as they are certain;
 * a tail that may be the start of a marker is held back until resolved, and
 * released at finish. What is emitted does not depend on how the text was
 * split (only how it is cut into callback calls does). Reasoning is
 * recognised only at the start of the reply (after whitespace), or from the
 * first byte with start_in_reasoning. Whitespace is trimmed where markers
 * make it meaningless: around the reasoning, after </think> (or
 * <channel|>), before and after a tool-call block.
 *
 * Tool calls are buffered until their closing marker and handed out at
 * finish, as an OpenAI tool_calls array:
 *   [{"id": "call_...", "type": "function",
 *     "function": {"name": N, "arguments": "<JSON object, serialized>"}}]
 * Arguments keep the model's own number spelling (JSON is compacted, never
 * re-printed through doubles). A block that does not parse, or is not closed
 * by the end of the stream, is emitted as content verbatim: nothing is lost.
 *
 * Ownership: an osp_reply is per-request state, used by one thread. Emitted
 * text points into the parser and is valid only during the callback. The
 * tool_calls array from finish belongs to the caller (json_decref).
 */
#ifndef OSP_REPLY_H
#define OSP_REPLY_H

#include <jansson.h>
#include <stddef.h>
#include "core/core.h"

typedef enum osp_reply_format {
    OSP_REPLY_NONE = 0,
    OSP_REPLY_QWEN,   /* Hermes style: Qwen 2 / 2.5 / 3 */
    OSP_REPLY_LLAMA3,
    OSP_REPLY_GEMMA4
} osp_reply_format;

/* How a format's replies call tools. */
typedef enum osp_reply_calls {
    OSP_REPLY_CALLS_NONE = 0,
    OSP_REPLY_CALLS_JSON_BLOCK,  /* {"name", "arguments"} between tool_open and tool_close */
    OSP_REPLY_CALLS_JSON_REPLY,  /* the whole reply is {"name", "parameters"} objects, after an optional call_tag */
    OSP_REPLY_CALLS_GEMMA_BLOCK  /* call:NAME{...} in Gemma 4's notation between tool_open and tool_close */
} osp_reply_calls;

/* One format, as one row of the formats' table (reply.c): what the reply
 * parser, the format's detection and the request's forced opening read.
 * A NULL marker is one the format does not have. */
typedef struct osp_reply_spec {
    osp_reply_format format;
    const char *name;
    const char *detect[2];   /* a chat template holding either is this format; rows are tried in table order */
    /* reasoning: think_open, then think_label (dropped), the reasoning, think_close */
    const char *think_open, *think_label, *think_close;
    osp_reply_calls calls;
    const char *tool_open, *tool_close; /* the *_BLOCK formats */
    const char *tool_quote;  /* delimits strings in a block: a tool_close inside one does not close it */
    const char *call_tag;    /* JSON_REPLY: may come before the calls */
    const char *end[2];      /* after a tool call, either ends the reply */
    int special_markers;     /* the markers are special tokens: they must be decoded, not skipped */
    /* A forced tool call's reply starts with: close_think (when the prompt
     * opened reasoning), open, then for tool_choice "required" any, for a
     * named function name_pre NAME name_post. */
    struct {
        const char *close_think, *open, *any, *name_pre, *name_post;
    } force;
} osp_reply_spec;

/* The row of format f; NULL for a value outside the enum. */
const osp_reply_spec *osp_reply_spec_of(osp_reply_format f);

/* From a chat template's source (NULL -> NONE): the first row whose detect
 * markers it holds (<|tool_call> or <|channel> -> GEMMA4; <tool_call> or
 * <think> -> QWEN; <|start_header_id|> or <|python_tag|> -> LLAMA3);
 * otherwise NONE. */
osp_reply_format osp_reply_format_detect(const char *template_source);

/* 1 when a rendered prompt (len bytes) ends inside an open reasoning block,
 * so the reply starts in reasoning: think_open and think_label, then only
 * whitespace (QWEN "<think>", GEMMA4 "<|channel>thought"). */
int osp_reply_prompt_opens_reasoning(osp_reply_format f, const char *prompt, size_t len);

const char *osp_reply_format_name(osp_reply_format f); /* "none", "qwen", "llama3", "gemma4" */

typedef struct osp_reply osp_reply;

typedef enum osp_reply_kind { OSP_REPLY_CONTENT, OSP_REPLY_REASONING } osp_reply_kind;

/* Receives a piece of content or reasoning (len > 0, whole UTF-8
 * characters). Return non-zero to stop: the call that emitted returns
 * OSP_REPLY_CANCELLED, and so does every later feed or finish. */
typedef int (*osp_reply_emit)(void *user, osp_reply_kind kind, const char *text, size_t len);

/* osprey.h has no "cancelled" status; the usual reason to stop is a client
 * that went away (a failed write), so this is reported as I/O. */
#define OSP_REPLY_CANCELLED OSP_ERR_IO

/* parse_reasoning / parse_tools: 0 makes the format's markers ordinary
 * content (tools: on when the request gives tools). start_in_reasoning: the
 * prompt already opened the reasoning block (see
 * osp_reply_prompt_opens_reasoning); ignored without parse_reasoning or for
 * formats without reasoning. */
osp_status osp_reply_new(osp_reply_format f, int parse_reasoning, int parse_tools, int start_in_reasoning,
                         osp_reply **out);
void osp_reply_free(osp_reply *r);

/* Append len bytes of the reply. */
osp_status osp_reply_feed(osp_reply *r, const char *text, size_t len, osp_reply_emit emit, void *user);

/* End of stream: emits what was held back; *tool_calls (if tool_calls is
 * not NULL) receives a new JSON array, possibly empty, owned by the caller,
 * or NULL on failure. Once only; no feed after it. */
osp_status osp_reply_finish(osp_reply *r, osp_reply_emit emit, void *user, json_t **tool_calls);

#endif
