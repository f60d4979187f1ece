/* speech/: Whisper decoding logic on synthetic logits (the timestamp rules,
 * suppressed tokens, temperature fallback, splitting a window into
 * segments, the output formats) and end to end on the tiny golden
 * checkpoint (language detection, long audio over several windows). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>
#include "audio/audio.h"
#include "model/safetensors.h"
#include "speech/transcribe.h"

#define WG "data/goldens/whisper"
static char tok_path[64];
static osp_tokenizer *tok;
static osp_wtokens W;
static const int32_t V = 51865;

/* the rank file, unpacked from the test data into a temporary file */
static int setup(void **state) {
    (void)state;
    snprintf(tok_path, sizeof tok_path, "/tmp/osp_wtokXXXXXX.tiktoken");
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
    if (osp_whisper_tokenizer_load(WG, tok_path, V, &tok) != OSP_OK) return -1;
    return osp_wtokens_init(tok, V, &W) == OSP_OK ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    osp_wtokens_free(&W);
    osp_tokenizer_free(tok);
    unlink(tok_path);
    return 0;
}

static void test_special_ids(void **state) {
    (void)state;
    /* openai-whisper's multilingual numbering */
    assert_int_equal(W.eot, 50257);
    assert_int_equal(W.sot, 50258);
    assert_int_equal(W.lang0, 50259);
    assert_int_equal(W.n_langs, 99);
    assert_int_equal(W.translate, 50358);
    assert_int_equal(W.transcribe, 50359);
    assert_int_equal(W.sot_prev, 50361);
    assert_int_equal(W.no_speech, 50362);
    assert_int_equal(W.no_timestamps, 50363);
    assert_int_equal(W.ts_begin, 50364);
    assert_int_equal(W.space, 220);
    /* the golden's decoder_ids start with sot, en, transcribe, notimestamps */
    assert_int_equal(osp_whisper_lang_index("English"), 0);
    assert_int_equal(osp_whisper_lang_index("de"), 2);
    assert_int_equal(osp_whisper_lang_index("klingon"), -1);
    /* the non-speech list holds "#" and " (" but no letters */
    int32_t id;
    size_t n;
    int32_t *ids;
    assert_int_equal(osp_tokenizer_encode_alloc(tok, "#", 1, 0, &ids, &n), OSP_OK);
    id = ids[0];
    osp_free(ids);
    int found = 0, letter = 0;
    int32_t a_id = osp_tokenizer_token_id(tok, "a", 1);
    for (int32_t i = 0; i < W.n_suppress; i++) {
        found |= W.suppress[i] == id;
        letter |= W.suppress[i] == a_id;
    }
    assert_true(found && !letter);
    assert_true(W.n_suppress > 80);
}

static float *flat(float v) {
    float *l = malloc(sizeof(float) * V);
    for (int32_t i = 0; i < V; i++) l[i] = v;
    return l;
}

static int32_t first_allowed(const float *l, int32_t a, int32_t b) {
    for (int32_t i = a; i < b; i++)
        if (l[i] != -INFINITY) return i;
    return -1;
}

