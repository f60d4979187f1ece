/* golden_compare GOLDEN_DIR OUT.safetensors: checks `osprey logits` output
 * against golden.safetensors with the goldens' tolerance. Exit 0 = pass. */
#include "golden.h"

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: golden_compare GOLDEN_DIR OUT.safetensors\n");
        return 2;
    }
    golden g;
    if (golden_load(argv[1], &g) != 0) {
        fprintf(stderr, "golden_compare: cannot read %s/golden.safetensors\n", argv[1]);
        return 2;
    }
    osp_st *st;
    if (osp_st_open_file(argv[2], &st) != OSP_OK) {
        fprintf(stderr, "golden_compare: %s\n", osp_last_error());
        return 2;
    }
    const osp_st_tensor *t = osp_st_find(st, "logits");
    if (!t || t->dtype != OSP_DT_F32 || t->ndim != 2 || t->shape[0] != g.T || t->shape[1] != g.vocab) {
        fprintf(stderr, "golden_compare: %s: no F32 logits [%d, %d]\n", argv[2], g.T, g.vocab);
        return 1;
    }
    float *out = malloc(t->nbytes);
    memcpy(out, t->data, t->nbytes);
    double worst = 0;
    int bad = 0;
    for (int32_t p = 0; p < g.T; p++) {
        double r = golden_pos_ratio(g.logits + (int64_t)p * g.vocab, out + (int64_t)p * g.vocab, g.vocab);
        if (r > worst) worst = r;
        if (r > 1) bad++;
    }
    printf("%s: worst position at %.4f of the tolerance, %d of %d positions over\n", argv[1], worst, bad, g.T);
    free(out);
    osp_st_close(st);
    golden_free(&g);
    return bad ? 1 : 0;
}
