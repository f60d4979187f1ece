/* llama.cpp's whole-vocabulary grammar mask, timed per token as MaskBench's runner does: the peer row's mask
 * figure, which node-llama-cpp cannot give (it exposes only a one-token check).
 *
 * Input: the --dump file of bench/maskbench_peer.mjs (node-llama-cpp's GBNF for each compiled schema and its
 * tests' token ids under the same vocab-only GGUF). Per schema: llama_sampler_init_grammar (compile, timed);
 * per test a fresh grammar sampler; per token one figure: llama_sampler_apply over all vocabulary tokens
 * (the mask, as llama.cpp computes it for sampling), the token's check, and llama_sampler_accept (the commit).
 * At the end the test is accepted when node-llama-cpp's stop trigger tokens pass and then EOS is allowed (as
 * bench/maskbench_peer.mjs decides). Pass / valid rejected / invalid accepted as osprey's runner counts them.
 * A schema over --cap-s seconds (default 20) stops and counts as failing. Thread CPU clock; one thread.
 *
 * Build, against the llama.cpp that node-llama-cpp 3.22.1 ships (headers from its git bundle):
 *   git clone -q /tmp/nlc/node_modules/node-llama-cpp/llama/gitRelease.bundle /tmp/llamacpp-src
 *   B=/tmp/nlc/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64
 *   gcc -O2 -Wall -I/tmp/llamacpp-src/include -I/tmp/llamacpp-src/ggml/include bench/maskbench_llamacpp_mask.c \
 *       -o /tmp/maskbench_llamacpp_mask $B/libllama.v0.5.0.so $B/libggml.v0.5.0.so $B/libggml-base.so -Wl,-rpath,$B -lm
 * Run:
 *   nice -n 5 node bench/maskbench_peer.mjs --gguf /tmp/llama3-vocab.gguf FILE.jsonl --dump /tmp/mb.dump >/dev/null
 *   nice -n 5 /tmp/maskbench_llamacpp_mask /tmp/llama3-vocab.gguf /tmp/mb.dump [--shard K/N] [--cap-s S] > out.jsonl
 * (--shard K/N: schemas K, K+N, ... of those in the dump, i.e. of those that compiled.)
 * One JSON line a schema on stdout, a summary on stderr.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "llama.h"

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec * 1e6 + (double)t.tv_nsec * 1e-3;
}
static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}
static double pct(const double *v, size_t n, double p) {
    if (!n) return 0;
    size_t i = (size_t)(p * (double)(n - 1) + 0.5);
    return v[i < n ? i : n - 1];
}
static void push(double **v, size_t *n, size_t *cap, double x) {
    if (*n == *cap) *v = realloc(*v, sizeof(double) * (*cap = *cap ? *cap * 2 : 4096));
    (*v)[(*n)++] = x;
}

static void log_quiet(enum ggml_log_level level, const char *text, void *ud) {
    (void)ud;
    if (level == GGML_LOG_LEVEL_ERROR) fputs(text, stderr);
}

/* one-candidate check, as node-llama-cpp's canBeNextTokenForGrammarEvaluationState */
static int can_be(struct llama_sampler *s, llama_token t) {
    llama_token_data d = {t, 1.0f, 0.0f};
    llama_token_data_array a = {&d, 1, -1, false};
    llama_sampler_apply(s, &a);
    return a.size == 1 && a.data[0].logit != -INFINITY;
}

