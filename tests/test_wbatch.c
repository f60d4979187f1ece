/* speech/batch: transcriptions through the batch, several at once with
 * different options, give exactly what each gives alone (osp_transcribe on
 * a state of its own): the same segments, tokens, times, temperatures,
 * log-probabilities and words, bit for bit. On the tiny golden checkpoint. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>
#include "audio/audio.h"
#include "speech/batch.h"

#define WG "data/goldens/whisper"
#define N_JOBS 7
static char tok_path[64];
static osp_tokenizer *tok;
static const int32_t V = 51865;

static int setup(void **state) {
    (void)state;
    snprintf(tok_path, sizeof tok_path, "/tmp/osp_wbtokXXXXXX.tiktoken");
    int fd = mkstemps(tok_path, 9);
    if (fd < 0) return -1;
    close(fd);
    gzFile in = gzopen("data/tokenizers/whisper/multilingual.tiktoken.gz", "rb");
    FILE *out = fopen(tok_path, "wb");
    if (!in || !out) return -1;
    char buf[65536];
    int k;
    while ((k = gzread(in, buf, sizeof buf)) > 0) fwrite(buf, 1, (size_t)k, out);
    gzclose(in);
    fclose(out);
    return osp_whisper_tokenizer_load(WG, tok_path, V, &tok) == OSP_OK ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    osp_tokenizer_free(tok);
    unlink(tok_path);
    return 0;
}

typedef struct job {
    osp_wbatch *b;
    const float *pcm;
    int64_t n;
    osp_transcribe_opts o;
    osp_transcript alone, batched;
    osp_status rc;
} job;

static void *run_batched(void *p) {
    job *j = p;
    j->rc = osp_wbatch_transcribe(j->b, tok, j->pcm, j->n, &j->o, &j->batched);
    return NULL;
}

static void same_transcript(const osp_transcript *a, const osp_transcript *b) {
    assert_string_equal(a->text, b->text);
    assert_string_equal(a->language, b->language);
    assert_int_equal(a->n_segs, b->n_segs);
    for (int32_t i = 0; i < a->n_segs; i++) {
        const osp_segment *x = &a->segs[i], *y = &b->segs[i];
        assert_int_equal(x->n_tokens, y->n_tokens);
        assert_memory_equal(x->tokens, y->tokens, sizeof(int32_t) * x->n_tokens);
        assert_int_equal(x->seek, y->seek);
        assert_true(x->start == y->start && x->end == y->end && x->temperature == y->temperature);
        assert_true(x->avg_logprob == y->avg_logprob && x->compression_ratio == y->compression_ratio &&
                    x->no_speech_prob == y->no_speech_prob);
        assert_int_equal(x->n_words, y->n_words);
        for (int32_t k = 0; k < x->n_words; k++) {
            assert_string_equal(x->words[k].text, y->words[k].text);
            assert_true(x->words[k].start == y->words[k].start && x->words[k].end == y->words[k].end &&
                        x->words[k].prob == y->words[k].prob);
        }
    }
}

static void test_batch_as_alone(void **state) {
    (void)state;
    osp_whisper *m;
    assert_int_equal(osp_whisper_load(WG, &m), OSP_OK);
    float *pcm;
    int64_t n;
    assert_int_equal(osp_audio_load(WG "/audio.wav", &pcm, &n), OSP_OK);
    /* 40 s: the recording, 2 s of silence, the recording again, then silence (two windows) */
    const int64_t N = 40 * 16000;
    float *longpcm = calloc(N, sizeof(float));
    memcpy(longpcm, pcm, sizeof(float) * n);
    memcpy(longpcm + n + 32000, pcm, sizeof(float) * n);
    job jobs[N_JOBS];
    for (int i = 0; i < N_JOBS; i++) {
        memset(&jobs[i], 0, sizeof jobs[i]);
        jobs[i].pcm = pcm;
        jobs[i].n = n;
        osp_transcribe_defaults(&jobs[i].o);
        jobs[i].o.serial = 1;
    }
    jobs[0].o.language = "en"; /* beam search (5) at 0, fallback schedule */
    jobs[1].o.language = "de"; /* sampled at 0.4 alone: best of 5, seeded */
    jobs[1].o.temperature = 0.4f;
    jobs[1].o.no_fallback = 1;
    jobs[2].o.timestamps = 0; /* language detected; greedy, no timestamps */
    jobs[2].o.beam_size = 1;
    jobs[3].o.language = "en"; /* word timestamps (the alignment heads captured) */
    jobs[3].o.word_timestamps = 1;
    jobs[3].o.no_fallback = 1;
    jobs[4].o.language = "en"; /* long audio with a prompt: windows in order, the previous text as prompt */
    jobs[4].pcm = longpcm;
    jobs[4].n = N;
    jobs[4].o.prompt = "So my fellow Americans";
    jobs[4].o.no_fallback = 1;
    jobs[5].o.language = "fr"; /* the fallback schedule from 0.2, another seed */
    jobs[5].o.temperature = 0.2f;
    jobs[5].o.seed = 7;
    jobs[5].o.best_of = 2;
    jobs[6].o.language = "en"; /* translate, beam 3 */
    jobs[6].o.translate = 1;
    jobs[6].o.beam_size = 3;
    jobs[6].o.no_fallback = 1;
    for (int i = 0; i < N_JOBS; i++)
        assert_int_equal(osp_transcribe(m, tok, jobs[i].pcm, jobs[i].n, &jobs[i].o, &jobs[i].alone), OSP_OK);
    /* fewer slots than jobs (some wait for one), two windows an encode */
    osp_wbatch_opts bo;
    osp_wbatch_defaults(&bo);
    bo.slots = 5;
    bo.enc_windows = 2;
    osp_wbatch *b;
    assert_int_equal(osp_wbatch_new(m, &bo, &b), OSP_OK);
    pthread_t th[N_JOBS];
    for (int i = 0; i < N_JOBS; i++) {
        jobs[i].b = b;
        assert_int_equal(pthread_create(&th[i], NULL, run_batched, &jobs[i]), 0);
    }
    for (int i = 0; i < N_JOBS; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < N_JOBS; i++) {
        assert_int_equal(jobs[i].rc, OSP_OK);
        assert_true(jobs[i].alone.n_segs > 0);
        same_transcript(&jobs[i].alone, &jobs[i].batched);
        osp_transcript_free(&jobs[i].batched);
    }
    /* one through the batch alone: the same too */
    assert_int_equal(osp_wbatch_transcribe(b, tok, pcm, n, &jobs[0].o, &jobs[0].batched), OSP_OK);
    same_transcript(&jobs[0].alone, &jobs[0].batched);
    osp_transcript_free(&jobs[0].batched);
    /* a beam wider than the batch's rows; a bad request fails alone */
    osp_transcribe_opts o = jobs[0].o;
    o.beam_size = 6;
    assert_int_equal(osp_wbatch_transcribe(b, tok, pcm, n, &o, &jobs[0].batched), OSP_ERR_INVALID);
    o.beam_size = 5;
    o.language = "klingon";
    assert_int_equal(osp_wbatch_transcribe(b, tok, pcm, n, &o, &jobs[0].batched), OSP_ERR_INVALID);
    osp_wbatch_free(b);
    for (int i = 0; i < N_JOBS; i++) osp_transcript_free(&jobs[i].alone);
    free(longpcm);
    osp_free(pcm);
    osp_whisper_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_batch_as_alone)};
    return cmocka_run_group_tests(tests, setup, teardown);
}
