/* speech/batch: concurrent transcriptions that share the model's steps.
 *
 * A batch owns one decoder state of `slots` windows (model/whisper.h:
 * osp_whisper_state_new_slots) and a thread that runs it. Each
 * transcription holds a slot for its whole audio and runs openai-whisper's
 * decoding (speech/transcribe.c, unchanged) on its own thread over a view of
 * that state: its encodes and decoder steps are jobs the batch thread takes
 * together with every other transcription's (windows through the encoder in
 * one call, beams and samples of every request as rows of one decoder step).
 * Every per-request rule (temperature fallback, beams, timestamps, prompts,
 * language detection, word timestamps) stays on the request's thread.
 *
 * Batch invariance: a request's tokens are computed as they are alone (the
 * backend's exact tokens, a window's matmuls and cross-attention as alone),
 * so its text is the same alone or among others. Long audio keeps its windows
 * in order within its slot while other requests' windows share the calls. */
#ifndef OSP_SPEECH_BATCH_H
#define OSP_SPEECH_BATCH_H

#include "speech/transcribe.h"

typedef struct osp_wbatch osp_wbatch;

typedef struct osp_wbatch_opts {
    int32_t slots;       /* transcriptions at once (8); more wait for a slot */
    int32_t rows;        /* decoder rows a transcription may use: its beam size, at most (5) */
    int32_t enc_windows; /* windows an encoder call takes (4) */
    int serial;          /* 1: the batch thread computes alone, off the process thread pool (osp_whisper_state_set_serial) */
    int fast;            /* the device's production precision for every transcription (osp_whisper_state_set_fast) */
    double gather_ms;    /* how long the batch thread waits for the other transcriptions' jobs (2 ms) */
    double hold_ms;      /* how long, at most, for those of the last round's transcriptions (20 ms) after it */
} osp_wbatch_opts;

void osp_wbatch_defaults(osp_wbatch_opts *o);

/* What the batch thread did since the batch began (GET /metrics): how well concurrent transcriptions share steps. */
typedef struct osp_wbatch_stats {
    int64_t steps;          /* decoder steps run */
    int64_t step_jobs;      /* transcriptions' steps they held (step_jobs / steps: transcriptions a step) */
    int64_t step_tokens;    /* tokens they computed */
    int64_t encodes;        /* encoder calls */
    int64_t windows;        /* windows those calls encoded */
    double compute_s;       /* seconds the batch thread spent computing */
    double gather_s;        /* seconds it waited for other transcriptions' jobs with one queued */
} osp_wbatch_stats;
void osp_wbatch_get_stats(osp_wbatch *b, osp_wbatch_stats *out);
osp_status osp_wbatch_new(const osp_whisper *m, const osp_wbatch_opts *o, osp_wbatch **out);
/* No transcription may be running. */
void osp_wbatch_free(osp_wbatch *b);

/* osp_transcribe through the batch (blocking; any number of threads at once).
 * o->serial and o->fast are the batch's; o->beam_size at most its rows. */
osp_status osp_wbatch_transcribe(osp_wbatch *b, const osp_tokenizer *tok, const float *pcm, int64_t n,
                                 const osp_transcribe_opts *o, osp_transcript *out);

#endif
