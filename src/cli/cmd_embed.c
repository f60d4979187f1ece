/* osprey embed: embeddings of texts as JSON lines, {"index", "embedding"}
 * (model/embed.h: pooling from the folder's sentence-transformers files,
 * L2-normalized; --dimensions: Matryoshka truncation, renormalized). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli.h"
#include "core/core.h"
#include "model/embed.h"
#include "osprey.h"
#include "text/tokenizer.h"

static int usage(void) {
    fprintf(stderr, "usage: osprey embed --model M (--input TEXT ... | -f FILE) [--dimensions N] [--batch N] [--fast]\n"
                    "                    [-t THREADS] [--device cpu|cuda|auto]\n"
                    "  one JSON line per input: {\"index\": i, \"embedding\": [...]}\n"
                    "  -f FILE: one input per line (empty lines skipped); --input may be repeated\n"
                    "  --dimensions N: the first N values, renormalized (Matryoshka models only)\n"
                    "  --batch N: inputs run together as rows of one forward (default 8)\n"
                    "  --fast: the production path (as the server) instead of reference precision\n");
    return 2;
}

/* FILE's non-empty lines, appended to texts */
static int read_lines(const char *path, char ***texts, int *n) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "osprey embed: cannot open %s\n", path);
        return -1;
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t k;
    int rc = 0;
    while ((k = getline(&line, &cap, f)) >= 0) {
        while (k > 0 && (line[k - 1] == '\n' || line[k - 1] == '\r')) line[--k] = 0;
        if (!k) continue;
        char **t = realloc(*texts, sizeof *t * (size_t)(*n + 1));
        if (!t || !(t[*n] = strdup(line))) {
            if (t) *texts = t;
            rc = -1;
            break;
        }
        *texts = t;
        (*n)++;
    }
    free(line);
    fclose(f);
    return rc;
}

static void print_embedding(int i, const float *v, int32_t d) {
    printf("{\"index\": %d, \"embedding\": [", i);
    for (int32_t j = 0; j < d; j++) printf("%s%.9g", j ? ", " : "", v[j]);
    printf("]}\n");
}

int osp_cmd_embed(int argc, char **argv) {
    const char *model = NULL;
    char **texts = NULL;
    int n = 0, device = OSP_DEVICE_AUTO, threads = 0, batch = 8, dims = 0, fast = 0, rc = 1;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int dv = osp_cli_device_flag("embed", f, v, &device);
        if (dv < 0) return 2;
        if (dv) {
            i++;
            continue;
        }
        if (!strcmp(f, "--fast")) {
            fast = 1;
            continue;
        }
        if (!v) return usage();
        if (!strcmp(f, "--model") || !strcmp(f, "-m")) model = v, i++;
        else if (!strcmp(f, "--input")) {
            char **t = realloc(texts, sizeof *t * (size_t)(n + 1));
            if (!t) return 1;
            texts = t, texts[n++] = strdup(v), i++;
        } else if (!strcmp(f, "-f") || !strcmp(f, "--file")) {
            if (read_lines(v, &texts, &n)) return 1;
            i++;
        } else if (!strcmp(f, "--dimensions")) dims = atoi(v), i++;
        else if (!strcmp(f, "--batch")) batch = atoi(v), i++;
        else if (!strcmp(f, "-t") || !strcmp(f, "--threads")) threads = atoi(v), i++;
        else return usage();
    }
    if (!model || !n || batch < 1) return usage();
    if (threads) osp_set_threads(threads);

    osp_model *m = NULL;
    osp_tokenizer *tok = NULL;
    osp_session *s = NULL;
    osp_embed_config ec = {0};
    int32_t **ids = calloc((size_t)n, sizeof *ids), *len = calloc((size_t)n, sizeof *len), maxlen = 0;
    float *out = NULL;
    osp_model_params p = {.device = (osp_device)device, .place = 1};
    if (!ids || !len) goto done;
    if (osp_model_load_params(model, &p, &m) != OSP_OK || osp_tokenizer_load(osp_model_get_info(m)->dir, &tok) != OSP_OK ||
        osp_embed_config_load(m, &ec) != OSP_OK || (dims && osp_embed_check_dims(&ec, dims) != OSP_OK)) {
        rc = osp_cli_fail("embed");
        goto done;
    }
    if (!dims) dims = ec.dims;
    for (int i = 0; i < n; i++) {
        size_t k = 0;
        if (osp_tokenizer_encode_alloc(tok, texts[i], strlen(texts[i]), 1, &ids[i], &k) != OSP_OK) {
            rc = osp_cli_fail("embed");
            goto done;
        }
        len[i] = (int32_t)k;
        maxlen = len[i] > maxlen ? len[i] : maxlen;
    }
    int32_t ctx = osp_model_get_info(m)->max_ctx;
    if (maxlen > ctx || maxlen < 1) {
        fprintf(stderr, "osprey embed: an input has %d tokens: the context is %d\n", maxlen, ctx);
        goto done;
    }
    out = malloc(sizeof(float) * (size_t)n * (size_t)ec.dims);
    if (!out || osp_embed_session_new(m, n < batch ? n : batch, maxlen, &s) != OSP_OK) {
        rc = osp_cli_fail("embed");
        goto done;
    }
    osp_session_set_fast(s, fast);
    if (osp_embed_run(s, &ec, (const int32_t *const *)ids, len, n, out) != OSP_OK) {
        rc = osp_cli_fail("embed");
        goto done;
    }
    for (int i = 0; i < n; i++) {
        float *v = out + (size_t)i * ec.dims;
        osp_embed_finish(&ec, v, dims);
        print_embedding(i, v, dims);
    }
    rc = 0;
done:
    for (int i = 0; i < n; i++) {
        free(texts[i]);
        if (ids) osp_free(ids[i]);
    }
    free(texts), free(ids), free(len), free(out);
    osp_session_free(s);
    osp_embed_config_free(&ec);
    osp_tokenizer_free(tok);
    osp_model_free(m);
    return rc;
}
