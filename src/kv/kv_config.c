/* kv_config.json (OptiQ): per-layer KV-cache quantization, a list of
 * {"layer_idx", "bits", "group_size"}; layers not listed stay full precision. */
#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include "osprey.h"
#include "core/core.h"

osp_status osp_model_kv_config(const osp_model *m, int32_t *bits, int32_t *group, int *found) {
    const osp_model_info *in = osp_model_get_info(m);
    *found = 0;
    char path[4200];
    snprintf(path, sizeof path, "%s/kv_config.json", in->dir);
    if (access(path, F_OK) != 0) return OSP_OK;
    json_error_t je;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    if (!root) return osp_err(OSP_ERR_FORMAT, "%s: %s (line %d)", path, je.text, je.line);
    json_t *list = json_is_object(root) ? json_object_get(root, "layers") : root;
    osp_status rc = OSP_OK;
    if (!json_is_array(list)) {
        rc = osp_err(OSP_ERR_FORMAT, "%s: expected a list of {layer_idx, bits, group_size}", path);
        goto out;
    }
    for (int32_t i = 0; i < in->n_layers; i++) bits[i] = group[i] = 0;
    size_t i;
    json_t *e;
    json_array_foreach(list, i, e) {
        json_t *l = json_object_get(e, "layer_idx"), *b = json_object_get(e, "bits"), *g = json_object_get(e, "group_size");
        if (!json_is_integer(l) || !json_is_integer(b) || (g && !json_is_integer(g))) {
            rc = osp_err(OSP_ERR_FORMAT, "%s: entry %zu needs integer layer_idx and bits (and group_size)", path, i);
            goto out;
        }
        json_int_t li = json_integer_value(l), bv = json_integer_value(b), gv = g ? json_integer_value(g) : 64;
        if (li < 0 || li >= in->n_layers) {
            rc = osp_err(OSP_ERR_FORMAT, "%s: layer_idx %lld outside 0..%d", path, (long long)li, in->n_layers - 1);
            goto out;
        }
        if ((bv != 4 && bv != 8 && bv != 16) || (gv != 32 && gv != 64 && gv != 128)) {
            rc = osp_err(OSP_ERR_UNSUPPORTED, "%s: layer %lld: %lld bits, group %lld; the KV cache supports 4 or 8 "
                         "bits (16 = unquantized, stored as bf16) in groups of 32, 64 or 128", path, (long long)li, (long long)bv,
                         (long long)gv);
            goto out;
        }
        bits[li] = (int32_t)bv;
        group[li] = (int32_t)gv;
    }
    *found = 1;
out:
    json_decref(root);
    return rc;
}
