/* server/stats: the server's counters, as JSON (GET /stats) and in
 * Prometheus' text format (GET /metrics): requests by outcome, tokens
 * (prompt, of which cached, generated), the queue, rows in use, the KV
 * budget, the prefix cache and the process's resident memory (which the KV
 * budget plus the overhead the README documents bounds). */
#include <stdio.h>
#include <unistd.h>
#include "kv/prefix.h"
#include "server/server_internal.h"
#include "speech/batch.h"

typedef struct srv_counts {
    long long requests, ok, failed, cancelled, stalled, prompt_tokens, cached_tokens, gen_tokens, draft, draft_accepted;
    int queued, running, parallel;
    long long kv_budget, kv_reserved, resident;
    int have_pc;
    osp_prefix_stats pc;
} srv_counts;

static long long resident_bytes(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    long long size = 0, pages = 0;
    if (!f) return 0;
    if (fscanf(f, "%lld %lld", &size, &pages) != 2) pages = 0;
    fclose(f);
    return pages * sysconf(_SC_PAGESIZE);
}

static void gather(srv *s, srv_counts *c) {
    c->requests = atomic_load(&s->c_requests), c->ok = atomic_load(&s->c_ok), c->failed = atomic_load(&s->c_failed);
    c->cancelled = atomic_load(&s->c_cancelled), c->prompt_tokens = atomic_load(&s->c_prompt_tokens);
    c->cached_tokens = atomic_load(&s->c_cached_tokens), c->gen_tokens = atomic_load(&s->c_gen_tokens);
    c->draft = atomic_load(&s->c_draft), c->draft_accepted = atomic_load(&s->c_draft_accepted);
    c->stalled = atomic_load(&s->c_stalled);
    pthread_mutex_lock(&s->qmu);
    c->queued = s->n_queued, c->running = s->busy, c->kv_reserved = s->kv_reserved;
    pthread_mutex_unlock(&s->qmu);
    c->parallel = s->parallel;
    c->kv_budget = s->kv_budget;
    c->resident = resident_bytes();
    c->have_pc = s->pc != NULL;
    if (s->pc) osp_prefix_get_stats(s->pc, &c->pc);
}

