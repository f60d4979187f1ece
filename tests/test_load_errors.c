/* Loading refuses bad checkpoints with a status and a message that names
 * the problem (and the file/tensor), never a crash; and loads the valid
 * layouts: shards with an index, Hugging Face cache repo folders. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "model/safetensors.h"
#include "model/st_write.h"
#include "golden.h"
#include "osprey.h"

static char tmpdir[256];

static void write_bytes(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, n, f), n);
    fclose(f);
}

/* A safetensors file whose header is `json` followed by `data_len` bytes. */
static void write_st(const char *path, const char *json, size_t data_len) {
    size_t hl = strlen(json);
    unsigned char *buf = calloc(1, 8 + hl + data_len);
    for (int i = 0; i < 8; i++) buf[i] = (unsigned char)((uint64_t)hl >> (8 * i));
    memcpy(buf + 8, json, hl);
    write_bytes(path, buf, 8 + hl + data_len);
    free(buf);
}

static void expect_st_error(const char *json, size_t data_len, osp_status want, const char *needle) {
    char path[512];
    snprintf(path, sizeof path, "%s/bad.safetensors", tmpdir);
    write_st(path, json, data_len);
    osp_st *st = NULL;
    osp_status rc = osp_st_open_file(path, &st);
    assert_null(st);
    if (rc != want || !strstr(osp_last_error(), needle))
        fail_msg("header %s: got status %d '%s', want %d containing '%s'", json, rc, osp_last_error(), want, needle);
    assert_non_null(strstr(osp_last_error(), "bad.safetensors")); /* names the file */
}

static void test_bad_headers(void **state) {
    (void)state;
    expect_st_error("{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,8]}}", 16, OSP_ERR_FORMAT, "'w'");
    expect_st_error("{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 8, OSP_ERR_FORMAT, "past the end");
    expect_st_error("{\"w\":{\"dtype\":\"Q7\",\"shape\":[2],\"data_offsets\":[0,2]}}", 2, OSP_ERR_UNSUPPORTED, "unknown dtype 'Q7'");
    expect_st_error("{\"w\":{\"dtype\":\"F8_E4M3\",\"shape\":[2],\"data_offsets\":[0,2]}}", 2, OSP_ERR_UNSUPPORTED, "F8_E4M3");
    expect_st_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                    "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12, OSP_ERR_FORMAT, "overlap");
    expect_st_error("{\"w\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4, OSP_ERR_FORMAT, "bad shape");
    expect_st_error("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,4]}}", 8, OSP_ERR_FORMAT, "data_offsets");
    expect_st_error("{\"w\":{\"dtype\":\"F32\",\"shape\":[1]", 4, OSP_ERR_FORMAT, "not valid JSON");
    expect_st_error("[1,2]", 0, OSP_ERR_FORMAT, "not a JSON object");
    expect_st_error("{\"w\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4294967296],\"data_offsets\":[0,4]}}",
                    4, OSP_ERR_FORMAT, "'w'");
    /* header length larger than the file */
    char path[512];
    snprintf(path, sizeof path, "%s/bad.safetensors", tmpdir);
    unsigned char b[16] = {0xff, 0xff, 0, 0, 0, 0, 0, 0, '{', '}'};
    write_bytes(path, b, 10);
    osp_st *st;
    assert_int_equal(osp_st_open_file(path, &st), OSP_ERR_FORMAT);
    assert_non_null(strstr(osp_last_error(), "runs past the end"));
    write_bytes(path, b, 3);
    assert_int_equal(osp_st_open_file(path, &st), OSP_ERR_FORMAT);
}

/* Copy a golden model folder with config.json replaced by `cfg` (or kept
 * when NULL) and model.safetensors truncated to `trunc` bytes (0 = whole). */
static void make_model(const char *dst, const char *src, const char *cfg, long trunc) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s' && cp '%s'/config.json '%s'/model.safetensors '%s'/",
             dst, dst, src, src, dst);
    assert_int_equal(system(cmd), 0);
    if (cfg) {
        snprintf(cmd, sizeof cmd, "%s/config.json", dst);
        write_bytes(cmd, cfg, strlen(cfg));
    }
    if (trunc) {
        snprintf(cmd, sizeof cmd, "%s/model.safetensors", dst);
        assert_int_equal(truncate(cmd, trunc), 0);
    }
}

