/* server/server: osp_serve, the server's lifecycle: limits, the HTTP side,
 * model loading behind /health, signals and draining. */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>
#include "server/responses.h"

void osp_serve_config_defaults(osp_serve_config *c) {
    memset(c, 0, sizeof *c);
    c->host = "127.0.0.1";
    c->port = 8080;
    c->max_tokens = 0; /* not given: 512 on the chat and completions routes, the context's rest on /v1/responses */
    c->temp = c->top_p = c->min_p = -1;
    c->top_k = -1;
    c->allowed_origins = "*";
    c->max_body = 8u << 20;
    c->max_audio_body = 25u << 20;
    c->responses_store = 64u << 20;
    c->responses_ttl = 30 * 86400.0;
    c->log_level = 1;
    c->parallel = 4;
    c->prefill_step = 512;
    c->kv_bits = -1;
    c->kv_group = 64;
    c->timeout = 10;
    c->body_timeout = 60;
    c->write_timeout = 60;
    c->max_connections = 1024;
    c->prompt_cache_gib = 2;
    c->prompt_cache_disk_gib = 10;
    c->spec_batch_tokens = -1;
}

/* The limits, with the connection cap fitted to the descriptors we may open:
 * the soft limit is raised to the hard one, and each connection may need
 * two (held, and as many again closing gracefully) plus some to spare. */
static void set_limits(srv *s) {
    const osp_serve_config *c = &s->cfg;
    srv_limits *L = &s->limits;
    L->head_timeout = c->timeout > 0 ? c->timeout : 10;
    L->idle_timeout = (int)(L->head_timeout + 0.999);
    L->body_timeout = c->body_timeout > 0 ? c->body_timeout : 0;
    L->write_timeout = c->write_timeout > 0 ? c->write_timeout : 60;
    L->per_client = c->max_per_client > 0 ? c->max_per_client : 0;
    int want = c->max_connections > 0 ? c->max_connections : 1024;
    struct rlimit rl;
    if (!getrlimit(RLIMIT_NOFILE, &rl)) {
        rlim_t need = (rlim_t)want * 2 + 128;
        if (rl.rlim_cur < need) {
            rl.rlim_cur = rl.rlim_max == RLIM_INFINITY || rl.rlim_max > need ? need : rl.rlim_max;
            setrlimit(RLIMIT_NOFILE, &rl);
            getrlimit(RLIMIT_NOFILE, &rl);
        }
        if (rl.rlim_cur != RLIM_INFINITY && (rlim_t)want * 2 + 128 > rl.rlim_cur) {
            int fit = rl.rlim_cur > 256 ? (int)((rl.rlim_cur - 128) / 2) : 64;
            OSP_LOG(1, "osprey serve: --max-connections %d needs %d file descriptors; the limit is %llu: using %d",
                    want, want * 2 + 128, (unsigned long long)rl.rlim_cur, fit);
            want = fit;
        }
    }
    L->max_connections = want;
}

static atomic_int g_signals;
static sigset_t g_sigset;
static pthread_mutex_t g_stop_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_stop_cv = PTHREAD_COND_INITIALIZER;

static void *signal_thread(void *arg) {
    (void)arg;
    for (;;) {
        int sig;
        if (sigwait(&g_sigset, &sig)) continue;
        if (atomic_fetch_add(&g_signals, 1) >= 1) {
            static const char m[] = "osprey serve: second signal, exiting now\n";
            (void)!write(2, m, sizeof m - 1);
            _exit(130);
        }
        pthread_mutex_lock(&g_stop_mu);
        pthread_cond_broadcast(&g_stop_cv);
        pthread_mutex_unlock(&g_stop_mu);
    }
    return NULL;
}

/* After the signal: the queued and running work finishes and its responses
 * reach their clients, for at most --drain-timeout seconds in all (0: as
 * long as it takes; a second signal exits at once). Past the deadline what
 * is left is cancelled: a stream ends with an error event, a waiting client
 * gets a 503. Returns how many requests were cut. */
