/* core/: status and error messages, the counting allocator, small helpers.
 *
 * Errors: library code sets a thread-local message with osp_err() and
 * returns its status; callers propagate. Nothing here calls exit().
 */
#ifndef OSP_CORE_H
#define OSP_CORE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include "osprey.h"

/* Record a formatted error message for this thread and return `st`. */
osp_status osp_err(osp_status st, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void osp_err_clear(void);

/* Propagate a failing status. */
#define OSP_TRY(expr)                                                          \
    do {                                                                       \
        osp_status osp_try_st_ = (expr);                                       \
        if (osp_try_st_ != OSP_OK) return osp_try_st_;                         \
    } while (0)

/* Broken invariant (a bug, not bad input): report file and line, abort. */
#define OSP_ASSERT(c)                                                          \
    do {                                                                       \
        if (!(c)) osp_assert_fail(#c, __FILE__, __LINE__);                     \
    } while (0)
void osp_assert_fail(const char *cond, const char *file, int line)
    __attribute__((noreturn));

/* Counting allocator: every heap byte of the engine goes through these,
 * tagged by pool, so memory use can be reported honestly. Memory is
 * 64-byte aligned. */
typedef enum osp_pool {
    OSP_POOL_MISC = 0,
    OSP_POOL_WEIGHTS, /* aligned copies of weights, dequantized tables */
    OSP_POOL_KV,      /* KV cache */
    OSP_POOL_SCRATCH, /* activations */
    OSP_POOL_COUNT
} osp_pool;
void *osp_malloc(osp_pool pool, size_t n);
void *osp_calloc(osp_pool pool, size_t n);
/* A large block that streams at the full memory bandwidth: 2 MiB-aligned
 * and advised for transparent huge pages (fewer TLB misses when a kernel
 * reads hundreds of MB per token). Freed with osp_free. */
void *osp_malloc_huge(osp_pool pool, size_t n);
void osp_free(void *p);
size_t osp_pool_bytes(osp_pool pool);

/* Logging to stderr, filtered by level (0 error .. 3 debug). */
extern int osp_log_level;
#define OSP_LOG(lvl, ...)                                                      \
    do {                                                                       \
        if ((lvl) <= osp_log_level) { fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); } \
    } while (0)

double osp_now_s(void); /* monotonic seconds */
int osp_ncpu(void);

#endif
