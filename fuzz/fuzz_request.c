/* libFuzzer: a request body → a job (server/request), as /v1/chat/completions
 * and /v1/completions parse it, over the bundled model with its own chat
 * template and with a Qwen-style tool template (FUZZ_TOOL_TEMPLATE, default
 * tests/e2e/tools_template.jinja), so that tools, tool_choice and forced
 * tool calls are reached. The first byte: bit 0 the template; bit 1
 * completions, else bit 2 the translated chat of the other routes, whose
 * refusal's reason is checked. Run from the repository root. */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "server/server_internal.h"

static srv *servers[2];

static srv *make(const char *template_file) {
    srv *s = calloc(1, sizeof *s);
    osp_serve_config_defaults(&s->cfg);
    s->cfg.model = getenv("FUZZ_MODEL") ? getenv("FUZZ_MODEL") : "models/fortune";
    s->cfg.chat_template = template_file;
    s->cfg.parallel = 1;
    s->cfg.ctx = 512;
    s->cfg.log_level = 0;
    osp_log_level = 0;
    srv_model_name(s->cfg.model, s->model_name, sizeof s->model_name);
    if (srv_setup(s)) abort();
    return s;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    const char *tt = getenv("FUZZ_TOOL_TEMPLATE");
    servers[0] = make(NULL);
    servers[1] = make(tt ? tt : "tests/e2e/tools_template.jinja");
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!size) return 0;
    json_t *body = json_loadb((const char *)data + 1, size - 1, JSON_REJECT_DUPLICATES, NULL);
    if (!body) return 0;
    srv *s = servers[data[0] & 1];
    int status = 0;
    json_t *err = NULL;
    srv_reject why = {0};
    srv_job *j = (data[0] & 2)   ? srv_parse_completion(s, body, &status, &err)
                 : (data[0] & 4) ? srv_parse_translated(s, json_incref(body), 0, &status, &err, &why)
                                 : srv_parse_chat(s, body, &status, &err);
    if (why.reason == SRV_REJECT_OVER_CONTEXT && (j || status != 400 || why.ctx != s->ctx || why.n_prompt < why.ctx))
        __builtin_trap(); /* the reason a route words its own way matches the refusal */
    if (j) {
        if (j->n_prompt <= 0 || j->n_prompt >= s->ctx || j->gp.max_tokens <= 0 ||
            j->n_prompt + j->gp.max_tokens > s->ctx)
            __builtin_trap(); /* a job must fit the context */
        srv_job_release(j);
    } else {
        if (status < 400 || status > 599 || !json_is_object(json_object_get(err, "error"))) __builtin_trap();
        json_decref(err);
    }
    json_decref(body);
    return 0;
}
