/* osprey bench: prefill and decode speed, and the decode's weight
 * bandwidth against this machine's memory bandwidth measured in the same
 * run (a STREAM-like triad on all threads). The ratio is the figure of
 * merit: decode of a dense model must stream every weight once per token. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli.h"
#include "model/whisper.h"
#include "core/core.h"
#include "core/threadpool.h"
#include "osprey.h"
#include "text/tokenizer.h"

typedef struct triad { float *a, *b, *c; int64_t n, block; } triad;

static void triad_task(void *p, int64_t t) {
    triad *tr = p;
    int64_t i0 = t * tr->block, i1 = i0 + tr->block < tr->n ? i0 + tr->block : tr->n;
    float *restrict a = tr->a;
    const float *restrict b = tr->b, *restrict c = tr->c;
    for (int64_t i = i0; i < i1; i++) a[i] = b[i] + 3.0f * c[i];
}

static void init_task(void *p, int64_t t) {
    triad *tr = p;
    int64_t i0 = t * tr->block, i1 = i0 + tr->block < tr->n ? i0 + tr->block : tr->n;
    for (int64_t i = i0; i < i1; i++) tr->a[i] = 0, tr->b[i] = 1, tr->c[i] = 2;
}

/* Models streaming fewer weight bytes per step than this decode from the
 * caches in good part: the triad runs after their decode, not inside it. */
#define BENCH_INTERLEAVE_BYTES (256LL << 20)

/* The machine's memory bandwidth: a STREAM triad (a = b + 3c, counted as 3
 * arrays: 2 reads, 1 write) on all threads over arrays of 32 Mi floats
 * each, far beyond any cache. Its trials are interleaved with the decode
 * steps, so the decode and the triad are measured over the same seconds of
 * a shared machine whose bandwidth drifts. The figure is the best trial, as
 * STREAM reports it (the mean is kept too). On huge pages (as the weights
 * are placed: the machine's best) and on the 4 KiB pages a plain STREAM
 * binary gets. */
typedef struct bw_probe {
    triad tr;
    const osp_model *dev;     /* a GPU model: its device's read probe instead of the triad */
    double bytes, secs, best; /* totals over the trials; the best trial's GB/s */
    int trials;
} bw_probe;

static int probe_open(bw_probe *pr, int huge) {
    memset(pr, 0, sizeof *pr);
    triad *tr = &pr->tr;
    tr->n = 32LL << 20;
    void *(*alloc)(osp_pool, size_t) = huge ? osp_malloc_huge : osp_malloc;
    tr->a = alloc(OSP_POOL_SCRATCH, tr->n * sizeof(float));
    tr->b = alloc(OSP_POOL_SCRATCH, tr->n * sizeof(float));
    tr->c = alloc(OSP_POOL_SCRATCH, tr->n * sizeof(float));
    if (!tr->a || !tr->b || !tr->c) {
        osp_free(tr->a), osp_free(tr->b), osp_free(tr->c);
        tr->a = tr->b = tr->c = NULL;
        return 0;
    }
    int nt = osp_threads_count();
    tr->block = (tr->n + nt - 1) / nt; /* one contiguous slice per thread, first-touched by it */
    osp_parallel_for(nt, init_task, tr);
    return 1;
}

/* The device's own probe (a GPU: a read kernel over a buffer far beyond its L2). */
static int probe_open_dev(bw_probe *pr, const osp_model *m) {
    memset(pr, 0, sizeof *pr);
    double g;
    if (osp_model_bw_trial(m, 0, &g) != OSP_OK) return 0; /* the first trial allocates and warms */
    pr->dev = m;
    return 1;
}

