/* Comparisons the encoder, reranker and Whisper tests share: the goldens'
 * relative measure |x - ref| / max(1, |ref|) (tests/data/goldens/README.md,
 * tier 1) and the plain max |a - b|, and a golden tensor found by a numbered
 * name (input_ids_3, hidden_3). */
#ifndef OSP_TEST_GOLDEN_CMP_H
#define OSP_TEST_GOLDEN_CMP_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include "model/safetensors.h"

static inline double golden_rel(double x, double ref) { return fabs(x - ref) / fmax(1, fabs(ref)); }

/* the largest golden_rel over n values */
static inline double golden_worst_rel(const float *x, const float *ref, int64_t n) {
    double w = 0;
    for (int64_t i = 0; i < n; i++) w = fmax(w, golden_rel(x[i], ref[i]));
    return w;
}

/* max |a - b| over n values */
static inline double golden_max_diff(const float *a, const float *b, int64_t n) {
    double d = 0;
    for (int64_t i = 0; i < n; i++) d = fmax(d, fabs((double)a[i] - b[i]));
    return d;
}

/* the tensor named by fmt with i (e.g. "hidden_%d"), or NULL */
static inline const osp_st_tensor *golden_find_i(const osp_st *g, const char *fmt, int i) {
    char name[64];
    snprintf(name, sizeof name, fmt, i);
    return osp_st_find(g, name);
}

#endif
