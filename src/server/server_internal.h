/* server/ internals shared by http.c, request.c, worker.c and util.c. */
#ifndef OSP_SERVER_INTERNAL_H
#define OSP_SERVER_INTERNAL_H

#include <jansson.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/socket.h>
#include "osprey.h"
#include "grammar/grammar.h"
#include "server/conn.h"
#include "server/reply.h"
#include "server/server.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

/* ---- util.c ---- */
typedef struct srv_buf {
    char *p;
    size_t len, cap;
} srv_buf;
int srv_buf_add(srv_buf *b, const char *s, size_t n); /* 0 ok, -1 out of memory */
int srv_buf_addf(srv_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void srv_buf_free(srv_buf *b);
/* JSON text of v (compact), appended; 0 ok. */
int srv_buf_add_json(srv_buf *b, const json_t *v);
/* A JSON string from bytes that may not be valid UTF-8 (invalid bytes
 * become U+FFFD). */
json_t *srv_json_string_lossy(const char *s, size_t n);
int srv_utf8_valid(const char *s, size_t n);
/* A JSON string literal of bytes (invalid UTF-8 becomes U+FFFD); 0 ok. */
int srv_buf_add_json_string(srv_buf *b, const char *s, size_t n);
const char *srv_status_text(int status); /* "Not Found" */
int srv_same_host(const struct sockaddr *a, const struct sockaddr *b); /* the same IP address */
/* "prefix-" + 24 random hex digits. */
void srv_make_id(char *out, size_t cap, const char *prefix);
/* {"error":{"message","type","code","param"}} (param omitted when NULL). */
json_t *srv_error_json(int status, const char *message, const char *param);
const char *srv_error_type(int status);
/* o's "type" when it is an object with a string one, else NULL. */
const char *srv_json_type(const json_t *o);
/* Where a translating parser (anthropic.c, responses.c) writes why it failed. */
typedef struct srv_msgbuf {
    char *msg;
    size_t cap;
} srv_msgbuf;
#define SRV_FAIL(e, ...)                                                                                     \
    do {                                                                                                     \
        snprintf((e)->msg, (e)->cap, __VA_ARGS__);                                                           \
        return -1;                                                                                           \
    } while (0)
/* o[k], NULL when absent or null. */
json_t *srv_json_get(const json_t *o, const char *k);
/* An SSE event "event: NAME\ndata: JSON\n\n" appended (o is stolen); 0 ok. */
int srv_sse_event(srv_buf *b, const char *name, json_t *o);

/* ---- the job: one request's generation, shared by its connection thread
 * and the worker ----
 *
 * The worker (the batch loop) reports what happens to a job as typed events
 * and never formats anything: a TEXT event per piece of text that became
 * final, a LOGPROB event per sampled token (when asked), and one END event.
 * The connection thread takes them off the job and turns them into SSE
 * chunks or a JSON body (respond.c), waking on the job's eventfd. */
typedef enum srv_kind { SRV_CHAT, SRV_COMPLETION } srv_kind;
/* The API a chat job answers in: OpenAI's chat shape, Anthropic's Messages
 * (anthropic.c) or OpenAI's Responses (responses.c). */
typedef enum srv_api { SRV_API_OPENAI, SRV_API_MESSAGES, SRV_API_RESPONSES } srv_api;

enum { SRV_CANCEL_CLIENT = 1, SRV_CANCEL_SHUTDOWN = 2 }; /* why a job was cancelled: its client left; --drain-timeout */

typedef enum srv_ev_kind { SRV_EV_TEXT, SRV_EV_LOGPROB, SRV_EV_END } srv_ev_kind;

typedef struct srv_event {
    struct srv_event *next;
    srv_ev_kind kind;
    int32_t token;            /* TEXT, LOGPROB */
    float logprob;            /* LOGPROB */
    int32_t n_top;            /* LOGPROB: top_ids / top_lp have n_top entries */
    int32_t *top_ids;
    float *top_lp;
    char *text;               /* TEXT: len bytes; END: the error message (status != 200), else NULL */
    size_t len;
    int status;               /* END: 200 done, 499 cancelled, 4xx/5xx failed */
    osp_gen_stats stats;      /* END */
    int batch_max;            /* END: most rows decoded in one step with this one */
} srv_event;

typedef struct srv_job {
    /* set by the connection thread before the job is queued, then read-only */
    srv_kind kind;
    srv_api api;
    int stream, include_usage;
    int cache_prompt;         /* use and feed the prefix cache (llama-server's field; default 1) */
    int return_tokens;        /* completions: the reply's token ids in choices[0].tokens (llama-server's field) */
    int speculative;          /* speculative decoding for this request (default 1, when the server has it) */
    int32_t *prompt;
    int32_t n_prompt;
    osp_gen_params gp;
    char **stops;
    int n_stop;
    osp_bias *bias;
    int32_t eos[32];
    int logprobs;             /* report logprobs */
    int top_logprobs;
    osp_reply_format fmt;
    int parse_reasoning, parse_tools, start_in_reasoning;
    int parallel_tools;       /* parallel_tool_calls: 0 keeps only the first call */
    char *forced;             /* text the reply starts with (a forced tool call's opening), or NULL */
    struct srv_grammar *grammar; /* structured output (structured.c): the reply is held to it; a reference, or NULL */
    const char *grammar_trigger; /* the grammar holds from this text on (osp_gen_params.grammar_trigger), or NULL */
    char *rf_schema;          /* while parsing: the response format's JSON Schema (text), or NULL */
    const char *rf_param;     /* the field it came from */
    int rf_gbnf;              /* rf_schema is a GBNF grammar (llama-server's `grammar`), not a JSON Schema */
    json_t *custom_tools;     /* the names of the request's custom tools (an object: name -> true; owned), or NULL */
    struct srv_rsp_job *rsp;  /* a Responses job: its request's side (responses.h), owned by the route */
    char id[64];
    long long created;
    int64_t kv_need;          /* KV bytes it may come to hold (prompt + max_tokens) */

    /* shared, under mu */
    pthread_mutex_t mu;
    srv_event *ev_head, *ev_tail; /* events not yet taken by the connection */
    int ended;                /* the END event is queued: nothing more comes */
    int refs;
    int wake_fd;              /* eventfd: written on every event */
    atomic_int cancel;        /* SRV_CANCEL_*, set by the connection side or the drain: the worker stops */
    struct srv_job *next;     /* queue link (under the queue's lock) */
    int batch_max;            /* worker only */
} srv_job;

void srv_job_release(srv_job *j);
/* Worker side: queue an event (text/top arrays copied) and wake the connection. */
int srv_job_text(srv_job *j, int32_t token, const char *text, size_t len);
int srv_job_logprob(srv_job *j, int32_t token, float lp, const int32_t *top_ids, const float *top_lp, int32_t k);
void srv_job_end(srv_job *j, int status, const char *error, const osp_gen_stats *st);
/* Connection side: take every queued event (a list, oldest first; free each
 * with free()); *ended = the job has ended (its END event is in this list or
 * an earlier one; or it ended without one, when memory ran out). */
srv_event *srv_job_take(srv_job *j, int *ended);

/* ---- the server ---- */
typedef struct srv_slot srv_slot; /* worker.c: one row of the running batch */
typedef struct srv_front srv_front; /* front.c */

/* Connection limits and deadlines (osp_serve_config, with defaults applied). */
typedef struct srv_limits {
    double head_timeout;      /* s from connecting (or the previous response) to a complete request head */
    int idle_timeout;         /* --timeout rounded up: the keep-alive comments of a silent stream come 4 times in it */
    double body_timeout;      /* s from the head to the end of the body; 0 = none */
    double write_timeout;     /* s a response may wait for its client to read (--write-timeout) */
    int max_connections;      /* connections held at once (reading a request, or being answered) */
    int per_client;           /* connections from one address; 0 = no cap */
} srv_limits;

typedef struct srv {
    osp_serve_config cfg;
    srv_limits limits;
    char model_name[256];
    long long created;        /* when the server started: /v1/models' "created" */
    /* set once loading is over, then read-only */
    atomic_int ready;
    osp_model *model;
    osp_tokenizer *tok;
    osp_chat_template *tmpl;  /* NULL when the model has none */
    osp_reply_format fmt;
    int ctx;
    osp_gen_params defaults;  /* generation_config.json + flags */
    int32_t eos[32];
    int n_eos;

    /* queue */
    pthread_mutex_t qmu;
    pthread_cond_t qcv;
    srv_job *head, *tail;
    int n_queued, busy;       /* jobs waiting; jobs admitted to rows and not yet finished */
    atomic_int draining, stopping;
    pthread_t worker;
    int worker_started;
    osp_session *session;     /* `parallel` rows */
    int parallel, prefill_step;
    int32_t vocab;
    int64_t kv_budget;        /* bytes; the scheduler admits jobs while their reservations fit */
    int64_t kv_reserved;      /* under qmu */
    srv_slot *slots;          /* [parallel] */
    float *logits;            /* [parallel, vocab] */

    long long n_requests;
    atomic_int active;        /* generation requests whose response is not yet sent */
    struct osp_prefix *pc;    /* the prefix cache (kv/prefix.h), or NULL */
    struct osp_spec *spec;    /* speculative decoding (engine/spec.h), or NULL */
    osp_model *draft;         /* its draft model, or NULL */
    int pc_grid;              /* rows depend on their chunking: reuse only prompts, at multiples of prefill_step */
    char identity[65];        /* the model's artifact identity ("" when not computed) */
    char pc_dir[4096];        /* the prefix cache's folder ("" = memory only) */
    /* counters for /stats and /metrics (the worker adds; readers load) */
    atomic_llong c_requests, c_ok, c_failed, c_cancelled, c_prompt_tokens, c_cached_tokens, c_gen_tokens;
    atomic_llong c_draft, c_draft_accepted;
    atomic_llong c_stalled;   /* responses abandoned at --write-timeout */
    atomic_llong c_route_chat, c_route_messages, c_route_responses; /* generation requests by route */
    atomic_llong c_tools_dropped; /* hosted tools a Responses request offered that osprey cannot run */
    struct srv_rsp_store *rsp_store; /* stored Responses (responses.h), or NULL */

    /* the audio model (audio.c): read-only after setup; transcriptions share its steps (speech/batch.h) */
    struct osp_whisper *audio;
    osp_tokenizer *audio_tok;
    struct osp_wbatch *audio_batch;
    struct srv_embed *embed;  /* the embedding model (embed.c), or NULL */
    osp_grammar_vocab *gvocab;/* structured output: the tokenizer's trie (NULL: none for this tokenizer) */
    struct srv_gcache *gcache;/* compiled grammars (structured.c) */
    struct srv_rerank *rerank;/* the reranker (rerank.c), or NULL */
} srv;

/* structured.c: compiled grammars in an LRU shared by requests, by what
 * they were compiled from; a job holds a reference until it ends (entries
 * are freed only when no job holds them). NULL with the compiler's message
 * in err when it does not compile. */
typedef struct srv_grammar srv_grammar;
typedef struct srv_gcache srv_gcache;
srv_gcache *srv_gcache_new(void);
void srv_gcache_free(srv_gcache *c);
srv_grammar *srv_grammar_schema(srv_gcache *c, const char *schema, size_t len, char *err, size_t cap);
srv_grammar *srv_grammar_parts(srv_gcache *c, const osp_grammar_part *alts, int n, char *err, size_t cap);
/* A GBNF grammar (llama-server's `grammar`) after the literal prefix (NULL: none). */
srv_grammar *srv_grammar_gbnf(srv_gcache *c, const char *text, size_t len, const char *prefix, char *err, size_t cap);
osp_grammar *srv_grammar_of(srv_grammar *g);
void srv_grammar_release(srv_grammar *g);
void srv_gcache_counts(srv_gcache *c, long long *hits, long long *misses, int *entries);

/* setup.c */
int srv_setup(srv *s);    /* model, tokenizer, template, session, budget; 0 ok (else osp_last_error) */
void srv_teardown(srv *s);
void srv_model_name(const char *path, char *out, size_t cap); /* the id clients see */

/* audio.c: --audio-model (0 ok, else osp_last_error) and its routes */
int srv_audio_setup(srv *s);
void srv_audio_teardown(srv *s);
int srv_audio_respond(srv *s, srv_req *q, const char *body, size_t len, int translate);
/* embed.c: --embedding-model (0 ok, else osp_last_error) and POST /v1/embeddings */
int srv_embed_setup(srv *s);
void srv_embed_teardown(srv *s);
int srv_embed_respond(srv *s, srv_req *q, const json_t *body);
/* rerank.c: --rerank-model (0 ok, else osp_last_error) and POST /v1/rerank */
int srv_rerank_setup(srv *s);
void srv_rerank_teardown(srv *s);
int srv_rerank_respond(srv *s, srv_req *q, const json_t *body);

/* http.c: at a request's head (front.c's thread): 0 to read its body (up
 * to *limit bytes), else the status to refuse it with, and why in msg. */
int srv_http_admit(srv *s, srv_req *q, size_t *limit, char *msg, size_t cap);
/* On the request's handler thread, its body read: route it and answer. */
void srv_http_handle(srv *s, srv_req *q);

/* front.c: the listening socket and every connection (see its top); prints
 * "listening on" once bound. 0 ok. */
int srv_front_start(srv *s, srv_front **out);
/* Stop accepting, close what waits, cut the responses still being written
 * and wait up to grace_s for their threads; returns how many are still
 * running (then nothing was freed). */
int srv_front_stop(srv_front *f, double grace_s);

#define SRV_KV_BUDGET_MSG "the prompt plus max_tokens needs more KV cache than --kv-budget allows"

/* http.c: a JSON body (o is stolen) or a JSON error; 0 ok, -1 when the client is gone. */
int srv_send_json(srv *s, srv_req *q, int status, json_t *o);
int srv_send_error(srv *s, srv_req *q, int status, const char *msg);
/* The error body for a request to path (NULL: not known yet): Anthropic's
 * shape on the Messages routes, else OpenAI's. */
json_t *srv_http_error_json(const char *path, int status, const char *msg);

/* http.c: a parsed job (the caller's reference) past the KV budget's check
 * to respond.c. 0 when answered; else a 400 (it could never fit
 * --kv-budget: SRV_KV_BUDGET_MSG) for the caller to send in its shape. */
int srv_submit(srv *s, srv_req *q, srv_job *j);

/* respond.c: queue the job and answer the request with its result (a
 * stream, or the body once it is done); takes the caller's reference. */
int srv_respond(srv *s, srv_req *q, srv_job *j);

/* Why request.c refused a request, for the routes that word a reason in
 * their API's own terms (Anthropic's "prompt is too long", the Responses
 * API's context_length_exceeded). */
typedef enum srv_reject_reason {
    SRV_REJECT_OTHER = 0,      /* the error's message says it all */
    SRV_REJECT_OVER_CONTEXT    /* the prompt alone does not fit the context */
} srv_reject_reason;

typedef struct srv_reject {
    srv_reject_reason reason;
    int32_t n_prompt, ctx;     /* OVER_CONTEXT: the prompt's tokens, the context's (n_prompt >= ctx) */
} srv_reject;

/* request.c: build a job from a request body. On failure returns NULL with
 * *status (4xx) and *err (a new JSON error object). */
srv_job *srv_parse_chat(srv *s, const json_t *body, int *status, json_t **err);
srv_job *srv_parse_completion(srv *s, const json_t *body, int *status, json_t **err);
/* A chat body another API's route translated (taken): max_tokens > 0 is cut
 * to what the context leaves after the prompt, where the chat route refuses it.
 * On failure *why (when not NULL) also says why, in a route's terms. */
srv_job *srv_parse_translated(srv *s, json_t *chat, int32_t max_tokens, int *status, json_t **err, srv_reject *why);
/* A translated chat body (consumed) → a job only for its n_prompt, which may exceed the context (count_tokens). */
srv_job *srv_parse_count(srv *s, json_t *chat, int *status, json_t **err);
/* The chat template rendering of {messages, tools, ...} (for /apply-template). */
json_t *srv_apply_template(srv *s, const json_t *body, int *status);

/* stats.c: GET /stats (a new JSON object) and GET /metrics (appended to b; 0 ok) */
json_t *srv_stats_json(srv *s);
int srv_metrics_text(srv *s, srv_buf *b);

/* worker.c */
int srv_queue_push(srv *s, srv_job *j); /* 0 ok; -1 when draining */
int srv_worker_start(srv *s);
void srv_worker_stop(srv *s);       /* after the queue is empty */
void srv_queue_cancel_all(srv *s);  /* --drain-timeout: every job, queued or running, ends with a 503 */
int srv_slots_init(srv *s);         /* the rows of the batch (s->parallel); 0 ok */
void srv_prefix_freed(void *srv_);  /* the prefix cache gave memory back: admission may go on */
int srv_queue_idle(srv *s);         /* nothing queued or running */
void srv_queue_counts(srv *s, int *queued, int *running);
/* KV bytes a job of n_prompt + max_tokens tokens may come to hold. */
int64_t srv_kv_need(srv *s, int32_t n_prompt, int32_t max_tokens);

#endif
