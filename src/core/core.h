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
/* Blocks allocated and freed at a high rate in many sizes (KV blocks: rows
 * and the prefix cache's entries): each in whole pages of its own mapping,
 * zeroed, with no header, so a free gives its memory back to the system at
 * once and a block holds exactly osp_pages_size(n) bytes. A heap keeps the
 * holes such churn leaves between live blocks resident, and blocks of many
 * sizes, each a header longer than its multiple of the growth step, seldom
 * fill a hole exactly. Freed with the size it was allocated with. */
void *osp_pages_alloc(osp_pool pool, size_t n);
void osp_pages_free(osp_pool pool, void *p, size_t n);
size_t osp_pages_size(size_t n); /* n rounded up to whole pages */
/* For a long-running process (the server), called once at start: large
 * blocks from the C library's malloc stay mappings of their own, returned
 * when freed. glibc otherwise raises its mapping threshold to the largest
 * block freed so far, and blocks under it then come from the threads'
 * heaps, whose freed holes stay resident. */
void osp_alloc_long_running(void);
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
