/* speech/tokens.c: Whisper's special tokens, languages, tokenizer loading,
 * the logit filters and the compression ratio (see transcribe.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <zlib.h>
#include "core/fs.h"
#include "transcribe.h"

static const char *const LANG_CODES[OSP_WHISPER_MAX_LANGS] = {
    "en", "zh", "de", "es", "ru", "ko", "fr", "ja", "pt", "tr", "pl", "ca", "nl", "ar", "sv", "it", "id",
    "hi", "fi", "vi", "he", "uk", "el", "ms", "cs", "ro", "da", "hu", "ta", "no", "th", "ur", "hr", "bg",
    "lt", "la", "mi", "ml", "cy", "sk", "te", "fa", "lv", "bn", "sr", "az", "sl", "kn", "et", "mk", "br",
    "eu", "is", "hy", "ne", "mn", "bs", "kk", "sq", "sw", "gl", "mr", "pa", "si", "km", "sn", "yo", "so",
    "af", "oc", "ka", "be", "tg", "sd", "gu", "am", "yi", "lo", "uz", "fo", "ht", "ps", "tk", "nn", "mt",
    "sa", "lb", "my", "bo", "tl", "mg", "as", "tt", "haw", "ln", "ha", "ba", "jw", "su", "yue"};

static const char *const LANG_NAMES[OSP_WHISPER_MAX_LANGS] = {
    "english", "chinese", "german", "spanish", "russian", "korean", "french", "japanese", "portuguese",
    "turkish", "polish", "catalan", "dutch", "arabic", "swedish", "italian", "indonesian", "hindi",
    "finnish", "vietnamese", "hebrew", "ukrainian", "greek", "malay", "czech", "romanian", "danish",
    "hungarian", "tamil", "norwegian", "thai", "urdu", "croatian", "bulgarian", "lithuanian", "latin",
    "maori", "malayalam", "welsh", "slovak", "telugu", "persian", "latvian", "bengali", "serbian",
    "azerbaijani", "slovenian", "kannada", "estonian", "macedonian", "breton", "basque", "icelandic",
    "armenian", "nepali", "mongolian", "bosnian", "kazakh", "albanian", "swahili", "galician", "marathi",
    "punjabi", "sinhala", "khmer", "shona", "yoruba", "somali", "afrikaans", "occitan", "georgian",
    "belarusian", "tajik", "sindhi", "gujarati", "amharic", "yiddish", "lao", "uzbek", "faroese",
    "haitian creole", "pashto", "turkmen", "nynorsk", "maltese", "sanskrit", "luxembourgish", "myanmar",
    "tibetan", "tagalog", "malagasy", "assamese", "tatar", "hawaiian", "lingala", "hausa", "bashkir",
    "javanese", "sundanese", "cantonese"};

const char *osp_whisper_lang_code(int i) { return i >= 0 && i < OSP_WHISPER_MAX_LANGS ? LANG_CODES[i] : NULL; }
const char *osp_whisper_lang_name(int i) { return i >= 0 && i < OSP_WHISPER_MAX_LANGS ? LANG_NAMES[i] : NULL; }

int osp_whisper_lang_index(const char *s) {
    if (!s) return -1;
    for (int i = 0; i < OSP_WHISPER_MAX_LANGS; i++)
        if (!strcasecmp(s, LANG_CODES[i]) || !strcasecmp(s, LANG_NAMES[i])) return i;
    return -1;
}

static int32_t id_of(const osp_tokenizer *t, const char *s) { return osp_tokenizer_token_id(t, s, strlen(s)); }

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* openai-whisper's non_speech_tokens: symbols that are not speech, alone or
 * after a space, when they are one token (the musical signs always by their
 * first token), plus " -" and " '". */
static osp_status non_speech(const osp_tokenizer *t, osp_wtokens *w, int32_t *buf, int32_t cap, int32_t *n) {
    static const char *const SYM[] = {
        "\"", "#", "(", ")", "*", "+", "/", ":", ";", "<", "=", ">", "@", "[", "\\", "]", "^", "_", "`", "{", "|",
        "}", "~", "「", "」", "『", "』", "<<", ">>", "<<<", ">>>", "--", "---", "-(", "-[", "('", "(\"", "((",
        "))", "(((", ")))", "[[", "]]", "{{", "}}", "♪♪", "♪♪♪"};
    static const char *const MISC[] = {"♩", "♪", "♫", "♬", "♭", "♮", "♯"};
    const int n_sym = sizeof SYM / sizeof *SYM, n_misc = sizeof MISC / sizeof *MISC;
    *n = 0;
    for (int i = 0; i < n_sym + n_misc + 1; i++) {
        const char *s = i < n_sym ? SYM[i] : i < n_sym + n_misc ? MISC[i - n_sym] : NULL;
        for (int sp = 0; sp < 2; sp++) {
            char txt[32];
            if (s) snprintf(txt, sizeof txt, "%s%s", sp ? " " : "", s);
            else snprintf(txt, sizeof txt, "%s", sp ? " '" : " -");
            int32_t *ids;
            size_t k;
            OSP_TRY(osp_tokenizer_encode_alloc(t, txt, strlen(txt), 0, &ids, &k));
            if (k >= 1 && (k == 1 || !s || i >= n_sym) && *n < cap) buf[(*n)++] = ids[0];
            osp_free(ids);
        }
    }
    return OSP_OK;
}