json_t *srv_stats_json(srv *s) {
    srv_counts c = {0};
    gather(s, &c);
    json_t *o = json_pack("{s:{s:I, s:I, s:I, s:I}, s:{s:I, s:I, s:I}, s:i, s:i, s:i, s:{s:I, s:I}, s:I}",
                          "requests", "total", c.requests, "ok", c.ok, "failed", c.failed, "cancelled", c.cancelled,
                          "tokens", "prompt", c.prompt_tokens, "prompt_cached", c.cached_tokens, "generated",
                          c.gen_tokens, "queued", c.queued, "rows_in_use", c.running, "rows", c.parallel, "kv",
                          "budget_bytes", c.kv_budget, "reserved_bytes", c.kv_reserved, "resident_bytes", c.resident);
    if (!o) return NULL;
    json_object_set_new(o, "routes", json_pack("{s:I, s:I, s:I, s:I}", "chat", atomic_load(&s->c_route_chat), "messages",
                                               atomic_load(&s->c_route_messages), "responses",
                                               atomic_load(&s->c_route_responses), "responses_tools_dropped",
                                               atomic_load(&s->c_tools_dropped)));
    if (s->audio_batch) {
        osp_wbatch_stats w;
        osp_wbatch_get_stats(s->audio_batch, &w);
        json_object_set_new(o, "transcription",
                            json_pack("{s:I, s:I, s:I, s:I, s:I, s:f, s:f}", "steps", (json_int_t)w.steps,
                                      "step_requests", (json_int_t)w.step_jobs, "step_tokens", (json_int_t)w.step_tokens,
                                      "encodes", (json_int_t)w.encodes, "windows", (json_int_t)w.windows,
                                      "compute_s", w.compute_s, "gather_s", w.gather_s));
    }
    if (c.have_pc) {
        const osp_prefix_stats *p = &c.pc;
        json_t *pc = json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:s}",
                               "lookups", (json_int_t)p->lookups, "hits", (json_int_t)p->hits, "misses",
                               (json_int_t)p->misses, "tokens_reused", (json_int_t)p->tokens_reused, "entries",
                               (json_int_t)p->entries, "bytes", (json_int_t)p->bytes, "disk_entries",
                               (json_int_t)p->disk_entries, "disk_bytes", (json_int_t)p->disk_bytes, "inserts",
                               (json_int_t)p->inserts, "evictions", (json_int_t)p->evictions, "disk_writes",
                               (json_int_t)p->disk_writes, "disk_loads", (json_int_t)p->disk_loads, "disk_rejects",
                               (json_int_t)p->disk_rejects, "disk_deletes", (json_int_t)p->disk_deletes, "dir",
                               s->pc_dir);
        /* what may be reused: any prefix (the rows are chunk-invariant here), or prompts at multiples of align */
        json_object_set_new(pc, "reuse", json_string(s->pc_grid ? "prompts on the prefill grid" : "any prefix"));
        json_object_set_new(pc, "align", json_integer(s->pc_grid ? s->prefill_step : 1));
        json_object_set_new(pc, "lookup_seconds", json_real(p->lookup_s));
        json_object_set_new(pc, "insert_seconds", json_real(p->insert_s));
        json_object_set_new(o, "prompt_cache", pc);
    } else {
        json_object_set_new(o, "prompt_cache", json_null());
    }
    json_object_set_new(o, "speculative", s->spec ? json_pack("{s:I, s:I, s:f}", "drafted", c.draft, "accepted",
                                                              c.draft_accepted, "acceptance",
                                                              c.draft ? (double)c.draft_accepted / c.draft : 0.0)
                                                  : json_null());
    if (s->gcache) { /* structured output's compiled grammars (structured.c) */
        long long gh, gm;
        int ge;
        srv_gcache_counts(s->gcache, &gh, &gm, &ge);
        json_object_set_new(o, "grammar_cache", json_pack("{s:I, s:I, s:i}", "hits", gh, "compiles", gm, "entries", ge));
    }
    json_object_set_new(o, "write_timeouts", json_integer(c.stalled));
    json_object_set_new(o, "model_identity", s->identity[0] ? json_string(s->identity) : json_null());
    return o;
}

static int metric(srv_buf *b, const char *name, const char *type, const char *help, long long v) {
    return srv_buf_addf(b, "# HELP osprey_%s %s\n# TYPE osprey_%s %s\nosprey_%s %lld\n", name, help, name, type, name, v);
}