static void test_timestamp_rules(void **state) {
    (void)state;
    const int32_t tb = W.ts_begin, sot[3] = {W.sot, W.lang0, W.transcribe};
    int32_t seq[16];
    memcpy(seq, sot, sizeof sot);
    /* first step: a timestamp of at most 1.0 s, nothing else */
    float *l = flat(0);
    osp_whisper_filter_logits(&W, 1, seq, 3, 3, l);
    assert_int_equal(first_allowed(l, 0, tb), -1);
    assert_true(l[tb] == 0 && l[tb + 50] == 0);
    assert_true(l[tb + 51] == -INFINITY && l[W.eot] == -INFINITY && l[W.no_timestamps] == -INFINITY);
    free(l);
    /* without timestamps: text allowed, blank and eot not at the start */
    l = flat(0);
    osp_whisper_filter_logits(&W, 0, seq, 3, 3, l);
    assert_true(l[100] == 0 && l[W.space] == -INFINITY && l[W.eot] == -INFINITY && l[W.sot] == -INFINITY);
    free(l);
    /* after <|0.20|> text <|1.00|>: a timestamp >= 1.00 or the end, no text */
    seq[3] = tb + 10;
    seq[4] = 400;
    seq[5] = tb + 50;
    l = flat(0);
    l[W.eot] = 10; /* likelier than all timestamps together (e^10 > 1451): kept */
    osp_whisper_filter_logits(&W, 1, seq, 6, 3, l);
    assert_int_equal(first_allowed(l, 0, W.eot), -1);
    assert_true(l[W.eot] == 10);
    assert_int_equal(first_allowed(l, tb, V), tb + 50);
    free(l);
    /* after a pair <|1.00|><|1.00|>: text only (or the end) */
    seq[6] = tb + 50;
    l = flat(0);
    osp_whisper_filter_logits(&W, 1, seq, 7, 3, l);
    assert_int_equal(first_allowed(l, tb, V), -1);
    assert_true(l[400] == 0 && l[W.eot] == 0 && l[W.no_timestamps] == -INFINITY);
    free(l);
    /* after text: timestamps strictly after the last one */
    seq[7] = 401;
    l = flat(-5);
    l[401] = 5; /* e^5 > 1400 e^-5: text stays allowed */
    osp_whisper_filter_logits(&W, 1, seq, 8, 3, l);
    assert_int_equal(first_allowed(l, tb, V), tb + 51);
    assert_true(l[401] == 5);
    free(l);
    /* timestamps more likely together than any text token: a timestamp */
    l = flat(-30);
    l[500] = 0;
    for (int32_t i = tb + 60; i < tb + 80; i++) l[i] = -1; /* 20 * e^-1 > e^0 */
    osp_whisper_filter_logits(&W, 1, seq, 8, 3, l);
    assert_true(l[500] == -INFINITY);
    assert_true(l[tb + 60] == -1);
    free(l);
    /* but not when one text token dominates */
    l = flat(-30);
    l[500] = 5;
    for (int32_t i = tb + 60; i < tb + 80; i++) l[i] = -1;
    osp_whisper_filter_logits(&W, 1, seq, 8, 3, l);
    assert_true(l[500] == 5);
    free(l);
}

/* A decoder whose results per temperature are scripted. */
typedef struct script {
    double cr[6], lp[6], ns[6];
    int calls;
} script;

static osp_status scripted(void *ctx, float t, osp_wresult *r) {
    script *s = ctx;
    int i = (int)lroundf(t / 0.2f);
    memset(r, 0, sizeof *r);
    r->compression_ratio = s->cr[i];
    r->avg_logprob = s->lp[i];
    r->no_speech_prob = s->ns[i];
    s->calls++;
    return OSP_OK;
}

static void test_fallback(void **state) {
    (void)state;
    osp_transcribe_opts o;
    osp_transcribe_defaults(&o);
    osp_wresult r;
    /* repetitive at 0 (ratio 3.0), fine at 0.2 */
    script a = {{3.0, 1.5, 1.5, 1.5, 1.5, 1.5}, {-0.2, -0.3, -0.3, -0.3, -0.3, -0.3}, {0}, 0};
    assert_int_equal(osp_whisper_fallback(&o.fb, scripted, &a, &r), OSP_OK);
    assert_int_equal(a.calls, 2);
    assert_true(fabsf(r.temperature - 0.2f) < 1e-6f);
    /* unlikely everywhere: every temperature, the last result kept */
    script b = {{1, 1, 1, 1, 1, 1}, {-2, -2, -2, -2, -2, -1.5}, {0}, 0};
    assert_int_equal(osp_whisper_fallback(&o.fb, scripted, &b, &r), OSP_OK);
    assert_int_equal(b.calls, 6);
    assert_true(fabsf(r.temperature - 1.0f) < 1e-6f && r.avg_logprob == -1.5);
    /* unlikely but silent (no_speech 0.9): no fallback */
    script c = {{1, 1, 1, 1, 1, 1}, {-2, -2, -2, -2, -2, -2}, {0.9, 0.9, 0.9, 0.9, 0.9, 0.9}, 0};
    assert_int_equal(osp_whisper_fallback(&o.fb, scripted, &c, &r), OSP_OK);
    assert_int_equal(c.calls, 1);
    /* the ratio is zlib's, as Python's zlib.compress */
    const char *rep = "the the the the the the the the the the the the the the the the the the the the";
    assert_true(osp_compression_ratio(rep, strlen(rep)) > 2.4);
    assert_true(osp_compression_ratio("And so my fellow Americans", 26) < 1.2);
}

