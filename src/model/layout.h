/* model/layout: the tensors of a checkpoint, as an architecture lists them.
 *
 * Each architecture (arch.h) walks its tensors once in `layout`, calling a
 * visitor with a description of each: its Hugging Face name, kind and shape,
 * and (when a model is being loaded) where the bound weight goes. The loader
 * binds by walking it, `osprey synth` writes a checkpoint by walking it, and
 * `osprey inspect` reports what the loader bound: one list per
 * architecture, no second copy of the names anywhere. */
#ifndef OSP_LAYOUT_H
#define OSP_LAYOUT_H

#include <stdint.h>
#include "backend/backend.h"
#include "core/core.h"
#include "tensor/tensor.h"

struct osp_config;
struct osp_model;

typedef enum osp_tkind {
    OSP_T_LINEAR,  /* a matrix [rows, cols]: <name>.weight, or MLX codes + <name>.scales/.biases */
    OSP_T_VEC,     /* a float vector [rows] named <name> (norm weights, biases, scalars) */
    OSP_T_EXPERTS, /* n_exp gated-MLP experts under <name>: HF fused experts.gate_up_proj [E, 2I, H] +
                      experts.down_proj [E, H, I], or MLX experts.switch_glu.{gate,up,down}_proj */
} osp_tkind;

enum {
    OSP_TF_GATHERED = 1,  /* rows are gathered (an embedding table): not streamed per decode step */
    OSP_TF_OPTIONAL = 2,  /* a vector that may be absent (OSP_T_VEC) */
    OSP_TF_Q_IF_FITS = 4, /* synth: quantized only when its columns split into groups (mlx-lm's predicate) */
    OSP_TF_Q8_ROUTER = 8, /* synth: quantized 8-bit, group 64, as a per-module override (mlx-lm's Gemma 4 router) */
    OSP_TF_ZERO_MEAN = 16, /* synth: drawn around 0 (biases; norms applied as 1 + w), not around 1 (norms) */
};

typedef struct osp_tdesc {
    char name[192];        /* linears and experts: the module path (no ".weight"); vectors: the full name */
    osp_tkind kind;
    int64_t rows, cols;    /* linear: [rows, cols]; vector: [rows]; experts: each expert's gate is [rows, cols] */
    int64_t n_exp;         /* experts: how many (top_k of them are used per token: n_used) */
    int64_t n_used;
    int flags;             /* OSP_TF_* */
    /* where the loader puts it (NULL when only walking, as synth does) */
    osp_weight *w;         /* OSP_T_LINEAR */
    osp_vec *vec;          /* OSP_T_VEC */
    float *scalar;         /* OSP_T_VEC of one value kept as a host scalar (Gemma 4's layer_scalar) */
    osp_weight **gate, **up, **down; /* OSP_T_EXPERTS: arrays of n_exp, allocated by the loader */
} osp_tdesc;

typedef osp_status (*osp_tvisit)(void *ctx, const osp_tdesc *d);

/* Helpers for the architectures' layout functions: describe one tensor
 * (name from printf) and visit it. dst may be NULL (walking only). */
osp_status osp_tlinear(osp_tvisit v, void *ctx, osp_weight *dst, int64_t rows, int64_t cols, int flags,
                       const char *fmt, ...) __attribute__((format(printf, 7, 8)));
osp_status osp_tvec(osp_tvisit v, void *ctx, osp_vec *dst, int64_t n, int flags, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
osp_status osp_tscalar(osp_tvisit v, void *ctx, float *dst, int flags, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
osp_status osp_texperts(osp_tvisit v, void *ctx, osp_weight **gate, osp_weight **up, osp_weight **down,
                        int64_t n_exp, int64_t n_used, int64_t inter, int64_t hidden, const char *fmt, ...)
    __attribute__((format(printf, 10, 11)));

/* The names' prefixes: the text model's ("model.", "model.language_model.")
 * and the head's ("lm_head", "language_model.lm_head"). */
typedef struct osp_tnames {
    const char *prefix;
    const char *head;
} osp_tnames;

#endif
