/* Tokenizer: every golden line of the real Gemma 3, Llama 3, Qwen 3 and
 * Whisper tokenizers (ids with and without special tokens, decode round
 * trips), the chat renderings' ids, the bundled fortune model's prompts;
 * refusals with a message naming the problem; the incremental
 * detokenizer (held-back UTF-8, leading spaces, equal to a full decode).
 *
 * The tokenizer.json files are stored gzip-compressed in data/tokenizers/
 * and unpacked into a temporary folder for the run. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <utf8proc.h>
#include "core/core.h"
#include "text/detok.h"
#include "text/tokenizer.h"

#define DATA "data/tokenizers"

static char tmpdir[256];
static osp_tokenizer *gemma, *llama, *qwen;

static int run(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int run(const char *fmt, ...) {
    char cmd[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    return system(cmd);
}

static osp_tokenizer *load_family(const char *name) {
    char p[512];
    snprintf(p, sizeof p, "%s/%s", tmpdir, name);
    osp_tokenizer *t = NULL;
    double t0 = osp_now_s();
    if (osp_tokenizer_load(p, &t) != OSP_OK) {
        print_error("load %s: %s\n", name, osp_last_error());
        return NULL;
    }
    print_message("loaded %s in %.3f s\n", name, osp_now_s() - t0);
    return t;
}

static int group_setup(void **state) {
    (void)state;
    snprintf(tmpdir, sizeof tmpdir, "/tmp/osp_tok_XXXXXX");
    if (!mkdtemp(tmpdir)) return -1;
    const char *fam[] = {"gemma3", "llama3", "qwen3"};
    for (int i = 0; i < 3; i++) {
        if (run("mkdir -p %s/%s && gzip -dc %s/%s/tokenizer.json.gz > %s/%s/tokenizer.json && "
                "cp %s/%s/tokenizer_config.json %s/%s/",
                tmpdir, fam[i], DATA, fam[i], tmpdir, fam[i], DATA, fam[i], tmpdir, fam[i]) != 0)
            return -1;
    }
    if (run("mkdir -p %s/whisper && gzip -dc %s/whisper/gpt2.tiktoken.gz > %s/whisper/gpt2.tiktoken && "
            "gzip -dc %s/whisper/multilingual.tiktoken.gz > %s/whisper/multilingual.tiktoken",
            tmpdir, DATA, tmpdir, DATA, tmpdir) != 0)
        return -1;
    gemma = load_family("gemma3");
    llama = load_family("llama3");
    qwen = load_family("qwen3");
    return gemma && llama && qwen ? 0 : -1;
}

static int group_teardown(void **state) {
    (void)state;
    osp_tokenizer_free(gemma);
    osp_tokenizer_free(llama);
    osp_tokenizer_free(qwen);
    if (tmpdir[0]) run("rm -rf %s", tmpdir);
    return 0;
}

/* ---- helpers ---- */

typedef void (*line_fn)(json_t *line, void *ctx, int *fails);

static void each_line(const char *file, line_fn fn, void *ctx, int *fails, int skip_first) {
    char p[512];
    snprintf(p, sizeof p, "%s/goldens/%s", DATA, file);
    FILE *f = fopen(p, "r");
    assert_non_null(f);
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    int k = 0;
    while ((n = getline(&line, &cap, f)) > 0) {
        if (k++ == 0 && skip_first) continue;
        json_error_t e;
        json_t *j = json_loadb(line, (size_t)n, 0, &e);
        if (!j) fail_msg("%s line %d: %s", file, k, e.text);
        fn(j, ctx, fails);
        json_decref(j);
    }
    free(line);
    fclose(f);
    assert_true(k > 0);
}

static int ids_match(const int32_t *got, size_t n, json_t *want) {
    if (json_array_size(want) != n) return 0;
    for (size_t i = 0; i < n; i++)
        if (json_integer_value(json_array_get(want, i)) != got[i]) return 0;
    return 1;
}

static void show_ids(const char *what, const char *text, const int32_t *got, size_t n, json_t *want) {
    char *w = json_dumps(want, JSON_COMPACT);
    fprintf(stderr, "MISMATCH %s for %s\n  want %s\n  got  [", what, text, w);
    for (size_t i = 0; i < n; i++) fprintf(stderr, "%s%d", i ? "," : "", got[i]);
    fprintf(stderr, "]\n");
    free(w);
}

static int32_t *json_ids(json_t *arr, size_t *n) {
    *n = json_array_size(arr);
    int32_t *v = malloc((*n + 1) * sizeof *v);
    for (size_t i = 0; i < *n; i++) v[i] = (int32_t)json_integer_value(json_array_get(arr, i));
    return v;
}

static int valid_utf8(const char *s, size_t n) {
    utf8proc_int32_t cp;
    while (n) {
        utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &cp);
        if (k <= 0) return 0;
        s += k;
        n -= (size_t)k;
    }
    return 1;
}

