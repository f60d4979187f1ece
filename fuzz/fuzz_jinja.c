/* libFuzzer: the Jinja engine (text/jinja) on arbitrary template source,
 * rendered with a chat-like set of variables under the default limits. */
#include <jansson.h>
#include <stdint.h>
#include "text/jinja.h"

static json_t *vars;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    vars = json_loads("{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"},"
                      " {\"role\": \"user\", \"content\": \"Hi <b>there</b>\"},"
                      " {\"role\": \"assistant\", \"content\": null, \"tool_calls\": [{\"id\": \"c1\", \"type\": \"function\","
                      "   \"function\": {\"name\": \"f\", \"arguments\": {\"x\": [1, 2.5, \"s\", null, true]}}}]},"
                      " {\"role\": \"tool\", \"content\": \"42\"}],"
                      " \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {}}}],"
                      " \"add_generation_prompt\": true, \"bos_token\": \"<s>\", \"eos_token\": \"</s>\","
                      " \"enable_thinking\": false, \"n\": 3, \"s\": \"abc\", \"d\": {\"k\": 1}}",
                      0, NULL);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    osp_jinja_template *t;
    if (osp_jinja_parse((const char *)data, size, &t) != OSP_OK) return 0;
    osp_jinja_options o = {0};
    o.max_output = 1 << 20;
    o.max_steps = 200000;
    char *out = NULL;
    size_t len = 0;
    if (osp_jinja_render(t, vars, &o, &out, &len) == OSP_OK) osp_free(out);
    osp_jinja_free(t);
    return 0;
}
