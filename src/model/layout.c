/* model/layout: describing tensors for the architectures' layout walks. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include "layout.h"

static osp_status visit_one(osp_tvisit v, void *ctx, osp_tdesc *d, const char *fmt, va_list ap) {
    int n = vsnprintf(d->name, sizeof d->name, fmt, ap);
    if (n < 0 || (size_t)n >= sizeof d->name) return osp_err(OSP_ERR_FORMAT, "tensor name too long: %.60s...", d->name);
    return v(ctx, d);
}

osp_status osp_tlinear(osp_tvisit v, void *ctx, osp_weight *dst, int64_t rows, int64_t cols, int flags,
                       const char *fmt, ...) {
    osp_tdesc d = {.kind = OSP_T_LINEAR, .rows = rows, .cols = cols, .flags = flags, .w = dst};
    va_list ap;
    va_start(ap, fmt);
    osp_status rc = visit_one(v, ctx, &d, fmt, ap);
    va_end(ap);
    return rc;
}

osp_status osp_tvec(osp_tvisit v, void *ctx, osp_vec *dst, int64_t n, int flags, const char *fmt, ...) {
    osp_tdesc d = {.kind = OSP_T_VEC, .rows = n, .flags = flags, .vec = dst};
    va_list ap;
    va_start(ap, fmt);
    osp_status rc = visit_one(v, ctx, &d, fmt, ap);
    va_end(ap);
    return rc;
}

osp_status osp_tscalar(osp_tvisit v, void *ctx, float *dst, int flags, const char *fmt, ...) {
    osp_tdesc d = {.kind = OSP_T_VEC, .rows = 1, .flags = flags, .scalar = dst};
    va_list ap;
    va_start(ap, fmt);
    osp_status rc = visit_one(v, ctx, &d, fmt, ap);
    va_end(ap);
    return rc;
}

osp_status osp_texperts(osp_tvisit v, void *ctx, osp_weight **gate, osp_weight **up, osp_weight **down,
                        int64_t n_exp, int64_t n_used, int64_t inter, int64_t hidden, const char *fmt, ...) {
    osp_tdesc d = {.kind = OSP_T_EXPERTS, .rows = inter, .cols = hidden, .n_exp = n_exp, .n_used = n_used,
                   .gate = gate, .up = up, .down = down};
    va_list ap;
    va_start(ap, fmt);
    osp_status rc = visit_one(v, ctx, &d, fmt, ap);
    va_end(ap);
    return rc;
}