/* Stream ids through a detokenizer: the chunks must be valid UTF-8 and add
 * up to the full decode. Returns 0 when all holds. */
static int stream_matches(const osp_tokenizer *t, const int32_t *ids, size_t n, int skip) {
    char *full;
    size_t flen;
    if (osp_tokenizer_decode(t, ids, n, skip ? OSP_DECODE_SKIP_SPECIAL : 0, &full, &flen) != OSP_OK) return 1;
    osp_detok *d;
    if (osp_detok_new(t, skip, &d) != OSP_OK) {
        osp_free(full);
        return 1;
    }
    char *acc = malloc(flen * 2 + 64);
    size_t an = 0, cap = flen * 2 + 64;
    int bad = 0;
    for (size_t i = 0; i <= n && !bad; i++) {
        const char *s;
        size_t k;
        osp_status st = i < n ? osp_detok_push(d, ids[i], &s, &k) : osp_detok_flush(d, &s, &k);
        if (st != OSP_OK || !valid_utf8(s, k) || an + k > cap) bad = 1;
        else {
            memcpy(acc + an, s, k);
            an += k;
        }
    }
    if (!bad && (an != flen || memcmp(acc, full, flen) != 0)) {
        fprintf(stderr, "STREAM MISMATCH: full '%s' streamed '%.*s'\n", full, (int)an, acc);
        bad = 1;
    }
    free(acc);
    osp_free(full);
    osp_detok_free(d);
    return bad;
}

static char *nfc(const char *s) { return (char *)utf8proc_NFC((const utf8proc_uint8_t *)s); }

/* ---- goldens ---- */

typedef struct enc_ctx {
    const osp_tokenizer *t;
    int nfc_decode; /* the tokenizer normalizes with NFC */
} enc_ctx;

static void check_encode_line(json_t *j, void *vctx, int *fails) {
    enc_ctx *c = vctx;
    const char *text = json_string_value(json_object_get(j, "text"));
    size_t tlen = json_string_length(json_object_get(j, "text"));
    json_t *want = json_object_get(j, "ids"), *want_sp = json_object_get(j, "ids_with_special_tokens");
    int32_t *got;
    size_t n;
    if (osp_tokenizer_encode_alloc(c->t, text, tlen, 0, &got, &n) != OSP_OK) {
        fprintf(stderr, "encode failed for %s: %s\n", text, osp_last_error());
        (*fails)++;
        return;
    }
    if (!ids_match(got, n, want)) {
        show_ids("ids", text, got, n, want);
        (*fails)++;
    }
    osp_free(got);
    if (want_sp) {
        assert_int_equal(osp_tokenizer_encode_alloc(c->t, text, tlen, 1, &got, &n), OSP_OK);
        if (!ids_match(got, n, want_sp)) {
            show_ids("ids_with_special_tokens", text, got, n, want_sp);
            (*fails)++;
        }
        osp_free(got);
    }
    /* decode: the text itself where it round-trips, else its NFC form */
    json_t *rt = json_object_get(j, "roundtrip");
    size_t nw;
    int32_t *wids = json_ids(want, &nw);
    if (rt) {
        char *dec;
        size_t dlen;
        assert_int_equal(osp_tokenizer_decode(c->t, wids, nw, 0, &dec, &dlen), OSP_OK);
        char *expect = json_is_true(rt) ? strdup(text) : (c->nfc_decode ? nfc(text) : NULL);
        if (expect && (dlen != strlen(expect) || memcmp(dec, expect, dlen) != 0)) {
            fprintf(stderr, "DECODE MISMATCH for '%s': got '%s'\n", expect, dec);
            (*fails)++;
        }
        free(expect);
        osp_free(dec);
    }
    if (stream_matches(c->t, wids, nw, 0) || stream_matches(c->t, wids, nw, 1)) {
        fprintf(stderr, "stream decode differs for '%s'\n", text);
        (*fails)++;
    }
    free(wids);
}

static void check_encode_file(const osp_tokenizer *t, const char *file, int nfc_decode) {
    enc_ctx c = {t, nfc_decode};
    int fails = 0;
    each_line(file, check_encode_line, &c, &fails, 0);
    if (fails) fail_msg("%s: %d mismatches", file, fails);
}

static void test_encode_gemma3(void **s) { (void)s; check_encode_file(gemma, "encode-gemma3.jsonl", 0); }
static void test_encode_llama3(void **s) { (void)s; check_encode_file(llama, "encode-llama3.jsonl", 0); }
static void test_encode_qwen3(void **s) { (void)s; check_encode_file(qwen, "encode-qwen3.jsonl", 1); }
static void test_encode_llamacpp_qwen2(void **s) { (void)s; check_encode_file(qwen, "encode-llamacpp-qwen2.jsonl", 1); }
static void test_encode_llamacpp_llama_bpe(void **s) {
    (void)s;
    check_encode_file(llama, "encode-llamacpp-llama-bpe.jsonl", 0);
}