static void expect_load_error(const char *dir, osp_status want, const char *needle) {
    osp_model *m = NULL;
    osp_status rc = osp_model_load(dir, &m);
    assert_null(m);
    if (rc != want || !strstr(osp_last_error(), needle))
        fail_msg("%s: got %d '%s', want %d containing '%s'", dir, rc, osp_last_error(), want, needle);
}

static const char *LLAMA_CFG =
    "{\"architectures\":[\"%s\"],\"model_type\":\"llama\",\"hidden_size\":64,\"intermediate_size\":128,"
    "\"num_hidden_layers\":3,\"num_attention_heads\":4,\"num_key_value_heads\":2,\"head_dim\":16,"
    "\"vocab_size\":512,\"hidden_act\":\"%s\",\"rope_parameters\":{\"rope_type\":\"%s\",\"rope_theta\":10000.0}}";

static void test_bad_models(void **state) {
    (void)state;
    char dir[512], cfg[1024];
    snprintf(dir, sizeof dir, "%s/m", tmpdir);
    snprintf(cfg, sizeof cfg, LLAMA_CFG, "FooForCausalLM", "silu", "default");
    make_model(dir, "data/goldens/llama3", cfg, 0);
    expect_load_error(dir, OSP_ERR_UNSUPPORTED, "architecture 'FooForCausalLM'");
    snprintf(cfg, sizeof cfg, LLAMA_CFG, "LlamaForCausalLM", "relu6", "default");
    make_model(dir, "data/goldens/llama3", cfg, 0);
    expect_load_error(dir, OSP_ERR_UNSUPPORTED, "activation 'relu6'");
    snprintf(cfg, sizeof cfg, LLAMA_CFG, "LlamaForCausalLM", "silu", "yarn2");
    make_model(dir, "data/goldens/llama3", cfg, 0);
    expect_load_error(dir, OSP_ERR_UNSUPPORTED, "rope type 'yarn2'");
    make_model(dir, "data/goldens/llama3", "{not json", 0);
    expect_load_error(dir, OSP_ERR_FORMAT, "config.json");
    make_model(dir, "data/goldens/llama3", NULL, 200000);
    expect_load_error(dir, OSP_ERR_FORMAT, "past the end");
    /* a config that wants more layers than the file has: a missing tensor */
    snprintf(cfg, sizeof cfg, LLAMA_CFG, "LlamaForCausalLM", "silu", "default");
    char *four = strstr(cfg, "\"num_hidden_layers\":3");
    four[strlen("\"num_hidden_layers\":")] = '4';
    make_model(dir, "data/goldens/llama3", cfg, 0);
    expect_load_error(dir, OSP_ERR_FORMAT, "'model.layers.3.self_attn.q_proj.weight' is missing");
    /* a config asking for absurdly many layers: an error before per-layer tables are allocated */
    snprintf(cfg, sizeof cfg, LLAMA_CFG, "LlamaForCausalLM", "silu", "default");
    char *nl = strstr(cfg, "\"num_hidden_layers\":3,");
    memmove(nl + strlen("\"num_hidden_layers\":393216000"), nl + strlen("\"num_hidden_layers\":3"),
            strlen(nl + strlen("\"num_hidden_layers\":3")) + 1);
    memcpy(nl, "\"num_hidden_layers\":393216000", strlen("\"num_hidden_layers\":393216000"));
    make_model(dir, "data/goldens/llama3", cfg, 0);
    expect_load_error(dir, OSP_ERR_FORMAT, "num_hidden_layers 393216000 is more than");
    /* wrong shape: hidden 32 against 64-wide tensors */
    snprintf(cfg, sizeof cfg, LLAMA_CFG, "LlamaForCausalLM", "silu", "default");
    char *h = strstr(cfg, "\"hidden_size\":64");
    memcpy(h + strlen("\"hidden_size\":"), "32", 2);
    make_model(dir, "data/goldens/llama3", cfg, 0);
    expect_load_error(dir, OSP_ERR_FORMAT, "expected");
    expect_load_error("/nonexistent/model", OSP_ERR_IO, "no such model folder");
}

typedef struct copy_ctx { const osp_st *src; const char **names; } copy_ctx;

/* Split the qwen3 golden into two shards with an index, wrap it in a
 * Hugging Face cache layout, and check it computes the same logits. */