static void test_split(void **state) {
    (void)state;
    const int32_t tb = W.ts_begin;
    int32_t ranges[32];
    double times[32];
    int32_t n;
    /* <|0.00|> a b <|2.00|><|2.00|> c <|3.00|>: two segments, ends on a single timestamp: whole window */
    int32_t t1[] = {tb, 10, 11, tb + 100, tb + 100, 12, tb + 150};
    assert_int_equal(osp_whisper_split(&W, t1, 7, 3000, ranges, times, &n), 3000);
    assert_int_equal(n, 2);
    assert_int_equal(ranges[0], 0);
    assert_int_equal(ranges[1], 4);
    assert_int_equal(ranges[2], 4);
    assert_int_equal(ranges[3], 7);
    assert_true(fabs(times[1] - 2.0) < 1e-9 && fabs(times[2] - 2.0) < 1e-9 && fabs(times[3] - 3.0) < 1e-9);
    /* ... <|2.00|><|2.00|> c (cut mid-speech): advance to the last pair, 2.00 s = 200 frames */
    int32_t t2[] = {tb, 10, 11, tb + 100, tb + 100, 12};
    assert_int_equal(osp_whisper_split(&W, t2, 6, 3000, ranges, times, &n), 200);
    assert_int_equal(n, 1);
    /* no pair: one segment to the last timestamp, the whole window consumed */
    int32_t t3[] = {tb, 10, 11, tb + 300};
    assert_int_equal(osp_whisper_split(&W, t3, 4, 1200, ranges, times, &n), 1200);
    assert_int_equal(n, 1);
    assert_true(fabs(times[1] - 6.0) < 1e-9);
    /* no timestamps at all: the window's duration */
    int32_t t4[] = {10, 11};
    assert_int_equal(osp_whisper_split(&W, t4, 2, 1200, ranges, times, &n), 1200);
    assert_true(fabs(times[1] - 12.0) < 1e-9);
}

static void test_formats(void **state) {
    (void)state;
    osp_segment s[2] = {{.id = 0, .start = 0, .end = 2.5, .text = " Hello there."},
                        {.id = 1, .start = 2.5, .end = 3661.25, .text = " a --> b"}};
    osp_transcript t = {.segs = s, .n_segs = 2, .text = " Hello there. a --> b", .language = "en", .duration = 3662};
    char *o;
    size_t n;
    assert_int_equal(osp_transcript_format(&t, "srt", &o, &n), OSP_OK);
    assert_string_equal(o, "1\n00:00:00,000 --> 00:00:02,500\nHello there.\n\n2\n00:00:02,500 --> 01:01:01,250\na -> b\n\n");
    osp_free(o);
    assert_int_equal(osp_transcript_format(&t, "vtt", &o, &n), OSP_OK);
    assert_string_equal(o, "WEBVTT\n\n00:00.000 --> 00:02.500\nHello there.\n\n00:02.500 --> 01:01:01.250\na -> b\n\n");
    osp_free(o);
    assert_int_equal(osp_transcript_format(&t, "txt", &o, &n), OSP_OK);
    assert_string_equal(o, "Hello there.\na --> b\n");
    osp_free(o);
    assert_int_equal(osp_transcript_format(&t, "text", &o, &n), OSP_OK);
    assert_string_equal(o, "Hello there. a --> b\n");
    osp_free(o);
    assert_int_equal(osp_transcript_format(&t, "json", &o, &n), OSP_OK);
    assert_string_equal(o, "{\"text\":\" Hello there. a --> b\"}\n");
    osp_free(o);
    assert_int_equal(osp_transcript_format(&t, "verbose_json", &o, &n), OSP_OK);
    assert_non_null(strstr(o, "\"task\":\"transcribe\",\"language\":\"english\",\"duration\":3662.0"));
    assert_non_null(strstr(o, "\"segments\":[{\"id\":0,\"seek\":0,\"start\":0.0,\"end\":2.5,\"text\":\" Hello there.\""));
    osp_free(o);
    assert_int_equal(osp_transcript_format(&t, "docx", &o, &n), OSP_ERR_INVALID);
}


