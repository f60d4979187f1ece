/* audio/audio.c: decoding (libsndfile), downmix and resampling
 * (libsamplerate) to 16 kHz mono f32. The whole file is decoded at once:
 * speech files are small next to the model (an hour is 230 MB of f32). */
#include <samplerate.h>
#include <sndfile.h>
#include <stdlib.h>
#include <string.h>
#include "audio.h"
#include "core/fs.h"

/* Longest input accepted: 24 hours at 16 kHz (a bound on the decoded size,
 * against headers that claim absurd lengths). */
#define MAX_SECONDS (24 * 3600)

/* Reading from memory through libsndfile's virtual I/O. */
typedef struct membuf {
    const unsigned char *p;
    sf_count_t len, pos;
} membuf;

static sf_count_t vio_len(void *u) { return ((membuf *)u)->len; }
static sf_count_t vio_seek(sf_count_t off, int whence, void *u) {
    membuf *m = u;
    sf_count_t at = whence == SEEK_SET ? off : whence == SEEK_CUR ? m->pos + off : m->len + off;
    if (at < 0 || at > m->len) return -1;
    return m->pos = at;
}
static sf_count_t vio_read(void *ptr, sf_count_t n, void *u) {
    membuf *m = u;
    if (n > m->len - m->pos) n = m->len - m->pos;
    if (n <= 0) return 0;
    memcpy(ptr, m->p + m->pos, (size_t)n);
    m->pos += n;
    return n;
}
static sf_count_t vio_write(const void *ptr, sf_count_t n, void *u) { return 0; }
static sf_count_t vio_tell(void *u) { return ((membuf *)u)->pos; }

/* Decode every frame of an open file, average the channels, resample. */
static osp_status decode_open(SNDFILE *f, const SF_INFO *info, const char *name, float **pcm, int64_t *n) {
    *pcm = NULL;
    *n = 0;
    if (info->channels < 1 || info->samplerate < 1000 || info->samplerate > 768000)
        return osp_err(OSP_ERR_FORMAT, "%s: unsupported audio (%d channels at %d Hz)", name, info->channels,
                       info->samplerate);
    int ch = info->channels;
    /* the header's length is a hint (it may lie): at most 2^22 frames up front, grown as decoded */
    int64_t cap = info->frames > 0 && info->frames < (1 << 22) ? info->frames : 1 << 16;
    float *mono = osp_malloc(OSP_POOL_MISC, sizeof(float) * (size_t)cap);
    float *buf = osp_malloc(OSP_POOL_MISC, sizeof(float) * 4096 * (size_t)ch);
    if (!mono || !buf) {
        osp_free(mono);
        osp_free(buf);
        return osp_err(OSP_ERR_NOMEM, "%s: out of memory decoding audio", name);
    }
    int64_t got = 0;
    osp_status rc = OSP_OK;
    for (;;) {
        sf_count_t k = sf_readf_float(f, buf, 4096);
        if (k <= 0) break;
        if (got + k > (int64_t)MAX_SECONDS * info->samplerate) {
            rc = osp_err(OSP_ERR_RANGE, "%s: audio longer than %d hours", name, MAX_SECONDS / 3600);
            break;
        }
        if (got + k > cap) {
            int64_t nc = cap * 2 > got + k ? cap * 2 : got + k;
            float *m2 = osp_malloc(OSP_POOL_MISC, sizeof(float) * (size_t)nc);
            if (!m2) {
                rc = osp_err(OSP_ERR_NOMEM, "%s: out of memory decoding audio", name);
                break;
            }
            memcpy(m2, mono, sizeof(float) * (size_t)got);
            osp_free(mono);
            mono = m2;
            cap = nc;
        }
        for (sf_count_t i = 0; i < k; i++) {
            float s = 0;
            for (int c = 0; c < ch; c++) s += buf[i * ch + c];
            mono[got + i] = ch == 1 ? s : s / (float)ch;
        }
        got += k;
    }
    osp_free(buf);
    if (rc == OSP_OK && sf_error(f) != SF_ERR_NO_ERROR)
        rc = osp_err(OSP_ERR_FORMAT, "%s: cannot decode the audio: %s", name, sf_strerror(f));
    if (rc == OSP_OK && got == 0) rc = osp_err(OSP_ERR_FORMAT, "%s: the audio is empty (0 samples)", name);
    if (rc == OSP_OK) {
        for (int64_t i = 0; i < got; i++)
            if (!(mono[i] == mono[i])) {
                rc = osp_err(OSP_ERR_FORMAT, "%s: the audio has NaN samples", name);
                break;
            }
    }
    if (rc != OSP_OK) {
        osp_free(mono);
        return rc;
    }
    if (info->samplerate == OSP_AUDIO_RATE) {
        *pcm = mono;
        *n = got;
        return OSP_OK;
    }
    rc = osp_audio_resample(mono, got, info->samplerate, pcm, n);
    osp_free(mono);
    return rc;
}

