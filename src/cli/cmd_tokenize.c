/* osprey tokenize / osprey detokenize: the tokenizer from the command line.
 *
 *   osprey tokenize --model MODEL (--text TEXT | --file FILE) [--add-special]
 *       prints the ids as one JSON array ("[2, 651, 1234]", as json.dumps
 *       writes it) and a newline.
 *   osprey detokenize --model MODEL --ids 1,2,3 [--skip-special]
 *       prints exactly the decoded text, with no newline added.
 *
 * MODEL is a folder holding tokenizer.json (+ tokenizer_config.json), a
 * Hugging Face cache repo folder, or a tokenizer.json path; the bundled
 * model when omitted. Errors: one line "osprey <cmd>: <message>", exit 1. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli.h"
#include "core/core.h"
#include "text/tokenizer.h"

static const char TOK_USAGE[] =
    "usage: osprey tokenize --model MODEL (--text TEXT | --file FILE) [--add-special]\n"
    "  prints the token ids as one JSON array, then a newline\n"
    "  --add-special  add the post-processor's special tokens (e.g. <bos>)\n";

static const char DETOK_USAGE[] =
    "usage: osprey detokenize --model MODEL --ids 1,2,3 [--skip-special]\n"
    "  prints exactly the decoded text (no newline is added)\n"
    "  --skip-special  leave out special tokens\n";

static int fail(const char *cmd, const char *msg) {
    fprintf(stderr, "osprey %s: %s\n", cmd, msg);
    return 1;
}

static char *read_all(const char *path, size_t *n) {
    FILE *f = strcmp(path, "-") ? fopen(path, "rb") : stdin;
    if (!f) return NULL;
    size_t cap = 1 << 16, len = 0;
    char *b = malloc(cap);
    size_t k;
    while (b && (k = fread(b + len, 1, cap - len, f)) > 0) {
        len += k;
        if (len == cap) {
            char *q = realloc(b, cap *= 2);
            if (!q) {
                free(b);
                b = NULL;
            }
            b = q;
        }
    }
    if (b && ferror(f)) {
        free(b);
        b = NULL;
    }
    if (f != stdin) fclose(f);
    *n = len;
    return b;
}

static const char *model_arg(const char *model) { return model ? model : osp_cli_default_model(); }

int osp_cmd_tokenize(int argc, char **argv) {
    const char *model = NULL, *text = NULL, *file = NULL;
    int add_special = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--model") && i + 1 < argc) model = argv[++i];
        else if (!strcmp(argv[i], "--text") && i + 1 < argc) text = argv[++i];
        else if (!strcmp(argv[i], "--file") && i + 1 < argc) file = argv[++i];
        else if (!strcmp(argv[i], "--add-special")) add_special = 1;
        else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            fputs(TOK_USAGE, stdout);
            return 0;
        } else {
            fprintf(stderr, "osprey tokenize: unknown or incomplete option '%s'\n%s", argv[i], TOK_USAGE);
            return 1;
        }
    }
    if (!!text == !!file) {
        fprintf(stderr, "osprey tokenize: give one of --text or --file\n%s", TOK_USAGE);
        return 1;
    }
    if (!model_arg(model)) return fail("tokenize", "no --model given and no bundled model found");
    char *buf = NULL;
    size_t len = 0;
    if (file) {
        buf = read_all(file, &len);
        if (!buf) {
            char m[600];
            snprintf(m, sizeof m, "%s: cannot read (%s)", file, strerror(errno));
            return fail("tokenize", m);
        }
    } else {
        len = strlen(text);
    }
    osp_tokenizer *t;
    if (osp_tokenizer_load(model_arg(model), &t) != OSP_OK) {
        free(buf);
        return osp_cli_fail("tokenize");
    }
    int32_t *ids = NULL;
    size_t n = 0;
    osp_status st = osp_tokenizer_encode_alloc(t, file ? buf : text, len, add_special, &ids, &n);
    free(buf);
    osp_tokenizer_free(t);
    if (st != OSP_OK) return osp_cli_fail("tokenize");
    putchar('[');
    for (size_t i = 0; i < n; i++) printf(i ? ", %d" : "%d", ids[i]);
    fputs("]\n", stdout);
    osp_free(ids);
    return fflush(stdout) == 0 ? 0 : fail("tokenize", "cannot write the output");
}

static int parse_ids(const char *s, int32_t **out, size_t *n) {
    size_t cap = 16;
    *n = 0;
    *out = malloc(cap * sizeof **out);
    if (!*out) return -1;
    while (*s) {
        while (*s == ' ' || *s == ',' || *s == '[' || *s == ']') s++;
        if (!*s) break;
        char *end;
        errno = 0;
        long v = strtol(s, &end, 10);
        if (end == s || errno || v < INT32_MIN || v > INT32_MAX) return -1;
        if (*n == cap) {
            int32_t *q = realloc(*out, (cap *= 2) * sizeof **out);
            if (!q) return -1;
            *out = q;
        }
        (*out)[(*n)++] = (int32_t)v;
        s = end;
        if (*s && *s != ',' && *s != ' ' && *s != ']') return -1;
    }
    return 0;
}

int osp_cmd_detokenize(int argc, char **argv) {
    const char *model = NULL, *idstr = NULL;
    unsigned flags = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--model") && i + 1 < argc) model = argv[++i];
        else if (!strcmp(argv[i], "--ids") && i + 1 < argc) idstr = argv[++i];
        else if (!strcmp(argv[i], "--skip-special")) flags |= OSP_DECODE_SKIP_SPECIAL;
        else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            fputs(DETOK_USAGE, stdout);
            return 0;
        } else {
            fprintf(stderr, "osprey detokenize: unknown or incomplete option '%s'\n%s", argv[i], DETOK_USAGE);
            return 1;
        }
    }
    if (!idstr) {
        fprintf(stderr, "osprey detokenize: --ids is required\n%s", DETOK_USAGE);
        return 1;
    }
    if (!model_arg(model)) return fail("detokenize", "no --model given and no bundled model found");
    int32_t *ids = NULL;
    size_t n = 0;
    if (parse_ids(idstr, &ids, &n) != 0) {
        free(ids);
        return fail("detokenize", "--ids must be integers separated by commas, e.g. 1,2,3");
    }
    osp_tokenizer *t;
    if (osp_tokenizer_load(model_arg(model), &t) != OSP_OK) {
        free(ids);
        return osp_cli_fail("detokenize");
    }
    char *text = NULL;
    size_t len = 0;
    osp_status st = osp_tokenizer_decode(t, ids, n, flags, &text, &len);
    free(ids);
    osp_tokenizer_free(t);
    if (st != OSP_OK) return osp_cli_fail("detokenize");
    fwrite(text, 1, len, stdout);
    osp_free(text);
    return fflush(stdout) == 0 ? 0 : fail("detokenize", "cannot write the output");
}
