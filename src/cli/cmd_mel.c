/* osprey mel FILE --n-mels 80|128 --output OUT.safetensors: Whisper's
 * log-mel spectrogram of the first 30 s of FILE, `mel` F32 [n_mels, 3000]
 * (the front end's parity tool). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "audio/audio.h"
#include "cli.h"
#include "model/st_write.h"

static int usage(void) {
    fprintf(stderr, "usage: osprey mel FILE [--n-mels 80|128] --output OUT.safetensors [-t THREADS]\n"
                    "  FILE: WAV, FLAC, OGG or MP3, any rate and channels (resampled to 16 kHz mono)\n");
    return 2;
}

int osp_cmd_mel(int argc, char **argv) {
    const char *file = NULL, *output = NULL;
    int n_mels = 80, threads = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--n-mels") && i + 1 < argc) n_mels = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--output") && i + 1 < argc) output = argv[++i];
        else if ((!strcmp(argv[i], "-t") || !strcmp(argv[i], "--threads")) && i + 1 < argc) threads = atoi(argv[++i]);
        else if (argv[i][0] != '-' && !file) file = argv[i];
        else return usage();
    }
    if (!file || !output) return usage();
    if (n_mels != 80 && n_mels != 128) {
        fprintf(stderr, "osprey mel: --n-mels must be 80 or 128\n");
        return 2;
    }
    osp_set_threads(threads);
    float *pcm = NULL, *mel = NULL;
    int64_t n = 0;
    osp_mel *m = NULL;
    int rc = 0;
    if (osp_audio_load(file, &pcm, &n) != OSP_OK || osp_mel_new(n_mels, &m) != OSP_OK) {
        rc = osp_cli_fail("mel");
        goto done;
    }
    mel = osp_malloc(OSP_POOL_MISC, sizeof(float) * (size_t)n_mels * OSP_MEL_FRAMES);
    if (!mel || osp_mel_compute(m, pcm, n, mel) != OSP_OK) {
        if (!mel) osp_err(OSP_ERR_NOMEM, "out of memory");
        rc = osp_cli_fail("mel");
        goto done;
    }
    osp_st_writer *w = osp_st_writer_new();
    int64_t shape[2] = {n_mels, OSP_MEL_FRAMES};
    if (!w || osp_st_writer_add(w, "mel", OSP_DT_F32, 2, shape, mel, sizeof(float) * (size_t)n_mels * OSP_MEL_FRAMES) != OSP_OK ||
        osp_st_writer_write(w, output, NULL, NULL) != OSP_OK)
        rc = osp_cli_fail("mel");
    osp_st_writer_free(w);
done:
    osp_free(mel);
    osp_free(pcm);
    osp_mel_free(m);
    return rc;
}
