/* libFuzzer: config.json parsing (model/config) on arbitrary JSON text. */
#include <jansson.h>
#include <stdint.h>
#include <string.h>
#include "model/config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    json_t *root = json_loadb((const char *)data, size, JSON_REJECT_DUPLICATES, NULL);
    if (!root) return 0;
    osp_config c;
    memset(&c, 0, sizeof c); /* as osp_config_load: parse fills it, free releases it either way */
    osp_config_parse(root, "fuzz/config.json", &c);
    osp_config_free(&c);
    json_decref(root);
    return 0;
}