static void test_shards_and_cache_layout(void **state) {
    (void)state;
    osp_st *src;
    assert_int_equal(osp_st_open_file("data/goldens/qwen3/model.safetensors", &src), OSP_OK);
    char snap[512], path[600], cmd[4096];
    snprintf(snap, sizeof snap, "%s/models--test--qwen3/snapshots/abc123", tmpdir);
    snprintf(cmd, sizeof cmd, "rm -rf '%s/models--test--qwen3' && mkdir -p '%s' '%s/models--test--qwen3/refs' && "
             "cp data/goldens/qwen3/config.json '%s/' && printf abc123 > '%s/models--test--qwen3/refs/main'",
             tmpdir, snap, tmpdir, snap, tmpdir);
    assert_int_equal(system(cmd), 0);
    osp_st_writer *w[2] = {osp_st_writer_new(), osp_st_writer_new()};
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", snap);
    FILE *idx = fopen(path, "w");
    fprintf(idx, "{\"metadata\":{},\"weight_map\":{");
    for (int i = 0; i < src->n_tensors; i++) {
        const osp_st_tensor *t = &src->tensors[i];
        int s = i % 2;
        assert_int_equal(osp_st_writer_add(w[s], t->name, t->dtype, t->ndim, t->shape, t->data, t->nbytes), OSP_OK);
        fprintf(idx, "%s\"%s\":\"model-%05d-of-00002.safetensors\"", i ? "," : "", t->name, s + 1);
    }
    fprintf(idx, "}}");
    fclose(idx);
    for (int s = 0; s < 2; s++) {
        snprintf(path, sizeof path, "%s/model-%05d-of-00002.safetensors", snap, s + 1);
        assert_int_equal(osp_st_writer_write(w[s], path, NULL, NULL), OSP_OK);
        osp_st_writer_free(w[s]);
    }
    osp_st_close(src);

    osp_model *a, *b;
    snprintf(path, sizeof path, "%s/models--test--qwen3", tmpdir);
    if (osp_model_load(path, &b) != OSP_OK) fail_msg("cache layout: %s", osp_last_error());
    assert_int_equal(osp_model_load("data/goldens/qwen3", &a), OSP_OK);
    int32_t ids[6] = {1, 5, 9, 200, 7, 511};
    int32_t V = osp_model_get_info(a)->vocab;
    float *la = malloc(sizeof(float) * 6 * V), *lb = malloc(sizeof(float) * 6 * V);
    osp_session *sa, *sb;
    assert_int_equal(osp_session_new(a, 1, 16, &sa), OSP_OK);
    assert_int_equal(osp_session_new(b, 1, 16, &sb), OSP_OK);
    assert_int_equal(osp_forward(sa, ids, 6, 1, la), OSP_OK);
    assert_int_equal(osp_forward(sb, ids, 6, 1, lb), OSP_OK);
    assert_memory_equal(la, lb, sizeof(float) * 6 * V);
    /* out-of-range ids and context overflow are errors, not crashes */
    int32_t bad = V;
    assert_int_equal(osp_forward(sa, &bad, 1, 0, la), OSP_ERR_RANGE);
    assert_int_equal(osp_forward(sa, ids, 6, 0, la), OSP_OK);
    assert_int_equal(osp_forward(sa, ids, 6, 0, la), OSP_ERR_RANGE); /* 18 > 16 */
    osp_session_free(sa);
    osp_session_free(sb);
    free(la);
    free(lb);
    osp_model_free(a);
    osp_model_free(b);

    /* the index names a tensor its shard lacks */
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", snap);
    idx = fopen(path, "a");
    fclose(idx);
    snprintf(cmd, sizeof cmd, "sed -i 's/{\"metadata\":{},\"weight_map\":{/&\"ghost.weight\":\"model-00001-of-00002.safetensors\",/' '%s'", path);
    assert_int_equal(system(cmd), 0);
    expect_load_error(snap, OSP_ERR_FORMAT, "ghost.weight");
}

static int setup(void **state) {
    (void)state;
    return test_tmpdir_make(tmpdir, sizeof tmpdir, "test_load");
}

static int teardown(void **state) {
    (void)state;
    return test_tmpdir_remove(tmpdir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_headers),
        cmocka_unit_test(test_bad_models),
        cmocka_unit_test(test_shards_and_cache_layout),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
