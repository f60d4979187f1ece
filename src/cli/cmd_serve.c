/* osprey serve: flags (mlx_lm.server and llama-server spellings) → osp_serve. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include "cli.h"
#include "osprey.h"
#include "server/server.h"

static int usage(FILE *f) {
    fprintf(f,
            "usage: osprey serve [MODEL] [flags]\n"
            "  An OpenAI-compatible HTTP server (POST /v1/chat/completions, /v1/completions,\n"
            "  /tokenize, /detokenize, /apply-template; GET /v1/models, /health).\n"
            "  With no MODEL it serves the bundled model (models/fortune), unless --audio-model is given alone.\n"
            "\n"
            "  --model, -m MODEL        model folder (or Hugging Face cache repo folder)\n"
            "  --host HOST              address to listen on (default 127.0.0.1)\n"
            "  --port PORT              port (default 8080; 0 picks a free one)\n"
            "  -c, --ctx-size N         context per request in tokens (default: the model's, at most 8192)\n"
            "  -t, --threads N          compute threads (default: all cores)\n"
            "  --device cpu|cuda|auto   where the model runs (default auto: the GPU when one is present)\n"
            "  -ngl, --n-gpu-layers N   llama-server's spelling: N > 0 = cuda, 0 = cpu\n"
            "  --max-tokens N           default max_tokens of a request (default 512)\n"
            "  --temp T                 default temperature (default: generation_config.json, else 0)\n"
            "  --top-p P, --top-k K, --min-p P   default filters\n"
            "  --chat-template FILE     a Jinja chat template replacing the model's\n"
            "  --allowed-origins LIST   CORS origins, comma-separated; '*' = any (default), '' = none\n"
            "  --api-key KEY            require 'Authorization: Bearer KEY' (except /health)\n"
            "  --max-body BYTES         request body limit (default 8388608); larger bodies get a 413\n"
            "  --audio-model M          a Whisper model folder for POST /v1/audio/transcriptions and /translations;\n"
            "                           without --model the server transcribes only (no chat model is loaded)\n"
            "  --audio-tokenizer PATH   its tokenizer.json or .tiktoken rank file, when the folder has none\n"
            "  --embedding-model M      a model for POST /v1/embeddings (beside MODEL, or alone; docs/EMBEDDINGS.md)\n"
            "  --rerank-model M         a reranker for POST /v1/rerank (beside MODEL, or alone; docs/EMBEDDINGS.md)\n"
            "  --max-audio-body BYTES   upload limit of the audio routes (default 26214400)\n"
            "  --responses-store-size BYTES  stored /v1/responses kept for GET and previous_response_id\n"
            "                           (default 67108864; 0 = none stored); written beside the prefix cache's files\n"
            "  --responses-store-ttl S  seconds a stored response is kept (default 2592000, 30 days)\n"
            "  --log-level LEVEL        ERROR, WARNING, INFO or DEBUG (default WARNING)\n"
            "  -np, --parallel N        requests decoded together (continuous batching; default 4;\n"
            "                           alias --decode-concurrency)\n"
            "  --prefill-step-size N    prompt tokens per prefill chunk, interleaved with decode steps (default 512)\n"
            "  --kv-budget BYTES        KV cache memory for all requests (suffix K, M, G); requests wait in the\n"
            "                           queue while it is full (default: all rows at full context, at most 3/4 of\n"
            "                           available memory)\n"
            "  --kv-bits 4|8|16|32      KV cache precision: 4 or 8 = MLX affine-quantized, 16 = bf16, 32 = f32.\n"
            "                           Default: the model's kv_config.json if it has one, else f32\n"
            "  --kv-group-size N        KV quantization group along head_dim: 32, 64 (default) or 128\n"
            "  -ctk, -ctv TYPE          llama-server spellings: q4_0 = --kv-bits 4, q8_0 = 8, f16/bf16 = 16, f32 = 32\n"
            "  --timeout S              a connection must send its request head within S seconds of connecting\n"
            "                           (or of its previous response; then an idle one is closed) (default 10)\n"
            "  --body-timeout S         a request body must arrive within S seconds of its head (default 60; 0 = none)\n"
            "  --write-timeout S        a client that reads nothing of its response for S seconds is disconnected\n"
            "                           and its request cancelled (default 60)\n"
            "  --max-connections N      connections held at once (reading a request or being answered); at the limit\n"
            "                           the one that has waited longest for its request is closed (503) to make\n"
            "                           room, and when all are being answered a new one gets a 503 (default 1024)\n"
            "  --max-connections-per-client N   connections from one address (default 0 = no cap)\n"
            "  --drain-timeout S        after SIGINT/SIGTERM, finish the queued and running requests for at most S\n"
            "                           seconds in all, then cut what is left (an error event or a 503) and exit 1\n"
            "                           (default 0 = deliver everything)\n"
            "  --prompt-cache-size GiB  the prefix cache's memory (KV of earlier prompts and replies, reused by a\n"
            "                           prompt that starts with one), inside the KV budget (default 2; 0 = off;\n"
            "                           alias --prompt-cache)\n"
            "  --prompt-cache-dir DIR   where entries go when they leave memory and at shutdown, found again after a\n"
            "                           restart (default $XDG_CACHE_HOME/osprey, else ~/.cache/osprey)\n"
            "  --prompt-cache-disk GiB  that folder's bound, least recently used files deleted first (default 10;\n"
            "                           0 = memory only)\n"
            "  --draft-model M (-md)    speculative decoding with a draft model sharing the tokenizer, for every\n"
            "                           request (\"speculative\": false opts out); greedy output is unchanged bitwise\n"
            "  --spec-ngram             speculative decoding with n-gram lookup in prompt + output (no second model)\n"
            "  --num-draft-tokens K     tokens drafted per round, at most (default 4; alias --draft-max);\n"
            "                           --draft-min K the fewest (default 1); the count adapts to the acceptance\n"
            "  --spec-batch-tokens N    most tokens one verification pass computes for all rows (default: 64 where\n"
            "                           bf16 weights run on AMX tiles, else 8; 0 = no\n"
            "                           cap): a fuller batch drafts fewer tokens a row, none from N rows on (past it\n"
            "                           the pass is compute-bound and checking drafts costs more than it saves)\n"
            "  --strict-model-name      refuse (404) a request whose 'model' is not the served model's name\n"
            "                           (default: any name is answered by the served model, which the response names)\n"
            "\n"
            "  SIGINT / SIGTERM: /health turns 503 and new requests are refused; the queued and running ones finish\n"
            "  and are delivered, then it exits; a second signal exits at once.\n");
    return f == stdout ? 0 : 2;
}

static int log_level_of(const char *v) {
    if (!strcasecmp(v, "error") || !strcasecmp(v, "critical")) return 0;
    if (!strcasecmp(v, "warning") || !strcasecmp(v, "warn")) return 1;
    if (!strcasecmp(v, "info")) return 2;
    if (!strcasecmp(v, "debug")) return 3;
    return -1;
}

/* llama-server cache types onto our bits; -1 when unknown. */
static int cache_type_bits(const char *v) {
    if (!strcasecmp(v, "q4_0") || !strcasecmp(v, "q4_1")) return 4;
    if (!strcasecmp(v, "q8_0")) return 8;
    if (!strcasecmp(v, "f16") || !strcasecmp(v, "bf16")) return 16; /* stored as bf16 */
    if (!strcasecmp(v, "f32")) return 0;
    return -1;
}

