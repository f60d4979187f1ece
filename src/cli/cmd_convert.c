/* osprey convert IN OUT [-q] [--q-bits N] [--q-group-size G] [--dtype D]:
 * mlx_lm.convert's flags over model/convert.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "cli.h"
#include "core/core.h"
#include "model/convert.h"

static const char *CONVERT_USAGE =
    "usage: osprey convert IN OUT [-q] [--q-bits 2..8] [--q-group-size 32|64|128] [--dtype bf16|f16|f32]\n"
    "  IN                 a Hugging Face model folder (config.json + safetensors)\n"
    "  OUT                the folder to write (must not exist, or be empty)\n"
    "  -q, --quantize     MLX affine quantization of the Linear and Embedding layers\n"
    "  --q-bits N         bits per weight: 2, 3, 4, 5, 6 or 8 (default 4)\n"
    "  --q-group-size G   weights per scale and bias: 32, 64 or 128 (default 64)\n"
    "  --dtype D          the unquantized tensors' (and the scales') type (default: config.json's torch_dtype)\n"
    "mlx_lm's --hf-path/--model IN and --mlx-path OUT are accepted too.\n";

typedef struct cli_progress {
    int tty;
    double last;
} cli_progress;

/* One line per tensor when stderr is a terminal (overwritten in place),
 * else a line every few seconds; nothing for small models. */
static int on_progress(void *ud, int64_t i, int64_t n, const char *name, uint64_t done, uint64_t total) {
    cli_progress *p = ud;
    if (total < (64u << 20)) return 0;
    double now = osp_now_s();
    if (!p->tty && now - p->last < 5 && i + 1 < n) return 0;
    p->last = now;
    fprintf(stderr, "%sconvert: tensor %lld/%lld  %.0f/%.0f MB  %.60s%s", p->tty ? "\r\033[K" : "", (long long)(i + 1),
            (long long)n, done / 1e6, total / 1e6, name, p->tty ? "" : "\n");
    fflush(stderr);
    return 0;
}

static int parse_int(const char *flag, const char *v, int *out) {
    char *end;
    long x = v ? strtol(v, &end, 10) : 0;
    if (!v || !*v || *end || x <= 0 || x > 1024) {
        fprintf(stderr, "osprey convert: %s needs a positive integer (got '%s')\n", flag, v ? v : "");
        return -1;
    }
    *out = (int)x;
    return 0;
}

int osp_cmd_convert(int argc, char **argv) {
    osp_convert_opts o = {.dtype = -1};
    const char *pos[2] = {NULL, NULL}; /* IN, OUT */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(CONVERT_USAGE, stdout);
            return 0;
        } else if (!strcmp(a, "-q") || !strcmp(a, "--quantize")) {
            o.quantize = 1;
        } else if (!strcmp(a, "--q-bits")) {
            if (parse_int(a, v, &o.bits)) return 1;
            i++;
        } else if (!strcmp(a, "--q-group-size")) {
            if (parse_int(a, v, &o.group)) return 1;
            i++;
        } else if (!strcmp(a, "--hf-path") || !strcmp(a, "--model") || !strcmp(a, "--mlx-path")) {
            if (!v) {
                fprintf(stderr, "osprey convert: %s needs a folder\n", a);
                return 1;
            }
            pos[strcmp(a, "--mlx-path") ? 0 : 1] = v;
            i++;
        } else if (!strcmp(a, "--dtype")) {
            if (osp_convert_parse_dtype(v, &o.dtype) != OSP_OK) return osp_cli_fail("convert");
            i++;
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "osprey convert: unknown option '%s' (osprey convert --help)\n", a);
            return 1;
        } else if (!pos[0] || !pos[1]) {
            pos[pos[0] ? 1 : 0] = a;
        } else {
            fprintf(stderr, "osprey convert: unexpected argument '%s' (osprey convert --help)\n", a);
            return 1;
        }
    }
    if (!pos[0] || !pos[1]) {
        fputs(CONVERT_USAGE, stderr);
        return 2;
    }
    if (!o.quantize && (o.bits || o.group)) {
        fprintf(stderr, "osprey convert: --q-bits and --q-group-size need -q\n");
        return 1;
    }
    cli_progress pr = {.tty = isatty(2)};
    o.progress = on_progress;
    o.progress_ud = &pr;
    double t0 = osp_now_s();
    osp_convert_result r;
    osp_status st = osp_convert(pos[0], pos[1], &o, &r);
    if (pr.tty && pr.last > 0) fputc('\n', stderr);
    if (st != OSP_OK) return osp_cli_fail("convert");
    printf("wrote %s: %lld tensors (%lld modules quantized%s), %d shard%s, %.1f MB in %.1f s\n", pos[1],
           (long long)r.n_tensors, (long long)r.n_quantized,
           o.quantize ? "" : ": dtype conversion only", r.n_shards, r.n_shards == 1 ? "" : "s", r.bytes / 1e6,
           osp_now_s() - t0);
    return 0;
}
