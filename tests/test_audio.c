/* audio/: decoding (file and memory), downmix, resampling, clear errors for
 * bad input, and the mel filters against the real Whisper filter banks
 * (data/goldens/whisper/mel_{80,128}.npy, openai-whisper's assets). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <sndfile.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "audio/audio.h"
#include "core/core.h"

/* A .npy file of '<f4' [rows, cols], C order. */
static float *read_npy(const char *path, int rows, int cols) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    unsigned char h[10];
    float *v = NULL;
    if (fread(h, 1, 10, f) == 10 && !memcmp(h, "\x93NUMPY", 6)) {
        int hl = h[8] | h[9] << 8;
        char hdr[512] = {0};
        char want[64];
        snprintf(want, sizeof want, "(%d, %d)", rows, cols);
        if (hl < (int)sizeof hdr && fread(hdr, 1, hl, f) == (size_t)hl && strstr(hdr, "'<f4'") && strstr(hdr, want)) {
            v = malloc(sizeof(float) * rows * cols);
            if (fread(v, sizeof(float), (size_t)rows * cols, f) != (size_t)rows * cols) {
                free(v);
                v = NULL;
            }
        }
    }
    fclose(f);
    return v;
}

static void check_filters(int n_mels) {
    char p[128];
    snprintf(p, sizeof p, "data/goldens/whisper/mel_%d.npy", n_mels);
    float *ref = read_npy(p, n_mels, OSP_MEL_NFREQ);
    assert_non_null(ref);
    double *ours = malloc(sizeof(double) * n_mels * OSP_MEL_NFREQ);
    assert_int_equal(osp_mel_filters(n_mels, ours), OSP_OK);
    double worst = 0, mx = 0;
    for (int i = 0; i < n_mels * OSP_MEL_NFREQ; i++) {
        worst = fmax(worst, fabs(ours[i] - ref[i]));
        mx = fmax(mx, fabs(ref[i]));
    }
    /* librosa (the .npy) and transformers compute the same formula in f64 */
    assert_true(mx > 0.01);
    assert_true(worst <= 1e-6 * mx);
    free(ref);
    free(ours);
}

static void test_filters(void **state) {
    (void)state;
    check_filters(80);
    check_filters(128);
    double f[OSP_MEL_NFREQ];
    assert_int_equal(osp_mel_filters(0, f), OSP_ERR_INVALID);
}

/* A WAV (16-bit PCM) of `frames` frames of `ch` channels at `rate`, channel c
 * a sine of freq[c] Hz at amplitude 0.5, written to path. */
static void write_wav(const char *path, int rate, int ch, int64_t frames, const double *freq, int format) {
    SF_INFO info = {.samplerate = rate, .channels = ch, .format = format};
    SNDFILE *f = sf_open(path, SFM_WRITE, &info);
    assert_non_null(f);
    float *buf = malloc(sizeof(float) * ch * (frames ? frames : 1));
    for (int64_t i = 0; i < frames; i++)
        for (int c = 0; c < ch; c++) buf[i * ch + c] = (float)(0.5 * sin(2 * M_PI * freq[c] * i / rate));
    assert_int_equal(sf_writef_float(f, buf, frames), frames);
    sf_close(f);
    free(buf);
}

/* Amplitude of a sine of `freq` Hz in x (16 kHz), by correlation. */
static double sine_amp(const float *x, int64_t n, double freq) {
    double s = 0, c = 0;
    for (int64_t i = 0; i < n; i++) {
        s += x[i] * sin(2 * M_PI * freq * i / 16000);
        c += x[i] * cos(2 * M_PI * freq * i / 16000);
    }
    return 2 * sqrt(s * s + c * c) / n;
}

