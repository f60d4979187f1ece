/* backend/cpu/features: cpuid once (see features.h). */
#include "backend/cpu/features.h"
#include "core/options.h"
#include <cpuid.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

static osp_cpu_features feats;
static pthread_once_t once = PTHREAD_ONCE_INIT;

/* F16C from cpuid leaf 1 (ECX bit 29): clang's __builtin_cpu_supports does not know "f16c". */
static int has_f16c(void) {
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29));
}

static void detect(void) {
    __builtin_cpu_init();
    feats.avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && has_f16c();
    feats.avx512 = feats.avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                   __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
    feats.vnni = feats.avx512 && __builtin_cpu_supports("avx512vnni");
    const char *want = osp_options_get()->isa;
    feats.forced = want;
    if (want && !strcmp(want, "scalar")) feats.avx2 = feats.avx512 = feats.vnni = 0;
    else if (want && !strcmp(want, "avx2")) feats.avx512 = feats.vnni = 0;
}

const osp_cpu_features *osp_cpu_features_get(void) {
    pthread_once(&once, detect);
    return &feats;
}
