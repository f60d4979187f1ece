/* tensor_compare REF.safetensors REF_NAME OUT.safetensors OUT_NAME [--columns]:
 * checks a 2-D F32 tensor of OUT against one of REF with the goldens'
 * reference-precision bound (data/goldens/README.md, "Tolerances"):
 * max |ours - ref| <= 2e-5 * max(1, max |ref|) at every position. A position
 * is a row ([T, vocab] logits, [1500, d] encoder states), or with --columns a
 * column (a frame of a [n_mels, 3000] spectrogram). With --kl, the
 * production precision's tier on logits instead (tests/test_fast_path.c's):
 * per-row KL(ref || ours) of the softmaxes <= 1e-3 on average and <= 1e-2 at
 * worst, and the same top-1 token in every row. Exit 0 = pass. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "golden.h"
#include "model/safetensors.h"


static const osp_st_tensor *get(const osp_st *st, const char *file, const char *name) {
    const osp_st_tensor *t = osp_st_find(st, name);
    if (!t || t->dtype != OSP_DT_F32 || t->ndim < 1) {
        fprintf(stderr, "tensor_compare: %s: no F32 tensor '%s'\n", file, name);
        return NULL;
    }
    return t;
}

int main(int argc, char **argv) {
    int by_col = argc == 6 && !strcmp(argv[5], "--columns"), kl = argc == 6 && !strcmp(argv[5], "--kl");
    if (argc != 5 && !by_col && !kl) {
        fprintf(stderr, "usage: tensor_compare REF.safetensors REF_NAME OUT.safetensors OUT_NAME [--columns | --kl]\n");
        return 2;
    }
    osp_st *rs = NULL, *os = NULL;
    if (osp_st_open_file(argv[1], &rs) != OSP_OK || osp_st_open_file(argv[3], &os) != OSP_OK) {
        fprintf(stderr, "tensor_compare: %s\n", osp_last_error());
        osp_st_close(rs);
        return 2;
    }
    int rc = 1;
    const osp_st_tensor *r = get(rs, argv[1], argv[2]), *o = get(os, argv[3], argv[4]);
    if (!r || !o) goto done;
    if (r->ndim != 2 || o->ndim != 2 || memcmp(r->shape, o->shape, sizeof(int64_t) * 2)) {
        fprintf(stderr, "tensor_compare: %s has another shape than %s\n", argv[4], argv[2]);
        goto done;
    }
    /* positions x elements, with the element stride es and position stride ps */
    int64_t rows = by_col ? r->shape[1] : r->shape[0], cols = by_col ? r->shape[0] : r->shape[1];
    int64_t ps = by_col ? 1 : r->shape[1], es = by_col ? r->shape[1] : 1;
    float *a = malloc(r->nbytes + 4), *b = malloc(o->nbytes + 4);
    memcpy(a, r->data, r->nbytes);
    memcpy(b, o->data, o->nbytes);
    double worst = 0, worst_abs = 0;
    int64_t bad = 0;
    if (kl) {
        double sum = 0;
        for (int64_t i = 0; i < rows; i++) {
            double k = golden_kl(a + i * cols, b + i * cols, (int32_t)cols);
            sum += k;
            worst = k > worst || isnan(k) ? k : worst;
            bad += argmax_f(a + i * cols, (int32_t)cols) != argmax_f(b + i * cols, (int32_t)cols);
        }
        printf("%s: KL mean %.2e, max %.2e; top-1 mismatches %lld of %lld\n", argv[2], sum / rows, worst,
               (long long)bad, (long long)rows);
        rc = sum / rows <= 1e-3 && worst <= 1e-2 && !bad ? 0 : 1;
        free(a);
        free(b);
        goto done;
    }
    for (int64_t i = 0; i < rows; i++) {
        double mx = 1, d = 0;
        for (int64_t j = 0; j < cols; j++) mx = fmax(mx, fabs(a[i * ps + j * es]));
        for (int64_t j = 0; j < cols; j++) {
            double e = fabs((double)a[i * ps + j * es] - b[i * ps + j * es]);
            if (!(e <= d)) d = e; /* NaN counts as the worst */
        }
        double ratio = isnan(d) ? INFINITY : d / (GOLDEN_TOL * mx);
        if (ratio > worst) worst = ratio;
        if (!(d <= worst_abs)) worst_abs = d;
        if (!(ratio <= 1)) bad++;
    }
    printf("%s: max |diff| %.3g, worst %s at %.4f of the tolerance, %lld of %lld over\n", argv[2], worst_abs,
           by_col ? "column" : "row", worst, (long long)bad, (long long)rows);
    rc = bad ? 1 : 0;
    free(a);
    free(b);
done:
    osp_st_close(rs);
    osp_st_close(os);
    return rc;
}