static int drain(srv *s) {
    double t0 = osp_now_s(), limit = s->cfg.drain_timeout, last_log = t0;
    for (;;) {
        int queued = 0, running = 0, active = atomic_load(&s->active);
        if (s->worker_started) srv_queue_counts(s, &queued, &running);
        if (!queued && !running && !active) return 0;
        double now = osp_now_s();
        if (limit > 0 && now - t0 >= limit) {
            int cut = active > queued + running ? active : queued + running;
            if (s->worker_started) srv_queue_cancel_all(s);
            for (int i = 0; i < 200 && atomic_load(&s->active) > 0; i++) usleep(10000); /* their last words */
            return cut;
        }
        if (now - last_log >= 10) {
            OSP_LOG(1, "osprey serve: still finishing %d queued, %d generating, %d responses in flight", queued,
                    running, active);
            last_log = now;
        }
        usleep(10000);
    }
}

int osp_serve(const osp_serve_config *cfg) {
    srv *s = calloc(1, sizeof *s);
    if (!s) return 1;
    s->cfg = *cfg;
    osp_log_level = cfg->log_level;
    s->created = (long long)time(NULL);
    srv_model_name(cfg->model ? cfg->model : cfg->audio_model ? cfg->audio_model : cfg->embedding_model ? cfg->embedding_model : cfg->rerank_model, s->model_name,
                   sizeof s->model_name);
    pthread_mutex_init(&s->qmu, NULL);
    pthread_cond_init(&s->qcv, NULL);
    set_limits(s);
    signal(SIGPIPE, SIG_IGN);
    sigemptyset(&g_sigset);
    sigaddset(&g_sigset, SIGINT);
    sigaddset(&g_sigset, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &g_sigset, NULL); /* every thread created from here on inherits it */
    pthread_t sig_thr;
    pthread_create(&sig_thr, NULL, signal_thread, NULL);
    pthread_detach(sig_thr);

    int rc = 1;
    srv_front *front = NULL;
    if (osp_set_threads(cfg->threads) != OSP_OK) { /* the pool's threads inherit the blocked signals */
        fprintf(stderr, "osprey serve: %s\n", osp_last_error());
        goto out;
    }
    if (srv_front_start(s, &front)) goto out;
    if (srv_setup(s)) {
        fprintf(stderr, "osprey serve: %s\n", osp_last_error());
        goto out;
    }
    if (s->model && s->cfg.responses_store) { /* beside the prefix cache's files, when it has a folder */
        char dir[4200] = "";
        if (s->pc && s->pc_dir[0]) snprintf(dir, sizeof dir, "%s/responses", s->pc_dir);
        s->rsp_store = srv_rsp_store_open(s->cfg.responses_store, s->cfg.responses_ttl, dir);
    }
    if (s->model && srv_worker_start(s)) { /* (an audio-only server has no batch thread) */
        fprintf(stderr, "osprey serve: cannot start the worker thread\n");
        goto out;
    }
    atomic_store(&s->ready, 1);
    OSP_LOG(1, "osprey serve: ready");
    pthread_mutex_lock(&g_stop_mu);
    while (!atomic_load(&g_signals)) pthread_cond_wait(&g_stop_cv, &g_stop_mu);
    pthread_mutex_unlock(&g_stop_mu);
    int queued, running;
    srv_queue_counts(s, &queued, &running);
    atomic_store(&s->draining, 1); /* /health is 503 from here; new work is refused */
    OSP_LOG(1, "osprey serve: stopping: %d queued, %d generating, %d responses in flight", queued, running,
            atomic_load(&s->active));
    rc = 0;
out:
    atomic_store(&s->draining, 1);
    int cut = drain(s);
    if (cut) {
        OSP_LOG(0, "osprey serve: --drain-timeout: %d requests were cut before they were delivered", cut);
        if (rc == 0) rc = 1;
    }
    srv_worker_stop(s); /* nothing is left to run */
    int left = srv_front_stop(front, 2.0);
    if (left) { /* a transcription cannot be interrupted: its thread still uses the model, so nothing is freed */
        OSP_LOG(1, "osprey serve: %d requests still running at exit", left);
        return rc;
    }
    srv_teardown(s);
    srv_rsp_store_close(s->rsp_store);
    pthread_mutex_destroy(&s->qmu);
    pthread_cond_destroy(&s->qcv);
    free(s);
    if (rc == 0) OSP_LOG(1, "osprey serve: bye");
    return rc;
}
