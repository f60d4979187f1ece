/* audio/mel.c: Whisper's log-mel spectrogram (see audio.h for the exact
 * recipe). One FFTW plan per osp_mel, made under a lock (FFTW's planner is
 * not thread-safe); frames are transformed with the new-array execute
 * calls, which are, so the 3000 frames are split over the thread pool. */
#include <fftw3.h>
#include <math.h>
#include <pthread.h>
#include <string.h>
#include "audio.h"
#include "core/threadpool.h"

struct osp_mel {
    int n_mels;
    float *filters; /* [n_mels, 201] */
    float *window;  /* [400] periodic Hann */
    fftwf_plan plan;
    int serial; /* frames on the calling thread, not the pool */
};

static pthread_mutex_t plan_lock = PTHREAD_MUTEX_INITIALIZER;

/* Slaney's mel scale: linear below 1 kHz, logarithmic above. */
static double hz_to_mel(double f) {
    const double f_sp = 200.0 / 3, min_log_hz = 1000, min_log_mel = min_log_hz / f_sp, step = log(6.4) / 27;
    return f < min_log_hz ? f / f_sp : min_log_mel + log(f / min_log_hz) / step;
}
static double mel_to_hz(double m) {
    const double f_sp = 200.0 / 3, min_log_hz = 1000, min_log_mel = min_log_hz / f_sp, step = log(6.4) / 27;
    return m < min_log_mel ? m * f_sp : min_log_hz * exp(step * (m - min_log_mel));
}

osp_status osp_mel_filters(int n_mels, float *out) {
    if (n_mels < 1 || n_mels > 512) return osp_err(OSP_ERR_INVALID, "mel filters: %d bins is out of range", n_mels);
    double edges[514];
    const double m0 = hz_to_mel(0), m1 = hz_to_mel(8000);
    for (int i = 0; i < n_mels + 2; i++) edges[i] = mel_to_hz(m0 + (m1 - m0) * i / (n_mels + 1));
    for (int m = 0; m < n_mels; m++) {
        double lo = edges[m], c = edges[m + 1], hi = edges[m + 2], enorm = 2.0 / (hi - lo);
        for (int k = 0; k < OSP_MEL_NFREQ; k++) {
            double f = 8000.0 * k / (OSP_MEL_NFREQ - 1);
            double down = (f - lo) / (c - lo), up = (hi - f) / (hi - c);
            double v = down < up ? down : up;
            out[(int64_t)m * OSP_MEL_NFREQ + k] = (float)(v > 0 ? v * enorm : 0);
        }
    }
    return OSP_OK;
}

osp_status osp_mel_new(int n_mels, osp_mel **out) {
    *out = NULL;
    if (n_mels < 1 || n_mels > 512) return osp_err(OSP_ERR_INVALID, "mel: %d bins is out of range (80 or 128)", n_mels);
    osp_mel *m = osp_calloc(OSP_POOL_MISC, sizeof *m);
    if (!m) return osp_err(OSP_ERR_NOMEM, "mel: out of memory");
    m->n_mels = n_mels;
    m->filters = osp_malloc(OSP_POOL_MISC, sizeof(float) * (size_t)n_mels * OSP_MEL_NFREQ);
    m->window = osp_malloc(OSP_POOL_MISC, sizeof(float) * OSP_MEL_NFFT);
    float *in = osp_malloc(OSP_POOL_MISC, sizeof(float) * OSP_MEL_NFFT);
    fftwf_complex *spec = osp_malloc(OSP_POOL_MISC, sizeof(fftwf_complex) * OSP_MEL_NFREQ);
    if (!m->filters || !m->window || !in || !spec) {
        osp_free(in);
        osp_free(spec);
        osp_mel_free(m);
        return osp_err(OSP_ERR_NOMEM, "mel: out of memory");
    }
    osp_mel_filters(n_mels, m->filters);
    for (int i = 0; i < OSP_MEL_NFFT; i++) m->window[i] = (float)(0.5 - 0.5 * cos(2 * M_PI * i / OSP_MEL_NFFT));
    pthread_mutex_lock(&plan_lock);
    m->plan = fftwf_plan_dft_r2c_1d(OSP_MEL_NFFT, in, spec, FFTW_ESTIMATE);
    pthread_mutex_unlock(&plan_lock);
    osp_free(in);
    osp_free(spec);
    if (!m->plan) {
        osp_mel_free(m);
        return osp_err(OSP_ERR_INTERNAL, "mel: FFTW could not plan a %d-point transform", OSP_MEL_NFFT);
    }
    *out = m;
    return OSP_OK;
}

