/* osprey bench of an embedder (a model without lm_head, or --embed): the
 * tokens per second of embedding N inputs of P tokens (osp_embed_run, rows
 * of one forward, the batch's rows at a time), against the same model's
 * prefill of one input of P tokens alone (its hidden states, no head): the
 * figure the embedder should reach. Random ids of the vocabulary; one warm-up
 * group first. */
#include <stdio.h>
#include <stdlib.h>
#include "cli.h"
#include "core/core.h"
#include "model/embed.h"
#include "osprey.h"

int osp_bench_embed(osp_model *m, int fast, int n_inputs, int p, int batch, int as_json) {
    const osp_model_info *in = osp_model_get_info(m);
    osp_embed_config c = {0};
    osp_session *s = NULL;
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)n_inputs * (size_t)p), **rows = malloc(sizeof *rows * (size_t)n_inputs);
    int32_t *len = malloc(sizeof(int32_t) * (size_t)n_inputs);
    float *out = NULL, *h = malloc(sizeof(float) * (size_t)in->hidden);
    int rc = 1;
    if (!ids || !rows || !len || !h) goto done;
    for (int64_t i = 0; i < (int64_t)n_inputs * p; i++) ids[i] = (int32_t)((i * 7919 + 13) % in->vocab);
    for (int i = 0; i < n_inputs; i++) rows[i] = ids + (int64_t)i * p, len[i] = p;
    if (osp_embed_config_load(m, &c) != OSP_OK || !(out = malloc(sizeof(float) * (size_t)n_inputs * (size_t)c.dims)) ||
        osp_embed_session_new(m, batch, p, &s) != OSP_OK) {
        rc = osp_cli_fail("bench");
        goto done;
    }
    osp_session_set_fast(s, fast);
    if (osp_embed_run(s, &c, (const int32_t *const *)rows, len, batch < n_inputs ? batch : n_inputs, out) != OSP_OK) {
        rc = osp_cli_fail("bench"); /* (the warm-up) */
        goto done;
    }
    /* the prefill of one input alone: the median of 5 */
    double pre[5];
    for (int k = 0; k < 5; k++) {
        int32_t row = 0, pos = p - 1;
        double t0 = osp_now_s();
        if (osp_forward_rows_hidden(s, &row, 1, ids, p, &pos, h) != OSP_OK) {
            rc = osp_cli_fail("bench");
            goto done;
        }
        pre[k] = osp_now_s() - t0;
        osp_session_reset_row(s, 0);
    }
    for (int i = 1; i < 5; i++)
        for (int j = i; j > 0 && pre[j] < pre[j - 1]; j--) {
            double t = pre[j];
            pre[j] = pre[j - 1], pre[j - 1] = t;
        }
    double t0 = osp_now_s();
    if (osp_embed_run(s, &c, (const int32_t *const *)rows, len, n_inputs, out) != OSP_OK) {
        rc = osp_cli_fail("bench");
        goto done;
    }
    double t = osp_now_s() - t0, tok_s = (double)n_inputs * p / t, pre_s = p / pre[2];
    if (as_json)
        printf("{\"model\": \"%s\", \"device\": \"%s\", \"embed_inputs\": %d, \"embed_tokens_per_input\": %d, "
               "\"batch\": %d, \"pooling\": \"%s\", \"embed_s\": %.4f, \"embed_tok_s\": %.1f, \"prefill_tok_s\": %.1f, "
               "\"embed_vs_prefill\": %.4f}\n", in->dir, in->device, n_inputs, p, batch, osp_pooling_name(c.pooling), t,
               tok_s, pre_s, tok_s / pre_s);
    else
        printf("%s on %s: embedding %d inputs of %d tokens (%d rows at a time, %s pooling) in %.2f s: %.1f tokens/s; "
               "the prefill of one input alone %.1f tokens/s (%.1f%%)\n", in->dir, in->device, n_inputs, p, batch,
               osp_pooling_name(c.pooling), t, tok_s, pre_s, 100 * tok_s / pre_s);
    rc = 0;
done:
    osp_session_free(s);
    osp_embed_config_free(&c);
    free(ids), free(rows), free(len), free(out), free(h);
    return rc;
}
