#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include "core.h"

static _Thread_local char err_buf[1024];

osp_status osp_err(osp_status st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err_buf, sizeof err_buf, fmt, ap);
    va_end(ap);
    return st;
}

void osp_err_clear(void) { err_buf[0] = 0; }

const char *osp_last_error(void) { return err_buf; }

const char *osp_status_name(osp_status s) {
    switch (s) {
    case OSP_OK: return "ok";
    case OSP_ERR_IO: return "io error";
    case OSP_ERR_FORMAT: return "format error";
    case OSP_ERR_UNSUPPORTED: return "unsupported";
    case OSP_ERR_INVALID: return "invalid argument";
    case OSP_ERR_NOMEM: return "out of memory";
    case OSP_ERR_RANGE: return "out of range";
    case OSP_ERR_INTERNAL: return "internal error";
    }
    return "unknown status";
}

void osp_assert_fail(const char *cond, const char *file, int line) {
    fprintf(stderr, "osprey: assertion failed: %s (%s:%d)\n", cond, file, line);
    abort();
}