void osp_mel_free(osp_mel *m) {
    if (!m) return;
    if (m->plan) {
        pthread_mutex_lock(&plan_lock);
        fftwf_destroy_plan(m->plan);
        pthread_mutex_unlock(&plan_lock);
    }
    osp_free(m->filters);
    osp_free(m->window);
    osp_free(m);
}

int osp_mel_bins(const osp_mel *m) { return m->n_mels; }
void osp_mel_set_serial(osp_mel *m, int serial) { m->serial = serial; }

typedef struct mel_ctx {
    const osp_mel *m;
    const float *x; /* [480000 + 400]: the reflect-padded window */
    float *out;     /* [n_mels, 3000], log10 of the mel power for now */
    int64_t per_task;
} mel_ctx;

static void mel_task(void *p, int64_t task) {
    const mel_ctx *c = p;
    const osp_mel *m = c->m;
    _Alignas(64) float in[OSP_MEL_NFFT];
    _Alignas(64) fftwf_complex spec[OSP_MEL_NFREQ];
    double power[OSP_MEL_NFREQ];
    int64_t f0 = task * c->per_task, f1 = f0 + c->per_task < OSP_MEL_FRAMES ? f0 + c->per_task : OSP_MEL_FRAMES;
    for (int64_t f = f0; f < f1; f++) {
        const float *fr = c->x + f * OSP_MEL_HOP;
        for (int i = 0; i < OSP_MEL_NFFT; i++) in[i] = fr[i] * m->window[i];
        fftwf_execute_dft_r2c(m->plan, in, spec);
        for (int k = 0; k < OSP_MEL_NFREQ; k++)
            power[k] = (double)spec[k][0] * spec[k][0] + (double)spec[k][1] * spec[k][1];
        for (int b = 0; b < m->n_mels; b++) {
            const float *w = m->filters + (int64_t)b * OSP_MEL_NFREQ;
            double s = 0;
            for (int k = 0; k < OSP_MEL_NFREQ; k++) s += w[k] * power[k];
            c->out[(int64_t)b * OSP_MEL_FRAMES + f] = (float)log10(s > 1e-10 ? s : 1e-10);
        }
    }
}

osp_status osp_mel_compute(osp_mel *m, const float *pcm, int64_t n, float *out) {
    if (n < 0 || (n > 0 && !pcm)) return osp_err(OSP_ERR_INVALID, "mel: bad input");
    const int pad = OSP_MEL_NFFT / 2, W = OSP_MEL_WINDOW_SAMPLES;
    float *x = osp_malloc(OSP_POOL_SCRATCH, sizeof(float) * (W + 2 * pad));
    if (!x) return osp_err(OSP_ERR_NOMEM, "mel: out of memory");
    int64_t k = n < W ? n : W;
    if (k) memcpy(x + pad, pcm, sizeof(float) * (size_t)k);
    memset(x + pad + k, 0, sizeof(float) * (size_t)(W - k));
    /* numpy's "reflect": the edge sample is not repeated */
    for (int i = 1; i <= pad; i++) {
        x[pad - i] = x[pad + i];
        x[pad + W - 1 + i] = x[pad + W - 1 - i];
    }
    mel_ctx c = {m, x, out, 50};
    int64_t tasks = (OSP_MEL_FRAMES + c.per_task - 1) / c.per_task;
    if (m->serial)
        for (int64_t t = 0; t < tasks; t++) mel_task(&c, t);
    else
        osp_parallel_for(tasks, mel_task, &c);
    osp_free(x);
    float mx = -INFINITY;
    const int64_t N = (int64_t)m->n_mels * OSP_MEL_FRAMES;
    for (int64_t i = 0; i < N; i++) mx = out[i] > mx ? out[i] : mx;
    for (int64_t i = 0; i < N; i++) out[i] = ((out[i] > mx - 8.0f ? out[i] : mx - 8.0f) + 4.0f) / 4.0f;
    return OSP_OK;
}
