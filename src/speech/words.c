/* speech/words.c: word timestamps as openai-whisper computes them
 * (timing.py): the window's text is decoded again after
 * <|startoftranscript|><|lang|><|task|><|notimestamps|> while the alignment
 * heads' cross-attention scores are captured; their softmax over the
 * window's audio frames, normalized over the tokens, median-filtered (7)
 * over the frames and averaged over the heads, is aligned to the tokens by
 * dynamic time warping; each word starts where the path first reaches its
 * first token (50 steps a second). Then its heuristics: punctuation merged
 * into the neighbouring words, words at sentence and segment boundaries no
 * longer than twice the median word duration, segment times from the words. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "transcribe.h"

#define TOKENS_PER_SECOND 50.0
#define MEDFILT 7

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* Median of every window of 7 along a row of M values, reflect-padded
 * (rows of 3 values or fewer are left as they are, as openai-whisper does). */
static void median_row(float *row, int64_t M, float *tmp) {
    const int p = MEDFILT / 2;
    if (M <= p) return;
    for (int64_t j = 0; j < M + 2 * p; j++) {
        int64_t k = j - p;
        if (k < 0) k = -k;
        if (k >= M) k = 2 * (M - 1) - k;
        tmp[j] = row[k];
    }
    float w[MEDFILT];
    for (int64_t j = 0; j < M; j++) {
        memcpy(w, tmp + j, sizeof w);
        qsort(w, MEDFILT, sizeof *w, cmp_float);
        row[j] = w[p];
    }
}

int32_t osp_whisper_dtw(const float *x, int32_t N, int32_t M, int32_t *text_idx, int32_t *time_idx, void *scratch) {
    /* cost and trace [N+1][M+1]; ties go to the later choices, as in openai-whisper's dtw_cpu */
    double *cost = scratch;
    signed char *trace = (signed char *)(cost + (int64_t)(N + 1) * (M + 1));
    const int64_t W = M + 1;
    for (int64_t i = 0; i < (int64_t)(N + 1) * W; i++) {
        cost[i] = INFINITY;
        trace[i] = -1;
    }
    cost[0] = 0;
    for (int32_t j = 1; j <= M; j++)
        for (int32_t i = 1; i <= N; i++) {
            double c0 = cost[(i - 1) * W + j - 1], c1 = cost[(i - 1) * W + j], c2 = cost[i * W + j - 1], c;
            int t;
            if (c0 < c1 && c0 < c2) c = c0, t = 0;
            else if (c1 < c0 && c1 < c2) c = c1, t = 1;
            else c = c2, t = 2;
            cost[i * W + j] = x[(int64_t)(i - 1) * M + j - 1] + c;
            trace[i * W + j] = (signed char)t;
        }
    for (int32_t j = 0; j <= M; j++) trace[j] = 2;
    for (int32_t i = 0; i <= N; i++) trace[i * W] = 1;
    int32_t i = N, j = M, n = 0;
    while (i > 0 || j > 0) {
        text_idx[n] = i - 1;
        time_idx[n] = j - 1;
        n++;
        int t = trace[i * W + j];
        if (t == 0) i--, j--;
        else if (t == 1) i--;
        else j--;
    }
    for (int32_t a = 0, b = n - 1; a < b; a++, b--) { /* forwards */
        int32_t u = text_idx[a], v = time_idx[a];
        text_idx[a] = text_idx[b];
        time_idx[a] = time_idx[b];
        text_idx[b] = u;
        time_idx[b] = v;
    }
    return n;
}

/* ---------------- words from tokens ---------------- */

/* Index (in code points) of the first U+FFFD of s, or -1. */
static int64_t fffd_at(const char *s) {
    int64_t cp = 0;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if ((*p & 0xc0) == 0x80) continue;
        if (p[0] == 0xef && p[1] == 0xbf && p[2] == 0xbd) return cp;
        cp++;
    }
    return -1;
}

/* 1 when code point k of s is U+FFFD. */
static int is_fffd(const char *s, int64_t k) {
    int64_t cp = -1;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if ((*p & 0xc0) == 0x80) continue;
        if (++cp == k) return p[0] == 0xef && p[1] == 0xbf && p[2] == 0xbd;
    }
    return 0;
}

static int64_t n_cp(const char *s) {
    int64_t n = 0;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) n += (*p & 0xc0) != 0x80;
    return n;
}

