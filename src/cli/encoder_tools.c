/* cli/encoder_tools: the encoders' presets of `osprey synth` (see encoder_tools.h). The real ones are the
 * published configs (sentence-transformers/all-MiniLM-L6-v2, BAAI/bge-m3) with their pooling; the tiny ones are
 * the tests' (tests/data/bert-tiny, xlmr-tiny, xlmr-reranker-tiny), sized to their hand-built tokenizers. */
#include "encoder_tools.h"
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

typedef struct enc_preset {
    const char *name, *json;
    const char *pooling; /* sentence-transformers' Pooling mode key, or NULL: a cross-encoder (no such files) */
} enc_preset;

static const enc_preset PRESETS[] = {
    {"all-minilm-l6-v2",
     "{\"architectures\": [\"BertModel\"], \"attention_probs_dropout_prob\": 0.1, \"hidden_act\": \"gelu\","
     " \"hidden_dropout_prob\": 0.1, \"hidden_size\": 384, \"initializer_range\": 0.02, \"intermediate_size\": 1536,"
     " \"layer_norm_eps\": 1e-12, \"max_position_embeddings\": 512, \"model_type\": \"bert\","
     " \"num_attention_heads\": 12, \"num_hidden_layers\": 6, \"pad_token_id\": 0,"
     " \"position_embedding_type\": \"absolute\", \"type_vocab_size\": 2, \"use_cache\": true, \"vocab_size\": 30522}",
     "pooling_mode_mean_tokens"},
    {"bge-m3",
     "{\"architectures\": [\"XLMRobertaModel\"], \"attention_probs_dropout_prob\": 0.1, \"bos_token_id\": 0,"
     " \"classifier_dropout\": null, \"eos_token_id\": 2, \"hidden_act\": \"gelu\", \"hidden_dropout_prob\": 0.1,"
     " \"hidden_size\": 1024, \"initializer_range\": 0.02, \"intermediate_size\": 4096, \"layer_norm_eps\": 1e-05,"
     " \"max_position_embeddings\": 8194, \"model_type\": \"xlm-roberta\", \"num_attention_heads\": 16,"
     " \"num_hidden_layers\": 24, \"output_past\": true, \"pad_token_id\": 1, \"position_embedding_type\": \"absolute\","
     " \"type_vocab_size\": 1, \"use_cache\": true, \"vocab_size\": 250002}",
     "pooling_mode_cls_token"},
    {"bert-tiny",
     "{\"architectures\": [\"BertModel\"], \"hidden_act\": \"gelu\", \"hidden_size\": 64, \"intermediate_size\": 128,"
     " \"layer_norm_eps\": 1e-12, \"max_position_embeddings\": 64, \"model_type\": \"bert\","
     " \"num_attention_heads\": 4, \"num_hidden_layers\": 2, \"pad_token_id\": 0,"
     " \"position_embedding_type\": \"absolute\", \"type_vocab_size\": 2, \"vocab_size\": 64}",
     "pooling_mode_mean_tokens"},
    {"xlmr-tiny",
     "{\"architectures\": [\"XLMRobertaModel\"], \"bos_token_id\": 0, \"eos_token_id\": 2, \"hidden_act\": \"gelu\","
     " \"hidden_size\": 64, \"intermediate_size\": 128, \"layer_norm_eps\": 1e-05, \"max_position_embeddings\": 66,"
     " \"model_type\": \"xlm-roberta\", \"num_attention_heads\": 4, \"num_hidden_layers\": 2, \"pad_token_id\": 1,"
     " \"position_embedding_type\": \"absolute\", \"type_vocab_size\": 1, \"vocab_size\": 64}",
     "pooling_mode_cls_token"},
    {"xlmr-reranker-tiny",
     "{\"architectures\": [\"XLMRobertaForSequenceClassification\"], \"bos_token_id\": 0, \"eos_token_id\": 2,"
     " \"hidden_act\": \"gelu\", \"hidden_size\": 64, \"id2label\": {\"0\": \"LABEL_0\"},"
     " \"label2id\": {\"LABEL_0\": 0}, \"intermediate_size\": 128, \"layer_norm_eps\": 1e-05,"
     " \"max_position_embeddings\": 66, \"model_type\": \"xlm-roberta\", \"num_attention_heads\": 4,"
     " \"num_hidden_layers\": 2, \"pad_token_id\": 1, \"position_embedding_type\": \"absolute\","
     " \"type_vocab_size\": 1, \"vocab_size\": 64}",
     NULL},
};

static const enc_preset *find(const char *name) {
    for (size_t i = 0; i < sizeof PRESETS / sizeof *PRESETS; i++)
        if (!strcmp(name, PRESETS[i].name)) return &PRESETS[i];
    return NULL;
}

json_t *osp_encoder_preset_config(const char *name) {
    const enc_preset *p = find(name);
    return p ? json_loads(p->json, 0, NULL) : NULL;
}

static osp_status dump(json_t *j, const char *dir, const char *name) {
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    osp_status st = !j ? osp_err(OSP_ERR_NOMEM, "out of memory")
                   : json_dump_file(j, path, JSON_INDENT(2)) ? osp_err(OSP_ERR_IO, "cannot write %s", path)
                                                            : OSP_OK;
    json_decref(j);
    return st;
}

osp_status osp_encoder_synth_files(const char *name, const char *dir) {
    const enc_preset *p = find(name);
    if (!p) return osp_err(OSP_ERR_INVALID, "no encoder preset '%s'", name);
    if (!p->pooling) return OSP_OK;
    json_t *cfg = osp_encoder_preset_config(name);
    int hidden = (int)json_integer_value(json_object_get(cfg, "hidden_size"));
    json_decref(cfg);
    json_t *mods = json_pack("[{s:i, s:s, s:s, s:s}, {s:i, s:s, s:s, s:s}, {s:i, s:s, s:s, s:s}]", "idx", 0, "name",
                             "0", "path", "", "type", "sentence_transformers.models.Transformer", "idx", 1, "name", "1",
                             "path", "1_Pooling", "type", "sentence_transformers.models.Pooling", "idx", 2, "name", "2",
                             "path", "2_Normalize", "type", "sentence_transformers.models.Normalize");
    OSP_TRY(dump(mods, dir, "modules.json"));
    char sub[4200];
    snprintf(sub, sizeof sub, "%s/1_Pooling", dir);
    if (mkdir(sub, 0755) != 0 && errno != EEXIST) return osp_err(OSP_ERR_IO, "cannot create %s: %s", sub, strerror(errno));
    static const char *const MODES[] = {"pooling_mode_cls_token", "pooling_mode_mean_tokens", "pooling_mode_max_tokens",
                                        "pooling_mode_mean_sqrt_len_tokens", "pooling_mode_weightedmean_tokens",
                                        "pooling_mode_lasttoken"};
    json_t *pool = json_pack("{s:i, s:b}", "word_embedding_dimension", hidden, "include_prompt", 1);
    for (size_t i = 0; pool && i < sizeof MODES / sizeof *MODES; i++)
        json_object_set_new(pool, MODES[i], json_boolean(!strcmp(MODES[i], p->pooling)));
    return dump(pool, dir, "1_Pooling/config.json");
}
