/* audio/mel.c against a scalar twin, on several recordings (issue 36).
 *
 * The twin is written plainly and shares no code with mel.c: reflect padding
 * by index, the textbook Hann window, a direct f64 DFT (a twiddle table,
 * O(n^2) per frame), power re^2 + im^2, Slaney filters built from their
 * definition, log10, clamp and scale. It rounds where transformers' numpy
 * path rounds (the spectrum to complex64, the log10 to f32, then f32
 * arithmetic), so that it computes what the goldens hold.
 *
 * On jfk.wav both are checked against the goldens (mel80, mel128) at their
 * bound; on the recordings of data/audio/ (speech, the same speech at
 * -54 dB, noise, digital silence, tones) osprey is checked against the twin
 * at TWIN_TOL, a twentieth of the goldens' bound: an f64 FFT and a direct
 * DFT differ by far less than one rounding of the f32 output, while an f32
 * FFT misses by up to the whole bound in low-power bins. The measured
 * figures are printed. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "audio/audio.h"
#include "core/core.h"
#include "model/safetensors.h"

#define GOLDEN_TOL 2e-5
#define TWIN_TOL (GOLDEN_TOL / 20)
#define WG "data/goldens/whisper"

/* ---- the scalar twin ---- */

static double slaney_mel(double hz) { return hz < 1000 ? hz * 3 / 200 : 15 + 27 * log(hz / 1000) / log(6.4); }
static double slaney_hz(double mel) { return mel < 15 ? mel * 200 / 3 : 1000 * pow(6.4, (mel - 15) / 27); }

/* Triangles between mel-spaced edges over 0..8 kHz, each scaled to unit area
 * per Hz (Slaney's "norm"): [n_mels, 201]. */
static void twin_filters(int n_mels, double *w) {
    for (int m = 0; m < n_mels; m++) {
        double e[3];
        for (int j = 0; j < 3; j++) e[j] = slaney_hz(slaney_mel(8000) * (m + j) / (n_mels + 1));
        for (int k = 0; k < OSP_MEL_NFREQ; k++) {
            double f = 8000.0 * k / (OSP_MEL_NFREQ - 1), v = 0;
            if (f > e[0] && f <= e[1]) v = (f - e[0]) / (e[1] - e[0]);
            else if (f > e[1] && f < e[2]) v = (e[2] - f) / (e[2] - e[1]);
            w[m * OSP_MEL_NFREQ + k] = v * 2 / (e[2] - e[0]);
        }
    }
}

/* Power spectra [3000, 201] of pcm[0..n), zero-padded to 30 s. */
static double *twin_power(const float *pcm, int64_t n) {
    const int N = OSP_MEL_NFFT, W = OSP_MEL_WINDOW_SAMPLES;
    double *p = calloc((size_t)OSP_MEL_FRAMES * OSP_MEL_NFREQ, sizeof(double));
    double cs[OSP_MEL_NFFT], sn[OSP_MEL_NFFT], x[OSP_MEL_NFFT];
    for (int j = 0; j < N; j++) {
        cs[j] = cos(2 * M_PI * j / N);
        sn[j] = sin(2 * M_PI * j / N);
    }
    for (int f = 0; f < OSP_MEL_FRAMES; f++) {
        int any = 0;
        for (int i = 0; i < N; i++) {
            int64_t t = (int64_t)f * OSP_MEL_HOP + i - N / 2; /* sample index in the 30 s window */
            if (t < 0) t = -t;
            if (t >= W) t = 2 * (W - 1) - t;
            double s = t < n ? pcm[t] : 0;
            x[i] = s * (0.5 - 0.5 * cos(2 * M_PI * i / N));
            any |= s != 0;
        }
        if (!any) continue; /* a silent frame's spectrum is 0 */
        for (int k = 0; k < OSP_MEL_NFREQ; k++) {
            double re = 0, im = 0;
            for (int i = 0; i < N; i++) {
                re += x[i] * cs[(k * i) % N];
                im -= x[i] * sn[(k * i) % N];
            }
            /* numpy stores the spectrum as complex64 */
            double r = (float)re, q = (float)im;
            p[(int64_t)f * OSP_MEL_NFREQ + k] = r * r + q * q;
        }
    }
    return p;
}

static void twin_mel(const double *power, int n_mels, float *out) {
    double *w = malloc(sizeof(double) * n_mels * OSP_MEL_NFREQ);
    twin_filters(n_mels, w);
    float mx = -INFINITY;
    for (int m = 0; m < n_mels; m++)
        for (int f = 0; f < OSP_MEL_FRAMES; f++) {
            double s = 0;
            for (int k = 0; k < OSP_MEL_NFREQ; k++) s += w[m * OSP_MEL_NFREQ + k] * power[(int64_t)f * OSP_MEL_NFREQ + k];
            float v = (float)log10(fmax(s, 1e-10));
            out[(int64_t)m * OSP_MEL_FRAMES + f] = v;
            mx = fmaxf(mx, v);
        }
    for (int64_t i = 0; i < (int64_t)n_mels * OSP_MEL_FRAMES; i++) out[i] = (fmaxf(out[i], mx - 8.0f) + 4.0f) / 4.0f;
    free(w);
}

/* ---- comparisons ---- */

/* The goldens' measure: the worst frame's max |a - ref| over 2e-5 * max(1,
 * max |ref|) of that frame; also each value finite. */
