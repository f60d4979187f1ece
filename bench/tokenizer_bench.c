/* tokenizer_bench: load time and single-core encode speed of tokenizers.
 *
 *   tokenizer_bench [--text FILE] [--mb N] [--chunk BYTES] PATH...
 *
 * PATH is a tokenizer folder, a tokenizer.json, or a tokenizer.json.gz (as
 * stored in tests/data/tokenizers; unpacked in memory with gzip -dc, and
 * its sibling tokenizer_config.json is read). Without --text the input is
 * English prose: sentences drawn from a fixed pool by a fixed-seed PRNG
 * into paragraphs, N MB in all (default 8). The text is encoded in chunks
 * of --chunk bytes (default 4096, cut at a space), the way prompts arrive;
 * the first pass warms the pre-token cache and is reported separately. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/core.h"
#include "text/tokenizer.h"

static const char *const SENTENCES[] = {
    "The history of the city is written in its streets, its bridges and the names of its squares.",
    "When the first settlers arrived, they found a river wide enough to carry boats to the sea.",
    "Over the following centuries, merchants built warehouses along both banks and trade grew steadily.",
    "Scientists have long debated whether the climate of the region changed before or after the forests were cleared.",
    "In the morning, the market fills with farmers selling vegetables, cheese, bread and fresh flowers.",
    "She opened the letter slowly, unsure whether she wanted to know what it said.",
    "The committee will publish its final report next spring, after reviewing more than two thousand submissions.",
    "Most readers remember the novel for its ending, but the opening chapters are where the author's skill shows.",
    "A small change in the design of the engine reduced fuel consumption by almost twelve percent.",
    "He had never seen so many stars; far from the lights of town, the sky looked crowded and close.",
    "Teachers say that students learn best when they are allowed to make mistakes and correct them.",
    "The museum's new wing, which opened in October, holds paintings that were hidden for decades.",
    "If the weather holds, the expedition plans to reach the northern glacier by the end of the week.",
    "Economists expect interest rates to remain unchanged, although some warn that inflation could return.",
    "The old library smelled of dust and leather, and every shelf seemed to hold a forgotten story.",
    "Researchers measured the temperature of the lake every hour for three years without interruption.",
    "Nobody knew exactly why the bridge had been painted red, but by now no one could imagine it any other way.",
    "The software update fixes several security problems and makes the application start faster.",
    "Children played in the park until the light faded, and then the streetlamps came on one by one.",
    "According to the survey, most people would rather walk or cycle to work if the roads were safer.",
    "The orchestra rehearsed the symphony for weeks, yet the conductor still asked for one more run.",
    "Her grandmother's recipe called for butter, flour, sugar, two eggs and a pinch of salt.",
    "During the storm, the harbor was closed and the fishing boats stayed tied to the pier.",
    "It is easy to underestimate how much work goes into a good dictionary, which must record how words are really used.",
};

static uint64_t rng = 0x9E3779B97F4A7C15ULL;
static uint32_t next_rand(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 11);
}

static char *make_prose(size_t bytes, size_t *n) {
    char *b = malloc(bytes + 4096);
    size_t k = 0;
    int in_par = 0;
    const size_t ns = sizeof SENTENCES / sizeof *SENTENCES;
    while (k < bytes) {
        const char *s = SENTENCES[next_rand() % ns];
        size_t l = strlen(s);
        if (in_par) b[k++] = ' ';
        memcpy(b + k, s, l);
        k += l;
        if (++in_par == 5 + (int)(next_rand() % 4)) {
            b[k++] = '\n';
            b[k++] = '\n';
            in_par = 0;
        }
    }
    *n = k;
    return b;
}

static char *slurp_cmd(const char *cmd, size_t *n) {
    FILE *f = popen(cmd, "r");
    if (!f) return NULL;
    size_t cap = 1 << 20, len = 0, k;
    char *b = malloc(cap);
    while ((k = fread(b + len, 1, cap - len, f)) > 0) {
        len += k;
        if (len == cap) b = realloc(b, cap *= 2);
    }
    if (pclose(f) != 0) {
        free(b);
        return NULL;
    }
    *n = len;
    return b;
}

static char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)sz + 1);
    *n = fread(b, 1, (size_t)sz, f);
    fclose(f);
    return b;
}

static osp_tokenizer *load(const char *path, double *secs) {
    osp_tokenizer *t = NULL;
    size_t plen = strlen(path);
    if (plen > 3 && !strcmp(path + plen - 3, ".gz")) {
        char cmd[4200], cfgp[4200];
        snprintf(cmd, sizeof cmd, "gzip -dc '%s'", path);
        size_t jn, cn = 0;
        char *json = slurp_cmd(cmd, &jn);
        if (!json) return NULL;
        snprintf(cfgp, sizeof cfgp, "%s", path);
        char *slash = strrchr(cfgp, '/');
        snprintf(slash ? slash + 1 : cfgp, sizeof cfgp - (size_t)(slash ? slash + 1 - cfgp : 0),
                 "tokenizer_config.json");
        char *cfg = slurp(cfgp, &cn);
        double t0 = osp_now_s();
        osp_status st = osp_tokenizer_load_json(json, jn, cfg, cn, path, &t);
        *secs = osp_now_s() - t0;
        free(json);
        free(cfg);
        return st == OSP_OK ? t : NULL;
    }
    double t0 = osp_now_s();
    osp_status st = osp_tokenizer_load(path, &t);
    *secs = osp_now_s() - t0;
    return st == OSP_OK ? t : NULL;
}

int main(int argc, char **argv) {
    const char *text_file = NULL;
    double mb = 8;
    size_t chunk = 4096;
    int first_path = argc;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--text") && i + 1 < argc) text_file = argv[++i];
        else if (!strcmp(argv[i], "--mb") && i + 1 < argc) mb = atof(argv[++i]);
        else if (!strcmp(argv[i], "--chunk") && i + 1 < argc) chunk = (size_t)atol(argv[++i]);
        else {
            first_path = i;
            break;
        }
    }
    if (first_path >= argc) {
        fprintf(stderr, "usage: tokenizer_bench [--text FILE] [--mb N] [--chunk BYTES] PATH...\n");
        return 2;
    }
    size_t n;
    char *text = text_file ? slurp(text_file, &n) : make_prose((size_t)(mb * 1e6), &n);
    if (!text) {
        fprintf(stderr, "tokenizer_bench: cannot read %s\n", text_file);
        return 1;
    }
    printf("text: %.2f MB (%s), chunks of %zu bytes\n", n / 1e6, text_file ? text_file : "generated English prose",
           chunk);
    size_t cap = n + 16;
    int32_t *ids = malloc(cap * sizeof *ids);
    for (int a = first_path; a < argc; a++) {
        double load_s;
        osp_tokenizer *t = load(argv[a], &load_s);
        if (!t) {
            fprintf(stderr, "tokenizer_bench: %s: %s\n", argv[a], osp_last_error());
            return 1;
        }
        double pass_s[2] = {0, 0};
        size_t total_ids = 0;
        for (int pass = 0; pass < 2; pass++) {
            double t0 = osp_now_s();
            total_ids = 0;
            for (size_t off = 0; off < n;) {
                size_t len = n - off < chunk ? n - off : chunk;
                while (off + len < n && len > 1 && text[off + len] != ' ') len--; /* cut at a space */
                size_t k;
                if (osp_tokenizer_encode(t, text + off, len, 0, ids, cap, &k) != OSP_OK) {
                    fprintf(stderr, "tokenizer_bench: encode: %s\n", osp_last_error());
                    return 1;
                }
                total_ids += k;
                off += len;
            }
            pass_s[pass] = osp_now_s() - t0;
        }
        printf("%-50s load %.3f s  encode %.1f MB/s (first pass %.1f MB/s)  %.2f bytes/token\n", argv[a], load_s,
               n / 1e6 / pass_s[1], n / 1e6 / pass_s[0], (double)n / (double)total_ids);
        osp_tokenizer_free(t);
    }
    free(ids);
    free(text);
    return 0;
}
