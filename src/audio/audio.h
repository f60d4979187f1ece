/* audio/: speech input for Whisper.
 *
 * osp_audio_load / osp_audio_decode: any file libsndfile reads (WAV, FLAC,
 * OGG/Vorbis/Opus, MP3 with libsndfile >= 1.1), any rate and channel count,
 * to 16 kHz mono f32 in [-1, 1]: channels averaged, then resampled with
 * libsamplerate (SRC_SINC_BEST_QUALITY) when the rate is not 16 kHz. Integer
 * PCM is scaled by 1/32768 (16-bit), as soundfile/torchaudio do.
 * Unreadable, truncated-to-nothing or empty audio is OSP_ERR_FORMAT (or
 * OSP_ERR_IO for a missing file) with a message naming the input.
 *
 * osp_mel_*: the log-mel spectrogram exactly as transformers'
 * WhisperFeatureExtractor computes it: the samples are zero-padded or cut to
 * 30 s (480000), reflect-padded by n_fft/2 at both ends, framed every 160
 * samples with a periodic Hann window of 400, |rfft|^2 (FFTW in f64, the
 * spectrum rounded to complex64 as numpy stores it), Slaney mel filters
 * (computed here in f64, as transformers' mel_filter_bank with norm and
 * scale "slaney"), log10 of max(1e-10, .) in f64 rounded to f32, the last
 * frame dropped (3000 remain), clamped at (max - 8), then (x + 4) / 4: the
 * extractor's numpy path (_np_extract_fbank_features), which the goldens
 * hold. Output [n_mels, 3000] row-major f32.
 */
#ifndef OSP_AUDIO_H
#define OSP_AUDIO_H

#include <stddef.h>
#include <stdint.h>
#include "core/core.h"

#define OSP_AUDIO_RATE 16000
#define OSP_MEL_NFFT 400
#define OSP_MEL_HOP 160
#define OSP_MEL_NFREQ (OSP_MEL_NFFT / 2 + 1)      /* 201 */
#define OSP_MEL_WINDOW_SAMPLES (30 * OSP_AUDIO_RATE) /* 480000 */
#define OSP_MEL_FRAMES (OSP_MEL_WINDOW_SAMPLES / OSP_MEL_HOP) /* 3000 */

/* Decode the file at path into *pcm (osp_malloc'd, freed with osp_free),
 * *n samples at 16 kHz mono. */
osp_status osp_audio_load(const char *path, float **pcm, int64_t *n);
/* The same for an in-memory file (an upload); name is for messages. */
osp_status osp_audio_decode(const void *buf, size_t len, const char *name, float **pcm, int64_t *n);
/* Resample mono f32 from `rate` Hz to 16 kHz (a copy when rate is 16000). */
osp_status osp_audio_resample(const float *in, int64_t n, int rate, float **out, int64_t *n_out);

/* Slaney mel filters, [n_mels, 201] row-major, for 16 kHz, n_fft 400,
 * 0..8000 Hz (what WhisperFeatureExtractor builds, in f64 as it keeps them). */
osp_status osp_mel_filters(int n_mels, double *out);

typedef struct osp_mel osp_mel; /* filters + FFT plan; use from one thread at a time */
osp_status osp_mel_new(int n_mels, osp_mel **out);
void osp_mel_free(osp_mel *m);
int osp_mel_bins(const osp_mel *m);
/* 1: compute on the calling thread only, not the process thread pool. */
void osp_mel_set_serial(osp_mel *m, int serial);
/* The log-mel spectrogram of pcm[0..n) (the first 30 s; shorter input is
 * zero-padded) into out[n_mels, 3000]. */
osp_status osp_mel_compute(osp_mel *m, const float *pcm, int64_t n, float *out);

#endif
