/* core/json_get: reading optional config values (jansson), header-only. */
#ifndef OSP_JSON_GET_H
#define OSP_JSON_GET_H

#include <jansson.h>

static inline double osp_json_num(const json_t *o, const char *k, double def) {
    json_t *v = json_object_get(o, k);
    return json_is_number(v) ? json_number_value(v) : def;
}

static inline int osp_json_int(const json_t *o, const char *k, int def) {
    json_t *v = json_object_get(o, k);
    return json_is_integer(v) ? (int)json_integer_value(v) : def;
}

static inline const char *osp_json_str(const json_t *o, const char *k) { return json_string_value(json_object_get(o, k)); }

#endif
