/* speech/: transcription with a Whisper model, as openai-whisper decodes.
 *
 * Tokens (osp_wtokens): the special and timestamp ids of the model's
 * tokenizer (tokenizer.json of a Hugging Face folder, or openai's tiktoken
 * rank files with the specials appended as openai-whisper does: <|endoftext|>,
 * <|startoftranscript|>, one per language, <|translate|>, <|transcribe|>,
 * <|startoflm|>, <|startofprev|>, <|nospeech|>, <|notimestamps|>, then
 * <|0.00|> .. <|30.00|>). Multilingual models (vocab >= 51865) start with
 * <|startoftranscript|><|lang|><|task|>; English-only ones with
 * <|startoftranscript|> alone.
 *
 * Logit filters (osp_whisper_filter_logits), in openai-whisper's order:
 * SuppressBlank (" " and <|endoftext|> at the first sampled step),
 * SuppressTokens (its non-speech symbol list + the task/special tokens),
 * ApplyTimestampRules (timestamps in pairs, never decreasing, a segment of
 * non-zero length, the first token a timestamp of at most 1.0 s, a timestamp
 * forced when their total probability beats every text token).
 *
 * One window: beam search at temperature 0 (openai-whisper's
 * BeamSearchDecoder, patience 1: beam_size + 1 candidates per beam, done when
 * beam_size sequences ended; the best by sum logprob / length) or greedy
 * (beam_size 1), sampled above 0 (the best of `best_of` samples by sum
 * logprob / length), until <|endoftext|> or 224 tokens; its
 * avg_logprob (sum over tokens incl. <|endoftext|>, / (text tokens + 1)),
 * no_speech_prob (the <|nospeech|> probability at <|startoftranscript|>) and
 * compression ratio (zlib, as Python's zlib.compress). Temperature fallback
 * over 0.0, 0.2, .., 1.0 while the ratio is above 2.4 or avg_logprob below
 * -1.0 (unless no_speech_prob is above 0.6 too: silence).
 *
 * Long audio: 30 s windows; a window advances to its last timestamp when it
 * ends inside speech, by its whole length otherwise; the previous text is
 * the next window's prompt (<|startofprev|>) until a window needed a
 * temperature above 0.5. Each window's log-mel is computed from its own
 * samples (zero audio past the end), as transformers' feature extractor does.
 */
#ifndef OSP_TRANSCRIBE_H
#define OSP_TRANSCRIBE_H

#include <stddef.h>
#include <stdint.h>
#include "core/core.h"
#include "model/whisper.h"
#include "text/tokenizer.h"

#define OSP_WHISPER_MAX_LANGS 100
#define OSP_WHISPER_SAMPLE_LEN 224 /* tokens sampled per window, at most (n_text_ctx / 2) */

typedef struct osp_wtokens {
    int32_t vocab; /* the model's logits size */
    int32_t eot, sot, sot_prev, sot_lm, no_speech, no_timestamps, translate, transcribe;
    int32_t lang0;    /* <|en|>: languages are lang0 .. lang0 + n_langs - 1 */
    int32_t n_langs;  /* 0 for English-only models */
    int32_t ts_begin; /* <|0.00|>; <|k·0.02|> = ts_begin + k */
    int32_t space;    /* " " (SuppressBlank) */
    int32_t *suppress; /* sorted, osp_malloc'd */
    int32_t n_suppress;
} osp_wtokens;

/* Find every special id in tok; vocab is the model's. */
osp_status osp_wtokens_init(const osp_tokenizer *tok, int32_t vocab, osp_wtokens *w);
void osp_wtokens_free(osp_wtokens *w);

/* Language codes in openai-whisper's order ("en", "zh", ..., "yue"). */
const char *osp_whisper_lang_code(int i);
const char *osp_whisper_lang_name(int i); /* "english", ... */
/* Index of a code or an English name (any case), or -1. */
int osp_whisper_lang_index(const char *s);

/* Load the tokenizer for a Whisper model: `path` (a tokenizer.json, a folder
 * with one, or a .tiktoken rank file), else the model folder's
 * tokenizer.json, else a multilingual.tiktoken / gpt2.tiktoken in it. */
osp_status osp_whisper_tokenizer_load(const char *model_dir, const char *path, int32_t vocab, osp_tokenizer **out);

/* Apply the filters to logits[vocab] for the sequence tokens[0..n) whose
 * sampled part starts at sample_begin. timestamps: 0 when decoding
 * without timestamps (<|notimestamps|> in the prompt). */
void osp_whisper_filter_logits(const osp_wtokens *w, int timestamps, const int32_t *tokens, int32_t n,
                               int32_t sample_begin, float *logits);

/* Python's len(zlib.compress(text)) / len(text); 0 for empty text. */
double osp_compression_ratio(const char *text, size_t len);

/* What one decoding of a window gave. */
typedef struct osp_wresult {
    int32_t tokens[OSP_WHISPER_SAMPLE_LEN + 1]; /* sampled, without <|endoftext|> */
    int32_t n_tokens;
    double sum_logprob, avg_logprob, no_speech_prob, compression_ratio;
    float temperature;
} osp_wresult;

typedef struct osp_fallback_opts {
    int n_temps;
    float temps[8];
    double compression_ratio_threshold; /* 2.4; <= 0: none */
    double logprob_threshold;           /* -1.0; NaN: none */
    double no_speech_threshold;         /* 0.6; NaN: none */
} osp_fallback_opts;

/* Decode at one temperature into *r (r->compression_ratio set too). */
typedef osp_status (*osp_wdecode_fn)(void *ctx, float temperature, osp_wresult *r);
/* openai-whisper's decode_with_fallback over o->temps: returns the last
 * result tried. */
