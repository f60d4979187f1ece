/* server/setup: what the server computes on before it can answer: the
 * model, its tokenizer and chat template, the batch session with its KV
 * cache precision, the KV budget and the generation defaults. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/fs.h"
#include "engine/spec.h"
#include "kv/prefix.h"
#include "server/server_internal.h"

/* Bytes of memory the system can still give (MemAvailable), or 0. */
static int64_t mem_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return 0;
    char line[256];
    long long kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %lld kB", &kb) == 1) break;
    fclose(f);
    return (int64_t)kb * 1024;
}


void srv_model_name(const char *path, char *out, size_t cap) {
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s", path);
    size_t n = strlen(tmp);
    while (n > 1 && tmp[n - 1] == '/') tmp[--n] = 0;
    const char *b = strrchr(tmp, '/');
    b = b ? b + 1 : tmp;
    if (!strncmp(b, "models--", 8)) { /* Hugging Face cache: models--ORG--NAME */
        snprintf(out, cap, "%s", b + 8);
        char *d = strstr(out, "--");
        if (d) memmove(d + 1, d + 2, strlen(d + 2) + 1), *d = '/';
    } else {
        snprintf(out, cap, "%s", b);
    }
}

/* The prefix cache: in memory, and in its folder under the model's artifact
 * identity when persisting. A folder that cannot be used leaves it in
 * memory only (logged), never stops the server. */
static int prefix_setup(srv *s, int64_t mem_bytes) {
    const osp_serve_config *c = &s->cfg;
    int64_t disk = (int64_t)(c->prompt_cache_disk_gib * 1073741824.0);
    s->pc_dir[0] = 0;
    if (disk > 0) {
        if (c->prompt_cache_dir) snprintf(s->pc_dir, sizeof s->pc_dir, "%s", c->prompt_cache_dir);
        else if (!osp_cache_dir(s->pc_dir, sizeof s->pc_dir))
            OSP_LOG(1, "osprey serve: neither XDG_CACHE_HOME nor HOME is set: the prefix cache stays in memory");
    }
    if (s->pc_dir[0] && osp_mkdirs(s->pc_dir) != 0) {
        OSP_LOG(1, "osprey serve: cannot create %s: the prefix cache stays in memory", s->pc_dir);
        s->pc_dir[0] = 0;
    }
    if (s->pc_dir[0]) {
        double t0 = osp_now_s();
        if (osp_model_identity(s->model, s->pc_dir, s->identity) != OSP_OK) {
            OSP_LOG(1, "osprey serve: the model's identity: %s: the prefix cache stays in memory", osp_last_error());
            s->pc_dir[0] = 0;
            s->identity[0] = 0;
        } else {
            OSP_LOG(2, "osprey serve: model identity %s (%.2f s)", s->identity, osp_now_s() - t0);
        }
    }
    const osp_model_info *in = osp_model_get_info(s->model);
    char numerics[256], ns[65];
    /* a prefix cache that reuses any prefix (replies too) is worth more to a conversation than the faster
     * prefill kernels whose numbers depend on the chunk (the CPU's 4-bit chunks on AMX tiles): re-prefilling
     * from the last grid line costs up to a prefill step and the last reply every turn */
    osp_session_set_chunk_exact(s->session, 1);
    s->pc_grid = !osp_session_chunk_invariant(s->session);
    snprintf(numerics, sizeof numerics, "numerics %d; %s; production; %s %d", OSP_NUMERICS_VERSION, in->device,
             s->pc_grid ? "grid" : "any chunks", s->pc_grid ? c->prefill_step : 0);
    osp_prefix_namespace(s->identity[0] ? s->identity : "memory only", osp_session_kv(s->session), numerics, ns);
    osp_prefix_opts po = {.mem_bytes = mem_bytes, .dir = s->pc_dir[0] ? s->pc_dir : NULL,
                          .disk_bytes = s->pc_dir[0] ? disk : 0, .ns = ns, .on_freed = srv_prefix_freed, .user = s,
                          .align = s->pc_grid ? c->prefill_step : 1};
    if (osp_prefix_new(&po, osp_session_kv(s->session), &s->pc) != OSP_OK) return -1;
    osp_prefix_stats st;
    osp_prefix_get_stats(s->pc, &st);
    char how[160];
    if (s->pc_grid)
        snprintf(how, sizeof how, "prompts reused at multiples of %d tokens (the prefill chunk: this model's rows "
                 "depend on their chunking here)", c->prefill_step);
    else
        snprintf(how, sizeof how, "any prefix reused, replies too");
    if (s->pc_dir[0])
        OSP_LOG(1, "osprey serve: prefix cache %.2f GiB in memory, then %s (%lld entries there); %s",
                mem_bytes / 1073741824.0, s->pc_dir, (long long)st.disk_entries, how);
    else
        OSP_LOG(1, "osprey serve: prefix cache %.2f GiB in memory; %s", mem_bytes / 1073741824.0, how);
    return 0;
}