static void probe_trial(bw_probe *pr) {
    if (pr->dev) {
        double g;
        if (osp_model_bw_trial(pr->dev, 0, &g) != OSP_OK) return;
        pr->bytes += g * 1e9;
        pr->secs += 1.0;
        if (g > pr->best) pr->best = g;
        pr->trials++;
        return;
    }
    if (!pr->tr.a) return;
    double t0 = osp_now_s();
    osp_parallel_for(osp_threads_count(), triad_task, &pr->tr);
    double dt = osp_now_s() - t0, bytes = 3.0 * pr->tr.n * sizeof(float);
    pr->bytes += bytes;
    pr->secs += dt;
    if (dt > 0 && bytes / dt / 1e9 > pr->best) pr->best = bytes / dt / 1e9;
    pr->trials++;
}

static double probe_gbps(const bw_probe *pr) { return pr->secs > 0 ? pr->bytes / pr->secs / 1e9 : 0; }

static void probe_close(bw_probe *pr) {
    if (pr->dev) osp_model_bw_trial(pr->dev, 1, NULL);
    osp_free(pr->tr.a), osp_free(pr->tr.b), osp_free(pr->tr.c);
}

/* Greedy decode steps of the rows, each fed with next: a chain of steps
 * where the device queues them (osp_forward_rows_chain, as generate takes a
 * greedy stream's tokens there; next then gets the tokens of the step
 * before), else one osp_forward_rows_ids a step (next gets its tokens).
 * --no-chain: always the latter. bench_end finishes a chain's last step. */
static int no_chain;

static int bench_step(osp_session *s, const int32_t *rows, int32_t nb, int32_t *next, float *logits, int *chained) {
    if (no_chain || !osp_session_chain_queues(s)) return osp_forward_rows_ids(s, rows, nb, next, 1, NULL, logits, next) == OSP_OK;
    osp_status rc = *chained ? osp_forward_rows_chain(s, rows, nb, NULL, logits, next)
                             : osp_forward_rows_chain(s, rows, nb, next, logits, NULL);
    *chained = rc == OSP_OK;
    return rc == OSP_OK;
}

static int bench_end(osp_session *s, float *logits, int32_t *next, int *chained) {
    if (!*chained) return 1;
    *chained = 0;
    return osp_forward_chain_end(s, 1, logits, next) == OSP_OK;
}

/* Seconds for n greedy decode steps of one sequence after a p-token
 * prefill, on a session of its own; < 0 on failure. Each step's token is
 * taken by the backend (bench_step), as the server and generate take a
 * greedy stream's. */