osp_status osp_wtokens_init(const osp_tokenizer *tok, int32_t vocab, osp_wtokens *w) {
    memset(w, 0, sizeof *w);
    w->vocab = vocab;
    struct { int32_t *dst; const char *s; } S[] = {
        {&w->eot, "<|endoftext|>"},       {&w->sot, "<|startoftranscript|>"}, {&w->sot_prev, "<|startofprev|>"},
        {&w->sot_lm, "<|startoflm|>"},    {&w->no_timestamps, "<|notimestamps|>"}, {&w->translate, "<|translate|>"},
        {&w->transcribe, "<|transcribe|>"}, {&w->ts_begin, "<|0.00|>"},      {&w->lang0, "<|en|>"},
    };
    for (size_t i = 0; i < sizeof S / sizeof *S; i++) {
        *S[i].dst = id_of(tok, S[i].s);
        if (*S[i].dst < 0 || *S[i].dst >= vocab)
            return osp_err(OSP_ERR_FORMAT, "whisper tokenizer: no token %s within the model's %d", S[i].s, vocab);
    }
    w->no_speech = id_of(tok, "<|nospeech|>");
    if (w->no_speech < 0) w->no_speech = id_of(tok, "<|nocaptions|>"); /* older HF tokenizers */
    if (w->no_speech < 0 || w->no_speech >= vocab)
        return osp_err(OSP_ERR_FORMAT, "whisper tokenizer: no <|nospeech|> token");
    if (w->ts_begin + 1500 >= vocab)
        return osp_err(OSP_ERR_FORMAT, "whisper tokenizer: the timestamp tokens do not fit the model's vocabulary");
    /* multilingual models: every language code after <|en|>, in order */
    if (vocab >= 51865) {
        char b[16];
        while (w->n_langs < OSP_WHISPER_MAX_LANGS) {
            snprintf(b, sizeof b, "<|%s|>", LANG_CODES[w->n_langs]);
            if (id_of(tok, b) != w->lang0 + w->n_langs) break;
            w->n_langs++;
        }
    }
    int32_t *ids;
    size_t k;
    OSP_TRY(osp_tokenizer_encode_alloc(tok, " ", 1, 0, &ids, &k));
    w->space = k == 1 ? ids[0] : -1;
    osp_free(ids);
    int32_t buf[256];
    int32_t n;
    OSP_TRY(non_speech(tok, w, buf, 250, &n));
    int32_t extra[] = {w->transcribe, w->translate, w->sot, w->sot_prev, w->sot_lm, w->no_speech};
    for (int i = 0; i < 6; i++) buf[n++] = extra[i];
    qsort(buf, n, sizeof *buf, cmp_i32);
    w->suppress = osp_malloc(OSP_POOL_MISC, sizeof(int32_t) * n);
    if (!w->suppress) return osp_err(OSP_ERR_NOMEM, "out of memory");
    for (int32_t i = 0; i < n; i++)
        if (i == 0 || buf[i] != buf[i - 1]) w->suppress[w->n_suppress++] = buf[i];
    return OSP_OK;
}

void osp_wtokens_free(osp_wtokens *w) {
    osp_free(w->suppress);
    w->suppress = NULL;
}

/* ---------------- tokenizer files ---------------- */

static int ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

/* openai-whisper's encoding: the ranks, then the specials in order. The
 * number of languages follows from the model's vocabulary. */
static osp_status load_tiktoken(const char *path, int32_t vocab, osp_tokenizer **out) {
    FILE *f = fopen(path, "rb");
    if (!f) return osp_err(OSP_ERR_IO, "%s: cannot open the tokenizer", path);
    int32_t ranks = 0;
    int c, prev = '\n';
    while ((c = fgetc(f)) != EOF) {
        if (c == '\n' && prev != '\n') ranks++;
        prev = c;
    }
    if (prev != '\n') ranks++;
    fclose(f);
    int32_t n_langs = vocab - ranks - 2 - 6 - 1501;
    if (n_langs < 1 || n_langs > OSP_WHISPER_MAX_LANGS)
        return osp_err(OSP_ERR_FORMAT, "%s: %d ranks do not make a Whisper vocabulary of %d", path, ranks, vocab);
    const char *tail[] = {"<|translate|>", "<|transcribe|>", "<|startoflm|>", "<|startofprev|>", "<|nospeech|>",
                          "<|notimestamps|>"};
    int32_t n = 2 + n_langs + 6 + 1501;
    char *pool = osp_malloc(OSP_POOL_MISC, (size_t)n * 24);
    const char **sp = osp_malloc(OSP_POOL_MISC, sizeof(char *) * n);
    if (!pool || !sp) {
        osp_free(pool);
        osp_free(sp);
        return osp_err(OSP_ERR_NOMEM, "out of memory");
    }
    for (int32_t i = 0; i < n; i++) {
        char *p = pool + (size_t)i * 24;
        if (i == 0) snprintf(p, 24, "<|endoftext|>");
        else if (i == 1) snprintf(p, 24, "<|startoftranscript|>");
        else if (i < 2 + n_langs) snprintf(p, 24, "<|%s|>", LANG_CODES[i - 2]);
        else if (i < 8 + n_langs) snprintf(p, 24, "%s", tail[i - 2 - n_langs]);
        else snprintf(p, 24, "<|%.2f|>", (i - 8 - n_langs) * 0.02);
        sp[i] = p;
    }
    osp_status rc = osp_tokenizer_load_tiktoken(path, NULL, sp, n, out);
    osp_free(pool);
    osp_free(sp);
    return rc;
}