/* Python's `s.strip() in string.punctuation` (a substring test; "" is in it). */
static int in_set(const char *s, const char *set) {
    while (*s == ' ' || *s == '\t' || *s == '\n') s++;
    size_t n = strlen(s);
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\n')) n--;
    if (!n) return 1;
    for (const char *p = set; *p; p++)
        if (!strncmp(p, s, n) && strlen(p) >= n) return 1;
    return 0;
}

static const char PUNCT[] = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~";

/* Words of tokens[0..n) (openai-whisper's split_to_word_tokens): pieces at
 * complete UTF-8 characters; for languages written without spaces each piece
 * is a word, otherwise a piece starting with a space, a punctuation piece or
 * a special token starts a new word. wt receives each word's token range. */
static osp_status split_words(const osp_tokenizer *tok, const osp_wtokens *w, const int32_t *toks, int32_t n,
                              int no_spaces, osp_word *out, int32_t *n_out) {
    char *full = NULL, *dec = NULL;
    size_t len;
    *n_out = 0;
    OSP_TRY(osp_tokenizer_decode(tok, toks, n, 0, &full, &len));
    int64_t offset = 0;
    int32_t start = 0;
    osp_status rc = OSP_OK;
    for (int32_t i = 0; i < n && rc == OSP_OK; i++) {
        rc = osp_tokenizer_decode(tok, toks + start, i + 1 - start, 0, &dec, &len);
        if (rc != OSP_OK) break;
        int64_t f = fffd_at(dec);
        if (f >= 0 && !is_fffd(full, offset + f)) { /* an incomplete character: wait for more tokens */
            osp_free(dec);
            continue;
        }
        offset += n_cp(dec);
        int special = toks[start] >= w->eot, space = dec[0] == ' ', punct = in_set(dec, PUNCT);
        if (no_spaces || special || space || punct || *n_out == 0) {
            out[*n_out] = (osp_word){.text = dec, .tok0 = start, .n_tok = i + 1 - start};
            (*n_out)++;
        } else { /* continues the previous word */
            osp_word *pw = &out[*n_out - 1];
            size_t a = strlen(pw->text), b = strlen(dec);
            char *j = osp_malloc(OSP_POOL_MISC, a + b + 1);
            if (!j) {
                osp_free(dec);
                rc = osp_err(OSP_ERR_NOMEM, "out of memory");
                break;
            }
            memcpy(j, pw->text, a);
            memcpy(j + a, dec, b + 1);
            osp_free(pw->text);
            osp_free(dec);
            pw->text = j;
            pw->n_tok += i + 1 - start;
        }
        start = i + 1;
    }
    osp_free(full);
    if (rc != OSP_OK) {
        for (int32_t i = 0; i < *n_out; i++) osp_free(out[i].text);
        *n_out = 0;
    }
    return rc;
}

/* ---------------- the alignment ---------------- */