static void check_chat_line(json_t *j, void *vctx, int *fails) {
    const osp_tokenizer *t = vctx;
    json_t *r = json_object_get(j, "rendered");
    int32_t *got;
    size_t n;
    assert_int_equal(osp_tokenizer_encode_alloc(t, json_string_value(r), json_string_length(r), 0, &got, &n), OSP_OK);
    if (!ids_match(got, n, json_object_get(j, "ids"))) {
        show_ids("chat ids", json_string_value(json_object_get(j, "name")), got, n, json_object_get(j, "ids"));
        (*fails)++;
    }
    if (stream_matches(t, got, n, 0) || stream_matches(t, got, n, 1)) (*fails)++;
    osp_free(got);
}

static void check_chat(const osp_tokenizer *t, const char *file) {
    int fails = 0;
    each_line(file, check_chat_line, (void *)t, &fails, 0);
    if (fails) fail_msg("%s: %d mismatches", file, fails);
}

static void test_chat_ids(void **s) {
    (void)s;
    check_chat(gemma, "chat-gemma3.jsonl");
    check_chat(llama, "chat-llama3.jsonl");
    check_chat(qwen, "chat-qwen3.jsonl");
}

static void test_special_ids(void **s) {
    (void)s;
    const osp_tokenizer_info *g = osp_tokenizer_get_info(gemma), *l = osp_tokenizer_get_info(llama),
                             *q = osp_tokenizer_get_info(qwen);
    assert_int_equal(g->vocab_size, 262145);
    assert_int_equal(g->bos_id, 2);
    assert_int_equal(g->eos_id, 106); /* <end_of_turn>, from tokenizer_config.json */
    assert_int_equal(g->pad_id, 0);
    assert_true(g->add_bos);
    assert_int_equal(l->bos_id, 128000);
    assert_int_equal(l->eos_id, 128001);
    assert_false(l->add_bos);
    assert_true(l->clean_up_tokenization_spaces);
    assert_int_equal(q->bos_id, -1);
    assert_int_equal(q->eos_id, 151645);
    assert_true(osp_tokenizer_is_special(gemma, 106));
    assert_false(osp_tokenizer_is_special(gemma, 107)); /* "\n" is added but not special */
    assert_int_equal(osp_tokenizer_token_id(gemma, "<start_of_turn>", 15), 105);
    assert_int_equal(osp_tokenizer_token_id(llama, "Hello", 5), 9906);
    assert_int_equal(osp_tokenizer_token_id(llama, "nope-not-a-token", 16), -1);
    size_t len;
    const char *txt = osp_tokenizer_token_text(llama, 220, &len);
    assert_non_null(txt);
    assert_memory_equal(txt, "\xC4\xA0", 2); /* "Ġ" */
    assert_null(osp_tokenizer_token_text(llama, 1 << 30, &len));

    /* buffer API */
    int32_t buf[4];
    size_t n = 0;
    const char *text = "The quick brown fox jumps over the lazy dog.";
    assert_int_equal(osp_tokenizer_encode(llama, text, strlen(text), 0, buf, 4, &n), OSP_ERR_RANGE);
    assert_true(n > 4);
    int32_t *big = malloc(n * sizeof *big);
    size_t n2;
    assert_int_equal(osp_tokenizer_encode(llama, text, strlen(text), 0, big, n, &n2), OSP_OK);
    assert_int_equal(n2, n);
    free(big);
    /* invalid UTF-8 is refused */
    assert_int_equal(osp_tokenizer_encode(llama, "a\xff", 2, 0, buf, 4, &n), OSP_ERR_INVALID);
    /* decode: ids outside the vocabulary */
    int32_t badid = 1 << 30;
    char *dec;
    assert_int_equal(osp_tokenizer_decode(llama, &badid, 1, 0, &dec, NULL), OSP_ERR_RANGE);
    /* skip special, clean-up */
    int32_t ids[] = {128000, 9906, 1174, 1917, 758};
    assert_int_equal(osp_tokenizer_decode(llama, ids, 5, OSP_DECODE_SKIP_SPECIAL, &dec, &len), OSP_OK);
    char *plain;
    assert_int_equal(osp_tokenizer_decode(llama, ids + 1, 4, 0, &plain, NULL), OSP_OK);
    assert_string_equal(dec, plain);
    osp_free(dec);
    osp_free(plain);
}

/* ---- whisper (tiktoken) ---- */

