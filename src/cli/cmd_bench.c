/* osprey bench: prefill and decode speed, and the decode's weight
 * bandwidth against this machine's read bandwidth measured in the same run
 * (bench_bw.h: a streaming read as large as the weights, on the bench's
 * threads; STREAM's triad beside it). The ratio is the figure of merit:
 * decode of a dense model must stream every weight once per token. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "bench_bw.h"
#include "cli.h"
#include "model/whisper.h"
#include "core/core.h"
#include "core/threadpool.h"
#include "osprey.h"
#include "text/tokenizer.h"

/* Models streaming fewer weight bytes per step than this decode from the
 * caches in good part: the probes run after their decode, not inside it. */
#define BENCH_INTERLEAVE_BYTES (256LL << 20)

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
                    "  decode_tok_s, decode_tok_s_plain, spec_speedup, acceptance, identical (--json)\n"
                    "  an embedder (no lm_head, or --embed): --inputs N (default 1000) inputs of -p tokens (default\n"
                    "  256) embedded, --concurrency rows at a time (default 8), against its prefill of one input\n");
    return 2;
}

int osp_cmd_bench(int argc, char **argv) {
    const char *model = NULL;
    int p = 512, n = 128, threads = 0, json = 0, fast = 1, conc = 1, kv_bits = 0, kv_group = 64, device = OSP_DEVICE_AUTO, dr;
    osp_cli_spec spc = OSP_CLI_SPEC_UNSET;
    const char *prompt = NULL;
    int chat = 0, embed = 0, inputs = 1000, p_set = 0, conc_set = 0;
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
        if (!strcmp(argv[i], "--embed")) {
            embed = 1;
            continue;
        }
        if (!strcmp(argv[i], "--inputs") && i + 1 < argc) {
            inputs = atoi(argv[++i]);
            continue;
        }
        p_set |= !strcmp(argv[i], "-p"), conc_set |= !strcmp(argv[i], "--concurrency") || !strcmp(argv[i], "-np");
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
    if (embed || !in->has_head) { /* cli/bench_embed.c */
        int r = inputs < 1 ? usage() : osp_bench_embed(m, fast, inputs, p_set ? p : 256, conc_set ? conc : 8, json);
        osp_model_free(m);
        return r;
    }
    osp_session *s = NULL;
    int32_t *ids = malloc(sizeof(int32_t) * p * conc), *next = malloc(sizeof(int32_t) * conc),
            *all = malloc(sizeof(int32_t) * conc);
    float *logits = malloc(sizeof(float) * in->vocab * conc);
    for (int i = 0; i < p * conc; i++) ids[i] = (int32_t)((i * 7919 + 13) % in->vocab);
    for (int32_t b = 0; b < conc; b++) all[b] = b;
    int rc = 0;
    double *step = NULL; /* each decode step's seconds */
    osp_bw_probe rd = {0}, tri = {0}, tri4k = {0}; /* the read (or the device's), the triads */
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
    if (!step || !(on_dev ? osp_bw_open_device(&rd, m)
                          : osp_bw_open_read(&rd, (size_t)in->decode_bytes) && osp_bw_open_triad(&tri, 1) &&
                                osp_bw_open_triad(&tri4k, 0))) {
        rc = osp_cli_fail("bench");
        goto done;
    }
    /* the probes run between decode steps (not timed as decode), 16 times
     * over the run, taking turns (read, triad, 4 KiB triad); after them for
     * a model whose weights would stay in the caches (a probe would evict
     * them, and its bandwidth says nothing about such a model's speed) */
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
            int k = on_dev ? 0 : trial++ % 3;
            osp_bw_trial(k == 0 ? &rd : k == 1 ? &tri : &tri4k);
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
    while (rd.trials < 8) osp_bw_trial(&rd);
    while (!on_dev && (tri.trials < 8 || tri4k.trials < 8)) osp_bw_trial(tri.trials <= tri4k.trials ? &tri : &tri4k);
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
        /* best of three runs, as the probes are best of eight: an interruption
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
    double bw = rd.best, bw_mean = osp_bw_mean(&rd), btri = tri.best, btri4k = tri4k.best;
    double pp = (double)p * conc / t_prefill, tg = (double)n * conc / t_decode, per = n / t_decode;
    double dg = (double)in->decode_bytes * per / 1e9; /* weights are streamed once per step for all rows */
    /* bw_ratio = decode_gbps / mem_bw_gbps: the decode's mean GB/s over all
     * its steps against the read probe's best trial (as STREAM reports its
     * "best rate") among those run between the same steps. Both slowdowns
     * from a noisy machine count against the decode only, so the ratio errs
     * low; the median step, the read's mean and the triads are beside it. */
    double dgm = t_step_median > 0 ? (double)in->decode_bytes / t_step_median / 1e9 : 0;
    if (json) {
        printf("{\"model\":\"%s\",\"device\":\"%s\",\"mem_bw_probe\":\"%s\",\"precision\":\"%s\",\"threads\":%d,\"prompt_tokens\":%d,\"decode_tokens\":%d,"
               "\"prefill_tok_s\":%.3f,\"decode_tok_s\":%.3f,\"decode_bytes_per_token\":%lld,"
               "\"decode_gbps\":%.3f,\"decode_gbps_median\":%.3f,\"mem_bw_gbps\":%.3f,"
               "\"mem_bw_mean_gbps\":%.3f,\"mem_bw_trials\":%d,\"triad_gbps\":%.3f,\"triad_4k_gbps\":%.3f,"
               "\"bw_ratio_median\":%.4f,\"bw_ratio\":%.4f,\"bw_ratio_triad\":%.4f,\"bw_ratio_4k\":%.4f,"
               "\"loop_overhead_pct\":%.3f,"
               "\"concurrency\":%d,\"per_stream_tok_s\":%.3f,\"single_tok_s\":%.3f,\"batch_speedup\":%.3f,"
               "\"kv_bits\":%d,\"kv_bytes\":%zu,\"kv_bytes_per_token\":%.1f,\"load_s\":%.3f}\n",
               model, in->device, on_dev ? "device read" : "host read", fast ? "fast" : "precise", osp_threads_count(), p, n, pp, tg,
               (long long)in->decode_bytes, dg, dgm, bw, bw_mean, rd.trials, btri, btri4k, bw > 0 ? dgm / bw : 0,
               bw > 0 ? dg / bw : 0, btri > 0 ? dg / btri : 0, btri4k > 0 ? dg / btri4k : 0, loop_pct, conc, per,
               single, single > 0 ? tg / single : 0, kv_bits ? kv_bits : 32, kv_bytes,
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
                   rd.trials, bw_mean);
        else
            printf("memory bw:    %.2f GB/s (best read of %.0f MB on huge pages, %d run between the decode steps, mean "
                   "%.2f); triad %.2f GB/s, %.2f on 4 KiB pages as STREAM\n",
                   bw, (double)rd.n * 64 / 1e6, rd.trials, bw_mean, btri, btri4k);
        printf("ratio:        %.1f%% of the measured read bandwidth (mean decode vs best read; median step %.1f%%)",
               bw > 0 ? 100 * dg / bw : 0, bw > 0 ? 100 * dgm / bw : 0);
        if (!on_dev) printf("; %.1f%% of the triad", btri > 0 ? 100 * dg / btri : 0);
        printf("\n");
        if (loop_pct >= 0)
            printf("loop:         sampling + detokenizing + stop strings = %.2f%% of the decode forward time\n", loop_pct);
    }
done:
    osp_bw_close(&rd);
    osp_bw_close(&tri);
    osp_bw_close(&tri4k);
    free(step);
    free(ids);
    free(next);
    free(all);
    free(logits);
    osp_session_free(s);
    osp_model_free(m);
    return rc;
}