osp_status osp_whisper_align(osp_whisper_state *s, const osp_whisper *m, const osp_tokenizer *tok,
                             const osp_wtokens *w, const int32_t *sot, int32_t n_sot, const int32_t *text,
                             int32_t n_text, int32_t num_frames, int no_spaces, osp_word *words, int32_t *n_words) {
    const osp_whisper_config *c = osp_whisper_get_config(m);
    const int32_t V = c->vocab, A = c->n_audio_ctx;
    *n_words = 0;
    const int32_t T = n_sot + 1 + n_text + 1, F = num_frames / 2 < A ? num_frames / 2 : A, N = n_text + 1;
    if (n_text < 1 || F < 1) return OSP_OK;
    if (T > c->n_text_ctx) return osp_err(OSP_ERR_RANGE, "word timestamps: %d tokens exceed the decoder", T);
    int32_t nh;
    const int32_t *heads = osp_whisper_alignment_heads(m, &nh);
    int32_t *toks = osp_malloc(OSP_POOL_SCRATCH, sizeof(int32_t) * (T + 1));
    float *qk = osp_malloc(OSP_POOL_SCRATCH, sizeof(float) * nh * T * A);
    float *logits = osp_malloc(OSP_POOL_SCRATCH, sizeof(float) * T * V);
    float *mat = osp_malloc(OSP_POOL_SCRATCH, sizeof(float) * T * F), *tmp = osp_malloc(OSP_POOL_SCRATCH, sizeof(float) * (A + 8));
    double *probs = osp_malloc(OSP_POOL_SCRATCH, sizeof(double) * (n_text + 1));
    int32_t *ti = osp_malloc(OSP_POOL_SCRATCH, sizeof(int32_t) * (N + F + 1)),
            *fi = osp_malloc(OSP_POOL_SCRATCH, sizeof(int32_t) * (N + F + 1));
    void *dtw = osp_malloc(OSP_POOL_SCRATCH, (sizeof(double) + 1) * (size_t)(N + 1) * (F + 1));
    double *jump = osp_malloc(OSP_POOL_SCRATCH, sizeof(double) * (N + 1));
    osp_word *wd = osp_malloc(OSP_POOL_SCRATCH, sizeof(osp_word) * (n_text + 2));
    int32_t nw = 0;
    osp_status rc = OSP_OK;
    if (!toks || !qk || !logits || !mat || !tmp || !probs || !ti || !fi || !dtw || !jump || !wd) {
        rc = osp_err(OSP_ERR_NOMEM, "out of memory for word timestamps");
        goto done;
    }
    memcpy(toks, sot, sizeof(int32_t) * n_sot);
    toks[n_sot] = w->no_timestamps;
    memcpy(toks + n_sot + 1, text, sizeof(int32_t) * n_text);
    toks[T - 1] = w->eot;
    rc = osp_whisper_truncate(s, 0);
    if (rc == OSP_OK) rc = osp_whisper_capture_qk(s, heads, nh, qk, T);
    if (rc == OSP_OK) rc = osp_whisper_decode(s, toks, T, logits, NULL);
    osp_whisper_capture_qk(s, NULL, 0, NULL, 0);
    if (rc != OSP_OK) goto done;
    /* each text token's probability among the text tokens */
    for (int32_t i = 0; i < n_text; i++) {
        const float *l = logits + (int64_t)(n_sot + i) * V;
        float mx = -INFINITY;
        for (int32_t j = 0; j < w->eot; j++) mx = l[j] > mx ? l[j] : mx;
        double z = 0;
        for (int32_t j = 0; j < w->eot; j++) z += exp((double)l[j] - mx);
        probs[i] = text[i] < w->eot ? exp((double)l[text[i]] - mx) / z : 0;
    }
    /* per head: softmax over the frames, standardized over the tokens, median-filtered; averaged */
    memset(mat, 0, sizeof(float) * T * F);
    for (int32_t h = 0; h < nh; h++) {
        float *q = qk + (int64_t)h * T * A; /* [T][A]: its first F columns are used, rows of stride F below */
        for (int32_t t = 0; t < T; t++) {
            float *r = q + (int64_t)t * A;
            float mx = -INFINITY;
            for (int32_t f = 0; f < F; f++) mx = r[f] > mx ? r[f] : mx;
            double z = 0;
            for (int32_t f = 0; f < F; f++) z += exp((double)r[f] - mx);
            for (int32_t f = 0; f < F; f++) r[f] = (float)(exp((double)r[f] - mx) / z);
        }
        for (int32_t f = 0; f < F; f++) {
            double mean = 0, var = 0;
            for (int32_t t = 0; t < T; t++) mean += q[(int64_t)t * A + f];
            mean /= T;
            for (int32_t t = 0; t < T; t++) var += (q[(int64_t)t * A + f] - mean) * (q[(int64_t)t * A + f] - mean);
            double sd = sqrt(var / T);
            for (int32_t t = 0; t < T; t++) q[(int64_t)t * A + f] = (float)((q[(int64_t)t * A + f] - mean) / sd);
        }
        for (int32_t t = 0; t < T; t++) {
            median_row(q + (int64_t)t * A, F, tmp);
            for (int32_t f = 0; f < F; f++) mat[(int64_t)t * F + f] += q[(int64_t)t * A + f] / nh;
        }
    }
    /* the rows of <|notimestamps|> and the text tokens, negated, aligned */
    float *x = mat + (int64_t)n_sot * F;
    for (int64_t i = 0; i < (int64_t)N * F; i++) x[i] = -x[i];
    int32_t np = osp_whisper_dtw(x, N, F, ti, fi, dtw);
    int32_t nj = 0;
    for (int32_t k = 0; k < np; k++)
        if (k == 0 || ti[k] != ti[k - 1]) jump[nj++] = fi[k] / TOKENS_PER_SECOND;
    /* words of the text + <|endoftext|> (its word only closes the last one) */
    memcpy(toks, text, sizeof(int32_t) * n_text);
    toks[n_text] = w->eot;
    rc = split_words(tok, w, toks, n_text + 1, no_spaces, wd, &nw);
    if (rc != OSP_OK || nw <= 1) goto done;
    int32_t b = 0;
    for (int32_t k = 0; k + 1 < nw; k++) {
        int32_t e = b + wd[k].n_tok;
        words[k] = wd[k];
        words[k].start = b < nj ? jump[b] : 0;
        words[k].end = e < nj ? jump[e] : words[k].start;
        double p = 0;
        for (int32_t i = b; i < e; i++) p += probs[i];
        words[k].prob = e > b ? p / (e - b) : 0;
        wd[k].text = NULL;
        b = e;
    }
    *n_words = nw - 1;
done:
    for (int32_t k = 0; k < nw; k++) osp_free(wd[k].text);
    void *fr[] = {toks, qk, logits, mat, tmp, probs, ti, fi, dtw, jump, wd};
    for (size_t i = 0; i < sizeof fr / sizeof *fr; i++) osp_free(fr[i]);
    return rc;
}