osp_status osp_whisper_tokenizer_load(const char *model_dir, const char *path, int32_t vocab, osp_tokenizer **out) {
    char p[4200];
    *out = NULL;
    if (path) {
        if (ends_with(path, ".tiktoken")) return load_tiktoken(path, vocab, out);
        return osp_tokenizer_load(path, out);
    }
    snprintf(p, sizeof p, "%s/tokenizer.json", model_dir);
    if (osp_is_file(p)) return osp_tokenizer_load(model_dir, out);
    const char *names[] = {vocab >= 51865 ? "multilingual.tiktoken" : "gpt2.tiktoken"};
    snprintf(p, sizeof p, "%s/%s", model_dir, names[0]);
    if (osp_is_file(p)) return load_tiktoken(p, vocab, out);
    return osp_err(OSP_ERR_IO,
                   "%s: no tokenizer.json or %s in the model folder (give one with --tokenizer: a tokenizer.json, "
                   "or openai-whisper's multilingual.tiktoken / gpt2.tiktoken)",
                   model_dir, names[0]);
}

/* ---------------- filters ---------------- */

static void mask(float *l, int32_t a, int32_t b) {
    for (int32_t i = a < 0 ? 0 : a; i < b; i++) l[i] = -INFINITY;
}

void osp_whisper_filter_logits(const osp_wtokens *w, int timestamps, const int32_t *tokens, int32_t n,
                               int32_t sample_begin, float *logits) {
    const int32_t V = w->vocab, tb = w->ts_begin;
    const int first = n == sample_begin;
    /* SuppressBlank */
    if (first) {
        if (w->space >= 0) logits[w->space] = -INFINITY;
        logits[w->eot] = -INFINITY;
    }
    /* SuppressTokens */
    for (int32_t i = 0; i < w->n_suppress; i++)
        if (w->suppress[i] < V) logits[w->suppress[i]] = -INFINITY;
    if (!timestamps) return;
    /* ApplyTimestampRules */
    logits[w->no_timestamps] = -INFINITY;
    const int32_t *seq = tokens + sample_begin;
    const int32_t k = n - sample_begin;
    const int last_ts = k >= 1 && seq[k - 1] >= tb;
    const int pen_ts = k < 2 || seq[k - 2] >= tb;
    if (last_ts) {
        if (pen_ts) mask(logits, tb, V); /* after a pair: text */
        else mask(logits, 0, w->eot);    /* after text + timestamp: a timestamp or the end */
    }
    int32_t last = -1;
    for (int32_t i = 0; i < k; i++)
        if (seq[i] >= tb) last = seq[i];
    if (last >= 0) mask(logits, tb, last_ts && !pen_ts ? last : last + 1);
    if (first) {
        mask(logits, 0, tb);
        mask(logits, tb + 50 + 1, V); /* max_initial_timestamp 1.0 s */
    }
    /* when the timestamps' total probability beats every text token, a timestamp
     * (log-softmax's normalizer cancels: log sum_ts e^l against max_text l) */
    float mt = -INFINITY, mts = -INFINITY;
    for (int32_t i = 0; i < tb; i++) mt = logits[i] > mt ? logits[i] : mt;
    for (int32_t i = tb; i < V; i++) mts = logits[i] > mts ? logits[i] : mts;
    if (mts == -INFINITY) return;
    double zt = 0;
    for (int32_t i = tb; i < V; i++) zt += exp((double)logits[i] - mts);
    if (mts + log(zt) > mt) mask(logits, 0, tb);
}

double osp_compression_ratio(const char *text, size_t len) {
    if (!len) return 0;
    uLongf cap = compressBound(len);
    unsigned char *buf = osp_malloc(OSP_POOL_MISC, cap);
    if (!buf) return 0;
    double r = 0;
    if (compress2(buf, &cap, (const Bytef *)text, len, Z_DEFAULT_COMPRESSION) == Z_OK) r = (double)len / cap;
    osp_free(buf);
    return r;
}
