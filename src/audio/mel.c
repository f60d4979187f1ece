/* audio/mel.c: Whisper's log-mel spectrogram (see audio.h for the recipe).
 *
 * Precision follows transformers' numpy path step for step, because that is
 * what the goldens hold: samples promoted to f64, window, FFT, power, filters
 * and log10 in f64, with two roundings to f32 where numpy stores them: the
 * spectrum (a complex64 array) and the log10 (the spectrogram's f32 dtype);
 * the clamp and scaling are then f32 arithmetic. An f32 FFT does not fit the
 * goldens' bound: its error is relative to the whole frame, and log10 turns
 * that into a large error in a bin whose power is a tiny part of the frame's.
 *
 * One FFTW plan per osp_mel, made under a lock (FFTW's planner is not
 * thread-safe); frames are transformed with the new-array execute call, which
 * is, so the 3000 frames are split over the thread pool. The plan is made on
 * arrays of the same alignment as the ones it executes on (64-byte stack
 * arrays), as FFTW's new-array interface requires. */
#include <fftw3.h>
#include <math.h>
#include <pthread.h>
#include <string.h>
#include "audio.h"
#include "core/threadpool.h"

struct osp_mel {
    int n_mels;
    double *filters; /* [n_mels, 201] */
    double *window;  /* [400] periodic Hann */
    fftw_plan plan;
    int serial; /* frames on the calling thread, not the pool */
};

static pthread_mutex_t plan_lock = PTHREAD_MUTEX_INITIALIZER;

/* Slaney's mel scale, written as transformers' hertz_to_mel / mel_to_hertz
 * write it (the same operations, so the same roundings). */
static double hz_to_mel(double f) {
    const double logstep = 27.0 / log(6.4);
    return f >= 1000.0 ? 15.0 + log(f / 1000.0) * logstep : 3.0 * f / 200.0;
}
static double mel_to_hz(double m) {
    const double logstep = log(6.4) / 27.0;
    return m >= 15.0 ? 1000.0 * exp(logstep * (m - 15.0)) : 200.0 * m / 3.0;
}

osp_status osp_mel_filters(int n_mels, double *out) {
    if (n_mels < 1 || n_mels > 512) return osp_err(OSP_ERR_INVALID, "mel filters: %d bins is out of range", n_mels);
    /* np.linspace(mel_min, mel_max, n + 2): i * step + start, the last one exactly stop */
    double edges[514];
    const double m0 = hz_to_mel(0.0), m1 = hz_to_mel(8000.0), step = (m1 - m0) / (n_mels + 1);
    for (int i = 0; i < n_mels + 2; i++) edges[i] = mel_to_hz(i == n_mels + 1 ? m1 : i * step + m0);
    for (int m = 0; m < n_mels; m++) {
        double lo = edges[m], c = edges[m + 1], hi = edges[m + 2], enorm = 2.0 / (hi - lo);
        for (int k = 0; k < OSP_MEL_NFREQ; k++) {
            double f = k * (8000.0 / (OSP_MEL_NFREQ - 1));
            double down = (f - lo) / (c - lo), up = (hi - f) / (hi - c);
            double v = down < up ? down : up;
            out[(int64_t)m * OSP_MEL_NFREQ + k] = (v > 0 ? v : 0) * enorm;
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
    m->filters = osp_malloc(OSP_POOL_MISC, sizeof(double) * (size_t)n_mels * OSP_MEL_NFREQ);
    m->window = osp_malloc(OSP_POOL_MISC, sizeof(double) * OSP_MEL_NFFT);
    if (!m->filters || !m->window) {
        osp_mel_free(m);
        return osp_err(OSP_ERR_NOMEM, "mel: out of memory");
    }
    osp_mel_filters(n_mels, m->filters);
    /* np.hanning(401)[:-1], as numpy writes it: 0.5 + 0.5 cos(pi n / 400), n = -400, -398, ... */
    for (int i = 0; i < OSP_MEL_NFFT; i++) m->window[i] = 0.5 + 0.5 * cos(M_PI * (2 * i - OSP_MEL_NFFT) / OSP_MEL_NFFT);
    _Alignas(64) double in[OSP_MEL_NFFT];
    _Alignas(64) fftw_complex spec[OSP_MEL_NFREQ];
    pthread_mutex_lock(&plan_lock);
    m->plan = fftw_plan_dft_r2c_1d(OSP_MEL_NFFT, in, spec, FFTW_ESTIMATE);
    pthread_mutex_unlock(&plan_lock);
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
        fftw_destroy_plan(m->plan);
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
    _Alignas(64) double in[OSP_MEL_NFFT];
    _Alignas(64) fftw_complex spec[OSP_MEL_NFREQ];
    double power[OSP_MEL_NFREQ];
    int64_t f0 = task * c->per_task, f1 = f0 + c->per_task < OSP_MEL_FRAMES ? f0 + c->per_task : OSP_MEL_FRAMES;
    for (int64_t f = f0; f < f1; f++) {
        const float *fr = c->x + f * OSP_MEL_HOP;
        for (int i = 0; i < OSP_MEL_NFFT; i++) in[i] = (double)fr[i] * m->window[i];
        fftw_execute_dft_r2c(m->plan, in, spec);
        /* the spectrum as complex64, then np.abs in f64 (a hypot) squared */
        for (int k = 0; k < OSP_MEL_NFREQ; k++) {
            double a = hypot((double)(float)spec[k][0], (double)(float)spec[k][1]);
            power[k] = a * a;
        }
        for (int b = 0; b < m->n_mels; b++) {
            const double *w = m->filters + (int64_t)b * OSP_MEL_NFREQ;
            double s = 0;
            for (int k = 0; k < OSP_MEL_NFREQ; k++) s += w[k] * power[k];
            c->out[(int64_t)b * OSP_MEL_FRAMES + f] = (float)log10(s > 1e-10 ? s : 1e-10);
        }
    }
}

osp_status osp_mel_compute(osp_mel *m, const float *pcm, int64_t n, float *out) {
    if (n < 0 || (n > 0 && !pcm)) return osp_err(OSP_ERR_INVALID, "mel: bad input");
    const int pad = OSP_MEL_NFFT / 2, W = OSP_MEL_WINDOW_SAMPLES;
    /* f32 samples, as the extractor pads them; each is promoted to f64 in its frame */
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
    /* f32 from here on, as numpy's max, maximum and (x + 4) / 4 on the f32 spectrogram */
    float mx = -INFINITY;
    const int64_t N = (int64_t)m->n_mels * OSP_MEL_FRAMES;
    for (int64_t i = 0; i < N; i++) mx = out[i] > mx ? out[i] : mx;
    for (int64_t i = 0; i < N; i++) out[i] = ((out[i] > mx - 8.0f ? out[i] : mx - 8.0f) + 4.0f) / 4.0f;
    return OSP_OK;
}
