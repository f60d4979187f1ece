/* server/: osprey serve, an OpenAI-compatible HTTP server.
 *
 *   front.c    every connection's socket (one thread, a poll set): reads each
 *              request's head (head.c) and body (body.c), decides at the head
 *              (http.c's srv_http_admit: route, API key, body limit), holds
 *              the limits and deadlines, refuses in JSON; a whole request
 *              goes to a handler thread
 *   http.c     on the handler thread: routing, CORS, the small routes;
 *              conn.c writes the response (whole, or chunked as it comes)
 *     └─ request.c  JSON body ─► validated job (template, tokens, sampler)
 *        └─ queue ─► worker.c  continuous batching: up to --parallel rows;
 *                       prefill chunks interleaved with batched decode steps;
 *                       each row's progress as events on its job
 *     └─ respond.c  the handler thread turns the events into SSE chunks
 *                   or the final JSON (reply.c: reasoning / tool calls)
 *   setup.c    model, session, KV budget; server.c the lifecycle
 *
 * A client that disconnects, or reads nothing for --write-timeout, cancels
 * its job (queued or running); SIGINT / SIGTERM stop accepting work, finish
 * it and deliver it (within --drain-timeout), then exit.
 */
#ifndef OSP_SERVER_H
#define OSP_SERVER_H

#include <stdint.h>
#include "core/core.h"

typedef struct osp_serve_config {
    const char *model;          /* model folder */
    const char *host;           /* default 127.0.0.1 */
    int port;                   /* default 8080; 0 = any free port */
    int ctx;                    /* context per request; 0 = min(model, 8192) */
    int threads;                /* 0 = all cores */
    int device;                 /* osp_device: 0 = auto (the GPU when present) */
    int max_tokens;             /* default max_tokens; <= 0 = not given: 512 (/v1/responses: the context's rest) */
    float temp, top_p, min_p;   /* server sampling defaults; < 0 = not given */
    int top_k;                  /* < 0 = not given */
    const char *chat_template;  /* file replacing the model's template, or NULL */
    const char *allowed_origins;/* comma-separated, "*" = any (default) */
    const char *api_key;        /* NULL = no authentication */
    size_t max_body;            /* request body limit in bytes (default 8 MiB) */
    int log_level;              /* 0 error .. 3 debug */
    int parallel;               /* rows decoded together (continuous batching); default 4 */
    int prefill_step;           /* prompt tokens per prefill chunk; default 512 */
    long long kv_budget;        /* KV bytes for all rows; 0 = fit (see osp_serve) */
    int kv_bits;                /* -1 = kv_config.json if the model has one, else f32; 0 (f32), 4, 8, 16 (bf16) */
    int kv_group;               /* 32, 64 (default) or 128 */
    double timeout;             /* s a connection may take to send a request head, and sit idle
                                   between requests (default 10) */
    double body_timeout;        /* s from a request's head to the end of its body (default 60; 0 = none) */
    double write_timeout;       /* s a response may wait for its client to read before it is abandoned (default 60) */
    int max_connections;        /* connections held at once (default 1024, capped by the fd limit) */
    int max_per_client;         /* connections from one address (default 0 = no cap) */
    double drain_timeout;       /* s to finish after SIGTERM/SIGINT (default 0 = until all is delivered) */
    int strict_model;           /* a request naming another model gets a 404 (default: it is served) */
    double prompt_cache_gib;    /* the prefix cache's memory bound in GiB (default 2; 0 = no prefix cache) */
    const char *prompt_cache_dir; /* its folder (default $XDG_CACHE_HOME/osprey, else ~/.cache/osprey) */
    double prompt_cache_disk_gib; /* the folder's bound in GiB (default 10; 0 = memory only) */
    const char *draft_model;    /* speculative decoding with this draft model (NULL = none) */
    int spec_ngram;             /* speculative decoding with n-gram lookup (when no draft model) */
    int draft_max, draft_min;   /* tokens drafted per round (0 = defaults 4 and 1) */
    int spec_batch_tokens;      /* most tokens one verification pass computes for all rows (-1 = default 8; 0 = no cap) */
    const char *audio_model;    /* Whisper model folder for the /v1/audio routes, or NULL */
    const char *audio_tokenizer;/* its tokenizer (tokenizer.json or .tiktoken) when not in the folder */
    size_t max_audio_body;      /* upload limit of the audio routes (default 25 MiB) */
    const char *embedding_model;/* a model for POST /v1/embeddings (server/embed.c), or NULL */
    const char *rerank_model;   /* a reranker for POST /v1/rerank (server/rerank.c), or NULL */
    size_t responses_store;     /* bytes of stored Responses kept (default 64 MiB; 0 = none stored) */
    double responses_ttl;       /* s a stored Response is kept (default 30 days) */
} osp_serve_config;

void osp_serve_config_defaults(osp_serve_config *c);

/* Run until SIGINT/SIGTERM. Prints "osprey serve: listening on http://HOST:PORT"
 * to stderr once the socket is bound (the model loads after that; /health
 * answers 503 until it is ready). Returns 0 on a clean exit. */
int osp_serve(const osp_serve_config *c);

#endif