static void test_decode_resample(void **state) {
    (void)state;
    char path[] = "/tmp/osp_test_audioXXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    /* 16 kHz mono: read as is, 16-bit samples scaled by 1/32768 */
    double f1[] = {440};
    write_wav(path, 16000, 1, 16000, f1, SF_FORMAT_WAV | SF_FORMAT_PCM_16);
    float *pcm;
    int64_t n;
    assert_int_equal(osp_audio_load(path, &pcm, &n), OSP_OK);
    assert_int_equal(n, 16000);
    assert_true(fabs(sine_amp(pcm, n, 440) - 0.5) < 1e-3);
    osp_free(pcm);
    /* 44.1 kHz stereo, 300 Hz left and 1 kHz right: averaged, then resampled */
    double f2[] = {300, 1000};
    write_wav(path, 44100, 2, 44100 * 2, f2, SF_FORMAT_WAV | SF_FORMAT_PCM_16);
    assert_int_equal(osp_audio_load(path, &pcm, &n), OSP_OK);
    assert_true(llabs(n - 32000) <= 2);
    /* away from the edges, each tone at half its amplitude */
    assert_true(fabs(sine_amp(pcm + 4000, 24000, 300) - 0.25) < 2e-3);
    assert_true(fabs(sine_amp(pcm + 4000, 24000, 1000) - 0.25) < 2e-3);
    assert_true(sine_amp(pcm + 4000, 24000, 700) < 1e-3);
    osp_free(pcm);
    /* FLAC from memory (an upload) */
    write_wav(path, 8000, 1, 8000, f1, SF_FORMAT_FLAC | SF_FORMAT_PCM_16);
    FILE *f = fopen(path, "rb");
    unsigned char *bytes = malloc(1 << 20);
    size_t len = fread(bytes, 1, 1 << 20, f);
    fclose(f);
    assert_int_equal(osp_audio_decode(bytes, len, "upload.flac", &pcm, &n), OSP_OK);
    assert_true(llabs(n - 16000) <= 2);
    assert_true(fabs(sine_amp(pcm + 2000, 12000, 440) - 0.5) < 2e-3);
    osp_free(pcm);
    /* truncated to its first bytes: an error, not a crash */
    assert_int_not_equal(osp_audio_decode(bytes, 20, "cut.flac", &pcm, &n), OSP_OK);
    assert_null(pcm);
    free(bytes);
    /* 0 s */
    write_wav(path, 16000, 1, 0, f1, SF_FORMAT_WAV | SF_FORMAT_PCM_16);
    assert_int_equal(osp_audio_load(path, &pcm, &n), OSP_ERR_FORMAT);
    assert_non_null(strstr(osp_last_error(), "empty"));
    /* not audio */
    f = fopen(path, "wb");
    fputs("{\"this\": \"is json, not audio\"}", f);
    fclose(f);
    assert_int_equal(osp_audio_load(path, &pcm, &n), OSP_ERR_FORMAT);
    assert_non_null(strstr(osp_last_error(), path));
    assert_int_equal(osp_audio_decode("RIFF", 4, "x.wav", &pcm, &n), OSP_ERR_FORMAT);
    assert_int_equal(osp_audio_decode(NULL, 0, "x.wav", &pcm, &n), OSP_ERR_FORMAT);
    unlink(path);
    assert_int_equal(osp_audio_load(path, &pcm, &n), OSP_ERR_IO);
}

/* Silence is log10(1e-10) everywhere, which is its own max: (−10 + 4) / 4.
 * A 1 kHz tone peaks in the bins around 1 kHz, and in every frame. */
static void test_mel(void **state) {
    (void)state;
    osp_mel *m;
    assert_int_equal(osp_mel_new(80, &m), OSP_OK);
    float *out = malloc(sizeof(float) * 80 * OSP_MEL_FRAMES);
    assert_int_equal(osp_mel_compute(m, NULL, 0, out), OSP_OK);
    for (int i = 0; i < 80 * OSP_MEL_FRAMES; i++) assert_true(out[i] == -1.5f);
    int64_t n = OSP_MEL_WINDOW_SAMPLES + 1000; /* longer than 30 s: cut */
    float *x = malloc(sizeof(float) * n);
    for (int64_t i = 0; i < n; i++) x[i] = (float)(0.1 * sin(2 * M_PI * 1000 * i / 16000.0));
    assert_int_equal(osp_mel_compute(m, x, n, out), OSP_OK);
    double filt[80 * OSP_MEL_NFREQ];
    osp_mel_filters(80, filt);
    int best_bin = 0; /* the filter with the most weight at 1 kHz (FFT bin 25) */
    for (int b = 1; b < 80; b++)
        if (filt[b * OSP_MEL_NFREQ + 25] > filt[best_bin * OSP_MEL_NFREQ + 25]) best_bin = b;
    for (int f = 1; f < OSP_MEL_FRAMES; f += 499) { /* frame 0 sees the reflected edge */
        int arg = 0;
        for (int b = 1; b < 80; b++)
            if (out[b * OSP_MEL_FRAMES + f] > out[arg * OSP_MEL_FRAMES + f]) arg = b;
        /* window leakage spreads the tone over the neighbouring FFT bins */
        assert_true(abs(arg - best_bin) <= 1);
        assert_true(out[arg * OSP_MEL_FRAMES + f] > out[5 * OSP_MEL_FRAMES + f] + 1);
    }
    free(x);
    free(out);
    osp_mel_free(m);
    assert_int_equal(osp_mel_new(0, &m), OSP_ERR_INVALID);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_filters),
        cmocka_unit_test(test_decode_resample),
        cmocka_unit_test(test_mel),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