int srv_metrics_text(srv *s, srv_buf *b) {
    srv_counts c = {0};
    gather(s, &c);
    int e = 0;
    e |= srv_buf_addf(b, "# HELP osprey_requests_total Generation requests finished, by outcome.\n"
                         "# TYPE osprey_requests_total counter\n"
                         "osprey_requests_total{outcome=\"ok\"} %lld\nosprey_requests_total{outcome=\"failed\"} %lld\n"
                         "osprey_requests_total{outcome=\"cancelled\"} %lld\n", c.ok, c.failed, c.cancelled);
    e |= srv_buf_addf(b, "# HELP osprey_route_requests_total Generation requests received, by API route.\n"
                         "# TYPE osprey_route_requests_total counter\nosprey_route_requests_total{route=\"chat\"} %lld\n"
                         "osprey_route_requests_total{route=\"messages\"} %lld\n"
                         "osprey_route_requests_total{route=\"responses\"} %lld\n",
                      atomic_load(&s->c_route_chat), atomic_load(&s->c_route_messages),
                      atomic_load(&s->c_route_responses));
    e |= metric(b, "responses_tools_dropped_total", "counter",
                "Hosted tools (web_search, namespace, ...) a Responses request offered, left out: osprey cannot run them.",
                atomic_load(&s->c_tools_dropped));
    e |= metric(b, "write_timeouts_total", "counter",
                "Responses abandoned because the client read nothing for --write-timeout (their requests cancelled).",
                c.stalled);
    e |= metric(b, "prompt_tokens_total", "counter", "Prompt tokens of finished requests.", c.prompt_tokens);
    e |= metric(b, "prompt_tokens_cached_total", "counter", "Prompt tokens served from the prefix cache.", c.cached_tokens);
    e |= metric(b, "generated_tokens_total", "counter", "Tokens generated.", c.gen_tokens);
    e |= metric(b, "draft_tokens_total", "counter", "Tokens drafted by speculative decoding.", c.draft);
    e |= metric(b, "draft_tokens_accepted_total", "counter", "Drafted tokens accepted.", c.draft_accepted);
    e |= metric(b, "queue_length", "gauge", "Requests waiting for a row.", c.queued);
    e |= metric(b, "rows_in_use", "gauge", "Rows of the batch generating.", c.running);
    e |= metric(b, "rows", "gauge", "Rows of the batch (--parallel).", c.parallel);
    e |= metric(b, "kv_budget_bytes", "gauge", "The KV budget.", c.kv_budget);
    e |= metric(b, "kv_reserved_bytes", "gauge", "KV bytes reserved by running requests.", c.kv_reserved);
    e |= srv_buf_addf(b, "# HELP process_resident_memory_bytes Resident memory size in bytes.\n"
                         "# TYPE process_resident_memory_bytes gauge\nprocess_resident_memory_bytes %lld\n", c.resident);
    if (s->audio_batch) {
        osp_wbatch_stats w;
        osp_wbatch_get_stats(s->audio_batch, &w);
        e |= metric(b, "transcription_steps_total", "counter", "Decoder steps of the transcription batch.", w.steps);
        e |= metric(b, "transcription_step_requests_total", "counter",
                    "Transcriptions' steps those steps held (per step: how many shared it).", w.step_jobs);
        e |= metric(b, "transcription_step_tokens_total", "counter", "Tokens those steps computed.", w.step_tokens);
        e |= metric(b, "transcription_encodes_total", "counter", "Encoder calls of the transcription batch.", w.encodes);
        e |= metric(b, "transcription_windows_total", "counter", "30 s windows those calls encoded.", w.windows);
        e |= metric(b, "transcription_compute_microseconds_total", "counter",
                    "Time the transcription batch spent computing.", (long long)(w.compute_s * 1e6));
        e |= metric(b, "transcription_gather_microseconds_total", "counter",
                    "Time it waited for other transcriptions' jobs to share a step.", (long long)(w.gather_s * 1e6));
    }
    if (c.have_pc) {
        const osp_prefix_stats *p = &c.pc;
        e |= metric(b, "prompt_cache_lookups_total", "counter", "Prefix cache lookups.", p->lookups);
        e |= metric(b, "prompt_cache_hits_total", "counter", "Prefix cache lookups that reused a prefix.", p->hits);
        e |= metric(b, "prompt_cache_misses_total", "counter", "Prefix cache lookups that found nothing.", p->misses);
        e |= metric(b, "prompt_cache_tokens_reused_total", "counter", "Prompt tokens reused.", p->tokens_reused);
        e |= metric(b, "prompt_cache_entries", "gauge", "Prefix cache entries in memory.", p->entries);
        e |= metric(b, "prompt_cache_bytes", "gauge", "Prefix cache bytes in memory.", p->bytes);
        e |= metric(b, "prompt_cache_disk_entries", "gauge", "Prefix cache entries on disk.", p->disk_entries);
        e |= metric(b, "prompt_cache_disk_bytes", "gauge", "Prefix cache bytes on disk.", p->disk_bytes);
        e |= metric(b, "prompt_cache_evictions_total", "counter", "Entries that left memory.", p->evictions);
        e |= metric(b, "prompt_cache_disk_writes_total", "counter", "Entries written to disk.", p->disk_writes);
        e |= metric(b, "prompt_cache_disk_loads_total", "counter", "Entries loaded from disk.", p->disk_loads);
        e |= metric(b, "prompt_cache_disk_rejects_total", "counter", "Files skipped as corrupt or foreign.",
                    p->disk_rejects);
    }
    return e ? -1 : 0;
}