static const char *const LANGS[99] = {
    "en", "zh", "de", "es", "ru", "ko", "fr", "ja", "pt", "tr", "pl", "ca", "nl", "ar", "sv", "it", "id",
    "hi", "fi", "vi", "he", "uk", "el", "ms", "cs", "ro", "da", "hu", "ta", "no", "th", "ur", "hr", "bg",
    "lt", "la", "mi", "ml", "cy", "sk", "te", "fa", "lv", "bn", "sr", "az", "sl", "kn", "et", "mk", "br",
    "eu", "is", "hy", "ne", "mn", "bs", "kk", "sq", "sw", "gl", "mr", "pa", "si", "km", "sn", "yo", "so",
    "af", "oc", "ka", "be", "tg", "sd", "gu", "am", "yi", "lo", "uz", "fo", "ht", "ps", "tk", "nn", "mt",
    "sa", "lb", "my", "bo", "tl", "mg", "as", "tt", "haw", "ln", "ha", "ba", "jw", "su"};

static void check_whisper_line(json_t *j, void *vctx, int *fails) {
    const osp_tokenizer *t = vctx;
    json_t *tx = json_object_get(j, "text");
    const char *text = json_string_value(tx);
    int32_t *got;
    size_t n;
    assert_int_equal(osp_tokenizer_encode_alloc(t, text, json_string_length(tx), 0, &got, &n), OSP_OK);
    if (!ids_match(got, n, json_object_get(j, "ids"))) {
        show_ids("whisper ids", text, got, n, json_object_get(j, "ids"));
        (*fails)++;
    }
    char *dec;
    size_t dl;
    assert_int_equal(osp_tokenizer_decode(t, got, n, 0, &dec, &dl), OSP_OK);
    if (dl != json_string_length(tx) || memcmp(dec, text, dl) != 0) {
        fprintf(stderr, "whisper decode: want '%s' got '%s'\n", text, dec);
        (*fails)++;
    }
    if (stream_matches(t, got, n, 0)) (*fails)++;
    osp_free(dec);
    osp_free(got);
}

static void check_whisper(const char *ranks, const char *golden) {
    char *specials[2 + 99 + 6 + 1501];
    int k = 0;
    char buf[64];
    specials[k++] = strdup("<|endoftext|>");
    specials[k++] = strdup("<|startoftranscript|>");
    for (int i = 0; i < 99; i++) {
        snprintf(buf, sizeof buf, "<|%s|>", LANGS[i]);
        specials[k++] = strdup(buf);
    }
    const char *tail[] = {"<|translate|>", "<|transcribe|>", "<|startoflm|>", "<|startofprev|>", "<|nospeech|>",
                          "<|notimestamps|>"};
    for (int i = 0; i < 6; i++) specials[k++] = strdup(tail[i]);
    for (int i = 0; i < 1501; i++) {
        snprintf(buf, sizeof buf, "<|%.2f|>", i * 0.02);
        specials[k++] = strdup(buf);
    }
    char p[512];
    snprintf(p, sizeof p, "%s/whisper/%s", tmpdir, ranks);
    osp_tokenizer *t;
    double t0 = osp_now_s();
    if (osp_tokenizer_load_tiktoken(p, NULL, (const char *const *)specials, k, &t) != OSP_OK)
        fail_msg("%s", osp_last_error());
    print_message("loaded %s in %.3f s\n", ranks, osp_now_s() - t0);

    /* line 1: the special ids */
    snprintf(p, sizeof p, "%s/goldens/%s", DATA, golden);
    FILE *f = fopen(p, "r");
    assert_non_null(f);
    char line[4096];
    assert_non_null(fgets(line, sizeof line, f));
    fclose(f);
    json_t *root = json_loads(line, 0, NULL);
    json_t *sp = json_object_get(root, "special_ids");
    assert_non_null(sp);
    const struct { const char *key, *tok; } S[] = {
        {"eot", "<|endoftext|>"},   {"sot", "<|startoftranscript|>"}, {"en", "<|en|>"},
        {"translate", "<|translate|>"}, {"transcribe", "<|transcribe|>"}, {"nospeech", "<|nospeech|>"},
        {"notimestamps", "<|notimestamps|>"}, {"ts_0_00", "<|0.00|>"}, {"ranks", "<|endoftext|>"},
    };
    for (size_t i = 0; i < sizeof S / sizeof *S; i++)
        assert_int_equal(osp_tokenizer_token_id(t, S[i].tok, strlen(S[i].tok)),
                         json_integer_value(json_object_get(sp, S[i].key)));
    assert_int_equal(osp_tokenizer_get_info(t)->vocab_size, json_integer_value(json_object_get(sp, "n_vocab")));
    assert_true(osp_tokenizer_is_special(t, (int32_t)json_integer_value(json_object_get(sp, "sot"))));

    int fails = 0;
    each_line(golden, check_whisper_line, t, &fails, 1);
    /* special-token text is matched */
    int32_t *ids;
    size_t n;
    const char *txt = "<|startoftranscript|><|en|> hello<|endoftext|>";
    assert_int_equal(osp_tokenizer_encode_alloc(t, txt, strlen(txt), 0, &ids, &n), OSP_OK);
    assert_true(n >= 4);
    assert_int_equal(ids[0], json_integer_value(json_object_get(sp, "sot")));
    assert_int_equal(ids[1], json_integer_value(json_object_get(sp, "en")));
    assert_int_equal(ids[n - 1], json_integer_value(json_object_get(sp, "eot")));
    osp_free(ids);
    json_decref(root);
    for (int i = 0; i < k; i++) free(specials[i]);
    osp_tokenizer_free(t);
    if (fails) fail_msg("%s: %d mismatches", golden, fails);
}