/* Speculative decoding: the draft model on the model's device, its
 * tokenizer checked against the model's; or n-gram lookup. */
static int spec_setup(srv *s) {
    const osp_serve_config *c = &s->cfg;
    osp_spec_params p = osp_spec_defaults();
    if (c->draft_max > 0) p.draft_max = c->draft_max;
    if (c->draft_min > 0) p.draft_min = c->draft_min;
    if (p.draft_min > p.draft_max) p.draft_min = p.draft_max;
    p.max_tokens = c->spec_batch_tokens >= 0 ? c->spec_batch_tokens : osp_session_pass_tokens(s->session);
    p.ngram = !c->draft_model;
    if (c->draft_model && osp_spec_load_draft(c->draft_model, c->device, s->tok, &s->draft) != OSP_OK) return -1;
    osp_status rc = osp_spec_new(&p, s->draft, s->session, &s->spec);
    if (rc == OSP_ERR_UNSUPPORTED) { /* the device cannot verify exactly: serve without it, and say so */
        OSP_LOG(0, "osprey serve: %s; serving without it", osp_last_error());
        osp_model_free(s->draft);
        s->draft = NULL;
        return 0;
    }
    if (rc != OSP_OK) return -1;
    OSP_LOG(1, "osprey serve: speculative decoding with %s, up to %d drafted tokens per round (at least %d)",
            c->draft_model ? c->draft_model : "n-gram lookup", p.draft_max, p.draft_min);
    return 0;
}

