#define _GNU_SOURCE
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "sampler.h"
#include "backend/ops.h"

struct osp_sampler {
    osp_sampler_params p;
    int32_t vocab;
    osp_bias *bias;
    int32_t *exempt;
    uint64_t rng;
    int32_t *idx;      /* [vocab] selection scratch */
    int32_t *idx2;     /* [vocab] */
    uint32_t *mark;    /* [vocab] stamps to apply a penalty once per token */
    uint32_t stamp;
    float *probs;      /* [vocab] */
};

osp_sampler_params osp_sampler_defaults(void) {
    osp_sampler_params p;
    memset(&p, 0, sizeof p);
    p.min_tokens_to_keep = 1;
    p.xtc_threshold = 0.1f;
    p.repetition_context = p.presence_context = p.frequency_context = 20;
    return p;
}

osp_status osp_sampler_new(const osp_sampler_params *p, int32_t vocab, osp_sampler **out) {
    *out = NULL;
    if (vocab <= 0) return osp_err(OSP_ERR_INVALID, "sampler: empty vocabulary");
    if (!(p->temperature >= 0) || !isfinite(p->temperature))
        return osp_err(OSP_ERR_INVALID, "temperature must be a finite number >= 0");
    if (!(p->top_p >= 0 && p->top_p <= 1)) return osp_err(OSP_ERR_INVALID, "top_p must be in [0, 1]");
    if (!(p->min_p >= 0 && p->min_p <= 1)) return osp_err(OSP_ERR_INVALID, "min_p must be in [0, 1]");
    if (p->min_tokens_to_keep < 1) return osp_err(OSP_ERR_INVALID, "min_tokens_to_keep must be >= 1");
    if (p->top_k < 0) return osp_err(OSP_ERR_INVALID, "top_k must be >= 0");
    if (!(p->xtc_probability >= 0 && p->xtc_probability <= 1))
        return osp_err(OSP_ERR_INVALID, "xtc_probability must be in [0, 1]");
    if (!(p->xtc_threshold >= 0 && p->xtc_threshold <= 0.5f))
        return osp_err(OSP_ERR_INVALID, "xtc_threshold must be in [0, 0.5]");
    if (!(p->repetition_penalty >= 0) || !isfinite(p->repetition_penalty))
        return osp_err(OSP_ERR_INVALID, "repetition_penalty must be a finite number >= 0");
    if (!isfinite(p->presence_penalty) || !isfinite(p->frequency_penalty))
        return osp_err(OSP_ERR_INVALID, "presence/frequency penalties must be finite");
    if (p->repetition_context < 0 || p->presence_context < 0 || p->frequency_context < 0)
        return osp_err(OSP_ERR_INVALID, "penalty context sizes must be >= 0");
    for (int32_t i = 0; i < p->n_logit_bias; i++)
        if (p->logit_bias[i].token < 0 || p->logit_bias[i].token >= vocab || !isfinite(p->logit_bias[i].bias))
            return osp_err(OSP_ERR_INVALID, "logit_bias: token %d is outside the vocabulary or its bias is not finite",
                           p->logit_bias[i].token);
    osp_sampler *s = calloc(1, sizeof *s);
    if (!s) return osp_err(OSP_ERR_NOMEM, "out of memory");
    s->p = *p;
    s->vocab = vocab;
    s->idx = malloc(sizeof(int32_t) * vocab);
    s->idx2 = malloc(sizeof(int32_t) * vocab);
    s->mark = calloc((size_t)vocab, sizeof(uint32_t));
    s->probs = malloc(sizeof(float) * vocab);
    s->bias = p->n_logit_bias ? malloc(sizeof(osp_bias) * p->n_logit_bias) : NULL;
    s->exempt = p->n_xtc_exempt ? malloc(sizeof(int32_t) * p->n_xtc_exempt) : NULL;
    if (!s->idx || !s->idx2 || !s->mark || !s->probs || (p->n_logit_bias && !s->bias) ||
        (p->n_xtc_exempt && !s->exempt)) {
        osp_sampler_free(s);
        return osp_err(OSP_ERR_NOMEM, "out of memory");
    }
    if (p->n_logit_bias) memcpy(s->bias, p->logit_bias, sizeof(osp_bias) * p->n_logit_bias);
    if (p->n_xtc_exempt) memcpy(s->exempt, p->xtc_exempt, sizeof(int32_t) * p->n_xtc_exempt);
    s->p.logit_bias = s->bias;
    s->p.xtc_exempt = s->exempt;
    s->rng = p->seed ^ 0x9e3779b97f4a7c15ull;
    *out = s;
    return OSP_OK;
}