static void test_dtw(void **state) {
    (void)state;
    /* the cheap path: token 0 over frames 0-1, token 1 over frame 2, token 2 over frame 3 */
    const float x[3 * 4] = {0, 0, 9, 9, 9, 9, 0, 9, 9, 9, 9, 0};
    int32_t ti[8], fi[8];
    double scratch[4 * 5 * 2];
    int32_t n = osp_whisper_dtw(x, 3, 4, ti, fi, scratch);
    assert_int_equal(n, 4);
    const int32_t want_t[] = {0, 0, 1, 2}, want_f[] = {0, 1, 2, 3};
    for (int i = 0; i < 4; i++) {
        assert_int_equal(ti[i], want_t[i]);
        assert_int_equal(fi[i], want_f[i]);
    }
}

static osp_word word(const char *s, double a, double b) {
    osp_word w = {.text = osp_malloc(OSP_POOL_MISC, strlen(s) + 1), .n_tok = 1, .start = a, .end = b};
    strcpy(w.text, s);
    return w;
}

static void test_punctuation(void **state) {
    (void)state;
    osp_word a[6] = {word(" \"", 0, 0.1), word("Hello", 0.1, 0.5), word(",", 0.5, 0.6), word(" world", 0.6, 1),
                     word(".", 1, 1.1), word("\"", 1.1, 1.2)};
    osp_whisper_merge_punctuations(a, 6);
    const char *want[] = {"", " \"Hello,", "", " world.\"", "", ""};
    for (int i = 0; i < 6; i++) {
        assert_string_equal(a[i].text, want[i]);
        osp_free(a[i].text);
    }
}

/* The golden's transcript aligned on its recording (the checkpoint is
 * random-ish: the words and their order are checked, the times only for
 * consistency). */
static void test_word_alignment(void **state) {
    (void)state;
    osp_whisper *m;
    assert_int_equal(osp_whisper_load(WG, &m), OSP_OK);
    osp_st *st;
    assert_int_equal(osp_st_open_file(WG "/golden.safetensors", &st), OSP_OK);
    const osp_st_tensor *mt = osp_st_find(st, "mel80"), *it = osp_st_find(st, "decoder_ids");
    float *mel = malloc(mt->nbytes);
    memcpy(mel, mt->data, mt->nbytes);
    int32_t ids[30];
    memcpy(ids, it->data, sizeof ids);
    osp_st_close(st);
    osp_whisper_state *s;
    assert_int_equal(osp_whisper_state_new(m, &s), OSP_OK);
    assert_int_equal(osp_whisper_encode(s, mel), OSP_OK);
    osp_word words[32];
    int32_t n;
    /* ids: sot en transcribe notimestamps, 25 text tokens, eot */
    assert_int_equal(osp_whisper_align(s, m, tok, &W, ids, 3, ids + 4, 25, 1100, 0, words, &n), OSP_OK);
    double maxd;
    osp_whisper_word_heuristics(words, n, &maxd);
    char joined[512] = "";
    int kept = 0;
    for (int32_t i = 0; i < n; i++) {
        strcat(joined, words[i].text);
        if (words[i].text[0]) {
            kept++;
            assert_true(words[i].start <= words[i].end && words[i].end <= 11.0 + 1e-9);
        }
        if (i) assert_true(words[i].start >= words[i - 1].start - maxd);
        osp_free(words[i].text);
    }
    assert_string_equal(joined, " And so my fellow Americans, ask not what your country can do for you, ask what you can "
                                "do for your country.");
    assert_int_equal(kept, 22); /* "Americans," "you," "country." carry their punctuation */
    osp_whisper_state_free(s);
    osp_whisper_free(m);
    free(mel);
}