int srv_setup(srv *s) {
    const osp_serve_config *c = &s->cfg;
    double t0 = osp_now_s();
    osp_alloc_long_running();
    if (!c->model) { /* audio and/or embeddings only */
        if (srv_audio_setup(s) || srv_embed_setup(s) || srv_rerank_setup(s)) return -1;
        if (s->audio)
            OSP_LOG(1, "osprey serve: audio model %s on /v1/audio/transcriptions and /v1/audio/translations (no chat "
                    "model)", c->audio_model);
        return 0;
    }
    osp_model_params mp = {.device = (osp_device)c->device, .place = 1};
    if (osp_model_load_params(c->model, &mp, &s->model) != OSP_OK) return -1;
    const osp_model_info *in = osp_model_get_info(s->model);
    if (!in->has_head)
        return osp_err(OSP_ERR_INVALID, "%s has no lm_head: it is an embedding model (serve it with --embedding-model)",
                       c->model), -1;
    if (osp_tokenizer_load(in->dir, &s->tok) != OSP_OK) return -1;
    if (osp_chat_template_load(in->dir, c->chat_template, &s->tmpl) != OSP_OK) {
        if (c->chat_template) return -1;
        OSP_LOG(1, "osprey serve: no chat template (%s); /v1/chat/completions is unavailable", osp_last_error());
        s->tmpl = NULL;
    }
    s->fmt = s->tmpl ? osp_reply_format_detect(osp_chat_template_source(s->tmpl)) : OSP_REPLY_NONE;
    int ctx = c->ctx > 0 ? c->ctx : (in->max_ctx > 0 && in->max_ctx < 8192 ? in->max_ctx : 8192);
    if (in->max_ctx > 0 && ctx > in->max_ctx) {
        OSP_LOG(1, "osprey serve: -c %d is larger than the model's %d positions; using %d", ctx, in->max_ctx, in->max_ctx);
        ctx = in->max_ctx;
    }
    s->ctx = ctx;
    int32_t n_layers = in->n_layers, lbits[n_layers], lgroup[n_layers];
    int have_cfg = 0;
    osp_session_opts so = {.n_rows = c->parallel, .max_ctx = ctx, .kv_bits = c->kv_bits > 0 ? c->kv_bits : 0,
                           .kv_group = c->kv_group,
                           .max_tokens = c->parallel > c->prefill_step ? c->parallel : c->prefill_step,
                           .spare = c->draft_model || c->spec_ngram ? (c->draft_max > 0 ? c->draft_max : 4) + 1 : 0};
    if (c->kv_bits < 0) { /* no flag: the model's kv_config.json, if any */
        if (osp_model_kv_config(s->model, lbits, lgroup, &have_cfg) != OSP_OK) return -1;
        if (have_cfg) so.layer_kv_bits = lbits, so.layer_kv_group = lgroup;
    }
    if (osp_session_new_opts(s->model, &so, &s->session) != OSP_OK) return -1;
    osp_session_set_fast(s->session, 1); /* the production path, as osprey generate and bench use */
    /* the KV budget: the flag, else what all rows at full context take plus the prefix cache, capped at
     * 3/4 of available memory; the prefix cache lives inside it */
    int64_t pc_bytes = (int64_t)(c->prompt_cache_gib * 1073741824.0);
    int64_t full = osp_session_kv_row_bytes(s->session, ctx) * c->parallel, avail = mem_available() / 4 * 3;
    s->kv_budget = c->kv_budget > 0 ? c->kv_budget : (avail > 0 && avail < full + pc_bytes ? avail : full + pc_bytes);
    if (pc_bytes > 0 && prefix_setup(s, pc_bytes)) return -1;
    if ((c->draft_model || c->spec_ngram) && spec_setup(s)) return -1;
    s->parallel = c->parallel;
    s->prefill_step = c->prefill_step;
    s->vocab = in->vocab;
    s->logits = malloc(sizeof(float) * (size_t)c->parallel * in->vocab);
    if (!s->logits || srv_slots_init(s)) return osp_err(OSP_ERR_NOMEM, "out of memory"), -1;
    osp_gen_defaults(s->model, s->tok, &s->defaults, s->eos);
    /* structured output: the vocabulary's trie, once (a tokenizer larger than the model's vocabulary has tokens
     * the model cannot produce: no grammars then) */
    if (osp_grammar_vocab_from_tokenizer(s->tok, &s->gvocab) != OSP_OK ||
        osp_grammar_vocab_size(s->gvocab) > in->vocab) {
        OSP_LOG(1, "osprey serve: no structured output for this tokenizer (%s)",
                s->gvocab ? "more tokens than the model's vocabulary" : osp_last_error());
        osp_grammar_vocab_free(s->gvocab);
        s->gvocab = NULL;
    }
    if (!(s->gcache = srv_gcache_new())) return osp_err(OSP_ERR_NOMEM, "out of memory"), -1;
    s->n_eos = s->defaults.n_eos;
    if (c->temp >= 0) s->defaults.sampler.temperature = c->temp;
    if (c->top_p >= 0) s->defaults.sampler.top_p = c->top_p;
    if (c->top_k >= 0) s->defaults.sampler.top_k = c->top_k;
    if (c->min_p >= 0) s->defaults.sampler.min_p = c->min_p;
    OSP_LOG(1, "osprey serve: loaded %s (%s on %s, context %d, reply format %s) in %.2f s; %d parallel rows, KV %s%s, "
            "budget %.1f MiB (%.1f MiB per row at full context)", s->model_name, in->architecture, in->device, ctx,
            osp_reply_format_name(s->fmt), osp_now_s() - t0, c->parallel,
            have_cfg ? "per kv_config.json" : so.kv_bits == 16 ? "bf16" : so.kv_bits ? (so.kv_bits == 4 ? "4-bit" : "8-bit") : "f32",
            so.kv_bits && so.kv_bits != 16 ? " (affine-quantized)" : "", s->kv_budget / 1048576.0, full / (double)c->parallel / 1048576.0);
    if (srv_audio_setup(s)) return -1;
    if (s->audio) OSP_LOG(1, "osprey serve: audio model %s on /v1/audio/transcriptions and /v1/audio/translations", c->audio_model);
    return srv_embed_setup(s) || srv_rerank_setup(s) ? -1 : 0;
}


void srv_teardown(srv *s) {
    srv_audio_teardown(s);
    srv_embed_teardown(s);
    srv_rerank_teardown(s);
    /* a clean shutdown writes what is only in memory; under --drain-timeout for at most 5 s more, the most
     * recently used entries first, so that the drain's bound holds whatever clients put in the cache */
    osp_prefix_free_within(s->pc, s->cfg.drain_timeout > 0 ? 5.0 : 0);
    s->pc = NULL;
    osp_spec_free(s->spec);
    osp_model_free(s->draft);
    s->spec = NULL, s->draft = NULL;
    osp_session_free(s->session);
    free(s->slots);
    free(s->logits);
    osp_chat_template_free(s->tmpl);
    srv_gcache_free(s->gcache);
    osp_grammar_vocab_free(s->gvocab);
    s->gcache = NULL, s->gvocab = NULL;
    osp_tokenizer_free(s->tok);
    osp_model_free(s->model);
    s->session = NULL, s->slots = NULL, s->logits = NULL, s->tmpl = NULL, s->tok = NULL, s->model = NULL;
}
