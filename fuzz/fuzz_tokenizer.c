/* libFuzzer: tokenizer.json loading and encoding (text/tokenizer).
 * Input byte 0 picks the job:
 *   even: the rest is a tokenizer.json; when it loads, a fixed text is
 *         encoded and decoded with it;
 *   odd:  the rest is text, encoded (with and without specials) and decoded
 *         by the real tokenizers in FUZZ_TOKENIZERS (a ':'-separated list of
 *         folders or tokenizer.json files; default: the bundled model's, and
 *         the encoders' WordPiece and Unigram tokenizers of tests/data/bert).
 * The seeds (fuzz/run.sh) include those tokenizer.json files as job 0. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "core/core.h"
#include "text/tokenizer.h"

static osp_tokenizer *toks[8];
static int n_toks;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    const char *env = getenv("FUZZ_TOKENIZERS");
    char *list = strdup(env ? env : "models/fortune:tests/data/bert/bert-tiny:tests/data/bert/xlmr-tiny");
    for (char *p = strtok(list, ":"); p && n_toks < 8; p = strtok(NULL, ":"))
        if (osp_tokenizer_load(p, &toks[n_toks]) == OSP_OK) n_toks++;
    free(list);
    if (!n_toks) abort(); /* run from the repository root, or set FUZZ_TOKENIZERS */
    return 0;
}

static void roundtrip(const osp_tokenizer *t, const char *s, size_t n, int specials) {
    int32_t *ids = NULL;
    size_t k = 0;
    if (osp_tokenizer_encode_alloc(t, s, n, specials, &ids, &k) != OSP_OK) return;
    char *text = NULL;
    size_t len = 0;
    if (osp_tokenizer_decode(t, ids, k, 0, &text, &len) == OSP_OK) osp_free(text);
    osp_free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!size) return 0;
    const char *s = (const char *)data + 1;
    size_t n = size - 1;
    if (!(data[0] & 1)) {
        osp_tokenizer *t;
        if (osp_tokenizer_load_json(s, n, NULL, 0, "fuzz", &t) != OSP_OK) return 0;
        static const char text[] = "Hello, world! 123 <|im_start|> \xc3\xa9t\xc3\xa9  \n\t x";
        roundtrip(t, text, sizeof text - 1, 1);
        osp_tokenizer_free(t);
        return 0;
    }
    for (int i = 0; i < n_toks; i++) {
        roundtrip(toks[i], s, n, 0);
        roundtrip(toks[i], s, n, 1);
    }
    return 0;
}
