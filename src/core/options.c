/* core/options: the environment parsed once into osp_options (options.h; the table in docs/OPTIONS.md).
 *
 * Every entry below is a name, where it lives in the struct and how its value parses. An off-switch is off
 * only for "0"; a hook is on for any value but "0". Strings point into the environment (or, after
 * osp_options_set, a copy this module keeps for the process's life).
 */
#include "core/options.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

static osp_options opts;
static pthread_once_t once = PTHREAD_ONCE_INIT;

typedef enum { K_STR, K_ON_UNLESS_0, K_ON_IF_SET, K_INT, K_CHOICE } kind;

typedef struct entry {
    const char *name;
    int from_env;         /* 0: a hook osp_options_set alone sets */
    kind k;
    size_t off;           /* the field in osp_options */
    const char *choices;  /* K_CHOICE: "|"-separated words; the value is the word's index, else dflt */
    int dflt;             /* K_ON_UNLESS_0, K_INT, K_CHOICE: the value when unset */
} entry;

#define F(field) offsetof(osp_options, field)
static const entry table[] = {
    {"OSP_DEVICE", 1, K_STR, F(device), NULL, 0},
    {"OSP_ISA", 1, K_STR, F(isa), NULL, 0},
    {"OSP_AMX", 1, K_ON_UNLESS_0, F(amx), NULL, 1},
    {"OSP_BF16T", 1, K_CHOICE, F(bf16t), "0||dot", 1},
    {"OSPREY_MODEL", 1, K_STR, F(model), NULL, 0},
    {"XDG_CACHE_HOME", 1, K_STR, F(cache_home), NULL, 0},
    {"HOME", 1, K_STR, F(home), NULL, 0},
    {"OSP_CHAIN", 1, K_ON_UNLESS_0, F(chain), NULL, 1},
    {"OSP_SERVE_CHAIN", 1, K_CHOICE, F(serve_chain), "0|1", -1},
    {"OSP_CUDA_GRAPHS", 1, K_ON_UNLESS_0, F(cuda_graphs), NULL, 1},
    {"OSP_CUDA_PDL", 1, K_ON_UNLESS_0, F(cuda_pdl), NULL, 1},
    {"OSP_CUDA_FUSE", 1, K_ON_UNLESS_0, F(cuda_fuse), NULL, 1},
    {"OSP_CUDA_MOE", 1, K_CHOICE, F(cuda_moe_host), "|host", 0},
    {"OSP_ATT_NOSCRATCH", 1, K_ON_IF_SET, F(att_noscratch), NULL, 0},
    {"OSP_CUDA_PROFILE_ROWS", 1, K_INT, F(cuda_profile_rows), NULL, 0},
    {"cuda_attention", 0, K_CHOICE, F(cuda_attention), "0|1|2", 0},
};
#undef F

/* the index of word v in "a|b|c", or -1 */
static int choice(const char *choices, const char *v) {
    int i = 0;
    for (const char *p = choices;; i++) {
        const char *bar = strchr(p, '|');
        size_t len = bar ? (size_t)(bar - p) : strlen(p);
        if (strlen(v) == len && !strncmp(p, v, len)) return i;
        if (!bar) return -1;
        p = bar + 1;
    }
}

static void apply(const entry *e, const char *v) {
    void *at = (char *)&opts + e->off;
    if (e->k == K_STR) {
        *(const char **)at = v && *v ? v : NULL;
        return;
    }
    int x = e->dflt;
    if (v) switch (e->k) {
        case K_ON_UNLESS_0: x = strcmp(v, "0") != 0; break;
        case K_ON_IF_SET: x = strcmp(v, "0") != 0; break;
        case K_INT: x = atoi(v); break;
        case K_CHOICE: {
            int c = choice(e->choices, v);
            if (c >= 0) x = c;
            break;
        }
        default: break;
        }
    *(int *)at = x;
}

static void parse(void) {
    for (size_t i = 0; i < sizeof table / sizeof *table; i++)
        apply(&table[i], table[i].from_env ? getenv(table[i].name) : NULL);
}

const osp_options *osp_options_get(void) {
    pthread_once(&once, parse);
    return &opts;
}

osp_status osp_options_set(const char *name, const char *value) {
    pthread_once(&once, parse);
    for (size_t i = 0; i < sizeof table / sizeof *table; i++) {
        if (strcmp(table[i].name, name)) continue;
        const char *v = value;
        if (v && table[i].k == K_STR && !(v = strdup(value))) return osp_err(OSP_ERR_NOMEM, "out of memory");
        apply(&table[i], v);
        return OSP_OK;
    }
    return osp_err(OSP_ERR_INVALID, "no option named %s", name);
}