int main(int argc, char **argv) {
    const char *gguf = NULL, *dumpf = NULL;
    int skip = 0, every = 1;
    double cap_s = 20;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--shard") && i + 1 < argc) {
            if (sscanf(argv[++i], "%d/%d", &skip, &every) != 2 || every < 1 || skip < 0) skip = -1;
        } else if (!strcmp(argv[i], "--cap-s") && i + 1 < argc) cap_s = atof(argv[++i]);
        else if (argv[i][0] != '-' && !gguf) gguf = argv[i];
        else if (argv[i][0] != '-' && !dumpf) dumpf = argv[i];
        else skip = -1;
    }
    if (!gguf || !dumpf || skip < 0) {
        fprintf(stderr, "usage: maskbench_llamacpp_mask VOCAB.gguf DUMP [--shard K/N] [--cap-s S]\n");
        return 2;
    }
    llama_log_set(log_quiet, NULL);
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.vocab_only = true;
    struct llama_model *model = llama_model_load_from_file(gguf, mp);
    if (!model) { fprintf(stderr, "maskbench_llamacpp_mask: cannot load %s\n", gguf); return 1; }
    const struct llama_vocab *vocab = llama_model_get_vocab(model);
    int V = llama_vocab_n_tokens(vocab);
    FILE *in = fopen(dumpf, "rb");
    if (!in) { fprintf(stderr, "maskbench_llamacpp_mask: cannot open %s\n", dumpf); return 1; }
    int eos, ntrig;
    llama_token trig[16];
    if (fscanf(in, "H %d %d", &eos, &ntrig) != 2 || ntrig < 0 || ntrig > 16) goto bad;
    for (int i = 0; i < ntrig; i++)
        if (fscanf(in, "%d", &trig[i]) != 1) goto bad;
    llama_token_data *cand = malloc(sizeof(llama_token_data) * (size_t)V);
    size_t tcap = 1 << 16;
    llama_token *ids = malloc(sizeof(llama_token) * tcap);
    double *all = NULL, *comp = NULL, *mine = NULL;
    size_t n_all = 0, c_all = 0, n_comp = 0, c_comp = 0, n_mine = 0, c_mine = 0;
    long n_schemas = 0, n_pass = 0, n_cerr = 0, n_timeout = 0, n_valid_rej = 0, n_inv_acc = 0, n_inv_schemas = 0;
    long idx = -1;
    char tag[2];
    while (fscanf(in, "%1s", tag) == 1) {
        if (tag[0] != 'G') goto bad;
        size_t nb;
        char id[1024];
        if (fscanf(in, "%zu %1023s", &nb, id) != 2 || fgetc(in) != '\n') goto bad;
        char *gbnf = nb < (1u << 30) ? malloc(nb + 1) : NULL;
        if (!gbnf || fread(gbnf, 1, nb, in) != nb) goto bad;
        gbnf[nb] = 0;
        idx++;
        int mine_schema = idx % every == skip;
        double t0 = now_us();
        struct llama_sampler *root = mine_schema ? llama_sampler_init_grammar(vocab, gbnf, "root") : NULL;
        double compile_us = now_us() - t0;
        if (mine_schema) {
            n_schemas++;
            if (!root) n_cerr++;
            else push(&comp, &n_comp, &c_comp, compile_us);
        }
        n_mine = 0;
        const char *verr = NULL;
        int inv_acc = 0, timed_out = 0, ntests = 0, nvalid = 0;
        while (fscanf(in, "%1s", tag) == 1 && tag[0] == 'T') {
            int valid;
            size_t nt;
            if (fscanf(in, "%d %zu", &valid, &nt) != 2) goto bad;
            if (nt > (1u << 24)) goto bad;
            if (nt > tcap) ids = realloc(ids, sizeof(llama_token) * (tcap = nt));
            for (size_t k = 0; k < nt; k++)
                if (fscanf(in, "%d", &ids[k]) != 1 || ids[k] < 0 || ids[k] >= V) goto bad;
            ntests++, nvalid += valid;
            if (!root || timed_out) continue;
            if ((now_us() - t0) * 1e-6 > cap_s) { timed_out = 1; continue; }
            struct llama_sampler *s = llama_sampler_clone(root);
            int ok = 1;
            for (size_t k = 0; k < nt; k++) {
                double a = now_us();
                for (int t = 0; t < V; t++) cand[t] = (llama_token_data){t, 0.0f, 0.0f};
                llama_token_data_array arr = {cand, (size_t)V, -1, false};
                llama_sampler_apply(s, &arr);
                int allowed = cand[ids[k]].id == ids[k] && cand[ids[k]].logit != -INFINITY;
                if (allowed) llama_sampler_accept(s, ids[k]);
                double us = now_us() - a;
                push(&mine, &n_mine, &c_mine, us);
                if (!allowed) { ok = 0; break; }
                if ((now_us() - t0) * 1e-6 > cap_s) { ok = 0, timed_out = 1; break; }
            }
            for (int i = 0; ok && !timed_out && i < ntrig; i++) {
                if (!can_be(s, trig[i])) ok = 0;
                else llama_sampler_accept(s, trig[i]);
            }
            if (ok && !timed_out && !can_be(s, eos)) ok = 0;
            llama_sampler_free(s);
            if (timed_out) continue;
            if (valid && !ok && !verr) verr = "should accept but didn't", n_valid_rej++;
            if (!valid && ok) {
                if (!verr) verr = "should reject but didn't";
                inv_acc = 1, n_inv_acc++;
            }
        }
        if (tag[0] != 'E') goto bad;
        free(gbnf);
        if (!mine_schema) continue;
        if (root) {
            if (timed_out) n_timeout++;
            else if (!verr) n_pass++;
            n_inv_schemas += inv_acc;
            llama_sampler_free(root);
        }
        double sum = 0, mx = 0;
        for (size_t k = 0; k < n_mine; k++) {
            sum += mine[k], mx = mine[k] > mx ? mine[k] : mx;
            push(&all, &n_all, &c_all, mine[k]);
        }
        printf("{\"id\":\"%s\",\"compile_us\":%.1f,\"masks_us\":%.1f,\"max_mask_us\":%.1f,\"num_tokens\":%zu,"
               "\"num_tests\":%d,\"num_valid_tests\":%d,\"num_invalid_tests\":%d,\"all_mask_us\":[",
               id, compile_us, sum, mx, n_mine, ntests, nvalid, ntests - nvalid);
        for (size_t k = 0; k < n_mine; k++) printf(k ? ",%.1f" : "%.1f", mine[k]);
        printf("]%s%s%s%s%s%s}\n", root ? "" : ",\"compile_error\":\"llama_sampler_init_grammar failed\"",
               timed_out ? ",\"timeout\":true" : "", verr ? ",\"validation_error\":\"" : "", verr ? verr : "",
               verr ? "\"" : "", inv_acc ? ",\"invalid_accepted\":true" : "");
        fflush(stdout);
    }
    fclose(in);
    qsort(all, n_all, sizeof(double), cmp_d);
    qsort(comp, n_comp, sizeof(double), cmp_d);
    fprintf(stderr,
            "maskbench_llamacpp_mask: %ld schemas (compiled by node-llama-cpp), passing %ld (%.1f%%), grammar init "
            "errors %ld, timeouts %ld (over %g s), valid rejected %ld tests, invalid accepted %ld tests in %ld schemas\n"
            "maskbench_llamacpp_mask: %zu masks (%d tokens each, + commit): p50 %.1f us, p99 %.1f us, p99.9 %.1f us, "
            "max %.1f us; llama_sampler_init_grammar p50 %.1f us, p99 %.1f us\n",
            n_schemas, n_pass, n_schemas ? 100.0 * (double)n_pass / (double)n_schemas : 0.0, n_cerr, n_timeout, cap_s,
            n_valid_rej, n_inv_acc, n_inv_schemas, n_all, V, pct(all, n_all, 0.5), pct(all, n_all, 0.99),
            pct(all, n_all, 0.999), n_all ? all[n_all - 1] : 0.0, pct(comp, n_comp, 0.5), pct(comp, n_comp, 0.99));
    free(all), free(comp), free(mine), free(cand), free(ids);
    llama_model_free(model);
    return 0;
bad:
    fprintf(stderr, "maskbench_llamacpp_mask: %s is not a maskbench_peer.mjs --dump file\n", dumpf);
    return 1;
}
