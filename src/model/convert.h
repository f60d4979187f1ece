/* model/convert: a Hugging Face model folder → an MLX-layout folder
 * (`osprey convert`, mlx_lm.convert's job).
 *
 * What is written to OUT:
 *   - the weights, every float tensor cast to the target dtype; with
 *     quantize, each Linear/Embedding of the architecture's layout
 *     (model/layout.h) whose input width is a multiple of the group size
 *     (mlx_lm's default predicate) becomes MLX affine codes:
 *       <m>.weight U32 [.., out, in·bits/32], <m>.scales and <m>.biases
 *       [.., out, in/group] in the target dtype,
 *     the codes, scales and biases being mx.quantize's (tensor/quant.h: f32
 *     scale and bias from the values as cast to the target dtype, codes
 *     from the unrounded f32 scale and bias, scale and bias then stored in
 *     the target dtype). Gemma 4's router.proj is 8-bit, group 64, written
 *     as a per-module override (mlx_lm's Gemma 4 predicate); HF fused
 *     experts (experts.gate_up_proj, experts.down_proj) become MLX's
 *     experts.switch_glu.{gate,up,down}_proj;
 *   - model.safetensors, or model-0000i-of-0000N.safetensors shards of at
 *     most shard_bytes each (mlx_lm's 5 GiB), and model.safetensors.index.json
 *     (metadata total_size, total_parameters; weight_map sorted by name)
 *     either way, as mlx_lm writes them; metadata {"format": "mlx"};
 *   - config.json with "quantization": {"group_size", "bits", overrides...}
 *     and its mirror "quantization_config" (when quantizing), the dtype
 *     keys set to the target dtype, "_name_or_path" dropped;
 *   - the tokenizer, chat template and generation config files, copied.
 *
 * Everything is written under a temporary sibling folder (OUT.tmp-XXXXXX),
 * renamed to OUT once complete, and removed on failure: a failed convert
 * leaves no folder that looks like a model. OUT must not exist, or be an
 * empty folder. An input that is already quantized is refused with
 * quantize (dequantizing first is not supported); without quantize its
 * codes are copied and its scales, biases and dense tensors cast.
 */
#ifndef OSP_CONVERT_H
#define OSP_CONVERT_H

#include <stdint.h>
#include "core/core.h"
#include "tensor/tensor.h"

/* Called once per output tensor before it is produced: tensor i of n
 * (from 0), done of total data bytes written so far. A nonzero return
 * cancels the convert (OSP_ERR_INVALID, "cancelled"; nothing is left). */
typedef int (*osp_convert_progress_fn)(void *ud, int64_t i, int64_t n, const char *name, uint64_t done,
                                        uint64_t total);

typedef struct osp_convert_opts {
    int quantize;              /* 1: MLX affine quantization; 0: dtype conversion only */
    int bits;                  /* 2, 3, 4, 5, 6 or 8 (0 = 4, mlx_lm's default) */
    int group;                 /* 32, 64 or 128 (0 = 64, mlx_lm's default) */
    int dtype;                 /* OSP_DT_BF16, OSP_DT_F16 or OSP_DT_F32; -1: config.json's torch_dtype or
                                  dtype (as mlx_lm), else each tensor keeps its own */
    uint64_t shard_bytes;      /* largest shard's data (0 = 5 GiB) */
    osp_convert_progress_fn progress; /* may be NULL */
    void *progress_ud;
} osp_convert_opts;

/* What a convert wrote (may be NULL). */
typedef struct osp_convert_result {
    int64_t n_tensors, n_quantized; /* tensors written; modules quantized */
    int n_shards;
    uint64_t bytes;                 /* tensor data written */
} osp_convert_result;

/* Parse "bf16"/"bfloat16", "f16"/"float16", "f32"/"float32" into *dtype;
 * OSP_ERR_INVALID with a message otherwise. */
osp_status osp_convert_parse_dtype(const char *s, int *dtype);

osp_status osp_convert(const char *in, const char *out, const osp_convert_opts *opts, osp_convert_result *res);

#endif
