/* backend/moe_route: the routed experts' choice on the host, shared by the backends that route there (the CPU's
 * moe, the GPU's reference path): a token's top_k experts by probability, ties to the lower index, their weights
 * renormalized to sum 1 and scaled per expert (osp_moe_args). */
#include "backend/backend.h"

void osp_moe_route_topk(const float *p, int64_t E, int64_t K, const float *per_expert_scale, int32_t *idx, float *w) {
    float sum = 0;
    for (int64_t k = 0; k < K; k++) {
        int64_t best = -1;
        for (int64_t e = 0; e < E; e++) {
            int taken = 0;
            for (int64_t j = 0; j < k; j++) taken |= idx[j] == e;
            if (!taken && (best < 0 || p[e] > p[best])) best = e;
        }
        idx[k] = (int32_t)best;
        w[k] = p[best];
        sum += p[best];
    }
    for (int64_t k = 0; k < K; k++) w[k] = w[k] / sum * per_expert_scale[idx[k]];
}