static void test_whisper_multilingual(void **s) { (void)s; check_whisper("multilingual.tiktoken", "whisper-multilingual.jsonl"); }
static void test_whisper_gpt2(void **s) { (void)s; check_whisper("gpt2.tiktoken", "whisper-gpt2-en.jsonl"); }

/* ---- the bundled model ---- */

static void test_fortune(void **s) {
    (void)s;
    osp_tokenizer *t;
    if (osp_tokenizer_load("../models/fortune", &t) != OSP_OK) fail_msg("%s", osp_last_error());
    const osp_tokenizer_info *in = osp_tokenizer_get_info(t);
    assert_int_equal(in->vocab_size, 4096);
    assert_int_equal(in->bos_id, 2);
    /* golden.safetensors: metadata "prompts" (rendered text) and prompt{i}_ids */
    FILE *f = fopen("../models/fortune/golden.safetensors", "rb");
    assert_non_null(f);
    uint64_t hl = 0;
    unsigned char hb[8];
    assert_int_equal(fread(hb, 1, 8, f), 8);
    for (int i = 0; i < 8; i++) hl |= (uint64_t)hb[i] << (8 * i);
    char *hdr = malloc(hl + 1);
    assert_int_equal(fread(hdr, 1, hl, f), hl);
    hdr[hl] = 0;
    json_t *h = json_loads(hdr, 0, NULL);
    assert_non_null(h);
    json_t *prompts = json_loads(json_string_value(json_object_get(json_object_get(h, "__metadata__"), "prompts")), 0, NULL);
    assert_true(json_array_size(prompts) == 3);
    for (size_t i = 0; i < 3; i++) {
        json_t *r = json_object_get(json_array_get(prompts, i), "rendered");
        char key[32];
        snprintf(key, sizeof key, "prompt%zu_ids", i);
        json_t *off = json_object_get(json_object_get(h, key), "data_offsets");
        size_t a = (size_t)json_integer_value(json_array_get(off, 0)), b = (size_t)json_integer_value(json_array_get(off, 1));
        int32_t *want = malloc(b - a);
        fseek(f, (long)(8 + hl + a), SEEK_SET);
        assert_int_equal(fread(want, 1, b - a, f), b - a);
        int32_t *got;
        size_t n;
        assert_int_equal(osp_tokenizer_encode_alloc(t, json_string_value(r), json_string_length(r), 0, &got, &n), OSP_OK);
        assert_int_equal(n, (b - a) / 4);
        assert_memory_equal(got, want, b - a);
        char *dec;
        size_t dl;
        assert_int_equal(osp_tokenizer_decode(t, got, n, 0, &dec, &dl), OSP_OK);
        assert_int_equal(dl, json_string_length(r));
        assert_memory_equal(dec, json_string_value(r), dl);
        assert_int_equal(stream_matches(t, got, n, 1), 0);
        osp_free(dec);
        osp_free(got);
        free(want);
    }
    const char *text = "Hello, world!  Ünïcödé and emoji 🦙🚀\n\tend ";
    int32_t *ids;
    size_t n;
    assert_int_equal(osp_tokenizer_encode_alloc(t, text, strlen(text), 1, &ids, &n), OSP_OK);
    assert_int_equal(ids[0], 2);
    char *dec;
    assert_int_equal(osp_tokenizer_decode(t, ids + 1, n - 1, 0, &dec, NULL), OSP_OK);
    assert_string_equal(dec, text);
    osp_free(dec);
    osp_free(ids);
    json_decref(prompts);
    json_decref(h);
    free(hdr);
    fclose(f);
    osp_tokenizer_free(t);
}

/* ---- refusals ---- */

static char mini[4096];
static const char *mini_json(const char *model_type, const char *norm, const char *pre, const char *dec) {
    snprintf(mini, sizeof mini,
             "{\"version\":\"1.0\",\"truncation\":null,\"padding\":null,\"added_tokens\":"
             "[{\"id\":3,\"content\":\"<s>\",\"single_word\":false,\"lstrip\":false,\"rstrip\":false,"
             "\"normalized\":false,\"special\":true}],"
             "\"normalizer\":%s,\"pre_tokenizer\":%s,\"post_processor\":null,\"decoder\":%s,"
             "\"model\":{\"type\":\"%s\",\"dropout\":null,\"unk_token\":null,\"vocab\":{\"a\":0,\"b\":1,\"ab\":2},"
             "\"merges\":[\"a b\"]}}",
             norm, pre, dec, model_type);
    return mini;
}