osp_status osp_whisper_fallback(const osp_fallback_opts *o, osp_wdecode_fn fn, void *ctx, osp_wresult *r);

typedef struct osp_word {
    char *text;            /* osp_malloc'd; "" when merged into a neighbour */
    int32_t tok0, n_tok;   /* its tokens among the window's text tokens */
    double start, end;     /* seconds */
    double prob;           /* mean probability of its tokens */
} osp_word;

typedef struct osp_segment {
    int32_t id, seek;      /* seek: the window's first mel frame */
    double start, end;     /* seconds */
    char *text;            /* osp_malloc'd, UTF-8 */
    int32_t *tokens;       /* text and timestamp tokens, osp_malloc'd */
    int32_t n_tokens;
    float temperature;
    double avg_logprob, compression_ratio, no_speech_prob;
    osp_word *words;       /* with word timestamps, osp_malloc'd */
    int32_t n_words;
} osp_segment;

/* Splitting one window's tokens into segments (time_offset: the window's
 * start in seconds; segment_frames: its mel frames of audio). Returns the
 * segments' token ranges [b, e) in ranges (2 per segment, at most n + 1
 * segments), their count in *n_seg, their times in times (2 per segment,
 * relative to the window), and the frames the window advances by. */
int32_t osp_whisper_split(const osp_wtokens *w, const int32_t *tokens, int32_t n, int32_t segment_frames,
                          int32_t *ranges, double *times, int32_t *n_seg);

typedef struct osp_transcribe_opts {
    const char *language;   /* code or name; NULL: detected from the first window (multilingual) */
    int translate;          /* task translate (to English) */
    int timestamps;         /* 1: timestamp tokens (segments); 0: <|notimestamps|> */
    const char *prompt;     /* initial prompt, or NULL */
    float temperature;      /* the first temperature (0) */
    int no_fallback;        /* 1: only `temperature` */
    int best_of;            /* samples per temperature > 0 (5) */
    int beam_size;          /* beam search at temperature 0 (5; 1: greedy), patience 1 */
    int sample_len;         /* tokens sampled a window at most (openai-whisper's sample_len; 0: 224) */
    int condition_on_previous_text; /* 1 */
    uint64_t seed;
    int serial;             /* 1: on the calling thread only (osp_whisper_state_set_serial) */
    int fast;               /* 1: the device's production precision (osp_whisper_state_set_fast); 0 */
    int word_timestamps;    /* words with their times (speech/words.c) */
    osp_fallback_opts fb;   /* thresholds (osp_transcribe_defaults) */
    /* called after each window: seconds done, total */
    void (*progress)(void *ctx, double done, double total);
    /* called for each new non-empty segment */
    void (*on_segment)(void *ctx, const osp_segment *s);
    void *ctx;
} osp_transcribe_opts;

void osp_transcribe_defaults(osp_transcribe_opts *o);

/* Word timestamps (speech/words.c), openai-whisper's timing.py:
 * dynamic time warping of a cost x[N][M] (ties to the later choice, as its
 * dtw_cpu): the path's token and frame indices, forwards; returns its length
 * (<= N + M). scratch: (N + 1)(M + 1)(sizeof(double) + 1) bytes. */
int32_t osp_whisper_dtw(const float *x, int32_t N, int32_t M, int32_t *text_idx, int32_t *time_idx, void *scratch);
/* Words of the window's text tokens, times relative to the window: decodes
 * sot[0..n_sot) <|notimestamps|> text <|endoftext|> on s (row 0) while
 * capturing the alignment heads. no_spaces: zh, ja, th, lo, my, yue (every
 * character piece a word). words: room for n_text + 1. */
osp_status osp_whisper_align(osp_whisper_state *s, const osp_whisper *m, const osp_tokenizer *tok,
                             const osp_wtokens *w, const int32_t *sot, int32_t n_sot, const int32_t *text,
                             int32_t n_text, int32_t num_frames, int no_spaces, osp_word *words, int32_t *n_words);
/* Punctuation merged into the next word (opening) or the previous one (closing). */
void osp_whisper_merge_punctuations(osp_word *a, int32_t n);
/* Words at sentence ends no longer than twice the median duration (at most
 * 0.7 s), then merge_punctuations; returns the median, *max_duration set. */
double osp_whisper_word_heuristics(osp_word *a, int32_t n, double *max_duration);

typedef struct osp_transcript {
    osp_segment *segs;
    int32_t n_segs;
    char *text;          /* every segment's text, concatenated */
    char language[8];    /* code */
    int translate;
    double duration;     /* seconds of audio */
} osp_transcript;

/* Transcribe pcm[0..n) (16 kHz mono). */
osp_status osp_transcribe(const osp_whisper *m, const osp_tokenizer *tok, const float *pcm, int64_t n,
                          const osp_transcribe_opts *o, osp_transcript *out);
/* The same on a given decoder state (s: at least beam_size rows; a view of
 * a batch's state, speech/batch.h), which the call does not free; NULL: a
 * state of its own. */
osp_status osp_transcribe_on(const osp_whisper *m, osp_whisper_state *s, const osp_tokenizer *tok, const float *pcm,
                             int64_t n, const osp_transcribe_opts *o, osp_transcript *out);
void osp_transcript_free(osp_transcript *t);

/* Formats: "txt" / "text" (one segment a line), "json" ({"text"}),
 * "verbose_json" (task, language, duration, text, segments), "srt", "vtt".
 * *out is osp_malloc'd and NUL-terminated. OSP_ERR_INVALID for an unknown
 * format. */
osp_status osp_transcript_format(const osp_transcript *t, const char *format, char **out, size_t *len);
int osp_transcript_format_known(const char *format);

#endif
