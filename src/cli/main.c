#include <stdio.h>
#include <string.h>
#include "cli.h"
#include "core/core.h"

static const char *USAGE =
    "usage: osprey <command> [options]\n"
    "\n"
    "commands:\n"
    "  inspect MODEL                 architecture, parameters, dtypes, weight and KV bytes\n"
    "  logits --model M --input IN.safetensors --output OUT.safetensors [--mode prefill|decode|chunk:N]\n"
    "                                logits at every position (parity checks)\n"
    "  generate [--model M] (--prompt TEXT [--chat] [--system S] | --ids 1,2,3) [-n N] [--temp T] [--top-p P]\n"
    "           [--top-k K] [--min-p P] [--seed S] [--stop STR]   stream a completion (--ids: print token ids)\n"
    "  serve [MODEL] [--host H] [--port P] [-c CTX] [--api-key K] ...   OpenAI-compatible HTTP server\n"
    "                                (osprey serve --help lists the flags)\n"
    "  chat [--model M] [--system S]   interactive chat through the model's template (/reset, /quit)\n"
    "  convert IN OUT [-q] [--q-bits N] [--q-group-size G] [--dtype bf16|f16|f32]\n"
    "                                a model folder cast or quantized to MLX affine (mlx_lm.convert's flags)\n"
    "  synth --preset NAME --dtype bf16|q4|q8 --out DIR   random-weight checkpoint\n"
    "  bench --model M [-p 512] [-n 128] [-t THREADS] [--json]   prefill/decode speed vs memory bandwidth\n"
    "  tokenize --model M (--text TEXT | --file FILE) [--add-special]   token ids as a JSON array\n"
    "  detokenize --model M --ids 1,2,3   text of token ids\n"
    "  embed --model M (--input TEXT | -f FILE) [--dimensions N]   embeddings as JSON lines\n"
    "  rerank --model M --query Q DOC...   relevance scores as JSON lines, the most relevant first\n"
    "  template --model M --messages FILE.json [--tools FILE.json] [--add-generation-prompt] [--var NAME=JSON]\n"
    "                                the model's chat template rendered\n"
    "  mel FILE [--n-mels 80|128] --output OUT.safetensors   Whisper's log-mel spectrogram (first 30 s)\n"
    "  transcribe FILE... --model WHISPER [--language L] [--task translate] [-f txt|json|verbose_json|srt|vtt]\n"
    "                                speech to text (osprey transcribe --help lists the flags)\n"
    "\n"
    "Without --model, serve/generate/chat/bench use the bundled model (models/fortune).\n"
    "MODEL is a Hugging Face model folder (config.json + safetensors) or a cache repo folder (models--ORG--NAME).\n";

int osp_cli_fail(const char *cmd) {
    fprintf(stderr, "osprey %s: %s\n", cmd, osp_last_error()[0] ? osp_last_error() : "failed");
    return 1;
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
        fputs(USAGE, argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "--version")) {
        puts("osprey 0.1.0");
        return 0;
    }
    static const struct { const char *name; int (*fn)(int, char **); } CMDS[] = {
        {"inspect", osp_cmd_inspect}, {"logits", osp_cmd_logits}, {"generate", osp_cmd_generate},
        {"synth", osp_cmd_synth},     {"bench", osp_cmd_bench},       {"tokenize", osp_cmd_tokenize},
        {"detokenize", osp_cmd_detokenize}, {"template", osp_cmd_template}, {"chat", osp_cmd_chat},
        {"serve", osp_cmd_serve},     {"convert", osp_cmd_convert},   {"mel", osp_cmd_mel},
        {"transcribe", osp_cmd_transcribe}, {"maskbench", osp_cmd_maskbench}, {"embed", osp_cmd_embed},
        {"rerank", osp_cmd_rerank},
    };
    for (size_t i = 0; i < sizeof CMDS / sizeof *CMDS; i++)
        if (!strcmp(cmd, CMDS[i].name)) return CMDS[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "osprey: unknown command '%s'\n\n%s", cmd, USAGE);
    return 2;
}