void osp_sampler_free(osp_sampler *s) {
    if (!s) return;
    free(s->idx);
    free(s->idx2);
    free(s->mark);
    free(s->probs);
    free(s->bias);
    free(s->exempt);
    free(s);
}

/* splitmix64: a small, well-mixed stream; 53 bits make the double. */
double osp_sampler_uniform(osp_sampler *s) {
    uint64_t z = (s->rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (double)(z >> 11) * (1.0 / 9007199254740992.0);
}

/* ---- partial selection ---- */

/* Total order: larger value first, then lower index. Callers pass no NaN
 * (osp_sampler_sample turns NaN logits into -inf first). */
static inline int before(const float *x, int32_t a, int32_t b) {
    return x[a] > x[b] || (x[a] == x[b] && a < b);
}

static int cmp_before(const void *a, const void *b, void *x) {
    int32_t ia = *(const int32_t *)a, ib = *(const int32_t *)b;
    return before(x, ia, ib) ? -1 : before(x, ib, ia) ? 1 : 0;
}

static void sort_idx(const float *x, int32_t *v, int32_t n) {
    qsort_r(v, (size_t)n, sizeof *v, cmp_before, (void *)x);
}

/* Min-heap (by the total order) of the k best so far: one comparison
 * rejects most elements, so small k costs about one pass over x. */
static void heap_down(const float *x, int32_t *h, int32_t k, int32_t i) {
    for (;;) {
        int32_t l = 2 * i + 1, r = l + 1, w = i;
        if (l < k && before(x, h[w], h[l])) w = l; /* h[w] must be the worst: "after" the others */
        if (r < k && before(x, h[w], h[r])) w = r;
        if (w == i) return;
        int32_t t = h[i];
        h[i] = h[w];
        h[w] = t;
        i = w;
    }
}

/* The k best among the candidate indices cand[0..n), sorted, into idx. */
static void top_k_among(const float *x, const int32_t *cand, int32_t n, int32_t k, int32_t *idx) {
    for (int32_t i = 0; i < k; i++) idx[i] = cand[i];
    for (int32_t i = k / 2 - 1; i >= 0; i--) heap_down(x, idx, k, i);
    for (int32_t i = k; i < n; i++) {
        if (!before(x, cand[i], idx[0])) continue;
        idx[0] = cand[i];
        heap_down(x, idx, k, 0);
    }
    sort_idx(x, idx, k);
}

static void top_k_heap(const float *x, int64_t n, int32_t k, int32_t *idx) {
    for (int32_t i = 0; i < k; i++) idx[i] = i;
    for (int32_t i = k / 2 - 1; i >= 0; i--) heap_down(x, idx, k, i);
    for (int64_t i = k; i < n; i++) {
        if (!before(x, (int32_t)i, idx[0])) continue; /* not better than the worst kept */
        idx[0] = (int32_t)i;
        heap_down(x, idx, k, 0);
    }
    sort_idx(x, idx, k);
}

void osp_top_k_indices(const float *x, int64_t n, int32_t k, int32_t *idx, int32_t *v) {
    if (k <= 0) return;
    if (k > n) k = (int32_t)n;
    if (k <= 512) {
        top_k_heap(x, n, k, idx);
        return;
    }
    for (int32_t i = 0; i < n; i++) v[i] = i;
    /* quickselect: afterwards v[0..k) holds the k first in the total order */
    int32_t lo = 0, hi = (int32_t)n - 1;
    while (lo < hi) {
        int32_t piv = v[lo + (hi - lo) / 2], i = lo, j = hi;
        while (i <= j) {
            while (before(x, v[i], piv)) i++;
            while (before(x, piv, v[j])) j--;
            if (i <= j) {
                int32_t t = v[i];
                v[i] = v[j];
                v[j] = t;
                i++;
                j--;
            }
        }
        if (k - 1 <= j) hi = j;
        else if (k - 1 >= i) lo = i;
        else break;
    }
    sort_idx(x, v, k);
    memcpy(idx, v, sizeof(int32_t) * k);
}

/* ---- processors ---- */

static void next_stamp(osp_sampler *s) {
    if (++s->stamp == 0) { /* wrapped: clear */
        memset(s->mark, 0, sizeof(uint32_t) * s->vocab);
        s->stamp = 1;
    }
}

static void apply_processors(osp_sampler *s, float *l, const int32_t *h, int64_t nh) {
    const osp_sampler_params *p = &s->p;
    for (int32_t i = 0; i < p->n_logit_bias; i++) l[p->logit_bias[i].token] += p->logit_bias[i].bias;
    if (p->repetition_penalty != 0 && p->repetition_penalty != 1 && p->repetition_context > 0) {
        next_stamp(s);
        int64_t from = nh > p->repetition_context ? nh - p->repetition_context : 0;
        for (int64_t i = from; i < nh; i++) {
            int32_t t = h[i];
            if (t < 0 || t >= s->vocab || s->mark[t] == s->stamp) continue;
            s->mark[t] = s->stamp;
            l[t] = l[t] < 0 ? l[t] * p->repetition_penalty : l[t] / p->repetition_penalty;
        }
    }
    if (p->presence_penalty != 0 && p->presence_context > 0) {
        next_stamp(s);
        int64_t from = nh > p->presence_context ? nh - p->presence_context : 0;
        for (int64_t i = from; i < nh; i++) {
            int32_t t = h[i];
            if (t < 0 || t >= s->vocab || s->mark[t] == s->stamp) continue;
            s->mark[t] = s->stamp;
            l[t] -= p->presence_penalty;
        }
    }
    if (p->frequency_penalty != 0 && p->frequency_context > 0) {
        int64_t from = nh > p->frequency_context ? nh - p->frequency_context : 0;
        for (int64_t i = from; i < nh; i++)
            if (h[i] >= 0 && h[i] < s->vocab) l[h[i]] -= p->frequency_penalty;
    }
}

int osp_sampler_is_argmax(const osp_sampler_params *p) {
    /* apply_processors changes nothing, and osp_sampler_sample goes straight to ops->argmax */
    return p->temperature == 0 && p->n_logit_bias == 0 &&
           !(p->repetition_penalty != 0 && p->repetition_penalty != 1 && p->repetition_context > 0) &&
           !(p->presence_penalty != 0 && p->presence_context > 0) &&
           !(p->frequency_penalty != 0 && p->frequency_context > 0);
}

static void log_softmax(float *l, int32_t n) {
    float mx = -INFINITY;
    for (int32_t i = 0; i < n; i++) {
        if (isnan(l[i])) l[i] = -INFINITY;
        mx = l[i] > mx ? l[i] : mx;
    }
    float sum = 0; /* f32 terms in [0, 1], vectorizable */
    for (int32_t i = 0; i < n; i++) sum += expf(l[i] - mx);
    float lse = mx + logf(sum);
    for (int32_t i = 0; i < n; i++) l[i] -= lse;
}

static int32_t argmax(const float *x, int32_t n) {
    int32_t b = 0;
    for (int32_t i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* ---- filters (on logprobs; removed tokens become -inf) ---- */

/* Keep the most likely tokens while the probability mass strictly above
 * each is < top_p (mlx-lm: ascending cumulative mass > 1 - top_p). */
/* Number of tokens top_p keeps (they are the first ones in s->idx, sorted),
 * or `limit` when it keeps at least that many (then only the first `limit`
 * are selected: top_k will cut there anyway). */
static int32_t top_p_count(osp_sampler *s, const float *lp, int32_t limit) {
    int32_t V = s->vocab, m = V < 64 ? V : 64;
    if (m > limit) m = limit;
    for (;;) {
        osp_top_k_indices(lp, V, m, s->idx, s->idx2);
        double above = 0;
        for (int32_t i = 0; i < m; i++) {
            if (above >= s->p.top_p) return i;
            above += exp((double)lp[s->idx[i]]);
        }
        if (m >= limit) return limit;
        m = m * 8 < limit ? m * 8 : limit;
    }
}


static void filter_top_p(osp_sampler *s, float *lp) {
    int32_t V = s->vocab, m = V < 256 ? V : 256;
    for (;;) {
        osp_top_k_indices(lp, V, m, s->idx, s->idx2);
        double above = 0;
        int32_t keep = -1;
        for (int32_t i = 0; i < m; i++) {
            if (above >= s->p.top_p) {
                keep = i;
                break;
            }
            above += exp((double)lp[s->idx[i]]);
        }
        if (keep < 0 && m < V) {
            m = m * 8 < V ? m * 8 : V;
            continue;
        }
        if (keep < 0) return; /* everything kept */
        /* mark kept, mask the rest */
        next_stamp(s);
        for (int32_t i = 0; i < keep; i++) s->mark[s->idx[i]] = s->stamp;
        for (int32_t i = 0; i < V; i++)
            if (s->mark[i] != s->stamp) lp[i] = -INFINITY;
        return;
    }
}

static void filter_min_p(osp_sampler *s, float *lp) {
    int32_t V = s->vocab;
    float mx = -INFINITY;
    for (int32_t i = 0; i < V; i++) mx = lp[i] > mx ? lp[i] : mx;
    float thr = mx + logf(s->p.min_p);
    int32_t k = s->p.min_tokens_to_keep;
    if (k > 1) {
        osp_top_k_indices(lp, V, k, s->idx, s->idx2);
        next_stamp(s);
        for (int32_t i = 0; i < k && i < V; i++) s->mark[s->idx[i]] = s->stamp;
    }
    for (int32_t i = 0; i < V; i++)
        if (lp[i] < thr && !(k > 1 && s->mark[i] == s->stamp)) lp[i] = -INFINITY;
}

/* XTC: with probability xtc_probability, remove every token above the
 * threshold except the least likely of them (exempt tokens stay). */
static void filter_xtc(osp_sampler *s, float *lp) {
    double u = osp_sampler_uniform(s);
    if (u > s->p.xtc_probability) return;
    int32_t V = s->vocab;
    float mx = -INFINITY;
    for (int32_t i = 0; i < V; i++) mx = lp[i] > mx ? lp[i] : mx;
    double sum = 0;
    for (int32_t i = 0; i < V; i++) sum += s->probs[i] = isinf(lp[i]) && lp[i] < 0 ? 0.0f : expf(lp[i] - mx);
    float lowest = INFINITY;
    for (int32_t i = 0; i < V; i++) {
        s->probs[i] = (float)(s->probs[i] / sum);
        if (s->probs[i] > s->p.xtc_threshold && s->probs[i] < lowest) lowest = s->probs[i];
    }
    if (isinf(lowest)) return;
    next_stamp(s);
    for (int32_t i = 0; i < s->p.n_xtc_exempt; i++)
        if (s->p.xtc_exempt[i] >= 0 && s->p.xtc_exempt[i] < V) s->mark[s->p.xtc_exempt[i]] = s->stamp;
    for (int32_t i = 0; i < V; i++)
        if (s->probs[i] > lowest && s->mark[i] != s->stamp) lp[i] = -INFINITY;
}

static void filter_top_k(osp_sampler *s, float *lp) {
    int32_t V = s->vocab, k = s->p.top_k;
    osp_top_k_indices(lp, V, k, s->idx, s->idx2);
    next_stamp(s);
    for (int32_t i = 0; i < k; i++) s->mark[s->idx[i]] = s->stamp;
    for (int32_t i = 0; i < V; i++)
        if (s->mark[i] != s->stamp) lp[i] = -INFINITY;
}

static int32_t categorical(osp_sampler *s, const float *lp) {
    int32_t V = s->vocab;
    float inv_t = 1.0f / s->p.temperature, mx = -INFINITY;
    for (int32_t i = 0; i < V; i++) mx = lp[i] * inv_t > mx ? lp[i] * inv_t : mx;
    double sum = 0;
    for (int32_t i = 0; i < V; i++) sum += s->probs[i] = (lp[i] == -INFINITY) ? 0.0f : expf(lp[i] * inv_t - mx);
    double u = osp_sampler_uniform(s) * sum, c = 0;
    int32_t last = -1;
    for (int32_t i = 0; i < V; i++) {
        if (s->probs[i] <= 0) continue;
        last = i;
        c += s->probs[i];
        if (u < c) return i;
    }
    return last >= 0 ? last : argmax(lp, V);
}

/* Categorical draw restricted to the tokens idx[0..n) (already sorted by
 * decreasing logprob, so idx[0] holds the maximum). */
static int32_t categorical_among(osp_sampler *s, const float *lp, const int32_t *idx, int32_t n) {
    float inv_t = 1.0f / s->p.temperature, mx = lp[idx[0]] * inv_t;
    double sum = 0;
    for (int32_t i = 0; i < n; i++) sum += s->probs[i] = expf(lp[idx[i]] * inv_t - mx);
    double u = osp_sampler_uniform(s) * sum, c = 0;
    for (int32_t i = 0; i < n; i++) {
        c += s->probs[i];
        if (u < c) return idx[i];
    }
    return idx[n - 1];
}

/* How many of the ranked tokens idx[0..n) top_p keeps: the first i while
 * the mass before i is < top_p; n (and *reached = 0) when the mass of all n
 * stays below top_p. */
static int32_t top_p_cut(const osp_sampler *s, const float *logits, int32_t n, float mx, double inv, int *reached) {
    double above = 0;
    for (int32_t i = 0; i < n; i++) {
        if (above >= s->p.top_p) {
            *reached = 1;
            return i;
        }
        above += expf(logits[s->idx[i]] - mx) * inv;
    }
    *reached = above >= s->p.top_p;
    return n;
}

/* top_p then top_k, the common configuration, without logprobs. A token
 * top_p keeps has p >= (1 - top_p) / V (the mass at and below it exceeds
 * 1 - top_p and it is the largest there), so only those are ranked; the
 * threshold moves to logit space (p = e^(l - max) / sum), so the whole
 * vocabulary is only read: its max and exp-sum in two vector passes, then
 * candidate scans. The first scan takes the tokens within e^-6 of the most
 * likely one: when there are top_k of them, or their mass already reaches
 * top_p, the kept tokens are all among them (everything else ranks below);
 * only a flat distribution needs the second, wider scan. */
static int32_t sample_top_p_k(osp_sampler *s, const float *logits) {
    int32_t V = s->vocab, k = s->p.top_k, reached;
    const osp_ops *ops = osp_ops_get();
    float mx, sum = ops->sumexp(logits, V, &mx);
    double inv = 1.0 / sum;
    float thr = mx + logf((1.0f - s->p.top_p) / (float)V * 0.999f * sum), near = mx - 6.0f;
    if (near > thr) {
        int32_t nc = ops->select_ge(s->idx2, logits, V, near);
        if (nc > 0) {
            int32_t m = k < nc ? k : nc;
            top_k_among(logits, s->idx2, nc, m, s->idx);
            int32_t keep = top_p_cut(s, logits, m, mx, inv, &reached);
            if (m == k || reached) return categorical_among(s, logits, s->idx, keep);
        }
    }
    int32_t nc = ops->select_ge(s->idx2, logits, V, thr);
    if (nc <= 0) return -1;
    int32_t m = k < nc ? k : nc;
    top_k_among(logits, s->idx2, nc, m, s->idx);
    return categorical_among(s, logits, s->idx, top_p_cut(s, logits, m, mx, inv, &reached));
}

int osp_sampler_dist(osp_sampler *s, float *logits, const int32_t *history, int64_t n_history, float *probs,
                     float *logprobs) {
    const osp_sampler_params *p = &s->p;
    int32_t V = s->vocab;
    if (p->xtc_probability > 0) return -1;
    apply_processors(s, logits, history, n_history);
    log_softmax(logits, V);
    if (logprobs) memcpy(logprobs, logits, sizeof(float) * V);
    if (p->temperature == 0) {
        memset(probs, 0, sizeof(float) * V);
        probs[argmax(logits, V)] = 1;
        return 0;
    }
    if (p->top_p > 0 && p->top_p < 1) filter_top_p(s, logits);
    if (p->min_p > 0) filter_min_p(s, logits);
    if (p->top_k > 0 && p->top_k < V) filter_top_k(s, logits);
    float inv_t = 1.0f / p->temperature, mx = -INFINITY;
    for (int32_t i = 0; i < V; i++) mx = logits[i] * inv_t > mx ? logits[i] * inv_t : mx;
    double sum = 0;
    for (int32_t i = 0; i < V; i++) sum += probs[i] = logits[i] == -INFINITY ? 0.0f : expf(logits[i] * inv_t - mx);
    float inv = (float)(1.0 / sum);
    for (int32_t i = 0; i < V; i++) probs[i] *= inv;
    return 0;
}

int32_t osp_sampler_draw(osp_sampler *s, const float *probs) {
    int32_t V = s->vocab, last = -1;
    double sum = 0;
    for (int32_t i = 0; i < V; i++) sum += probs[i];
    double u = osp_sampler_uniform(s) * sum, c = 0;
    for (int32_t i = 0; i < V; i++) {
        if (probs[i] <= 0) continue;
        last = i;
        c += probs[i];
        if (u < c) return i;
    }
    return last >= 0 ? last : 0;
}

int32_t osp_sampler_sample(osp_sampler *s, float *logits, const int32_t *history, int64_t n_history,
                           float *logprobs) {
    const osp_sampler_params *p = &s->p;
    int32_t V = s->vocab;
    apply_processors(s, logits, history, n_history);
    if (!logprobs && p->temperature == 0) return osp_ops_get()->argmax(logits, V); /* greedy: no softmax needed */
    if (!logprobs && p->temperature > 0 && p->top_p > 0 && p->top_p < 1 && p->top_k > 0 && p->top_k < V &&
        !(p->min_p > 0) && !(p->xtc_probability > 0)) {
        /* NaN probabilities never pass the candidate threshold; if nothing
         * passes, the general path below (which cleans NaN) takes over */
        int32_t t = sample_top_p_k(s, logits);
        if (t >= 0) return t;
    }
    log_softmax(logits, V);
    if (logprobs) memcpy(logprobs, logits, sizeof(float) * V);
    if (p->temperature == 0) return argmax(logits, V);
    int use_top_p = p->top_p > 0 && p->top_p < 1, use_top_k = p->top_k > 0 && p->top_k < V;
    if (use_top_p && use_top_k && !(p->min_p > 0) && !(p->xtc_probability > 0)) {
        /* both keep a prefix of the same order: one selection serves both */
        /* A token top_p keeps has p >= (1 - top_p) / V (the mass at and below
         * it exceeds 1 - top_p, and it is the largest there): select among those. */
        float thr = logf((1.0f - p->top_p) / (float)V) - 1e-3f;
        int32_t nc = 0;
        for (int32_t i = 0; i < V; i++) {
            s->idx2[nc] = i;
            nc += logits[i] >= thr;
        }
        if (nc > 0 && nc < V / 2) {
            int32_t k = p->top_k < nc ? p->top_k : nc;
            top_k_among(logits, s->idx2, nc, k, s->idx);
            double above = 0;
            int32_t keep = k;
            for (int32_t i = 0; i < k; i++) {
                if (above >= p->top_p) {
                    keep = i;
                    break;
                }
                above += exp((double)logits[s->idx[i]]);
            }
            return categorical_among(s, logits, s->idx, keep);
        }
        int32_t keep = top_p_count(s, logits, p->top_k);
        return categorical_among(s, logits, s->idx, keep);
    }
    if (use_top_p) filter_top_p(s, logits);
    if (p->min_p > 0) filter_min_p(s, logits);
    if (p->xtc_probability > 0) filter_xtc(s, logits);
    if (p->top_k > 0 && p->top_k < V) filter_top_k(s, logits);
    return categorical(s, logits);
}