typedef struct seen {
    int calls;
    double last, total;
} seen;
static void on_progress(void *ctx, double done, double total) {
    seen *s = ctx;
    assert_true(done >= s->last && done <= total);
    s->calls++;
    s->last = done;
    s->total = total;
}

/* The tiny golden checkpoint: random-ish, so its text is noise, but the
 * windows, languages and segments must be consistent. 65 s of audio: the
 * recording, silence, the recording again, ... */
static void test_end_to_end(void **state) {
    (void)state;
    osp_whisper *m;
    assert_int_equal(osp_whisper_load(WG, &m), OSP_OK);
    float *pcm;
    int64_t n;
    assert_int_equal(osp_audio_load(WG "/audio.wav", &pcm, &n), OSP_OK);
    int64_t N = 65 * 16000;
    float *longpcm = calloc(N, sizeof(float));
    for (int64_t i = 0; i + n <= N; i += n + 16000) memcpy(longpcm + i, pcm, sizeof(float) * n);
    osp_transcribe_opts o;
    osp_transcribe_defaults(&o);
    o.no_fallback = 1;
    seen sn = {0};
    o.progress = on_progress;
    o.ctx = &sn;
    osp_transcript t;
    assert_int_equal(osp_transcribe(m, tok, longpcm, N, &o, &t), OSP_OK);
    assert_true(sn.calls >= 3); /* at least three windows for 65 s */
    assert_true(fabs(sn.last - 65.0) < 1e-9 && fabs(t.duration - 65.0) < 1e-9);
    assert_true(osp_whisper_lang_index(t.language) >= 0);
    for (int32_t i = 0; i < t.n_segs; i++) {
        assert_true(t.segs[i].end > t.segs[i].start);
        assert_true(t.segs[i].seek < 65 * 100);
        if (i) assert_true(t.segs[i].seek >= t.segs[i - 1].seek);
    }
    osp_transcript_free(&t);
    /* a language given is kept; greedy decoding is deterministic */
    o.language = "de";
    o.progress = NULL;
    osp_transcript a, b;
    assert_int_equal(osp_transcribe(m, tok, pcm, n, &o, &a), OSP_OK);
    assert_int_equal(osp_transcribe(m, tok, pcm, n, &o, &b), OSP_OK);
    assert_string_equal(a.language, "de");
    assert_string_equal(a.text, b.text);
    osp_transcript_free(&a);
    osp_transcript_free(&b);
    /* beam search finds a likelier window than greedy decoding here (the
     * checkpoint is deterministic: this holds or fails every time) */
    o.language = "en";
    o.beam_size = 1;
    assert_int_equal(osp_transcribe(m, tok, pcm, n, &o, &a), OSP_OK);
    o.beam_size = 5;
    assert_int_equal(osp_transcribe(m, tok, pcm, n, &o, &b), OSP_OK);
    assert_true(a.n_segs > 0 && b.n_segs > 0);
    print_message("avg logprob: greedy %.4f, beam 5 %.4f\n", a.segs[0].avg_logprob, b.segs[0].avg_logprob);
    assert_true(b.segs[0].avg_logprob > a.segs[0].avg_logprob + 0.05);
    osp_transcript_free(&a);
    osp_transcript_free(&b);
    o.beam_size = 17;
    assert_int_equal(osp_transcribe(m, tok, pcm, n, &o, &a), OSP_ERR_INVALID);
    o.beam_size = 5;
    /* bad requests */
    o.language = "klingon";
    assert_int_equal(osp_transcribe(m, tok, pcm, n, &o, &a), OSP_ERR_INVALID);
    o.language = NULL;
    assert_int_equal(osp_transcribe(m, tok, NULL, 5, &o, &a), OSP_ERR_INVALID);
    free(longpcm);
    osp_free(pcm);
    osp_whisper_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_special_ids), cmocka_unit_test(test_timestamp_rules), cmocka_unit_test(test_fallback),
        cmocka_unit_test(test_split),       cmocka_unit_test(test_formats),         cmocka_unit_test(test_dtw),
        cmocka_unit_test(test_punctuation), cmocka_unit_test(test_word_alignment),  cmocka_unit_test(test_end_to_end),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
