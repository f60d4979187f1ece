#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>
#include <string.h>
#include <jansson.h>
#include "cli.h"
#include "core/core.h"
#include "core/options.h"
#include "osprey.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

#ifndef OSP_SOURCE_DIR
#define OSP_SOURCE_DIR "."
#endif

/* The bundled model: OSPREY_MODEL, else models/fortune next to the binary's
 * source tree or install prefix. */
const char *osp_cli_default_model(void) {
    static char path[4096];
    const char *env = osp_options_get()->model;
    if (env) return env;
    const char *cands[] = {OSP_SOURCE_DIR "/models/fortune", "models/fortune", "/usr/local/share/osprey/models/fortune"};
    struct stat sb;
    for (size_t i = 0; i < sizeof cands / sizeof *cands; i++) {
        snprintf(path, sizeof path, "%s/config.json", cands[i]);
        if (stat(path, &sb) == 0) {
            snprintf(path, sizeof path, "%s", cands[i]);
            return path;
        }
    }
    return NULL;
}

int osp_cli_sampling_flag(osp_cli_sampling *s, const char *f, const char *v) {
    if (!v) return 0;
    if (!strcmp(f, "--temp") || !strcmp(f, "--temperature")) s->temp = (float)atof(v);
    else if (!strcmp(f, "--top-p")) s->top_p = (float)atof(v);
    else if (!strcmp(f, "--top-k")) s->top_k = atoi(v);
    else if (!strcmp(f, "--min-p")) s->min_p = (float)atof(v);
    else if (!strcmp(f, "--repeat-penalty")) s->rep = (float)atof(v);
    else if (!strcmp(f, "--seed")) s->seed = atoll(v);
    else return 0;
    return 1;
}

void osp_cli_sampling_apply(const osp_cli_sampling *s, osp_gen_params *p) {
    if (s->temp >= 0) p->sampler.temperature = s->temp;
    if (s->top_p >= 0) p->sampler.top_p = s->top_p;
    if (s->top_k >= 0) p->sampler.top_k = s->top_k;
    if (s->min_p >= 0) p->sampler.min_p = s->min_p;
    if (s->rep >= 0) p->sampler.repetition_penalty = s->rep;
    p->sampler.seed = s->seed >= 0 ? (uint64_t)s->seed : (uint64_t)(osp_now_s() * 1e6);
}

int osp_cli_device_flag(const char *cmd, const char *f, const char *v, int *device) {
    int ngl = !strcmp(f, "-ngl") || !strcmp(f, "--n-gpu-layers") || !strcmp(f, "--gpu-layers");
    if (strcmp(f, "--device") != 0 && !ngl) return 0;
    if (!v) {
        fprintf(stderr, "osprey %s: %s needs a value\n", cmd, f);
        return -1;
    }
    if (ngl) {
        char *end;
        long n = strtol(v, &end, 10);
        if (!*v || *end || n < -1) {
            fprintf(stderr, "osprey %s: %s expects a layer count, got '%s'\n", cmd, f, v);
            return -1;
        }
        *device = n == 0 ? OSP_DEVICE_CPU : OSP_DEVICE_CUDA; /* -1 (llama.cpp: all layers) too */
        return 1;
    }
    if (!strcmp(v, "cpu")) *device = OSP_DEVICE_CPU;
    else if (!strcmp(v, "cuda") || !strcmp(v, "gpu")) *device = OSP_DEVICE_CUDA;
    else if (!strcmp(v, "auto")) *device = OSP_DEVICE_AUTO;
    else {
        fprintf(stderr, "osprey %s: --device expects cpu, cuda or auto, got '%s'\n", cmd, v);
        return -1;
    }
    return 1;
}

/* A prompt as token ids: through the model's chat template (with an optional
 * system turn) or encoded with the tokenizer's special tokens. */
int osp_cli_prompt_ids(const char *dir, const osp_tokenizer *tok, const char *system, const char *prompt, int chat,
                       int32_t **ids, int *n) {
    size_t nn = 0;
    osp_status rc;
    *ids = NULL;
    if (chat) {
        osp_chat_template *ct;
        if (osp_chat_template_load(dir, NULL, &ct) != OSP_OK) return -1;
        json_t *msgs = json_array();
        if (system) json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", "system", "content", system));
        json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", "user", "content", prompt));
        char *text = NULL;
        size_t len = 0;
        rc = osp_chat_template_render(ct, msgs, NULL, 1, NULL, NULL, &text, &len);
        if (rc == OSP_OK) rc = osp_tokenizer_encode_alloc(tok, text, len, 0, ids, &nn);
        osp_free(text);
        json_decref(msgs);
        osp_chat_template_free(ct);
    } else {
        rc = osp_tokenizer_encode_alloc(tok, prompt, strlen(prompt), 1, ids, &nn);
    }
    *n = (int)nn;
    if (rc == OSP_OK && nn == 0) osp_err(OSP_ERR_INVALID, "the prompt is empty");
    return rc == OSP_OK && nn > 0 ? 0 : -1;
}