static void expect_error(const char *json, osp_status want, const char *needle) {
    osp_tokenizer *t = NULL;
    osp_status st = osp_tokenizer_load_json(json, strlen(json), NULL, 0, "bad.json", &t);
    if (st != want) fail_msg("status %d (want %d) for %.200s: %s", st, want, json, osp_last_error());
    assert_null(t);
    if (!strstr(osp_last_error(), needle)) fail_msg("message '%s' does not name '%s'", osp_last_error(), needle);
}

static void test_errors(void **s) {
    (void)s;
    /* the mini file itself is fine */
    const char *ok = mini_json("BPE", "null", "null", "null");
    osp_tokenizer *t;
    assert_int_equal(osp_tokenizer_load_json(ok, strlen(ok), NULL, 0, "mini", &t), OSP_OK);
    int32_t ids[8];
    size_t n;
    assert_int_equal(osp_tokenizer_encode(t, "ab<s>ba", 7, 0, ids, 8, &n), OSP_OK);
    assert_int_equal(n, 4);
    assert_int_equal(ids[0], 2);
    assert_int_equal(ids[1], 3);
    osp_tokenizer_free(t);
    /* every truncation of it is a malformed-JSON error */
    size_t len = strlen(ok);
    char *cut = malloc(len + 1);
    for (size_t k = 0; k < len; k++) {
        memcpy(cut, ok, k);
        cut[k] = 0;
        osp_tokenizer *tt = NULL;
        osp_status st = osp_tokenizer_load_json(cut, k, NULL, 0, "cut.json", &tt);
        if (st != OSP_ERR_FORMAT || !strstr(osp_last_error(), "malformed JSON"))
            fail_msg("truncated at %zu: status %d, '%s'", k, st, osp_last_error());
    }
    free(cut);
    expect_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []", OSP_ERR_FORMAT, "truncated");
    expect_error("{\"model\": {\"type\": \"BPE\" \"vocab\": {}}}", OSP_ERR_FORMAT, "byte 25: expected ','");
    expect_error(mini_json("WordLevel", "null", "null", "null"), OSP_ERR_UNSUPPORTED, "WordLevel");
    expect_error(mini_json("Unigram", "null", "null", "null"), OSP_ERR_FORMAT, "Unigram"); /* vocab not a list */
    expect_error(mini_json("BPE", "{\"type\":\"Precompiled\",\"precompiled_charsmap\":\"\"}", "null", "null"),
                 OSP_ERR_FORMAT, "Precompiled"); /* an empty charsmap has no trie */
    expect_error(mini_json("BPE", "{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"NFC\"},{\"type\":\"Bogus\"}]}",
                           "null", "null"),
                 OSP_ERR_UNSUPPORTED, "Bogus");
    expect_error(mini_json("BPE", "null", "{\"type\":\"UnicodeScripts\"}", "null"), OSP_ERR_UNSUPPORTED, "UnicodeScripts");
    expect_error(mini_json("BPE", "null", "null", "{\"type\":\"CTC\"}"), OSP_ERR_UNSUPPORTED, "CTC");
    expect_error(mini_json("BPE", "null",
                           "{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(unclosed\"},\"behavior\":\"Isolated\",\"invert\":false}",
                           "null"),
                 OSP_ERR_UNSUPPORTED, "(unclosed");
    const char *badmerge = "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1},\"merges\":[\"a c\"]}}";
    expect_error(badmerge, OSP_ERR_FORMAT, "'c'");
    const char *nomodel = "{\"version\":\"1.0\"}";
    expect_error(nomodel, OSP_ERR_FORMAT, "model");
    /* found by fuzz_tokenizer: a sparse id made a 150-byte file allocate gigabytes */
    const char *sparse = "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":99209202},\"merges\":[]}}";
    expect_error(sparse, OSP_ERR_FORMAT, "not dense");
    assert_int_equal(osp_tokenizer_load("/nonexistent/osprey/tok", &t), OSP_ERR_IO);
    char p[512];
    snprintf(p, sizeof p, "%s/bad.tiktoken", tmpdir);
    FILE *f = fopen(p, "w");
    fputs("IQ== 0\nnot-a-line\n", f);
    fclose(f);
    assert_int_equal(osp_tokenizer_load_tiktoken(p, NULL, NULL, 0, &t), OSP_ERR_FORMAT);
    assert_non_null(strstr(osp_last_error(), "line 2"));
}

/* ---- incremental detokenizer ---- */

