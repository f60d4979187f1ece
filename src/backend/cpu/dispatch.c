/* Picks the ops table once from cpuid (or OSP_ISA). */
#include <cpuid.h>
#include <stdlib.h>
#include <string.h>
#include "backend/ops.h"

static const osp_ops *chosen;

static int has_avx512(void) {
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
}

/* F16C from cpuid leaf 1 (ECX bit 29): clang's __builtin_cpu_supports does not know "f16c". */
static int has_f16c(void) {
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29));
}

static int has_avx2(void) {
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && has_f16c();
}

const osp_ops *osp_ops_get(void) {
    if (chosen) return chosen;
    __builtin_cpu_init();
    const char *want = getenv("OSP_ISA");
    const osp_ops *best = osp_ops_scalar();
    if (has_avx2() && osp_ops_avx2()) best = osp_ops_avx2();
    if (has_avx512() && osp_ops_avx512()) best = osp_ops_avx512();
    if (want && strcmp(want, "scalar") == 0) best = osp_ops_scalar();
    else if (want && strcmp(want, "avx2") == 0 && has_avx2() && osp_ops_avx2()) best = osp_ops_avx2();
    /* Entries a variant leaves out fall back (vectorized where the CPU can). */
    static osp_ops table;
    table = *best;
    int vec = has_avx512() && best != osp_ops_scalar();
    if (!table.wsum) table.wsum = vec ? osp_wsum_avx512 : osp_ops_scalar()->wsum;
    if (!table.scores) table.scores = vec ? osp_scores_avx512 : osp_ops_scalar()->scores;
    if (!table.argmax) table.argmax = vec ? osp_argmax_avx512 : osp_ops_scalar()->argmax;
    if (!table.select_ge) table.select_ge = vec ? osp_select_ge_avx512 : osp_ops_scalar()->select_ge;
    chosen = &table;
    return chosen;
}
