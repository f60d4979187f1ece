/* server/ internals shared by http.c, request.c, worker.c and util.c. */
#ifndef OSP_SERVER_INTERNAL_H
#define OSP_SERVER_INTERNAL_H

#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include "osprey.h"
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
/* "prefix-" + 24 random hex digits. */
void srv_make_id(char *out, size_t cap, const char *prefix);
/* {"error":{"message","type","code","param"}} (param omitted when NULL). */
json_t *srv_error_json(int status, const char *message, const char *param);
const char *srv_error_type(int status);

/* ---- the job: one request's generation, shared by its connection thread
 * and the worker ---- */
typedef enum srv_kind { SRV_CHAT, SRV_COMPLETION } srv_kind;

typedef struct srv_job {
    /* set by the connection thread before the job is queued, then read-only */
    srv_kind kind;
    int stream, include_usage;
    int32_t *prompt;
    int32_t n_prompt;
    osp_gen_params gp;
    char **stops;
    int n_stop;
    osp_bias *bias;
    int32_t eos[32];
    int logprobs;             /* report logprobs */
    int top_logprobs;
    int echo_prompt;          /* completions: echo */
    osp_reply_format fmt;
    int parse_reasoning, parse_tools, start_in_reasoning;
    char id[64];
    long long created;
    int conn_fd;              /* the client's socket, to notice a disconnect */

    /* shared, under mu */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    srv_buf out;              /* SSE bytes not yet sent, or the final body */
    size_t out_off;           /* bytes of out already handed to the client */
    int done;                 /* the worker will add nothing more */
    int status;               /* HTTP status of a non-streamed answer */
    int refs;
    atomic_int cancel;        /* set by the connection side; the worker stops */
    struct srv_job *next;     /* queue link (under the queue's lock) */
} srv_job;

void srv_job_release(srv_job *j);
/* Append bytes for the client and wake its thread. */
void srv_job_emit(srv_job *j, const char *s, size_t n);
/* Mark done (with the status of a non-streamed body) and wake. */
void srv_job_finish(srv_job *j, int status);

/* ---- the server ---- */
typedef struct srv_slot srv_slot; /* worker.c: one row of the running batch */

typedef struct srv {
    osp_serve_config cfg;
    char model_name[256];
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
} srv;

/* request.c: build a job from a request body. On failure returns NULL with
 * *status (4xx) and *err (a new JSON error object). */
srv_job *srv_parse_chat(srv *s, const json_t *body, int *status, json_t **err);
srv_job *srv_parse_completion(srv *s, const json_t *body, int *status, json_t **err);
/* The chat template rendering of {messages, tools, ...} (for /apply-template). */
json_t *srv_apply_template(srv *s, const json_t *body, int *status);

/* worker.c */
int srv_queue_push(srv *s, srv_job *j); /* 0 ok; -1 when draining */
int srv_worker_start(srv *s);
void srv_worker_stop(srv *s);       /* after the queue is empty */
int srv_slots_init(srv *s);         /* the rows of the batch (s->parallel); 0 ok */
int srv_queue_idle(srv *s);         /* nothing queued or running */

#endif