static int bytes_arg(const char *v, long long *out) {
    char *end;
    double d = strtod(v, &end);
    double mul = 1;
    if (*end == 'k' || *end == 'K') mul = 1024.0, end++;
    else if (*end == 'm' || *end == 'M') mul = 1048576.0, end++;
    else if (*end == 'g' || *end == 'G') mul = 1073741824.0, end++;
    if (*end == 'i' || *end == 'B' || *end == 'b') end++;
    if (*end == 'B') end++;
    if (!*v || *end || !(d > 0) || d * mul > 9e18) {
        fprintf(stderr, "osprey serve: --kv-budget expects bytes (e.g. 2G, 512M), got '%s'\n", v);
        return -1;
    }
    *out = (long long)(d * mul);
    return 0;
}

static int num_arg(const char *flag, const char *v, double lo, double hi, double *out) {
    char *end;
    double d = strtod(v, &end);
    if (!*v || *end || !(d >= lo && d <= hi)) {
        fprintf(stderr, "osprey serve: %s expects a number in [%g, %g], got '%s'\n", flag, lo, hi, v);
        return -1;
    }
    *out = d;
    return 0;
}

int osp_cmd_serve(int argc, char **argv) {
    osp_serve_config c;
    osp_serve_config_defaults(&c);
    int threads = 0, ctk_seen = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        double d;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) return usage(stdout);
        if (!strcmp(a, "--spec-ngram")) {
            c.spec_ngram = 1;
            continue;
        }
        if (!strcmp(a, "--strict-model-name")) {
            c.strict_model = 1;
            continue;
        }
        if (a[0] != '-') {
            if (c.model) return usage(stderr);
            c.model = a;
            continue;
        }
        if (!v) {
            fprintf(stderr, "osprey serve: unknown flag or missing value: %s\n", a);
            return usage(stderr);
        }
        i++;
