/* Picks the ops table once from the CPU's features (backend/cpu/features.h). */
#include <stdlib.h>
#include <string.h>
#include "backend/cpu/features.h"
#include "backend/ops.h"

static const osp_ops *chosen;

const osp_ops *osp_ops_get(void) {
    if (chosen) return chosen;
    const osp_cpu_features *f = osp_cpu_features_get();
    const osp_ops *best = osp_ops_scalar();
    if (f->avx2 && osp_ops_avx2()) best = osp_ops_avx2();
    if (f->avx512 && osp_ops_avx512()) best = osp_ops_avx512();
    /* Entries a variant leaves out fall back (vectorized where the CPU can;
     * OSP_ISA=avx2 runs exactly what a CPU without AVX-512 runs). */
    static osp_ops table;
    table = *best;
    int vec = f->avx512 && best != osp_ops_scalar();
    if (!table.wsum) table.wsum = vec ? osp_wsum_avx512 : osp_ops_scalar()->wsum;
    if (!table.scores) table.scores = vec ? osp_scores_avx512 : osp_ops_scalar()->scores;
    if (!table.argmax) table.argmax = vec ? osp_argmax_avx512 : osp_ops_scalar()->argmax;
    if (!table.select_ge) table.select_ge = vec ? osp_select_ge_avx512 : osp_ops_scalar()->select_ge;
    chosen = &table;
    return chosen;
}