osp_status osp_audio_load(const char *path, float **pcm, int64_t *n) {
    *pcm = NULL;
    *n = 0;
    if (!osp_is_file(path)) return osp_err(OSP_ERR_IO, "%s: no such audio file", path);
    SF_INFO info;
    memset(&info, 0, sizeof info);
    SNDFILE *f = sf_open(path, SFM_READ, &info);
    if (!f) return osp_err(OSP_ERR_FORMAT, "%s: not a readable audio file (%s)", path, sf_strerror(NULL));
    osp_status rc = decode_open(f, &info, path, pcm, n);
    sf_close(f);
    return rc;
}

osp_status osp_audio_decode(const void *buf, size_t len, const char *name, float **pcm, int64_t *n) {
    *pcm = NULL;
    *n = 0;
    if (!buf || len == 0) return osp_err(OSP_ERR_FORMAT, "%s: the audio is empty (0 bytes)", name);
    membuf m = {buf, (sf_count_t)len, 0};
    SF_VIRTUAL_IO vio = {vio_len, vio_seek, vio_read, vio_write, vio_tell};
    SF_INFO info;
    memset(&info, 0, sizeof info);
    SNDFILE *f = sf_open_virtual(&vio, SFM_READ, &info, &m);
    if (!f) return osp_err(OSP_ERR_FORMAT, "%s: not a readable audio file (%s)", name, sf_strerror(NULL));
    osp_status rc = decode_open(f, &info, name, pcm, n);
    sf_close(f);
    return rc;
}

osp_status osp_audio_resample(const float *in, int64_t n, int rate, float **out, int64_t *n_out) {
    *out = NULL;
    *n_out = 0;
    if (n < 0 || rate < 1) return osp_err(OSP_ERR_INVALID, "resample: bad input (%lld samples at %d Hz)", (long long)n, rate);
    double ratio = (double)OSP_AUDIO_RATE / rate;
    int64_t cap = (int64_t)(n * ratio) + 64;
    float *o = osp_malloc(OSP_POOL_MISC, sizeof(float) * (size_t)cap);
    if (!o) return osp_err(OSP_ERR_NOMEM, "resample: out of memory (%lld samples)", (long long)cap);
    if (rate == OSP_AUDIO_RATE) {
        memcpy(o, in, sizeof(float) * (size_t)n);
        *out = o;
        *n_out = n;
        return OSP_OK;
    }
    SRC_DATA d = {.data_in = in, .data_out = o, .input_frames = (long)n, .output_frames = (long)cap,
                  .src_ratio = ratio, .end_of_input = 1};
    int e = src_simple(&d, SRC_SINC_BEST_QUALITY, 1);
    if (e) {
        osp_free(o);
        return osp_err(OSP_ERR_INTERNAL, "resample %d Hz -> 16 kHz: %s", rate, src_strerror(e));
    }
    if (d.output_frames_gen <= 0) {
        osp_free(o);
        return osp_err(OSP_ERR_FORMAT, "the audio is too short to resample (%lld samples at %d Hz)", (long long)n, rate);
    }
    *out = o;
    *n_out = d.output_frames_gen;
    return OSP_OK;
}