#define IS(x) (!strcmp(a, x))
#define NUM(lo, hi) (num_arg(a, v, lo, hi, &d) ? 2 : 0)
        if (IS("--model") || IS("-m")) c.model = v;
        else if (IS("--host")) c.host = v;
        else if (IS("--port")) { if (NUM(0, 65535)) return 2; c.port = (int)d; }
        else if (IS("-c") || IS("--ctx-size")) { if (NUM(0, 1 << 24)) return 2; c.ctx = (int)d; }
        else if (IS("-t") || IS("--threads")) { if (NUM(0, 4096)) return 2; threads = (int)d; }
        else if (IS("--device") || IS("-ngl") || IS("--n-gpu-layers") || IS("--gpu-layers")) {
            if (osp_cli_device_flag("serve", a, v, &c.device) < 0) return 2;
        }
        else if (IS("--max-tokens") || IS("-n") || IS("--n-predict")) { if (NUM(1, 1 << 30)) return 2; c.max_tokens = (int)d; }
        else if (IS("--temp") || IS("--temperature")) { if (NUM(0, 1e6)) return 2; c.temp = (float)d; }
        else if (IS("--top-p")) { if (NUM(0, 1)) return 2; c.top_p = (float)d; }
        else if (IS("--top-k")) { if (NUM(0, 1 << 30)) return 2; c.top_k = (int)d; }
        else if (IS("--min-p")) { if (NUM(0, 1)) return 2; c.min_p = (float)d; }
        else if (IS("--chat-template")) c.chat_template = v;
        else if (IS("--allowed-origins")) c.allowed_origins = v;
        else if (IS("--api-key")) c.api_key = v;
        else if (IS("--max-body")) { if (NUM(1024, 1ull << 32)) return 2; c.max_body = (size_t)d; }
        else if (IS("--audio-model")) c.audio_model = v;
        else if (IS("--audio-tokenizer")) c.audio_tokenizer = v;
        else if (IS("--embedding-model")) c.embedding_model = v;
        else if (IS("--rerank-model")) c.rerank_model = v;
        else if (IS("--max-audio-body")) { if (NUM(1024, 1ull << 32)) return 2; c.max_audio_body = (size_t)d; }
        else if (IS("--responses-store-size")) { if (NUM(0, 1ull << 40)) return 2; c.responses_store = (size_t)d; }
        else if (IS("--responses-store-ttl")) { if (NUM(1, 1e10)) return 2; c.responses_ttl = d; }
        else if (IS("-np") || IS("--parallel") || IS("--decode-concurrency")) { if (NUM(1, 256)) return 2; c.parallel = (int)d; }
        else if (IS("--prefill-step-size") || IS("-ub") || IS("--ubatch-size")) { if (NUM(1, 1 << 16)) return 2; c.prefill_step = (int)d; }
        else if (IS("--kv-budget")) { if (bytes_arg(v, &c.kv_budget)) return 2; }
        else if (IS("--timeout") || IS("-to")) { if (NUM(0.1, 86400)) return 2; c.timeout = d; }
        else if (IS("--body-timeout")) { if (NUM(0, 86400)) return 2; c.body_timeout = d; }
        else if (IS("--write-timeout")) { if (NUM(0.1, 86400)) return 2; c.write_timeout = d; }
        else if (IS("--max-connections")) { if (NUM(8, 1 << 20)) return 2; c.max_connections = (int)d; }
        else if (IS("--max-connections-per-client")) { if (NUM(0, 1 << 20)) return 2; c.max_per_client = (int)d; }
        else if (IS("--prompt-cache-size") || IS("--prompt-cache")) { if (NUM(0, 1 << 20)) return 2; c.prompt_cache_gib = d; }
        else if (IS("--prompt-cache-disk")) { if (NUM(0, 1 << 24)) return 2; c.prompt_cache_disk_gib = d; }
        else if (IS("--prompt-cache-dir")) c.prompt_cache_dir = v;
        else if (IS("--draft-model") || IS("-md") || IS("--model-draft")) c.draft_model = v;
        else if (IS("--num-draft-tokens") || IS("--draft-max") || IS("--draft")) { if (NUM(1, 64)) return 2; c.draft_max = (int)d; }
        else if (IS("--draft-min")) { if (NUM(1, 64)) return 2; c.draft_min = (int)d; }
        else if (IS("--spec-batch-tokens")) { if (NUM(0, 1 << 16)) return 2; c.spec_batch_tokens = (int)d; }
        else if (IS("--drain-timeout")) { if (NUM(0, 1e7)) return 2; c.drain_timeout = d; }
        else if (IS("--kv-bits")) {
            if (NUM(0, 32) || (d != 4 && d != 8 && d != 16 && d != 32 && d != 0)) {
                fprintf(stderr, "osprey serve: --kv-bits is 4, 8, 16 (bf16) or 32 (f32)\n");
                return 2;
            }
            c.kv_bits = d == 32 ? 0 : (int)d;
        }
        else if (IS("--kv-group-size")) {
            if (NUM(32, 128) || (d != 32 && d != 64 && d != 128)) {
                fprintf(stderr, "osprey serve: --kv-group-size is 32, 64 or 128\n");
                return 2;
            }
            c.kv_group = (int)d;
        }
        else if (IS("-ctk") || IS("-ctv") || IS("--cache-type-k") || IS("--cache-type-v")) {
            int b = cache_type_bits(v);
            if (b < 0) {
                fprintf(stderr, "osprey serve: %s is one of q4_0, q8_0, f16, bf16, f32\n", a);
                return 2;
            }
            if (c.kv_bits >= 0 && c.kv_bits != b && ctk_seen) {
                fprintf(stderr, "osprey serve: K and V are quantized alike: -ctk and -ctv must agree\n");
                return 2;
            }
            ctk_seen = 1;
            c.kv_bits = b;
        }
        else if (IS("--log-level")) {
            if ((c.log_level = log_level_of(v)) < 0) {
                fprintf(stderr, "osprey serve: --log-level is one of ERROR, WARNING, INFO, DEBUG\n");
                return 2;
            }
        } else {
            fprintf(stderr, "osprey serve: unknown flag %s\n", a);
            return usage(stderr);
        }
#undef IS
#undef NUM
    }
    if (!c.model && !c.audio_model && !c.embedding_model && !c.rerank_model) /* with --audio-model or --embedding-model alone: only those */
        c.model = osp_cli_default_model();
    if (!c.model && !c.audio_model && !c.embedding_model && !c.rerank_model) {
        fprintf(stderr, "osprey serve: no model given and the bundled model was not found\n");
        return 2;
    }
    c.threads = threads;
    return osp_serve(&c);
}
