/* osprey generate: greedy continuation of a list of token ids (text
 * arrives with the tokenizer). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli.h"
#include "core/core.h"
#include "osprey.h"

static int usage(void) {
    fprintf(stderr, "usage: osprey generate [--model MODEL] --ids 1,2,3 [-n N] [-t THREADS] [--precise]\n");
    return 2;
}

static int argmax(const float *x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

int osp_cmd_generate(int argc, char **argv) {
    const char *model = NULL, *ids_s = NULL;
    int n = 16, threads = 0, fast = 1;
    for (int i = 1; i < argc; i++) {
        if ((!strcmp(argv[i], "--model") || !strcmp(argv[i], "-m")) && i + 1 < argc) model = argv[++i];
        else if (!strcmp(argv[i], "--ids") && i + 1 < argc) ids_s = argv[++i];
        else if ((!strcmp(argv[i], "-n") || !strcmp(argv[i], "--max-tokens")) && i + 1 < argc) n = atoi(argv[++i]);
        else if ((!strcmp(argv[i], "-t") || !strcmp(argv[i], "--threads")) && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--precise")) fast = 0;
        else return usage();
    }
    if (!model) model = osp_cli_default_model();
    if (!model || !ids_s || n < 0) return usage();
    int cap = 1;
    for (const char *p = ids_s; *p; p++) cap += *p == ',';
    int32_t *ids = malloc(sizeof(int32_t) * cap);
    int np = 0;
    for (char *p = (char *)ids_s, *end; *p; p = end + (*end == ',')) {
        long v = strtol(p, &end, 10);
        if (end == p || (*end && *end != ',')) {
            free(ids);
            fprintf(stderr, "osprey generate: --ids must be comma-separated integers\n");
            return 2;
        }
        ids[np++] = (int32_t)v;
    }
    osp_set_threads(threads);
    osp_model *m;
    if (osp_model_load(model, &m) != OSP_OK) {
        free(ids);
        return osp_cli_fail("generate");
    }
    const osp_model_info *in = osp_model_get_info(m);
    osp_session *s = NULL;
    float *logits = malloc(sizeof(float) * in->vocab);
    int rc = 0;
    if (osp_session_new(m, 1, np + n, &s) == OSP_OK) osp_session_set_fast(s, fast);
    if (!s || osp_forward(s, ids, np, 0, logits) != OSP_OK) {
        rc = osp_cli_fail("generate");
    } else {
        double t0 = osp_now_s();
        for (int i = 0; i < n; i++) {
            int32_t tok = argmax(logits, in->vocab);
            printf(i ? ",%d" : "%d", tok);
            fflush(stdout);
            if (i + 1 < n && osp_forward(s, &tok, 1, 0, logits) != OSP_OK) {
                rc = osp_cli_fail("generate");
                break;
            }
        }
        printf("\n");
        double dt = osp_now_s() - t0;
        if (n > 1) fprintf(stderr, "decode: %d tokens, %.2f tok/s\n", n, (n - 1) / dt);
    }
    free(logits);
    free(ids);
    osp_session_free(s);
    osp_model_free(m);
    return rc;
}