static double single_stream_s(osp_model *m, const osp_session_opts *like, const int32_t *ids, int p, int n, int fast) {
    const osp_model_info *in = osp_model_get_info(m);
    osp_session_opts so = *like;
    so.n_rows = 1;
    osp_session *s;
    if (osp_session_new_opts(m, &so, &s) != OSP_OK) return -1;
    osp_session_set_fast(s, fast);
    float *logits = malloc(sizeof(float) * in->vocab);
    double dt = -1;
    int32_t row = 0, best;
    if (logits && osp_forward_rows_ids(s, &row, 1, ids, p, NULL, logits, &best) == OSP_OK) {
        double t0 = osp_now_s();
        int ok = 1, chained = 0;
        for (int i = 0; i < n && ok; i++) ok = bench_step(s, &row, 1, &best, logits, &chained);
        if (ok) ok = bench_end(s, logits, &best, &chained);
        if (ok) dt = osp_now_s() - t0;
    }
    free(logits);
    osp_session_free(s);
    return dt;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int usage(void) {
    fprintf(stderr, "usage: osprey bench [--model MODEL] [-p PROMPT_TOKENS] [-n DECODE_TOKENS] [-t THREADS] [--json] "
                    "[--precise] [--no-chain] [--concurrency N] [--kv-bits 4|8|16|32] [--kv-group-size G]\n"
                    "         [--device cpu|cuda|auto]\n" OSP_CLI_DEVICE_HELP
                    "  --precise: reference precision (f32 activations) instead of the production path\n"
                    "  --no-chain: on a GPU, each decode step waits for its tokens before the next is queued (by\n"
                    "              default the next step is queued first, fed with them on the GPU)\n"
                    "  --concurrency N: N sequences decoded together (each prefilled alone first); decode_tok_s is\n"
                    "                   then the aggregate over all streams, and one sequence alone is decoded\n"
                    "                   before and after in the same run for the speedup (batch_speedup)\n"
                    "  --kv-bits: KV cache precision: 4 or 8 = affine-quantized, 16 = bf16, 32 = f32 (the default)\n"
                    "  --prompt TEXT [--chat]: with speculation, the prompt (through the chat template with --chat)\n"
                    OSP_CLI_SPEC_HELP
                    "  with speculation: the same greedy generations decoded plainly and speculatively, interleaved;\n"
                    "  decode_tok_s, decode_tok_s_plain, spec_speedup, acceptance, identical (--json)\n");
    return 2;
}

int osp_cmd_bench(int argc, char **argv) {
    const char *model = NULL;
    int p = 512, n = 128, threads = 0, json = 0, fast = 1, conc = 1, kv_bits = 0, kv_group = 64, device = OSP_DEVICE_AUTO, dr;
    osp_cli_spec spc = OSP_CLI_SPEC_UNSET;
    const char *prompt = NULL;
    int chat = 0;
    for (int i = 1; i < argc; i++) {
        int sr = osp_cli_spec_flag(&spc, argv[i], i + 1 < argc ? argv[i + 1] : NULL);
        if (sr < 0) return 2;
        if (sr > 0) {
            i += sr == 1;
            continue;
        }
        if (!strcmp(argv[i], "--prompt") && i + 1 < argc) {
            prompt = argv[++i];
            continue;
        }
        if (!strcmp(argv[i], "--chat")) {
            chat = 1;
            continue;
        }
        if ((!strcmp(argv[i], "--model") || !strcmp(argv[i], "-m")) && i + 1 < argc) model = argv[++i];
        else if (!strcmp(argv[i], "-p") && i + 1 < argc) p = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-n") && i + 1 < argc) n = atoi(argv[++i]);
        else if ((!strcmp(argv[i], "-t") || !strcmp(argv[i], "--threads")) && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--json")) json = 1;
        else if (!strcmp(argv[i], "--precise")) fast = 0;
        else if (!strcmp(argv[i], "--no-chain")) no_chain = 1;
        else if ((!strcmp(argv[i], "--concurrency") || !strcmp(argv[i], "-np")) && i + 1 < argc) conc = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--kv-bits") && i + 1 < argc) kv_bits = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--kv-group-size") && i + 1 < argc) kv_group = atoi(argv[++i]);
        else if ((dr = osp_cli_device_flag("bench", argv[i], i + 1 < argc ? argv[i + 1] : NULL, &device)) != 0) {
            if (dr < 0) return 2;
            i++;
        } else return usage();
    }
    if (!model) model = osp_cli_default_model();
    if (kv_bits == 32) kv_bits = 0;
    if (!model || p < 1 || n < 1 || conc < 1 || conc > 256 || (kv_bits != 0 && kv_bits != 4 && kv_bits != 8 && kv_bits != 16))
        return usage();
    osp_set_threads(threads);
    if (osp_whisper_detect(model)) return osp_whisper_bench(model, device, fast, n, json); /* cli/whisper_tools.c */
    if (spc.draft || spc.ngram) return osp_bench_spec(model, device, fast, p, n, conc, prompt, chat, &spc, json);
    if (prompt) {
        fprintf(stderr, "osprey bench: --prompt is for speculation (--draft-model, --spec-ngram)\n");
        return 2;
    }
    osp_model *m;
    osp_model_params mp = {.device = (osp_device)device, .place = 1};
    const double t_load0 = osp_now_s();
    if (osp_model_load_params(model, &mp, &m) != OSP_OK) return osp_cli_fail("bench");
    const double t_load = osp_now_s() - t_load0; /* open, map, place (repack or upload): a server's start */
    const osp_model_info *in = osp_model_get_info(m);
    osp_session *s = NULL;
    int32_t *ids = malloc(sizeof(int32_t) * p * conc), *next = malloc(sizeof(int32_t) * conc),
            *all = malloc(sizeof(int32_t) * conc);
    float *logits = malloc(sizeof(float) * in->vocab * conc);
    for (int i = 0; i < p * conc; i++) ids[i] = (int32_t)((i * 7919 + 13) % in->vocab);
    for (int32_t b = 0; b < conc; b++) all[b] = b;
    int rc = 0;
    double *step = NULL; /* each decode step's seconds */
    bw_probe bw_huge = {0}, bw_4k = {0};
    osp_session_opts so = {.n_rows = conc, .max_ctx = p + n + 8, .kv_bits = kv_bits, .kv_group = kv_group}; /* + the warm-up steps */
    if (osp_session_new_opts(m, &so, &s) != OSP_OK) {
        rc = osp_cli_fail("bench");
        goto done;
    }
    osp_session_set_fast(s, fast);
    /* warm the page cache and the thread pool; on a GPU a whole prefill and
     * decode steps (libraries, handles and kernels load on first use) */
    double g0;
    int on_dev = osp_model_bw_trial(m, 0, &g0) == OSP_OK;
    osp_err_clear();
    if (osp_forward(s, ids, on_dev ? p : 1, 0, logits) != OSP_OK) {
        rc = osp_cli_fail("bench");
        goto done;
    }
    for (int i = 0; on_dev && i < 4; i++) {
        int32_t t = 1;
        if (osp_forward_rows_ids(s, &(int32_t){0}, 1, &t, 1, NULL, logits, &(int32_t){0}) != OSP_OK) {
            rc = osp_cli_fail("bench");
            goto done;
        }
    }
    for (int32_t b = 0; b < conc; b++) osp_session_reset_row(s, b);
    double t0 = osp_now_s();
    for (int32_t b = 0; b < conc; b++) /* each sequence is prefilled alone, as the server does */
        if (osp_forward_rows_ids(s, &b, 1, ids + (int64_t)b * p, p, NULL, logits, next + b) != OSP_OK) {
            rc = osp_cli_fail("bench");
            goto done;
        }
    double t_prefill = osp_now_s() - t0;
    /* single-stream decode before and after the batch: the speedup is a
     * ratio of figures measured in one run, on a machine whose speed drifts */
    double t_single = 0;
    if (conc > 1) {
        double a = single_stream_s(m, &so, ids, p, n, fast);
        t_single = a < 0 ? -1 : a;
    }
    step = malloc(sizeof(double) * n);
    if (!step || !(on_dev ? probe_open_dev(&bw_huge, m) : probe_open(&bw_huge, 1) && probe_open(&bw_4k, 0))) {
        rc = osp_cli_fail("bench");
        goto done;
    }
    /* the triad runs between decode steps (not timed as decode), 16 times
     * over the run, alternating huge and 4 KiB pages; after them for a model
     * whose weights would stay in the caches (the triad would evict them,
     * and its bandwidth says nothing about such a model's speed) */
    int every = n / 16 > 0 ? n / 16 : 1, trial = 0, interleave = in->decode_bytes >= BENCH_INTERLEAVE_BYTES;
    double t_decode = 0;
    int chained = 0;
    for (int i = 0; i < n; i++) {
        if (interleave && i % every == 0) {
            double te = osp_now_s(); /* (a chain's step in flight finishes first: its time is the step's before) */
            if (chained && !bench_end(s, logits, next, &chained)) {
                rc = osp_cli_fail("bench");
                goto done;
            }
            if (i > 0) step[i - 1] += osp_now_s() - te, t_decode += osp_now_s() - te;
            probe_trial(on_dev || trial++ % 2 == 0 ? &bw_huge : &bw_4k);
        }
        double ts = osp_now_s();
        /* greedy: the backend takes each row's token (only the ids come back from a GPU); in a chain, this call
         * waits for the step before */
        if (!bench_step(s, all, conc, next, logits, &chained)) {
            rc = osp_cli_fail("bench");
            goto done;
        }
        step[i] = osp_now_s() - ts;
        t_decode += step[i];
    }
    {
        double te = osp_now_s();
        if (!bench_end(s, logits, next, &chained)) {
            rc = osp_cli_fail("bench");
            goto done;
        }
        step[n - 1] += osp_now_s() - te, t_decode += osp_now_s() - te;
    }
    while (bw_huge.trials < 8 || (!on_dev && bw_4k.trials < 8))
        probe_trial(on_dev || bw_huge.trials <= bw_4k.trials ? &bw_huge : &bw_4k);
    qsort(step, (size_t)n, sizeof *step, cmp_double);
    double t_step_median = n % 2 ? step[n / 2] : (step[n / 2 - 1] + step[n / 2]) / 2;
    if (conc > 1 && t_single >= 0) {
        double b = single_stream_s(m, &so, ids, p, n, fast);
        t_single = b < 0 ? -1 : (t_single + b) / 2;
    }
    double single = t_single > 0 ? n / t_single : 0;
    size_t kv_bytes = osp_session_kv_bytes(s);
    /* The generation loop with the model's own sampling defaults, to measure
     * what sampling, detokenizing, stop strings and callbacks add per token
     * (against the forward passes of the same run). */
    double loop_pct = -1;
    osp_tokenizer *tok = NULL;
    if (conc == 1 && osp_tokenizer_load(in->dir, &tok) == OSP_OK) {
        int32_t eos[32];
        osp_gen_params gp;
        osp_gen_stats gs;
        const char *stops[] = {"\n\n\n\n"};
        osp_gen_defaults(m, tok, &gp, eos);
        if (gp.sampler.temperature == 0) gp.sampler.temperature = 1.0f, gp.sampler.top_k = 64, gp.sampler.top_p = 0.95f;
        gp.sampler.seed = 1;
        gp.max_tokens = n;
        gp.n_eos = 0; /* run all n tokens */
        gp.stop = stops;
        gp.n_stop = 1;
        /* best of three runs, as the triad is best of eight: an interruption
         * during the loop's microseconds would otherwise dominate it */
        for (int rep = 0; rep < 3; rep++) {
            osp_session_reset_row(s, 0);
            if (osp_generate(s, tok, ids, p < 16 ? p : 16, &gp, NULL, NULL, &gs) == OSP_OK && gs.forward_s > 0) {
                double pct = 100.0 * gs.loop_s / gs.forward_s;
                if (loop_pct < 0 || pct < loop_pct) loop_pct = pct;
            }
        }
        osp_tokenizer_free(tok);
    }
    double bw = bw_huge.best, bw4k = bw_4k.best, bw_mean = probe_gbps(&bw_huge);
    double pp = (double)p * conc / t_prefill, tg = (double)n * conc / t_decode, per = n / t_decode;
    double dg = (double)in->decode_bytes * per / 1e9; /* weights are streamed once per step for all rows */
    /* bw_ratio = decode_gbps / mem_bw_gbps: the decode's mean GB/s over all
     * its steps against the triad's best trial (STREAM's "best rate") among
     * those run between the same steps. Both slowdowns from a noisy machine
     * count against the decode only, so the ratio errs low; the median step
     * and the triad's mean are reported beside it. */
    double dgm = t_step_median > 0 ? (double)in->decode_bytes / t_step_median / 1e9 : 0;
    if (json) {
        printf("{\"model\":\"%s\",\"device\":\"%s\",\"mem_bw_probe\":\"%s\",\"precision\":\"%s\",\"threads\":%d,\"prompt_tokens\":%d,\"decode_tokens\":%d,"
               "\"prefill_tok_s\":%.3f,\"decode_tok_s\":%.3f,\"decode_bytes_per_token\":%lld,"
               "\"decode_gbps\":%.3f,\"decode_gbps_median\":%.3f,\"mem_bw_gbps\":%.3f,\"mem_bw_4k_gbps\":%.3f,"
               "\"mem_bw_mean_gbps\":%.3f,\"mem_bw_trials\":%d,\"bw_ratio_median\":%.4f,"
               "\"bw_ratio\":%.4f,\"bw_ratio_4k\":%.4f,\"loop_overhead_pct\":%.3f,"
               "\"concurrency\":%d,\"per_stream_tok_s\":%.3f,\"single_tok_s\":%.3f,\"batch_speedup\":%.3f,"
               "\"kv_bits\":%d,\"kv_bytes\":%zu,\"kv_bytes_per_token\":%.1f,\"load_s\":%.3f}\n",
               model, in->device, on_dev ? "device read" : "host triad", fast ? "fast" : "precise", osp_threads_count(), p, n, pp, tg, (long long)in->decode_bytes, dg, dgm,
               bw, bw4k, bw_mean, bw_huge.trials + bw_4k.trials, bw > 0 ? dgm / bw : 0,
               bw > 0 ? dg / bw : 0, bw4k > 0 ? dg / bw4k : 0, loop_pct, conc, per, single, single > 0 ? tg / single : 0, kv_bits ? kv_bits : 32, kv_bytes,
               (double)kv_bytes / ((double)conc * (p + n)), t_load);
    } else {
        printf("model:        %s (%s, %s%s)\n", model, in->architecture, in->quant_bits ? "MLX q" : in->dtype,
               in->quant_bits ? (in->quant_bits == 4 ? "4" : in->quant_bits == 8 ? "8" : "?") : "");
        printf("device:       %s\n", in->device);
        printf("load:         %.2f s (open, map, place the weights)\n", t_load);
        printf("threads:      %d, %s precision\n", osp_threads_count(), fast ? "production" : "reference (f32)");
        printf("prefill:      %d tokens, %.2f tok/s\n", p, pp);
        if (conc > 1) {
            printf("decode:       %d streams x %d tokens, %.2f tok/s in all, %.2f tok/s per stream\n", conc, n, tg, per);
            if (single > 0)
                printf("single:       %.2f tok/s alone (before and after, same run) -> %.2fx aggregate speedup\n",
                       single, tg / single);
        }
        else
            printf("decode:       %d tokens, %.2f tok/s\n", n, tg);
        printf("kv cache:     %s, %.2f MB in use (%.0f bytes per token)\n",
               kv_bits == 4 ? "4-bit" : kv_bits == 8 ? "8-bit" : kv_bits == 16 ? "bf16" : "f32", kv_bytes / 1e6, (double)kv_bytes / ((double)conc * (p + n)));
        printf("weights/step: %.1f MB -> %.2f GB/s (mean), %.2f GB/s (median step)\n", in->decode_bytes / 1e6, dg, dgm);
        if (on_dev)
            printf("memory bw:    %.2f GB/s (best device read of %d run between the decode steps, mean %.2f)\n", bw,
                   bw_huge.trials, bw_mean);
        else
            printf("memory bw:    %.2f GB/s (best triad on huge pages of %d run between the decode steps, mean %.2f; "
                   "%.2f GB/s on 4 KiB pages, as STREAM)\n", bw, bw_huge.trials, bw_mean, bw4k);
        printf("ratio:        %.1f%% of measured memory bandwidth (mean decode vs best triad; median step %.1f%%; "
               "%.1f%% of the 4 KiB-page triad)\n",
               bw > 0 ? 100 * dg / bw : 0, bw > 0 ? 100 * dgm / bw : 0, bw4k > 0 ? 100 * dg / bw4k : 0);
        if (loop_pct >= 0)
            printf("loop:         sampling + detokenizing + stop strings = %.2f%% of the decode forward time\n", loop_pct);
    }
done:
    probe_close(&bw_huge);
    probe_close(&bw_4k);
    free(step);
    free(ids);
    free(next);
    free(all);
    free(logits);
    osp_session_free(s);
    osp_model_free(m);
    return rc;
}
