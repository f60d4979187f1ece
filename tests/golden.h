/* Helpers shared by the parity tests: load golden.safetensors and compare
 * logits with the goldens' reference-precision bound (tests/data/goldens/
 * README.md, "Tolerances", tier 1): max |ours - ref| <= GOLDEN_TOL *
 * max(1, max |ref|) at every position. */
#ifndef OSP_TEST_GOLDEN_H
#define OSP_TEST_GOLDEN_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "model/safetensors.h"
#include "osprey.h"

#define GOLDEN_TOL 2e-5
/* The greedy argmax must agree wherever the reference's top-2 margin
 * exceeds this (absolute, in logits). */
#define GOLDEN_MARGIN 1e-3

/* Every language-model golden in data/goldens (the parity suite). */
static const char *const GOLDEN_MODELS[] = {"gemma3",      "gemma3-q4",   "llama3",       "llama3-q4",
                                            "qwen3",       "qwen3-q8",    "qwen2",        "gemma4-e",
                                            "gemma4-e-q4", "gemma4-e-q8", "gemma4-dense", "gemma4-dense-q4",
                                            "gemma4-moe"};
#define N_GOLDEN_MODELS (sizeof GOLDEN_MODELS / sizeof *GOLDEN_MODELS)

typedef struct golden {
    osp_st *st;
    const int32_t *input_ids, *gen_prompt, *gen_ids; /* may be unaligned: copied below */
    int32_t *ids, *prompt, *gen;
    int32_t T, n_prompt, n_gen, vocab;
    float *logits; /* [T, vocab] */
} golden;

static inline int32_t *golden_copy_i32(const osp_st_tensor *t, int32_t *n) {
    if (!t || t->dtype != OSP_DT_I32) return NULL;
    *n = (int32_t)t->numel;
    int32_t *v = malloc(t->nbytes + 4);
    memcpy(v, t->data, t->nbytes);
    return v;
}

static inline int golden_load(const char *dir, golden *g) {
    char p[1024];
    memset(g, 0, sizeof *g);
    snprintf(p, sizeof p, "%s/golden.safetensors", dir);
    if (osp_st_open_file(p, &g->st) != OSP_OK) return -1;
    g->ids = golden_copy_i32(osp_st_find(g->st, "input_ids"), &g->T);
    g->prompt = golden_copy_i32(osp_st_find(g->st, "gen_prompt"), &g->n_prompt);
    g->gen = golden_copy_i32(osp_st_find(g->st, "gen_ids"), &g->n_gen);
    const osp_st_tensor *l = osp_st_find(g->st, "logits");
    if (!g->ids || !l || l->dtype != OSP_DT_F32 || l->ndim != 2 || l->shape[0] != g->T) return -1;
    g->vocab = (int32_t)l->shape[1];
    g->logits = malloc(l->nbytes);
    memcpy(g->logits, l->data, l->nbytes);
    return 0;
}

static inline void golden_free(golden *g) {
    free(g->ids);
    free(g->prompt);
    free(g->gen);
    free(g->logits);
    osp_st_close(g->st);
}

/* Max error of one position relative to the tolerance (<= 1 passes). */
static inline double golden_pos_ratio(const float *ref, const float *got, int32_t V) {
    double mx = 0, err = 0;
    for (int32_t i = 0; i < V; i++) {
        if (fabs(ref[i]) > mx) mx = fabs(ref[i]);
        double e = fabs((double)ref[i] - got[i]);
        if (!(e <= err)) err = e; /* NaN counts as failure */
    }
    return err / (GOLDEN_TOL * (mx > 1 ? mx : 1));
}

/* KL(ref || got) of the softmaxed logits, in nats (>= 0). */
static inline double golden_kl(const float *ref, const float *got, int32_t V) {
    double mr = -1e300, mg = -1e300, zr = 0, zg = 0, k = 0;
    for (int32_t i = 0; i < V; i++) mr = fmax(mr, ref[i]), mg = fmax(mg, got[i]);
    for (int32_t i = 0; i < V; i++) zr += exp(ref[i] - mr), zg += exp(got[i] - mg);
    for (int32_t i = 0; i < V; i++) {
        double lp = ref[i] - mr - log(zr), lq = got[i] - mg - log(zg);
        k += exp(lp) * (lp - lq);
    }
    return k > 0 ? k : 0;
}

static inline int argmax_f(const float *x, int32_t n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* A scratch folder for a test file: make it in setup, remove it in teardown. */
static inline int test_tmpdir_make(char *dir, size_t n, const char *tag) {
    snprintf(dir, n, "/tmp/osp_%s_XXXXXX", tag);
    return mkdtemp(dir) ? 0 : -1;
}

static inline int test_tmpdir_remove(const char *dir) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    return system(cmd) == 0 ? 0 : -1;
}

/* Run the same T ids through the models in folders da and db (prefill,
 * every position) and return max |a - b| / max(1, max |b|); -1 if a model
 * fails to load or run (the message is in osp_last_error()). */
static inline double models_rel_diff(const char *da, const char *db, int32_t T, int32_t mul) {
    osp_model *a = NULL, *b = NULL;
    osp_session *sa = NULL, *sb = NULL;
    float *la = NULL, *lb = NULL;
    double r = -1;
    if (osp_model_load(da, &a) != OSP_OK || osp_model_load(db, &b) != OSP_OK) goto out;
    int32_t V = osp_model_get_info(a)->vocab;
    int32_t *ids = malloc(sizeof(int32_t) * T);
    for (int32_t i = 0; i < T; i++) ids[i] = (i * mul + 7) % V;
    la = malloc(sizeof(float) * T * V), lb = malloc(sizeof(float) * T * V);
    if (osp_session_new(a, 1, T, &sa) == OSP_OK && osp_session_new(b, 1, T, &sb) == OSP_OK &&
        osp_forward(sa, ids, T, 1, la) == OSP_OK && osp_forward(sb, ids, T, 1, lb) == OSP_OK) {
        double mx = 0, err = 0;
        for (int64_t i = 0; i < (int64_t)T * V; i++) {
            mx = fmax(mx, fabs(lb[i]));
            err = fmax(err, fabs((double)la[i] - lb[i]));
            if (isnan(la[i])) err = INFINITY;
        }
        r = err / fmax(1, mx);
    }
    free(ids);
out:
    osp_session_free(sa);
    osp_session_free(sb);
    osp_model_free(a);
    osp_model_free(b);
    free(la);
    free(lb);
    return r;
}

#endif