static double frame_ratio(const float *ref, const float *a, int n_mels, double *max_abs) {
    double worst = 0;
    *max_abs = 0;
    for (int f = 0; f < OSP_MEL_FRAMES; f++) {
        double mx = 1, d = 0;
        for (int m = 0; m < n_mels; m++) {
            float r = ref[(int64_t)m * OSP_MEL_FRAMES + f], v = a[(int64_t)m * OSP_MEL_FRAMES + f];
            assert_true(isfinite(v));
            mx = fmax(mx, fabs(r));
            d = fmax(d, fabs((double)v - r));
        }
        *max_abs = fmax(*max_abs, d);
        worst = fmax(worst, d / (GOLDEN_TOL * mx));
    }
    return worst;
}

static float *run_mel(int n_mels, const float *pcm, int64_t n, int serial) {
    osp_mel *m;
    assert_int_equal(osp_mel_new(n_mels, &m), OSP_OK);
    osp_mel_set_serial(m, serial);
    float *out = malloc(sizeof(float) * n_mels * OSP_MEL_FRAMES);
    assert_int_equal(osp_mel_compute(m, pcm, n, out), OSP_OK);
    osp_mel_free(m);
    return out;
}

static float *golden(const char *name) {
    osp_st *st;
    assert_int_equal(osp_st_open_file(WG "/golden.safetensors", &st), OSP_OK);
    const osp_st_tensor *t = osp_st_find(st, name);
    assert_non_null(t);
    assert_int_equal(t->dtype, OSP_DT_F32);
    float *v = malloc(t->nbytes);
    memcpy(v, t->data, t->nbytes);
    osp_st_close(st);
    return v;
}

/* Osprey against the twin on one recording, 80 and 128 bins; against the
 * goldens as well where given. */
static void check_recording(const char *path, int with_golden) {
    float *pcm;
    int64_t n;
    assert_int_equal(osp_audio_load(path, &pcm, &n), OSP_OK);
    double *power = twin_power(pcm, n);
    for (int nm = 80; nm <= 128; nm += 48) {
        float *twin = malloc(sizeof(float) * nm * OSP_MEL_FRAMES);
        twin_mel(power, nm, twin);
        float *ours = run_mel(nm, pcm, n, 0);
        double abs_err, r = frame_ratio(twin, ours, nm, &abs_err);
        printf("  %-28s %3d bins: osprey vs twin  max |diff| %.3g = %.4f of the goldens' bound\n", path, nm,
               abs_err, r);
        assert_true(r * GOLDEN_TOL <= TWIN_TOL);
        if (with_golden) {
            char name[16];
            snprintf(name, sizeof name, "mel%d", nm);
            float *g = golden(name);
            double ga, gr = frame_ratio(g, ours, nm, &ga), ta, tr = frame_ratio(g, twin, nm, &ta);
            printf("  %-28s %3d bins: osprey vs golden max |diff| %.3g = %.4f; twin vs golden %.3g = %.4f\n", path,
                   nm, ga, gr, ta, tr);
            assert_true(gr <= 1);
            assert_true(tr <= 1);
            free(g);
        }
        free(twin);
        free(ours);
    }
    free(power);
    osp_free(pcm);
}

static void test_twin_filters(void **state) {
    (void)state;
    for (int nm = 80; nm <= 128; nm += 48) {
        double *a = malloc(sizeof(double) * nm * OSP_MEL_NFREQ), *b = malloc(sizeof(double) * nm * OSP_MEL_NFREQ);
        assert_int_equal(osp_mel_filters(nm, a), OSP_OK);
        twin_filters(nm, b);
        double worst = 0, mx = 0;
        for (int i = 0; i < nm * OSP_MEL_NFREQ; i++) {
            worst = fmax(worst, fabs(a[i] - b[i]));
            mx = fmax(mx, fabs(b[i]));
        }
        /* the same formula in other words: f64 roundings apart */
        assert_true(worst <= 1e-12 * mx);
        free(a);
        free(b);
    }
}

static void test_jfk(void **state) {
    (void)state;
    check_recording(WG "/audio.wav", 1);
}

static void test_recordings(void **state) {
    (void)state;
    static const char *const files[] = {"speech.wav", "quiet.wav", "noise.wav", "silence.wav", "tone.wav"};
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        char p[64];
        snprintf(p, sizeof p, "data/audio/%s", files[i]);
        check_recording(p, 0);
    }
}

/* Digital silence is log10(1e-10) = -10 everywhere, its own max, so
 * (-10 + 4) / 4 exactly: never a NaN or -inf. */
static void test_silence(void **state) {
    (void)state;
    float *pcm;
    int64_t n;
    assert_int_equal(osp_audio_load("data/audio/silence.wav", &pcm, &n), OSP_OK);
    assert_int_equal(n, 16000);
    for (int nm = 80; nm <= 128; nm += 48) {
        float *out = run_mel(nm, pcm, n, 1);
        for (int64_t i = 0; i < (int64_t)nm * OSP_MEL_FRAMES; i++) assert_true(out[i] == -1.5f);
        free(out);
    }
    osp_free(pcm);
}

/* Frames split over the thread pool or computed on one thread: the same bits
 * (each frame is computed alone, in the same order of operations). */
static void test_threads(void **state) {
    (void)state;
    float *pcm;
    int64_t n;
    assert_int_equal(osp_audio_load("data/audio/speech.wav", &pcm, &n), OSP_OK);
    float *a = run_mel(80, pcm, n, 0), *b = run_mel(80, pcm, n, 1);
    assert_memory_equal(a, b, sizeof(float) * 80 * OSP_MEL_FRAMES);
    free(a);
    free(b);
    osp_free(pcm);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_twin_filters), cmocka_unit_test(test_jfk),     cmocka_unit_test(test_recordings),
        cmocka_unit_test(test_silence),      cmocka_unit_test(test_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