static void stream(const osp_tokenizer *t, const int32_t *ids, size_t n, int skip, const char **chunks, size_t nchunks) {
    osp_detok *d;
    assert_int_equal(osp_detok_new(t, skip, &d), OSP_OK);
    assert_int_equal(n + 1, nchunks);
    for (size_t i = 0; i <= n; i++) {
        const char *s;
        size_t k;
        assert_int_equal(i < n ? osp_detok_push(d, ids[i], &s, &k) : osp_detok_flush(d, &s, &k), OSP_OK);
        if (k != strlen(chunks[i]) || memcmp(s, chunks[i], k) != 0)
            fail_msg("chunk %zu: want '%s' got '%.*s'", i, chunks[i], (int)k, s);
    }
    osp_detok_free(d);
}

static void test_detok_byte_fallback(void **s) {
    (void)s;
    int32_t e2 = osp_tokenizer_token_id(gemma, "<0xE2>", 6), x82 = osp_tokenizer_token_id(gemma, "<0x82>", 6),
            xac = osp_tokenizer_token_id(gemma, "<0xAC>", 6), price = osp_tokenizer_token_id(gemma, "▁Price", 8),
            ok = osp_tokenizer_token_id(gemma, "▁ok", 5);
    assert_true(e2 > 0 && x82 > 0 && xac > 0 && price > 0 && ok > 0);
    int32_t ids[] = {2, price, e2, x82, xac, ok};
    const char *want[] = {"", " Price", "", "", "", "€ ok", ""};
    stream(gemma, ids, 6, 1, want, 7);
    const char *want_sp[] = {"<bos>", " Price", "", "", "", "€ ok", ""};
    stream(gemma, ids, 6, 0, want_sp, 7);
    /* the stream ends inside the run: flush gives what decode gives */
    const char *cut[] = {"", " Price", "", "", "", "€"};
    stream(gemma, ids, 5, 1, cut, 6);
    const char *broken[] = {" Price", "", "", "\xEF\xBF\xBD\xEF\xBF\xBD"};
    int32_t ids2[] = {price, e2, x82};
    stream(gemma, ids2, 3, 1, broken, 4);
    char *dec;
    assert_int_equal(osp_tokenizer_decode(gemma, ids2, 3, 0, &dec, NULL), OSP_OK);
    assert_string_equal(dec, " Price\xEF\xBF\xBD\xEF\xBF\xBD");
    osp_free(dec);
}

static void test_detok_byte_level(void **s) {
    (void)s;
    const char *text = "a 🦙 b";
    int32_t *ids;
    size_t n;
    assert_int_equal(osp_tokenizer_encode_alloc(llama, text, strlen(text), 0, &ids, &n), OSP_OK);
    assert_true(n >= 4); /* the emoji spans several byte-level tokens */
    osp_detok *d;
    assert_int_equal(osp_detok_new(llama, 0, &d), OSP_OK);
    char acc[64] = "";
    int held = 0;
    for (size_t i = 0; i < n; i++) {
        const char *c;
        size_t k;
        assert_int_equal(osp_detok_push(d, ids[i], &c, &k), OSP_OK);
        assert_true(valid_utf8(c, k));
        held += k == 0;
        strncat(acc, c, k);
    }
    const char *c;
    size_t k;
    assert_int_equal(osp_detok_flush(d, &c, &k), OSP_OK);
    strncat(acc, c, k);
    assert_string_equal(acc, text);
    assert_true(held >= 1);
    osp_detok_free(d);
    osp_free(ids);
}

/* Llama 2 style SentencePiece tokenizers: the leading space of the text's
 * first token is dropped, and only that one. */