/* ---------------- openai-whisper's heuristics ---------------- */

static void merge_into(osp_word *dst, osp_word *src, int prepend) {
    size_t a = strlen(dst->text), b = strlen(src->text);
    char *j = osp_malloc(OSP_POOL_MISC, a + b + 1);
    if (!j) return; /* out of memory: left unmerged */
    if (prepend) {
        memcpy(j, src->text, b);
        memcpy(j + b, dst->text, a + 1);
    } else {
        memcpy(j, dst->text, a);
        memcpy(j + a, src->text, b + 1);
    }
    osp_free(dst->text);
    dst->text = j;
    dst->n_tok += src->n_tok;
    src->text[0] = 0;
    src->n_tok = 0;
}

static int one_of(const char *s, const char *set) {
    /* Python's `word in set` (a substring test) */
    return strstr(set, s) != NULL;
}

void osp_whisper_merge_punctuations(osp_word *a, int32_t n) {
    static const char PRE[] = "\"'\xe2\x80\x9c\xc2\xbf([{-", APP[] = "\"'.\xe3\x80\x82,\xef\xbc\x8c!\xef\xbc\x81?\xef\xbc\x9f:\xef\xbc\x9a\xe2\x80\x9d)]}\xe3\x80\x81";
    for (int32_t i = n - 2, j = n - 1; i >= 0; i--) {
        char st[64];
        const char *p = a[i].text;
        while (*p == ' ' || *p == '\t' || *p == '\n') p++;
        size_t l = strlen(p);
        while (l && (p[l - 1] == ' ' || p[l - 1] == '\t' || p[l - 1] == '\n')) l--;
        int ok = a[i].text[0] == ' ' && l < sizeof st;
        if (ok) {
            memcpy(st, p, l);
            st[l] = 0;
            ok = one_of(st, PRE);
        }
        if (ok) merge_into(&a[j], &a[i], 1);
        else j = i;
    }
    for (int32_t i = 0, j = 1; j < n; j++) {
        size_t l = strlen(a[i].text);
        if (!(l && a[i].text[l - 1] == ' ') && one_of(a[j].text, APP)) merge_into(&a[i], &a[j], 0);
        else i = j;
    }
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double osp_whisper_word_heuristics(osp_word *a, int32_t n, double *max_duration) {
    double *d = osp_malloc(OSP_POOL_SCRATCH, sizeof(double) * (n + 1));
    int32_t k = 0;
    for (int32_t i = 0; d && i < n; i++)
        if (a[i].end - a[i].start != 0) d[k++] = a[i].end - a[i].start;
    double median = 0;
    if (k) {
        qsort(d, k, sizeof *d, cmp_double);
        median = k % 2 ? d[k / 2] : (d[k / 2 - 1] + d[k / 2]) / 2;
    }
    osp_free(d);
    median = median < 0.7 ? median : 0.7;
    *max_duration = 2 * median;
    if (k) {
        static const char ENDS[] = ".\xe3\x80\x82!\xef\xbc\x81?\xef\xbc\x9f";
        for (int32_t i = 1; i < n; i++)
            if (a[i].end - a[i].start > *max_duration) {
                if (one_of(a[i].text, ENDS)) a[i].end = a[i].start + *max_duration;
                else if (one_of(a[i - 1].text, ENDS)) a[i].start = a[i].end - *max_duration;
            }
    }
    osp_whisper_merge_punctuations(a, n);
    return median;
}