static void test_detok_leading_space(void **s) {
    (void)s;
    const char *fmt =
        "{\"added_tokens\":[{\"id\":0,\"content\":\"<s>\",\"special\":true,\"normalized\":false}],"
        "\"normalizer\":null,\"pre_tokenizer\":{\"type\":\"Metaspace\",\"replacement\":\"\\u2581\","
        "\"prepend_scheme\":\"first\",\"split\":false},\"post_processor\":null,\"decoder\":%s,"
        "\"model\":{\"type\":\"BPE\",\"vocab\":{\"<s>\":0,\"\\u2581\":1,\"\\u2581Hello\":2,\"\\u2581world\":3,"
        "\"H\":4,\"e\":5,\"l\":6,\"o\":7,\"w\":8,\"r\":9,\"d\":10,\"\\u2581H\":11,\"\\u2581He\":12,\"\\u2581Hel\":13,"
        "\"\\u2581Hell\":14,\"\\u2581w\":15,\"\\u2581wo\":16,\"\\u2581wor\":17,\"\\u2581worl\":18},"
        "\"merges\":[\"\\u2581 H\",\"\\u2581H e\",\"\\u2581He l\",\"\\u2581Hel l\",\"\\u2581Hell o\",\"\\u2581 w\","
        "\"\\u2581w o\",\"\\u2581wo r\",\"\\u2581wor l\",\"\\u2581worl d\"]}}";
    const char *decoders[] = {
        "{\"type\":\"Metaspace\",\"replacement\":\"\\u2581\",\"prepend_scheme\":\"first\",\"split\":false}",
        "{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"Replace\",\"pattern\":{\"String\":\"\\u2581\"},"
        "\"content\":\" \"},{\"type\":\"ByteFallback\"},{\"type\":\"Fuse\"},{\"type\":\"Strip\",\"content\":\" \","
        "\"start\":1,\"stop\":0}]}",
    };
    char json[4096];
    for (int i = 0; i < 2; i++) {
        snprintf(json, sizeof json, fmt, decoders[i]);
        osp_tokenizer *t;
        if (osp_tokenizer_load_json(json, strlen(json), NULL, 0, "sp.json", &t) != OSP_OK)
            fail_msg("%s", osp_last_error());
        int32_t *ids;
        size_t n;
        assert_int_equal(osp_tokenizer_encode_alloc(t, "Hello world", 11, 0, &ids, &n), OSP_OK);
        assert_int_equal(n, 2);
        assert_int_equal(ids[0], 2);
        assert_int_equal(ids[1], 3);
        osp_free(ids);
        /* "<s>" first: "first" prepends nothing after it */
        assert_int_equal(osp_tokenizer_encode_alloc(t, "<s>Hello", 8, 0, &ids, &n), OSP_OK);
        assert_int_equal(n, 6);
        osp_free(ids);
        int32_t a[] = {2, 3};
        const char *w1[] = {"Hello", " world", ""};
        stream(t, a, 2, 0, w1, 3);
        int32_t b[] = {0, 2, 3};
        const char *w2[] = {"", "Hello", " world", ""};
        stream(t, b, 3, 1, w2, 4);
        int32_t c[] = {1, 1, 2};
        char *full;
        assert_int_equal(osp_tokenizer_decode(t, c, 3, 0, &full, NULL), OSP_OK);
        assert_int_equal(stream_matches(t, c, 3, 0), 0);
        if (i == 0) {
            const char *w3[] = {"", " ", " Hello", ""};
            assert_string_equal(full, "  Hello");
            stream(t, c, 3, 0, w3, 4);
            const char *w4[] = {"<s>", " Hello", " world", ""};
            stream(t, b, 3, 0, w4, 4);
        }
        osp_free(full);
        osp_tokenizer_free(t);
    }
    /* a decoder whose end changes with later tokens is refused for streaming */
    snprintf(json, sizeof json, fmt,
             "{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"Fuse\"},{\"type\":\"Strip\",\"content\":\" \","
             "\"start\":0,\"stop\":1}]}");
    osp_tokenizer *t;
    assert_int_equal(osp_tokenizer_load_json(json, strlen(json), NULL, 0, "sp.json", &t), OSP_OK);
    osp_detok *d;
    assert_int_equal(osp_detok_new(t, 0, &d), OSP_ERR_UNSUPPORTED);
    assert_non_null(strstr(osp_last_error(), "Strip"));
    osp_tokenizer_free(t);
}

/* ---- threads share one tokenizer ---- */

typedef struct thr {
    const osp_tokenizer *t;
    int ok;
} thr;

static void *worker(void *arg) {
    thr *w = arg;
    const char *text = "The quick brown fox jumps over the lazy dog. Пример текста 例子 🚀 again and again.";
    int32_t *first = NULL;
    size_t nf = 0;
    w->ok = 1;
    for (int i = 0; i < 200 && w->ok; i++) {
        int32_t *ids;
        size_t n;
        if (osp_tokenizer_encode_alloc(w->t, text, strlen(text), 1, &ids, &n) != OSP_OK) w->ok = 0;
        else if (!first) {
            first = ids;
            nf = n;
            continue;
        } else if (n != nf || memcmp(ids, first, n * sizeof *ids)) w->ok = 0;
        osp_free(ids);
    }
    osp_free(first);
    return NULL;
}

static void test_threads(void **s) {
    (void)s;
    pthread_t th[4];
    thr w[4];
    for (int i = 0; i < 4; i++) {
        w[i].t = i % 2 ? gemma : llama;
        pthread_create(&th[i], NULL, worker, &w[i]);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        assert_true(w[i].ok);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_encode_gemma3),
        cmocka_unit_test(test_encode_llama3),
        cmocka_unit_test(test_encode_qwen3),
        cmocka_unit_test(test_encode_llamacpp_qwen2),
        cmocka_unit_test(test_encode_llamacpp_llama_bpe),
        cmocka_unit_test(test_chat_ids),
        cmocka_unit_test(test_special_ids),
        cmocka_unit_test(test_whisper_multilingual),
        cmocka_unit_test(test_whisper_gpt2),
        cmocka_unit_test(test_fortune),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_detok_byte_fallback),
        cmocka_unit_test(test_detok_byte_level),
        cmocka_unit_test(test_detok_leading_space),
        cmocka_unit_test(test_threads),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
